"""What one probe measures: the workload, the candidate configuration and the probe settings.  [pure]

These are plain frozen dataclasses that round-trip through JSON (``to_dict``/``from_dict``), because
they cross process boundaries (parent -> probe worker, Ray task, results store). ``validate()``
collects every problem into one SpecError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import SpecError
from autotune.spec.levers import LEVERS, rule_problems, value_problem

__all__ = [
    "FLATTEN_ATTN",
    "ATTN_CHOICES",
    "PRECISION_CHOICES",
    "MODE_CHOICES",
    "OPTIM_CHOICES",
    "OFFLOAD_CHOICES",
    "SHARDING_CHOICES",
    "DEVICE_CHOICES",
    "TRAINER_CHOICES",
    "WINDOW_CHOICES",
    "STATUSES",
    "Candidate",
    "Workload",
    "ProbeSettings",
    "ProbeRequest",
    "ALLOC_CONF_VARS",
    "CUDA_ALLOC_CONF_DEFAULT",
    "alloc_conf_env",
    "cuda_alloc_conf",
    "ATTN_TARGETS",
    "parse_lora_targets",
]

# the levers' values, as declared in autotune.spec.levers
ATTN_CHOICES: tuple[str, ...] = LEVERS["attn"].values
# attention implementations that take packed sequences flattened, padding-free, with position_ids
# only (no 4D mask): the probe's collator and the memory estimator both read this
FLATTEN_ATTN = ("flash_attention_2", "flex_attention")
PRECISION_CHOICES: tuple[str, ...] = LEVERS["precision"].values
MODE_CHOICES = ("full", "lora", "qlora")
OPTIM_CHOICES: tuple[str, ...] = LEVERS["optim"].values
OFFLOAD_CHOICES: tuple[str, ...] = LEVERS["offload"].values
SHARDING_CHOICES: tuple[str, ...] = LEVERS["sharding"].values
DEVICE_CHOICES = ("auto", "cuda", "cpu")
TRAINER_CHOICES = ("hf", "trl")
# "adaptive": the probe times components at a small accumulation, composes the true step and stops
# once the estimate is stable (autotune.spec.probe_window); "whole": ``warmup_steps`` + ``steps``
# whole optimizer steps at the candidate's own accumulation (a direct measurement; what a loss
# comparison needs, since it must train exactly the user's batches)
WINDOW_CHOICES = ("adaptive", "whole")
# ok: measured and fits; the others are information, not errors.
STATUSES = ("ok", "oom", "over_budget", "unsupported", "timeout", "crash")


def _check_choice(problems: list[str], name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        problems.append(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _check_int(problems: list[str], name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems.append(f"{name} must be an integer >= {minimum}; got {value!r}")


KIND_TYPES: dict[str, type] = {"int": int, "bool": bool, "str": str}


class _CandidateMethods:
    def problems(self) -> list[str]:
        values = dataclasses.asdict(self)  # type: ignore[call-overload]
        p = [m for name, v in values.items() if (m := value_problem(name, v))]
        return p or rule_problems(values)


# The knobs a search chooses: one field per lever, in the order ``autotune.spec.levers.LEVERS`` declares them,
# typed by the lever's kind and defaulting to autotune's default there (a lever declared is a field here).
Candidate = dataclasses.make_dataclass(
    "Candidate",
    [(name, KIND_TYPES[lv.kind], field(default=lv.default)) for name, lv in LEVERS.items()],
    bases=(_CandidateMethods,),
    frozen=True,
    namespace={"__doc__": "The knobs a search chooses, one field per lever (``autotune.spec.levers``, where each is "
                          "declared with its values, default and rules). Everything here ends up in the emitted "
                          "configs."},
)
Candidate.__module__ = __name__


# LoRA's default targets: the attention projections (what most recipes adapt)
ATTN_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def parse_lora_targets(text: str) -> tuple[str, ...]:
    """``attn`` (q/k/v/o), ``all-linear``, or a comma-separated list of module names; () if empty."""
    t = (text or "").strip()
    if t == "attn":
        return ATTN_TARGETS
    if t == "all-linear":
        return ("all-linear",)
    return tuple(x.strip() for x in t.split(",") if x.strip())


@dataclass(frozen=True)
class Workload:
    """What is being trained: the model, the sequences and the fine-tuning mode."""

    model: str
    model_path: str = ""  # directory holding config.json, filled in by model resolution
    seq_len: int = 512
    mode: str = "full"
    lengths: str = "fixed"  # "fixed", or a length histogram (see autotune.probe.data)
    dataset: str | None = None
    tokenizer: str | None = None
    lora_r: int = 16
    lora_alpha: int = 32
    lora_targets: tuple[str, ...] = ATTN_TARGETS
    trust_remote_code: bool = False
    seed: int = 42
    split: str | None = None  # the split of a DatasetDict directory or a cached Hub dataset
    trainer: str = "hf"  # "hf": transformers.Trainer; "trl": TRL's SFTTrainer (what train_sft.py runs)

    @property
    def variable_lengths(self) -> bool:
        """Sequences of varying length: a length distribution or a real dataset (packing has padding to remove). A
        distribution whose every length reaches ``seq_len`` is not one: each row is cut to ``seq_len``."""
        if self.dataset:
            return True
        if self.lengths == "fixed":
            return False
        from autotune.spec.lengths import length_bounds

        try:
            return length_bounds(str(self.lengths), int(self.seq_len))[0] < self.seq_len
        except SpecError:  # (varying, as far as anyone can tell; the spec's problem is reported where it is checked)
            return True

    def problems(self) -> list[str]:
        p: list[str] = []
        if not self.model:
            p.append("model must be given")
        _check_int(p, "seq_len", self.seq_len, 8)
        _check_choice(p, "mode", self.mode, MODE_CHOICES)
        _check_int(p, "lora_r", self.lora_r, 1)
        _check_choice(p, "trainer", self.trainer, TRAINER_CHOICES)
        return p


@dataclass(frozen=True)
class ProbeSettings:
    """How a probe measures: device, memory ceiling, window and timeout.

    ``steps`` is the most timed optimizer steps an adaptive window runs (it may stop after
    ``autotune.spec.probe_window.MIN_TIMED_STEPS``), and exactly what a ``whole`` window runs.
    """

    device: str = "auto"
    budget_bytes: int | None = None
    budget_text: str | None = None
    headroom: float = 0.05
    warmup_steps: int = 2
    steps: int = 5
    timeout_s: float = 300.0
    cpu_threads: int | None = None
    window: str = "adaptive"
    # PYTORCH_CUDA_ALLOC_CONF the probe process runs with (``cuda_alloc_conf``); None: the environment's as it is
    cuda_alloc_conf: str | None = None

    def problems(self) -> list[str]:
        p: list[str] = []
        _check_choice(p, "device", self.device, DEVICE_CHOICES)
        _check_choice(p, "window", self.window, WINDOW_CHOICES)
        _check_int(p, "warmup_steps", self.warmup_steps, 0)
        _check_int(p, "steps", self.steps, 1)
        if not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            p.append(f"timeout must be positive seconds; got {self.timeout_s!r}")
        if not isinstance(self.headroom, (int, float)) or not 0 <= self.headroom < 1:
            p.append(f"headroom must be in [0, 1); got {self.headroom!r}")
        if self.budget_bytes is not None and self.budget_bytes <= 0:
            p.append(f"gpu budget must be positive; got {self.budget_bytes!r} bytes")
        if self.cuda_alloc_conf is not None and (not isinstance(self.cuda_alloc_conf, str) or not self.cuda_alloc_conf
                                                 or not self.cuda_alloc_conf.isprintable()):
            p.append(f"the CUDA allocator setting ({'/'.join(ALLOC_CONF_VARS)}) must be printable and on one line; "
                     f"got {self.cuda_alloc_conf!r}: put the value on one line, or unset the variable")
        return p

    def usable_bytes(self) -> int | None:
        """The budget less the headroom: a probe's peak must stay at or under this."""
        if self.budget_bytes is None:
            return None
        return int(self.budget_bytes * (1.0 - self.headroom))


# The CUDA caching allocator's setting a GPU probe runs with, and the emitted scripts set, unless the user's
# environment sets one of ALLOC_CONF_VARS itself. With variable-length batches the default allocator caches
# blocks a longer batch cannot reuse: over a few hundred steps the reserve grows to 1.5-4.2x the live tensors
# (20 of 21 variable-length replays), or, on a card without that room, it frees and retries (stalled steps, and
# an out-of-memory error where the retry fails). A probe runs a few steps and does not see that growth.
# Expandable segments grow a freed block in place: the replays hold the reserve at 1.01-1.18x allocated whatever
# the lengths (``python benchmarks/allocator_replay.py --expandable benchmarks/results/allocator_replay-*.json``;
# docs/plan.md), so what the probe measures is what a long run holds.
CUDA_ALLOC_CONF_DEFAULT = "expandable_segments:True"
# where torch reads the allocator's setting, in the order it reads them: the first of these the environment holds
# decides, even an empty one (torch then runs the default allocator). The name torch has read since 1.x, ROCm's, and
# the accelerator-neutral one newer torch prefers (torch 2.13: ``torch._C._accelerator_getAllocatorSettings()``)
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def cuda_alloc_conf(device: str, environ: Mapping[str, str]) -> str | None:
    """The allocator setting a probe on ``device`` (the run's resolved cpu or cuda) and the scripts emitted from it
    run with (``ProbeSettings.cuda_alloc_conf``): the user's own, the first non-empty one of ``ALLOC_CONF_VARS`` in
    ``environ``, else ``CUDA_ALLOC_CONF_DEFAULT``; None on a CPU, where there is no CUDA allocator. An empty variable
    is not a setting: :func:`alloc_conf_env` sets the one torch reads first over it."""
    if device == "cpu":
        return None
    own = next((environ[v] for v in ALLOC_CONF_VARS if environ.get(v)), None)
    return own or CUDA_ALLOC_CONF_DEFAULT


def alloc_conf_env(conf: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """What a process started from ``environ`` must add so that torch reads ``conf``: nothing when ``conf`` is None
    or the variable torch reads first (the first of ``ALLOC_CONF_VARS`` that ``environ`` holds) has a value, the
    user's or a node's own, which is left as it is; otherwise (none held, or the first held is empty, which torch
    would read as the default allocator) ``PYTORCH_CUDA_ALLOC_CONF``, the name torch reads first. The emitted
    scripts apply the same rule to their own environment."""
    first = next((v for v in ALLOC_CONF_VARS if v in environ), None)
    if conf is None or (first is not None and environ[first]):
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": conf}


@dataclass(frozen=True)
class ProbeRequest:
    workload: Workload
    candidate: Candidate = field(default_factory=Candidate)
    settings: ProbeSettings = field(default_factory=ProbeSettings)

    def validate(self) -> ProbeRequest:
        problems = self.workload.problems() + self.candidate.problems() + self.settings.problems()
        if problems:
            raise SpecError(problems)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": dataclasses.asdict(self.workload),
            "candidate": dataclasses.asdict(self.candidate),
            "settings": dataclasses.asdict(self.settings),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeRequest:
        wl = dict(data["workload"])
        if "lora_targets" in wl:
            wl["lora_targets"] = tuple(wl["lora_targets"])
        return cls(
            workload=_build(Workload, wl, "workload"),
            candidate=_build(Candidate, data.get("candidate", {}), "candidate"),
            settings=_build(ProbeSettings, data.get("settings", {}), "settings"),
        )


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpecError(f"unknown {where} field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls(**data)
