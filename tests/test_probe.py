"""The probe, for real on CPU: real Trainer runs on a tiny model, each status reached for real."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest
from _oom import needs_heuristic_overcommit, write_huge_vocab_model
from _probes import probe

from autotune.executors.base import run_one
from autotune.executors.local import LocalExecutor, run_probe_process
from autotune.probe.failure import classify_exception
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult


def tiny_request(tmp_model: str | None = None, **overrides: object) -> ProbeRequest:
    from autotune.models import resolve_model

    resolved = resolve_model(tmp_model or "tiny-llama")
    wl = {"model": resolved.name, "model_path": resolved.path, "seq_len": 128}
    cand = {"micro_batch": 2, "precision": "fp32", "attn": "sdpa"}
    sett = {"device": "cpu", "warmup_steps": 1, "steps": 3, "timeout_s": 240.0}
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


@pytest.fixture(scope="module")
def ok_result() -> ProbeResult:
    return probe(tiny_request())


@pytest.mark.slow
@pytest.mark.xdist_group("probe_ok_result")  # one real probe, read by both
def test_ok_probe_measures_real_tokens_memory_and_overhead(ok_result: ProbeResult) -> None:
    r = ok_result
    assert r.status == "ok", r.reason
    m = r.metrics
    # fixed lengths: every slot is a real token; 3 timed steps × 2 rows × 128 tokens
    assert m["real_tokens"] == 3 * 2 * 128
    assert m["token_slots"] == 3 * 2 * 128
    assert m["padding_fraction"] == 0.0
    assert m["tokens_per_s"] == pytest.approx(m["real_tokens"] / m["window_s"])
    assert m["samples_per_s"] == pytest.approx(6 / m["window_s"])
    assert len(m["step_times_s"]) == 3
    assert m["step_time_p10_s"] <= m["step_time_median_s"] <= m["step_time_p90_s"]
    assert m["peak_mem_bytes"] > 10 * 2**20  # weights + grads + Adam states of a ~7M-param model
    assert 0 < m["overhead_s"] < m["wall_s"]
    assert m["num_params"] == m["trainable_params"] > 1_000_000
    assert 0 < m["cpu_util_mean"] <= 1.05  # share of the cores busy during the timed window
    assert m["loss_first"] > 0 and len(m["losses"]) == 4
    assert r.env["packages"]["torch"] and r.env["packages"]["transformers"]
    assert r.env["device_type"] == "cpu"
    json.dumps(r.to_dict())  # plain JSON-serialisable data


@pytest.mark.slow
@pytest.mark.xdist_group("probe_ok_result")  # one real probe, read by both
def test_result_round_trips(ok_result: ProbeResult) -> None:
    again = ProbeResult.from_dict(json.loads(json.dumps(ok_result.to_dict())))
    assert again == ok_result
    assert again.probe_request() == tiny_request()


@pytest.mark.slow
def test_variable_lengths_count_only_real_tokens() -> None:
    r = probe(tiny_request(lengths="uniform:16-128", micro_batch=4))
    assert r.status == "ok", r.reason
    m = r.metrics
    assert m["real_tokens"] < m["token_slots"]
    assert m["padding_fraction"] > 0.05
    assert m["tokens_per_s"] == pytest.approx(m["real_tokens"] / m["window_s"])


@pytest.mark.slow
def test_unsupported_attention_on_cpu_is_reported() -> None:
    r = probe(tiny_request(attn="flash_attention_2"))
    assert r.status == "unsupported"
    assert "flash_attention_2" in r.reason and "GPU" in r.reason


@pytest.mark.slow
def test_fp16_on_cpu_is_unsupported() -> None:
    r = probe(tiny_request(precision="fp16"))
    assert r.status == "unsupported"
    assert "fp16" in r.reason


@pytest.mark.slow
def test_over_budget_stops_the_probe_mid_run() -> None:
    r = probe(tiny_request(budget_bytes=4 * 2**20))
    assert r.status == "over_budget"
    assert "past the budget" in r.reason
    assert r.metrics["peak_mem_bytes"] > 4 * 2**20


@pytest.mark.slow
def test_over_budget_after_measurement_gives_both_numbers() -> None:
    # the run completes (under the hard budget) but exceeds the usable share after headroom
    r = probe(tiny_request(budget_bytes=8 * 2**30, headroom=0.999))
    assert r.status == "over_budget"
    assert "peak memory" in r.reason and "usable budget" in r.reason
    assert r.metrics["tokens_per_s"] > 0
    assert r.metrics["peak_mem_bytes"] > r.metrics["usable_bytes"]


@pytest.mark.slow
def test_timeout_kills_the_probe() -> None:
    r = run_probe_process(tiny_request(timeout_s=2.0, steps=5000))
    assert r.status == "timeout"
    assert "2 s" in r.reason
    assert r.metrics["wall_s"] < 15


@pytest.mark.slow
@needs_heuristic_overcommit
def test_real_out_of_memory(tmp_path: Path) -> None:
    # a 1M-token vocabulary makes the logits of 4 × 2048 tokens a single 32 GB allocation,
    # which this machine refuses at once: a real allocator failure, nothing touched
    write_huge_vocab_model(tmp_path)
    r = probe(tiny_request(str(tmp_path), seq_len=2048, micro_batch=4, steps=1, warmup_steps=0))
    assert r.status == "oom", r.reason
    assert "memory" in r.reason


def test_crashing_probe_leaves_the_caller_intact(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a worker that dies by a signal without writing a result
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nkill -{int(signal.SIGSEGV)} $$\n")
    fake.chmod(0o755)
    r = run_probe_process(tiny_request(), python=str(fake))
    assert r.status == "crash"
    assert "SIGSEGV" in r.reason
    assert os.getpid() > 0  # still here


def test_crash_with_exit_code_and_stderr(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'boom: something broke' >&2\nexit 7\n")
    fake.chmod(0o755)
    r = run_probe_process(tiny_request(), python=str(fake))
    assert r.status == "crash"
    assert "exit code 7" in r.reason and "boom: something broke" in r.reason


def test_local_executor_runs_probes_through_the_protocol(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    with LocalExecutor(slots=2, python=str(fake)) as ex:
        tickets = {ex.submit(tiny_request()), ex.submit(tiny_request(micro_batch=4))}
        assert ex.pending() == 2
        got: dict[str, ProbeResult] = {}
        while len(got) < 2:
            got.update(dict(ex.poll(timeout=30)))
        assert set(got) == tickets and ex.pending() == 0
        assert all(r.status == "crash" for r in got.values())
        assert run_one(ex, tiny_request()).status == "crash"


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError (matched by class name)."""


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"), "oom"),
        (MemoryError(), "oom"),
        (
            ImportError("FlashAttention2 has been toggled on, but it cannot be used: flash_attn missing"),
            "unsupported",
        ),
        (
            ValueError("LlamaForCausalLM does not support an attention implementation through flex"),
            "unsupported",
        ),
        (KeyError("x"), "crash"),
        (RuntimeError("shape mismatch"), "crash"),
    ],
)
def test_classify_exception(exc: BaseException, status: str) -> None:
    got, reason = classify_exception(exc)
    assert got == status
    assert reason


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: every thread count is 1, the test could not fail")
def test_a_cpu_probe_runs_with_the_threads_the_emitted_train_py_gets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe measures with torch's default thread count, as ``best/train.py`` (which sets none)
    runs: the user's OMP_NUM_THREADS here. It used to pin ``os.cpu_count()``, overriding it."""
    import subprocess
    import sys

    from autotune.executors.local import worker_env

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    req = tiny_request(seq_len=32, steps=2)
    assert worker_env(req, 0.0)["OMP_NUM_THREADS"] == "1"  # the user's value, passed through
    explicit = dataclasses.replace(req, settings=dataclasses.replace(req.settings, cpu_threads=2))
    assert worker_env(explicit, 0.0)["OMP_NUM_THREADS"] == "2"  # an explicit cpu_threads wins
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert "OMP_NUM_THREADS" not in worker_env(req, 0.0)  # none added for a single-process probe
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    r = run_probe_process(req)
    assert r.status == "ok", r.reason
    train_py_threads = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                      capture_output=True, text=True, check=True).stdout.strip()
    assert r.env["torch_threads"] == int(train_py_threads) == 1


def test_a_gpu_probe_runs_with_the_cuda_allocator_setting_of_its_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ProbeSettings.cuda_alloc_conf`` is what the probe process gets (the run resolves it from the user's
    environment: theirs, under any of the names torch reads, else expandable segments); a setting already in the
    probe's environment is left as it is; None adds nothing. It is part of the cache key only when set, so a CPU
    run's key is unchanged."""
    from autotune.executors.local import worker_env
    from autotune.spec.probe_request import (
        ALLOC_CONF_VARS,
        CUDA_ALLOC_CONF_DEFAULT,
        alloc_conf_env,
        cuda_alloc_conf,
    )
    from autotune.store import probe_fields

    assert cuda_alloc_conf("cuda", {}) == CUDA_ALLOC_CONF_DEFAULT == "expandable_segments:True"
    for var in ALLOC_CONF_VARS:  # the name torch has always read, ROCm's, the accelerator-neutral one: the user's wins
        assert cuda_alloc_conf("cuda", {var: "max_split_size_mb:512"}) == "max_split_size_mb:512"
    assert cuda_alloc_conf("cuda", {"PYTORCH_CUDA_ALLOC_CONF": ""}) == CUDA_ALLOC_CONF_DEFAULT  # empty: not a setting
    # torch reads the first of its names the environment holds, even an empty one (then the default allocator):
    # the recorded setting is what torch will read once alloc_conf_env's additions are made
    for env in ({}, {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "max_split_size_mb:512"},
                {"PYTORCH_HIP_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "b:2"}, {"PYTORCH_ALLOC_CONF": "", "PYTORCH_HIP_ALLOC_CONF": "c:3"},
                {"PYTORCH_ALLOC_CONF": "b:2", "PYTORCH_HIP_ALLOC_CONF": "c:3"}, {"PYTORCH_CUDA_ALLOC_CONF": "a:1", "PYTORCH_ALLOC_CONF": "b:2"},
                {"PYTORCH_ALLOC_CONF": ""}):
        conf = cuda_alloc_conf("cuda", env)
        full = {**env, **alloc_conf_env(conf, env)}
        assert full[next(v for v in ALLOC_CONF_VARS if v in full)] == conf, env
    assert cuda_alloc_conf("cpu", {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}) is None
    for var in ALLOC_CONF_VARS:
        monkeypatch.delenv(var, raising=False)
    req = tiny_request(seq_len=32, steps=2)
    assert "cuda_alloc_conf" not in probe_fields(req.settings)
    assert not any(v in worker_env(req, 0.0) for v in ALLOC_CONF_VARS)  # a CPU request adds none
    gpu = dataclasses.replace(req, settings=dataclasses.replace(req.settings, device="cuda",
                                                                cuda_alloc_conf=CUDA_ALLOC_CONF_DEFAULT))
    assert worker_env(gpu, 0.0)["PYTORCH_CUDA_ALLOC_CONF"] == CUDA_ALLOC_CONF_DEFAULT
    assert probe_fields(gpu.settings)["cuda_alloc_conf"] == CUDA_ALLOC_CONF_DEFAULT
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:512")  # e.g. a Ray node's own
    env = worker_env(gpu, 0.0)
    assert env["PYTORCH_ALLOC_CONF"] == "max_split_size_mb:512" and "PYTORCH_CUDA_ALLOC_CONF" not in env
    for bad in (3, "", "x\ny: z"):  # a value that is not one printable line (it goes into YAML comments)
        assert any("PYTORCH_CUDA_ALLOC_CONF" in p and "one line" in p
                   for p in dataclasses.replace(req.settings, cuda_alloc_conf=bad).problems())
