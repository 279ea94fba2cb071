"""Hugging Face ``TrainingArguments``: the emitted ``training_args.json`` and a user's JSON/YAML, both ways.  [pure]

:func:`lever_values` is the one table of what each lever is written as (``LEVER_KEYS`` names the keys):
the probe's arguments (:func:`probe_kwargs`), the emitted file (:func:`emitted_training_args`), TRL's and
LLaMA-Factory's files and the write-back into a user's file (:func:`tuned_keys`) all take the levers from it,
so the configuration handed out is the one measured. The caller passes the field names of the installed
``TrainingArguments`` (transformers 5 renamed some, e.g. ``gradient_checkpointing`` ->
``activation_checkpointing``), so this module never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.formats._common import Measured, changed
from autotune.formats.deepspeed import deepspeed_config
from autotune.spec.probe_request import Candidate, ProbeRequest, Workload

__all__ = [
    "NAME", "LABEL", "VOCAB", "MARKERS", "DEFAULTS", "LEVER_KEYS", "LEARNING_RATES", "RUN_DEFAULTS", "RUN_ONLY_KEYS",
    "WARMUP_RATIO", "CKPT_KWARGS", "checkpointed_every", "stated_checkpointing_kwargs", "checkpointing_field", "detect", "emitted_training_args", "lever_values", "performance_kwargs",
    "HELD_LEVERS", "UNEXPRESSED", "candidate_of", "precision_of", "probe_kwargs", "to_checklist", "to_request", "tuned_keys",
    "written_back",
]  # fmt: skip

NAME = "training_args"
LABEL = "TrainingArguments"
VOCAB: dict[str, str] = {}  # its own vocabulary
# keys only TrainingArguments-shaped files have (Axolotl / LLaMA-Factory use other names for these)
MARKERS = frozenset({
    "per_device_train_batch_size", "gradient_accumulation_steps", "output_dir", "learning_rate",
    "num_train_epochs", "max_steps", "optim", "bf16", "fp16", "save_strategy", "logging_steps", "report_to",
})  # fmt: skip

# transformers >= 5 checkpoints non-reentrantly when no kwargs are given
_NON_REENTRANT = {"use_reentrant": False}
DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "bf16": False, "fp16": False,
    "gradient_checkpointing": False, "activation_checkpointing": False, "dataloader_num_workers": 0,
    "dataloader_pin_memory": True, "dataloader_persistent_workers": False, "optim": "adamw_torch_fused",
    "torch_compile": False, "use_liger_kernel": False, "gradient_checkpointing_kwargs": _NON_REENTRANT,
    "activation_checkpointing_kwargs": _NON_REENTRANT, "use_cpu": False,
}  # fmt: skip

# autotune lever -> the TrainingArguments key(s) that carry it
LEVER_KEYS: dict[str, tuple[str, ...]] = {
    "micro_batch": ("per_device_train_batch_size",),
    "grad_accum": ("gradient_accumulation_steps",),
    "grad_ckpt": ("activation_checkpointing", "gradient_checkpointing", "activation_checkpointing_kwargs",
                  "gradient_checkpointing_kwargs"),
    "ckpt_every": ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"),  # every_n_layers
    "precision": ("bf16", "fp16", "tf32"),
    "workers": ("dataloader_num_workers", "dataloader_persistent_workers"),
    "pin_memory": ("dataloader_pin_memory",),
    "optim": ("optim",),
    "torch_compile": ("torch_compile",),
    "liger": ("use_liger_kernel",),
    "zero_stage": ("deepspeed", "fsdp", "fsdp_config"),
    "offload": ("deepspeed", "fsdp", "ddp_backend"),
    "attn": (),  # a model argument: model_kwargs.json
    "device": ("use_cpu",),  # where it was measured: a CPU answer says so, or the Trainer looks for a GPU
}
# levers a write-back leaves as the file has them: the distributed set-up (a DeepSpeed/FSDP config the user owns)
HELD_LEVERS = ("zero_stage", "offload")
# levers a TrainingArguments file has no key for -> what training from it does instead (formats._common):
# packing is the data collator's (best/train.py packs as measured; a Trainer script of yours does not)
UNEXPRESSED: dict[str, str] = {"packing": "pads each micro-batch unless your own script packs"}
# levers off by default, written into an emitted file only when on (an older transformers may lack the key)
_ONLY_WHEN_ON = ("torch_compile", "use_liger_kernel")


def checkpointing_field(fields: set[str] | frozenset[str]) -> str:
    """The installed transformers' name for gradient checkpointing."""
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def _sharding_values(c: Candidate, device: str | None) -> dict[str, Any]:
    kw: dict[str, Any] = {}
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
    return kw


def lever_values(candidate: Candidate, at: Measured, *, ckpt_key: str | None = None) -> dict[str, Any]:
    """The TrainingArguments keys of every lever (``LEVER_KEYS``), each with the value that was measured.

    ``ckpt_key``: the checkpointing key to write (default: the installed transformers' name)."""
    c = candidate
    ckpt = ckpt_key or checkpointing_field(at.fields or frozenset())
    kw: dict[str, Any] = {
        "per_device_train_batch_size": c.micro_batch,
        "gradient_accumulation_steps": c.grad_accum,
        "bf16": c.precision == "bf16",
        "fp16": c.precision == "fp16",
        "dataloader_num_workers": c.workers,
        "dataloader_pin_memory": c.pin_memory,
        "optim": c.optim,
        ckpt: c.grad_ckpt,
        "torch_compile": bool(c.torch_compile),
        "use_liger_kernel": bool(c.liger),
    }
    if c.workers > 0:
        kw["dataloader_persistent_workers"] = True
    if c.grad_ckpt:
        # non-reentrant checkpointing works with frozen bases (LoRA) and is torch's recommendation;
        # every_n_layers (transformers >= 5.24) checkpoints one decoder layer in k
        kw[f"{ckpt}_kwargs"] = {**_NON_REENTRANT, **({"every_n_layers": c.ckpt_every} if c.ckpt_every > 1 else {})}
    if at.device == "cuda":
        # bf16 and TF32 both imply an Ampere-or-newer GPU, where tf32=True is valid. TrainingArguments
        # raises on tf32=True elsewhere (T4, V100), so fp16/fp32 say False (always accepted; and
        # without it transformers turns TF32 on by itself under torch_compile, which would blur fp32 vs tf32).
        kw["tf32"] = c.precision in ("tf32", "bf16")
    if at.device == "cpu":
        kw["use_cpu"] = True
    kw.update(_sharding_values(c, at.device))
    return kw


def performance_kwargs(
    candidate: Candidate, workload: Workload, *, fields: set[str], device: str
) -> dict[str, Any]:
    """The arguments that decide speed and memory (the probe's and the emitted file's). ``device`` is
    ``"cpu"`` or ``"cuda"``."""
    kw = lever_values(candidate, Measured(device=device, seq_len=workload.seq_len, fields=frozenset(fields)))
    for key in _ONLY_WHEN_ON:
        if not kw[key]:
            del kw[key]
    kw.update(seed=workload.seed, data_seed=workload.seed, remove_unused_columns=False)
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


def detect(cfg: Mapping[str, Any]) -> bool:
    return bool(MARKERS & set(cfg))


def precision_of(bf16: Any, fp16: Any, tf32: Any) -> str:
    if bf16 is True or bf16 == "auto":
        return "bf16"
    if fp16 is True:
        return "fp16"
    return "tf32" if tf32 is True else "fp32"


def _ckpt_key(cfg: Mapping[str, Any], fields: set[str] | frozenset[str] | None) -> str:
    for key in ("activation_checkpointing", "gradient_checkpointing"):
        if key in cfg:
            return key
    if fields is not None and "activation_checkpointing" in fields:
        return "activation_checkpointing"
    return "gradient_checkpointing"


# the keys a file states its checkpointing kwargs under (transformers 5's name and the deprecated one)
CKPT_KWARGS = LEVER_KEYS["ckpt_every"]


def stated_checkpointing_kwargs(cfg: Mapping[str, Any]) -> list[str]:
    """The checkpointing-kwargs keys ``cfg`` states as a mapping: a write-back keeps them as they are (a
    mapping cannot be edited in place), so what they say is what the tuned file trains with."""
    return [key for key in CKPT_KWARGS if isinstance(cfg.get(key), Mapping)]


def checkpointed_every(cfg: Mapping[str, Any]) -> int | None:
    """The file's ``every_n_layers`` (one checkpointed decoder layer in k), None when it states none."""
    for key in stated_checkpointing_kwargs(cfg):
        if isinstance(cfg[key].get("every_n_layers"), int):
            return int(cfg[key]["every_n_layers"])
    return None


def to_request(cfg: Mapping[str, Any]) -> dict[str, Any]:
    mb = cfg.get("per_device_train_batch_size", 8)
    acc = cfg.get("gradient_accumulation_steps", 1)
    req: dict[str, Any] = {
        "micro_batch": mb, "grad_accum": acc,
        "precision": precision_of(cfg.get("bf16"), cfg.get("fp16"), cfg.get("tf32")),
        "workers": cfg.get("dataloader_num_workers", 0),
        "grad_ckpt": bool(cfg.get("activation_checkpointing", cfg.get("gradient_checkpointing", False))),
    }  # fmt: skip
    every = checkpointed_every(cfg)
    if every is not None:
        req["ckpt_every"] = every
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


def candidate_of(candidate: Candidate | Mapping[str, Any]) -> Candidate:
    """A ``Candidate`` from itself or its ``dataclasses.asdict`` form."""
    return candidate if isinstance(candidate, Candidate) else Candidate(**dict(candidate))


def written_back(candidate: Candidate, cfg: Mapping[str, Any], at: Measured) -> dict[str, Any]:
    """:func:`lever_values` as a write-back into ``cfg`` writes them: in the checkpointing key the file
    uses, the distributed set-up held (``HELD_LEVERS``), checkpointing kwargs the file states kept (a
    mapping cannot be edited in place), and TF32 (a GPU mode) left as the file has it by a CPU measurement; where
    the device is not known, written only where the file names it."""
    held = {k for lever in HELD_LEVERS for k in LEVER_KEYS[lever]}
    wanted = {k: v for k, v in lever_values(candidate, at, ckpt_key=_ckpt_key(cfg, at.fields)).items()
              if k not in held}
    for key in stated_checkpointing_kwargs(cfg):
        wanted.pop(key, None)
    if candidate.workers == 0 and cfg.get("dataloader_persistent_workers"):
        wanted["dataloader_persistent_workers"] = False  # persistent workers need workers
    if at.device == "cuda" and cfg.get("use_cpu"):
        wanted["use_cpu"] = False  # measured on the GPU: a file that says use_cpu would train elsewhere
    if at.device is None and (candidate.precision == "tf32" or "tf32" in cfg):  # a CPU run leaves TF32 alone
        wanted["tf32"] = candidate.precision in ("tf32", "bf16")
    return wanted


def tuned_keys(
    candidate: Candidate | Mapping[str, Any], cfg: Mapping[str, Any], *, fields: set[str] | None = None,
    at: Measured | None = None,
) -> dict[str, Any]:
    at = at or Measured(fields=None if fields is None else frozenset(fields))
    return changed(cfg, written_back(candidate_of(candidate), cfg, at), DEFAULTS)
