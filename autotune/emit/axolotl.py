"""Candidate -> ``axolotl.yaml`` (Axolotl's config schema).  [pure]

Keys and types are checked against the schema Axolotl declares (autotune/emit/schemas/axolotl_keys.json,
read from axolotl-ai-cloud/axolotl by tools/extract_target_keys.py); Axolotl itself does not install
beside transformers 5.24.

Packing differs. autotune's ``micro_batch`` counts SEQUENCES and packs each micro-batch's sequences
into rows with per-sequence attention. Axolotl's ``sample_packing`` bin-packs the whole dataset into
rows of ``sequence_len`` ahead of training (block-diagonal attention with sdpa/eager/flash) and its
``micro_batch_size`` counts those ROWS. The emitted ``micro_batch_size`` is therefore the number of
full rows that holds the real tokens of one measured micro-batch (``packed_rows``): the same tokens
per optimizer step, and rows x sequence_len never exceeds what the probe's worst-case micro-batch held.

Levers Axolotl switches on by itself are written explicitly as measured: for a LoRA/QLoRA config it
auto-enables its LoRA kernels (``lora_mlp_kernel``, ``lora_qkv_kernel``, ``lora_o_kernel``,
``lora_embedding_kernel``) unless one is set, and autotune never measured those, so they are written ``false`` (``LORA_KERNEL_KEYS``).
"""

from __future__ import annotations

from typing import Any

from autotune.emit.training_args import LEARNING_RATES, LORA_DROPOUT, RUN_DEFAULTS, WARMUP_RATIO
from autotune.spec.probe_request import Candidate, Workload

__all__ = ["LEVER_KEYS", "ATTN_VALUES", "LIGER_PLUGIN", "LORA_KERNEL_KEYS", "packed_rows", "axolotl_config"]

# Axolotl's LoRA kernels, auto-enabled for LoRA/QLoRA configs that leave them unset (not measured by autotune)
LORA_KERNEL_KEYS = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")

LEVER_KEYS: dict[str, tuple[str, ...]] = {
    "micro_batch": ("micro_batch_size",),
    "grad_accum": ("gradient_accumulation_steps",),
    "grad_ckpt": ("gradient_checkpointing", "gradient_checkpointing_kwargs"),
    "attn": ("attn_implementation",),
    "precision": ("bf16", "fp16", "tf32"),
    "packing": ("sample_packing", "pad_to_sequence_len"),
    "optim": ("optimizer",),
    "workers": ("dataloader_num_workers",),
    "pin_memory": ("dataloader_pin_memory",),
    "torch_compile": ("torch_compile",),
    "liger": ("plugins", "liger_rms_norm", "liger_glu_activation", "liger_fused_linear_cross_entropy"),
    "zero_stage": ("deepspeed", "fsdp_version", "fsdp_config"),
    "offload": ("deepspeed", "fsdp_config"),
    "seq_len": ("sequence_len",),
    "mode": ("adapter", "load_in_4bit", "lora_r", "lora_alpha", "lora_target_modules"),
}

# autotune attention -> Axolotl's attn_implementation (its canonical values)
ATTN_VALUES = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash_attention_2",
               "flex_attention": "flex_attention"}  # fmt: skip

LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"


def packed_rows(candidate: Candidate, workload: Workload, mean_seq_len: float | None) -> int:
    """Full rows of ``seq_len`` that hold one measured micro-batch's real tokens (at least 1).

    ``mean_seq_len`` is the probe's mean real sequence length; without it (an older result) the
    measured micro-batch is taken as full rows (the memory the probe's worst case held).
    """
    if not mean_seq_len or mean_seq_len <= 0:
        return candidate.micro_batch
    return max(1, min(candidate.micro_batch, round(candidate.micro_batch * mean_seq_len / workload.seq_len)))


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
    notes: list[str] = []
    cfg: dict[str, Any] = {
        "base_model": wl.model,
        "sequence_len": wl.seq_len,
        "micro_batch_size": c.micro_batch,
        "gradient_accumulation_steps": c.grad_accum,
        "attn_implementation": ATTN_VALUES[c.attn],
        "gradient_checkpointing": bool(c.grad_ckpt),
        "bf16": c.precision == "bf16",
        "fp16": c.precision == "fp16",
        "optimizer": c.optim,
        "learning_rate": LEARNING_RATES[wl.mode],
        "lr_scheduler": RUN_DEFAULTS["lr_scheduler_type"],
        "warmup_ratio": WARMUP_RATIO,
        "num_epochs": float(RUN_DEFAULTS["num_train_epochs"]),
        "logging_steps": RUN_DEFAULTS["logging_steps"],
        "save_steps": RUN_DEFAULTS["save_steps"],
        "save_total_limit": RUN_DEFAULTS["save_total_limit"],
        "dataloader_num_workers": c.workers,
        "dataloader_pin_memory": bool(c.pin_memory),
        "seed": wl.seed,
        "output_dir": "./outputs/autotune",
    }
    if device == "cuda":
        cfg["tf32"] = c.precision in ("tf32", "bf16")
    if c.grad_ckpt:
        cfg["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if c.packing:
        rows = packed_rows(c, wl, mean_seq_len)
        cfg["sample_packing"] = True
        cfg["pad_to_sequence_len"] = True
        cfg["micro_batch_size"] = rows
        notes.append(
            f"packing: autotune measured micro-batches of {c.micro_batch} sequences packed into rows; "
            "Axolotl's sample_packing packs the dataset into rows of sequence_len and micro_batch_size "
            f"counts rows: {rows} row(s) hold the same real tokens per micro-batch"
            + (
                ""
                if mean_seq_len
                else " (no mean length recorded: rows = measured sequences, an upper bound)"
            )
        )
    if c.torch_compile:
        cfg["torch_compile"] = True
    if c.liger:
        cfg["plugins"] = [LIGER_PLUGIN]
        cfg.update(liger_rms_norm=True, liger_glu_activation=True, liger_fused_linear_cross_entropy=True)
    if wl.mode in ("lora", "qlora"):
        cfg["adapter"] = wl.mode
        cfg["lora_r"] = wl.lora_r
        cfg["lora_alpha"] = wl.lora_alpha
        cfg["lora_dropout"] = LORA_DROPOUT
        cfg["lora_target_modules"] = list(wl.lora_targets)
        if wl.mode == "qlora":
            cfg["load_in_4bit"] = True
        cfg.update(dict.fromkeys(LORA_KERNEL_KEYS, False))
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
