"""Follow-ups: which configuration to probe next, from what the probes so far have shown.  [pure]

The Searcher asks ``FollowUps.next()`` before each Optuna ask; a candidate returned is enqueued
and probed next, and TPE proposes when it returns None. Two sets of rules:

**Memory boundary** (``after_probe``). Memory grows with the micro-batch and throughput usually
does too, so the fastest configurations sit at the memory boundary: a probe over budget (or a
configuration the memory model's pruner skipped) is followed by the same choices at the next smaller
micro-batch (the largest that may fit), ahead of
anything the walk has queued (checkpointing costs a quarter of the speed or more, so the largest
micro-batch that fits without it is worth knowing before the walk settles on a checkpointed
centre). Without the walk, a new best is followed by the next larger micro-batch and, when it checkpoints, by the
same without checkpointing (faster when it fits).

**Neighbourhood walk** (``neighbours=True``, ``advance``): a greedy local search around the best
probe. The effects of attention, precision, packing, loader workers, optimizer and compilation on
throughput are close to multiplicative, and memory caps the micro-batch, so the best configuration
is usually a few one-knob changes away from a good one. The best probe so far is the *centre*; its
neighbourhood goes to the front of the queue: the *boundary moves* first (the next larger
micro-batch; no checkpointing), each of which becomes the new centre as soon as it beats the old
one (climbing to the memory boundary), ahead of them from a full-precision centre its half-precision
neighbour (bf16 first: faster and lighter; when it beats the centre whose next larger micro-batch was
over budget, it is tried at that micro-batch next, as a boundary move: the lighter precision may fit
it), then every other searched knob changed alone (each other
choice; the next value for ordered knobs). Once all have landed, the changes that beat the centre
are tried all together (one probe), and the best configuration seen becomes the next centre, until
a centre has nothing better around it (TPE goes on from there). A change that did not help one
centre is not retried at the next. A new best found elsewhere (seeds, TPE, the combination)
re-centres the walk. The HF-default baseline is never a centre: it is measured for the report.

**Centres on confirmed evidence** (``recheck_tolerance``): a would-be new centre that beats the
current one by less than the measurement noise (``ConfirmPolicy.tolerance``) and has been measured
once is re-measured first (``recheck``: one more probe); its figure is then the median of its
measurements, and the centre moves only if that still beats it.

Nothing known, in flight or provably infeasible is handed out. The state is a function of the
landed probes in the order they landed: :class:`~autotune.search.AutotuneSampler` rebuilds it by
replaying the study's trials through ``land()`` and reads the next proposal with ``peek()``, so a
resumed search continues exactly where the interrupted one was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from autotune.search._logic import (
    MEMORY_INFEASIBLE,
    ORDERED_KNOBS,
    TrialRecord,
    candidate_id,
    derive_grad_accum,
    infer_infeasible,
    settled,
)
from autotune.spec.levers import inactive
from autotune.spec.probe_request import Candidate
from autotune.spec.space import DIMENSIONS

__all__ = ["FollowUps", "one_knob_change"]

Change = tuple[str, Any]
HALF_PRECISIONS = ("bf16", "fp16")  # preferred first
FULL_PRECISIONS = ("fp32", "tf32")


def one_knob_change(base: Candidate, other: Candidate) -> Change | None:
    """The one knob (and its new value) in which ``other`` differs from ``base``; None otherwise.

    The micro-batch (with its accumulation) is not a knob here; a ZeRO stage with its offload is one.
    """
    if other.micro_batch != base.micro_batch:
        return None
    diff = [d for d in DIMENSIONS if d not in ("gpus_per_trial", "micro_batch") and getattr(other, d) != getattr(base, d)]
    if len(diff) == 1:
        return diff[0], getattr(other, diff[0])
    if set(diff) == {"zero_stage", "offload"}:
        return "zero_stage", (other.zero_stage, other.offload)
    return None


class FollowUps:
    """The follow-up queue and the neighbourhood walk's state (see the module docstring)."""

    def __init__(
        self,
        *,
        choices: Mapping[str, list[Any]],
        micro_batches: list[int],
        grad_ckpt_choices: tuple[bool, ...] | list[bool],
        effective_batch: int,
        in_space: Callable[[Candidate], bool],
        records: Callable[[], list[TrialRecord]],
        baseline_key: str | None = None,
        neighbours: bool = True,
        recheck_tolerance: float | None = None,
    ) -> None:
        self.choices = dict(choices)
        self.micro_batches = sorted(micro_batches)
        self.grad_ckpt_choices = tuple(grad_ckpt_choices)
        self.effective_batch = effective_batch
        self.in_space = in_space
        self.records = records
        self.baseline_key = baseline_key
        self.neighbours = neighbours
        self.queue: list[Candidate] = []  # the walk's, most promising first
        self.step_downs: list[Candidate] = []  # over budget -> the next smaller micro-batch: before the walk
        self.centre: TrialRecord | None = None
        self._nbrs: set[str] = set()  # keys of the centre's neighbourhood (and their combination)
        self._boundary: set[str] = set()  # its boundary moves (bigger micro-batch, no checkpointing)
        self._combined = False
        self._closed: set[str] = set()  # centres whose neighbourhood held nothing better
        self.good: set[Change] = set()  # one-knob changes (knob, value) that beat a centre
        self.bad: set[Change] = set()  # ... and those that did not
        self.origins: dict[str, str] = {}  # key -> boundary | neighbour | combination (first reason wins)
        self.recheck_tolerance = recheck_tolerance
        self.measurements: dict[str, int] = {}  # key -> how many probes measured it (rechecks included)
        self.recheck: str | None = None  # a would-be centre to re-measure before the walk moves to it

    # ------------------------------------------------------------------ the boundary rules

    def after_probe(self, rec: TrialRecord, cache: Mapping[str, TrialRecord]) -> None:
        """A probe landed: apply the memory-boundary rules. A configuration inferred over the budget steps down
        like a probed one (the memory model's pruner on a GPU: the step-downs it also prunes cost nothing, and
        the first it lets through is the largest micro-batch that may fit, which the probe decides)."""
        cand = rec.candidate_obj()
        if cand is None or rec.phase != "search" or self._is_baseline(rec):
            return
        if rec.status in MEMORY_INFEASIBLE:
            lower = [m for m in self.micro_batches if m < cand.micro_batch]
            if lower:
                built = self._runnable(dataclasses.replace(cand, micro_batch=lower[-1]))
                if built is not None and built[1] not in cache:
                    self.step_downs.append(built[0])
                    self.origins.setdefault(built[1], "boundary")
        elif rec.status == "ok" and not rec.inferred and not self.neighbours and self._best() is rec:
            self._push(self.boundary_moves(cand), cache, origin="boundary")

    def boundary_moves(self, cand: Candidate) -> list[Candidate]:
        out: list[Candidate] = []
        higher = [m for m in self.micro_batches if m > cand.micro_batch]
        if higher:
            out.append(dataclasses.replace(cand, micro_batch=higher[0]))
        if cand.grad_ckpt and False in self.grad_ckpt_choices:
            out.append(settled(dataclasses.replace(cand, grad_ckpt=False)))
        return out

    def half_precision(self, cand: Candidate) -> list[Candidate]:
        """``cand`` in half precision (bf16 first) when it runs in full precision and the space offers it."""
        half = [p for p in HALF_PRECISIONS if p in self.choices.get("precision", ())]
        return [dataclasses.replace(cand, precision=half[0])] if half and cand.precision in FULL_PRECISIONS else []

    def one_knob_changes(self, cand: Candidate) -> list[Candidate]:
        """``cand`` with one searched knob changed (not the micro-batch: the boundary moves own it)."""
        out: list[Candidate] = []
        for d, choices in self.choices.items():
            if d in ("micro_batch", "gpus_per_trial", "grad_ckpt"):
                # checkpointing off is a boundary move; on, at the same micro-batch, it only adds the
                # recomputed forward (it pays through the larger micro-batch it lets fit: step-downs)
                continue
            if inactive(DIMENSIONS[d], dataclasses.asdict(cand)):  # offload without ZeRO, ...
                continue
            current = getattr(cand, d)
            if current not in choices:
                continue
            if d in ORDERED_KNOBS:  # the next value up or down, not every other value
                ordered = sorted(choices)
                i = ordered.index(current)
                others = [ordered[j] for j in (i + 1, i - 1) if 0 <= j < len(ordered)]
            else:
                others = [v for v in choices if v != current]
            for v in others:
                out.append(settled(dataclasses.replace(cand, **{d: v})))
        return out

    # ------------------------------------------------------------------ the queue

    def next(self, cache: Mapping[str, TrialRecord], in_flight: Mapping[str, Any]) -> Candidate | None:
        """The next follow-up worth a probe, or None (then TPE proposes)."""
        self.advance(cache)
        known = list(cache.values())
        while self.step_downs or self.queue:
            cand = (self.step_downs or self.queue).pop(0)
            key = candidate_id(cand)
            if key in cache or key in in_flight:
                continue
            if infer_infeasible(cand, known) is not None:  # (every queued one passed _runnable)
                # provably over budget (a smaller micro-batch of it was): not a neighbour to wait for
                self._nbrs.discard(key)
                self._boundary.discard(key)
                continue
            return cand
        return None

    def land(self, rec: TrialRecord, cache: Mapping[str, TrialRecord]) -> None:
        """A probe (or an inference) landed: the boundary rules, the walk, then drop what is settled.

        The canonical order the sampler replays: the state after n landings is a function of those n.
        """
        self.after_probe(rec, cache)
        self.advance(cache)
        self._drop_settled(cache)

    def _drop_settled(self, cache: Mapping[str, TrialRecord]) -> None:
        """Drop queued candidates that are known or provably infeasible (no longer awaited)."""
        known = list(cache.values())
        keep_s, keep_q = [], []
        for lst, keep in ((self.step_downs, keep_s), (self.queue, keep_q)):
            for cand in lst:
                key = candidate_id(cand)
                if key in cache:
                    continue
                if infer_infeasible(cand, known) is not None:
                    self._nbrs.discard(key)
                    self._boundary.discard(key)
                    continue
                keep.append(cand)
        self.step_downs, self.queue = keep_s, keep_q
        if self.neighbours:
            self.advance(cache)  # a neighbourhood may be complete now that a member is proved infeasible

    def peek(self, cache: Mapping[str, TrialRecord], in_flight: Mapping[str, Any]) -> tuple[Candidate, str] | None:
        """The next proposal (candidate, origin) without changing the state; None when there is none."""
        if self.recheck is not None and self.recheck not in in_flight:
            rec = cache.get(self.recheck)
            cand = rec.candidate_obj() if rec is not None else None
            if cand is not None:
                return cand, "recheck"
        for cand in (*self.step_downs, *self.queue):
            key = candidate_id(cand)
            if key not in cache and key not in in_flight:
                return cand, self.origins.get(key, "boundary")
        return None

    def peek_step_down(self, cache: Mapping[str, TrialRecord],
                       in_flight: Mapping[str, Any]) -> tuple[Candidate, str] | None:
        """The next pending step-down of a probe over budget (not known, in flight or provably
        infeasible), without changing the state; None when there is none."""
        known = list(cache.values())
        for cand in self.step_downs:
            key = candidate_id(cand)
            if key not in cache and key not in in_flight and infer_infeasible(cand, known) is None:
                return cand, self.origins.get(key, "boundary")
        return None

    def _needs_recheck(self, best: TrialRecord, centre: TrialRecord | None) -> bool:
        """``best`` beats ``centre`` by less than the noise, on one measurement: re-measure it first."""
        if self.recheck_tolerance is None or centre is None or best.key == centre.key:
            return False
        if self.measurements.get(best.key, 1) >= 2 or not centre.tokens_per_s:
            return False
        return (best.tokens_per_s or 0.0) < centre.tokens_per_s * (1.0 + self.recheck_tolerance)

    def _runnable(self, cand: Candidate) -> tuple[Candidate, str] | None:
        """``cand`` with the accumulation its micro-batch needs, and its key; None if not in the space."""
        accum = derive_grad_accum(self.effective_batch, cand.micro_batch, cand.world_size)
        if accum is None:
            return None
        cand = dataclasses.replace(cand, grad_accum=accum)
        return (cand, candidate_id(cand)) if self.in_space(cand) else None

    def _push(self, cands: list[Candidate], cache: Mapping[str, TrialRecord], *, origin: str,
              keys: set[str] | None = None) -> None:
        """Put ``cands`` at the front of the queue, in order (unknown ones only)."""
        front: list[Candidate] = []
        for c in cands:
            built = self._runnable(c)
            if built is None:
                continue
            c, key = built
            if keys is not None:
                keys.add(key)
            if key not in cache and all(candidate_id(q) != key for q in front):
                front.append(c)
                self.origins.setdefault(key, origin)
        fresh = {candidate_id(c) for c in front}
        self.queue = front + [q for q in self.queue if candidate_id(q) not in fresh]

    # ------------------------------------------------------------------ the walk

    def _is_baseline(self, rec: TrialRecord) -> bool:
        """The HF-default baseline measured for the report; not when an expert seed (or the walk)
        proposed the same configuration: then it is the search's own probe."""
        return rec.key == self.baseline_key and rec.origin in ("baseline", "")

    def _best(self) -> TrialRecord | None:
        """The fastest search probe so far, the baseline excepted."""
        ok = [r for r in self.records() if r.phase == "search" and r.status == "ok" and r.tokens_per_s is not None
              and r.probed and not self._is_baseline(r)]
        return max(ok, key=lambda r: r.tokens_per_s or 0.0) if ok else None

    def advance(self, cache: Mapping[str, TrialRecord]) -> None:
        """Move the walk on from what has landed (re-centre, combine, or close the centre)."""
        if not self.neighbours:
            return
        best = self._best()
        if best is None:
            return
        centre = self.centre
        self.recheck = None
        if centre is None or best.key in self._boundary or (best.key != centre.key and best.key not in self._nbrs):
            if best.key not in self._closed and (centre is None or best.key != centre.key):
                if self._needs_recheck(best, centre):
                    self.recheck = best.key
                    return
                self._learn(cache)
                self._recentre(best, cache)
            return
        self._climb_lighter(cache)
        if any(k not in cache for k in self._nbrs):
            return  # the neighbourhood is still being measured
        if not self._combined:
            self._combined = True
            self._learn(cache)
            combo = self._combination(cache)
            built = self._runnable(combo) if combo is not None else None
            if built is not None and built[1] not in cache:
                self._nbrs.add(built[1])
                self.queue.insert(0, built[0])
                self.origins.setdefault(built[1], "combination")
                return
        if best.key != centre.key and best.key not in self._closed and self._needs_recheck(best, centre):
            self.recheck = best.key
            return
        self._closed.add(centre.key)
        if best.key != centre.key and best.key not in self._closed:
            self._recentre(best, cache)
        else:
            self.centre, self._nbrs, self._boundary = None, set(), set()

    def converged(self) -> bool:
        """The walk has settled: the best configuration is a closed centre (each of its one-lever neighbours,
        their combination and the boundary moves were measured and none beat it) and nothing is queued."""
        best = self._best()
        return (self.neighbours and best is not None and best.key in self._closed and self.centre is None
                and not self.queue and not self.step_downs and self.recheck is None)

    def _climb_lighter(self, cache: Mapping[str, TrialRecord]) -> None:
        """The centre's next larger micro-batch was over budget and its half-precision neighbour beat it:
        that neighbour at the larger micro-batch next (a boundary move: the lighter precision may fit it)."""
        centre = self.centre
        base = centre.candidate_obj() if centre is not None else None
        if centre is None or base is None or not centre.tokens_per_s:
            return
        higher = [m for m in self.micro_batches if m > base.micro_batch]
        if not higher:
            return
        for half in self.half_precision(base):
            built = self._runnable(half)
            r = cache.get(built[1]) if built is not None else None
            up = self._runnable(dataclasses.replace(base, micro_batch=higher[0]))
            over = cache.get(up[1]) if up is not None else None
            if r is None or r.status != "ok" or (r.tokens_per_s or 0.0) <= centre.tokens_per_s \
                    or over is None or over.status not in MEMORY_INFEASIBLE:
                continue
            climb = self._runnable(dataclasses.replace(half, micro_batch=higher[0]))
            if climb is not None and climb[1] not in cache and climb[1] not in self._boundary:
                self._push([climb[0]], cache, keys=self._boundary, origin="boundary")
                self._nbrs.add(climb[1])

    def _recentre(self, rec: TrialRecord, cache: Mapping[str, TrialRecord]) -> None:
        """Explore the neighbourhood of ``rec`` next (stale neighbours of the old centre dropped).

        Order: the boundary moves, then the one-knob changes that beat an earlier centre, then
        the untried ones; a change that did not beat an earlier centre is not tried again here.
        """
        stale = set(self._nbrs)
        self.queue = [q for q in self.queue if candidate_id(q) not in stale]
        self.centre, self._nbrs, self._boundary, self._combined = rec, set(), set(), False
        cand = rec.candidate_obj()
        if cand is None:
            return
        changes = [(c, one_knob_change(cand, c)) for c in self.one_knob_changes(cand)]
        good = [c for c, ch in changes if ch in self.good]
        untried = [c for c, ch in changes if ch not in self.good and ch not in self.bad]
        rest: set[str] = set()
        self._push(good + untried, cache, keys=rest, origin="neighbour")
        self._push(self.boundary_moves(cand), cache, keys=self._boundary, origin="boundary")  # they lead ...
        # ... but for half precision from full: faster and lighter (a larger micro-batch may fit with it)
        self._push([c for c in self.half_precision(cand) if one_knob_change(cand, c) not in self.bad],
                   cache, keys=rest, origin="neighbour")
        self._nbrs = self._boundary | rest

    def _learn(self, cache: Mapping[str, TrialRecord]) -> None:
        """Label the centre's landed one-knob changes as better or not (for later centres)."""
        centre = self.centre
        base = centre.candidate_obj() if centre is not None else None
        if centre is None or base is None:
            return
        for key in self._nbrs - self._boundary:
            r = cache.get(key)
            c = r.candidate_obj() if r is not None else None
            ch = one_knob_change(base, c) if c is not None else None
            if r is None or c is None or ch is None:
                continue
            better = r.status == "ok" and (r.tokens_per_s or 0.0) > (centre.tokens_per_s or 0.0)
            (self.good if better else self.bad).add(ch)
            (self.bad if better else self.good).discard(ch)
            if better:  # going back is then a change for the worse
                back = one_knob_change(c, base)
                if back is not None:
                    self.bad.add(back)
                    self.good.discard(back)

    def _combination(self, cache: Mapping[str, TrialRecord]) -> Candidate | None:
        """The centre with every one-knob change that beat it applied at once (None if < 2 did)."""
        centre = self.centre
        base = centre.candidate_obj() if centre is not None else None
        if centre is None or base is None or not centre.tokens_per_s:
            return None
        best_per_knob: dict[str, tuple[float, Any]] = {}
        for key in self._nbrs:
            r = cache.get(key)
            c = r.candidate_obj() if r is not None else None
            if r is None or c is None or r.status != "ok" or (r.tokens_per_s or 0.0) <= centre.tokens_per_s:
                continue
            for d in DIMENSIONS:
                if d == "gpus_per_trial" or getattr(c, d) == getattr(base, d):
                    continue
                if d not in best_per_knob or (r.tokens_per_s or 0.0) > best_per_knob[d][0]:
                    best_per_knob[d] = (r.tokens_per_s or 0.0, getattr(c, d))
        if len(best_per_knob) < 2:
            return None
        return dataclasses.replace(base, **{d: v for d, (_, v) in best_per_knob.items()})
