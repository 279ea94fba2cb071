"""LLaMA-Factory YAML (``llamafactory-cli train config.yaml``): the emitted ``llamafactory.yaml`` and a user's
file, both ways.  [pure]

LLaMA-Factory parses one flat file into its Model/Data/Finetuning/Generating arguments plus a
TrainingArguments that extends transformers' ``Seq2SeqTrainingArguments``, and rejects keys none of them
has (``HfArgumentParser`` with ``allow_extra_keys`` off unless ``ALLOW_EXTRA_ARGS`` is set). Its own keys
are checked against the dataclasses it declares (autotune/emit/schemas/llamafactory_keys.json, read from
hiyouga/LLaMA-Factory by tools/extract_target_keys.py); the transformers keys are the ones
:func:`autotune.formats.training_args.emitted_training_args` writes for the installed transformers
(LLaMA-Factory pins its own transformers and does not install beside 5.24).

:func:`lever_values` is the one table of what each lever is written as (``LEVER_KEYS`` names the keys);
:func:`llamafactory_config` (the emitted file) and :func:`tuned_keys` (the write-back) both take the levers
from it. Differences from what autotune measured, written as comments into the emitted file:
- packing: LLaMA-Factory packs the dataset into rows of ``cutoff_len`` ahead of training and
  ``per_device_train_batch_size`` counts rows; ``neat_packing`` keeps sequences apart (block-diagonal
  4D mask for sdpa/eager, varlen for fa2), like autotune's packing (and turns ``packing`` on itself).
  The batch size written is the number of rows holding one measured micro-batch's sequences, and the
  accumulation the one whose rows hold an optimizer step's (:func:`autotune.formats._common.packed_batch`).
- gradient checkpointing is LLaMA-Factory's own switch, ON unless ``disable_gradient_checkpointing: true``
  (``use_reentrant_gc`` defaults to true); it has no ``activation_checkpointing`` (its transformers
  predates the rename) and would refuse the key.
- flex_attention has no ``flash_attn`` value: ``auto`` is written and a comment says so.
- LLaMA-Factory runs its own pinned transformers: a TrainingArguments key the installed transformers has
  and that one lacks is left out (``accepted`` is the release's recorded argument set,
  schemas/llamafactory_fields.json) and a comment names it.
- data: LLaMA-Factory reads files registered in ``dataset_info.json``; a ``save_to_disk`` folder cannot be
  registered (its Arrow and JSON files are refused together), so the comment gives the export command.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.formats import training_args as _ta
from autotune.formats._common import Measured, changed, packed_batch, packed_drift_note, unexpressed_notes
from autotune.formats.model import LORA_DROPOUT
from autotune.spec.levers import ADVICE
from autotune.spec.probe_request import Candidate, ProbeRequest
from autotune.spec.shell import py_str, python_c

__all__ = ["NAME", "LABEL", "VOCAB", "MARKERS", "DEFAULTS", "FLASH_ATTN_VALUES", "HELD_LEVERS", "UNEXPRESSED", "LEVER_KEYS", "OWN_KEYS",
           "accepted_fields", "checkpointing_on", "dataset_note", "detect", "lever_values", "llamafactory_config",
           "to_request", "to_checklist", "tuned_keys"]

NAME = "llamafactory"
LABEL = "LLaMA-Factory"
MARKERS = frozenset({"model_name_or_path", "stage", "finetuning_type", "cutoff_len", "template", "lora_target",
                     "lora_rank", "neat_packing", "flash_attn", "quantization_bit", "plot_loss"})
VOCAB: dict[str, str] = {
    ADVICE["attn"]: "flash_attn: sdpa (or fa2)",
    "attn_implementation: sdpa": "flash_attn: sdpa",
    "attn_implementation": "flash_attn",
    "use_liger_kernel": "enable_liger_kernel",
}
LEVER_KEYS: dict[str, tuple[str, ...]] = {
    **{k: v for k, v in _ta.LEVER_KEYS.items() if k not in ("grad_ckpt", "ckpt_every", "liger")},
    "grad_ckpt": ("disable_gradient_checkpointing", "use_reentrant_gc"),
    "attn": ("flash_attn",),
    "packing": ("packing", "neat_packing", "per_device_train_batch_size"),
    "liger": ("enable_liger_kernel",),
    "seq_len": ("cutoff_len",),
    "mode": ("finetuning_type", "lora_rank", "lora_alpha", "lora_target", "quantization_bit"),
}
# levers this format has no key for -> what a file of it does instead (a note in the emitted file; a write-back
# holds them at their default before the search). Partial checkpointing: LLaMA-Factory enables checkpointing
# itself or through a transformers that may predate every_n_layers.
UNEXPRESSED: dict[str, str] = {"ckpt_every": "checkpoints every decoder layer"}
# levers a write-back leaves as the file has them: the distributed set-up and the fine-tuning mode
HELD_LEVERS = ("zero_stage", "offload", "mode")

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


def _own_values(c: Candidate, at: Measured) -> dict[str, Any]:
    """LLaMA-Factory's own keys of the levers, and the batch in packed rows."""
    out: dict[str, Any] = {} if at.seq_len is None else {"cutoff_len": at.seq_len}
    out["flash_attn"] = FLASH_ATTN_VALUES[c.attn]
    out["disable_gradient_checkpointing"] = not c.grad_ckpt
    if c.grad_ckpt:
        out["use_reentrant_gc"] = False  # autotune measured non-reentrant checkpointing
    out["enable_liger_kernel"] = bool(c.liger)
    out["packing"] = bool(c.packing)
    if c.packing:
        out["neat_packing"] = True  # keeps sequences apart, as autotune's packing does
        out["per_device_train_batch_size"], out["gradient_accumulation_steps"] = packed_batch(
            c.micro_batch, c.grad_accum, at)
    return out


def lever_values(candidate: Candidate, at: Measured) -> dict[str, Any]:
    """The LLaMA-Factory keys of every lever (``LEVER_KEYS``), each with the value that was measured:
    TrainingArguments' (checkpointing and Liger in LLaMA-Factory's own keys) and its own."""
    ta = {k: v for k, v in _ta.lever_values(candidate, at).items() if k not in _REPLACED}
    return {**ta, **_own_values(candidate, at)}
# flash_attn values (LLaMA-Factory's AttentionFunction) <-> attn_implementation
_ATTN = {"disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2", "fa3": "flash_attention_3"}
DEFAULTS = {**_ta.DEFAULTS, "packing": False, "neat_packing": False, "flash_attn": "auto",
            "enable_liger_kernel": False, "disable_gradient_checkpointing": False, "use_reentrant_gc": True}
# TrainingArguments' checkpointing keys: LLaMA-Factory enables checkpointing on the model itself
_TA_CKPT = ("activation_checkpointing", "gradient_checkpointing")


def accepted_fields() -> set[str]:
    """Every argument the pinned LLaMA-Factory release parses (schemas/llamafactory_fields.json)."""
    path = resources.files("autotune").joinpath("emit", "schemas", "llamafactory_fields.json")
    return set(json.loads(path.read_text(encoding="utf-8"))["fields"])


_FILE_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".arrow", ".txt")


def dataset_from_info(name: Any, info: Any, info_dir: str) -> tuple[str | None, str]:
    """The local file a LLaMA-Factory ``dataset:`` names through its ``dataset_info.json`` (``info``, read from
    ``info_dir``), when autotune reads it as LLaMA-Factory does: a ``text`` column for pre-training, or chat
    turns in a ``messages`` column of ``role``/``content`` entries (the entry :func:`dataset_note` writes).
    ``(path, "")``, or ``(None, why not)``."""
    if not isinstance(name, str) or not name.strip():
        return None, "it names no dataset"
    names = [n.strip() for n in name.split(",") if n.strip()]
    if len(names) != 1:
        return None, f"it mixes {len(names)} datasets ({', '.join(names)})"
    if not isinstance(info, Mapping):
        return None, f"no dataset_info.json in {info_dir!r}"
    entry = info.get(names[0])
    if not isinstance(entry, Mapping):
        return None, f"{info_dir}/dataset_info.json has no entry {names[0]!r}"
    file_name = entry.get("file_name")
    if not isinstance(file_name, str) or not file_name.endswith((".json", ".jsonl", ".parquet")):
        return None, f"its entry {names[0]!r} names no local .json/.jsonl/.parquet file"
    columns = entry.get("columns") if isinstance(entry.get("columns"), Mapping) else {}
    tags = entry.get("tags") if isinstance(entry.get("tags"), Mapping) else {}
    chat = (entry.get("formatting") == "sharegpt" and columns.get("messages", "conversations") == "messages"
            and tags.get("role_tag", "from") == "role" and tags.get("content_tag", "value") == "content")
    text = entry.get("formatting", "alpaca") == "alpaca" and dict(columns) == {"prompt": "text"}
    if not (chat or text):
        return None, (f"its entry {names[0]!r} is laid out as autotune does not read it (autotune reads a 'text' "
                      "column, or 'messages' of role/content turns)")
    return str(Path(info_dir) / file_name), ""


def dataset_note(dataset: str, *, split: str | None, column: str | None) -> str:
    """What to do with the measured dataset in LLaMA-Factory: register a file, or export a folder first."""
    path = dataset
    steps = ""
    if not dataset.lower().endswith(_FILE_SUFFIXES):
        # a save_to_disk folder (or a Hub id's cache): dataset_info.json takes files of one type only
        path = dataset.rstrip("/") + ".jsonl"
        pick = f"[{py_str(split)}]" if split else ""
        export = python_c(f"import datasets; datasets.load_from_disk({py_str(dataset)}){pick}.to_json({py_str(path)})")
        steps = f"export it first (a save_to_disk folder cannot be registered): {export}; then "
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
    at = Measured(device=device, mode=wl.mode, seq_len=wl.seq_len, mean_seq_len=mean_seq_len,
                  fields=frozenset(fields))
    notes: list[str] = []
    targs = _ta.emitted_training_args(request, fields=fields, device=device)
    for key in _REPLACED:
        targs.pop(key, None)
    known = accepted_fields() if accepted is None else accepted
    unknown = sorted(k for k in targs if k not in known)
    for key in unknown:
        targs.pop(key)
    if unknown:
        notes.append(f"left out (not arguments of LLaMA-Factory's transformers): {', '.join(unknown)}")
    notes += unexpressed_notes(c, UNEXPRESSED, LABEL)
    own = _own_values(c, at)
    cfg: dict[str, Any] = {
        "model_name_or_path": wl.model,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full" if wl.mode == "full" else "lora",
        **{k: v for k, v in own.items() if k not in ("per_device_train_batch_size", "gradient_accumulation_steps")},
        "output_dir": "./outputs/autotune",
    }
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
            lora_target="all" if wl.lora_targets == ("all-linear",) else ",".join(wl.lora_targets),
        )
        if wl.mode == "qlora":
            cfg.update(quantization_bit=4, quantization_method="bnb")
    if "deepspeed" in targs:
        targs["deepspeed"] = deepspeed_path or "deepspeed.json"
    if c.packing:
        targs["per_device_train_batch_size"] = own["per_device_train_batch_size"]
        targs["gradient_accumulation_steps"] = own["gradient_accumulation_steps"]
        notes.append(
            f"packing: autotune measured micro-batches of {c.micro_batch} sequences packed into rows with "
            "per-sequence attention; LLaMA-Factory packs the dataset into rows of cutoff_len (neat_packing "
            f"keeps sequences apart) and the batch size counts rows: {own['per_device_train_batch_size']} "
            f"row(s) hold a micro-batch's sequences, and {own['gradient_accumulation_steps']} of them a step's"
        )
        drift = packed_drift_note(c.micro_batch, c.grad_accum, at)
        notes += [drift] if drift else []
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


def checkpointing_on(cfg: Mapping[str, Any]) -> bool:
    """What LLaMA-Factory does: checkpointing unless disable_gradient_checkpointing (or the Trainer's own
    gradient_checkpointing: true, which turns it on again)."""
    return not cfg.get("disable_gradient_checkpointing", False) or bool(cfg.get("gradient_checkpointing"))


def detect(cfg: Mapping[str, Any]) -> bool:
    return len(MARKERS & set(cfg)) >= 2 or ("model_name_or_path" in cfg and "stage" in cfg)


def _mode(cfg: Mapping[str, Any]) -> str:
    if cfg.get("finetuning_type", "lora") == "lora":
        return "qlora" if cfg.get("quantization_bit") == 4 else "lora"
    return "full"


def to_request(cfg: Mapping[str, Any]) -> dict[str, Any]:
    req = _ta.to_request(cfg)
    req["mode"] = _mode(cfg)
    if isinstance(cfg.get("model_name_or_path"), str):
        req["model"] = cfg["model_name_or_path"]
    if isinstance(cfg.get("cutoff_len"), int):
        req["seq_len"] = cfg["cutoff_len"]
    req["packing"] = bool(cfg.get("packing") or cfg.get("neat_packing"))
    req["grad_ckpt"] = checkpointing_on(cfg)
    if req["mode"] != "full":
        r = cfg.get("lora_rank", 8)
        req["lora_r"] = r
        if cfg.get("lora_alpha"):
            req["lora_alpha"] = cfg["lora_alpha"]  # without it LLaMA-Factory uses 2 x the rank, as autotune does
        target = cfg.get("lora_target", "all")  # LLaMA-Factory's default: every linear layer
        if isinstance(target, str) and target.strip():
            names = tuple(t.strip() for t in target.split(",") if t.strip())
            req["lora_targets"] = ("all-linear",) if names == ("all",) else names
    attn = _ATTN.get(str(cfg.get("flash_attn", "auto")))
    if attn:
        req["attn"] = attn
    return req


def to_checklist(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    known_here = set(MARKERS) | {"packing", "disable_gradient_checkpointing", "use_reentrant_gc", *_TA_CKPT}
    ta = {k: v for k, v in cfg.items() if k not in known_here}
    ta["activation_checkpointing"] = checkpointing_on(cfg)
    if "enable_liger_kernel" in ta:
        ta["use_liger_kernel"] = ta.pop("enable_liger_kernel")
    out: dict[str, dict[str, Any]] = {"training_args": ta}
    attn = _ATTN.get(str(cfg.get("flash_attn", "auto")))
    mk: dict[str, Any] = {"attn_implementation": attn} if attn else {}
    if cfg.get("quantization_bit") == 4:
        mk["quantization_config"] = {"load_in_4bit": True}
    if mk:
        out["model_kwargs"] = mk
    if _mode(cfg) != "full":
        out["lora"] = {"r": cfg.get("lora_rank", 8)}
    return out


def tuned_keys(
    candidate: Candidate | Mapping[str, Any], cfg: Mapping[str, Any], *, fields: set[str] | None = None,
    at: Measured | None = None,
) -> dict[str, Any]:
    """The keys a write-back changes: :func:`lever_values`, checkpointing in LLaMA-Factory's own switch
    (written whenever it differs from what the file does now, "off" included: its default is on)."""
    c = _ta.candidate_of(candidate)
    at = at or Measured(fields=None if fields is None else frozenset(fields))
    wanted = {k: v for k, v in _ta.written_back(c, cfg, at).items() if k not in _REPLACED}
    own = _own_values(c, at)
    if "gradient_checkpointing" in cfg:
        wanted["gradient_checkpointing"] = bool(c.grad_ckpt)  # the Trainer's own switch would enable it again
    if not c.packing and cfg.get("neat_packing"):
        own["neat_packing"] = False
    current = _ATTN.get(str(cfg.get("flash_attn", "auto")))
    if current == c.attn or current is None and c.attn == "sdpa":
        del own["flash_attn"]  # what the file runs already ("auto" picks sdpa)
    wanted.update(own)
    return changed(cfg, wanted, DEFAULTS)
