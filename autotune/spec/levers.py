"""Every lever, declared once: its values, its default, the HF default, and what it needs.  [pure]

A lever is a knob of :class:`~autotune.spec.probe_request.Candidate` that the search may set (the search
space calls ``world_size`` ``gpus_per_trial``). What is declared here, and only here:

- ``LEVERS``: each lever's kind (int, bool or a name), its allowed values or minimum, autotune's default
  (the Candidate's), the HF default (what ``TrainingArguments`` and the model do untouched: the baseline a
  speed-up is quoted against), whether its values are ordered (8 lies between 4 and 16), and which other
  lever it only acts under (offload and the sharding backend act only with a ZeRO stage).
- ``RULES``: what one lever's value needs of another's (parameter offload needs ZeRO-3, ...), each with its
  reason, and whether a violation is invalid (no probe can run it) or only not searched (it runs, but is
  the same measurement as another choice).

Driven by it: the ``Candidate``'s fields and validation (``autotune.spec.probe_request``), the
``SearchSpace``'s fields, dimensions, value checks and contradictions (``autotune.spec.space``), a candidate's
short label (``spec.trial.candidate_label``, from each lever's ``label``), the search's skips
(``autotune.search``), the planner's pins (the ``planned`` levers) and ZeRO/offload lattice
(``autotune.estimate.plan``), and the ``probe`` and ``plan`` options with their help (``autotune/cli``, from
``cli_flags`` and ``help``). Each message about a lever's values or rules is worded here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Lever", "Rule", "LEVERS", "LABEL_ORDER", "RULES", "ADVICE", "ZERO_STAGES", "lever", "value_problem", "rule_problems",
           "space_problems",
           "inactive", "or_list",
           "choices_help"]


@dataclass(frozen=True)
class Lever:
    name: str
    kind: str  # "int", "bool" or "str"
    default: Any  # autotune's (the Candidate's)
    hf_default: Any  # TrainingArguments' and the model's, untouched (None: the HF stack has no such lever)
    values: tuple[Any, ...] = ()  # the allowed values of a "str" lever (or of a bounded "int" one)
    minimum: int | None = None  # an unbounded "int" lever's least value
    ordered: bool = False  # values lie in an order: the search steps to the next one
    acts_under: tuple[str, tuple[Any, ...]] | None = None  # (lever, values): it does anything only then
    help: str = ""
    # a lever added after candidates' ids were first stored: at its default it is left out of the id, so a
    # stored run, journal or recorded landscape keeps the ids it has (``spec.trial.candidate_id``)
    id_omits_default: bool = False
    # the planner prices it (a memory or speed term in ``autotune.estimate``): ``plan`` can pin it
    planned: bool = False
    # its piece of a candidate's short label (``spec.trial.candidate_label``; "" when it says nothing), None when
    # another lever's piece shows it (the accumulation in ``mb4x8``)
    label: Callable[[Any], str] | None = None
    # its command-line flags where not ``--name-with-dashes`` (a bool: ``--name/--no-name``)
    flags: tuple[str, ...] = ()

    def cli_flags(self) -> tuple[str, ...]:
        """The flags ``probe`` and ``plan`` take it by: ``--ckpt-every``, ``--grad-ckpt/--no-grad-ckpt``."""
        if self.flags:
            return self.flags
        dashed = "--" + self.name.replace("_", "-")
        return (f"{dashed}/--no-{dashed[2:]}",) if self.kind == "bool" else (dashed,)

    def allowed_text(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.values:
            return f"one of {', '.join(map(str, self.values))}" if self.kind == "str" else or_list(self.values)
        return f"an integer >= {self.minimum}"


def or_list(values: Iterable[Any]) -> str:
    """``3``, ``2 or 3``, ``1, 2 or 3``."""
    items = [str(v) for v in values]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


ZERO_STAGES = (0, 1, 2, 3)
_SHARDED = ("zero_stage", (1, 2, 3))

LEVERS: dict[str, Lever] = {lv.name: lv for lv in (
    Lever("micro_batch", "int", 1, 8, minimum=1, ordered=True, planned=True,
          label=lambda c: f"mb{c.micro_batch}x{c.grad_accum}" + (f"x{c.world_size}" if c.world_size > 1 else ""),
          help="sequences per device per forward pass (per_device_train_batch_size)"),
    Lever("grad_accum", "int", 1, 1, minimum=1, help="micro-batches per optimizer step (gradient_accumulation_steps; "
          "a search derives it from the effective batch)"),
    Lever("grad_ckpt", "bool", False, False, planned=True,
          label=lambda c: ("ckpt" + (f"/{c.ckpt_every}" if c.ckpt_every > 1 else "")) if c.grad_ckpt else "no-ckpt",
          help="recompute activations in the backward pass (activation checkpointing)"),
    # transformers >= 5.24 (activation_checkpointing_kwargs' every_n_layers): 1 checkpoints every decoder
    # layer; k checkpoints one layer in k, the others keep their activations: a dial between checkpointing
    # on and off that gives back speed for memory the full recompute leaves unused
    Lever("ckpt_every", "int", 1, 1, values=(1, 2, 4), ordered=True, acts_under=("grad_ckpt", (True,)),
          id_omits_default=True, planned=True, help="under checkpointing, recompute one decoder layer in every k"),
    Lever("attn", "str", "sdpa", "sdpa", values=("eager", "sdpa", "flash_attention_2", "flex_attention"),
          planned=True, label=lambda c: c.attn, help="attention kernel"),
    Lever("workers", "int", 0, 0, minimum=0, ordered=True, label=lambda c: f"w{c.workers}" + ("-pin" if c.pin_memory else ""),
          help="data-loader worker processes (dataloader_num_workers)"),
    Lever("pin_memory", "bool", True, True, help="page-locked host memory for batches (dataloader_pin_memory)"),
    Lever("precision", "str", "bf16", "fp32", values=("fp32", "bf16", "fp16", "tf32"), planned=True,
          label=lambda c: c.precision, help="compute precision"),
    Lever("packing", "bool", False, False, planned=True, label=lambda c: "pack" if c.packing else "",
          help="pack sequences into rows, each attending only to itself, instead of padding"),
    Lever("optim", "str", "adamw_torch", "adamw_torch_fused",
          values=("adamw_torch", "adamw_torch_fused", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit",
                  "adafactor", "sgd"), planned=True, label=lambda c: "" if c.optim == "adamw_torch" else c.optim,
          help="optimizer"),
    Lever("torch_compile", "bool", False, False, label=lambda c: "compile" if c.torch_compile else "",
          flags=("--compile/--no-compile",), help="torch.compile the model (TrainingArguments.torch_compile)"),
    Lever("liger", "bool", False, False, planned=True, label=lambda c: "liger" if c.liger else "",
          help="Liger's fused kernels (fused linear + cross-entropy; a GPU with liger-kernel installed)"),
    Lever("world_size", "int", 1, 1, minimum=1, ordered=True, planned=True, flags=("--world-size", "--gpus-per-trial"),
          help="GPUs one training run uses (data-parallel ranks; processes on cpu)"),
    Lever("zero_stage", "int", 0, 0, values=ZERO_STAGES, ordered=True, planned=True,
          label=lambda c: (("zero" if c.sharding == "deepspeed" else "fsdp") + str(c.zero_stage)) if c.zero_stage else "",
          help="ZeRO stage (0: DDP or one GPU)"),
    Lever("offload", "str", "none", "none", values=("none", "optimizer", "params"), acts_under=_SHARDED, planned=True,
          label=lambda c: f"offload-{c.offload}" if c.zero_stage and c.offload != "none" else "",
          help="CPU offload under ZeRO"),
    Lever("sharding", "str", "deepspeed", None, values=("deepspeed", "fsdp"), acts_under=_SHARDED,
          help="sharding backend (DeepSpeed ZeRO, or FSDP: full_shard for stage 3, shard_grad_op for 1-2)"),
)}
# a label's pieces in the order labels were first written (recorded runs and landscapes show them so); the
# pieces of levers not named here follow in the order they are declared above
LABEL_ORDER = ("micro_batch", "grad_ckpt", "attn", "precision", "packing", "workers")


# What to set a lever to when it holds training back, in TrainingArguments' keys: the one wording `check`
# (before a run, in the file's own keys via formats.translate) and `diagnose` (after a probe) both give.
ADVICE: dict[str, str] = {
    "micro_batch": "raise per_device_train_batch_size as far as memory allows and lower gradient_accumulation_steps to keep the effective batch",  # noqa: E501
    "workers": "dataloader_num_workers: 4-8 (up to the CPU cores per GPU)",
    "pin_memory": "dataloader_pin_memory: true",
    "attn": "attn_implementation: sdpa (or flash_attention_2 where installed and supported)",
}


@dataclass(frozen=True)
class Rule:
    """``lever`` = ``value`` needs ``other`` among ``allowed``, because ``why``. ``invalid``: no probe can
    run the combination (a Candidate problem); otherwise the search does not probe it (it measures the same
    as another choice, or has no twin in the backend) but a probe given it runs."""

    lever: str
    value: Any
    other: str
    allowed: tuple[Any, ...]
    why: str
    invalid: bool = True

    def broken_by(self, c: Mapping[str, Any]) -> bool:
        return c.get(self.lever, LEVERS[self.lever].default) == self.value and c.get(
            self.other, LEVERS[self.other].default) not in self.allowed

    def message(self) -> str:
        return f"{self.lever}={self.value} needs {self.other} {or_list(self.allowed)} ({self.why})"


RULES: tuple[Rule, ...] = (
    Rule("offload", "params", "zero_stage", (3,), "parameters are only sharded by ZeRO-3"),
    Rule("offload", "optimizer", "zero_stage", (1, 2, 3), "the optimizer states are offloaded from ZeRO's shards"),
    Rule("sharding", "fsdp", "zero_stage", (2, 3),
         "FSDP has no ZeRO-1 twin: it shards gradients and optimizer states, or everything", invalid=False),
    Rule("offload", "optimizer", "sharding", ("deepspeed",),
         "FSDP offloads parameters and optimizer states together: offload params covers it", invalid=False),
)


def lever(name: str) -> Lever:
    return LEVERS[name]


def value_problem(name: str, value: Any) -> str | None:
    """``name must be ...; got value`` when ``value`` is not one of the lever's values, else None."""
    lv = LEVERS[name]
    if lv.kind == "bool":
        ok = isinstance(value, bool)
    elif lv.kind == "int":
        ok = (not isinstance(value, bool) and isinstance(value, int)
              and (value in lv.values if lv.values else value >= (lv.minimum or 0)))
    else:
        ok = isinstance(value, str) and value in lv.values
    return None if ok else f"{name} must be {lv.allowed_text()}; got {value!r}"


def inactive(name: str, c: Mapping[str, Any]) -> bool:
    """The lever does nothing in ``c`` (offload without a ZeRO stage): the search holds it at its default."""
    under = LEVERS[name].acts_under
    return under is not None and c.get(under[0], LEVERS[under[0]].default) not in under[1]


def rule_problems(c: Mapping[str, Any], *, searched: bool = False, given_only: bool = False) -> list[str]:
    """The rules ``c`` (lever -> value; a missing lever is its default) breaks: the invalid ones, and with
    ``searched`` also those the search does not probe. A lever that does nothing in ``c`` is checked only by
    the invalid rules (offload=params without ZeRO is a problem; the FSDP backend without ZeRO is plain DDP).
    ``given_only``: only rules whose two levers ``c`` both names (a planner's pins: the rest is chosen)."""
    out = []
    for rule in RULES:
        if not (rule.invalid or searched):
            continue
        if given_only and not (rule.lever in c and rule.other in c):
            continue
        if inactive(rule.lever, c) and not rule.invalid:
            continue
        if rule.broken_by(c):
            out.append(rule.message())
    return out


def space_problems(choices: Mapping[str, tuple[Any, ...]]) -> list[str]:
    """Contradictions among a search space's choices (lever -> its choices; a missing lever: its default):
    a value that no choice of the lever it acts under or depends on lets run."""
    def of(name: str) -> tuple[Any, ...]:
        return tuple(choices.get(name, (LEVERS[name].default,)))

    out = []
    for lv in LEVERS.values():
        if lv.acts_under is None or lv.name not in choices:
            continue
        other, needed = lv.acts_under
        moot = [v for v in of(lv.name) if v != lv.default]
        if moot and not any(z in needed for z in of(other)):
            out.append(f"{lv.name} {', '.join(map(repr, moot))} acts only with {other} {or_list(needed)} among "
                       f"the choices; {other} is {list(of(other))}")
    for rule in RULES:
        if rule.lever in choices and rule.value in of(rule.lever) and not any(
                w in rule.allowed for w in of(rule.other)):
            out.append(f"{rule.lever} {rule.value!r} needs {rule.other} {or_list(rule.allowed)} among the choices "
                       f"({rule.why}); {rule.other} is {list(of(rule.other))}")
    return out


def choices_help(name: str, *, pin: bool = False) -> str:
    """A CLI option's help for the lever: ``Attention kernel: eager | sdpa | ...``, each value with what it
    needs of another lever (``params (needs zero_stage 3)``)."""
    lv = LEVERS[name]
    shown = []
    for v in lv.values:
        needs = [f"{r.other} {or_list(r.allowed)}" for r in RULES if r.lever == name and r.value == v and r.invalid]
        shown.append(f"{v} (needs {'; '.join(needs)})" if needs else str(v))
    what = lv.help if "." in lv.help.split()[0] else lv.help[0].upper() + lv.help[1:]  # torch.compile stays so
    allowed = " | ".join(shown) if shown else lv.allowed_text()
    return f"{what}: {allowed}{' (pinned: not searched)' if pin else ''}."
