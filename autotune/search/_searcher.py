"""The search loop: Optuna ask -> probe -> tell driving an Executor, then confirmation of the top few.

What to probe next is the study's sampler's decision: an :class:`~autotune.search.AutotuneSampler`
with the chosen ``strategy`` (the walk by default: seeds, step-downs, the neighbourhood walk, TPE).
The loop probes what it is asked, tells the study, and records each trial's ``origin``.

Optuna 5 semantics used here (checked against the installed 5.0): an OOM / over-budget /
unsupported probe is *information*: it is told COMPLETE with a value of 0 tok/s and a positive
``trial.set_constraint("memory", ...)``; TPE learns from it. Timeouts and crashes are told FAIL
(TPE ignores those). A skipped choice (micro-batch that does not divide the effective batch,
contradictory knobs) is told like an infeasible one so the sampler stops proposing it.

The loop never probes a configuration twice: a duplicate ask is told from the cache. It keeps up
to ``executor.slots`` probes in flight, and stops at ``max_trials`` probes, at the time budget
(keeping time for the confirmation), or when the space is exhausted. A probe's failure never
stops it.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import Trial, TrialState

from autotune.errors import SpecError
from autotune.estimate.prior import CostPrior
from autotune.estimate.probe_time import Deadlines
from autotune.executors.base import Executor
from autotune.search import _records
from autotune.search._confirm import (
    ConfirmPolicy,
    choose_winner,
    confirmation_probes,
    confirmation_status,
    interleaved_order,
    measured_range,
)
from autotune.search._logic import (
    FAILED,
    MEMORY_INFEASIBLE,
    Skip,
    TrialRecord,
    candidate_from_choice,
    candidate_id,
    candidate_label,
    constraint_value,
    distinct_candidates,
    infer_infeasible,
    median,
    relative_spread,
    runnable_candidates,
    usable_micro_batches,
    usable_worlds,
)
from autotune.search._sampler import AutotuneSampler, SamplerSettings, tpe_factory
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult
from autotune.spec.space import SearchSpace

__all__ = ["Searcher", "SearchPolicy", "SearchRecords", "SearchHooks", "SearchOutcome", "Pruner", "ProgressFn",
           "LoadCheck"]

# pruner(candidate) -> reason it is predicted not to fit (recorded as inferred), or None to probe it
Pruner = Callable[[Candidate], "str | None"]
ProgressFn = Callable[[str, dict[str, Any]], None]
# load_check(phase, since) -> findings about other load on the machine ({"kind", "message", ...}):
# phase "before" just before a probe is submitted (since None), "during" when one lands (since = its
# submit time on the same clock as time.monotonic)
LoadCheck = Callable[[str, "float | None"], "list[dict[str, Any]]"]
_CONSTRAINT = "memory"
_MAX_IDLE_ASKS = 120  # asks in a row that yield nothing new before the space counts as exhausted
# Knobs whose choices are ordered (ORDERED_KNOBS). ``ordinal=True`` suggests them as an index into the sorted
# choices (TPE then sees that 8 lies between 4 and 16). Measured on synthetic landscapes (24 seeds,
# 20-40 trials), categorical + multivariate TPE found >= 97 % of the optimum more often than
# ordinal + multivariate, and both beat independent TPE; so the defaults are categorical, multivariate.


@dataclass
class SearchOutcome:
    records: list[TrialRecord]
    best: ProbeResult | None
    best_record: TrialRecord | None
    ranking: list[dict[str, Any]]
    skipped_choices: list[str]
    counts: dict[str, int]
    wall_s: float
    stop_reason: str
    distinct_candidates: int | None = None
    warnings: list[dict[str, Any]] = field(default_factory=list)
    tie: list[str] = field(default_factory=list)  # labels indistinguishable from the winner
    confirm_policy: dict[str, Any] = field(default_factory=dict)
    # the model strategy: each lever of the winner changed alone, measured or predicted (LeverDecision.to_dict)
    lever_decisions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _InFlight:
    """A search probe in flight: the trial that asked for it (None: the baseline outside the space)."""

    trial: Trial | None
    candidate: Candidate
    key: str
    params: dict[str, Any]
    remeasure: bool = False  # the sampler asked to measure a seen configuration again (origin recheck)


@dataclass
class _Loop:
    """The search loop's state over one ``Searcher.run``."""

    start: float
    cache: dict[str, TrialRecord]  # key -> its search record (a duplicate ask is told from it)
    probes: int  # search probes and re-measures that ran, restored ones included
    in_flight: dict[str, _InFlight] = field(default_factory=dict)  # ticket -> probe
    in_flight_keys: dict[str, str] = field(default_factory=dict)  # key -> ticket
    waiters: dict[str, list[Trial]] = field(default_factory=dict)  # key in flight -> asks told when it lands
    submitted_at: dict[str, float] = field(default_factory=dict)  # ticket -> clock()
    idle_asks: int = 0
    stop_reason: str = ""
    extra: list[Candidate] = field(default_factory=list)  # the baseline outside the space
    outside: set[str] = field(default_factory=set)  # its key: not one of the space's distinct configurations
    enqueue_baseline: dict[str, Any] | None = None  # the baseline's Optuna params, until enqueued
    seed_keys: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class SearchPolicy:
    """How the search spends its probes: how many and for how long, the proposal strategy and its
    switches, the confirmation of the top few."""

    max_trials: int = 40
    time_budget_s: float | None = None
    seed: int = 42
    top_k: int = 3
    confirm_steps: int | None = None  # None: spec.run_defaults.confirm_steps(settings.steps)
    confirm: ConfirmPolicy | None = None  # None: ConfirmPolicy.for_device(device)
    strategy: str = "walk"
    seeds: int = 3
    ordinal: bool = False
    multivariate: bool = True
    follow_ups: bool = True
    neighbours: bool = True
    recheck: bool = True
    defaults: Candidate | None = None
    poll_interval_s: float = 2.0
    # stop the search once the walk has settled (its best is a local optimum under one-lever moves) rather
    # than handing the rest of max_trials to TPE
    stop_when_converged: bool = False


@dataclass(frozen=True)
class SearchRecords:
    """Where the search is kept: the Optuna study, the records a resumed run restores, and the sink each
    new record goes to (the run's journal)."""

    storage: str | optuna.storages.BaseStorage | None = None
    study_name: str = "autotune"
    history: list[TrialRecord] | None = None
    sink: Callable[[TrialRecord], None] | None = None


@dataclass(frozen=True)
class SearchHooks:
    """What the search calls out to: the progress events, the pruner, the load check, each probe's
    deadline (``Deadlines``; None: ``settings.timeout_s`` as given), the clock, and the estimator's
    prior for the model strategy (``autotune.estimate.CostPrior``; None: the model starts flat)."""

    progress: ProgressFn | None = None
    pruner: Pruner | None = None
    prior: CostPrior | None = None
    load_check: LoadCheck | None = None
    deadlines: Deadlines | None = None
    clock: Callable[[], float] = time.monotonic


_GROUPS = (SearchPolicy, SearchRecords, SearchHooks)


def _grouped(policy: SearchPolicy | None, records: SearchRecords | None, hooks: SearchHooks | None,
             keywords: dict[str, Any]) -> tuple[SearchPolicy, SearchRecords, SearchHooks]:
    """The three groups, each from its object or from the flat keywords of one release ago
    (``Searcher(max_trials=6, sink=...)``); a keyword in no group is a TypeError."""
    given = [policy, records, hooks]
    for i, group in enumerate(_GROUPS):
        names = {f.name for f in dataclasses.fields(group)}
        mine = {k: keywords.pop(k) for k in list(keywords) if k in names}
        if mine and given[i] is not None:
            raise TypeError(f"Searcher: give {group.__name__} or its keywords ({', '.join(sorted(mine))}), not both")
        given[i] = given[i] if given[i] is not None else group(**mine)
    if keywords:
        raise TypeError(f"Searcher() got an unexpected keyword argument {sorted(keywords)[0]!r}")
    return given[0], given[1], given[2]  # type: ignore[return-value]


class Searcher:
    """Search a space for the fastest configuration that fits, over an Executor.

    What is searched (``space``, ``workload``, ``settings``, ``effective_batch``), where (``executor``,
    ``device``, ``max_world``), the HF default measured beside it (``baseline``), and three groups:
    :class:`SearchPolicy`, :class:`SearchRecords`, :class:`SearchHooks` (their fields are also accepted as
    keywords, as before)."""

    def __init__(
        self,
        *,
        space: SearchSpace,
        workload: Workload,
        settings: ProbeSettings,
        effective_batch: int,
        executor: Executor,
        device: str = "cuda",
        max_world: int | None = None,
        baseline: Candidate | None = None,
        policy: SearchPolicy | None = None,
        records: SearchRecords | None = None,
        hooks: SearchHooks | None = None,
        **keywords: Any,
    ) -> None:
        policy, records, hooks = _grouped(policy, records, hooks, keywords)
        _check_arguments(effective_batch, policy.max_trials, policy.time_budget_s, policy.top_k)
        self.space, self.workload, self.settings = space, workload, settings
        self.effective_batch, self.executor, self.device, self.baseline = effective_batch, executor, device, baseline
        self._take(policy, records, hooks)
        history = records.history
        max_trials, seed, strategy, seeds = policy.max_trials, policy.seed, policy.strategy, policy.seeds
        multivariate, ordinal, defaults, recheck = policy.multivariate, policy.ordinal, policy.defaults, policy.recheck
        follow_ups, neighbours = policy.follow_ups, policy.neighbours
        if self.deadlines is not None and history:  # a resumed run keeps what its probes taught the correction
            self.deadlines.restore([r.result for r in history if r.probed and r.result])

        worlds, mbs, self.skipped_choices = _usable_shapes(space, effective_batch, max_world)
        self.worlds = worlds
        self.micro_batches = mbs
        self._origins: dict[str, str] = {}  # candidate key -> what proposed it (TrialRecord.origin)
        self.distinct = distinct_candidates(
            space, effective_batch=effective_batch, micro_batches=mbs, worlds=worlds
        )
        try:
            self.sampler = AutotuneSampler(space, SamplerSettings(
                strategy=strategy, seed=seed,
                base=tpe_factory(n_startup_trials=min(10, max(3, max_trials // 4)), multivariate=multivariate),
                device=device, max_world=max_world, seeds=min(seeds, max(1, max_trials // 3)),
                variable_lengths=workload.variable_lengths,
                baseline=baseline, defaults=defaults, recheck_tolerance=self.confirm.tolerance if recheck else None,
                follow_ups=follow_ups, neighbours=neighbours, ordinal=ordinal, prior=hooks.prior,
                probe_seconds=_probe_seconds(hooks.deadlines, settings),
            ), effective_batch=effective_batch)
        except ValueError as exc:
            raise SpecError(str(exc)) from exc
        self.choices: dict[str, list[Any]] = self.sampler.choices
        self.distributions: dict[str, BaseDistribution] = self.sampler.distributions
        self.fixed: dict[str, Any] = self.sampler.fixed
        self.seed_choices = self.sampler.seed_choices
        self.study = optuna.create_study(
            storage=records.storage,
            sampler=self.sampler,
            study_name=records.study_name,
            direction="maximize",
            load_if_exists=True,
        )

    def _take(self, policy: SearchPolicy, records: SearchRecords, hooks: SearchHooks) -> None:
        """The groups' values as the loop reads them, and the loop's own state."""
        from autotune.spec.run_defaults import confirm_steps as default_confirm_steps

        self.policy = policy
        self.max_trials, self.time_budget_s, self.seed, self.top_k = (
            policy.max_trials, policy.time_budget_s, policy.seed, policy.top_k)
        self.confirm_steps = policy.confirm_steps or default_confirm_steps(self.settings.steps)  # tune: its plan's
        self.confirm = policy.confirm if policy.confirm is not None else ConfirmPolicy.for_device(self.device)
        self.follow_ups, self.poll_interval_s = policy.follow_ups, policy.poll_interval_s
        self.sink = records.sink
        self.progress, self.pruner, self.load_check, self.clock = hooks.progress, hooks.pruner, hooks.load_check, hooks.clock
        self.deadlines = hooks.deadlines
        self.warnings: list[dict[str, Any]] = []
        self._tie: list[str] = []
        # confirmation values of one process only: a resumed run re-measures its rounds as a block
        self.session = uuid.uuid4().hex[:12]
        self.records: list[TrialRecord] = []
        self._durations: list[float] = []
        self._submitted_wall: dict[str, float] = {}
        self._retried: set[tuple[str, str]] = set()  # (phase, key) probed again after its process died
        self._history = list(records.history or [])

    # ---------------------------------------------------------------- helpers

    def _emit(self, event: str, **data: Any) -> None:
        if self.progress is not None:
            self.progress(event, data)

    def _add(self, record: TrialRecord) -> TrialRecord:
        record.number = len(self.records)
        self.records.append(record)
        if self.sink is not None:
            self.sink(record)
        return record

    def _request(self, candidate: Candidate, *, confirm: bool = False) -> ProbeRequest:
        settings = self.settings
        if confirm:
            settings = dataclasses.replace(settings, steps=self.confirm_steps)
        return ProbeRequest(workload=self.workload, candidate=candidate, settings=settings)

    def _best_so_far(self) -> TrialRecord | None:
        ok = [r for r in self.records if r.phase == "search" and r.status == "ok" and r.tokens_per_s is not None]
        return max(ok, key=lambda r: r.tokens_per_s or 0.0) if ok else None

    def _counts(self) -> dict[str, int]:
        search = [r for r in self.records if r.phase == "search"]
        return {
            # every probe the search ran (what --max-trials counts), re-measures of a would-be centre included
            "probed": sum(1 for r in search if r.probed) + sum(1 for r in self.records if r.phase == "recheck"),
            "ok": sum(1 for r in search if r.probed and r.status == "ok"),
            "infeasible": sum(1 for r in search if r.probed and r.status in MEMORY_INFEASIBLE),
            "unsupported": sum(1 for r in search if r.probed and r.status == "unsupported"),
            "failed": sum(1 for r in search if r.probed and r.status in FAILED),
            "inferred": sum(1 for r in search if r.inferred),
            "skipped": sum(1 for r in search if r.status == "skipped"),
            "confirm_probes": sum(1 for r in self.records if r.phase == "confirm"),
            "recheck_probes": sum(1 for r in self.records if r.phase == "recheck"),
        }

    def _median_probe_wall(self) -> float | None:
        """Typical seconds from submit to result of a further probe (measured here: includes queueing and launch).
        The first probe to land also paid the executor's one-time start (on this CPU 5.6 s of set-up against 0.8 s
        for the next forked probe), so it stands for the others only while it is alone, and then at most at its
        own prediction: a 60 s --time-budget had stopped after that one probe, reserving 12 of its walls."""
        if len(self._durations) >= 2:
            return median(self._durations[1:])
        if self._durations:
            first = self._durations[0]
            predicted = [float(m["predicted_s"]) for r in self.records if r.probed and r.result
                         and isinstance(m := r.result.get("metrics") or {}, dict) and m.get("predicted_s")]
            return min(first, median(predicted)) if predicted else first
        walls = [r.wall_s for r in self.records if r.probed and r.wall_s]
        return median([float(w) for w in walls]) if walls else None

    def _all_pruned(self) -> bool:
        """True when the pruner rejects every configuration of a countable space (nothing to probe)."""
        if self.pruner is None or self.distinct is None:
            return False
        some = False
        for _, c in runnable_candidates(self.space, effective_batch=self.effective_batch,
                                        micro_batches=self.micro_batches, worlds=self.worlds):
            if not self.pruner(c):
                return False
            some = True
        return some

    def _submit(self, cand: Candidate, *, confirm: bool = False) -> str:
        self._check_load("before", None, candidate_label(cand))
        request = self._request(cand, confirm=confirm)
        if self.deadlines is None:
            ticket = self.executor.submit(request)
        else:
            request, predicted, deadline = self.deadlines.apply(request)
            ticket = self.executor.submit(request)
            self.deadlines.issued(ticket, predicted, deadline)
        self._submitted_wall[ticket] = time.monotonic()
        return ticket

    def _landed(self, ticket: str, result: ProbeResult) -> ProbeResult:
        """A probe's result as recorded: with its prediction and deadline, and a timeout's reason."""
        return result if self.deadlines is None else self.deadlines.landed(ticket, result)

    def _check_load(self, phase: str, since: float | None, label: str) -> list[str]:
        """Ask the load monitor; each finding is a progress event and an entry of ``warnings``."""
        if self.load_check is None:
            return []
        try:
            found = list(self.load_check(phase, since))
        except Exception as exc:  # a monitor must never stop a search
            found = [{"kind": "monitor", "message": f"the load check failed: {exc!r}"}]
        out = []
        for f in found:
            entry = {**f, "phase": phase, "label": label}
            self.warnings.append(entry)
            self._emit("warning", **entry)
            out.append(str(entry.get("message", "")))
        return out

    def _note_noisy_composition(self, rec: TrialRecord, result: ProbeResult) -> None:
        """A composed figure whose components were too noisy to combine: a ``warnings`` entry (the
        confirmation never calls such a figure confirmed, see ``_rank_entry``)."""
        m = result.metrics or {}
        if not m.get("composition_noisy"):
            return
        rel = m.get("rel_std_error")
        entry = {"kind": "composition_noisy", "phase": rec.phase, "label": rec.label,
                 "message": f"{rec.label}: the composed tokens/s is too noisy to combine (relative standard "
                            f"error {rel:.0%})" if isinstance(rel, (int, float)) else f"{rec.label}: too noisy"}
        self.warnings.append(entry)
        self._emit("warning", **entry)

    def _origin(self, key: str, trial: Trial | None = None) -> str:
        if trial is not None and trial.user_attrs.get("origin"):
            return str(trial.user_attrs["origin"])
        return self._origins.get(key, "tpe")

    # ---------------------------------------------------------------- the study: a view of the records
    # The records (the journal) are the trial state; the study holds what the sampler's policy and TPE
    # read, written only by _tell (as the run goes) and _restore (what a resumed study lacks).

    def _restore(self) -> None:
        """Adopt the journal's records (the source of the trial state); the study is made to hold what they
        hold (a killed run's study lacks the last ones, a rebuilt one lacks all)."""
        for r in self._history:
            self._add_restored(r)
        lacking = self._records_the_study_lacks()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            # the killed run's in-flight asks: not evidence (re-proposed)
            self.study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        for r in lacking:
            trial = self._restored_trial(r)
            if trial is not None:  # None: the space changed; the record still counts, the sampler does not see it
                self.study.add_trial(trial)

    def _records_the_study_lacks(self) -> list[TrialRecord]:
        """The journal's search records and re-measures that no finished trial of the study stands for."""
        finished = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL,
                                                                  TrialState.PRUNED))
        told = {t.user_attrs.get("key") for t in finished if not t.user_attrs.get("remeasure")}
        # re-measures (the walk's rechecks) the study holds, per key: a rebuilt study gets the others back
        rechecks_told: dict[str, int] = {}
        for t in finished:
            if t.state == TrialState.COMPLETE and t.user_attrs.get("remeasure") and t.user_attrs.get("key"):
                rechecks_told[t.user_attrs["key"]] = rechecks_told.get(t.user_attrs["key"], 0) + 1
        lacking = []
        for r in self.records:
            if r.phase == "recheck" and rechecks_told.get(r.key, 0) > 0:
                rechecks_told[r.key] -= 1
                continue
            if r.phase not in ("search", "recheck") or r.status in FAILED or not r.params:
                continue
            if r.phase == "search" and r.key in told:
                continue
            lacking.append(r)
            told.add(r.key)
        return lacking

    def _restored_trial(self, r: TrialRecord) -> optuna.trial.FrozenTrial | None:
        """The finished trial a journal record stands for in the study; None when it lies outside the space."""
        internal = self.sampler.to_optuna(r.params)
        if internal is None:
            return None
        return optuna.trial.create_trial(
            params=internal,
            distributions={k: self.sampler.distributions[k] for k in r.params},
            value=self._study_value(r),
            user_attrs={**self._trial_attrs(r, measured=r.probed), "restored": True, "origin": r.origin or "restored",
                        **({"remeasure": True} if r.phase == "recheck" else {})},
            constraints={_CONSTRAINT: self._constraint(r)},
        )

    def _tell(self, trial: Trial | int, record: TrialRecord, *, measured: bool = False) -> None:
        """Tell the study; ``measured``: this trial's own probe measured it (not the cache, not an inference)."""
        number = trial if isinstance(trial, int) else trial.number
        if isinstance(trial, Trial):
            for name, value in self._trial_attrs(record, measured=measured).items():
                trial.set_user_attr(name, value)
        if record.status in FAILED:
            self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
            return
        if isinstance(trial, Trial):
            trial.set_constraint(_CONSTRAINT, self._constraint(record))
        self.study.tell(number, self._study_value(record), skip_if_finished=True)

    @staticmethod
    def _trial_attrs(record: TrialRecord, *, measured: bool) -> dict[str, Any]:
        """The user attributes a trial holds for its record (the sampler's policy reads them back:
        ``AutotuneSampler.observations``); ``measured``: the trial's own probe measured it."""
        return {"key": record.key, "status": record.status, "measured": measured}

    def _study_value(self, record: TrialRecord) -> float:
        """The value the study holds for a record: its tok/s when it ran and fitted, else 0."""
        return float(record.tokens_per_s or 0.0) if record.status == "ok" else 0.0

    def _constraint(self, record: TrialRecord) -> float:
        return constraint_value(record.status, record.peak_mem_bytes, self.settings.usable_bytes())

    def _add_restored(self, r: TrialRecord) -> None:
        r.number = len(self.records)
        self.records.append(r)

    # ---------------------------------------------------------------- the loop

    def run(self) -> SearchOutcome:
        """Restore, search (ask -> probe -> tell until a stop), confirm the top few."""
        start = self.clock()
        self._restore()
        loop = self._begin(start)
        self._emit(
            "start", max_trials=self.max_trials, slots=self.executor.slots, distinct=self.distinct,
            restored=len(self.records), skipped_choices=self.skipped_choices,
        )
        if self._all_pruned():
            loop.stop_reason = "the memory model predicts every configuration far above the budget"
        while not loop.stop_reason or loop.in_flight:
            self._fill(loop)
            if not loop.in_flight:
                break
            self._collect(loop)
        # asks that waited on a key whose probe never landed (cannot happen normally): mark failed
        for trials in loop.waiters.values():
            for t in trials:
                self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        if loop.stop_reason.startswith(("max trials", "time budget")):  # stopped from outside: what was left
            loop.stop_reason += self.sampler.unfinished_text(self.study)
        ranking, best, best_record = self._confirm()
        counts = self._counts()
        wall = self.clock() - start
        self._emit("done", best=best_record, counts=counts, wall_s=wall, stop_reason=loop.stop_reason)
        winner = best_record.candidate_obj() if best_record is not None else None
        return SearchOutcome(
            records=self.records, best=best, best_record=best_record, ranking=ranking,
            skipped_choices=self.skipped_choices, counts=counts, wall_s=wall, stop_reason=loop.stop_reason,
            distinct_candidates=self.distinct, warnings=self.warnings, tie=self._tie,
            confirm_policy=self.confirm.to_dict(),
            lever_decisions=self.sampler.lever_decisions(self.study, winner) if winner is not None else [],
        )

    def _begin(self, start: float) -> _Loop:
        """The loop's state after a restore: the cache of seen keys, and where the baseline goes."""
        loop = _Loop(start=start, cache={r.key: r for r in self.records if r.phase == "search"},
                     probes=sum(1 for r in self.records if r.phase in ("search", "recheck") and r.probed))
        # the baseline (the config a user would type) is probed like any other once the seeds are
        # under way (a cold start's slowness falls on a seed): inside the space as an enqueued trial
        # (origin "baseline"), outside it as an extra probe the sampler does not see
        if self.baseline is not None:
            bkey = candidate_id(self.baseline)
            self._origins[bkey] = "baseline"
            internal = self.sampler.params_of(self.baseline)
            if internal is None:
                loop.outside.add(bkey)
            if bkey not in loop.cache:
                waiting = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                           if t.user_attrs.get("origin") == "baseline"]
                if internal is not None and not waiting:
                    loop.enqueue_baseline = internal
                elif internal is None:
                    loop.extra.append(self.baseline)
        for choice in self.seed_choices:
            built_seed = candidate_from_choice(choice, effective_batch=self.effective_batch)
            if isinstance(built_seed, Candidate):
                loop.seed_keys.add(candidate_id(built_seed))
        return loop

    def _time_left(self, loop: _Loop) -> float | None:
        if self.time_budget_s is None:
            return None
        return self.time_budget_s - (self.clock() - loop.start)

    def _why_stop(self, loop: _Loop) -> str:
        """Why no further probe may start now ("" when one may)."""
        if loop.probes + len(loop.in_flight) >= self.max_trials:
            return f"max trials ({self.max_trials}) reached"
        # the space's configurations seen or in flight (a re-measure in flight is one seen already)
        seen = {k for k in loop.cache if not k.startswith("skip-")} | set(loop.in_flight_keys)
        if self.distinct is not None and len(seen - loop.outside) >= self.distinct:
            return f"space exhausted (all {self.distinct} distinct configurations seen)"
        if loop.idle_asks >= _MAX_IDLE_ASKS:
            return f"space exhausted (the sampler proposed only seen configurations {loop.idle_asks} times)"
        if self.policy.stop_when_converged and self._converged(loop):
            return ("converged: the best configuration's one-lever neighbours, their combination and its "
                    "boundary moves were measured and none beat it")
        left = self._time_left(loop)
        if left is not None:
            # measured walls; before any probe has landed, the predicted probe time
            per_probe = self._median_probe_wall() or (
                self.deadlines.expected_s() if self.deadlines is not None else None) or 0.0
            # the confirmation to come: the contenders that can exist once this probe lands, and the baseline
            measured = sum(1 for r in self.records if r.phase == "search" and r.probed and r.status == "ok")
            contenders = min(self.top_k, measured + 1)
            rounds = self.confirm.rounds_for(contenders)
            reserve = per_probe * (contenders + 1) * rounds * 1.5 / max(1, self.executor.slots)
            if left <= per_probe + reserve:
                return "time budget reached"
        return ""

    def _converged(self, loop: _Loop) -> bool:
        """The walk has settled, every seed and the HF-default baseline are measured (the answer's "x over
        default"), and nothing is in flight."""
        if loop.in_flight or loop.enqueue_baseline is not None or loop.extra or not loop.seed_keys <= set(loop.cache):
            return False
        if self.baseline is not None and candidate_id(self.baseline) not in loop.cache:
            return False
        return self.sampler.converged(self.study)

    def _fill(self, loop: _Loop) -> None:
        """Start probes until the slots are full, a stop applies, or the strategy waits for a landing."""
        while len(loop.in_flight) < max(1, self.executor.slots):
            loop.stop_reason = self._why_stop(loop)
            if loop.stop_reason:
                break
            if loop.enqueue_baseline is not None and loop.seed_keys <= set(loop.cache) | set(loop.in_flight_keys):
                self.study.enqueue_trial(loop.enqueue_baseline, user_attrs={"origin": "baseline"})
                loop.enqueue_baseline = None
            if loop.extra and (loop.probes > 0 or not self.seed_choices):
                # after the first probe has landed: a cold start's slowness falls on a seed
                cand = loop.extra.pop(0)
                key = candidate_id(cand)
                if key not in loop.cache and key not in loop.in_flight_keys:
                    self._launch(loop, _InFlight(None, cand, key, {}))
                continue
            if self.sampler.waiting(self.study):
                if not loop.in_flight:  # a scripted strategy (largest-fits, deepspeed) has run its course
                    loop.stop_reason = self.sampler.stop_text(self.study)
                break
            self._ask(loop)

    def _ask(self, loop: _Loop) -> None:
        """One ask: told at once (a skip, a duplicate, an inference), parked behind a probe of the same
        key in flight, or launched."""
        trial = self.study.ask()
        choice = self.sampler.suggest_choice(trial)
        params = self.sampler.plain_params(choice)
        built = candidate_from_choice(choice, effective_batch=self.effective_batch)
        remeasure = bool(trial.user_attrs.get("remeasure"))
        if isinstance(built, Skip):
            loop.idle_asks += 1
            rec = loop.cache.get(built.key)
            if rec is None:
                rec = self._add(_records.skipped(built, params, choice=choice, origin=self._origin(built.key, trial)))
                loop.cache[built.key] = rec
                self._emit_record(loop, rec)
            self._tell(trial, rec)
            return
        cand, key = built, candidate_id(built)
        self._origins.setdefault(key, self._origin(key, trial))
        if key in loop.cache and not (remeasure and loop.cache[key].probed and key not in loop.in_flight_keys):
            # duplicate ask: answer from the cache, never probe twice (unless the sampler asks
            # for a re-measure: a would-be walk centre within the noise of the current one)
            loop.idle_asks += 1
            self._tell(trial, loop.cache[key])
            return
        if key in loop.in_flight_keys:
            loop.idle_asks += 1
            loop.waiters.setdefault(key, []).append(trial)
            return
        status, reason = self._inferred_status(cand, loop.cache)
        if status:
            loop.idle_asks += 1
            rec = self._add(_records.inferred(key, cand, params, status=status, reason=reason,
                                              origin=self._origin(key, trial)))
            loop.cache[key] = rec
            self._tell(trial, rec)
            self._emit_record(loop, rec)
            return
        loop.idle_asks = 0
        self._launch(loop, _InFlight(trial, cand, key, params, remeasure=remeasure))

    def _inferred_status(self, cand: Candidate, cache: dict[str, TrialRecord]) -> tuple[str, str]:
        """(status, reason) of a configuration known not to fit without probing it; ("", "") to probe it."""
        proof = infer_infeasible(cand, cache.values())
        if proof is not None:
            pc = proof.candidate or {}
            return proof.status, (
                f"inferred: micro_batch {pc.get('micro_batch')} with the same other choices was "
                f"{proof.status}" + (f" ({proof.reason})" if proof.reason else "")
            )
        if self.pruner is not None:
            pruned = self.pruner(cand)
            if pruned:
                return "over_budget", f"inferred: {pruned}"
        return "", ""

    def _launch(self, loop: _Loop, probe: _InFlight) -> None:
        """Submit a search probe (an asked trial's, or the baseline outside the space)."""
        ticket = self._submit(probe.candidate)
        loop.in_flight[ticket] = probe
        loop.in_flight_keys[probe.key] = ticket
        loop.submitted_at[ticket] = self.clock()
        self._emit("submit", label=candidate_label(probe.candidate), key=probe.key, in_flight=len(loop.in_flight),
                   probes=loop.probes + len(loop.in_flight), max_trials=self.max_trials,
                   time_left=self._time_left(loop))

    def _collect(self, loop: _Loop) -> None:
        """Wait for landings (up to the poll interval); record and tell each."""
        landed = self.executor.poll(timeout=self.poll_interval_s)
        if not landed:
            self._emit("tick", in_flight=len(loop.in_flight), time_left=self._time_left(loop),
                       best=self._best_so_far())
        for ticket, result in landed:
            if ticket in loop.in_flight:
                self._land(loop, ticket, result)

    def _retry(self, phase: str, key: str, label: str, result: ProbeResult) -> bool:
        """Whether to probe again a configuration whose process died (``ProbeResult.died``): once per
        configuration and phase, before the crash counts; said as a note."""
        if not result.died or (phase, key) in self._retried:
            return False
        self._retried.add((phase, key))
        self._emit("note", text=f"{label}: {result.reason}; probing it once more before the crash counts")
        return True

    def _land(self, loop: _Loop, ticket: str, result: ProbeResult) -> None:
        probe = loop.in_flight.pop(ticket)
        result = self._landed(ticket, result)
        loop.in_flight_keys.pop(probe.key, None)
        if self._retry("search", probe.key, candidate_label(probe.candidate), result):
            loop.submitted_at.pop(ticket, None)
            self._submitted_wall.pop(ticket, None)
            self._launch(loop, probe)
            return
        self._durations.append(self.clock() - loop.submitted_at.pop(ticket))
        loop.probes += 1
        label = candidate_label(probe.candidate)
        warnings = self._check_load("during", self._submitted_wall.pop(ticket, None), label)
        rec = _records.measured(probe.key, probe.candidate, probe.params, result,
                                phase="recheck" if probe.remeasure else "search",
                                origin="recheck" if probe.remeasure else self._origin(probe.key, probe.trial),
                                warnings=warnings)
        self._note_noisy_composition(rec, result)
        rec = self._add(rec)
        if not probe.remeasure:
            loop.cache[probe.key] = rec
        if probe.trial is not None:
            self._tell(probe.trial, rec, measured=True)
        for waiter in loop.waiters.pop(probe.key, []):
            self._tell(waiter, rec)
        self._emit_record(loop, rec)

    def _emit_record(self, loop: _Loop, rec: TrialRecord) -> None:
        self._emit("record", record=rec, best=self._best_so_far(), counts=self._counts(),
                   time_left=self._time_left(loop), **self._progress_counts(loop))

    def _probe_budget(self) -> int:
        """The search probes this run may make: --max-trials, or fewer when the space has fewer configurations."""
        return min(self.max_trials, self.distinct) if self.distinct else self.max_trials

    def _progress_counts(self, loop: _Loop) -> dict[str, Any]:
        """``probes`` landed of ``probe_budget``, and ``eta_s``: the search probes left and the confirmation's,
        at the median wall of the probes measured so far, over the slots (None before any has landed)."""
        per = self._median_probe_wall() if self._durations else None
        budget = self._probe_budget()
        if self.distinct and self.distinct <= self.max_trials:
            budget += len(loop.outside)  # the HF default outside the space is probed beyond it ("probe 3/2")
        left = max(0, budget - loop.probes)
        confirm = confirmation_probes(self.top_k, self.baseline is not None, self.confirm.rounds_for(self.top_k),
                                      search_probes=self._probe_budget())
        eta = None if per is None else per * (left + confirm) / max(1, self.executor.slots)
        return {"probes": loop.probes, "probe_budget": max(budget, loop.probes), "eta_s": eta}

    # ---------------------------------------------------------------- confirmation

    def _confirm_values(self, key: str) -> list[TrialRecord]:
        """This process's re-measurements of ``key`` (a resumed run re-measures them as a block)."""
        return [r for r in self.records if r.phase == "confirm" and r.key == key and r.session == self.session]

    def _run_round(self, group: list[TrialRecord], round_index: int) -> None:
        """Re-measure every candidate of ``group`` once, in this round's interleaved order."""
        by_key = {r.key: r for r in group}
        queue = interleaved_order([r.key for r in group], round_index)
        in_flight: dict[str, TrialRecord] = {}
        while queue or in_flight:
            while queue and len(in_flight) < max(1, self.executor.slots):
                rec = by_key[queue.pop(0)]
                cand = rec.candidate_obj()
                assert cand is not None
                ticket = self._submit(cand, confirm=True)
                in_flight[ticket] = rec
                self._emit("submit", label=rec.label, key=rec.key, phase="confirm", round=round_index + 1,
                           in_flight=len(in_flight))
            for ticket, result in self.executor.poll(timeout=self.poll_interval_s):
                if ticket not in in_flight:
                    continue
                rec = in_flight.pop(ticket)
                result = self._landed(ticket, result)
                if self._retry(f"confirm {round_index}", rec.key, rec.label, result):
                    self._submitted_wall.pop(ticket, None)
                    queue.insert(0, rec.key)
                    continue
                cand = rec.candidate_obj()
                assert cand is not None
                warnings = self._check_load("during", self._submitted_wall.pop(ticket, None), rec.label)
                new = _records.measured(rec.key, cand, rec.params, result, phase="confirm", repeat=round_index,
                                        origin=rec.origin, session=self.session, warnings=warnings)
                self._note_noisy_composition(new, result)
                self._add(new)
                self._emit("record", record=new, best=self._best_so_far(), counts=self._counts(), time_left=None)

    def _entry(self, rec: TrialRecord, rounds_done: int) -> dict[str, Any]:
        return _rank_entry(rec, self._confirm_values(rec.key), self.confirm, rounds_done)

    def _confirm_group(self, group: list[TrialRecord], bkey: str | None = None) -> list[dict[str, Any]]:
        """Interleaved rounds over ``group`` (``bkey``: the baseline's key among them) until every candidate is
        settled or the cap is reached."""
        earlier = [r for r in self.records if r.phase == "confirm" and r.session != self.session
                   and r.key in {g.key for g in group}]
        if earlier:
            self._emit("note", text=f"confirmation re-measured as a block: {len(earlier)} value(s) from before "
                                    "the interruption are kept in the journal, not in the figures")
        rounds = 0
        active = list(group)
        while active and rounds < self.confirm.max_rounds:
            self._emit("confirm", count=len(active), steps=self.confirm_steps, round=rounds + 1,
                       max_rounds=self.confirm.max_rounds, tolerance=self.confirm.tolerance)
            self._run_round(active, rounds)
            rounds += 1
            entries = {r.key: self._entry(r, rounds) for r in active}
            # a candidate that does not fit drops out; the others stay together while any is pending,
            # so that every round measures them side by side, and two or more contenders are ranked on at
            # least the policy's contest rounds (on CPU two: one round alone cannot tell a tie from a win)
            active = [r for r in active if entries[r.key]["status"] != "failed_confirm"]
            contenders = sum(1 for r in active if r.key != bkey)
            if rounds < self.confirm.rounds_for(contenders):
                continue
            if not any(entries[r.key]["status"] == "pending" for r in active):
                break
        return [self._entry(r, max(rounds, 1) if self.confirm.max_rounds else 0) for r in group]

    def _confirm(self) -> tuple[list[dict[str, Any]], ProbeResult | None, TrialRecord | None]:
        self._tie = []
        ok = sorted(
            (r for r in self.records if r.phase == "search" and r.probed and r.status == "ok" and r.tokens_per_s),
            key=lambda r: -(r.tokens_per_s or 0.0),
        )
        if not ok:
            return [], None, None
        if self.top_k == 0 or self.confirm.max_rounds == 0:
            first = ok[0]
            entry = _rank_entry(first, [], dataclasses.replace(self.confirm, include_search=True, min_rounds=0,
                                                                max_rounds=0), 0)
            entry["status"] = "unconfirmed"
            entry["reason"] = "confirmation is off (top_k 0 or no rounds)"
            return [entry], _best_result(first, [], entry), first
        bkey = candidate_id(self.baseline) if self.baseline is not None else None
        reference = dataclasses.asdict(self.baseline) if self.baseline is not None else None
        ranking: list[dict[str, Any]] = []
        start = 0
        winner: dict[str, Any] | None = None
        while start < len(ok):
            group = ok[start : start + self.top_k]
            if self.sampler.strategy == "model":
                # only the contenders: those whose search measurement lies within the noise tolerance of the
                # best's (the model strategy measured around the best already; the others are decided)
                group = [r for r in group if (r.tokens_per_s or 0.0) * (1.0 + self.confirm.tolerance)
                         >= (ok[0].tokens_per_s or 0.0)] or group[:1]
            if start == 0 and bkey is not None:
                # the baseline is re-measured in the same rounds, so "best vs baseline" compares
                # medians measured side by side
                group += [r for r in ok if r.key == bkey and r not in group]
            start += self.top_k
            entries = self._confirm_group(group, bkey)
            ranking += entries
            winner, tied = choose_winner(ranking, reference, ties=self.confirm.ties, baseline_key=bkey,
                                         search_tolerance=self.confirm.tolerance if self.confirm.search_agrees else None,
                                         tolerance=self.confirm.tolerance)
            if winner is not None:
                if tied:
                    self._tie = [e["label"] for e in tied if e is not winner]
                    for e in tied:
                        e["indistinguishable"] = True
                break
        if winner is None:
            return ranking, None, None
        order = {"confirmed": 0, "noisy": 1, "unconfirmed": 2, "failed_confirm": 3}
        ranking.sort(key=lambda e: (e is not winner, order.get(e["status"], 4), -(e["median_tokens_per_s"] or 0.0)))
        best_record = next(r for r in ok if r.key == winner["key"])
        best = _best_result(best_record, self._confirm_values(winner["key"]), winner)
        return ranking, best, best_record


def _check_arguments(effective_batch: Any, max_trials: Any, time_budget_s: float | None, top_k: int) -> None:
    """The Searcher's own arguments, each problem named (one SpecError for all of them)."""
    problems = []
    if isinstance(effective_batch, bool) or not isinstance(effective_batch, int) or effective_batch < 1:
        problems.append(f"effective batch must be an integer >= 1; got {effective_batch!r}")
    if isinstance(max_trials, bool) or not isinstance(max_trials, int) or max_trials < 1:
        problems.append(f"max trials must be an integer >= 1; got {max_trials!r}")
    if time_budget_s is not None and time_budget_s <= 0:
        problems.append(f"time budget must be positive; got {time_budget_s!r} s")
    if top_k < 0:
        problems.append(f"top_k must be >= 0; got {top_k}")
    if problems:
        raise SpecError(problems)


def _probe_seconds(deadlines: Deadlines | None, settings: ProbeSettings) -> Callable[[Candidate], float | None] | None:
    """A search probe's predicted seconds under ``settings`` (the run's probe-time predictor, as its deadlines
    use it), for the model strategy's cost per probe; None without a predictor."""
    if deadlines is None or deadlines.predictor is None:
        return None
    return lambda c: deadlines.predict(c, settings)


def _usable_shapes(space: SearchSpace, effective_batch: int, max_world: int | None) \
        -> tuple[list[int], list[int], list[Any]]:
    """The world sizes and micro-batches of ``space`` this run can use, and the choices dropped (with why);
    SpecError when none is left of either."""
    worlds, dropped_w = usable_worlds(space, max_world)
    mbs, dropped_mb = usable_micro_batches(space, effective_batch, worlds)
    if not worlds:
        raise SpecError(
            f"no gpus_per_trial choice in {list(space.gpus_per_trial)} fits the {max_world} GPU(s) available"
        )
    if not mbs:
        raise SpecError(
            f"no micro_batch in {list(space.micro_batch)} divides the effective batch {effective_batch} "
            f"with gpus_per_trial {worlds}; choose an effective batch that is a multiple of one of them"
        )
    return worlds, mbs, dropped_w + dropped_mb


def _rank_entry(search: TrialRecord, confirms: list[TrialRecord], policy: ConfirmPolicy,
                rounds_done: int) -> dict[str, Any]:
    """A candidate's confirmed figure: the median of its re-measurements (never the search value,
    unless the policy says so), their spread and range, and its status (see search._confirm)."""
    measured = [c for c in confirms if c.status == "ok" and c.tokens_per_s]
    # a re-measurement during which the load monitor saw other work is set aside while clean ones
    # exist: another round replaces it (up to the cap), so a passing burst does not become the figure
    clean = [c for c in measured if not c.warnings]
    confirmed_ok = clean or measured
    values = [float(c.tokens_per_s) for c in confirmed_ok if c.tokens_per_s]
    failed_fit = [c for c in confirms if c.status in MEMORY_INFEASIBLE]
    other = [c for c in confirms if c.status != "ok" and c.status not in MEMORY_INFEASIBLE]
    status, reason = confirmation_status(
        values, rounds_done=rounds_done, policy=policy,
        memory_failure=f"{failed_fit[0].status}: {failed_fit[0].reason}" if failed_fit else "",
        other_failure=f"{other[0].status}: {other[0].reason}" if other else "",
        search_value=search.tokens_per_s,
    )
    if measured and not clean and status in ("confirmed", "pending") and rounds_done >= policy.max_rounds:
        status, reason = "noisy", f"every re-measurement ran while other work loaded the machine ({len(measured)})"
    elif measured and not clean and status == "confirmed":
        status = "pending"
    elif len(clean) < len(measured) and status == "confirmed":
        reason = f"{len(measured) - len(clean)} re-measurement(s) under other load set aside"
    elif len(clean) < len(measured) and status == "noisy" and len(values) == 1:
        reason = (f"only one re-measurement ran free of other load ({len(measured) - len(clean)} under it set "
                  f"aside)" + (f"; {other[0].status}: {other[0].reason}" if other else ""))
    noisy = [c for c in confirmed_ok if ((c.result or {}).get("metrics") or {}).get("composition_noisy")]
    if status == "confirmed" and confirmed_ok and len(noisy) == len(confirmed_ok):
        status, reason = "noisy", "every re-measurement's composed figure was too noisy to combine"
    elif status == "confirmed" and noisy:
        reason = f"{len(noisy)} re-measurement(s) with a noisy composition"
    measurements = ([float(search.tokens_per_s or 0.0)] if policy.include_search else []) + values
    peaks = [p for p in [search.peak_mem_bytes] + [c.peak_mem_bytes for c in confirms] if p is not None]
    spreads = [c.step_time_spread for c in confirmed_ok if c.step_time_spread is not None]
    load = sorted({w for c in confirms for w in (c.warnings or [])})
    return {
        "key": search.key,
        "label": search.label,
        "candidate": search.candidate,
        "status": status,
        "reason": reason,
        "search_tokens_per_s": search.tokens_per_s,
        "confirm_tokens_per_s": values,
        "measurements": measurements,
        "median_tokens_per_s": median(measurements) if measurements else None,
        "spread": relative_spread(measurements),
        "range": list(measured_range(measurements)) if measurements else None,
        # every round's value (spoiled or not) and which rounds saw other load: comparisons pair rounds and
        # leave the loaded ones out while a clean one remains (search._confirm)
        "by_round": {int(c.repeat): float(c.tokens_per_s) for c in measured if c.tokens_per_s},
        "loaded_rounds": sorted(int(c.repeat) for c in measured if c.warnings),
        "rounds": rounds_done,
        "step_time_spread": max(spreads) if spreads else search.step_time_spread,
        "peak_mem_bytes": max(peaks) if peaks else None,
        "load_warnings": load,
    }


def _best_result(search: TrialRecord, confirms: list[TrialRecord], entry: dict[str, Any]) -> ProbeResult:
    ok = [c for c in confirms if c.status == "ok" and c.tokens_per_s and c.result]
    med = entry["median_tokens_per_s"]
    chosen = min(ok, key=lambda c: abs((c.tokens_per_s or 0.0) - med)) if ok and med is not None else search
    result = ProbeResult.from_dict(chosen.result or {})
    result.metrics = dict(result.metrics)
    result.metrics.update(
        {
            "confirmed_tokens_per_s": med,
            "tokens_per_s_measurements": entry["measurements"],
            "tokens_per_s_range": entry["range"],
            "search_tokens_per_s": entry["search_tokens_per_s"],
            "measurement_spread": entry["spread"],
            "confirm_status": entry["status"],
            "confirm_rounds": entry["rounds"],
        }
    )
    if entry["peak_mem_bytes"] is not None:
        result.metrics["peak_mem_bytes_max"] = entry["peak_mem_bytes"]
    return result
