"""Composing an optimizer step at the true accumulation from a short probe's components.  [pure]

A composing probe (``autotune.spec.probe_window``) runs its Trainer at ``a`` micro-batches per
optimizer step and times, for every timed step ``j``:

- ``T_j``, the whole step (from the end of the previous step to the end of this one, synchronised),
- ``F_j``, the time spent fetching its ``a`` micro-batches (the data loader's wait),
- ``m_j[i]``, each micro-step's forward + backward (``training_step``).

A non-boundary micro-step costs ``n = F_j / a + m_j[i]`` (``i < a - 1``: no gradient sync); the
boundary is the rest of the step, ``b_j = T_j - sum(n)``: the last micro-step with its gradient
all-reduce / reduce-scatter, clipping, the optimizer step and ``zero_grad``. The step at the true
accumulation ``A`` is ``T_j(A) = (A - 1) * mean(n_j) + b_j``, holding ``A / a`` times the step's
real tokens and sequences.

With variable-length batches a micro-step's cost follows its token slots (rows x padded length),
and the one non-boundary micro-step of a step may happen to be shorter or longer than the step's
average: ``n`` is then scaled by the step's mean slots per micro-batch over that micro-step's own
slots (``micro_slots``), so the ``A - 1`` micro-steps are priced at the step's average batch, the
one the tokens are counted at. With fixed lengths the factor is 1. The boundary is kept as it
ran (it holds the gradient sync, which does not scale with the batch): its own batch is 1 of ``A``. Everything downstream (tokens/s = tokens / time over the window, the
ranks' merge) reads these composed steps as it read whole ones.

The estimate's noise is the jackknife (leave one timed step out) relative standard error of
tokens/s; the adaptive window stops once it is small, and a result above ``NOISY_REL_ERROR`` is
flagged as too noisy to combine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.probe.stats import percentile

__all__ = ["ComposedWindow", "compose_window", "jackknife_rel_error"]


def jackknife_rel_error(tokens: Sequence[float], times: Sequence[float]) -> float | None:
    """Relative standard error of ``sum(tokens) / sum(times)`` by leaving one step out (None under 2)."""
    n = len(times)
    if n < 2 or len(tokens) != n:
        return None
    total_t, total_k = float(sum(times)), float(sum(tokens))
    if total_t <= 0 or total_k <= 0:
        return None
    full = total_k / total_t
    loo = []
    for k, t in zip(tokens, times, strict=True):
        rest_t = total_t - t
        if rest_t <= 0:
            return None
        loo.append((total_k - k) / rest_t)
    mean = sum(loo) / n
    var = (n - 1) / n * sum((x - mean) ** 2 for x in loo)
    return math.sqrt(var) / full


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    med = float(statistics.median(values))
    p10, p90 = percentile(values, 10), percentile(values, 90)
    return {"median_s": med, "p10_s": p10, "p90_s": p90, "spread": (p90 - p10) / med if med > 0 else None}


@dataclass(frozen=True)
class ComposedWindow:
    """The timed window at the true accumulation, step by step, and the components it came from."""

    step_times: list[float]
    tokens: list[int]
    sequences: list[int]
    fetch_wait: list[float]
    slots: list[int]
    info: dict[str, Any]


def compose_window(
    *,
    step_times: Sequence[float],
    fetch_wait: Sequence[float],
    micro_times: Sequence[Sequence[float]],
    tokens: Sequence[int],
    sequences: Sequence[int],
    slots: Sequence[int],
    probe_accum: int,
    true_accum: int,
    micro_slots: Sequence[Sequence[int]] | None = None,
) -> ComposedWindow:
    """Compose each timed step at ``true_accum`` (see the module doc).

    ``micro_times[j]`` holds step ``j``'s ``probe_accum`` micro-step durations. Raises ValueError
    for inconsistent input (a step without its micro-steps, ``probe_accum`` < 2).
    """
    n = len(step_times)
    if probe_accum < 2:
        raise ValueError("composition needs at least 2 micro-batches per probe step")
    if not n or any(len(x) != n for x in (fetch_wait, micro_times, tokens, sequences, slots)):
        raise ValueError("every timed step needs its fetch time, micro-step times and counts")
    scale = true_accum / probe_accum
    nb_all: list[float] = []
    bounds: list[float] = []
    out_t: list[float] = []
    slot_rows = list(micro_slots) if micro_slots is not None else [None] * n
    if len(slot_rows) != n:
        raise ValueError("micro_slots needs one entry per timed step")
    scaled_any = False
    for t, f, micro, ms in zip(step_times, fetch_wait, micro_times, slot_rows, strict=True):
        if len(micro) != probe_accum:
            raise ValueError(f"a probe step ran {len(micro)} micro-steps, expected {probe_accum}")
        nb = [f / probe_accum + m for m in micro[:-1]]
        b = t - sum(nb)
        nb_all.extend(nb)
        bounds.append(b)
        nb_priced = nb
        if ms is not None and len(ms) == probe_accum and all(x > 0 for x in ms):
            mean_slots = sum(ms) / probe_accum
            nb_priced = [x * mean_slots / s for x, s in zip(nb, ms[:-1], strict=False)]
            scaled_any = scaled_any or any(s != mean_slots for s in ms)
        out_t.append((true_accum - 1) * (sum(nb_priced) / len(nb_priced)) + b)
    out_k = [round(k * scale) for k in tokens]
    rel = jackknife_rel_error(out_k, out_t)
    measured_t = float(sum(step_times))
    info: dict[str, Any] = {
        "rule": "T(A) = (A - 1) x non-boundary micro-step + boundary (last micro-step, gradient sync, optimizer step)",
        "probe_grad_accum": probe_accum,
        "grad_accum": true_accum,
        "timed_micro_batches": n * probe_accum,
        "micro_step": _spread(nb_all),
        "boundary": _spread(bounds),
        # the boundary's cost beyond a micro-step: gradient sync + clipping + optimizer step
        "boundary_extra_s": float(statistics.median(bounds)) - float(statistics.median(nb_all)),
        "measured_step_median_s": float(statistics.median(step_times)),
        "measured_tokens_per_s": float(sum(tokens)) / measured_t if measured_t > 0 else None,
        "rel_std_error": rel,
        "priced_at_mean_slots": scaled_any,
    }
    return ComposedWindow(
        step_times=out_t,
        tokens=out_k,
        sequences=[round(s * scale) for s in sequences],
        fetch_wait=[f * scale for f in fetch_wait],
        slots=[round(s * scale) for s in slots],
        info=info,
    )
