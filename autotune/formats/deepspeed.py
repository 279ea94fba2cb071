"""DeepSpeed JSON (``"deepspeed": "ds.json"`` in TrainingArguments / Axolotl / LLaMA-Factory).  [pure]

Both directions: :func:`deepspeed_config` / :func:`emitted_deepspeed_config` write the measured ZeRO set-up
(``deepspeed.json``); ``to_request`` / ``tuned_keys`` read and write back a user's file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.spec.probe_request import Candidate

__all__ = ["NAME", "LABEL", "VOCAB", "deepspeed_config", "detect", "emitted_deepspeed_config",
           "packed_rows_deepspeed_config", "to_request", "to_checklist", "tuned_keys"]

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


def deepspeed_config(candidate: Candidate) -> dict[str, Any] | None:
    """A DeepSpeed config for ZeRO stage > 0 with ``auto`` values the HF integration fills in."""
    if candidate.zero_stage == 0 or candidate.sharding != "deepspeed":
        return None
    zero: dict[str, Any] = {"stage": candidate.zero_stage, "overlap_comm": True, "contiguous_gradients": True}
    if candidate.offload in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if candidate.offload == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if candidate.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    cfg: dict[str, Any] = {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
    }
    if candidate.offload != "none":
        # ZeRO-Offload refuses a torch optimizer: name DeepSpeed's AdamW (CPU-Adam when offloaded),
        # its hyper-parameters filled in from the TrainingArguments ("auto")
        if candidate.optim in ("adamw_torch", "adamw_torch_fused"):
            cfg["optimizer"] = {
                "type": "AdamW",
                "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
            }
        else:
            cfg["zero_force_ds_cpu_optimizer"] = False
    return cfg


def packed_rows_deepspeed_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``deepspeed_packed.json``: ``deepspeed.json`` with the batch left to the trainer (``auto``), for the files
    whose batch counts packed rows (Axolotl's ``micro_batch_size``, LLaMA-Factory's batch size): the HF
    integration refuses a concrete ``train_micro_batch_size_per_gpu`` or accumulation that differs from the
    trainer's, and a packed winner's rows and accumulation differ from the sequences ``deepspeed.json`` counts."""
    return {**cfg, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}


def emitted_deepspeed_config(
    candidate: Candidate, *, max_grad_norm: float = 1.0, learning_rate: float = 2e-5
) -> dict[str, Any] | None:
    """``deepspeed.json``: :func:`deepspeed_config` with the ``auto`` values resolved.

    DeepSpeed's own config class cannot read ``auto``; concrete values that equal the
    TrainingArguments are also accepted by the HF integration. ``train_batch_size`` is left out:
    DeepSpeed derives it as micro-batch x accumulation x world size.
    """
    cfg = deepspeed_config(candidate)
    if cfg is None:
        return None
    cfg = dict(cfg)
    cfg.pop("train_batch_size", None)
    cfg["train_micro_batch_size_per_gpu"] = candidate.micro_batch
    cfg["gradient_accumulation_steps"] = candidate.grad_accum
    cfg["gradient_clipping"] = max_grad_norm
    cfg["bf16"] = {"enabled": candidate.precision == "bf16"}
    cfg["fp16"] = {"enabled": candidate.precision == "fp16"}
    if "optimizer" in cfg:
        # TrainingArguments' AdamW defaults; the learning rate is the emitted training_args' one
        cfg["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": learning_rate, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
        }
    return cfg
