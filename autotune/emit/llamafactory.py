"""Candidate -> ``llamafactory.yaml`` (``llamafactory-cli train llamafactory.yaml``).  [pure]

LLaMA-Factory parses one YAML into its Model/Data/Finetuning arguments and a TrainingArguments that
extends transformers' ``Seq2SeqTrainingArguments``. Its own keys are checked against the dataclasses
it declares (autotune/emit/schemas/llamafactory_keys.json, read from hiyouga/LLaMA-Factory by
tools/extract_target_keys.py); the transformers keys are the ones :func:`emitted_training_args` writes
for the installed transformers (LLaMA-Factory pins its own transformers and does not install beside 5.24).

Differences from what autotune measured, written as comments into the file:
- packing: LLaMA-Factory packs the dataset into rows of ``cutoff_len`` ahead of training and
  ``per_device_train_batch_size`` counts rows; ``neat_packing`` keeps sequences apart (block-diagonal
  4D mask for sdpa/eager, varlen for fa2), like autotune's packing. The batch size emitted is the
  number of full rows holding one measured micro-batch's tokens (:func:`autotune.emit.axolotl.packed_rows`).
- gradient checkpointing is ON by default in LLaMA-Factory: ``disable_gradient_checkpointing`` says
  what was measured.
- flex_attention has no ``flash_attn`` value: ``auto`` is written and a comment says so.
- LLaMA-Factory runs its own pinned transformers: a TrainingArguments key the installed transformers has
  and that one lacks is left out (``accepted`` is the release's recorded argument set,
  schemas/llamafactory_fields.json) and a comment names it.
- data: LLaMA-Factory reads files registered in ``dataset_info.json``; a ``save_to_disk`` folder cannot be
  registered (its Arrow and JSON files are refused together), so the comment gives the export command.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from autotune.emit.axolotl import packed_rows
from autotune.emit.training_args import LORA_DROPOUT, emitted_training_args
from autotune.spec.probe_request import ProbeRequest

__all__ = ["LEVER_KEYS", "FLASH_ATTN_VALUES", "OWN_KEYS", "accepted_fields", "dataset_note", "llamafactory_config"]

LEVER_KEYS: dict[str, tuple[str, ...]] = {
    "micro_batch": ("per_device_train_batch_size",),
    "grad_accum": ("gradient_accumulation_steps",),
    "grad_ckpt": ("disable_gradient_checkpointing", "use_reentrant_gc"),
    "attn": ("flash_attn",),
    "precision": ("bf16", "fp16", "tf32"),
    "packing": ("packing", "neat_packing"),
    "optim": ("optim",),
    "workers": ("dataloader_num_workers",),
    "pin_memory": ("dataloader_pin_memory",),
    "torch_compile": ("torch_compile",),
    "liger": ("enable_liger_kernel",),
    "zero_stage": ("deepspeed", "fsdp", "fsdp_config"),
    "offload": ("deepspeed", "fsdp"),
    "seq_len": ("cutoff_len",),
    "mode": ("finetuning_type", "lora_rank", "lora_alpha", "lora_target", "quantization_bit"),
}

# autotune attention -> LLaMA-Factory's AttentionFunction (auto, disabled, sdpa, fa2, fa3)
FLASH_ATTN_VALUES = {
    "eager": "disabled",
    "sdpa": "sdpa",
    "flash_attention_2": "fa2",
    "flex_attention": "auto",
}

# keys written from LLaMA-Factory's own dataclasses (the rest are TrainingArguments')
OWN_KEYS = frozenset({
    "model_name_or_path", "stage", "finetuning_type", "lora_rank", "lora_alpha", "lora_dropout", "lora_target",
    "quantization_bit", "quantization_method", "cutoff_len", "packing", "neat_packing", "flash_attn",
    "disable_gradient_checkpointing", "use_reentrant_gc", "enable_liger_kernel", "dataset", "dataset_dir",
    "template",
})  # fmt: skip

# TrainingArguments keys LLaMA-Factory sets from its own keys instead (left out of the file)
_REPLACED = ("activation_checkpointing", "gradient_checkpointing", "activation_checkpointing_kwargs",
             "gradient_checkpointing_kwargs", "use_liger_kernel", "remove_unused_columns")  # fmt: skip


def accepted_fields() -> set[str]:
    """Every argument the pinned LLaMA-Factory release parses (schemas/llamafactory_fields.json)."""
    path = resources.files("autotune").joinpath("emit", "schemas", "llamafactory_fields.json")
    return set(json.loads(path.read_text(encoding="utf-8"))["fields"])


_FILE_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".arrow", ".txt")


def dataset_note(dataset: str, *, split: str | None, column: str | None) -> str:
    """What to do with the measured dataset in LLaMA-Factory: register a file, or export a folder first."""
    path = dataset
    steps = ""
    if not dataset.lower().endswith(_FILE_SUFFIXES):
        # a save_to_disk folder (or a Hub id's cache): dataset_info.json takes files of one type only
        path = dataset.rstrip("/") + ".jsonl"
        pick = f"[{split!r}]" if split else ""
        steps = (f"export it first (a save_to_disk folder cannot be registered): python -c \"import datasets; "
                 f"datasets.load_from_disk({dataset!r}){pick}.to_json({path!r})\"; then ")
    if column == "text":
        entry = {"autotune_data": {"file_name": path, "columns": {"prompt": "text"}}}
        tail = "and set dataset: autotune_data, dataset_dir: (that folder), stage: pt"
    else:
        entry = {"autotune_data": {"file_name": path, "formatting": "sharegpt", "columns": {"messages": "messages"},
                                   "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                            "assistant_tag": "assistant", "system_tag": "system"}}}
        tail = "and set dataset: autotune_data, dataset_dir: (that folder), template: (your model's template)"
    return f"dataset: {steps}write dataset_info.json {json.dumps(entry)} {tail}"


def llamafactory_config(
    request: ProbeRequest,
    *,
    fields: set[str],
    device: str,
    mean_seq_len: float | None = None,
    deepspeed_path: str | None = None,
    accepted: set[str] | None = None,
    dataset_column: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """``(config, notes)``: the YAML mapping and the comments to write above it. ``accepted``: the
    arguments the pinned LLaMA-Factory parses (default: :func:`accepted_fields`)."""
    c, wl = request.candidate, request.workload
    notes: list[str] = []
    targs = emitted_training_args(request, fields=fields, device=device)
    for key in _REPLACED:
        targs.pop(key, None)
    known = accepted_fields() if accepted is None else accepted
    unknown = sorted(k for k in targs if k not in known)
    for key in unknown:
        targs.pop(key)
    if unknown:
        notes.append(f"left out (not arguments of LLaMA-Factory's transformers): {', '.join(unknown)}")
    cfg: dict[str, Any] = {
        "model_name_or_path": wl.model,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full" if wl.mode == "full" else "lora",
        "cutoff_len": wl.seq_len,
        "flash_attn": FLASH_ATTN_VALUES[c.attn],
        "disable_gradient_checkpointing": not c.grad_ckpt,
        "output_dir": "./outputs/autotune",
    }
    if c.grad_ckpt:
        cfg["use_reentrant_gc"] = False
    if c.attn == "flex_attention":
        notes.append(
            "attention: autotune measured flex_attention, which flash_attn cannot name; 'auto' lets "
            "LLaMA-Factory choose (sdpa on most models)"
        )
    if wl.mode != "full":
        cfg.update(
            lora_rank=wl.lora_r,
            lora_alpha=wl.lora_alpha,
            lora_dropout=LORA_DROPOUT,
            lora_target=",".join(wl.lora_targets),
        )
        if wl.mode == "qlora":
            cfg.update(quantization_bit=4, quantization_method="bnb")
    if c.liger:
        cfg["enable_liger_kernel"] = True
    if "deepspeed" in targs:
        targs["deepspeed"] = deepspeed_path or "deepspeed.json"
    if c.packing:
        rows = packed_rows(c, wl, mean_seq_len)
        cfg["packing"] = True
        cfg["neat_packing"] = True
        targs["per_device_train_batch_size"] = rows
        notes.append(
            f"packing: autotune measured micro-batches of {c.micro_batch} sequences packed into rows with "
            "per-sequence attention; LLaMA-Factory packs the dataset into rows of cutoff_len (neat_packing "
            f"keeps sequences apart) and the batch size counts rows: {rows} row(s) hold the same real tokens"
        )
    else:
        cfg["packing"] = False
    if wl.dataset:
        notes.append(dataset_note(wl.dataset, split=wl.split, column=dataset_column))
    else:
        notes.append(
            "dataset: set dataset: NAME (from dataset_info.json) and template: (your model's template)"
        )
    if device == "cpu":
        notes.append("measured on the CPU (use_cpu); re-tune on the target GPU")
    cfg.update(targs)
    return cfg, notes
