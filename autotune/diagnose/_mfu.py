"""MFU of a probe, with one stated convention, and the catalog GPU a probe ran on.  [pure]

Convention (the only one autotune reports):

    MFU = model FLOPs per token x real tokens/s per GPU / the GPU's dense 16-bit tensor peak

* model FLOPs per token = ``6N + 12·L·H·Q·T`` for full fine-tuning, ``4N + 12·L·H·Q·T`` for
  LoRA/QLoRA (``autotune.estimate.model_flops_per_token``: N = parameters in matmuls, the attention
  term is PaLM's with T = the span a real token attends over: the sequence length when every
  sequence fills it, and ``E[l²] / E[l]`` over the workload's length distribution when lengths
  vary, since a sequence of length l costs l² and holds l tokens; packed documents attend within
  themselves, so the same holds with packing); the recompute of activation checkpointing is not
  counted (that would be HFU).
* tokens/s counts real tokens only (padding excluded), divided by the probe's world size.
* the denominator is the catalog's dense bf16 peak (fp16 where the GPU has no bf16), whatever
  precision the probe trained in, so an fp32 probe shows the tensor cores it left idle and every
  configuration on one card is compared against the same figure.
* a GPU that is not in the catalog, or a CPU probe, has no MFU (None), never a guessed one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from autotune.errors import SpecError
from autotune.estimate import GPU, arch_from_config, find_gpu, mfu
from autotune.spec.result import ProbeResult

__all__ = ["MFU_CONVENTION", "attention_span", "gpu_for_device_name", "gpu_for_result", "probe_mfu"]

MFU_CONVENTION = (
    "MFU = (6N + 12·L·H·Q·T) FLOPs per token (4N + attention for LoRA/QLoRA; N = parameters in "
    "matmuls, T = sequence length, or E[l²]/E[l] over the length distribution when lengths vary; "
    "checkpoint recompute not counted) × real tokens/s per GPU ÷ the "
    "GPU's dense bf16 peak (fp16 where no bf16) from the catalog, whatever precision the probe used. "
    "Unknown GPU or CPU: no MFU."
)

# Prefixes that torch / NVML put before the names the catalog uses.
_VENDOR_PREFIX = re.compile(r"^(nvidia|geforce|tesla|quadro|amd|instinct)\s+", re.IGNORECASE)


def gpu_for_device_name(name: str | None, catalog: Iterable[GPU] | None = None) -> GPU | None:
    """The catalog entry for a device name as torch/NVML report it, or None.

    ``"NVIDIA H100 80GB HBM3"``, ``"NVIDIA GeForce RTX 4090"``, ``"Tesla T4"`` are matched by
    stripping the vendor words and trying the catalog's names and aliases; ``"cpu: ..."`` and
    unknown names give None.
    """
    if not name or str(name).lower().startswith("cpu"):
        return None
    gpus = None if catalog is None else list(catalog)
    text = str(name).strip()
    tried: list[str] = []
    while True:
        tried.append(text)
        stripped = _VENDOR_PREFIX.sub("", text, count=1)
        if stripped == text:
            break
        text = stripped
    for candidate in tried:
        try:
            return find_gpu(candidate, gpus)
        except SpecError:
            continue
    return None


def gpu_for_result(result: ProbeResult, catalog: Iterable[GPU] | None = None) -> GPU | None:
    """The catalog GPU a probe ran on (from ``env["device"]``); None on CPU or when unknown."""
    env = result.env or {}
    if env.get("device_type") == "cpu":
        return None
    return gpu_for_device_name(env.get("device"), catalog)


# lengths drawn to estimate E[l²]/E[l] (deterministic: the same spec gives the same span)
_SPAN_SAMPLES = 4096


def attention_span(lengths: str, seq_len: int) -> float:
    """T of the attention term: what a real token attends over, on average over tokens.

    ``seq_len`` for fixed lengths; ``E[l²] / E[l]`` over ``lengths`` (clipped to ``seq_len``)
    otherwise: a sequence of length l does l² attention work for its l tokens, so long sequences
    weigh by their tokens. Using ``seq_len`` for a long-tailed distribution counted work that was
    never done (padding, or attention across the whole packed row) and inflated MFU.
    """
    from autotune.spec.lengths import parse_lengths, sample_lengths

    dist = parse_lengths(lengths)
    if dist.kind == "fixed":
        return float(seq_len)
    ls = sample_lengths(dist, _SPAN_SAMPLES, seq_len, 0)
    total = sum(ls)
    return sum(x * x for x in ls) / total if total else float(seq_len)


def _request_parts(result: ProbeResult) -> tuple[float, str, int] | None:
    try:
        req = result.probe_request()
        span = attention_span(req.workload.lengths, req.workload.seq_len)
    except Exception:  # a malformed stored request gives no MFU rather than a crash
        return None
    return span, req.workload.mode, max(1, req.candidate.world_size)


def probe_mfu(
    result: ProbeResult,
    config: Mapping[str, Any] | None,
    *,
    gpu: GPU | str | None = None,
) -> float | None:
    """MFU of one probe (see the module docstring for the convention), or None.

    ``config`` is the model's ``config.json`` as a dict (the caller reads the file); ``gpu``
    overrides the device recorded in the probe's environment (a catalog entry or name). None when
    the probe has no throughput, the config cannot be summarised, or the GPU is not in the catalog.
    """
    tps = result.tokens_per_s
    if tps is None or tps <= 0 or not config:
        return None
    if isinstance(gpu, str):
        g = gpu_for_device_name(gpu)
    elif gpu is not None:
        g = gpu
    else:
        g = gpu_for_result(result)
    if g is None:
        return None
    parts = _request_parts(result)
    if parts is None:
        return None
    span, mode, world = parts
    try:
        arch = arch_from_config(config)
    except SpecError:
        return None
    # estimate.mfu's default denominator is the GPU's half-precision (bf16, else fp16) peak
    return mfu(tps / world, arch, span, g, mode)  # type: ignore[arg-type]  (a mean span, not an int)
