"""Type checks of the values ``--from`` reads, like the CLI's own flags.  [pure]

A ``micro_batch_size: "two"`` or ``2.5`` must not become "effective batch None" and then the default
64 (a different request than the user's): each key the request is read from is checked here and a
wrong type is a SpecError naming the key, its value and the fix. Keys absent from the file are fine
(the format's default applies).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.spec.files import short_repr

__all__ = ["unmeasured_problems", "value_problems"]

# key -> smallest allowed integer, per format (only keys whose value becomes part of the request)
_BATCH = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "dataloader_num_workers": 0}
_INTS: dict[str, dict[str, int]] = {
    "axolotl": {"micro_batch_size": 1, "gradient_accumulation_steps": 1, "sequence_len": 8, "lora_r": 1,
                "lora_alpha": 1, "dataloader_num_workers": 0},
    "training_args": dict(_BATCH),
    "trl": {**_BATCH, "max_length": 8, "max_seq_length": 8},  # (a sequence: the least length a probe takes)
    "llamafactory": {**_BATCH, "cutoff_len": 8, "lora_rank": 1, "lora_alpha": 1},
    "deepspeed": {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1},
    "accelerate": {},
}
# keys that must be true/false ("auto" where the format has it)
_BOOLS: dict[str, tuple[str, ...]] = {
    "axolotl": ("bf16", "fp16", "tf32", "gradient_checkpointing", "sample_packing", "load_in_4bit"),
    "training_args": ("bf16", "fp16", "tf32", "gradient_checkpointing", "activation_checkpointing"),
    "trl": ("bf16", "fp16", "tf32", "gradient_checkpointing", "activation_checkpointing", "packing",
            "padding_free"),
    "llamafactory": ("bf16", "fp16", "tf32", "gradient_checkpointing", "packing", "neat_packing"),
    "deepspeed": (),
    "accelerate": (),
}
# the words a key accepts besides its type (Axolotl's own schema; DeepSpeed's "auto")
_WORDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("axolotl", "bf16"): ("auto",), ("axolotl", "tf32"): ("auto",),
    ("axolotl", "gradient_checkpointing"): ("offload", "offload_disk"),
    ("deepspeed", "train_micro_batch_size_per_gpu"): ("auto",), ("deepspeed", "gradient_accumulation_steps"): ("auto",),
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def value_problems(fmt: str, cfg: Mapping[str, Any], label: str) -> list[str]:
    """One message per key of ``cfg`` (a ``fmt`` file) whose value has the wrong type or range."""
    out: list[str] = []
    for key, low in _INTS.get(fmt, {}).items():
        if key not in cfg or cfg[key] is None:
            continue
        v = cfg[key]
        if isinstance(v, str) and v in _WORDS.get((fmt, key), ()):
            continue
        if not _is_int(v) or v < low:
            example = 2048 if low == 8 else max(low, 1) * 2 if low else 0
            out.append(f"{label}: {key} must be an integer >= {low}, got {short_repr(v)}; write a whole number "
                       f"(e.g. {key}: {example})")
    for key in _BOOLS.get(fmt, ()):
        if key not in cfg or cfg[key] is None:
            continue
        v = cfg[key]
        words = _WORDS.get((fmt, key), ())
        if isinstance(v, str) and v in words:
            continue
        if not isinstance(v, bool):
            allowed = ", ".join(["true", "false", *words[:-1]]) + (f" or {words[-1]}" if words else "") \
                if words else "true or false"
            out.append(f"{label}: {key} must be {allowed}, got {short_repr(v)}")
    if fmt == "trl" and cfg.get("use_peft") is True and cfg.get("lora_target_modules") in ([], ""):
        out.append(f"{label}: lora_target_modules is empty, and peft refuses a LoRA config with no target modules; "
                   "name them, or remove the key for peft's default")
    one = cfg.get("lora_target_modules")
    if fmt in ("trl", "axolotl") and isinstance(one, str) and one.strip() not in ("", "all-linear"):
        # peft reads a string as a regular expression over whole module paths (model.layers.0.mlp.gate_proj): a bare
        # name matches nothing there, and autotune would measure its default targets instead
        out.append(f"{label}: lora_target_modules is the string {one!r}, which peft reads as a regular expression "
                   f"over whole module paths; write a list, e.g. lora_target_modules: [{one.strip()}]")
    if cfg.get("bf16") is True and cfg.get("fp16") is True:
        out.append(f"{label}: bf16 and fp16 are both true, which transformers refuses (at most one of them); keep one")
    for key in ("base_model", "model_name_or_path", "model"):
        if key in cfg and cfg[key] is not None and key in _MODEL_KEYS.get(fmt, ()) and not isinstance(cfg[key], str):
            out.append(f"{label}: {key} must be a model id or folder (a string), got {short_repr(cfg[key])}")
    return out


_MODEL_KEYS: dict[str, tuple[str, ...]] = {"axolotl": ("base_model",), "llamafactory": ("model_name_or_path",)}


# settings under which the file trains something the probes do not measure: (format, key) -> (the values that are
# fine, what the file would train instead). A --from file with one of them is refused (exit 2): the search would
# measure another training set-up than the file's, and write its levers back into it.
_UNMEASURED: dict[tuple[str, str], tuple[tuple[Any, ...], str]] = {
    ("axolotl", "load_in_8bit"): ((None, False), "an 8-bit base (autotune measures 16-bit LoRA and 4-bit QLoRA)"),
    ("trl", "load_in_8bit"): ((None, False), "an 8-bit base (autotune measures 16-bit LoRA and 4-bit QLoRA)"),
    ("llamafactory", "quantization_bit"): ((None, 4), "an 8-bit (or other non-4-bit) base (autotune measures "
                                                      "16-bit LoRA and 4-bit QLoRA)"),
    ("axolotl", "adapter"): ((None, "lora", "qlora"), "an adapter other than LoRA/QLoRA"),
    ("llamafactory", "finetuning_type"): ((None, "lora", "full"), "freeze or OFT fine-tuning (autotune measures "
                                                                  "LoRA, QLoRA and full fine-tuning)"),
    ("llamafactory", "stage"): ((None, "sft", "pt"), "a stage other than supervised fine-tuning or pre-training "
                                                     "(reward model, PPO, DPO, KTO: other models in memory)"),
    ("axolotl", "rl"): ((None,), "preference training (DPO, KTO, ORPO, GRPO: other models and batches)"),
    ("axolotl", "peft_use_dora"): ((None, False), "DoRA (its weight-norm path is not measured)"),
    ("llamafactory", "use_dora"): ((None, False), "DoRA (its weight-norm path is not measured)"),
    ("trl", "use_dora"): ((None, False), "DoRA (its weight-norm path is not measured)"),
}


def unmeasured_problems(fmt: str, cfg: Mapping[str, Any], label: str) -> list[str]:
    """One line per setting with which the file trains something autotune's probes do not measure
    (``_UNMEASURED``), naming the key and the fix."""
    out = []
    for (f, key), (fine, what) in _UNMEASURED.items():
        if f == fmt and cfg.get(key) not in fine:
            out.append(f"{label}: {key}: {short_repr(cfg.get(key))} trains {what}; autotune cannot measure it "
                       f"(remove the key to tune the set-up it measures)")
    return out
