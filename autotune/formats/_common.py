"""What every format module shares: the request fields, the lever values of a candidate.  [pure]

A format module maps one config format to autotune and back, both directions in one place:

- ``detect(cfg) -> bool``: the file is this format (by its keys)
- ``to_request(cfg) -> dict``: the partial request (``REQUEST_FIELDS``; absent = not in the file)
- ``to_checklist(cfg) -> dict[kind, dict]``: the config in TrainingArguments vocabulary, split by
  kind (training_args, model_kwargs, lora, deepspeed) for the checklist in ``autotune.check``
- ``VOCAB``: TrainingArguments name -> this format's key (or a phrase where it has none)
- ``tuned_keys(candidate, cfg) -> dict``: the format's keys to change for a tuned candidate (only
  those whose value differs from what the file means now, so a write-back touches nothing else)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["REQUEST_FIELDS", "changed", "local_dataset"]

# model / mode / seq_len / effective_batch are held from the file; the rest describe its current levers.
REQUEST_FIELDS = (
    "model", "mode", "seq_len", "effective_batch", "micro_batch", "grad_accum", "dataset", "lora_r",
    "lora_alpha", "precision", "attn", "workers", "packing", "grad_ckpt", "zero_stage", "offload",
)  # fmt: skip


def changed(cfg: Mapping[str, Any], wanted: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``wanted`` that differ from the file's value (or the default, when absent)."""
    out: dict[str, Any] = {}
    for key, value in wanted.items():
        current = cfg[key] if key in cfg else defaults.get(key, _MISSING)
        if current is _MISSING or current != value or type(current) is not type(value):
            out[key] = value
    return out


_MISSING: Any = object()


def local_dataset(path: Any) -> str | None:
    """A dataset reference that names a local jsonl/parquet file (the probe can read it), else None."""
    if isinstance(path, str) and path.endswith((".jsonl", ".json", ".parquet")) and not path.startswith("hf://"):
        return path
    return None
