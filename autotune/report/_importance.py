"""Parameter importance from the probes, by a simple, stated method.  [pure; optuna only if a study is given]"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from autotune.spec.result import ProbeResult

__all__ = ["Importance", "param_importance", "ETA_SQUARED_METHOD"]

# grad_accum follows from micro_batch (the effective batch is held fixed): not a free choice
_DERIVED = ("grad_accum",)

ETA_SQUARED_METHOD = (
    "share of the variance of log(tok/s) over the {n} probes that fit explained by grouping on each "
    "parameter alone (η², one parameter at a time). A search samples parameters together, so the "
    "shares are marginal, can overlap and need not add up to 100%."
)


@dataclass(frozen=True)
class Importance:
    values: dict[str, float]  # parameter -> importance, largest first
    method: str

    def to_dict(self) -> dict[str, Any]:
        return {"values": dict(self.values), "method": self.method}


def _eta_squared(results: list[ProbeResult]) -> Importance:
    rows: list[tuple[dict[str, Any], float]] = []
    for r in results:
        tps = r.tokens_per_s
        if not r.fits or not tps or tps <= 0:
            continue
        try:
            c = r.probe_request().candidate
        except Exception:
            continue
        rows.append((dataclasses.asdict(c), math.log(tps)))
    if len(rows) < 3:
        return Importance(
            {}, f"not enough probes that fit ({len(rows)}; at least 3 needed) to rank parameters"
        )
    ys = [y for _, y in rows]
    mean = sum(ys) / len(ys)
    total = sum((y - mean) ** 2 for y in ys)
    out: dict[str, float] = {}
    for name in rows[0][0]:
        if name in _DERIVED:
            continue
        groups: dict[str, list[float]] = {}
        for params, y in rows:
            groups.setdefault(repr(params[name]), []).append(y)
        if len(groups) < 2:
            continue  # never varied among the probes that fit
        between = sum(len(g) * (sum(g) / len(g) - mean) ** 2 for g in groups.values())
        out[name] = between / total if total > 0 else 0.0
    ordered = dict(sorted(out.items(), key=lambda kv: -kv[1]))
    return Importance(ordered, ETA_SQUARED_METHOD.format(n=len(rows)))


def param_importance(results: Iterable[ProbeResult], *, study: Any = None) -> Importance:
    """Optuna's ``get_param_importances`` (its default evaluator) when ``study`` is given and has
    enough completed trials; otherwise η² of log tokens/s per parameter over the probes that fit."""
    results = list(results)
    if study is not None:
        try:
            import optuna

            values = optuna.importance.get_param_importances(study)
            if values:
                return Importance(
                    {str(k): float(v) for k, v in values.items()},
                    "optuna.importance.get_param_importances (default evaluator) over the study's "
                    "completed trials",
                )
        except Exception:  # too few trials, a multi-objective study...: fall back, say which
            pass
    return _eta_squared(results)
