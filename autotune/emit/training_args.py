"""Candidate -> TrainingArguments keyword arguments and model kwargs.  [pure]

One function builds the performance-relevant arguments for both the probe and the emitted
``training_args.json``, so the configuration we hand out is the one we measured. The caller passes
the field names of the installed ``TrainingArguments`` (transformers 5 renamed some, e.g.
``gradient_checkpointing`` -> ``activation_checkpointing``), so this module never imports it.
"""

from __future__ import annotations

from typing import Any

from autotune.spec.probe_request import Candidate, ProbeRequest, Workload

__all__ = [
    "performance_kwargs",
    "probe_kwargs",
    "model_dtype",
    "model_kwargs",
    "deepspeed_config",
    "checkpointing_field",
]


def checkpointing_field(fields: set[str]) -> str:
    """The installed transformers' name for gradient checkpointing."""
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def model_dtype(candidate: Candidate, workload: Workload) -> str:
    """dtype the model is built in.

    Full fine-tuning keeps fp32 master weights and lets the Trainer autocast (bf16/fp16 AMP), which
    is what ``bf16=True`` means in TrainingArguments. LoRA/QLoRA freeze the base, so it is held in
    the 16-bit type and only the adapters stay fp32 (peft's default).
    """
    if workload.mode in ("lora", "qlora") and candidate.precision in ("bf16", "fp16"):
        return "bfloat16" if candidate.precision == "bf16" else "float16"
    return "float32"


def model_kwargs(candidate: Candidate, workload: Workload) -> dict[str, Any]:
    """Keyword arguments for ``AutoModelForCausalLM.from_pretrained`` / ``from_config``."""
    return {"attn_implementation": candidate.attn, "dtype": model_dtype(candidate, workload)}


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
    return cfg


def performance_kwargs(
    candidate: Candidate, workload: Workload, *, fields: set[str], device: str
) -> dict[str, Any]:
    """The arguments that decide speed and memory. ``device`` is ``"cpu"`` or ``"cuda"``."""
    c = candidate
    kw: dict[str, Any] = {
        "per_device_train_batch_size": c.micro_batch,
        "gradient_accumulation_steps": c.grad_accum,
        "bf16": c.precision == "bf16",
        "fp16": c.precision == "fp16",
        "dataloader_num_workers": c.workers,
        "dataloader_pin_memory": c.pin_memory,
        "optim": c.optim,
        "seed": workload.seed,
        "data_seed": workload.seed,
        "remove_unused_columns": False,
    }
    if c.workers > 0:
        kw["dataloader_persistent_workers"] = True
    ckpt = checkpointing_field(fields)
    kw[ckpt] = c.grad_ckpt
    if c.grad_ckpt:
        # non-reentrant checkpointing works with frozen bases (LoRA) and is torch's recommendation
        kw[f"{ckpt}_kwargs"] = {"use_reentrant": False}
    if device == "cuda":
        kw["tf32"] = c.precision in ("tf32", "bf16", "fp16")
    if device == "cpu":
        kw["use_cpu"] = True
    if c.torch_compile:
        kw["torch_compile"] = True
    if c.liger:
        kw["use_liger_kernel"] = True
    ds = deepspeed_config(c)
    if ds is not None:
        kw["deepspeed"] = ds
    if c.sharding == "fsdp" and c.zero_stage > 0:
        kw["fsdp"] = "full_shard auto_wrap" if c.zero_stage == 3 else "shard_grad_op auto_wrap"
        fsdp_cfg: dict[str, Any] = {"version": 2}
        if c.offload != "none":
            kw["fsdp"] += " offload"
        kw["fsdp_config"] = fsdp_cfg
    unknown = sorted(k for k in kw if k not in fields)
    if unknown:
        # e.g. an older transformers without use_liger_kernel: say so rather than drop silently
        raise ValueError(f"installed TrainingArguments lacks {', '.join(unknown)}")
    return kw


def probe_kwargs(request: ProbeRequest, *, fields: set[str], device: str) -> dict[str, Any]:
    """Everything a probe passes to ``TrainingArguments`` (besides ``output_dir``)."""
    kw = performance_kwargs(request.candidate, request.workload, fields=fields, device=device)
    kw.update(
        {
            "max_steps": request.settings.warmup_steps + request.settings.steps,
            "learning_rate": 2e-4 if request.workload.mode != "full" else 2e-5,
            "lr_scheduler_type": "constant",
            "warmup_steps": 0,
            "save_strategy": "no",
            "logging_strategy": "no",
            "report_to": "none",
            "disable_tqdm": True,
        }
    )
    return kw
