"""Every ``TrialRecord`` the search writes, or rebuilds from a study's trials, is built here.  [pure]

A record is one of: a probe's result (``measured``: a search probe, a re-measure, a confirmation),
an infeasibility concluded without running (``inferred``), a choice that cannot run (``skipped``),
or a finished trial of the study as the sampler's policy sees it (``observed``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.search._logic import Skip
from autotune.spec.probe_request import Candidate
from autotune.spec.result import ProbeResult
from autotune.spec.trial import TrialRecord, candidate_label

__all__ = ["measured", "inferred", "skipped", "observed", "choice_label"]


def measured(
    key: str, candidate: Candidate, params: dict[str, Any], result: ProbeResult, *, phase: str = "search",
    repeat: int = 0, origin: str = "", session: str = "", warnings: list[str] | None = None,
) -> TrialRecord:
    """A probe that ran: its result, figures and the label of its candidate."""
    return TrialRecord(
        key=key,
        status=result.status,
        candidate=dataclasses.asdict(candidate),
        params=params,
        reason=result.reason,
        phase=phase,
        repeat=repeat,
        result=result.to_dict(),
        tokens_per_s=result.tokens_per_s,
        peak_mem_bytes=result.peak_mem_bytes,
        step_time_spread=_float(result.metrics.get("step_time_spread")),
        wall_s=_float(result.metrics.get("wall_s")),
        label=candidate_label(candidate),
        origin=origin,
        session=session,
        warnings=list(warnings or []),
    )


def inferred(key: str, candidate: Candidate, params: dict[str, Any], *, status: str, reason: str,
             origin: str) -> TrialRecord:
    """A configuration concluded not to fit without running it (a smaller micro-batch did not, or the pruner)."""
    return TrialRecord(key=key, status=status, candidate=dataclasses.asdict(candidate), params=params, reason=reason,
                       inferred=True, label=candidate_label(candidate), origin=origin)


def skipped(skip: Skip, params: dict[str, Any], *, choice: dict[str, Any], origin: str) -> TrialRecord:
    """A choice of knobs that cannot run (contradictory, or the micro-batch does not divide the batch)."""
    return TrialRecord(key=skip.key, status="skipped", params=params, reason=skip.reason, label=choice_label(choice),
                       origin=origin)


def observed(*, key: str, status: str, params: dict[str, Any], origin: str, candidate: Candidate | None,
             value: float, was_measured: bool) -> TrialRecord:
    """A finished trial of the study as the sampler's policy sees it (its value the trial's tok/s)."""
    return TrialRecord(key=key, status=status, params=params, origin=origin,
                       candidate=dataclasses.asdict(candidate) if candidate else None,
                       tokens_per_s=value if status == "ok" else None, inferred=not was_measured,
                       result={} if was_measured else None)


def choice_label(choice: dict[str, Any]) -> str:
    """The label of a choice that has no candidate (a skipped one): the knobs that decide whether it runs."""
    return " ".join(f"{k}={v}" for k, v in choice.items() if k in ("micro_batch", "gpus_per_trial", "zero_stage",
                                                                      "offload", "sharding"))


def _float(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None
