"""The cache key: what must match for a stored answer to be the answer to a new request.

Hash of: the model's config dict (not its name: a renamed copy of the same config hits), the
search space's dimensions, the budget in bytes, sequence length, effective batch, mode, dataset
identity, search settings that change the answer (max trials, seed), the hardware fingerprint
(GPU names and memory, or CPU model and core count) and the software versions (torch,
transformers, peft, accelerate, deepspeed, optuna, autotune, python). Nothing here imports torch:
computing a key must take milliseconds, so a cached answer comes back in about a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from autotune.env import cpu_model, package_versions

__all__ = ["cache_key", "hardware_fingerprint", "software_versions", "dataset_identity"]

def software_versions() -> dict[str, str | None]:
    """Python and the versions of the packages measurements depend on (None: not installed)."""
    return {"python": platform.python_version(), **package_versions()}


def hardware_fingerprint(device: str, gpus: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What the measurements depend on. ``gpus``: NVML-style dicts of the GPUs in use."""
    fp: dict[str, Any] = {
        "device": device,
        "platform": f"{platform.system()}-{platform.machine()}",
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    if device == "cuda":
        fp["gpus"] = [
            {"name": g.get("name"), "memory_total_bytes": g.get("memory_total_bytes"), "driver": g.get("driver")}
            for g in (gpus or [])
        ]
    return fp


def dataset_identity(dataset: str | None) -> dict[str, Any] | None:
    """Path, size and modification time (cheap; a changed file changes the key)."""
    if dataset is None:
        return None
    p = Path(dataset)
    try:
        st = p.stat()
    except OSError:
        return {"path": str(dataset)}
    return {"path": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def cache_key(
    *,
    model_config: dict[str, Any],
    space: dict[str, Any],
    budget_bytes: int,
    seq_len: int,
    effective_batch: int,
    mode: str,
    hardware: dict[str, Any],
    software: dict[str, Any],
    dataset: dict[str, Any] | None = None,
    search: dict[str, Any] | None = None,
) -> str:
    """sha256 hex of the canonical JSON of everything above."""
    payload = {
        "model_config": model_config,
        "space": space,
        "budget_bytes": int(budget_bytes),
        "seq_len": int(seq_len),
        "effective_batch": int(effective_batch),
        "mode": mode,
        "hardware": hardware,
        "software": software,
        "dataset": dataset,
        "search": search or {},
    }
    text = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
