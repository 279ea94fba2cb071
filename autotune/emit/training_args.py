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
    "LEARNING_RATES",
    "RUN_DEFAULTS",
    "RUN_ONLY_KEYS",
    "emitted_training_args",
    "emitted_model_kwargs",
    "emitted_deepspeed_config",
    "quantization_config",
    "lora_config",
    "accelerate_config",
    "mixed_precision",
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
        # bf16 and TF32 both imply an Ampere-or-newer GPU, where tf32=True is valid. TrainingArguments
        # raises on tf32=True elsewhere (T4, V100), so fp16/fp32 say False (always accepted; and
        # without it transformers 5 turns TF32 on by itself for fp32, which would blur fp32 vs tf32).
        kw["tf32"] = c.precision in ("tf32", "bf16")
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
            if device == "cuda":
                # offloaded parameters are CPU DTensors: clip_grad_norm_ (and any collective on them)
                # needs a gloo backend beside NCCL. `accelerate launch` picks this pair itself from its
                # FSDP_OFFLOAD_PARAMS variable; TrainingArguments alone gave an NCCL-only group.
                kw["ddp_backend"] = "cuda:nccl,cpu:gloo"
        kw["fsdp_config"] = fsdp_cfg
    unknown = sorted(k for k in kw if k not in fields)
    if unknown:
        # e.g. an older transformers without use_liger_kernel: say so rather than drop silently
        raise ValueError(f"installed TrainingArguments lacks {', '.join(unknown)}")
    return kw


# Arguments where the probe's value is its own (a short measured run) and ``training_args.json``
# carries a real run's: the schedule and the bookkeeping. Speed and memory depend on none of them;
# every other argument is emitted with the probe's value (tests/test_train_script.py checks it).
RUN_ONLY_KEYS = frozenset({
    "max_steps", "lr_scheduler_type", "warmup_steps", "warmup_ratio", "save_strategy", "logging_strategy",
    "report_to", "disable_tqdm", "train_sampling_strategy",
})  # fmt: skip


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
    if "train_sampling_strategy" in fields:
        # the probe's Trainer reads its dataset in the dataset's own sampler order anyway
        # (autotune.probe.collate.measured_trainer_class); sequential is the plain Trainer's nearest
        kw["train_sampling_strategy"] = "sequential"
    return kw


def lora_target_modules(leaf_names: set[str], requested: tuple[str, ...] | list[str]) -> list[str] | str:
    """The requested LoRA targets present in the model, or ``"all-linear"`` when none are.

    GPT-2 names its projections ``c_attn``/``c_proj``, so the Llama-style default
    ``q_proj,k_proj,v_proj,o_proj`` matches nothing there; peft's ``all-linear`` is the fallback.
    """
    present = [t for t in requested if t in leaf_names]
    return present if present else "all-linear"


# ---------------------------------------------------------------------------------------------
# Emitted configuration: the tuned knobs above plus sound defaults for a real run.
# ---------------------------------------------------------------------------------------------

# LoRA trains small adapters and tolerates (needs) a higher rate; full fine-tuning moves every weight.
LEARNING_RATES: dict[str, float] = {"full": 2e-5, "lora": 2e-4, "qlora": 2e-4}

# Defaults from the domain notes for everything a search does not tune: durable checkpoints with a
# bounded number kept, regular logging, a cosine schedule with a short warm-up.
RUN_DEFAULTS: dict[str, Any] = {
    "num_train_epochs": 3,
    "lr_scheduler_type": "cosine",
    "logging_strategy": "steps",
    "logging_steps": 10,
    "logging_first_step": True,
    "save_strategy": "steps",
    "save_steps": 500,
    "save_total_limit": 3,
}
WARMUP_RATIO = 0.03
LORA_DROPOUT = 0.05

def emitted_training_args(
    request: ProbeRequest,
    *,
    fields: set[str],
    device: str,
    report_to: str | list[str] = "none",
) -> dict[str, Any]:
    """``training_args.json``: loads unmodified as ``TrainingArguments(output_dir=..., **it)``.

    The tuned knobs come from :func:`performance_kwargs` (the probe's own source), so what is
    handed out is what was measured. Defaults the installed transformers does not know are dropped
    (they are conveniences); ``warmup_ratio`` (removed in 5.2) is written as a fractional
    ``warmup_steps`` where that is the installed spelling.

    ``report_to`` defaults to ``"none"``: ``TrainingArguments`` accepts any integration name, but the
    ``Trainer`` raises at construction when that integration is not installed, so only a caller that
    has checked (the effectful side, e.g. tensorboard importable) should name one.
    """
    kw = performance_kwargs(request.candidate, request.workload, fields=fields, device=device)
    extra: dict[str, Any] = dict(RUN_DEFAULTS)
    extra["learning_rate"] = LEARNING_RATES[request.workload.mode]
    if "warmup_ratio" in fields:
        extra["warmup_ratio"] = WARMUP_RATIO
    else:
        extra["warmup_steps"] = WARMUP_RATIO  # transformers >= 5: a float < 1 is a ratio
    extra["report_to"] = report_to
    for key, value in extra.items():
        if key in fields and key not in kw:
            kw[key] = value
    return kw


def quantization_config(candidate: Candidate, workload: Workload) -> dict[str, Any] | None:
    """BitsAndBytesConfig fields for QLoRA (4-bit NF4, double quantisation); None otherwise.

    ``quant_method`` is included so the dict also works where transformers accepts a plain dict.
    """
    if workload.mode != "qlora":
        return None
    compute = {"bf16": "bfloat16", "fp16": "float16"}.get(candidate.precision, "float32")
    return {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_compute_dtype": compute,
        "bnb_4bit_use_double_quant": True,
    }


def emitted_model_kwargs(candidate: Candidate, workload: Workload) -> dict[str, Any]:
    """``model_kwargs.json``: keyword arguments for ``AutoModelForCausalLM.from_pretrained``."""
    kw = model_kwargs(candidate, workload)
    qc = quantization_config(candidate, workload)
    if qc is not None:
        kw["quantization_config"] = qc
    return kw


def lora_config(
    workload: Workload, *, target_modules: list[str] | str | None = None
) -> dict[str, Any] | None:
    """``lora_config.json``: keyword arguments for ``peft.LoraConfig`` (None for full fine-tuning)."""
    if workload.mode == "full":
        return None
    targets: list[str] | str = list(workload.lora_targets) if target_modules is None else target_modules
    return {
        "r": workload.lora_r,
        "lora_alpha": workload.lora_alpha,
        "lora_dropout": LORA_DROPOUT,
        "target_modules": targets,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }


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


def mixed_precision(candidate: Candidate) -> str:
    """accelerate's ``mixed_precision`` for the candidate's precision."""
    return {"bf16": "bf16", "fp16": "fp16"}.get(candidate.precision, "no")


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
        cfg["mixed_precision"] = mixed_precision(c)
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
        cfg["mixed_precision"] = mixed_precision(c)
    else:
        cfg["distributed_type"] = "NO"
        cfg["mixed_precision"] = mixed_precision(c)
    return dict(sorted(cfg.items()))
