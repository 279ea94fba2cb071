"""Distributed probes for real on CPU: 2 gloo processes, the tiny Llama, DDP / DeepSpeed ZeRO / FSDP.

The same launcher and worker code runs W ranks on W GPUs. DeepSpeed compiles its ops on first use
(``deepspeed_shm_comm`` ~1-3 min, ``cpu_adam`` ~2 min on 2 cores) into ``TORCH_EXTENSIONS_DIR``
(default ``~/.cache/torch_extensions``). ``make setup`` builds both ahead (``tests/_build_ops.py``); the
timeouts here still allow for the build, for a venv set up without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from _oom import needs_heuristic_overcommit, write_huge_vocab_model

from autotune.executors.local import run_probe_process
from autotune.probe.launch import fsdp_stand_in, is_distributed, merge_rank_results
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED, reason="needs deepspeed (autotune[deepspeed])")

SEQ, MB, WARMUP, STEPS = 64, 2, 1, 2
# DeepSpeed's first use compiles ops; later runs load them from the cache
DS_TIMEOUT = 600.0


def dist_request(**overrides: object) -> ProbeRequest:
    from autotune.models import resolve_model

    resolved = resolve_model("tiny-llama")
    wl = {"model": resolved.name, "model_path": resolved.path, "seq_len": SEQ}
    cand = {"micro_batch": MB, "precision": "fp32", "attn": "sdpa", "world_size": 2}
    sett = {"device": "cpu", "warmup_steps": WARMUP, "steps": STEPS, "timeout_s": 240.0}
    for key, value in overrides.items():
        if key in Workload.__dataclass_fields__:
            wl[key] = value
        elif key in Candidate.__dataclass_fields__:
            cand[key] = value
        elif key in ProbeSettings.__dataclass_fields__:
            sett[key] = value
        else:
            raise KeyError(key)
    return ProbeRequest(Workload(**wl), Candidate(**cand), ProbeSettings(**sett))  # type: ignore[arg-type]


class ChildWatch:
    """Runs a probe on a thread and records every descendant process seen while it runs."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}  # pid -> create_time (guards against pid reuse)

    def run(self, req: ProbeRequest, **kw: object) -> ProbeResult:
        out: list[ProbeResult] = []
        me = psutil.Process()
        before = {c.pid for c in me.children(recursive=True)}  # (this test process's warm server: tests/_probes.py)
        t = threading.Thread(target=lambda: out.append(run_probe_process(req, **kw)))  # type: ignore[arg-type]
        t.start()
        while t.is_alive():
            try:
                for c in me.children(recursive=True):
                    if c.pid in before:
                        continue
                    try:
                        self.seen.setdefault(c.pid, c.create_time())
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            t.join(0.05)
        return out[0]

    def survivors(self) -> list[str]:
        alive = []
        for pid, created in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {p.status()} pgid={os.getpgid(pid)} {' '.join(p.cmdline())[:200]}")
            except psutil.Error:
                pass
        return alive


def per_rank_tokens(accum: int = 1) -> int:
    return STEPS * MB * SEQ * accum


def assert_ok_world2(r: ProbeResult, distributed_type: str, accum: int = 1) -> None:
    """A whole-window probe of STEPS optimizer steps at accumulation ``accum`` on 2 ranks."""
    assert r.status == "ok", (r.reason, r.env.get("stderr_tail"))
    m = r.metrics
    assert m["world_size"] == 2 and len(m["ranks"]) == 2
    assert m["distributed_type"] == distributed_type
    assert m["dist_backend"] == "gloo"
    # fixed lengths: each rank counts its own real tokens; the probe's figure is their sum
    assert [x["real_tokens"] for x in m["ranks"]] == [per_rank_tokens(accum)] * 2
    assert m["real_tokens"] == 2 * per_rank_tokens(accum)
    assert m["token_slots"] == 2 * per_rank_tokens(accum)
    assert m["padding_fraction"] == 0.0
    assert m["tokens_per_s"] == pytest.approx(m["real_tokens"] / m["window_s"])
    assert m["window_s"] == max(x["window_s"] for x in m["ranks"])
    assert m["peak_mem_bytes"] == max(x["peak_mem_bytes"] for x in m["ranks"]) > 10 * 2**20
    assert m["mem_rss_growth_sum_bytes"] >= m["peak_mem_bytes"]
    assert len(m["step_times_s"]) == STEPS
    assert m["num_params"] > 1_000_000
    json.dumps(r.to_dict())


# ---------------------------------------------------------------------------------------------
# pure: merging, stand-ins
# ---------------------------------------------------------------------------------------------


def _rank(status: str = "ok", **metrics: object) -> ProbeResult:
    return ProbeResult(status=status, request={}, reason=f"{status} here", metrics=dict(metrics))


def test_merge_sums_tokens_and_takes_max_memory() -> None:
    a = _rank(real_tokens=100, token_slots=120, window_s=2.0, tokens_per_s=50.0, samples_per_s=1.0,
              peak_mem_bytes=10, step_time_median_s=1.0, step_times_s=[1.0, 1.0], rank=0)  # fmt: skip
    b = _rank(real_tokens=100, token_slots=120, window_s=2.5, tokens_per_s=40.0, samples_per_s=0.8,
              peak_mem_bytes=30, step_time_median_s=1.25, step_times_s=[1.2, 1.3], rank=1)  # fmt: skip
    m = merge_rank_results({}, [a, b], exit_codes=[0, 0]).metrics
    assert m["real_tokens"] == 200 and m["token_slots"] == 240
    assert m["window_s"] == 2.5 and m["tokens_per_s"] == pytest.approx(200 / 2.5)
    assert m["samples_per_s"] == pytest.approx((2.0 + 2.0) / 2.5)
    assert m["peak_mem_bytes"] == 30
    assert m["step_times_s"] == [1.0, 1.0] and m["step_time_max_median_s"] == 1.25  # rank 0's, and the max
    assert m["padding_fraction"] == pytest.approx(1 - 200 / 240)
    assert "rank" not in m and [x["rank"] for x in m["ranks"]] == [0, 1]


def test_merge_oom_on_any_rank_is_oom() -> None:
    r = merge_rank_results({}, [None, _rank("oom", peak_mem_bytes=5)], exit_codes=[None, 0], first_failed=1)
    assert r.status == "oom" and r.reason.startswith("rank 1/2: ")
    assert "tokens_per_s" not in r.metrics


def test_merge_rank_dead_without_result_is_a_crash_with_its_stderr() -> None:
    r = merge_rank_results(
        {}, [None, None], exit_codes=[None, -9], stderr_tails=["", "x\nKilled"], first_failed=1
    )
    assert r.status == "crash"
    assert "rank 1/2 killed by SIGKILL" in r.reason and "Killed" in r.reason
    assert r.env["stderr_tail"] == "x\nKilled" and r.metrics["exit_code"] == -9


def test_merge_blames_the_rank_that_died_not_its_peers_broken_collective() -> None:
    peer = _rank("crash")
    r = merge_rank_results(
        {}, [peer, None], exit_codes=[0, -9], stderr_tails=["gloo", "Killed"], first_failed=1
    )
    assert r.status == "crash" and r.reason.startswith("rank 1/2 killed by SIGKILL")
    assert r.metrics["failed_rank"] == 1


def test_merge_a_rank_that_exits_non_zero_after_an_ok_result_is_a_crash() -> None:
    # a crash in the teardown (after the result was written): the merge used to raise IndexError
    r = merge_rank_results({}, [_rank(), _rank()], exit_codes=[0, -11], stderr_tails=["", "Segmentation fault"],
                           first_failed=1)  # fmt: skip
    assert r.status == "crash" and r.reason.startswith("rank 1/2 killed by SIGSEGV after writing an ok result")
    assert r.metrics["exit_code"] == -11 and r.metrics["failed_rank"] == 1
    assert r.env["stderr_tail"] == "Segmentation fault"
    # the launcher then killed the other rank, which left nothing: the first failure is still the cause
    r = merge_rank_results({}, [_rank(), None], exit_codes=[1, None], first_failed=0)
    assert r.status == "crash" and r.reason.startswith("rank 0/2 exit code 1 after writing an ok result")


def test_fsdp_stands_in_for_zero_where_equivalent() -> None:
    assert not is_distributed(Candidate()) and is_distributed(Candidate(zero_stage=2))
    assert fsdp_stand_in(Candidate(zero_stage=3)) == Candidate(zero_stage=3, sharding="fsdp")
    assert fsdp_stand_in(Candidate(zero_stage=3, offload="params")).sharding == "fsdp"  # type: ignore[union-attr]
    assert fsdp_stand_in(Candidate(zero_stage=2, offload="optimizer")) is None
    assert fsdp_stand_in(Candidate(world_size=2)) == Candidate(world_size=2)


# ---------------------------------------------------------------------------------------------
# real: 2 gloo processes
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first DeepSpeed probe of a machine compiles its ops (tests/_two_rank.py)
@pytest.mark.xdist_group("two_rank")  # on the worker that ran them for test_short_probes
@pytest.mark.parametrize("stage", [0, pytest.param(3, marks=needs_deepspeed)], ids=["ddp", "zero3"])
def test_two_ranks_sum_tokens_and_take_the_max_memory(stage: int) -> None:
    """DDP and DeepSpeed ZeRO-3 on 2 gloo ranks: the session's whole-window probes (tests/_two_rank.py,
    shared with the composed-window tests), STEPS optimizer steps at accumulation 8. ZeRO-2's ranks are merged
    the same way in the offload test below (its own probe: a ZeRO-2 probe without offload proved nothing more)."""
    import _two_rank

    assert (_two_rank.WHOLE_STEPS, _two_rank.MB, _two_rank.SEQ) == (STEPS, MB, SEQ)
    r = _two_rank.probe("whole", stage)
    assert_ok_world2(r, "DEEPSPEED" if stage else "MULTI_CPU", accum=_two_rank.ACCUM)
    if stage == 3:
        # built under zero.Init: every rank holds only its shard; the count is still the full model
        assert r.metrics["param_local_numel"] == 0


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.timeout(900)  # DeepSpeed compiles cpu_adam on a machine's first offload (~2 min on 2 cores)
def test_deepspeed_zero2_optimizer_offload_world_2() -> None:
    r = run_probe_process(dist_request(zero_stage=2, offload="optimizer", timeout_s=DS_TIMEOUT))
    assert_ok_world2(r, "DEEPSPEED")


def test_zero_without_deepspeed_is_unsupported_with_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.probe import worker

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "deepspeed" else real(n, *a))
    with pytest.raises(worker._Unsupported, match=r"pip install 'autotune\[deepspeed\]'.*fsdp"):
        worker._precheck(dist_request(zero_stage=3), "cpu")


def test_distributed_request_outside_the_launcher_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.probe import worker

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(worker._Unsupported, match="autotune.probe.launch"):
        worker._precheck(dist_request(), "cpu")


@pytest.mark.slow
def test_a_rank_that_dies_stops_the_others_and_is_a_crash(tmp_path: Path) -> None:
    # rank 1's interpreter fails at once; rank 0 would wait for it at rendezvous until killed
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$RANK" = "1" ]; then echo "rank one exploded" >&2; exit 9; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    watch = ChildWatch()
    t0 = time.monotonic()
    r = watch.run(dist_request(timeout_s=200.0), python=str(wrapper))
    assert r.status == "crash", r.reason
    assert "rank 1/2 exit code 9" in r.reason and "rank one exploded" in r.reason
    assert r.metrics["failed_rank"] == 1
    assert r.metrics["ranks"][0]["exit_code"] is None  # killed by the launcher
    assert time.monotonic() - t0 < 100
    assert len(watch.seen) >= 2  # the launcher and rank 0 at least (rank 1 may come and go unseen)
    assert watch.survivors() == []


@pytest.mark.slow
def test_timeout_kills_every_rank() -> None:
    watch = ChildWatch()
    # thousands of steps: on a quiet machine a 2-rank tiny probe of a few steps ends inside 6 s
    r = watch.run(dist_request(timeout_s=6.0, steps=5000))
    assert r.status == "timeout"
    assert "all 2 ranks" in r.reason
    assert len(watch.seen) >= 3
    assert watch.survivors() == []


@pytest.mark.slow
@needs_heuristic_overcommit
def test_oom_on_a_rank_is_oom(tmp_path: Path) -> None:
    # as in test_probe: a 1M-token vocabulary makes the logits one refused 32 GB allocation per rank
    write_huge_vocab_model(tmp_path)
    req = dist_request(seq_len=2048, micro_batch=4, steps=1, warmup_steps=0)
    req = ProbeRequest(
        Workload(model="huge-vocab", model_path=str(tmp_path), seq_len=2048), req.candidate, req.settings
    )
    watch = ChildWatch()
    r = watch.run(req)
    assert r.status == "oom", r.reason
    assert r.reason.startswith("rank ")
    assert watch.survivors() == []


@pytest.mark.slow
def test_cli_distributed_flags_and_fsdp_full_shard_world_2() -> None:
    """FSDP2 full sharding on 2 gloo ranks, asked for through the CLI's distributed flags."""
    args = ["probe", "-m", "tiny-llama", "--device", "cpu", "--seq-len", str(SEQ), "--micro-batch", str(MB),
            "--warmup-steps", str(WARMUP), "--steps", str(STEPS), "--world-size", "2", "--zero-stage", "3",
            "--sharding", "fsdp", "--offload", "none", "--json"]  # fmt: skip
    p = subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    c = out["request"]["candidate"]
    assert (c["world_size"], c["zero_stage"], c["sharding"], c["offload"]) == (2, 3, "fsdp", "none")
    r = ProbeResult.from_dict(out)
    assert_ok_world2(r, "FSDP")
    assert r.metrics["param_type"] == "DTensor"  # FSDP2 fully_shard
    # offload=params needs ZeRO-3: a bad request, one line, exit 2
    bad = subprocess.run(
        [sys.executable, "-m", "autotune", "probe", "-m", "tiny-llama", "--device", "cpu",
         "--zero-stage", "2", "--offload", "params"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "offload=params needs zero_stage 3" in bad.stderr + bad.stdout


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.gpu_rehearsal
@pytest.mark.timeout(1500)
def test_gpu_zero_stages_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "zero.json"
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "gpu_zero_stages.py"), str(out), "--dry-run"],
        capture_output=True, text=True, timeout=1500, cwd=root,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["dry_run"] is True and data["model"] == "tiny-llama"
    rows = {(r["zero_stage"], r["offload"]): r for r in data["rows"]}
    assert {(0, "none"), (1, "none"), (2, "none"), (3, "none"), (2, "optimizer"), (3, "params")} <= set(rows)
    for key in ((0, "none"), (2, "none"), (3, "none")):
        assert rows[key]["status"] == "ok", rows[key]
        assert rows[key]["tokens_per_s"] > 0 and rows[key]["peak_mem_bytes"] > 0
