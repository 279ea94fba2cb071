"""``autotune check``: the domain notes' checklist over an existing configuration.  [pure]

``gather(bundle, ...) -> CheckReport`` is the logic (tested); ``render_text`` the thin render. The
CLI (autotune/cli/check.py) reads the files and the installed TrainingArguments' field names.
"""

from __future__ import annotations

from autotune.check._fit import DEFAULT_FIT_SEQ_LEN, GAIN_WORTH_SAYING, FitTarget
from autotune.check._report import STATUSES, CheckItem, CheckReport, render_text
from autotune.check._rules import (
    CONFIG_FILE_KINDS,
    KINDS,
    REMOVED_IN_V5,
    ConfigBundle,
    GpuInfo,
    bundle_from_texts,
    gather,
    parse_config,
    requested_model,
)
from autotune.errors import SpecError

__all__ = [
    "CONFIG_FILE_KINDS",
    "DEFAULT_FIT_SEQ_LEN",
    "GAIN_WORTH_SAYING",
    "FitTarget",
    "KINDS",
    "REMOVED_IN_V5",
    "STATUSES",
    "CheckItem",
    "CheckReport",
    "ConfigBundle",
    "GpuInfo",
    "bundle_from_texts",
    "gather",
    "gpu_info",
    "parse_config",
    "requested_model",
    "render_text",
]


# Used only when the GPU catalog cannot be loaded: name fragment -> (bf16, flash_attention_2, tf32).
_FALLBACK: tuple[tuple[str, tuple[bool, bool, bool]], ...] = (
    ("T4", (False, False, False)),
    ("V100", (False, False, False)),
    ("P100", (False, False, False)),
    ("A100", (True, True, True)),
    ("A10", (True, True, True)),
    ("L40", (True, True, True)),
    ("L4", (True, True, True)),
    ("H100", (True, True, True)),
    ("H200", (True, True, True)),
)


def gpu_info(name: str) -> GpuInfo:
    """bf16 / FlashAttention-2 / TF32 support of a GPU from the catalog (SpecError if unknown).

    If the catalog itself cannot be loaded, a small built-in table stands in.
    """
    try:
        from autotune.estimate.catalog import find_gpu

        g = find_gpu(name)
    except SpecError as exc:
        if str(exc).startswith("unknown GPU"):
            raise
        g = None
    except ImportError:
        g = None
    if g is None:
        key = name.upper().replace("-", "").replace(" ", "")
        for frag, (bf16, fa2, tf32) in _FALLBACK:
            if frag in key:
                return GpuInfo(name=name, bf16=bf16, flash_attention_2=fa2, tf32=tf32)
        raise SpecError(f"unknown GPU {name!r} (the GPU catalog could not be loaded)")
    cc = getattr(g, "compute_capability", None)
    try:
        ampere = float(cc) >= 8.0 if cc else bool(g.bf16)
    except ValueError:
        ampere = bool(g.bf16)
    return GpuInfo(name=g.name, bf16=bool(g.bf16), flash_attention_2=bool(g.flash_attention_2), tf32=ampere)
