"""LLaMA-Factory YAML (``llamafactory-cli train config.yaml``) and the DeepSpeed JSON it names.  [pure]

LLaMA-Factory parses one flat file into its Model/Data/Finetuning/Generating arguments plus
transformers' ``Seq2SeqTrainingArguments``, and rejects keys none of them has (``HfArgumentParser``
with ``allow_extra_keys`` off unless ``ALLOW_EXTRA_ARGS`` is set). Its own key set and commit are
in ``autotune/emit/schemas/llamafactory_keys.json``; the TrainingArguments part is the installed transformers'.

``packing``/``neat_packing`` pack into rows of ``cutoff_len`` tokens (neat_packing keeps attention
within each sequence, as autotune's packing does, and turns ``packing`` on itself); as for Axolotl,
micro-batch then counts rows. Checkpointing is LLaMA-Factory's own switch, ON unless
``disable_gradient_checkpointing: true`` (``use_reentrant_gc`` defaults to true); it has no
``activation_checkpointing`` (its transformers predates the rename) and would refuse the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.formats import training_args as _ta
from autotune.formats._common import changed

__all__ = ["NAME", "LABEL", "VOCAB", "MARKERS", "checkpointing_on", "detect", "to_request", "to_checklist",
           "tuned_keys"]

NAME = "llamafactory"
LABEL = "LLaMA-Factory"
MARKERS = frozenset({"model_name_or_path", "stage", "finetuning_type", "cutoff_len", "template", "lora_target",
                     "lora_rank", "neat_packing", "flash_attn", "quantization_bit", "plot_loss"})
VOCAB: dict[str, str] = {
    "attn_implementation: sdpa (or flash_attention_2 where installed and supported)": "flash_attn: sdpa (or fa2)",
    "attn_implementation: sdpa": "flash_attn: sdpa",
    "attn_implementation": "flash_attn",
    "use_liger_kernel": "enable_liger_kernel",
}
# flash_attn values (LLaMA-Factory's AttentionFunction) <-> attn_implementation
_ATTN = {"disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2", "fa3": "flash_attention_3"}
_ATTN_BACK = {v: k for k, v in _ATTN.items()}
DEFAULTS = {**_ta.DEFAULTS, "packing": False, "neat_packing": False, "flash_attn": "auto",
            "enable_liger_kernel": False, "disable_gradient_checkpointing": False, "use_reentrant_gc": True}
# TrainingArguments' checkpointing keys: LLaMA-Factory enables checkpointing on the model itself
_TA_CKPT = ("activation_checkpointing", "gradient_checkpointing")


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
        req["lora_alpha"] = cfg.get("lora_alpha") or (2 * r if isinstance(r, int) else None)
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
    candidate: Mapping[str, Any], cfg: Mapping[str, Any], *, fields: set[str] | None = None
) -> dict[str, Any]:
    wanted = _ta.lever_values(candidate, cfg, fields)
    wanted["enable_liger_kernel"] = wanted.pop("use_liger_kernel")
    for key in _TA_CKPT:
        wanted.pop(key, None)
    on = bool(candidate["grad_ckpt"])
    # written whenever it differs from what the file does now, "off" included (LLaMA-Factory's default is on)
    wanted["disable_gradient_checkpointing"] = not on
    if on:
        wanted["use_reentrant_gc"] = False  # autotune measured non-reentrant checkpointing
    if "gradient_checkpointing" in cfg:
        wanted["gradient_checkpointing"] = on  # the Trainer's own switch would enable it again
    # autotune's packing keeps sequences apart: neat_packing (which implies packing)
    if candidate["packing"]:
        wanted["packing"] = True
        wanted["neat_packing"] = True
    else:
        wanted["packing"] = False
        if cfg.get("neat_packing"):
            wanted["neat_packing"] = False
    current = _ATTN.get(str(cfg.get("flash_attn", "auto")))
    if current is not None and current != candidate["attn"] or current is None and candidate["attn"] != "sdpa":
        wanted["flash_attn"] = _ATTN_BACK.get(candidate["attn"], "auto")
    return changed(cfg, wanted, DEFAULTS)
