"""GPU tier: the same probe interfaces, for real on a CUDA GPU. Skipped without one.

Run on a GPU machine with ``pytest -m gpu`` (benchmarks/gpu_check.sh does, recording the figures).
"""

from __future__ import annotations

import pytest

from autotune.executors.local import run_probe_process
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")]


def gpu_request(model: str = "tiny-llama", **kw: object) -> ProbeRequest:
    """A cuda probe request; each keyword goes to the Workload, the ProbeSettings or the Candidate
    that has a field of that name (``lengths=`` is a Workload field: passing it to the Candidate
    was a TypeError)."""
    from autotune.models import resolve_model

    r = resolve_model(model)
    wl: dict[str, object] = {"model": r.name, "model_path": r.path, "seq_len": 512}
    sett: dict[str, object] = {"device": "cuda", "warmup_steps": 2, "steps": 5, "timeout_s": 300.0}
    cand: dict[str, object] = {"micro_batch": 4, "precision": "bf16", "attn": "sdpa"}
    for k, v in kw.items():
        if k in Workload.__dataclass_fields__ and k not in ("model", "model_path"):
            wl[k] = v
        elif k in ProbeSettings.__dataclass_fields__:
            sett[k] = v
        elif k in Candidate.__dataclass_fields__:
            cand[k] = v
        else:
            raise TypeError(f"gpu_request: no Workload, ProbeSettings or Candidate field {k!r}")
    return ProbeRequest(Workload(**wl), Candidate(**cand), ProbeSettings(**sett)).validate()  # type: ignore[arg-type]


def test_gpu_probe_measures_memory_with_context_and_utilisation() -> None:
    # a timed window of well over a second: NVML is sampled at 10 Hz, and tiny-llama's 5 steps at
    # seq 512 took ~0.1 s, a window that could hold no sample at all
    r = run_probe_process(gpu_request("smollm2-135m", seq_len=1024, micro_batch=16, steps=40))
    assert r.status == "ok", r.reason
    m = r.metrics
    assert m["tokens_per_s"] > 0
    assert m["mem_torch_reserved_bytes"] >= m["mem_torch_allocated_bytes"] > 0
    # the CUDA context is not in torch's count; the reported peak includes it
    assert m["peak_mem_bytes"] >= m["mem_torch_reserved_bytes"]
    assert m["cuda_context_bytes"] is not None and m["cuda_context_bytes"] > 50 * 2**20
    assert r.env["device"] and r.env["compute_capability"]
    assert m["nvml_process_visible"] in (True, False), m.get("nvml_errors")
    if m["nvml_process_visible"]:
        assert m["non_torch_bytes"] > 0 and "NVML per-process" in m["memory_source"]
    else:
        assert "not visible" in m["memory_source"]
    assert m["window_s"] >= 0.5, m["window_s"]
    assert m.get("gpu_util_samples"), "no NVML utilisation sample in a window of {:.2f} s".format(m["window_s"])


def test_budget_cap_makes_a_config_fail_like_on_a_smaller_card() -> None:
    # smollm2-360m full fine-tuning needs ~6 GB of model states alone: 3 GB cannot hold it
    r = run_probe_process(gpu_request("smollm2-360m", budget_bytes=3 * 10**9, seq_len=256))
    assert r.status in ("oom", "over_budget"), (r.status, r.reason)


def test_flash_attention_is_measured_or_unsupported_with_reason() -> None:
    import importlib.util

    r = run_probe_process(gpu_request(attn="flash_attention_2"))
    if importlib.util.find_spec("flash_attn") is None:
        assert r.status == "unsupported" and "flash-attn" in r.reason
    else:
        assert r.status == "ok", r.reason


def test_packing_with_flash_or_sdpa_counts_real_tokens() -> None:
    r = run_probe_process(gpu_request(packing=True, lengths="lognormal:5.0,0.8"))
    if r.status == "unsupported":
        pytest.skip(r.reason)
    assert r.status == "ok", r.reason
    assert r.metrics["real_tokens"] <= r.metrics["token_slots"]


def test_mfu_is_reported_for_a_known_gpu() -> None:
    from autotune.diagnose import gpu_for_device_name, probe_mfu
    from autotune.models import resolve_model

    r = run_probe_process(gpu_request("smollm2-135m", seq_len=1024, micro_batch=8))
    assert r.status == "ok", r.reason
    gpu = gpu_for_device_name(r.env["device"])
    mfu = probe_mfu(r, resolve_model("smollm2-135m").config, gpu=gpu)
    if gpu is None:
        assert mfu is None  # an unknown GPU gets no MFU, never a wrong one
    else:
        assert mfu is not None and 0.0 < mfu < 1.0
