"""Each probe's deadline, from its predicted duration, corrected by what the run's probes took.  [pure]

The rule (``DeadlineRule``), per probe:

    corrected = predicted x correction
    deadline  = max(floor, DEADLINE_MARGIN x corrected)
    floor     = DEADLINE_FLOOR_S on a GPU, CPU_DEADLINE_FLOOR_S on a CPU

``predicted`` is :func:`autotune.estimate.probe_time.predict_probe_time`'s total (set-up + the
probe window). ``correction`` is 1 until a probe of this run has finished, then the median over
the run's finished probes (status ok or over_budget: they ran their whole window) of
``measured wall seconds / predicted seconds``. A probe the estimator cannot predict (unknown
architecture or GPU) gets ``UNPREDICTED_S`` x correction-free, i.e. the fixed deadline.
``--probe-timeout SECONDS`` replaces the rule by that fixed deadline for every probe.

A probe stopped at its deadline gets a reason that says it was far slower than predicted, with
both figures.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings
from autotune.spec.result import ProbeResult

__all__ = [
    "CPU_DEADLINE_FLOOR_S",
    "DEADLINE_FLOOR_S",
    "DEADLINE_MARGIN",
    "UNPREDICTED_S",
    "DeadlineRule",
    "Deadlines",
    "Predictor",
]

# x the corrected prediction: room for a slower load, a cold cache, a planner constant that is off
DEADLINE_MARGIN = 3.0
# no GPU probe gets less: the fixed set-up (imports, the CUDA context) varies most with machine load
DEADLINE_FLOOR_S = 120.0
# no CPU probe gets less (the deadline every probe had before): a CPU probe shares its cores with
# whatever else runs, and on this project's 2-core machine at load average 10 a tiny-llama probe
# predicted at 15 s was still running at 180 s
CPU_DEADLINE_FLOOR_S = 300.0
# the deadline of a probe the estimator cannot predict (what every probe had before)
UNPREDICTED_S = 300.0
# statuses whose wall time is a whole window (an oom or crash stops early, a timeout is censored)
_COUNTED = ("ok", "over_budget")

# predictor(candidate, settings) -> predicted seconds of that probe, or None
Predictor = Callable[[Candidate, ProbeSettings], "float | None"]


@dataclass(frozen=True)
class DeadlineRule:
    """How deadlines are set: ``fixed_s`` (``--probe-timeout SECONDS``) or the predicted rule."""

    fixed_s: float | None = None
    margin: float = DEADLINE_MARGIN
    floor_s: float = DEADLINE_FLOOR_S
    unpredicted_s: float = UNPREDICTED_S

    @classmethod
    def for_device(cls, device: str, fixed_s: float | None = None) -> DeadlineRule:
        """The rule for probes on ``device`` (``cpu`` or ``cuda``): its floor."""
        return cls(fixed_s=fixed_s, floor_s=CPU_DEADLINE_FLOOR_S if device == "cpu" else DEADLINE_FLOOR_S)

    def describe(self) -> dict[str, Any]:
        """What the cache key and summary.json hold: the rule, never a probe's seconds."""
        if self.fixed_s is not None:
            return {"kind": "fixed", "seconds": float(self.fixed_s)}
        return {"kind": "predicted", "margin": self.margin, "floor_s": self.floor_s,
                "unpredicted_s": self.unpredicted_s,
                "correction": "median of measured/predicted wall over the run's finished (ok, over_budget) probes"}

    def text(self) -> str:
        if self.fixed_s is not None:
            return f"fixed {self.fixed_s:g} s per probe (--probe-timeout)"
        return (f"{self.margin:g} x the predicted probe time (corrected by this run's probes), at least "
                f"{self.floor_s:g} s")


@dataclass
class Deadlines:
    """Deadlines for one run: ``apply`` sets a request's ``timeout_s``, ``landed`` learns from results."""

    rule: DeadlineRule
    predictor: Predictor | None = None
    ratios: list[float] = field(default_factory=list)
    # ticket -> (predicted s or None, deadline s)
    _issued: dict[str, tuple[float | None, float]] = field(default_factory=dict)
    _predictions: list[float] = field(default_factory=list)

    def correction(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 1.0

    def predict(self, candidate: Candidate, settings: ProbeSettings) -> float | None:
        if self.predictor is None:
            return None
        try:
            p = self.predictor(candidate, settings)
        except Exception:  # a prediction must never stop a search
            return None
        return float(p) if p is not None and p > 0 else None

    def deadline(self, candidate: Candidate, settings: ProbeSettings) -> tuple[float | None, float]:
        """(predicted seconds or None, deadline seconds) of a probe submitted now."""
        predicted = self.predict(candidate, settings)
        if self.rule.fixed_s is not None:
            return predicted, float(self.rule.fixed_s)
        if predicted is None:
            return None, float(self.rule.unpredicted_s)
        return predicted, max(self.rule.floor_s, self.rule.margin * predicted * self.correction())

    def apply(self, request: ProbeRequest) -> tuple[ProbeRequest, float | None, float]:
        """``request`` with its deadline as ``settings.timeout_s``; (request, predicted, deadline)."""
        predicted, deadline = self.deadline(request.candidate, request.settings)
        settings = dataclasses.replace(request.settings, timeout_s=round(deadline, 1))
        return dataclasses.replace(request, settings=settings), predicted, settings.timeout_s

    def issued(self, ticket: str, predicted: float | None, deadline: float) -> None:
        self._issued[ticket] = (predicted, deadline)
        if predicted is not None:
            self._predictions.append(predicted)

    def restore(self, results: list[dict[str, Any]]) -> None:
        """Seed the correction from a resumed run's recorded results (their ``predicted_s`` and wall)."""
        for r in results:
            m = r.get("metrics") or {}
            p, wall = m.get("predicted_s"), m.get("wall_s")
            if r.get("status") in _COUNTED and isinstance(p, (int, float)) and p > 0 \
                    and isinstance(wall, (int, float)) and wall > 0:
                self.ratios.append(float(wall) / float(p))

    def expected_s(self) -> float | None:
        """A typical probe's seconds, corrected: the median prediction issued so far x the correction."""
        return statistics.median(self._predictions) * self.correction() if self._predictions else None

    def landed(self, ticket: str, result: ProbeResult) -> ProbeResult:
        """Learn from a finished probe; a timed-out one's reason says how far off the prediction was.

        The probe's prediction and deadline are written into its metrics (``predicted_s``,
        ``deadline_s``, ``deadline_correction``)."""
        predicted, deadline = self._issued.pop(ticket, (None, None))  # type: ignore[arg-type]
        if deadline is None:
            return result
        result.metrics = dict(result.metrics)
        result.metrics["deadline_s"] = deadline
        if predicted is not None:
            result.metrics["predicted_s"] = round(predicted, 1)
            result.metrics["deadline_correction"] = round(self.correction(), 3)
        wall = result.metrics.get("wall_s")
        if predicted is not None and result.status in _COUNTED and isinstance(wall, (int, float)) and wall > 0:
            self.ratios.append(float(wall) / predicted)
        if result.status == "timeout":
            if predicted is not None and self.rule.fixed_s is None:
                why = (f"far slower than predicted: predicted {predicted:,.0f} s"
                       + (f" (x{self.correction():.2f} from this run's earlier probes)" if self.ratios else "")
                       + f", deadline {deadline:,.0f} s ({self.rule.text()})")
            elif predicted is not None:
                why = f"past the --probe-timeout of {deadline:g} s (predicted {predicted:,.0f} s)"
            else:
                why = f"past the {deadline:g} s deadline (the estimator could not predict this probe)"
            result.reason = f"{why}; {result.reason}" if result.reason else why
        return result

    def summary(self) -> dict[str, Any]:
        """summary.json's ``deadlines``: the rule and what the run learned."""
        return {**self.rule.describe(), "correction_factor": round(self.correction(), 3),
                "probes_counted": len(self.ratios)}
