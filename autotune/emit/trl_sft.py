"""Candidate -> ``sft_config.json`` for TRL's ``SFTTrainer``.  [pure]

``trl.SFTConfig`` subclasses ``transformers.TrainingArguments``, so every tuned TrainingArguments key
is carried over unchanged (:func:`autotune.emit.training_args.emitted_training_args`, the probe's own
source); this module adds TRL's data keys and says how autotune's packing maps onto TRL's.

Packing. autotune's ``micro_batch`` counts SEQUENCES; with packing, a micro-batch's sequences are
laid into rows with per-sequence attention (autotune.probe.collate). TRL 1.16 refuses
``padding_free=True`` without ``packing`` while ``max_length`` is set (it would not truncate), so
the emitted form is TRL's own packing: ``packing=True, packing_strategy="bfd"``, which packs the
dataset into rows of ``max_length`` ahead of training, is padding-free (flattened rows, restarting
``position_ids``) and counts ROWS per micro-batch. ``per_device_train_batch_size`` is therefore the
number of full rows that holds one measured micro-batch's real tokens
(:func:`autotune.emit.axolotl.packed_rows`). Sequences stay apart with flash_attention_2/3 (varlen)
and, because ``SFTTrainer`` calls the model with ``use_cache=False``, with sdpa/eager on
transformers 5.x as well (the model derives a block-causal mask from the restarting positions;
with ``use_cache=True`` it would not: measured logit difference 4e-8 vs 0.17 on a tiny Llama).
"""

from __future__ import annotations

from typing import Any

from autotune.emit.axolotl import packed_rows
from autotune.emit.training_args import RUN_ONLY_KEYS, emitted_training_args, probe_kwargs
from autotune.spec.probe_request import ProbeRequest

__all__ = ["SFT_KEYS", "LEVER_KEYS", "PACKING_NOTE", "TRL_PACKING_QUALITY_NOTE", "sft_config", "sft_probe_overrides"]

# Keys TRL's SFTConfig adds to TrainingArguments that autotune writes (checked against the installed
# trl by tests/test_emit_targets.py).
SFT_KEYS = frozenset({"max_length", "packing", "packing_strategy"})

# autotune lever -> the SFTConfig key(s) that carry it (for readers such as ``autotune check``).
LEVER_KEYS: dict[str, tuple[str, ...]] = {
    "micro_batch": ("per_device_train_batch_size",),
    "grad_accum": ("gradient_accumulation_steps",),
    "grad_ckpt": ("activation_checkpointing", "gradient_checkpointing"),
    "precision": ("bf16", "fp16", "tf32"),
    "packing": ("packing", "packing_strategy", "padding_free"),
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
    "packing -> packing=true, packing_strategy=bfd: TRL packs the dataset into rows of max_length and "
    "per_device_train_batch_size counts rows (autotune measured micro-batches of sequences): the rows "
    "written hold one measured micro-batch's real tokens"
)


# What a ``--trainer trl`` probe with packing records as a quality note (probe result, summary, report).
TRL_PACKING_QUALITY_NOTE = (
    "TRL packing (packing_strategy=bfd, padding-free) differs from autotune's: TRL packs the whole dataset into "
    "rows of max_length before training, so an optimizer step holds other sequences than the unpacked run "
    "(rows, not sequences, per micro-batch; sequences longer than max_length are truncated); attention stays "
    "per-sequence (restarting position_ids, use_cache=False). `autotune run --trainer trl --verify-loss` "
    "measures the loss difference against the unpacked HF default"
)


def sft_probe_overrides(request: ProbeRequest, *, fields: set[str], device: str) -> dict[str, Any]:
    """What a ``--trainer trl`` probe changes in ``sft_config.json``: the run-only keys (schedule,
    bookkeeping; :data:`RUN_ONLY_KEYS`) set to the probe's values, nothing that decides speed or memory.

    The probe builds ``SFTConfig(**sft_config(...), **these)``, so every measured key is the emitted one.
    The data order stays SFTTrainer's own (its seeded sampler, as ``train_sft.py`` reads), not the hf
    probe's sequential one.
    """
    probe = probe_kwargs(request, fields=fields, device=device)
    return {k: probe[k] for k in sorted(RUN_ONLY_KEYS - {"train_sampling_strategy"}) if k in probe}


def sft_config(
    request: ProbeRequest,
    *,
    fields: set[str],
    device: str,
    report_to: str | list[str] = "none",
    mean_seq_len: float | None = None,
) -> dict[str, Any]:
    """``sft_config.json``: loads as ``trl.SFTConfig(output_dir=..., **it)``.

    ``fields``: the installed TrainingArguments' field names (SFTConfig has them all).
    """
    kw = emitted_training_args(request, fields=fields, device=device, report_to=report_to)
    # the probe feeds pre-built batches and so keeps every column; SFTTrainer drops what it does not use
    kw.pop("remove_unused_columns", None)
    cand, wl = request.candidate, request.workload
    kw["max_length"] = wl.seq_len
    kw["packing"] = bool(cand.packing)
    if cand.packing:
        kw["packing_strategy"] = "bfd"
        kw["per_device_train_batch_size"] = packed_rows(cand, wl, mean_seq_len)
    return kw
