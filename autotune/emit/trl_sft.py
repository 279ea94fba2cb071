"""Candidate -> ``sft_config.json`` for TRL's ``SFTTrainer``.  [pure]

``trl.SFTConfig`` subclasses ``transformers.TrainingArguments``, so every tuned TrainingArguments key
is carried over unchanged (:func:`autotune.emit.training_args.emitted_training_args`, the probe's own
source); this module adds TRL's data keys and says how autotune's packing maps onto TRL's.

Packing. autotune's ``micro_batch`` counts SEQUENCES; with packing, a micro-batch's sequences are
laid into rows with per-sequence attention (autotune.probe.collate). TRL's nearest equivalent is
``padding_free=True`` without ``packing``: ``per_device_train_batch_size`` still counts sequences and
the collator flattens them into one row with restarting ``position_ids`` (no attention mask).
Sequences stay apart with flash_attention_2/3 (varlen kernels) and, because ``SFTTrainer`` calls the
model with ``use_cache=False``, with sdpa/eager on transformers 5.x too (the model derives a
block-causal mask from the restarting positions). TRL's ``packing=True`` (``packing_strategy`` bfd)
instead packs the whole dataset into rows of ``max_length`` ahead of training and counts ROWS per
micro-batch, which is not what was measured; it is not emitted.
"""

from __future__ import annotations

from typing import Any

from autotune.emit.training_args import emitted_training_args
from autotune.spec.probe_request import ProbeRequest

__all__ = ["SFT_KEYS", "LEVER_KEYS", "PACKING_NOTE", "sft_config"]

# Keys TRL's SFTConfig adds to TrainingArguments that autotune writes (checked against the installed
# trl by tests/test_emit_targets.py).
SFT_KEYS = frozenset({"max_length", "packing", "padding_free"})

# autotune lever -> the SFTConfig key(s) that carry it (for readers such as ``autotune check``).
LEVER_KEYS: dict[str, tuple[str, ...]] = {
    "micro_batch": ("per_device_train_batch_size",),
    "grad_accum": ("gradient_accumulation_steps",),
    "grad_ckpt": ("activation_checkpointing", "gradient_checkpointing"),
    "precision": ("bf16", "fp16", "tf32"),
    "packing": ("padding_free", "packing"),
    "optim": ("optim",),
    "workers": ("dataloader_num_workers",),
    "pin_memory": ("dataloader_pin_memory",),
    "torch_compile": ("torch_compile",),
    "liger": ("use_liger_kernel",),
    "zero_stage": ("deepspeed", "fsdp"),
    "offload": ("deepspeed", "fsdp"),
    "seq_len": ("max_length",),
    "attn": (),  # a model argument: model_kwargs.json / SFTConfig.model_init_kwargs
}

PACKING_NOTE = (
    "packing -> padding_free=true: per_device_train_batch_size counts sequences, flattened into one "
    "row per micro-batch with restarting position_ids (as autotune measured); TRL's packing=true "
    "(bfd, rows of max_length) would count packed rows instead"
)


def sft_config(
    request: ProbeRequest,
    *,
    fields: set[str],
    device: str,
    report_to: str | list[str] = "none",
) -> dict[str, Any]:
    """``sft_config.json``: loads as ``trl.SFTConfig(output_dir=..., **it)``.

    ``fields``: the installed TrainingArguments' field names (SFTConfig has them all).
    """
    kw = emitted_training_args(request, fields=fields, device=device, report_to=report_to)
    # the probe feeds pre-built batches and so keeps every column; SFTTrainer drops what it does not use
    kw.pop("remove_unused_columns", None)
    cand, wl = request.candidate, request.workload
    kw["max_length"] = wl.seq_len
    kw["packing"] = False
    kw["padding_free"] = bool(cand.packing)
    return kw
