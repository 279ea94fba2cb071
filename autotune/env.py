"""Environment fingerprint: versions and device, recorded with every probe and used in cache keys.

Imports torch lazily; nothing touches CUDA at import time.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["fingerprint", "package_versions", "versions_of", "nvml_device_info", "cpu_model", "tail_lines",
           "training_fields", "sft_fields", "dataclass_field_names", "usable_cores"]

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
    broken): what the emitted files, the write-back and ``check`` hold a key against.

    Read from the installed ``transformers/training_args.py`` without executing it (:func:`dataclass_field_names`):
    importing ``TrainingArguments`` imports torch, peft and most of transformers (4-8 s on a 2-core machine), which
    ``autotune check`` and the driver of ``autotune run`` otherwise never need. Where the source does not read as
    one plain dataclass, the class is imported as before."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("transformers")
        origin = spec.origin if spec is not None else None
        if origin is None:
            return None, None
        names = dataclass_field_names(Path(origin).parent / "training_args.py", "TrainingArguments")
        if names is not None:
            return names, metadata.version("transformers")
    except Exception:  # an unreadable source or metadata: import the class instead
        pass
    try:
        import dataclasses

        import transformers
        from transformers import TrainingArguments
    except Exception:  # transformers missing or broken: the v5 table alone
        return None, None
    return {f.name for f in dataclasses.fields(TrainingArguments)}, transformers.__version__


def dataclass_field_names(path: Any, class_name: str) -> set[str] | None:
    """The field names ``dataclasses.fields`` gives for ``class_name`` in the Python file ``path``, read from its
    syntax tree: the annotated names of the class body, ``ClassVar``/``InitVar``/``KW_ONLY`` ones left out. None unless the
    class is there once, decorated with ``dataclass``, with no base class (inherited fields would be missed) and
    no field declared inside a nested block."""
    import ast
    import re

    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    if len(found) != 1:
        return None
    (cls,) = found
    if not any(_named(d, "dataclass") for d in cls.decorator_list) or cls.bases or cls.keywords:
        return None
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            if any(isinstance(x, ast.AnnAssign) for x in ast.walk(node)):
                return None  # a field declared conditionally: not readable without running it
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if not re.search(r"\b(ClassVar|InitVar|KW_ONLY)\b", ast.unparse(node.annotation)):
                names.add(node.target.id)
    return names or None


def _named(node: Any, name: str) -> bool:
    """``node`` is ``name``, ``x.name``, or a call of either (``dataclass(...)``)."""
    import ast

    if isinstance(node, ast.Call):
        node = node.func
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


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
