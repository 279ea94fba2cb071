"""MFU of a probe, with one stated convention, and the catalog GPU a probe ran on.  [pure]

Convention (the only one autotune reports):

    MFU = model FLOPs per token x real tokens/s per GPU / the GPU's dense 16-bit tensor peak

* model FLOPs per token = ``6N + 12·L·H·Q·T`` for full fine-tuning, ``4N + 12·L·H·Q·T`` for
  LoRA/QLoRA (``autotune.estimate.model_flops_per_token``: N = parameters in matmuls, the attention
  term is PaLM's with T = the workload's sequence length); the recompute of activation
  checkpointing is not counted (that would be HFU).
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
from autotune.probe.result import ProbeResult

__all__ = ["MFU_CONVENTION", "gpu_for_device_name", "gpu_for_result", "probe_mfu"]

MFU_CONVENTION = (
    "MFU = (6N + 12·L·H·Q·T) FLOPs per token (4N + attention for LoRA/QLoRA; N = parameters in "
    "matmuls, T = sequence length; checkpoint recompute not counted) × real tokens/s per GPU ÷ the "
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


def _request_parts(result: ProbeResult) -> tuple[int, str, int] | None:
    try:
        req = result.probe_request()
    except Exception:  # a malformed stored request gives no MFU rather than a crash
        return None
    return req.workload.seq_len, req.workload.mode, max(1, req.candidate.world_size)


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
    seq_len, mode, world = parts
    try:
        arch = arch_from_config(config)
    except SpecError:
        return None
    # estimate.mfu's default denominator is the GPU's half-precision (bf16, else fp16) peak
    return mfu(tps / world, arch, seq_len, g, mode)
