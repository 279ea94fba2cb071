"""accelerate YAML (``accelerate launch --config_file``).  [pure]"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NAME", "LABEL", "VOCAB", "detect", "to_request", "to_checklist", "tuned_keys"]

NAME = "accelerate"
LABEL = "accelerate"
VOCAB: dict[str, str] = {}


def detect(cfg: Mapping[str, Any]) -> bool:
    return bool({"distributed_type", "compute_environment"} & set(cfg))


def to_request(cfg: Mapping[str, Any]) -> dict[str, Any]:
    req: dict[str, Any] = {}
    mp = cfg.get("mixed_precision")
    if mp in ("bf16", "fp16"):
        req["precision"] = mp
    elif mp == "no":
        req["precision"] = "fp32"
    return req


def to_checklist(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {"accelerate": dict(cfg)}


def tuned_keys(candidate: Mapping[str, Any], cfg: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    if "mixed_precision" not in cfg:
        return {}
    want = {"bf16": "bf16", "fp16": "fp16"}.get(candidate["precision"], "no")
    return {} if cfg["mixed_precision"] == want else {"mixed_precision": want}
