"""The searcher's pure rules: effective batch, params -> candidate, monotone inference, seeds.  [pure]

Nothing here knows about Optuna or executors; each rule is a small function tested directly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from autotune.spec.levers import LEVERS, inactive, rule_problems
from autotune.spec.probe_request import Candidate
from autotune.spec.space import DIMENSIONS, SearchSpace
from autotune.spec.trial import TrialRecord, candidate_id, candidate_label

__all__ = [
    "CONDITIONAL_KNOBS",
    "MEMORY_INFEASIBLE",
    "ORDERED_KNOBS",
    "FAILED",
    "Skip",
    "TrialRecord",
    "derive_grad_accum",
    "usable_micro_batches",
    "usable_worlds",
    "candidate_from_choice",
    "candidate_id",
    "candidate_label",
    "same_except_micro_batch",
    "infer_infeasible",
    "iter_choices",
    "runnable_candidates",
    "distinct_candidates",
    "expert_seeds",
    "constraint_value",
    "median",
    "relative_spread",
]

# Statuses that mean "does not fit": they order by micro-batch (memory grows with it).
MEMORY_INFEASIBLE = ("oom", "over_budget")
# Statuses that are genuine failures (told to Optuna as FAIL: the sampler learns nothing from them).
FAILED = ("timeout", "crash")
# Conditional knobs: they act only under another knob's values (offload and sharding only with a ZeRO stage);
# elsewhere the search holds them at their default.
CONDITIONAL_KNOBS = tuple(d for d, name in DIMENSIONS.items() if LEVERS[name].acts_under)


@dataclass(frozen=True)
class Skip:
    """A choice of knobs that is not probed, with the reason (recorded, never silently changed)."""

    reason: str
    key: str


# knobs whose choices are ordered (8 lies between 4 and 16): the Searcher may suggest them as an
# index, and the neighbourhood walk steps to the next value rather than to every other one
ORDERED_KNOBS = tuple(d for d, name in DIMENSIONS.items() if LEVERS[name].ordered)


def derive_grad_accum(effective_batch: int, micro_batch: int, world: int) -> int | None:
    """Accumulation steps that hold ``effective_batch`` = micro_batch x accum x world, or None.

    None when the product does not divide the effective batch: such a micro-batch is skipped and
    reported, never rounded (the effective batch would silently change).
    """
    per_step = micro_batch * world
    if per_step <= 0 or effective_batch % per_step != 0:
        return None
    return effective_batch // per_step


def usable_worlds(space: SearchSpace, max_world: int | None) -> tuple[list[int], list[str]]:
    """gpus_per_trial choices that the hardware can hold, and the reasons for the others."""
    keep, dropped = [], []
    for w in space.gpus_per_trial:
        if max_world is not None and w > max_world:
            dropped.append(f"gpus_per_trial {w} skipped: only {max_world} GPU(s) available")
        else:
            keep.append(w)
    return keep, dropped


def usable_micro_batches(
    space: SearchSpace, effective_batch: int, worlds: Iterable[int]
) -> tuple[list[int], list[str]]:
    """Micro-batches that divide the effective batch for at least one world, and skip reasons."""
    worlds = list(worlds)
    keep, dropped = [], []
    for mb in space.micro_batch:
        if any(derive_grad_accum(effective_batch, mb, w) is not None for w in worlds):
            keep.append(mb)
        else:
            dropped.append(
                f"micro_batch {mb} skipped: effective batch {effective_batch} is not a multiple of "
                f"{mb} x {'/'.join(map(str, worlds)) or '?'} GPU(s)"
                + (f" (it would give {_nearest_effective(effective_batch, mb, worlds)})" if worlds else "")
            )
    return keep, dropped


def _nearest_effective(effective_batch: int, mb: int, worlds: list[int]) -> str:
    w = worlds[0]
    accum = max(1, round(effective_batch / (mb * w)))
    return f"{mb} x {accum} x {w} = {mb * accum * w}"


def settled(c: Candidate) -> Candidate:
    """``c`` with every lever that does nothing in it held at its default (offload without ZeRO, the
    checkpointed share without checkpointing): one candidate, one id, for one measurement."""
    values = dataclasses.asdict(c)
    held = {d: LEVERS[d].default for d in CONDITIONAL_KNOBS if inactive(d, values) and values[d] != LEVERS[d].default}
    return dataclasses.replace(c, **held) if held else c


def candidate_from_choice(choice: dict[str, Any], *, effective_batch: int) -> Candidate | Skip:
    """Build the candidate for one choice of knobs (all DIMENSIONS present, or defaulted).

    Conditional knobs collapse: with zero_stage 0, offload is ``none`` and sharding the default.
    Combinations the lever rules (``autotune.spec.levers.RULES``) leave unsearched, and micro-batches that
    do not divide the effective batch, come back as a Skip with the reason.
    """
    c = dict(choice)
    world = int(c.pop("gpus_per_trial", 1))
    mb = int(c["micro_batch"])
    for d in CONDITIONAL_KNOBS:
        if inactive(d, c):
            c[d] = LEVERS[d].default
    key_text = json.dumps({**c, "world": world}, sort_keys=True, default=str)
    key = "skip-" + hashlib.sha1(key_text.encode()).hexdigest()[:12]
    accum = derive_grad_accum(effective_batch, mb, world)
    if accum is None:
        return Skip(
            f"effective batch {effective_batch} is not a multiple of micro_batch {mb} x {world} GPU(s)", key
        )
    broken = rule_problems(c, searched=True)
    if broken:
        return Skip(broken[0], key)
    fields = {f.name for f in dataclasses.fields(Candidate)}
    kwargs = {k: v for k, v in c.items() if k in fields}
    cand = Candidate(**{**kwargs, "grad_accum": accum, "world_size": world})
    problems = cand.problems()
    if problems:
        return Skip("; ".join(problems), key)
    return cand


def same_except_micro_batch(a: Candidate, b: Candidate) -> bool:
    """True when a and b differ at most in micro-batch (and the accumulation derived from it)."""
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    for k in ("micro_batch", "grad_accum"):
        da.pop(k)
        db.pop(k)
    return da == db


def infer_infeasible(candidate: Candidate, known: Iterable[TrialRecord]) -> TrialRecord | None:
    """The known record that proves ``candidate`` does not fit, without running it.

    Memory grows with the micro-batch, so a config that was OOM or over budget at micro-batch m
    stays so at any larger micro-batch with every other choice the same. Returns the record with
    the smallest such micro-batch, or None.
    """
    best: TrialRecord | None = None
    for r in known:
        if r.status not in MEMORY_INFEASIBLE or r.candidate is None or r.phase != "search":
            continue
        other = r.candidate_obj()
        assert other is not None
        if other.micro_batch < candidate.micro_batch and same_except_micro_batch(other, candidate):
            if best is None or other.micro_batch < (best.candidate or {}).get("micro_batch", 1 << 30):
                best = r
    return best


def iter_choices(space: SearchSpace, *, micro_batches: list[int], worlds: list[int]) -> Iterator[dict[str, Any]]:
    """Every raw combination of the space's choices (micro-batch and world already filtered)."""
    dims = list(DIMENSIONS)
    lists = [
        micro_batches if d == "micro_batch" else worlds if d == "gpus_per_trial" else list(space.choices(d))
        for d in dims
    ]
    for combo in itertools.product(*lists):
        yield dict(zip(dims, combo, strict=True))


def runnable_candidates(
    space: SearchSpace, *, effective_batch: int, micro_batches: list[int], worlds: list[int]
) -> Iterator[tuple[dict[str, Any], Candidate]]:
    """Every distinct runnable configuration of the space, with the first choice producing it, in the space's order."""
    seen: set[str] = set()
    for choice in iter_choices(space, micro_batches=micro_batches, worlds=worlds):
        c = candidate_from_choice(choice, effective_batch=effective_batch)
        if isinstance(c, Candidate) and candidate_id(c) not in seen:
            seen.add(candidate_id(c))
            yield choice, c


def distinct_candidates(
    space: SearchSpace, *, effective_batch: int, micro_batches: list[int], worlds: list[int], limit: int = 200_000
) -> int | None:
    """How many distinct runnable candidates the space holds (None when it is too large to count)."""
    if space.size() > limit:
        return None
    return sum(1 for _ in runnable_candidates(space, effective_batch=effective_batch, micro_batches=micro_batches,
                                               worlds=worlds))


def _prefer(choices: tuple[Any, ...] | list[Any], *order: Any) -> Any:
    for v in order:
        if v in choices:
            return v
    return choices[0]


def expert_seeds(
    space: SearchSpace,
    *,
    effective_batch: int,
    micro_batches: list[int],
    worlds: list[int],
    device: str,
    limit: int = 3,
    variable_lengths: bool = False,
) -> list[dict[str, Any]]:
    """Configurations an expert would try first, as full choices (every dimension).

    1. the largest micro-batch up to 8 without checkpointing, sdpa, bf16 on GPU (fp32 on CPU),
       fused AdamW, a couple of loader workers on GPU;
    2. the smallest micro-batch with checkpointing (the one most likely to fit: it tells early
       whether anything fits, and by how much not);
    3. the largest micro-batch with checkpointing (the fast config when activations dominate).

    With ``variable_lengths`` (a length distribution or a real dataset) the seeds pack sequences
    where the space offers it: padding is then the largest waste, and packing removes it.
    """
    if not micro_batches or not worlds:
        return []
    gpu = device == "cuda"
    base: dict[str, Any] = {
        "attn": _prefer(space.attn, "sdpa", "flash_attention_2", "eager"),
        "precision": _prefer(space.precision, *(("bf16", "fp16", "tf32", "fp32") if gpu else ("fp32", "tf32", "bf16"))),
        "optim": _prefer(space.optim, "adamw_torch_fused", "adamw_torch"),
        "workers": _prefer(space.workers, *((2, 4, 1, 0) if gpu else (0, 1))),
        "pin_memory": _prefer(space.pin_memory, gpu),
        "packing": _prefer(space.packing, *((True, False) if variable_lengths else (False,))),
        "torch_compile": _prefer(space.torch_compile, False),
        "liger": _prefer(space.liger, False),
        "zero_stage": min(space.zero_stage),
        "offload": _prefer(space.offload, "none"),
        "sharding": _prefer(space.sharding, "deepspeed"),
        "gpus_per_trial": max(worlds),
    }
    world = base["gpus_per_trial"]
    fitting = [mb for mb in micro_batches if derive_grad_accum(effective_batch, mb, world) is not None]
    if not fitting:
        world = next(
            w for w in sorted(worlds, reverse=True)
            if any(derive_grad_accum(effective_batch, mb, w) is not None for mb in micro_batches)
        )
        base["gpus_per_trial"] = world
        fitting = [mb for mb in micro_batches if derive_grad_accum(effective_batch, mb, world) is not None]
    upto8 = [mb for mb in fitting if mb <= 8] or fitting[:1]
    seeds = [
        {**base, "micro_batch": max(upto8), "grad_ckpt": _prefer(space.grad_ckpt, False)},
        {**base, "micro_batch": min(fitting), "grad_ckpt": _prefer(space.grad_ckpt, True)},
        {**base, "micro_batch": max(fitting), "grad_ckpt": _prefer(space.grad_ckpt, True)},
    ]
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for s in seeds:
        c = candidate_from_choice(s, effective_batch=effective_batch)
        if isinstance(c, Candidate) and candidate_id(c) not in seen:
            seen.add(candidate_id(c))
            out.append(s)
    return out[: max(0, limit)]


def constraint_value(status: str, peak: int | None, usable: int | None) -> float:
    """Optuna constraint (feasible when <= 0): relative excess of peak memory over the budget."""
    if status == "ok":
        if peak is not None and usable:
            return min(0.0, (peak - usable) / usable)
        return -1.0
    if peak is not None and usable:
        return max(1e-3, (peak - usable) / usable)
    return 1.0


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("median of nothing")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


def relative_spread(values: list[float]) -> float:
    """(max - min) / median; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    m = median(values)
    return (max(values) - min(values)) / m if m else 0.0
