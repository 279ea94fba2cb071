"""Axolotl YAML (``axolotl train config.yml``): the emitted ``axolotl.yaml`` and a user's file, both ways.  [pure]

Key names and defaults from Axolotl's pydantic schema (``AxolotlInputConfig``; the accepted key set
and its commit are in ``autotune/emit/schemas/axolotl_keys.json``, read from axolotl-ai-cloud/axolotl by
tools/extract_target_keys.py; Axolotl itself does not install beside transformers 5.24). Axolotl ignores
keys its schema does not have (pydantic's default), so an unknown key is a setting that silently does nothing.

:func:`lever_values` is the one table of what each lever is written as (``LEVER_KEYS`` names the keys);
:func:`axolotl_config` (the emitted file) and :func:`tuned_keys` (the write-back) both take the levers from it.

Packing differs. autotune's ``micro_batch`` counts SEQUENCES and packs each micro-batch's sequences
into rows with per-sequence attention. Axolotl's ``sample_packing`` bin-packs the whole dataset into
rows of ``sequence_len`` ahead of training (block-diagonal attention with sdpa/eager/flash) and its
``micro_batch_size`` counts those ROWS. The ``micro_batch_size`` written is therefore the number of
rows that holds one measured micro-batch's sequences, and the accumulation the one whose rows hold an
optimizer step's (``packed_batch``: rows are whole, so the measured accumulation alone could hold a
different number of sequences a step); rows x sequence_len never exceeds what the probe's worst-case
micro-batch held.

Levers Axolotl switches on by itself are written explicitly as measured: for a LoRA/QLoRA config it
auto-enables its LoRA kernels (``lora_mlp_kernel``, ``lora_qkv_kernel``, ``lora_o_kernel``,
``lora_embedding_kernel``) unless one is set, and autotune never measured those, so they are written
``false`` (``LORA_KERNEL_KEYS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.formats._common import (
    Measured,
    changed,
    local_dataset,
    packed_batch,
    packed_drift_note,
    unexpressed_notes,
)
from autotune.formats.model import LORA_DROPOUT
from autotune.formats.training_args import (
    LEARNING_RATES,
    RUN_DEFAULTS,
    WARMUP_RATIO,
    candidate_of,
    precision_of,
)
from autotune.spec.probe_request import Candidate, Workload

__all__ = ["NAME", "LABEL", "VOCAB", "MARKERS", "AXOLOTL_LOADER_DEFAULTS", "ATTN_VALUES", "HELD_LEVERS", "UNEXPRESSED", "LEVER_KEYS",
           "LIGER_PLUGIN", "LORA_KERNEL_KEYS", "axolotl_config", "deprecations", "detect", "lever_values", "to_request",
           "to_checklist", "tuned_keys"]

NAME = "axolotl"
LABEL = "Axolotl"
MARKERS = frozenset({"base_model", "micro_batch_size", "sequence_len", "sample_packing", "adapter", "datasets",
                     "num_epochs", "lora_target_linear", "val_set_size"})
VOCAB: dict[str, str] = {
    "per_device_train_batch_size": "micro_batch_size",
    "dataloader_persistent_workers: true": "",  # no Axolotl key
    "report_to: tensorboard (or wandb, trackio, mlflow; the integration must be installed)":
        "use_tensorboard: true (or wandb_project: NAME, use_mlflow: true, use_trackio: true)",
    "report_to 'none': loss and metrics are not tracked":
        "no tracker set (use_tensorboard, wandb_project, use_mlflow, use_trackio): loss and metrics are not tracked",
    "report_to": "tracking",
    "seed: 42 (and data_seed)": "seed: 42",
    "save_strategy: steps, save_steps: 500, save_total_limit: 3": "save_steps: 500 (or saves_per_epoch), "
                                                                  "save_total_limit: 3",
    "optim": "optimizer",
}
# the attention keys Axolotl has had: attn_implementation (current) and the deprecated booleans
_ATTN_BOOLS = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager",
               "flex_attention": "flex_attention"}
DEFAULTS: dict[str, Any] = {
    "micro_batch_size": 1, "gradient_accumulation_steps": 1, "gradient_checkpointing": False,
    "sample_packing": False, "dataloader_num_workers": 0, "dataloader_pin_memory": True, "bf16": False,
    "fp16": False, "optimizer": "adamw_torch_fused", "torch_compile": False, "pad_to_sequence_len": False,
    "liger_rms_norm": False, "liger_glu_activation": False, "liger_fused_linear_cross_entropy": False,
}  # fmt: skip

# Axolotl's LoRA kernels, auto-enabled for LoRA/QLoRA configs that leave them unset (not measured by autotune)
LORA_KERNEL_KEYS = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")
LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"
_LIGER_KEYS = ("liger_rms_norm", "liger_glu_activation", "liger_fused_linear_cross_entropy")

# autotune lever -> the Axolotl key(s) that carry it
LEVER_KEYS: dict[str, tuple[str, ...]] = {
    "micro_batch": ("micro_batch_size",),
    "grad_accum": ("gradient_accumulation_steps", "batch_size"),  # batch_size: per device, mb x accumulation
    "grad_ckpt": ("gradient_checkpointing", "gradient_checkpointing_kwargs"),
    "attn": ("attn_implementation",),
    "precision": ("bf16", "fp16", "tf32"),
    "packing": ("sample_packing", "pad_to_sequence_len", "micro_batch_size"),
    "optim": ("optimizer",),
    "workers": ("dataloader_num_workers",),
    "pin_memory": ("dataloader_pin_memory",),
    "torch_compile": ("torch_compile",),
    "liger": ("plugins", *_LIGER_KEYS),
    "zero_stage": ("deepspeed", "fsdp_version", "fsdp_config"),
    "offload": ("deepspeed", "fsdp_config"),
    "seq_len": ("sequence_len",),
    "mode": ("adapter", "load_in_4bit", "lora_r", "lora_alpha", "lora_target_modules", *LORA_KERNEL_KEYS),
}
# levers this format has no key for -> what a file of it does instead (a note in the emitted file; a write-back
# holds them at their default before the search). Partial checkpointing: Axolotl enables checkpointing
# itself or through a transformers that may predate every_n_layers.
UNEXPRESSED: dict[str, str] = {"ckpt_every": "checkpoints every decoder layer"}
# levers a write-back leaves as the file has them: the distributed set-up and the fine-tuning mode (the run's
# mode is the file's; of the "mode" keys only the LoRA kernels, which autotune did not measure, are written off)
HELD_LEVERS = ("zero_stage", "offload", "mode")

# autotune attention -> Axolotl's attn_implementation (its canonical values)
ATTN_VALUES = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash_attention_2",
               "flex_attention": "flex_attention"}  # fmt: skip

_LOADER_KEYS = ("dataloader_num_workers", "dataloader_pin_memory", "dataloader_prefetch_factor")
# what Axolotl sets when none of _LOADER_KEYS is given: one worker per GPU (WORLD_SIZE), pinned, prefetch 256
AXOLOTL_LOADER_DEFAULTS = {"dataloader_num_workers": 1, "dataloader_pin_memory": True}
_DEPRECATED_KEYS = {"noisy_embedding_alpha": "neftune_noise_alpha", "dpo_beta": "rl_beta",
                    "evaluation_strategy": "eval_strategy"}


def detect(cfg: Mapping[str, Any]) -> bool:
    return "base_model" in cfg or len(MARKERS & set(cfg)) >= 2


def _attn(cfg: Mapping[str, Any]) -> str | None:
    if isinstance(cfg.get("attn_implementation"), str):
        return str(cfg["attn_implementation"])
    for key, attn in _ATTN_BOOLS.items():
        if cfg.get(key) is True:
            return attn
    return None


def _mode(cfg: Mapping[str, Any]) -> str:
    adapter = cfg.get("adapter")
    if adapter == "qlora" or (adapter == "lora" and cfg.get("load_in_4bit")):
        return "qlora"
    return "lora" if adapter == "lora" else "full"


def _report_to(cfg: Mapping[str, Any]) -> list[str]:
    names = []
    if cfg.get("wandb_project") or cfg.get("use_wandb"):
        names.append("wandb")
    for key, name in (("use_tensorboard", "tensorboard"), ("use_mlflow", "mlflow"), ("use_comet", "comet_ml"),
                      ("use_trackio", "trackio")):
        if cfg.get(key):
            names.append(name)
    return names


def _states_batch_size(cfg: Mapping[str, Any]) -> bool:
    """The file states ``batch_size`` (per device, micro-batch x accumulation) instead of the accumulation
    (Axolotl refuses a file that sets both)."""
    return cfg.get("gradient_accumulation_steps") is None and isinstance(cfg.get("batch_size"), int)


def _grad_accum(cfg: Mapping[str, Any]) -> Any:
    """The file's accumulation: ``gradient_accumulation_steps``, or ``batch_size // micro_batch_size`` as Axolotl
    derives it from a stated ``batch_size``."""
    mb = cfg.get("micro_batch_size", 1)
    if _states_batch_size(cfg) and isinstance(mb, int) and mb > 0:
        return max(1, cfg["batch_size"] // mb)
    return cfg.get("gradient_accumulation_steps", 1)


def to_request(cfg: Mapping[str, Any]) -> dict[str, Any]:
    mb = cfg.get("micro_batch_size", 1)
    acc = _grad_accum(cfg)
    req: dict[str, Any] = {"mode": _mode(cfg), "micro_batch": mb, "grad_accum": acc,
                           "precision": precision_of(cfg.get("bf16"), cfg.get("fp16"), cfg.get("tf32")),
                           "packing": bool(cfg.get("sample_packing")),
                           "workers": cfg.get("dataloader_num_workers", 0),
                           "grad_ckpt": bool(cfg.get("gradient_checkpointing"))}
    if isinstance(cfg.get("base_model"), str):
        req["model"] = cfg["base_model"]
    if isinstance(cfg.get("sequence_len"), int):
        req["seq_len"] = cfg["sequence_len"]
    if isinstance(mb, int) and isinstance(acc, int):
        req["effective_batch"] = mb * acc
    if req["mode"] != "full":
        for key, field in (("lora_r", "lora_r"), ("lora_alpha", "lora_alpha")):
            if isinstance(cfg.get(key), int):
                req[field] = cfg[key]
        modules = cfg.get("lora_target_modules")
        if cfg.get("lora_target_linear") is True:
            req["lora_targets"] = ("all-linear",)
        elif isinstance(modules, list) and modules and all(isinstance(m, str) for m in modules):
            req["lora_targets"] = tuple(modules)
    attn = _attn(cfg)
    if attn:
        req["attn"] = attn
    datasets = cfg.get("datasets")
    if isinstance(datasets, list) and datasets and isinstance(datasets[0], Mapping):
        ds = local_dataset(datasets[0].get("path"))
        if ds:
            req["dataset"] = ds
    return req


def to_checklist(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    ta: dict[str, Any] = {
        "per_device_train_batch_size": cfg.get("micro_batch_size", 1),
        "gradient_accumulation_steps": _grad_accum(cfg),
        "report_to": _report_to(cfg) or "none",
    }
    for key in ("bf16", "fp16", "tf32", "gradient_checkpointing", "dataloader_num_workers", "dataloader_pin_memory",
                "seed", "deepspeed"):
        if cfg.get(key) is not None:
            ta[key] = cfg[key]
    if ta.get("bf16") == "auto":
        ta["bf16"] = True  # Axolotl turns bf16 on where the GPU has it
    if all(cfg.get(k) is None for k in _LOADER_KEYS):
        # Axolotl's validation sets these itself when all three are unset (default_dataloader_opts)
        ta.update(AXOLOTL_LOADER_DEFAULTS)
    # Axolotl's trainer builder: save_steps -> steps; else save_strategy; else every epoch; keeps 4 unless told
    if cfg.get("save_steps"):
        ta.update(save_strategy="steps", save_steps=cfg["save_steps"])
    else:
        ta["save_strategy"] = cfg.get("save_strategy") or "epoch"
    ta["save_total_limit"] = cfg.get("save_total_limit") or 4
    if cfg.get("fsdp") or cfg.get("fsdp_config"):
        ta["fsdp"] = " ".join(cfg["fsdp"]) if isinstance(cfg.get("fsdp"), list) else str(cfg.get("fsdp") or "full_shard")
        fsdp_config = cfg.get("fsdp_config") or {}
        if isinstance(fsdp_config, Mapping) and (fsdp_config.get("offload_params") or fsdp_config.get("fsdp_offload_params")):
            ta["fsdp"] += " offload"
    out: dict[str, dict[str, Any]] = {"training_args": ta}
    attn = _attn(cfg)
    mk: dict[str, Any] = {"attn_implementation": attn} if attn else {}
    if cfg.get("load_in_4bit"):
        mk["quantization_config"] = {"load_in_4bit": True}
    if mk:
        out["model_kwargs"] = mk
    if _mode(cfg) != "full":
        out["lora"] = {"r": cfg.get("lora_r"), "lora_alpha": cfg.get("lora_alpha")}
    return out


def deprecations(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(what Axolotl 0.19 warns about this file, the fix): its own deprecation warnings, read from its validators."""
    out: list[tuple[str, str]] = []
    fsdp_config = cfg.get("fsdp_config")
    if isinstance(fsdp_config, Mapping) and fsdp_config:
        version = cfg.get("fsdp_version") or fsdp_config.get("fsdp_version") or fsdp_config.get("version")
        if str(version) != "2":
            out.append(("FSDP1 is deprecated (Axolotl warns it will be removed)", "fsdp_version: 2"))
        if any(str(k).startswith("fsdp_") and k != "fsdp_version" for k in fsdp_config):
            out.append(("fsdp_config keys with the fsdp_ prefix are deprecated",
                        "drop the fsdp_ prefix inside fsdp_config (fsdp_offload_params -> offload_params)"))
    for old, new in _DEPRECATED_KEYS.items():
        if cfg.get(old) is not None:
            out.append((f"{old} is deprecated", f"use {new}"))
    return out


def lever_values(candidate: Candidate, at: Measured) -> dict[str, Any]:
    """The Axolotl keys of the levers (``LEVER_KEYS``; the distributed set-up is :func:`axolotl_config`'s,
    it names the DeepSpeed file), each with the value that was measured."""
    c = candidate
    rows, accum = packed_batch(c.micro_batch, c.grad_accum, at) if c.packing else (c.micro_batch, c.grad_accum)
    out: dict[str, Any] = {
        "micro_batch_size": rows,
        "gradient_accumulation_steps": accum,
        "attn_implementation": ATTN_VALUES[c.attn],
        "gradient_checkpointing": bool(c.grad_ckpt),
        "bf16": c.precision == "bf16",
        "fp16": c.precision == "fp16",
        "optimizer": c.optim,
        "dataloader_num_workers": c.workers,
        "dataloader_pin_memory": bool(c.pin_memory),
        "sample_packing": bool(c.packing),
        "torch_compile": bool(c.torch_compile),
    }
    if at.seq_len is not None:
        out["sequence_len"] = at.seq_len
    if at.device == "cuda":
        out["tf32"] = c.precision in ("tf32", "bf16")
    if c.grad_ckpt:
        out["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if c.packing:
        out["pad_to_sequence_len"] = True
    if c.liger:
        out["plugins"] = [LIGER_PLUGIN]
        out.update(dict.fromkeys(_LIGER_KEYS, True))
    if at.mode in ("lora", "qlora"):
        out.update(dict.fromkeys(LORA_KERNEL_KEYS, False))
    return out


def axolotl_config(
    candidate: Candidate,
    workload: Workload,
    *,
    mean_seq_len: float | None = None,
    deepspeed_path: str | None = None,
    device: str = "cuda",
    dataset_type: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """``(config, notes)``: the YAML mapping and the comments to write above it (what differs)."""
    c, wl = candidate, workload
    at = Measured(device=device, mode=wl.mode, seq_len=wl.seq_len, mean_seq_len=mean_seq_len)
    notes: list[str] = []
    cfg: dict[str, Any] = {
        "base_model": wl.model,
        **lever_values(c, at),
        "learning_rate": LEARNING_RATES[wl.mode],
        "lr_scheduler": RUN_DEFAULTS["lr_scheduler_type"],
        "warmup_ratio": WARMUP_RATIO,
        "num_epochs": float(RUN_DEFAULTS["num_train_epochs"]),
        "logging_steps": RUN_DEFAULTS["logging_steps"],
        "save_steps": RUN_DEFAULTS["save_steps"],
        "save_total_limit": RUN_DEFAULTS["save_total_limit"],
        "seed": wl.seed,
        "output_dir": "./outputs/autotune",
    }
    notes += unexpressed_notes(c, UNEXPRESSED, LABEL)
    if c.packing:
        notes.append(
            f"packing: autotune measured micro-batches of {c.micro_batch} sequences packed into rows; "
            "Axolotl's sample_packing packs the dataset into rows of sequence_len and micro_batch_size "
            f"counts rows: {cfg['micro_batch_size']} row(s) hold a micro-batch's sequences, and "
            f"{cfg['gradient_accumulation_steps']} of them a step's"
            + ("" if mean_seq_len else " (no mean length recorded: rows = measured sequences, an upper bound)")
        )
        drift = packed_drift_note(c.micro_batch, c.grad_accum, at)
        notes += [drift] if drift else []
    if wl.mode in ("lora", "qlora"):
        cfg["adapter"] = wl.mode
        cfg["lora_r"] = wl.lora_r
        cfg["lora_alpha"] = wl.lora_alpha
        cfg["lora_dropout"] = LORA_DROPOUT
        if wl.lora_targets == ("all-linear",):
            cfg["lora_target_linear"] = True  # Axolotl's spelling of peft's all-linear
        else:
            cfg["lora_target_modules"] = list(wl.lora_targets)
        if wl.mode == "qlora":
            cfg["load_in_4bit"] = True
    if c.zero_stage > 0 and c.sharding == "deepspeed":
        cfg["deepspeed"] = deepspeed_path or "deepspeed.json"
    elif c.zero_stage > 0 and c.sharding == "fsdp":
        cfg["fsdp_version"] = 2
        cfg["fsdp_config"] = {
            "reshard_after_forward": c.zero_stage == 3,
            "offload_params": c.offload != "none",
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        }
    if device == "cpu":
        notes.append("measured on the CPU: Axolotl trains on GPUs; re-tune on the target GPU")
    if dataset_type is not None and wl.dataset:
        cfg["datasets"] = [{"path": wl.dataset, "type": dataset_type}]
    else:
        notes.append("datasets: add your data, e.g. datasets: [{path: DATA, type: chat_template}]")
    return cfg, notes


def tuned_keys(
    candidate: Candidate | Mapping[str, Any], cfg: Mapping[str, Any], *, fields: set[str] | None = None,
    at: Measured | None = None,
) -> dict[str, Any]:
    """The keys a write-back changes: :func:`lever_values` for the file's mode, in the file's own spellings
    (``bf16: auto`` kept for bf16, the deprecated attention booleans turned off), changed where they differ."""
    c = candidate_of(candidate)
    at = at or Measured()
    at = Measured(device=at.device, mode=_mode(cfg), seq_len=at.seq_len, mean_seq_len=at.mean_seq_len,
                  fields=at.fields)
    wanted = lever_values(c, at)
    if c.precision == "bf16" and cfg.get("bf16") == "auto":
        del wanted["bf16"], wanted["fp16"]
    if at.device is None and (c.precision == "tf32" or "tf32" in cfg):  # a CPU run leaves TF32 as the file has it
        wanted["tf32"] = c.precision in ("tf32", "bf16")
    if any(cfg.get(k) is not None for k in LORA_KERNEL_KEYS):
        for key in LORA_KERNEL_KEYS:  # one set: Axolotl enables none itself, the file's choice stands
            wanted.pop(key, None)
    if isinstance(cfg.get("gradient_checkpointing_kwargs"), Mapping):
        wanted.pop("gradient_checkpointing_kwargs", None)  # a mapping: the file's own (not editable in place)
    if not c.packing and cfg.get("pad_to_sequence_len"):
        wanted["pad_to_sequence_len"] = False
    if _states_batch_size(cfg):  # it stays the one key, micro-batch x accumulation
        wanted["batch_size"] = wanted["micro_batch_size"] * wanted.pop("gradient_accumulation_steps")
    if c.liger:
        if isinstance(cfg.get("plugins"), list):
            wanted.pop("plugins")  # a list: the file's own (not editable in place)
    else:
        wanted.update({k: False for k in _LIGER_KEYS if cfg.get(k)})
    attn = wanted.pop("attn_implementation")
    if _attn(cfg) != c.attn:
        bool_key = next((k for k, v in _ATTN_BOOLS.items() if cfg.get(k) is True), None)
        if bool_key is not None and "attn_implementation" not in cfg:
            wanted[bool_key] = False
        wanted["attn_implementation"] = attn
    defaults = dict(DEFAULTS)
    if all(cfg.get(k) is None for k in _LOADER_KEYS):
        defaults.update(AXOLOTL_LOADER_DEFAULTS)  # what Axolotl would set: a measured 0 workers must be written
    return changed(cfg, wanted, defaults)
