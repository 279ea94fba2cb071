"""The model side of a configuration: ``from_pretrained`` keyword arguments and the LoRA config.  [pure]

``model_kwargs.json`` loads as ``AutoModelForCausalLM.from_pretrained(model, **it)`` (for QLoRA its
``quantization_config`` holds BitsAndBytesConfig fields); ``lora_config.json`` as ``peft.LoraConfig(**it)``.
The probe builds its model from the same functions, so the model handed out is the one measured.
"""

from __future__ import annotations

from typing import Any

from autotune.spec.probe_request import Candidate, Workload

__all__ = ["LORA_DROPOUT", "PEFT_DEFAULT", "PEFT_DEFAULT_PATTERNS", "PEFT_DEFAULT_TARGETS", "emitted_model_kwargs", "lora_config", "lora_target_modules", "model_dtype", "model_kwargs",
           "quantization_config"]

LORA_DROPOUT = 0.05
# a LoRA config with no target_modules: peft picks its default for the model type (a trl sft config's use_peft with
# no lora_target_modules); the request resolves it with the model (``peft_default_targets``)
PEFT_DEFAULT = "peft-default"
# peft 0.21.2's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for causal LMs (tests/test_formats.py compares
# it with the installed peft); a model type it lacks has no default: peft refuses a config without targets
PEFT_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "RefinedWeb": ("query_key_value",), "RefinedWebModel": ("query_key_value",), "bloom": ("query_key_value",),
    "btlm": ("c_proj", "c_attn"), "chatglm": ("query_key_value",), "codegen": ("qkv_proj",),
    "falcon": ("query_key_value",), "gemma": ("q_proj", "v_proj"), "gemma2": ("q_proj", "v_proj"),
    "gemma3_text": ("q_proj", "v_proj"), "gpt2": ("c_attn",), "gpt_bigcode": ("c_attn",),
    "gpt_neo": ("q_proj", "v_proj"), "gpt_neox": ("query_key_value",), "gptj": ("q_proj", "v_proj"),
    "llama": ("q_proj", "v_proj"), "llama4": ("q_proj", "v_proj"), "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"), "mpt": ("Wqkv",), "nemotron_h": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "opt": ("q_proj", "v_proj"), "phi": ("q_proj", "v_proj", "fc1", "fc2"), "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"), "stablelm": ("q_proj", "v_proj"),
}
# the model types whose default in that table is a pattern over module paths, not a list of names (gemma4: the
# language model's q_proj and v_proj, not the vision tower's): a probe adapts modules by name, so such a file is
# refused with that said, rather than measured with other adapters than peft would build
PEFT_DEFAULT_PATTERNS: dict[str, str] = {"gemma4": r".*language_model\..*\.(q_proj|v_proj)"}


def model_dtype(candidate: Candidate, workload: Workload) -> str:
    """dtype the model is built in.

    Full fine-tuning keeps fp32 master weights and lets the Trainer autocast (bf16/fp16 AMP), which
    is what ``bf16=True`` means in TrainingArguments. LoRA/QLoRA freeze the base, so it is held in
    the 16-bit type and only the adapters stay fp32 (peft's default).
    """
    if workload.mode in ("lora", "qlora") and candidate.precision in ("bf16", "fp16"):
        return "bfloat16" if candidate.precision == "bf16" else "float16"
    return "float32"



def model_kwargs(candidate: Candidate, workload: Workload) -> dict[str, Any]:
    """Keyword arguments for ``AutoModelForCausalLM.from_pretrained`` / ``from_config``."""
    return {"attn_implementation": candidate.attn, "dtype": model_dtype(candidate, workload)}



def quantization_config(candidate: Candidate, workload: Workload) -> dict[str, Any] | None:
    """BitsAndBytesConfig fields for QLoRA (4-bit NF4, double quantisation); None otherwise.

    ``quant_method`` is included so the dict also works where transformers accepts a plain dict.
    """
    if workload.mode != "qlora":
        return None
    compute = {"bf16": "bfloat16", "fp16": "float16"}.get(candidate.precision, "float32")
    return {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_compute_dtype": compute,
        "bnb_4bit_use_double_quant": True,
    }



def emitted_model_kwargs(candidate: Candidate, workload: Workload) -> dict[str, Any]:
    """``model_kwargs.json``: keyword arguments for ``AutoModelForCausalLM.from_pretrained``."""
    kw = model_kwargs(candidate, workload)
    qc = quantization_config(candidate, workload)
    if qc is not None:
        kw["quantization_config"] = qc
    return kw



def lora_config(
    workload: Workload, *, target_modules: list[str] | str | None = None
) -> dict[str, Any] | None:
    """``lora_config.json``: keyword arguments for ``peft.LoraConfig`` (None for full fine-tuning)."""
    if workload.mode == "full":
        return None
    targets: list[str] | str = list(workload.lora_targets) if target_modules is None else target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"  # peft's keyword is the string; a list would name a module "all-linear"
    return {
        "r": workload.lora_r,
        "lora_alpha": workload.lora_alpha,
        "lora_dropout": LORA_DROPOUT,
        "target_modules": targets,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }



def lora_target_modules(leaf_names: set[str], requested: tuple[str, ...] | list[str]) -> list[str] | str:
    """The requested LoRA targets present in the model, or ``"all-linear"`` when none are.

    GPT-2 names its projections ``c_attn``/``c_proj``, so the Llama-style default
    ``q_proj,k_proj,v_proj,o_proj`` matches nothing there; peft's ``all-linear`` is the fallback.
    """
    present = [t for t in requested if t in leaf_names]
    return present if present else "all-linear"
