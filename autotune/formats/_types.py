"""The value types of the config keys autotune judges or reads.  [pure]

``autotune check`` validates each value's type before a rule judges it (a wrong type is a FAIL
naming the key, never a crash and never a PASS: ``"bf16": "yes"`` is not mixed precision), and
``--from`` refuses the same values. One table per kind of file: TrainingArguments, DeepSpeed (also
the ``deepspeed`` dict inline in TrainingArguments), accelerate, model kwargs, LoRA.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from autotune.spec.files import YAML_TEXT_NUMBER, short_repr

__all__ = ["ENUMS_JUDGED", "enum_problems", "numbers_read_as_text", "type_problems"]

Check = Callable[[Any], bool]


def _int(low: int) -> Check:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _num(low: float = 0.0) -> Check:
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= low


def _or(*checks: Check) -> Check:
    return lambda v: any(c(v) for c in checks)


def _is(*types: type) -> Check:
    return lambda v: isinstance(v, types) and not (isinstance(v, bool) and bool not in types)


def _word(*words: str) -> Check:
    return lambda v: isinstance(v, str) and v in words


_BOOL = _is(bool)
_STR = _is(str)
_AUTO = _word("auto")
_STR_LIST = lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))  # noqa: E731

# key -> (check, what it must be)
_TA: dict[str, tuple[Check, str]] = {
    "per_device_train_batch_size": (_int(1), "an integer >= 1"),
    "gradient_accumulation_steps": (_int(1), "an integer >= 1"),
    "dataloader_num_workers": (_int(0), "an integer >= 0"),
    "bf16": (_BOOL, "true or false"), "fp16": (_BOOL, "true or false"),
    "tf32": (_BOOL, "true or false"), "use_cpu": (_BOOL, "true or false"),
    "gradient_checkpointing": (_BOOL, "true or false"), "activation_checkpointing": (_BOOL, "true or false"),
    "dataloader_pin_memory": (_BOOL, "true or false"), "dataloader_persistent_workers": (_BOOL, "true or false"),
    "auto_find_batch_size": (_BOOL, "true or false"), "torch_compile": (_BOOL, "true or false"),
    "packing": (_BOOL, "true or false"), "padding_free": (_BOOL, "true or false"),
    "group_by_length": (_BOOL, "true or false"),
    "report_to": (_STR_LIST, "a name or a list of names (e.g. tensorboard, or none)"),
    "optim": (_STR, "an optimizer name (a string)"),
    "save_steps": (_num(0), "a number >= 0"), "save_total_limit": (_int(0), "an integer >= 0"),
    "seed": (_int(0), "an integer >= 0"), "max_steps": (_int(-1), "an integer"),
    "learning_rate": (_num(0), "a number >= 0"),
    "deepspeed": (_is(str, dict), "a file path or a DeepSpeed config mapping"),
    # a `trl sft --config` file's ModelConfig keys, which the request is read from (formats.trl)
    "model_name_or_path": (_STR, "a model id or folder (a string)"),
    "use_peft": (_BOOL, "true or false"), "load_in_4bit": (_BOOL, "true or false"),
    "lora_r": (_int(1), "an integer >= 1"), "lora_alpha": (_int(1), "an integer >= 1"),
    "lora_target_modules": (_STR_LIST, "all-linear or a list of module names"),
}
_DS: dict[str, tuple[Check, str]] = {
    "zero_optimization": (_is(dict), "a mapping ({stage: 0-3, ...})"),
    "train_micro_batch_size_per_gpu": (_or(_int(1), _AUTO), "an integer >= 1 or auto"),
    "gradient_accumulation_steps": (_or(_int(1), _AUTO), "an integer >= 1 or auto"),
    "train_batch_size": (_or(_int(1), _AUTO), "an integer >= 1 or auto"),
    "bf16": (_is(dict), "a mapping ({enabled: true|false|auto})"),
    "fp16": (_is(dict), "a mapping ({enabled: true|false|auto})"),
}
_ZERO: dict[str, tuple[Check, str]] = {
    "stage": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 3, "0, 1, 2 or 3"),
    "offload_optimizer": (_is(dict), "a mapping ({device: cpu|nvme|none, ...})"),
    "offload_param": (_is(dict), "a mapping ({device: cpu|nvme|none, ...})"),
    "overlap_comm": (_BOOL, "true or false"), "contiguous_gradients": (_BOOL, "true or false"),
    "reduce_bucket_size": (_or(_num(0), _AUTO), "a number or auto"),
    "allgather_bucket_size": (_or(_num(0), _AUTO), "a number or auto"),
    "stage3_prefetch_bucket_size": (_or(_num(0), _AUTO), "a number or auto"),
}
_OFFLOAD: dict[str, tuple[Check, str]] = {
    "device": (_STR, "cpu, nvme or none"), "pin_memory": (_BOOL, "true or false"),
}
_PRECISION_BLOCK: dict[str, tuple[Check, str]] = {"enabled": (_or(_BOOL, _AUTO), "true, false or auto")}
_ACC: dict[str, tuple[Check, str]] = {
    "fsdp_config": (_is(dict), "a mapping"), "deepspeed_config": (_is(dict), "a mapping"),
    "num_processes": (_int(1), "an integer >= 1"), "num_machines": (_int(1), "an integer >= 1"),
    "mixed_precision": (_word("no", "fp16", "bf16", "fp8"), "no, fp16, bf16 or fp8"),
    "distributed_type": (_STR, "a name (e.g. MULTI_GPU, DEEPSPEED, FSDP)"), "use_cpu": (_BOOL, "true or false"),
}
_MK: dict[str, tuple[Check, str]] = {
    "attn_implementation": (_STR, "a name (sdpa, eager, flash_attention_2)"),
    "dtype": (_STR, "a dtype name (bfloat16, float16, float32, auto)"),
    "torch_dtype": (_STR, "a dtype name"), "quantization_config": (_is(dict), "a mapping"),
}
_LORA: dict[str, tuple[Check, str]] = {
    "r": (_int(1), "an integer >= 1"), "lora_alpha": (_num(0), "a number"),
    "target_modules": (_STR_LIST, "a module name or a list of names"),
}


def _table(data: Mapping[str, Any], table: Mapping[str, tuple[Check, str]], prefix: str) -> list[tuple[str, str]]:
    out = []
    for key, (ok, what) in table.items():
        if key in data and data[key] is not None and not ok(data[key]):
            out.append((prefix + key, f"{prefix}{key} must be {what}, got {short_repr(data[key])}"))
    return out


def _deepspeed(ds: Mapping[str, Any], prefix: str) -> list[tuple[str, str]]:
    out = _table(ds, _DS, prefix)
    zero = ds.get("zero_optimization")
    if isinstance(zero, Mapping):
        out += _table(zero, _ZERO, f"{prefix}zero_optimization.")
        for part in ("offload_optimizer", "offload_param"):
            if isinstance(zero.get(part), Mapping):
                out += _table(zero[part], _OFFLOAD, f"{prefix}zero_optimization.{part}.")
    for p in ("bf16", "fp16"):
        if isinstance(ds.get(p), Mapping):
            out += _table(ds[p], _PRECISION_BLOCK, f"{prefix}{p}.")
    return out


def numbers_read_as_text(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with the number-typed TrainingArguments keys whose value YAML 1.1 read as text (``2e-5``: no dot
    before the exponent) as the float they are. TRL's parser (argparse converts string defaults by the field's
    type) and LLaMA-Factory's (OmegaConf's YAML reads them as floats) train with the number; transformers'
    ``HfArgumentParser.parse_yaml_file`` does not convert them, so a plain TrainingArguments file keeps them text."""
    out = dict(data)
    for key, (check, _) in _TA.items():
        v = out.get(key)
        if isinstance(v, str) and YAML_TEXT_NUMBER.match(v.strip()) and check(float(v)):
            out[key] = float(v)
    return out


def type_problems(kind: str, data: Any) -> list[tuple[str, str]]:
    """(dotted key, message) for each value of a ``kind`` config (training_args, deepspeed, accelerate,
    model_kwargs, lora) whose type the checks and the request cannot use."""
    if not isinstance(data, Mapping):
        return []
    if kind == "training_args":
        out = _table(data, _TA, "")
        if isinstance(data.get("deepspeed"), Mapping):
            out += _deepspeed(data["deepspeed"], "deepspeed.")
        return out
    if kind == "deepspeed":
        return _deepspeed(data, "")
    if kind == "accelerate":
        return _table(data, _ACC, "")
    if kind == "model_kwargs":
        return _table(data, _MK, "")
    if kind == "lora":
        return _table(data, _LORA, "")
    return []


# the formats whose TrainingArguments keys transformers itself parses, so whose enum-valued names it refuses (Axolotl
# maps its own optimizer and scheduler names, which transformers does not know, before it builds them)
ENUMS_JUDGED = frozenset({"training_args", "trl", "llamafactory"})


def enum_problems(data: Any, enums: Mapping[str, frozenset[str]]) -> list[tuple[str, str, str]]:
    """(key, message, fix) for each TrainingArguments value outside what the installed transformers accepts for its
    key (``enums``: ``autotune.env.training_enums``; ``report_to`` a name or a list of names): TrainingArguments
    refuses such a value at construction (the Trainer, an unknown ``report_to``), so the file does not start."""
    import difflib

    if not isinstance(data, Mapping):
        return []
    out = []
    for key, allowed in enums.items():
        value = data.get(key)
        given = [value] if isinstance(value, str) else value if key == "report_to" and isinstance(value, list) else []
        for v in given:
            if not isinstance(v, str) or v in allowed:
                continue
            near = difflib.get_close_matches(v, sorted(allowed), n=1)
            fix = f"{key}: {near[0]}" if near else f"{key}: one of {', '.join(sorted(allowed)[:6])}, ..."
            out.append((key, f"{key} {v!r} is not a value the installed transformers accepts: it refuses to start", fix))
    return out
