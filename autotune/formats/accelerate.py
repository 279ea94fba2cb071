"""accelerate YAML (``accelerate launch --config_file``).  [pure]

Both directions: :func:`accelerate_config` writes ``accelerate_config.yaml``; ``tuned_keys`` writes the
measured precision back into a user's file (:func:`mixed_precision`, the one mapping)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.spec.probe_request import Candidate

__all__ = ["NAME", "LABEL", "VOCAB", "accelerate_config", "detect", "mixed_precision", "to_request", "to_checklist",
           "tuned_keys"]

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
    want = mixed_precision(candidate["precision"])
    return {} if cfg["mixed_precision"] == want else {"mixed_precision": want}


def mixed_precision(precision: str) -> str:
    """accelerate's ``mixed_precision`` for a candidate's precision."""
    return {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no")


def accelerate_config(
    candidate: Candidate, *, device: str, deepspeed_file: str = "deepspeed.json"
) -> dict[str, Any]:
    """``accelerate_config.yaml`` content for ``accelerate launch --config_file``.

    With a DeepSpeed config file, accelerate refuses ``mixed_precision`` (and the other ZeRO keys) in
    its own config, so precision lives in the DeepSpeed file then. FSDP is written for FSDP2.
    """
    c = candidate
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "machine_rank": 0,
        "num_machines": 1,
        "num_processes": c.world_size,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": device == "cpu",
        "enable_cpu_affinity": False,
    }
    if device != "cpu":
        cfg["gpu_ids"] = "all"
    if c.zero_stage > 0 and c.sharding == "deepspeed":
        cfg["distributed_type"] = "DEEPSPEED"
        ds: dict[str, Any] = {"deepspeed_config_file": deepspeed_file}
        if c.zero_stage == 3:
            ds["zero3_init_flag"] = True
        cfg["deepspeed_config"] = ds
    elif c.zero_stage > 0 and c.sharding == "fsdp":
        cfg["distributed_type"] = "FSDP"
        cfg["mixed_precision"] = mixed_precision(c.precision)
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            # ZeRO-3 ~ full shard (re-shard parameters after forward); ZeRO-1/2 ~ keep them gathered
            "fsdp_reshard_after_forward": c.zero_stage == 3,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_offload_params": c.offload != "none",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            # checkpointing is the Trainer's (TrainingArguments), not FSDP's: one switch, not two
            "fsdp_activation_checkpointing": False,
        }
    elif c.world_size > 1:
        cfg["distributed_type"] = "MULTI_CPU" if device == "cpu" else "MULTI_GPU"
        cfg["mixed_precision"] = mixed_precision(c.precision)
    else:
        cfg["distributed_type"] = "NO"
        cfg["mixed_precision"] = mixed_precision(c.precision)
    return dict(sorted(cfg.items()))
