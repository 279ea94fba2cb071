"""TRL ``SFTConfig`` as JSON or YAML: TrainingArguments plus TRL's own fields.  [pure]

autotune's packing (several sequences in one row, no padding, attention kept per sequence through
position ids) is TRL's ``padding_free: true``; ``packing: true`` (best-fit decreasing bins of
``max_length``) also runs padding-free in TRL >= 0.20, so either key counts as packing when read,
and a write-back sets the one the file already uses (``packing`` if neither).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.formats import training_args as _ta
from autotune.formats._common import changed, local_dataset

__all__ = ["NAME", "LABEL", "VOCAB", "MARKERS", "detect", "to_request", "to_checklist", "tuned_keys"]

NAME = "trl"
LABEL = "TRL SFTConfig"
VOCAB: dict[str, str] = {}
# SFTConfig fields TrainingArguments does not have (trl 1.16); any one marks the file as TRL.
MARKERS = frozenset({
    "max_length", "packing", "padding_free", "packing_strategy", "dataset_text_field", "completion_only_loss",
    "assistant_only_loss", "model_init_kwargs", "dataset_num_proc", "eval_packing", "pad_to_multiple_of",
    "chat_template_path", "activation_offloading", "dataset_kwargs", "truncation_mode", "shuffle_dataset",
})  # fmt: skip
DEFAULTS = {**_ta.DEFAULTS, "packing": False, "padding_free": False}


def detect(cfg: Mapping[str, Any]) -> bool:
    return bool(MARKERS & set(cfg))


def to_request(cfg: Mapping[str, Any]) -> dict[str, Any]:
    req = _ta.to_request(cfg)
    if isinstance(cfg.get("max_length"), int):
        req["seq_len"] = cfg["max_length"]
    req["packing"] = bool(cfg.get("packing") or cfg.get("padding_free"))
    mik = cfg.get("model_init_kwargs")
    if isinstance(mik, Mapping) and isinstance(mik.get("attn_implementation"), str):
        req["attn"] = mik["attn_implementation"]
    ds = local_dataset(cfg.get("dataset_name"))
    if ds:
        req["dataset"] = ds
    return req


def to_checklist(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {"training_args": dict(cfg)}
    mik = cfg.get("model_init_kwargs")
    if isinstance(mik, Mapping):
        out["model_kwargs"] = dict(mik)
    return out


def tuned_keys(
    candidate: Mapping[str, Any], cfg: Mapping[str, Any], *, fields: set[str] | None = None
) -> dict[str, Any]:
    wanted = _ta.lever_values(candidate, cfg, fields)
    key = "padding_free" if "padding_free" in cfg and "packing" not in cfg else "packing"
    wanted[key] = bool(candidate["packing"])
    return changed(cfg, wanted, DEFAULTS)
