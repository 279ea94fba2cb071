"""An executor that answers probes from a recorded landscape instead of running them.  [pure]

A *landscape* (``benchmarks/record_landscape.py``) holds every configuration of a search space
measured with real probes, each repeated: status, tok/s of every repeat, peak memory, wall time.
``ReplayExecutor`` answers a probe request by looking its candidate up there, so a searcher can be
scored over many seeds in seconds on real measurements.

Noise: a measured throughput is not a constant (on CPU the same configuration spans ~30 %). With
``noise=True`` each answer draws its tok/s uniformly between the smallest and the largest recorded
repeat of that configuration; a configuration recorded once gets the landscape's median relative
spread around its value. With ``noise=False`` the answer is the median of the repeats.

Status: a recorded genuine failure (oom, crash, timeout, unsupported) is answered as recorded.
Otherwise fit is decided against the *request's* budget when it has one (peak memory above the
budget less the headroom is ``over_budget``), else the landscape's recorded status; so one recording
can be replayed under several budgets. A candidate that is not in the landscape is answered as a
``crash`` saying so (a search that asks outside the recorded grid is told, never given a number).

The executor counts what the answers would have cost: ``probes`` and ``probe_seconds`` (the
recorded wall time; a longer window, such as a confirmation re-measure, costs it pro rata to the
timed steps, plus the fixed start-up). A landscape whose ``timed_steps`` is below its ``steps`` says its
probes' adaptive windows stopped there, stable, before their maximum: a request with a larger maximum
stops at the same point, so it costs the recorded wall time (the simulated GPU landscapes of
``benchmarks/time_to_answer.py simulate``).
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
from collections import deque
from pathlib import Path
from typing import Any

from autotune.spec.probe_request import Candidate, ProbeRequest
from autotune.spec.result import ProbeResult
from autotune.spec.trial import candidate_id, candidate_label

__all__ = ["ReplayExecutor", "load_landscape"]

_MEASURED = ("ok", "over_budget")


def load_landscape(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    """A landscape as a dict, from a dict or a JSON file path."""
    if isinstance(source, dict):
        return source
    return dict(json.loads(Path(source).read_text(encoding="utf-8")))


def _values(entry: dict[str, Any]) -> list[float]:
    vals = [float(v) for v in entry.get("tokens_per_s_all") or [] if v]
    if not vals and entry.get("tokens_per_s"):
        vals = [float(entry["tokens_per_s"])]
    return vals


class ReplayExecutor:
    """Executor protocol over a recorded landscape: ``slots``, ``submit``, ``poll``, ``pending``, ``close``."""

    def __init__(self, landscape: str | Path | dict[str, Any], *, seed: int, noise: bool = True,
                 slots: int = 1) -> None:
        self.landscape = load_landscape(landscape)
        self.entries: dict[str, dict[str, Any]] = {}
        for e in self.landscape["entries"]:
            key = e.get("id") or candidate_id(Candidate(**e["candidate"]))
            self.entries[key] = e
        spreads = [(max(v) - min(v)) / statistics.median(v) for e in self.entries.values()
                   if len(v := _values(e)) > 1 and statistics.median(v) > 0]
        self.default_spread = statistics.median(spreads) if spreads else 0.0
        self.base_steps = int(self.landscape.get("steps") or 5)
        # the timed steps every recorded window stopped at (adaptive, stable), when it says so
        timed = self.landscape.get("timed_steps")
        self.stopped_at = int(timed) if timed is not None and int(timed) < self.base_steps else None
        self.noise = noise
        self.rng = random.Random(seed)
        self._slots = max(1, slots)
        self._queue: deque[tuple[str, ProbeRequest]] = deque()
        self._ids = itertools.count()
        self.probes = 0
        self.probe_seconds = 0.0
        self.answered: list[tuple[str, str]] = []  # (candidate id, status) in answer order

    @property
    def slots(self) -> int:
        return self._slots

    def true_tokens_per_s(self, candidate: Candidate) -> float | None:
        """The recorded median tok/s of a candidate (None when absent or not measured)."""
        e = self.entries.get(candidate_id(candidate))
        vals = _values(e) if e else []
        return statistics.median(vals) if vals else None

    def status_of(self, entry: dict[str, Any], request: ProbeRequest) -> str:
        reps = [r.get("status") for r in entry.get("repeats", [])]
        recorded = entry.get("status", "ok")
        if recorded not in _MEASURED and recorded != "missing":
            return str(recorded)
        if reps and not any(s in _MEASURED for s in reps):
            return str(reps[0])
        usable = request.settings.usable_bytes()
        peak = entry.get("peak_mem_bytes")
        if usable is not None and peak is not None:
            return "over_budget" if int(peak) > usable else "ok"
        return str(recorded) if recorded in _MEASURED else "ok"

    def _tokens(self, entry: dict[str, Any]) -> float | None:
        vals = _values(entry)
        if not vals:
            return None
        if not self.noise:
            return statistics.median(vals)
        if len(vals) > 1:
            return self.rng.uniform(min(vals), max(vals))
        half = self.default_spread / 2.0
        return vals[0] * self.rng.uniform(1.0 - half, 1.0 + half)

    def _cost(self, entry: dict[str, Any], steps: int) -> float:
        wall = float(entry.get("wall_s") or 0.0)
        if steps <= self.base_steps or wall <= 0 or self.stopped_at is not None:
            return wall
        fixed = float((entry.get("repeats") or [{}])[0].get("metrics", {}).get("overhead_s") or 0.5 * wall)
        fixed = min(fixed, wall)
        return fixed + (wall - fixed) * steps / self.base_steps

    def answer(self, request: ProbeRequest) -> ProbeResult:
        key = candidate_id(request.candidate)
        entry = self.entries.get(key)
        self.probes += 1
        if entry is None:
            self.answered.append((key, "crash"))
            return ProbeResult(status="crash", request=request.to_dict(),
                               reason=f"not in the landscape: {candidate_label(request.candidate)} was not recorded")
        status = self.status_of(entry, request)
        wall = self._cost(entry, request.settings.steps)
        if status == "over_budget" and entry.get("over_budget_wall_s") is not None:
            # a GPU probe capped at the budget stops at its out-of-memory error: set-up and the first steps
            wall = min(wall, float(entry["over_budget_wall_s"]))
        self.probe_seconds += wall
        metrics: dict[str, Any] = {"peak_mem_bytes": entry.get("peak_mem_bytes"), "wall_s": wall,
                                   "step_time_spread": entry.get("spread"), "replayed": True}
        if status in _MEASURED:
            metrics["tokens_per_s"] = self._tokens(entry)
        reason = entry.get("reason", "") if status == entry.get("status") else ""
        if status == "over_budget" and not reason:
            reason = f"peak {int(entry['peak_mem_bytes']) / 2**20:.0f} MiB over the usable budget"
        self.answered.append((key, status))
        return ProbeResult(status=status, request=request.to_dict(), reason=reason, metrics=metrics)

    # ---------------------------------------------------------------- Executor protocol

    def submit(self, request: ProbeRequest) -> str:
        ticket = f"replay-{next(self._ids)}"
        self._queue.append((ticket, request))
        return ticket

    def poll(self, timeout: float | None = None) -> list[tuple[str, ProbeResult]]:
        out = []
        for _ in range(min(self._slots, len(self._queue))):
            ticket, req = self._queue.popleft()
            out.append((ticket, self.answer(req)))
        return out

    def pending(self) -> int:
        return len(self._queue)

    def close(self) -> None:
        self._queue.clear()
