"""FLOPs per token, predicted tokens/s and MFU.  [pure]

FLOP convention (stated, because conventions differ by 10–20% at long sequences):

* ``N`` = ``Arch.params_matmul``: every parameter that takes part in a matmul per token: all
  weights except the input-embedding look-up, with the output projection counted even when tied,
  and only the active experts of an MoE (as torchtitan counts it).
* Model FLOPs per token (what MFU divides by): ``6N + 12·L·H·Q·T`` for full fine-tuning (2N
  forward + 4N backward; attention term of PaLM, non-causal, T = sequence length, H·Q = heads x
  head_dim); LoRA/QLoRA ``4N + 12·L·H·Q·T`` (no weight gradients for the frozen base; the
  adapters' FLOPs are negligible). FlashAttention's own recompute is not counted.
* Hardware FLOPs add the recomputed forward with gradient checkpointing: ``+2N + 4·L·H·Q·T``
  (full fine-tuning: 8N). Predicted tokens/s divide the achievable FLOP/s by hardware FLOPs;
  ``mfu()`` reports model FLOPs (pass ``hardware=True`` for HFU).

Predicted tokens/s per GPU = peak FLOP/s x efficiency / hardware FLOPs per token, where efficiency
= base (calibrated from probes on that GPU when given, else the catalog's default for the GPU,
else ``DEFAULT_EFFICIENCY``) x the stated lever factors below, and multi-GPU runs lose a stated
share to communication.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.errors import SpecError
from autotune.estimate.arch import Arch
from autotune.estimate.catalog import GPU, find_gpu
from autotune.spec.probe_request import Candidate, Workload

__all__ = [
    "ATTN_FACTOR",
    "DEFAULT_EFFICIENCY",
    "MODE_FACTOR",
    "SATURATION_TOKENS",
    "SCALING_FACTOR",
    "SpeedEstimate",
    "attention_flops_per_token",
    "calibrate",
    "calibration_pairs",
    "hardware_flops_per_token",
    "ideal_tokens_per_s",
    "mfu",
    "model_flops_per_token",
    "predict_speed",
]

# Share of peak bf16 FLOP/s an HF Trainer fine-tune reaches when the catalog gives none (MFU
# 33–64% in the reference runs; HF eager stacks sit lower).
DEFAULT_EFFICIENCY = 0.35
# Relative efficiency by mode: LoRA runs 1.47x SFT tokens/s for 1.5x fewer FLOPs (NeMo, Llama-2-7B)
# -> ~0.98; HF peft stacks lower. QLoRA pays for dequantization (bitsandbytes) on every matmul.
MODE_FACTOR = {"full": 1.0, "lora": 0.9, "qlora": 0.65}
# FlashAttention-2 vs eager: +19–23% at 1k tokens (LLaMA-Factory); sdpa dispatches to flash/mem-eff.
ATTN_FACTOR = {"flash_attention_2": 1.0, "sdpa": 0.97, "flex_attention": 0.95, "eager": 0.8}
# Tokens per micro-batch at which the GPU reaches half its saturation gap: eff x T/(T + this).
SATURATION_TOKENS = 512
# Data-parallel efficiency inside one node (NVLink-class), by ZeRO stage (0 = DDP).
SCALING_FACTOR = {0: 0.95, 1: 0.95, 2: 0.93, 3: 0.88}
# ZeRO-Offload: host<->device traffic and CPU Adam speed (node-wide, shared by all ranks).
PCIE_BYTES_PER_S = 16e9
CPU_ADAM_PARAMS_PER_S = 1.5e9


def attention_flops_per_token(arch: Arch, seq_len: int) -> float:
    """PaLM's non-causal attention term, forward + backward: 12·L·(heads·head_dim)·T."""
    return 12.0 * arch.layers * arch.q_width * seq_len


def model_flops_per_token(arch: Arch, seq_len: int, mode: str = "full") -> float:
    """Model FLOPs per trained token: ``6N`` (full) or ``4N`` (LoRA/QLoRA) + attention."""
    factor = 6.0 if mode == "full" else 4.0
    return factor * arch.params_matmul + attention_flops_per_token(arch, seq_len)


def hardware_flops_per_token(arch: Arch, seq_len: int, mode: str = "full", grad_ckpt: bool = False) -> float:
    """Model FLOPs plus the recomputed forward under checkpointing (``2N`` + a third of attention)."""
    f = model_flops_per_token(arch, seq_len, mode)
    if grad_ckpt:
        f += 2.0 * arch.params_matmul + attention_flops_per_token(arch, seq_len) / 3.0
    return f


def _resolve_gpu(gpu: GPU | str | None) -> GPU | None:
    if gpu is None or isinstance(gpu, GPU):
        return gpu
    try:
        return find_gpu(gpu)
    except SpecError:
        return None


def mfu(
    tokens_per_s: float,
    arch: Arch,
    seq_len: int,
    gpu: GPU | str | None,
    mode: str = "full",
    grad_ckpt: bool = False,
    *,
    precision: str | None = None,
    hardware: bool = False,
) -> float | None:
    """Model FLOPs utilisation of one GPU running at ``tokens_per_s`` (real tokens per second).

    Divides model FLOPs (recompute not counted; ``hardware=True`` counts it, giving HFU) by the
    GPU's dense peak for ``precision`` (default: bf16 where the GPU has it, else fp16). An unknown
    GPU (None, or a name not in the catalog) gives None, never a wrong figure.
    """
    g = _resolve_gpu(gpu)
    if g is None or tokens_per_s is None or tokens_per_s < 0:
        return None
    prec = precision or g.half_precision
    try:
        peak = g.peak_flops(prec)
    except SpecError:
        return None
    flops = (
        hardware_flops_per_token(arch, seq_len, mode, grad_ckpt)
        if hardware
        else model_flops_per_token(arch, seq_len, mode)
    )
    return tokens_per_s * flops / peak


@dataclass(frozen=True)
class SpeedEstimate:
    """Predicted throughput of a configuration (real tokens; no padding assumed)."""

    tokens_per_s: float  # all GPUs together
    tokens_per_s_per_gpu: float
    efficiency: float  # share of peak assumed, lever factors and scaling included
    base_efficiency: float
    mfu: float | None
    hardware_flops_per_token: float
    step_time_s: float  # one optimizer step (micro_batch x grad_accum x world_size sequences)
    offload_time_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _lever_factor(workload: Workload, candidate: Candidate) -> float:
    c = candidate
    tokens = c.micro_batch * workload.seq_len
    f = MODE_FACTOR.get(workload.mode, 1.0) * ATTN_FACTOR.get(c.attn, 0.95)
    f *= tokens / (tokens + SATURATION_TOKENS)
    if c.world_size > 1:
        f *= SCALING_FACTOR[c.zero_stage]
    return f


def predict_speed(
    arch: Arch,
    workload: Workload,
    candidate: Candidate,
    gpu: GPU,
    *,
    efficiency: float | None = None,
) -> SpeedEstimate:
    """Tokens/s for ``candidate`` on ``candidate.world_size`` x ``gpu``.

    ``efficiency`` is the base share of peak (from :func:`calibrate`); default the GPU's catalog
    figure, else DEFAULT_EFFICIENCY.
    """
    c, w = candidate, workload
    base = efficiency if efficiency is not None else (gpu.efficiency or DEFAULT_EFFICIENCY)
    prec = c.precision if c.precision in ("bf16", "fp16", "tf32", "fp32") else gpu.half_precision
    peak = gpu.peak_flops(prec)
    eff = base * _lever_factor(w, c)
    hw = hardware_flops_per_token(arch, w.seq_len, w.mode, c.grad_ckpt)
    per_gpu = peak * eff / hw
    tokens_step = c.micro_batch * c.grad_accum * c.world_size * w.seq_len
    compute_s = tokens_step / (per_gpu * c.world_size)
    offload_s = 0.0
    if c.offload != "none":
        from autotune.estimate.arch import lora_param_count

        trainable = (
            arch.params_total if w.mode == "full" else lora_param_count(arch, w.lora_r, w.lora_targets)
        )
        n = max(c.world_size, 1)
        # fp32 grads down, 16-bit params up, per rank (ranks share the host link and CPU Adam)
        offload_s = trainable * 6 / PCIE_BYTES_PER_S + trainable / CPU_ADAM_PARAMS_PER_S
        if c.offload == "params":
            offload_s += arch.params_total * 2 * 3 / n / PCIE_BYTES_PER_S * c.grad_accum
    step_s = compute_s + offload_s
    total = tokens_step / step_s
    per = total / c.world_size
    return SpeedEstimate(
        tokens_per_s=total,
        tokens_per_s_per_gpu=per,
        efficiency=eff * compute_s / step_s,
        base_efficiency=base,
        mfu=mfu(per, arch, w.seq_len, gpu, w.mode, c.grad_ckpt, precision=prec),
        hardware_flops_per_token=hw,
        step_time_s=step_s,
        offload_time_s=offload_s,
    )


def ideal_tokens_per_s(arch: Arch, workload: Workload, candidate: Candidate, gpu: GPU) -> float:
    """Tokens/s per GPU predicted at base efficiency 1.0 (lever factors included): the
    denominator :func:`calibrate` divides measured throughput by."""
    return predict_speed(arch, workload, candidate, gpu, efficiency=1.0).tokens_per_s_per_gpu


def calibrate(records: Iterable[tuple[float, float]]) -> float | None:
    """Base efficiency from measured probes: the median of measured / ideal tokens/s per GPU.

    ``records`` are ``(measured_tokens_per_s_per_gpu, ideal_tokens_per_s)`` pairs, the second from
    :func:`ideal_tokens_per_s` (or :func:`calibration_pairs` for stored probe results). Pairs with
    a non-positive figure are skipped; no usable pair gives None (use the default then).
    """
    ratios = [float(m) / float(i) for m, i in records if m and i and m > 0 and i > 0]
    if not ratios:
        return None
    return min(1.0, statistics.median(ratios))


def calibration_pairs(
    results: Iterable[Mapping[str, Any] | Any], arch: Arch, gpu: GPU
) -> list[tuple[float, float]]:
    """(measured, ideal) pairs from probe results (``ProbeResult`` or its ``to_dict()``) that ran
    on ``gpu`` with status ok. The request is read back with ``ProbeRequest.from_dict``."""
    from autotune.spec.probe_request import ProbeRequest

    pairs: list[tuple[float, float]] = []
    for r in results:
        d = r.to_dict() if hasattr(r, "to_dict") else dict(r)
        if d.get("status") != "ok":
            continue
        tps = (d.get("metrics") or {}).get("tokens_per_s")
        if not tps:
            continue
        req = ProbeRequest.from_dict(d["request"])
        world = max(req.candidate.world_size, 1)
        pairs.append((float(tps) / world, ideal_tokens_per_s(arch, req.workload, req.candidate, gpu)))
    return pairs
