"""``autotune run``'s time: the time to answer and the time budget (one probe's time and deadline are
``autotune.estimate.probe_time``'s).

Run by ``tune`` before anything is written (``plan_search``):

* :func:`parse_probe_timeout`: ``--probe-timeout`` is ``predicted`` (the default: each probe's deadline
  from its prediction, ``autotune.estimate.DeadlineRule``) or fixed seconds (``300``, ``10m``);
* :func:`forecast`: the time to answer, probes x predicted probe time / parallel slots, over the
  probes a run makes (the search's ``--max-trials``, or fewer when the space holds fewer distinct
  configurations, plus the confirmation's rounds over the top-k and the baseline);
* :func:`check_time_budget`: with ``--time-budget``, how many probes it buys; SpecError (exit 2,
  one line) when not even the baseline and one candidate fit; without one, SpecError when the predicted
  time to answer is over ``MAX_UNBUDGETED_S`` (a day: ``--steps 1000000000`` is a typo, not a request).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import Any

from autotune.errors import SpecError
from autotune.search import confirmation_probes
from autotune.spec.parse import duration_text
from autotune.spec.probe_request import Candidate, ProbeSettings
from autotune.spec.shell import command_line
from autotune.spec.space import SearchSpace

__all__ = ["MAX_UNBUDGETED_S", "PREDICTED", "ProbeCount", "parse_probe_timeout", "forecast", "forecast_line", "check_time_budget"]

PREDICTED = "predicted"
# the longest predicted time to answer a run starts without --time-budget (a longer one is refused)
MAX_UNBUDGETED_S = 24 * 3600.0
# configurations of the space whose predictions give the typical probe time (a seeded uniform sample)
_SAMPLE = 300


def parse_probe_timeout(value: Any) -> float | None:
    """``predicted`` -> None (the predicted rule); seconds or a duration (``90s``, ``10m``) -> seconds."""
    if value is None or (isinstance(value, str) and value.strip().lower() == PREDICTED):
        return None
    if isinstance(value, bool):
        raise SpecError(f"probe timeout must be 'predicted' or positive seconds; got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        from autotune.spec.parse import parse_duration

        try:
            seconds = float(value)
        except ValueError:
            try:
                parsed = parse_duration(value)
            except SpecError:
                raise SpecError(f"probe timeout must be 'predicted' or positive seconds (300, 10m); got {value!r}") \
                    from None
            seconds = float(parsed) if parsed is not None else 0.0
    if not math.isfinite(seconds) or seconds <= 0:
        raise SpecError(f"probe timeout must be 'predicted' or positive seconds (300, 10m); got {value!r}")
    return seconds


def _candidates(space: SearchSpace, effective_batch: int, max_world: int | None, n: int = _SAMPLE) -> list[Candidate]:
    """Up to ``n`` distinct runnable candidates of the space, drawn uniformly (seeded: the same each time)."""
    from autotune.search import candidate_from_choice, candidate_id, usable_micro_batches, usable_worlds
    from autotune.spec.space import DIMENSIONS

    worlds, _ = usable_worlds(space, max_world)
    mbs, _ = usable_micro_batches(space, effective_batch, worlds)
    if not worlds or not mbs:
        return []
    lists = {d: mbs if d == "micro_batch" else worlds if d == "gpus_per_trial" else list(space.choices(d))
             for d in DIMENSIONS}
    rng = random.Random(0)
    seen: dict[str, Candidate] = {}
    for _ in range(n * 5):
        c = candidate_from_choice({d: rng.choice(v) for d, v in lists.items()}, effective_batch=effective_batch)
        if isinstance(c, Candidate):
            seen.setdefault(candidate_id(c), c)
            if len(seen) >= n:
                break
    return list(seen.values())


@dataclasses.dataclass(frozen=True)
class ProbeCount:
    """How many probes a run makes and how many run at once: the search's (``max_trials``, fewer when the
    space has only ``distinct`` configurations), then the confirmation's (the top-k and the baseline,
    ``confirm_rounds`` rounds (``ConfirmPolicy.rounds_for(top_k)``) of ``confirm_steps`` timed steps)."""

    max_trials: int
    top_k: int
    confirm_rounds: int
    confirm_steps: int
    baseline: Candidate | None
    slots: int
    distinct: int | None = None


def forecast(
    predictor: Any, *, space: SearchSpace, settings: ProbeSettings, effective_batch: int, max_world: int | None,
    count: ProbeCount, fits: Any = None,
) -> dict[str, Any]:
    """The predicted time to answer (seconds; None where nothing can be predicted) and how it was counted.

    The typical probe is the median prediction over a seeded sample of the space's configurations,
    those the memory model puts within the budget (``fits``) when any are, since a configuration that
    does not fit stops at its out-of-memory error long before its window ends.
    """
    cands = _candidates(space, effective_batch, max_world)
    fitting: list[Candidate] | None = None
    if fits is not None:
        fitting = [c for c in cands if fits(c)]
        cands = fitting or cands
    confirm_settings = dataclasses.replace(settings, steps=count.confirm_steps)
    max_trials, distinct, top_k, baseline, slots = count.max_trials, count.distinct, count.top_k, count.baseline, count.slots
    preds = [p for p in (predictor(c, settings) for c in cands) if p] if predictor else []
    confirm_preds = [p for p in (predictor(c, confirm_settings) for c in cands) if p] if predictor else []
    search_probes = min(max_trials, distinct) if distinct else max_trials
    confirm_probes = confirmation_probes(top_k, baseline is not None, count.confirm_rounds, search_probes=search_probes)
    out: dict[str, Any] = {"search_probes": search_probes, "confirm_probes": confirm_probes, "slots": slots,
                           "probe_s": None, "min_probe_s": None, "confirm_probe_s": None, "baseline_probe_s": None,
                           "time_to_answer_s": None, "sampled": len(cands),
                           # of those, the memory model's fitting ones (0: every probe stops at its out-of-memory
                           # error or is pruned, long before its predicted time; None: not judged)
                           "fitting": None if fitting is None else len(fitting)}
    if not preds:
        return out
    typical = statistics.median(preds)
    typical_confirm = statistics.median(confirm_preds) if confirm_preds else typical
    base = predictor(baseline, settings) if predictor and baseline is not None else None
    out.update(probe_s=round(typical, 1), min_probe_s=round(min(preds), 1), confirm_probe_s=round(typical_confirm, 1),
               baseline_probe_s=round(base, 1) if base else None,
               time_to_answer_s=round((search_probes * typical + confirm_probes * typical_confirm) / max(1, slots), 1))
    return out




def forecast_line(fc: dict[str, Any], done: int = 0) -> str:
    """The line ``autotune run`` prints before the search; ``done``: search probes a resumed run already has
    (the time left counts only the rest, and the whole confirmation, which a resumed run measures afresh)."""
    if fc.get("time_to_answer_s") is None:
        return ("predicted time to answer: unknown (the estimator cannot price this model or GPU); each probe "
                f"gets the fixed deadline of {fc.get('deadline_text', '')}")
    slots = fc["slots"]
    left = max(0, fc["search_probes"] - done)
    seconds = fc["time_to_answer_s"]
    if done:
        seconds = (left * fc["probe_s"] + fc["confirm_probes"] * (fc.get("confirm_probe_s") or fc["probe_s"])) \
            / max(1, slots)
    bound = "at most " if fc.get("stops_early") else ""
    upto = "up to " if fc.get("stops_early") else ""
    head = (f"predicted time left: {bound}~{duration_text(seconds)} ({done} of {upto}{fc['search_probes']} search probes "
            f"done; {upto}{left} search" if done else
            f"predicted time to answer: {bound}~{duration_text(seconds)} ({upto}{left} search")
    text = (f"{head} + {fc['confirm_probes']} confirmation probes x ~{duration_text(fc['probe_s'])} each"
            + (f" / {slots} at a time" if slots > 1 else "") + ")")
    if fc.get("stops_early"):
        text += "; the search stops sooner once no unprobed configuration can change the answer"
    if fc.get("probes_in_budget") is not None:
        text += f"; the --time-budget buys about {fc['probes_in_budget']} probe(s)"
    return text


def _bounded_answer_s(fc: dict[str, Any], probe_timeout_s: float | None) -> tuple[float | None, bool]:
    """(the predicted time to answer, or None where it says nothing; whether it is only the fastest
    single probe). Where the memory model puts no configuration within the budget, most probes stop at
    their out-of-memory error, but one it misjudges runs its whole window: the fastest configuration's
    single probe is then the bound. A fixed ``--probe-timeout`` bounds each probe."""
    t = fc.get("time_to_answer_s")
    if t is None:
        return None, False
    one_probe = fc.get("fitting") == 0
    if one_probe:
        t = fc.get("min_probe_s")
        if t is None:
            return None, True
    probes = 1 if one_probe else int(fc.get("search_probes") or 0) + int(fc.get("confirm_probes") or 0)
    if probe_timeout_s is not None:
        t = min(float(t), probes * probe_timeout_s / (1 if one_probe else max(1, int(fc.get("slots") or 1))))
    return float(t), one_probe


def check_time_budget(fc: dict[str, Any], *, time_budget_s: float | None, time_budget_text: Any, steps: int,
                      model_ref: str, max_trials: int | None = None, probe_timeout_s: float | None = None) -> None:
    """Adds ``probes_in_budget``; SpecError (one line) when the budget cannot hold the baseline and one
    candidate, or, without a budget, when the predicted time to answer is over ``MAX_UNBUDGETED_S``
    (``probe_timeout_s``: a fixed ``--probe-timeout``, which bounds each probe)."""
    answer_s, one_probe = _bounded_answer_s(fc, probe_timeout_s)
    if time_budget_s is None and answer_s is not None and answer_s > MAX_UNBUDGETED_S:
        bounded = probe_timeout_s is not None and answer_s < (fc["min_probe_s"] if one_probe else fc["time_to_answer_s"])
        each = (f"of at most {duration_text(probe_timeout_s)} each (--probe-timeout)" if bounded
                else f"x ~{duration_text(fc['probe_s'])} each")
        what = (f"even its fastest configuration's one probe is predicted to take ~{duration_text(answer_s)} "
                f"(the memory model fits none in the budget, but a probe it misjudges runs its whole window)"
                if one_probe else
                f"this run is predicted to take ~{duration_text(answer_s)} to answer "
                f"({fc['search_probes']} search + {fc['confirm_probes']} confirmation probes {each})")
        raise SpecError(
            f"{what}, more than the {duration_text(MAX_UNBUDGETED_S)} autotune "
            f"starts without a --time-budget: give a smaller --steps than {steps}"
            + (f", fewer --max-trials than {max_trials}" if max_trials and not one_probe else "")
            + ", or a --time-budget to stop the search at (e.g. --time-budget 8h); "
            f"`{command_line('autotune', 'plan', '--model', model_ref)}` shows what one step costs")
    if time_budget_s is None or fc.get("probe_s") is None:
        return
    slots = max(1, int(fc["slots"]))
    typical = float(fc["probe_s"])
    base = float(fc.get("baseline_probe_s") or typical)
    fc["probes_in_budget"] = int(time_budget_s * slots // typical)
    needed = base + typical if slots == 1 else max(base, typical)
    if time_budget_s < needed:
        raise SpecError(
            f"--time-budget {time_budget_text} cannot hold even the HF-default baseline and one candidate (one probe "
            f"is predicted to take ~{duration_text(typical)}, {duration_text(needed)} for the two"
            + (f" on {slots} slots" if slots > 1 else "") + f"): give a smaller --steps than {steps}, more GPUs "
            f"(--gpus, --ray-address), a larger --time-budget, or see the estimate with "
            f"`{command_line('autotune', 'plan', '--model', model_ref)}`")
