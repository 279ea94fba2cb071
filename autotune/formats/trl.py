"""TRL ``SFTConfig``: the emitted ``sft_config.json`` and a user's JSON/YAML, both ways.  [pure]

``trl.SFTConfig`` subclasses ``transformers.TrainingArguments``, so every tuned TrainingArguments key
is carried over unchanged (:func:`autotune.formats.training_args.lever_values`, the probe's own source);
this module adds TRL's keys (:func:`lever_values`: sequence length and packing) and reads them back.

Packing. autotune's ``micro_batch`` counts SEQUENCES; with packing, a micro-batch's sequences are
laid into rows with per-sequence attention (autotune.probe.collate). TRL 1.16 refuses
``padding_free=True`` without ``packing`` while ``max_length`` is set (it would not truncate), so
the emitted form is TRL's own packing: ``packing=True, packing_strategy="bfd"``, which packs the
dataset into rows of ``max_length`` ahead of training, is padding-free (flattened rows, restarting
``position_ids``) and counts ROWS per micro-batch. ``per_device_train_batch_size`` is therefore the
number of rows that holds one measured micro-batch's sequences, and ``gradient_accumulation_steps`` the
accumulation whose rows hold an optimizer step's (:func:`autotune.formats._common.packed_batch`), in the
emitted file and in a write-back alike; a ``--trainer trl`` probe runs those rows at its window's
accumulation. Sequences
stay apart with flash_attention_2/3 (varlen) and, because ``SFTTrainer`` calls the model with
``use_cache=False``, with sdpa/eager on transformers 5.x as well (the model derives a block-causal mask
from the restarting positions; with ``use_cache=True`` it would not: measured logit difference 4e-8 vs
0.17 on a tiny Llama). A user's file that packs with ``padding_free: true`` alone (no bins) keeps it:
there the batch counts sequences, as autotune's does.

``trl sft --config FILE`` reads one file into three dataclasses: ``SFTConfig``, ``ModelConfig`` (the model,
PEFT/LoRA, quantization) and ``ScriptArguments`` (the dataset). The model's and the adapters' keys are read
here too (:func:`to_request`, :func:`to_checklist`); which names are valid is the installed trl's
(``autotune.env.sft_fields``), and TRL's renamed keys are :data:`RENAMED`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.formats import training_args as _ta
from autotune.formats._common import Measured, changed, local_dataset, packed_batch
from autotune.formats.model import PEFT_DEFAULT
from autotune.spec.probe_request import Candidate, ProbeRequest

__all__ = ["NAME", "LABEL", "VOCAB", "MARKERS", "DEFAULTS", "LEVER_KEYS", "HELD_LEVERS", "UNEXPRESSED", "RENAMED", "SFT_KEYS", "PACKING_NOTE",
           "TRL_PACKING_QUALITY_NOTE", "detect", "lever_values", "sft_config", "sft_probe_overrides", "to_request",
           "to_checklist", "tuned_keys"]

NAME = "trl"
LABEL = "TRL SFTConfig"
VOCAB: dict[str, str] = {}
# SFTConfig fields TrainingArguments does not have (trl 1.16); any one marks the file as TRL.
MARKERS = frozenset({
    "max_length", "packing", "padding_free", "packing_strategy", "dataset_text_field", "completion_only_loss",
    "assistant_only_loss", "model_init_kwargs", "dataset_num_proc", "eval_packing", "pad_to_multiple_of",
    "chat_template_path", "activation_offloading", "dataset_kwargs", "truncation_mode", "shuffle_dataset",
    # a `trl sft --config` file's ModelConfig keys, and SFTConfig's renamed max_seq_length (no other format's)
    "use_peft", "lora_target_modules", "max_seq_length",
})  # fmt: skip
DEFAULTS = {**_ta.DEFAULTS, "packing": False, "padding_free": False, "packing_strategy": "bfd"}

# Keys TRL's SFTConfig adds to TrainingArguments that autotune writes (checked against the installed
# trl by tests/test_emit_targets.py).
SFT_KEYS = frozenset({"max_length", "packing", "packing_strategy"})

# autotune lever -> the SFTConfig key(s) that carry it (TrainingArguments' plus TRL's own).
LEVER_KEYS: dict[str, tuple[str, ...]] = {
    **_ta.LEVER_KEYS,
    "packing": ("packing", "packing_strategy", "padding_free", "per_device_train_batch_size"),
    "seq_len": ("max_length",),
    "attn": (),  # a model argument: model_kwargs.json / SFTConfig.model_init_kwargs
}
HELD_LEVERS = _ta.HELD_LEVERS
# keys TRL renamed -> the new name (the old one is refused by the current SFTConfig)
RENAMED: dict[str, str] = {"max_seq_length": "max_length"}
UNEXPRESSED: dict[str, str] = {}  # SFTConfig carries packing (packing, padding_free) and every_n_layers


def _own_values(c: Candidate, at: Measured) -> dict[str, Any]:
    """TRL's keys: the sequence length, packing, and the batch in packed rows."""
    kw: dict[str, Any] = {} if at.seq_len is None else {"max_length": at.seq_len}
    kw["packing"] = bool(c.packing)
    if c.packing:
        kw["packing_strategy"] = "bfd"
        kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"] = packed_batch(
            c.micro_batch, c.grad_accum, at)
    return kw


def lever_values(candidate: Candidate, at: Measured) -> dict[str, Any]:
    """The SFTConfig keys of every lever (``LEVER_KEYS``), each with the value that was measured."""
    return {**_ta.lever_values(candidate, at), **_own_values(candidate, at)}


PACKING_NOTE = (
    "packing -> packing=true, packing_strategy=bfd: TRL packs the dataset into rows of max_length and "
    "per_device_train_batch_size counts rows (autotune measured micro-batches of sequences): the rows "
    "written hold one measured micro-batch's sequences, and the accumulation written an optimizer step's"
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
    bookkeeping; :data:`autotune.formats.training_args.RUN_ONLY_KEYS`) set to the probe's values, nothing
    that decides speed or memory.

    The probe builds ``SFTConfig(**sft_config(...), **these)``, so every measured key is the emitted one.
    The data order stays SFTTrainer's own (its seeded sampler, as ``train_sft.py`` reads), not the hf
    probe's sequential one.
    """
    probe = _ta.probe_kwargs(request, fields=fields, device=device)
    return {k: probe[k] for k in sorted(_ta.RUN_ONLY_KEYS - {"train_sampling_strategy"}) if k in probe}


def sft_config(
    request: ProbeRequest,
    *,
    fields: set[str],
    device: str,
    report_to: str | list[str] = "none",
    mean_seq_len: float | None = None,
    probe: bool = False,
) -> dict[str, Any]:
    """``sft_config.json``: loads as ``trl.SFTConfig(output_dir=..., **it)``.

    ``fields``: the installed TrainingArguments' field names (SFTConfig has them all). ``probe``: the config a
    ``--trainer trl`` probe runs, packed rows at the probe window's accumulation.
    """
    kw = _ta.emitted_training_args(request, fields=fields, device=device, report_to=report_to)
    # the probe feeds pre-built batches and so keeps every column; SFTTrainer drops what it does not use
    kw.pop("remove_unused_columns", None)
    at = Measured(device=device, mode=request.workload.mode, seq_len=request.workload.seq_len,
                  mean_seq_len=mean_seq_len, fields=frozenset(fields), probe=probe)
    kw.update(_own_values(request.candidate, at))
    return kw


def detect(cfg: Mapping[str, Any]) -> bool:
    return bool(MARKERS & set(cfg))


def to_request(cfg: Mapping[str, Any]) -> dict[str, Any]:
    req = _ta.to_request(cfg)
    if isinstance(cfg.get("max_length"), int):
        req["seq_len"] = cfg["max_length"]
    req["packing"] = bool(cfg.get("packing") or cfg.get("padding_free"))
    attn = _attn_implementation(cfg)
    if attn is not None:
        req["attn"] = attn
    ds = local_dataset(cfg.get("dataset_name"))
    if ds:
        req["dataset"] = ds
    req.update(_model_request(cfg))
    return req


def _model_request(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What a ``trl sft`` config's ModelConfig keys ask: the model, and LoRA/QLoRA with its adapters."""
    out: dict[str, Any] = {}
    if isinstance(cfg.get("model_name_or_path"), str):
        out["model"] = cfg["model_name_or_path"]
    if cfg.get("use_peft") is True:
        out["mode"] = "qlora" if cfg.get("load_in_4bit") is True else "lora"
        if isinstance(cfg.get("lora_r"), int):
            out["lora_r"] = cfg["lora_r"]
        if isinstance(cfg.get("lora_alpha"), int):
            out["lora_alpha"] = cfg["lora_alpha"]
        targets = cfg.get("lora_target_modules")
        if isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets):
            out["lora_targets"] = ",".join(targets)
        elif targets == "all-linear":
            out["lora_targets"] = "all-linear"
        elif targets is None:  # TRL passes None: peft's default for the model type (resolved with the model)
            out["lora_targets"] = PEFT_DEFAULT
    elif "use_peft" in cfg:
        out["mode"] = "full"
    return out


def _attn_implementation(cfg: Mapping[str, Any]) -> str | None:
    """The attention a config asks for: a ``trl sft --config`` file's ModelConfig ``attn_implementation`` (what the
    script builds the model with), else SFTConfig's ``model_init_kwargs``."""
    mik = cfg.get("model_init_kwargs")
    for value in (cfg.get("attn_implementation"), mik.get("attn_implementation") if isinstance(mik, Mapping) else None):
        if isinstance(value, str):
            return value
    return None


def to_checklist(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {"training_args": dict(cfg)}
    mik = cfg.get("model_init_kwargs")
    if isinstance(mik, Mapping):
        out["model_kwargs"] = dict(mik)
    attn = _attn_implementation(cfg)
    if attn is not None:
        out.setdefault("model_kwargs", {})["attn_implementation"] = attn
    model = _model_request(cfg)  # a trl sft config's adapters (ModelConfig), the valid values only
    if model.get("mode") in ("lora", "qlora"):
        out["lora"] = {"r": model.get("lora_r", 16), "lora_alpha": model.get("lora_alpha"),
                       "target_modules": cfg.get("lora_target_modules")}
        if model["mode"] == "qlora":
            out.setdefault("model_kwargs", {})["quantization_config"] = {"load_in_4bit": True}
    return out


def tuned_keys(
    candidate: Candidate | Mapping[str, Any], cfg: Mapping[str, Any], *, fields: set[str] | None = None,
    at: Measured | None = None,
) -> dict[str, Any]:
    """The keys a write-back changes: :func:`lever_values` in the file's own packing key."""
    c = _ta.candidate_of(candidate)
    at = at or Measured(fields=None if fields is None else frozenset(fields))
    wanted = _ta.written_back(c, cfg, at)
    if "padding_free" in cfg and "packing" not in cfg:
        wanted["padding_free"] = bool(c.packing)  # padding-free without bins: the batch counts sequences
        wanted.update({k: v for k, v in _own_values(c, at).items() if k == "max_length"})
    else:
        wanted.update(_own_values(c, at))
    return changed(cfg, wanted, DEFAULTS)
