"""The cache key: what must match for a stored answer to be the answer to a new request.

A repeat request is answered from the stored run only when *everything that changes the answer*
is the same. The key is the sha256 of the canonical JSON of:

* ``model_config``: the model's config dict (its content, not its name: a renamed copy of the
  same config hits; without the entries that say who saved it, ``MODEL_CONFIG_BOOKKEEPING``, and with
  ``dtype`` keyed as ``torch_dtype``, its older name); for a model
  from the HF cache or the Hub, ``model_revision``: its commit hash;
* ``space``: the searched dimensions and their choices (the content of the YAML, after the
  choices this machine cannot run were dropped; not the space's name);
* ``budget_bytes``, ``seq_len``, ``effective_batch``, ``mode``;
* ``workload``: the rest of what is trained (length distribution, LoRA rank/alpha/targets (not with ``full``),
  tokenizer, trust_remote_code, seed); a ``histogram:`` lengths file and a local tokenizer by their content;
* ``probe``: how each probe measures (timed steps, warm-up steps, probe timeout, headroom, CPU
  threads);
* ``search``: what the search does with the probes (max trials, time budget, top-k, the
  confirmation's steps and policy (rounds, tolerance), whether the load monitor watches, seed,
  GPUs, the HF-default baseline, estimator pruning, ``--verify-loss`` steps and tolerance);
* ``dataset``: the dataset's content (a file's sha256 and size, a save_to_disk folder's or a cached Hub
  dataset's digest of its files) and its ``--split``, not its path or modification time;
* ``hardware``: device, platform, CPU model and core count (on a CPU also ``OMP_NUM_THREADS``, which sets a
  probe's threads, and the cores this process may use, which bound them), and per GPU its name, memory, driver and compute
  capability; the Ray address when one is given;
* ``capabilities``: the optional packages and GPU features the space was filtered with;
* ``software``: python and the versions of torch, transformers, peft, accelerate, deepspeed,
  optuna, ray, flash-attn, bitsandbytes, liger-kernel and autotune.

Nothing here imports torch: computing a key must take milliseconds (plus one read of the dataset
file), so a cached answer comes back in about a second.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.env import cpu_model, package_versions, usable_cores
from autotune.spec.dataset_ref import (
    dataset_content_digest,
    find_hub_dataset,
    find_hub_sample,
    is_hub_dataset_id,
)
from autotune.spec.probe_request import ProbeSettings, Workload

__all__ = [
    "KeyedRequest",
    "cache_key",
    "hardware_fingerprint",
    "software_versions",
    "dataset_identity",
    "workload_fields",
    "probe_fields",
]

# Workload fields keyed elsewhere (the config's content stands in for the model's name and path,
# the dataset's content for its path).
_WORKLOAD_KEYED_ELSEWHERE = ("model", "model_path", "dataset")
# "24GB" and "24000000000" are one request: the budget is keyed in bytes.
_SETTINGS_KEYED_ELSEWHERE = ("budget_text", "budget_bytes", "device")


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
    if device == "cpu":  # a CPU probe's threads: OMP_NUM_THREADS, else the core count; the cores it may use bound them
        fp["usable_cores"] = usable_cores()
        fp["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS") or None
    if device == "cuda":
        fp["gpus"] = [
            {"name": g.get("name"), "memory_total_bytes": g.get("memory_total_bytes"), "driver": g.get("driver"),
             "compute_capability": g.get("compute_capability")}
            for g in (gpus or [])
        ]
    return fp


def dataset_identity(dataset: str | os.PathLike[str] | None, split: str | None = None) -> dict[str, Any] | None:
    """The data's content: a file's sha256 and size, a save_to_disk folder's digest of its files, a Hub
    id's digest of its folder in the local datasets cache; an edited dataset changes the key, a moved
    or touched one does not. ``split`` (a DatasetDict's) is part of it. A dataset that cannot be read
    is keyed by its reference (the request is refused later)."""
    if dataset is None:
        return None
    ref = str(dataset)
    out: dict[str, Any] = {"split": split} if split is not None else {}
    hub = is_hub_dataset_id(ref)
    p = (find_hub_dataset(ref) or find_hub_sample(ref, split)) if hub else Path(ref).expanduser()
    if p is None:
        return {"hub": ref, **out}
    try:
        if p.is_dir():
            return {"digest": dataset_content_digest(p), **({"hub": ref} if hub else {}), **out}
        # a file; for a Hub id, its streamed sample (autotune.probe.hub_sample). Its size is checked before
        # it is hashed (a file past the dataset bound is a DatasetError, not minutes of hashing)
        return {"sha256": dataset_content_digest(p), "size": p.stat().st_size, **({"hub": ref, "sample": True} if hub else {}),
                **out}
    except OSError:
        return {"path": ref, **out}


def workload_fields(workload: Workload) -> dict[str, Any]:
    """The workload's fields that change the answer, as keyed (see the module docstring)."""
    out = {k: v for k, v in dataclasses.asdict(workload).items() if k not in _WORKLOAD_KEYED_ELSEWHERE}
    out["lora_targets"] = list(workload.lora_targets)
    if workload.mode == "full":  # no adapters: their rank, alpha and targets change nothing
        for name in ("lora_r", "lora_alpha", "lora_targets"):
            out.pop(name)
    if workload.tokenizer:  # a local tokenizer by its files' content (an edited one changes the key, a moved one not)
        local = Path(workload.tokenizer).expanduser()
        if local.exists():
            try:
                out["tokenizer"] = {"digest": dataset_content_digest(local)}
            except (OSError, ValueError):
                pass
    hist = _histogram_path(workload.lengths)
    out["lengths"] = "histogram" if hist is not None else _lengths_key(workload.lengths)
    if hist:
        out["lengths_file"] = dataset_identity(hist)
    return out


def _histogram_path(text: str) -> str | None:
    """The file a ``histogram:`` spec names, read as ``parse_lengths`` reads it (any case, spaces around);
    None for another kind."""
    kind, sep, path = text.strip().partition(":")
    return path.strip() if sep and kind.strip().lower() == "histogram" else None


def _lengths_key(text: str) -> str:
    """A length spec other than a histogram (keyed by its file's content, ``lengths_file``) as keyed: one spelling
    per distribution (``lognormal:3,0.5`` and ``lognormal: 3.0, 0.50`` are one); a spec that does not parse as
    it is (it is refused where it is checked)."""
    from autotune.errors import SpecError
    from autotune.spec.lengths import parse_lengths

    try:
        d = parse_lengths(text)
    except SpecError:
        return text
    if d.kind == "lognormal":
        return f"lognormal:{d.mu!r},{d.sigma!r}"
    if d.kind == "uniform":
        return f"uniform:{d.lo}-{d.hi}"
    return "fixed" if d.kind == "fixed" else text


def probe_fields(settings: ProbeSettings) -> dict[str, Any]:
    """How a probe measures: steps, warm-up, timeout, headroom, CPU threads, the CUDA allocator's setting
    (keyed only when set: a CPU run's key is what it was before the setting existed)."""
    fields = {k: v for k, v in dataclasses.asdict(settings).items() if k not in _SETTINGS_KEYED_ELSEWHERE}
    if fields.get("cuda_alloc_conf") is None:
        fields.pop("cuda_alloc_conf", None)
    return fields


# config.json entries that say who wrote the file, not what the model is: a re-save by another transformers (or
# from another folder) is the same model
MODEL_CONFIG_BOOKKEEPING = frozenset({"transformers_version", "_name_or_path", "_commit_hash"})


def _keyed_model_config(config: dict[str, Any]) -> dict[str, Any]:
    """config.json as keyed: without ``MODEL_CONFIG_BOOKKEEPING``, and transformers 5's ``dtype`` under the name
    older files give it, ``torch_dtype`` (the same entry; a re-save by transformers 5 renames it)."""
    out = {k: v for k, v in config.items() if k not in MODEL_CONFIG_BOOKKEEPING}
    if "dtype" in out and "torch_dtype" not in out:
        out["torch_dtype"] = out.pop("dtype")
    return out


@dataclass(frozen=True)
class KeyedRequest:
    """Everything that changes a run's answer, as the cache key holds it (the module docstring lists why)."""

    model_config: dict[str, Any]
    space: dict[str, Any]
    budget_bytes: int
    seq_len: int
    effective_batch: int
    mode: str
    hardware: dict[str, Any]
    software: dict[str, Any]
    dataset: dict[str, Any] | None = None
    search: dict[str, Any] | None = None
    workload: dict[str, Any] | None = None
    probe: dict[str, Any] | None = None
    capabilities: dict[str, Any] | None = None
    model_revision: str | None = None  # the HF cache snapshot's commit of a Hub model


def cache_key(keyed: KeyedRequest) -> str:
    """sha256 hex of the canonical JSON of ``keyed`` (``model_revision`` only when there is one: presets
    and local folders key as before)."""
    payload = {
        "model_config": _keyed_model_config(keyed.model_config),
        "space": keyed.space,
        "budget_bytes": int(keyed.budget_bytes),
        "seq_len": int(keyed.seq_len),
        "effective_batch": int(keyed.effective_batch),
        "mode": keyed.mode,
        "hardware": keyed.hardware,
        "software": keyed.software,
        "dataset": keyed.dataset,
        "search": keyed.search or {},
        "workload": keyed.workload or {},
        "probe": keyed.probe or {},
        "capabilities": keyed.capabilities or {},
    }
    if keyed.model_revision is not None:
        payload["model_revision"] = keyed.model_revision
    text = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
