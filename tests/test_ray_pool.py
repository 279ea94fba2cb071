"""The Ray pool on CPU: a real embedded Ray (num_cpus=2, no GPUs, no dashboard)."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("ray")

from _fakes import drain as _drain  # noqa: E402

from autotune.errors import SpecError  # noqa: E402
from autotune.executors.base import Executor, run_one  # noqa: E402
from autotune.executors.ray_pool import RayExecutor, _split_address  # noqa: E402
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload  # noqa: E402
from autotune.spec.result import ProbeResult  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray_pool")]  # one Ray runtime for the module


def _make_ok():
    # a nested function: Ray's cloudpickle sends it by value (the test module is not importable
    # in Ray's worker processes)
    def ok(request: ProbeRequest) -> ProbeResult:
        import os

        return ProbeResult(status="ok", request=request.to_dict(),
                           metrics={"tokens_per_s": 100.0 * request.candidate.micro_batch, "pid": os.getpid()})

    return ok


_ok = _make_ok()


def _req(mb: int = 1) -> ProbeRequest:
    return ProbeRequest(workload=Workload(model="tiny-llama"), candidate=Candidate(micro_batch=mb, precision="fp32"),
                        settings=ProbeSettings(device="cpu"))



@pytest.fixture(scope="module")
def pool():
    ex = RayExecutor(device="cpu", num_cpus=2, probe_fn=_ok)
    yield ex
    ex.close()


def test_protocol_slots_and_fresh_processes(pool: RayExecutor) -> None:
    assert isinstance(pool, Executor)
    assert pool.slots == 1  # on CPU a probe takes every core
    tickets = [pool.submit(_req(mb)) for mb in (1, 2, 4)]
    assert pool.pending() == 3
    got = _drain(pool, 3)
    assert set(got) == set(tickets)
    assert pool.pending() == 0
    assert {r.tokens_per_s for r in got.values()} == {100.0, 200.0, 400.0}
    assert len({r.metrics["pid"] for r in got.values()}) == 3  # max_calls=1: a new worker process each


def test_an_exception_in_the_probe_is_a_crash_result(pool: RayExecutor) -> None:
    def boom(request: ProbeRequest) -> ProbeResult:
        raise RuntimeError("kaboom")

    pool._probe_fn = boom
    try:
        result = run_one(pool, _req())
    finally:
        pool._probe_fn = _ok
    assert result.status == "crash" and "kaboom" in result.reason


def test_a_lost_worker_is_retried_once_then_recorded_as_crash(pool: RayExecutor, tmp_path) -> None:
    marker = tmp_path / "tries"

    def die(request: ProbeRequest) -> ProbeResult:
        import os

        with open(marker, "a") as fh:
            fh.write("x")
        os._exit(1)

    pool._probe_fn = die
    try:
        result = run_one(pool, _req())
    finally:
        pool._probe_fn = _ok
    assert result.status == "crash" and "lost twice" in result.reason
    assert marker.read_text() == "xx"


def test_poll_with_nothing_pending_returns_at_once(pool: RayExecutor) -> None:
    t = time.monotonic()
    assert pool.poll(timeout=10) == []
    assert time.monotonic() - t < 1.0


def test_unreachable_address_is_a_bounded_one_line_error() -> None:
    t = time.monotonic()
    with pytest.raises(SpecError, match=r"could not reach the Ray cluster at '127.0.0.1:1' within 2 s"):
        RayExecutor("127.0.0.1:1", device="cpu", connect_timeout_s=2.0)
    assert time.monotonic() - t < 10
    with pytest.raises(SpecError, match="is not ray://HOST:PORT"):
        RayExecutor("nonsense", device="cpu", connect_timeout_s=1.0)


def test_address_parsing() -> None:
    assert _split_address("ray://head:10001") == ("head", 10001)
    assert _split_address("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert _split_address("auto") is None


@pytest.mark.slow
def test_a_real_probe_through_ray(pool: RayExecutor) -> None:
    """One real Trainer probe on tiny-llama, in a fresh process inside a Ray task."""
    from autotune.models import resolve_model

    resolved = resolve_model("tiny-llama")
    req = ProbeRequest(
        workload=Workload(model=resolved.name, model_path=resolved.path, seq_len=64),
        candidate=Candidate(micro_batch=2, grad_accum=1, precision="fp32", pin_memory=False),
        settings=ProbeSettings(device="cpu", warmup_steps=1, steps=2, timeout_s=240, budget_bytes=4 * 2**30),
    )
    pool._probe_fn = None
    try:
        result = run_one(pool, req)
    finally:
        pool._probe_fn = _ok
    assert result.status == "ok", result.reason
    assert result.tokens_per_s and result.tokens_per_s > 0
    assert result.peak_mem_bytes and result.peak_mem_bytes > 0



def _make_niceness():
    def niceness(request: ProbeRequest) -> ProbeResult:  # nested: sent by value (see _make_ok)
        import os

        return ProbeResult(status="ok", request=request.to_dict(), metrics={"tokens_per_s": 1.0, "nice": os.nice(0)})

    return niceness


def test_probes_run_at_the_priority_the_users_training_has(pool: RayExecutor) -> None:
    # Ray starts workers at niceness 15 unless told otherwise; a niced probe is starved by any other
    # work on the machine far more than the user's training would be
    pool._probe_fn = _make_niceness()
    try:
        pool.submit(_req())
        (res,) = _drain(pool, 1).values()
    finally:
        pool._probe_fn = _ok
    assert res.metrics["nice"] == os.nice(0) == 0
