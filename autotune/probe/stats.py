"""Summaries of a timed window.  [pure]"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["percentile", "per_step_counts", "summarize_window"]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    s = sorted(values)
    if len(s) == 1:
        return float(s[0])
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def summarize_window(
    step_times: Sequence[float],
    real_tokens: Sequence[int],
    samples: Sequence[int],
    data_wait: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Throughput over the timed window: real tokens (never padding) per second of wall time.

    Throughput is total tokens / total time, so a slow outlier step counts with its real weight;
    the median step time and the p10-p90 spread say how steady the window was.
    """
    if not step_times:
        raise ValueError("no timed steps")
    if len(real_tokens) != len(step_times) or len(samples) != len(step_times):
        raise ValueError("step_times, real_tokens and samples must have one entry per timed step")
    total_t = float(sum(step_times))
    median = float(statistics.median(step_times))
    p10, p90 = percentile(step_times, 10), percentile(step_times, 90)
    out: dict[str, Any] = {
        "tokens_per_s": sum(real_tokens) / total_t if total_t > 0 else None,
        "samples_per_s": sum(samples) / total_t if total_t > 0 else None,
        "step_time_median_s": median,
        "step_time_p10_s": p10,
        "step_time_p90_s": p90,
        "step_time_spread": (p90 - p10) / median if median > 0 else None,
        "step_times_s": [float(t) for t in step_times],
        "timed_steps": len(step_times),
        "window_s": total_t,
        "real_tokens": int(sum(real_tokens)),
    }
    if data_wait is not None and len(data_wait) == len(step_times) and total_t > 0:
        out["data_wait_s"] = float(sum(data_wait))
        out["data_wait_fraction"] = float(sum(data_wait)) / total_t
    return out


def per_step_counts(sequences: Sequence[int], real_tokens: Sequence[int]) -> dict[str, Any]:
    """What each optimizer step of the timed window held: sequences (mean/min/max), real tokens (mean).

    The per-step lists are kept too (``step_sequences``, ``step_real_tokens``), so the ranks of a
    distributed probe can be added step by step.
    """
    if not sequences or len(sequences) != len(real_tokens):
        return {}
    n = len(sequences)
    return {
        "step_sequences": [int(x) for x in sequences],
        "step_real_tokens": [int(x) for x in real_tokens],
        "sequences_per_step_mean": sum(sequences) / n,
        "sequences_per_step_min": int(min(sequences)),
        "sequences_per_step_max": int(max(sequences)),
        "tokens_per_step_mean": sum(real_tokens) / n,
    }
