"""Environment fingerprint: versions and device, recorded with every probe and used in cache keys.

Imports torch lazily; nothing touches CUDA at import time.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

__all__ = ["fingerprint", "package_versions", "versions_of", "nvml_device_info", "cpu_model", "tail_lines",
           "training_fields", "sft_fields", "usable_cores"]

_PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "deepspeed",
    "optuna",
    "ray",
    "flash-attn",
    "bitsandbytes",
    "liger-kernel",
    "autotune",
)


def package_versions() -> dict[str, str | None]:
    return versions_of(*_PACKAGES)


def versions_of(*names: str) -> dict[str, str | None]:
    """Installed version of each distribution (None: not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def training_fields() -> tuple[set[str] | None, str | None]:
    """The installed ``TrainingArguments``' field names and transformers' version (None, None if absent or
    broken): what the emitted files, the write-back and ``check`` hold a key against."""
    try:
        import dataclasses

        import transformers
        from transformers import TrainingArguments
    except Exception:  # transformers missing or broken: the v5 table alone
        return None, None
    return {f.name for f in dataclasses.fields(TrainingArguments)}, transformers.__version__


def sft_fields() -> set[str] | None:
    """The names a ``trl sft`` config may hold (None if trl is not installed): the installed TRL's
    ``SFTConfig`` fields, and its ``ModelConfig`` and ``ScriptArguments`` fields, which ``trl sft --config``
    reads from the same file."""
    try:
        import dataclasses

        from trl import ModelConfig, ScriptArguments, SFTConfig
    except Exception:
        return None
    return {f.name for cls in (SFTConfig, ModelConfig, ScriptArguments) for f in dataclasses.fields(cls)}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def tail_lines(path: str | os.PathLike[str], lines: int) -> str:
    """The last ``lines`` non-blank lines of a text file ("" when it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            kept = [ln for ln in fh.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    return "\n".join(kept[-lines:])


def nvml_device_info() -> list[dict[str, Any]]:
    """GPUs as NVML sees them; empty without a GPU or without the NVML library."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound on machines without a driver
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            devices.append(
                {
                    "index": i,
                    "name": pynvml.nvmlDeviceGetName(h),
                    "memory_total_bytes": int(mem.total),
                    "driver": driver,
                }
            )
        return devices
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one, else the core count)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def fingerprint(device: str | None = None) -> dict[str, Any]:
    """Versions, device name, driver and CPU. ``device`` is ``cpu``/``cuda`` if already decided."""
    fp: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "packages": package_versions(),
    }
    if "torch" in sys.modules or device is not None:
        import torch

        fp["torch_cuda"] = torch.version.cuda
        fp["cuda_available"] = bool(torch.cuda.is_available())
        if device == "cuda" and torch.cuda.is_available():
            idx = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(idx)
            fp["device"] = torch.cuda.get_device_name(idx)
            fp["device_memory_bytes"] = int(props.total_memory)
            fp["compute_capability"] = f"{props.major}.{props.minor}"
            infos = nvml_device_info()
            if infos:
                fp["driver"] = infos[0]["driver"]
        elif device == "cpu":
            fp["device"] = f"cpu: {fp['cpu']}"
            fp["torch_threads"] = torch.get_num_threads()
    return fp
