"""Hugging Face ``TrainingArguments`` as JSON or YAML (``TrainingArguments(**file)``).  [pure]

The key set is the installed transformers' (read by the caller and passed in as ``fields``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.formats._common import changed

__all__ = ["NAME", "LABEL", "VOCAB", "MARKERS", "detect", "to_request", "to_checklist", "tuned_keys", "precision_of"]

NAME = "training_args"
LABEL = "TrainingArguments"
VOCAB: dict[str, str] = {}  # its own vocabulary
# keys only TrainingArguments-shaped files have (Axolotl / LLaMA-Factory use other names for these)
MARKERS = frozenset({
    "per_device_train_batch_size", "gradient_accumulation_steps", "output_dir", "learning_rate",
    "num_train_epochs", "max_steps", "optim", "bf16", "fp16", "save_strategy", "logging_steps", "report_to",
})  # fmt: skip

DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "bf16": False, "fp16": False,
    "gradient_checkpointing": False, "activation_checkpointing": False, "dataloader_num_workers": 0,
    "dataloader_pin_memory": True, "dataloader_persistent_workers": False, "optim": "adamw_torch_fused",
    "torch_compile": False, "use_liger_kernel": False,
}  # fmt: skip


def detect(cfg: Mapping[str, Any]) -> bool:
    return bool(MARKERS & set(cfg))


def precision_of(bf16: Any, fp16: Any, tf32: Any) -> str:
    if bf16 is True or bf16 == "auto":
        return "bf16"
    if fp16 is True:
        return "fp16"
    return "tf32" if tf32 is True else "fp32"


def _ckpt_key(cfg: Mapping[str, Any], fields: set[str] | None) -> str:
    for key in ("activation_checkpointing", "gradient_checkpointing"):
        if key in cfg:
            return key
    if fields is not None and "activation_checkpointing" in fields:
        return "activation_checkpointing"
    return "gradient_checkpointing"


def to_request(cfg: Mapping[str, Any]) -> dict[str, Any]:
    mb = cfg.get("per_device_train_batch_size", 8)
    acc = cfg.get("gradient_accumulation_steps", 1)
    req: dict[str, Any] = {
        "micro_batch": mb, "grad_accum": acc,
        "precision": precision_of(cfg.get("bf16"), cfg.get("fp16"), cfg.get("tf32")),
        "workers": cfg.get("dataloader_num_workers", 0),
        "grad_ckpt": bool(cfg.get("activation_checkpointing", cfg.get("gradient_checkpointing", False))),
    }  # fmt: skip
    if isinstance(mb, int) and isinstance(acc, int):
        req["effective_batch"] = mb * acc
    ds = cfg.get("deepspeed")
    if isinstance(ds, Mapping):
        stage = (ds.get("zero_optimization") or {}).get("stage")
        if isinstance(stage, int):
            req["zero_stage"] = stage
    return req


def to_checklist(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {"training_args": dict(cfg)}


def lever_values(candidate: Mapping[str, Any], cfg: Mapping[str, Any], fields: set[str] | None) -> dict[str, Any]:
    """TrainingArguments keys for the candidate's levers (as autotune's own emitter names them)."""
    c = candidate
    prec = c["precision"]
    out: dict[str, Any] = {
        "per_device_train_batch_size": c["micro_batch"],
        "gradient_accumulation_steps": c["grad_accum"],
        "bf16": prec == "bf16",
        "fp16": prec == "fp16",
        _ckpt_key(cfg, fields): bool(c["grad_ckpt"]),
        "dataloader_num_workers": c["workers"],
        "dataloader_pin_memory": bool(c["pin_memory"]),
        "optim": c["optim"],
        "torch_compile": bool(c["torch_compile"]),
        "use_liger_kernel": bool(c["liger"]),
    }
    if c["workers"] > 0:
        out["dataloader_persistent_workers"] = True
    if prec == "tf32" or "tf32" in cfg:
        out["tf32"] = prec in ("tf32", "bf16")
    return out


def tuned_keys(
    candidate: Mapping[str, Any], cfg: Mapping[str, Any], *, fields: set[str] | None = None
) -> dict[str, Any]:
    return changed(cfg, lever_values(candidate, cfg, fields), DEFAULTS)
