"""Environment fingerprint: versions and device, recorded with every probe and used in cache keys.

Imports torch lazily; nothing touches CUDA at import time.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["fingerprint", "package_versions", "versions_of", "nvml_device_info", "cpu_model", "tail_lines",
           "training_fields", "training_enums", "sft_fields", "dataclass_field_names", "usable_cores"]

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
        names = _training_args_source_fields()
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


def sft_fields() -> set[str] | None:
    """The names a ``trl sft`` config may hold (None if trl is not installed): the installed TRL's
    ``SFTConfig`` fields, and its ``ModelConfig`` and ``ScriptArguments`` fields, which ``trl sft --config``
    reads from the same file. Read from TRL's and transformers' sources as :func:`training_fields` reads
    ``TrainingArguments`` (importing ``SFTConfig`` imports ``TrainingArguments``), else imported."""
    try:
        trl = _package_dir("trl")
        ta = _training_args_source_fields()
        if trl is not None and ta is not None:
            base = dataclass_field_names(trl / "trainer" / "base_config.py", "_BaseConfig",
                                         inherited={"TrainingArguments": ta})
            sft = dataclass_field_names(trl / "trainer" / "sft_config.py", "SFTConfig", inherited={"_BaseConfig": base})
            model = dataclass_field_names(trl / "trainer" / "model_config.py", "ModelConfig")
            script = dataclass_field_names(trl / "scripts" / "utils.py", "ScriptArguments")
            if sft is not None and model is not None and script is not None:
                return sft | model | script
    except Exception:  # a source laid out otherwise: import the classes instead
        pass
    try:
        import dataclasses

        from trl import ModelConfig, ScriptArguments, SFTConfig
    except Exception:
        return None
    return {f.name for cls in (SFTConfig, ModelConfig, ScriptArguments) for f in dataclasses.fields(cls)}


# TrainingArguments' keys whose value __post_init__ converts through an enum (a ValueError at construction for any
# other value): key -> (file under transformers/, enum class)
_TRAINING_ENUMS = {
    "optim": ("training_args.py", "OptimizerNames"), "lr_scheduler_type": ("trainer_utils.py", "SchedulerType"),
    "eval_strategy": ("trainer_utils.py", "IntervalStrategy"), "logging_strategy": ("trainer_utils.py", "IntervalStrategy"),
    "save_strategy": ("trainer_utils.py", "SaveStrategy"), "hub_strategy": ("trainer_utils.py", "HubStrategy"),
}


def training_enums() -> dict[str, frozenset[str]]:
    """The values the installed transformers accepts for TrainingArguments' enum-valued keys (``optim``,
    ``lr_scheduler_type``, the strategies), and ``report_to``'s names (the Trainer's integrations, ``all`` and
    ``none``; another name stops the Trainer at its start): read from its sources as :func:`training_fields` reads
    the field names. A key whose values cannot be read is left out ({} without transformers)."""
    tf = _package_dir("transformers")
    if tf is None:
        return {}
    out: dict[str, frozenset[str]] = {}
    for key, (file, enum) in _TRAINING_ENUMS.items():
        values = _source_names(tf / file, enum)
        if values:
            out[key] = values
    integrations = _source_names(tf / "integrations" / "integration_utils.py", "INTEGRATION_TO_CALLBACK")
    if integrations:
        out["report_to"] = integrations | {"all", "none"}
    return out


def _source_names(path: Path, name: str) -> frozenset[str] | None:
    """The string values of the enum class ``name`` in ``path`` (its ``NAME = "value"`` lines), or the string keys of
    the dict assigned to ``name`` at module level; None where the file or the name does not read that way."""
    try:
        st = os.stat(path)
        return _names_in_source(str(path), st.st_mtime_ns, st.st_size, name)
    except (OSError, SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=16)
def _names_in_source(path: str, mtime_ns: int, size: int, name: str) -> frozenset[str] | None:
    import ast

    for node in ast.parse(Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return frozenset(s.value.value for s in node.body if isinstance(s, ast.Assign)
                             and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)) or None
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)):
            return frozenset(k.value for k in node.value.keys
                             if isinstance(k, ast.Constant) and isinstance(k.value, str)) or None
    return None


def _package_dir(name: str) -> Path | None:
    """The folder of the installed package ``name``, found without importing it (None if absent)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    return Path(spec.origin).parent if spec is not None and spec.origin is not None else None


def _training_args_source_fields() -> set[str] | None:
    tf = _package_dir("transformers")
    return None if tf is None else dataclass_field_names(tf / "training_args.py", "TrainingArguments")


def dataclass_field_names(path: Any, class_name: str, *,
                          inherited: dict[str, set[str] | None] | None = None) -> set[str] | None:
    """The field names ``dataclasses.fields`` gives for ``class_name`` in the Python file ``path``, read from its
    syntax tree: the annotated names of the class body, ``ClassVar``/``InitVar``/``KW_ONLY`` ones left out, and the
    fields of each base class, which ``inherited`` gives by name. None unless the class is there once, decorated
    with ``dataclass``, every base class is in ``inherited`` (and not None), and no field is declared inside a
    nested block. A file is parsed once per process while it is unchanged (``check`` asks twice for each)."""
    st = os.stat(path)
    read = _dataclass_in_source(str(path), st.st_mtime_ns, st.st_size, class_name)
    if read is None:
        return None
    own, bases = read
    names = set(own)
    for base in bases:
        got = (inherited or {}).get(base)
        if got is None:
            return None  # a base whose fields are not known: they would be missed
        names |= got
    return names or None


@functools.lru_cache(maxsize=64)
def _dataclass_in_source(path: str, mtime_ns: int, size: int,
                         class_name: str) -> tuple[frozenset[str], tuple[str, ...]] | None:
    """(own field names, base class names) of the dataclass ``class_name`` in ``path``; None where unreadable."""
    import ast
    import re

    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    if len(found) != 1:
        return None
    (cls,) = found
    if not any(_name_of(d) == "dataclass" for d in cls.decorator_list) or cls.keywords:
        return None
    own: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            if any(isinstance(x, ast.AnnAssign) for x in ast.walk(node)):
                return None  # a field declared conditionally: not readable without running it
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if not re.search(r"\b(ClassVar|InitVar|KW_ONLY)\b", ast.unparse(node.annotation)):
                own.add(node.target.id)
    return frozenset(own), tuple(_name_of(b) or "" for b in cls.bases)


def _name_of(node: Any) -> str | None:
    """``name`` of ``name``, ``x.name`` or a call of either (``dataclass(...)``)."""
    import ast

    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


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
