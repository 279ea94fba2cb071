"""Which search-space choices can run here: a pure filter over a capability dict.  [pure]

``autotune run`` drops, before any probe, the choices the resolved device or installation cannot
run (fp16/tf32/flash_attention_2/Liger/8-bit optimizers on CPU, flash-attention below sm80 or
without flash-attn, ZeRO without deepspeed, ...), and lists each once with the reason. Without
this a CPU run of the ``default`` space spent most of its probes on configurations that came back
``unsupported``. The probe worker keeps its own check (``probe/worker.py``'s ``_precheck``) for
anything that reaches it another way (``autotune probe``, a remote cluster).

The capability dict (built by ``autotune.run.detect_capabilities``; any key may be absent,
and an absent or None entry means "unknown": no choice is dropped for it)::

    {"device": "cpu" | "cuda",
     "compute_capability": [8, 0] | None,      # the lowest of the GPUs in use
     "packages": {"flash_attn": bool, "bitsandbytes": bool, "liger_kernel": bool,
                  "deepspeed": bool, "triton": bool} | None,   # None: not known (a remote cluster)
     "cxx_compiler": bool | None,              # torch.compile's CPU backend builds C++
     "partial_ckpt": bool | None}              # the Trainer reads every_n_layers (transformers >= 5.24)

Dependent choices go with what they act under or need (``autotune.spec.levers``: offload without a ZeRO
stage left, the checkpointed share without checkpointing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.errors import SpecError
from autotune.spec.space import DIMENSIONS, SearchSpace

__all__ = ["LIGER_MODEL_TYPES", "DroppedChoice", "choice_problem", "liger_problem", "mode_problem", "filter_space", "drop_dependants", "dropped_line"]

_INSTALL = {
    "flash_attn": "pip install flash-attn",
    "bitsandbytes": "pip install bitsandbytes",
    "liger_kernel": "pip install liger-kernel",
    "deepspeed": "pip install 'autotune[deepspeed]'",
    "triton": "pip install triton",
}


# the model types Liger patches (liger-kernel 0.8.5, liger_kernel/transformers/monkey_patch.py,
# MODEL_TYPE_TO_APPLY_LIGER_FN); the Trainer's use_liger_kernel does nothing for any other (GPT-2, ...)
LIGER_MODEL_TYPES = frozenset({
    "deepseek_v2", "deepseek_v3", "deepseek_v4", "exaone4", "falcon_h1", "gemma", "gemma2", "gemma3", "gemma3_text",
    "gemma4", "gemma4_text", "glm4", "glm4v", "glm4v_moe", "gpt_oss", "granite", "hunyuan_v1_dense", "hunyuan_v1_moe",
    "internvl", "llama", "llama4", "llama4_text", "llava", "ministral", "mistral", "mixtral", "mllama",
    "mllama_text_model", "muse_glimmer", "nemotron", "olmo2", "olmo3", "paligemma", "phi3", "pixtral", "qwen2",
    "qwen2_5_vl", "qwen2_5_vl_text", "qwen2_vl", "qwen2_vl_text", "qwen3", "qwen3_5", "qwen3_5_moe",
    "qwen3_5_moe_text", "qwen3_5_text", "qwen3_moe", "qwen3_next", "qwen3_vl", "qwen3_vl_moe", "qwen3_vl_moe_text",
    "qwen3_vl_text", "smollm3", "smolvlm",
})


def liger_problem(model_type: str | None) -> str | None:
    """Why Liger's kernels would do nothing for this model type (None: Liger patches it, or it is not known)."""
    if not model_type or model_type in LIGER_MODEL_TYPES:
        return None
    return (f"Liger does not patch model_type {model_type!r} (liger-kernel patches Llama, Mistral, Qwen, Gemma, Phi-3 "
            "and other families): use_liger_kernel would change nothing")


@dataclass(frozen=True)
class DroppedChoice:
    """One choice of one knob that is not searched here, and why."""

    knob: str
    value: Any
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _installed(caps: Mapping[str, Any], package: str) -> bool | None:
    packages = caps.get("packages")
    if not isinstance(packages, Mapping) or package not in packages:
        return None
    return bool(packages[package])


def _sm(caps: Mapping[str, Any]) -> tuple[int, int] | None:
    cc = caps.get("compute_capability")
    if not cc:
        return None
    major, minor = (list(cc) + [0])[:2]
    return int(major), int(minor)


def _missing(caps: Mapping[str, Any], package: str, what: str) -> str | None:
    if _installed(caps, package) is False:
        return f"{what} needs the {package.replace('_', '-')} package, which is not installed: {_INSTALL[package]}"
    return None


def choice_problem(knob: str, value: Any, caps: Mapping[str, Any]) -> str | None:
    """Why ``knob = value`` cannot run with these capabilities, or None if it can (or if unknown)."""
    device = caps.get("device")
    sm = _sm(caps)
    cpu, cuda = device == "cpu", device == "cuda"
    sm_text = f"sm{sm[0]}{sm[1]}" if sm else ""
    if knob == "attn" and value == "flash_attention_2":
        if cpu:
            return "flash_attention_2 needs a CUDA GPU (sm80+); this run is on cpu"
        if cuda and sm is not None and sm < (8, 0):
            return f"flash_attention_2 needs an sm80+ GPU; this one is {sm_text}"
        return _missing(caps, "flash_attn", "flash_attention_2")
    if knob == "attn" and value == "flex_attention" and cpu:
        return "flex_attention has no backward pass on cpu in torch"
    if knob == "precision":
        if cpu and value == "fp16":
            return "fp16 mixed precision needs a GPU (the Trainer's fp16 AMP is CUDA-only)"
        if cpu and value == "tf32":
            return "tf32 is a CUDA matmul mode; fp32 is its cpu equivalent"
        if cuda and sm is not None and sm < (8, 0) and value in ("bf16", "tf32"):
            return f"{value} needs an sm80+ (Ampere or newer) GPU; this one is {sm_text}"
        return None
    if knob == "optim" and value == "adamw_8bit":
        if cpu:
            return "adamw_8bit (bitsandbytes) needs a CUDA GPU; this run is on cpu"
        return _missing(caps, "bitsandbytes", "adamw_8bit")
    if knob == "liger" and value is True:
        if cpu:
            return "Liger kernels are Triton GPU kernels; this run is on cpu"
        return liger_problem(caps.get("model_type")) or _missing(caps, "liger_kernel", "liger")
    if knob == "ckpt_every" and value != 1 and caps.get("partial_ckpt") is False:
        return (f"ckpt_every {value} (one checkpointed layer in {value}) needs a transformers whose Trainer reads "
                "activation_checkpointing_kwargs' every_n_layers (5.24 does): pip install -U transformers")
    if knob == "torch_compile" and value is True:
        if cpu and caps.get("cxx_compiler") is False:
            return "torch.compile on cpu builds C++ kernels and no C++ compiler (c++/g++/clang++) was found"
        if cuda:
            if sm is not None and sm < (7, 0):
                return f"torch.compile's Triton backend needs an sm70+ GPU; this one is {sm_text}"
            return _missing(caps, "triton", "torch.compile on a GPU")
        return None
    return None


def mode_problem(mode: str, caps: Mapping[str, Any]) -> str | None:
    """Why ``--mode`` cannot run here (QLoRA's 4-bit base is bitsandbytes, CUDA only), or None."""
    if mode != "qlora":
        return None
    if caps.get("device") == "cpu":
        return "--mode qlora quantizes the base with bitsandbytes, which needs a CUDA GPU; use --mode lora on cpu"
    if _installed(caps, "bitsandbytes") is False:
        return "--mode qlora needs the bitsandbytes package, which is not installed: pip install bitsandbytes"
    return None


def _sharded_problem(knob: str, value: Any, space: SearchSpace, caps: Mapping[str, Any]) -> str | None:
    """Without deepspeed: ZeRO stages go when FSDP is not among the sharding choices, else the
    ``deepspeed`` sharding choice goes (FSDP then stands in for it)."""
    if knob == "zero_stage" and value > 0 and "fsdp" not in space.sharding:
        return _missing(caps, "deepspeed", f"zero_stage {value} with sharding deepspeed")
    if knob == "sharding" and value == "deepspeed" and "fsdp" in space.sharding and any(
            z > 0 for z in space.zero_stage):
        return _missing(caps, "deepspeed", "sharding deepspeed")
    return None


def filter_space(
    space: SearchSpace, caps: Mapping[str, Any], *, mode: str = "full",
) -> tuple[SearchSpace, list[DroppedChoice]]:
    """The space without the choices that cannot run here, and what was dropped (knob order).

    Raises SpecError (one line) when a knob is left with no choice, or when ``mode`` cannot run.
    Dependent choices go with what they need: offload without any ZeRO stage left, FSDP sharding
    without any ZeRO stage left.
    """
    problem = mode_problem(mode, caps)
    if problem:
        raise SpecError(problem)
    dropped: list[DroppedChoice] = []
    kept: dict[str, Any] = {}
    for knob in DIMENSIONS:
        values = []
        for v in space.choices(knob):
            why = (_sharded_problem(knob, v, space, caps) if knob in ("zero_stage", "sharding")
                   else choice_problem(knob, v, caps))
            if why:
                dropped.append(DroppedChoice(knob, v, why))
            else:
                values.append(v)
        kept[knob] = tuple(values)
    dropped += drop_dependants(kept)
    empty = [k for k in DIMENSIONS if not kept[k]]
    if empty:
        reasons = "; ".join(f"{d.knob} {d.value}: {d.reason}" for d in dropped if d.knob in empty)
        raise SpecError(f"search space {space.name}: no choice of {', '.join(empty)} can run on "
                        f"{caps.get('device', 'this machine')} ({reasons}); give a space whose choices can "
                        f"(e.g. --space cpu on a CPU machine)")
    filtered = dataclasses.replace(space, **kept) if dropped else space
    return filtered, dropped


def drop_dependants(kept: dict[str, Any]) -> list[DroppedChoice]:
    """Drop from ``kept`` (dimension -> its choices left) every choice that what it acts under or needs no
    longer allows (``autotune.spec.levers``: offload params without ZeRO-3 left, a checkpointed share
    without checkpointing); returns what was dropped."""
    from autotune.spec.levers import LEVERS, RULES, or_list

    out: list[DroppedChoice] = []
    for knob, lever in DIMENSIONS.items():
        under = LEVERS[lever].acts_under
        if under is not None and not any(v in under[1] for v in kept.get(under[0], ())):
            for value in [v for v in kept[knob] if v != LEVERS[lever].default]:
                out.append(DroppedChoice(knob, value, f"{knob} {value} acts only with {under[0]} "
                                                      f"{or_list(under[1])}, which was dropped"))
            kept[knob] = (LEVERS[lever].default,)
    for rule in RULES:
        if rule.invalid and rule.value in kept.get(rule.lever, ()) and not any(
                v in rule.allowed for v in kept.get(rule.other, ())):
            kept[rule.lever] = tuple(v for v in kept[rule.lever] if v != rule.value)
            out.append(DroppedChoice(rule.lever, rule.value, f"{rule.lever} {rule.value} needs {rule.other} "
                                                             f"{or_list(rule.allowed)}, which was dropped"))
    return out


def dropped_line(dropped: list[DroppedChoice], device: str) -> str:
    """One progress line listing every dropped choice with its reason."""
    parts = [f"{d.knob}={str(d.value).lower() if isinstance(d.value, bool) else d.value} ({d.reason})"
             for d in dropped]
    return f"not searched on {device} here: " + "; ".join(parts)
