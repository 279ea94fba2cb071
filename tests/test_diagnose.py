"""Bottleneck diagnosis and MFU (pure): each row of the notes' table from synthetic probe results."""

from __future__ import annotations

import pytest

from autotune.diagnose import (
    MFU_CONVENTION,
    diagnose,
    diagnose_run,
    gpu_for_device_name,
    probe_mfu,
)
from autotune.estimate import arch_from_config, find_gpu, model_flops_per_token
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

GiB = 2**30
BUDGET = 24 * GiB
USABLE = int(BUDGET * 0.95)
GPU_ENV = {"device": "NVIDIA H100 80GB HBM3", "device_type": "cuda"}
CPU_ENV = {"device": "cpu: Intel Xeon", "device_type": "cpu"}

# a Llama-style 1.2B-ish config: enough for the estimator to predict a real footprint
LLAMA = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}


def res(
    cand: Candidate | None = None,
    *,
    status: str = "ok",
    env: dict | None = None,
    mode: str = "full",
    seq_len: int = 512,
    budget: int | None = BUDGET,
    reason: str = "",
    **metrics,
) -> ProbeResult:
    req = ProbeRequest(
        workload=Workload(model="m", model_path="/nowhere", mode=mode, seq_len=seq_len),
        candidate=cand or Candidate(micro_batch=2, grad_accum=8),
        settings=ProbeSettings(budget_bytes=budget),
    )
    m = {"budget_bytes": budget, "usable_bytes": int(budget * 0.95) if budget else None, **metrics}
    return ProbeResult(
        status=status,
        request=req.to_dict(),
        reason=reason,
        metrics={k: v for k, v in m.items() if v is not None},
        env=dict(GPU_ENV if env is None else env),
    )


def test_swinging_gpu_util_is_data_loading_with_the_measured_fraction():
    samples = [0, 2, 100, 98, 0, 1, 100, 97, 3, 100, 0, 99] * 5
    r = res(Candidate(micro_batch=4, grad_accum=4, workers=0, pin_memory=False),
            tokens_per_s=9000.0, data_wait_fraction=0.31, gpu_util_samples=samples,
            gpu_util_mean=sum(samples) / len(samples), peak_mem_bytes=20 * GiB)  # fmt: skip
    d = diagnose(r)
    assert d.findings[0].key == "data_loading"
    f = d.findings[0]
    assert "31% of step time waiting for batches" in f.evidence
    assert "swings 0↔100%" in f.evidence
    assert f.numbers["data_wait_fraction"] == pytest.approx(0.31)
    assert "dataloader_num_workers" in f.fix and "pin_memory" in f.fix and "pre-tokenize" in f.fix
    assert d.headline == "data loading / CPU preprocessing"


def test_data_wait_alone_triggers_data_loading_and_low_wait_does_not():
    slow = diagnose(
        res(tokens_per_s=1.0, data_wait_fraction=0.12, gpu_util_mean=85.0, peak_mem_bytes=20 * GiB)
    )
    assert slow.keys()[0] == "data_loading" and "12% of step time" in slow.findings[0].evidence
    fine = diagnose(
        res(tokens_per_s=1.0, data_wait_fraction=0.02, gpu_util_mean=95.0, peak_mem_bytes=20 * GiB)
    )
    assert "data_loading" not in fine.keys()
    assert fine.findings == () and fine.headline == "no bottleneck found"


def test_swing_without_data_wait_names_the_other_suspect():
    samples = [0, 100] * 20
    d = diagnose(
        res(tokens_per_s=1.0, data_wait_fraction=0.01, gpu_util_samples=samples, peak_mem_bytes=20 * GiB)
    )
    assert d.keys()[0] == "data_loading"
    assert "other suspect" in d.findings[0].evidence


def test_high_util_low_memory_means_the_batch_could_be_larger():
    r = res(Candidate(micro_batch=2, grad_accum=16), tokens_per_s=5000.0, gpu_util_mean=97.0,
            gpu_util_samples=[96, 97, 98] * 10, data_wait_fraction=0.01, peak_mem_bytes=6 * GiB)  # fmt: skip
    d = diagnose(r)
    assert d.keys() == ["batch_larger"]
    f = d.findings[0]
    assert "GPU utilisation mean 97%" in f.evidence and "26% of the usable budget" in f.evidence
    assert "raise per_device_train_batch_size" in f.fix and "micro-batch 2, accumulation 16" in f.fix
    # with checkpointing on, dropping it is the first advice
    ck = diagnose(res(Candidate(micro_batch=2, grad_accum=16, grad_ckpt=True), tokens_per_s=1.0,
                      gpu_util_mean=97.0, peak_mem_bytes=6 * GiB))  # fmt: skip
    assert "checkpointing off" in ck.findings[0].fix
    # memory already well used: no finding
    full = diagnose(res(tokens_per_s=1.0, gpu_util_mean=97.0, peak_mem_bytes=20 * GiB))
    assert "batch_larger" not in full.keys()


def test_batch_larger_is_withdrawn_when_the_next_micro_batch_was_measured_not_to_fit():
    small = res(
        Candidate(micro_batch=4, grad_accum=4),
        tokens_per_s=5000.0,
        gpu_util_mean=95.0,
        peak_mem_bytes=9 * GiB,
    )
    bigger = res(Candidate(micro_batch=8, grad_accum=2), status="oom", reason="CUDA out of memory")
    other = res(
        Candidate(micro_batch=8, grad_accum=2, grad_ckpt=True), status="oom", reason="CUDA out of memory"
    )
    alone = diagnose_run([small]).probes[0][1]
    assert alone.keys() == ["batch_larger"] and alone.findings[0].severity == "medium"
    run = diagnose_run([small, bigger, other])
    f = run.probes[0][1].findings[0]
    assert f.key == "batch_larger" and f.severity == "info"
    assert "micro-batch 8 of this configuration was measured: oom" in f.fix
    assert run.chosen is not None and run.chosen.findings[0].severity == "info"


def test_oom_and_over_budget_give_the_memory_levers():
    oom = diagnose(res(Candidate(micro_batch=8, grad_accum=2, precision="fp32"), status="oom",
                       reason="CUDA out of memory. Tried to allocate 2.00 GiB"))  # fmt: skip
    f = oom.findings[0]
    assert oom.keys() == ["memory"] and f.bottleneck == "out of memory"
    assert "CUDA out of memory" in f.evidence
    for lever in (
        "bf16",
        "checkpointing",
        "smaller micro-batch than 8",
        "shorter sequence than 512",
        "LoRA",
        "smaller model",
    ):
        assert lever in f.fix
    over = diagnose(res(Candidate(micro_batch=4, grad_accum=4, grad_ckpt=True, precision="bf16"),
                        status="over_budget", mode="lora", peak_mem_bytes=30 * GiB))  # fmt: skip
    g = over.findings[0]
    assert "30.00 GiB > usable budget 22.80 GiB (132%)" in g.evidence
    assert "bf16" not in g.fix and "activation checkpointing" not in g.fix and "QLoRA" in g.fix


def test_offload_only_fit_is_a_capacity_limit_with_a_card_size():
    off = Candidate(
        micro_batch=1, grad_accum=16, grad_ckpt=True, zero_stage=2, offload="optimizer", precision="bf16"
    )
    ok = res(off, tokens_per_s=800.0, gpu_util_mean=40.0, peak_mem_bytes=20 * GiB, seq_len=2048)
    too_big = res(Candidate(micro_batch=1, grad_accum=16, grad_ckpt=True, precision="bf16"), status="over_budget",
                  peak_mem_bytes=27 * GiB, seq_len=2048)  # fmt: skip
    # from the estimator (config known)
    d = diagnose(ok, config=LLAMA)
    cap = d.findings[0]
    assert cap.key == "capacity" and "PCIe" in cap.bottleneck
    assert "not a tuning problem" in cap.fix and "a card with at least" in cap.fix and "predicted" in cap.fix
    assert cap.numbers["need_bytes"] > 0
    assert "LoRA or QLoRA" in cap.fix and "GPUs" in cap.fix
    # a low GPU utilisation under offload is not blamed on the batch
    assert "small_batch" not in d.keys()

    run = diagnose_run([ok, too_big])
    top = run.findings[0]
    assert top.key == "offload_only" and "only configurations with CPU offload fit" in top.bottleneck
    # without the config: the measured peak of the non-offload config (a lower bound), in GB
    need = 27 * GiB / 0.95
    assert f"at least {need / 1e9:.0f} GB (measured, a lower bound" in top.fix
    assert top.numbers["need_bytes"] == pytest.approx(need)
    assert "e.g. A100-40GB" in top.fix  # the smallest catalog card holding ~30.5 GB
    assert run.chosen is not None and run.chosen.keys()[0] == "capacity"


def test_cpu_probe_uses_cpu_utilisation_and_data_wait():
    starving = res(Candidate(micro_batch=2, grad_accum=4, precision="fp32"), env=CPU_ENV, tokens_per_s=700.0,
                   cpu_util_mean=0.35, data_wait_fraction=0.22, peak_mem_bytes=2 * GiB)  # fmt: skip
    d = diagnose(starving)
    assert d.keys()[0] == "data_loading"
    assert (
        "22% of step time" in d.findings[0].evidence and "CPU utilisation mean 35%" in d.findings[0].evidence
    )
    # precision advice is for GPUs only (bf16 is slower on most CPUs)
    assert "precision" not in d.keys()

    busy = res(Candidate(micro_batch=1, grad_accum=8, precision="fp32"), env=CPU_ENV, tokens_per_s=700.0,
               cpu_util_mean=0.95, data_wait_fraction=0.01, peak_mem_bytes=1 * GiB)  # fmt: skip
    b = diagnose(busy)
    assert b.keys() == ["batch_larger"] and "CPU utilisation mean 95%" in b.findings[0].evidence

    idle = res(Candidate(micro_batch=1, grad_accum=8, precision="fp32"), env=CPU_ENV, tokens_per_s=700.0,
               cpu_util_mean=0.30, data_wait_fraction=0.01, peak_mem_bytes=20 * GiB)  # fmt: skip
    assert diagnose(idle).keys() == ["small_batch"]


def test_poor_multi_gpu_scaling_points_at_communication():
    one = res(
        Candidate(micro_batch=4, grad_accum=8, world_size=1), tokens_per_s=10_000.0, peak_mem_bytes=20 * GiB
    )
    four = res(Candidate(micro_batch=4, grad_accum=2, world_size=4, zero_stage=2), tokens_per_s=24_000.0,
               peak_mem_bytes=20 * GiB)  # fmt: skip
    run = diagnose_run([one, four])
    d4 = run.probes[1][1]
    assert d4.keys()[0] == "communication"
    assert "6,000 tok/s per GPU on 4 GPUs vs 10,000 on 1: 60% scaling efficiency" in d4.findings[0].evidence
    good = res(Candidate(micro_batch=4, grad_accum=2, world_size=4, zero_stage=2), tokens_per_s=38_000.0,
               peak_mem_bytes=20 * GiB)  # fmt: skip
    assert "communication" not in diagnose_run([one, good]).probes[1][1].keys()


def test_padding_and_gpu_kernel_advice():
    h100 = find_gpu("H100-SXM")
    d = diagnose(res(Candidate(precision="fp32", attn="eager"), tokens_per_s=1.0, padding_fraction=0.4,
                     peak_mem_bytes=20 * GiB), gpu=h100)  # fmt: skip
    assert {"padding", "precision", "attention"} <= set(d.keys())
    assert d.keys()[-1] in ("precision", "attention")  # info comes last


def test_nothing_fits_and_failures():
    run = diagnose_run([res(status="oom", reason="OOM"), res(status="over_budget", peak_mem_bytes=40 * GiB),
                        res(status="unsupported", reason="flash_attention_2 needs a CUDA GPU")])  # fmt: skip
    assert run.chosen is None and run.findings[0].key == "nothing_fits"
    assert "smallest measured peak 40.00 GiB" in run.findings[0].evidence
    assert run.probes[2][1].findings[0].key == "unsupported"
    assert run.to_dict()["findings"][0]["key"] == "nothing_fits"


def test_gpu_names_from_torch_map_to_the_catalog():
    assert gpu_for_device_name("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert gpu_for_device_name("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert gpu_for_device_name("NVIDIA GeForce RTX 4090").name == "RTX-4090"
    assert gpu_for_device_name("Tesla T4").name == "T4"
    assert gpu_for_device_name("NVIDIA H200").name == "H200"
    assert gpu_for_device_name("NVIDIA Mystery 9000") is None
    assert gpu_for_device_name("cpu: Intel Xeon") is None
    assert gpu_for_device_name(None) is None


def test_mfu_convention_and_unknown_gpu_gives_none():
    r = res(Candidate(micro_batch=4, grad_accum=4, world_size=2), tokens_per_s=20_000.0, seq_len=1024)
    arch = arch_from_config(LLAMA)
    expected = 10_000.0 * model_flops_per_token(arch, 1024, "full") / 989e12
    assert probe_mfu(r, LLAMA) == pytest.approx(expected)
    # the convention: 6N + 12·L·H·Q·T over the bf16 peak
    assert model_flops_per_token(arch, 1024, "full") == pytest.approx(
        6 * arch.params_matmul + 12 * arch.layers * arch.heads * arch.head_dim * 1024
    )
    assert "6N" in MFU_CONVENTION and "bf16 peak" in MFU_CONVENTION
    lora = res(Candidate(), mode="lora", tokens_per_s=10_000.0, seq_len=1024)
    assert probe_mfu(lora, LLAMA) == pytest.approx(
        10_000.0 * model_flops_per_token(arch, 1024, "lora") / 989e12
    )
    assert (
        probe_mfu(res(tokens_per_s=1e4, env={"device": "NVIDIA Mystery 9000", "device_type": "cuda"}), LLAMA)
        is None
    )
    assert probe_mfu(res(tokens_per_s=1e4, env=CPU_ENV), LLAMA) is None
    assert probe_mfu(res(tokens_per_s=1e4), None) is None
    assert probe_mfu(res(status="oom"), LLAMA) is None
    # an explicit GPU overrides the recorded one
    unknown = res(tokens_per_s=1e4, env={"device": "NVIDIA Mystery 9000", "device_type": "cuda"})
    assert probe_mfu(unknown, LLAMA, gpu="A100-80GB") == pytest.approx(
        1e4 * model_flops_per_token(arch, 512, "full") / 312e12
    )


def test_diagnose_is_pure():
    import subprocess
    import sys

    code = (
        "import sys, autotune.diagnose, autotune.report.html, autotune.report._model; "
        "bad=[m for m in ('torch','ray','pynvml','transformers') if m in sys.modules]; "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
