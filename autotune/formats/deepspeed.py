"""DeepSpeed JSON (``"deepspeed": "ds.json"`` in TrainingArguments / Axolotl / LLaMA-Factory).  [pure]"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NAME", "LABEL", "VOCAB", "detect", "to_request", "to_checklist", "tuned_keys"]

NAME = "deepspeed"
LABEL = "DeepSpeed"
VOCAB: dict[str, str] = {}
_KEYS = frozenset({"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"})


def detect(cfg: Mapping[str, Any]) -> bool:
    return bool(_KEYS & set(cfg))


def to_request(cfg: Mapping[str, Any]) -> dict[str, Any]:
    req: dict[str, Any] = {}
    zero = cfg.get("zero_optimization") or {}
    if isinstance(zero.get("stage"), int):
        req["zero_stage"] = zero["stage"]
    if (zero.get("offload_param") or {}).get("device") in ("cpu", "nvme"):
        req["offload"] = "params"
    elif (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme"):
        req["offload"] = "optimizer"
    mb, acc = cfg.get("train_micro_batch_size_per_gpu"), cfg.get("gradient_accumulation_steps", 1)
    if isinstance(mb, int) and isinstance(acc, int):
        req.update(micro_batch=mb, grad_accum=acc, effective_batch=mb * acc)
    return req


def to_checklist(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {"deepspeed": dict(cfg)}


def tuned_keys(candidate: Mapping[str, Any], cfg: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """Only the batch keys that hold numbers ('auto' ones follow TrainingArguments by themselves)."""
    out: dict[str, Any] = {}
    if isinstance(cfg.get("train_micro_batch_size_per_gpu"), int):
        out["train_micro_batch_size_per_gpu"] = candidate["micro_batch"]
    if isinstance(cfg.get("gradient_accumulation_steps"), int):
        out["gradient_accumulation_steps"] = candidate["grad_accum"]
    return {k: v for k, v in out.items() if cfg.get(k) != v}
