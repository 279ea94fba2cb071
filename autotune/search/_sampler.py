"""autotune's proposal policy as an Optuna sampler: ``AutotuneSampler``.  [pure + optuna]

Every decision is a function of the study's trials (in trial-number order) and the sampler's
seed, so a new sampler over the same storage (``autotune run --resume``) proposes what the
interrupted one would have: nothing is kept between asks that the trials do not hold. What
proposed each trial is its user attribute ``origin``.

The sampler owns the one mapping between the space and Optuna's parameters (``suggest_choice``,
``plain_params``, ``to_optuna``, ``params_of``, ``choice_of``): the ``Searcher`` asks, records and
restores trials through it. The trials' records it rebuilds come from one replay (``replay``).

Strategies (``strategy=``):

``walk`` (the default)
    the expert seeds (``expert_seeds``; a seed over budget is followed by its own step-down, the
    same levers at the next smaller micro-batch, before the next seed), then the memory-boundary step-downs and the
    neighbourhood walk around the best configuration (``_walk.FollowUps``, rebuilt by replaying
    the trials; a would-be centre within the noise of the current one is re-measured first:
    ``recheck``), then the base sampler (TPE); when the base keeps proposing configurations the
    study has seen, an unseen one (``coverage``).
``model``
    a model fitted to the run's own probes ranks every configuration (``_model.ModelPolicy``): the
    expert seeds, then the configuration with the highest expected gain over the best measured, weighed
    by its chance to fit, until none has a worthwhile chance of fitting and beating the best by more than
    the margin; then nothing more (``finished``, with the model's reason: ``stop_text``).
``tpe``
    the base sampler alone (with ``coverage`` when it keeps repeating itself).
``random``
    uniformly, configurations not seen yet.
``grid``
    every configuration once, in an order shuffled by the seed.
``largest-fits`` (HF ``auto_find_batch_size`` / Lightning ``BatchSizeFinder``)
    every knob at the defaults (``baseline``), the micro-batch from the default (8) up while it
    fits, down while it does not; then nothing more (``finished``).
``deepspeed`` (DeepSpeed autotuning's strategy)
    for each ZeRO stage (or, without a ZeRO dimension: without then with checkpointing), at the
    defaults, the largest micro-batch that fits, doubling from the smallest; the largest and its
    lower neighbour re-measured; the next stage only while the last improved the best by >= 5 %.

The objective tells a trial's throughput as its value; a configuration that does not fit is
told 0 (or with user attribute ``status`` ``oom`` / ``over_budget``), and a crash is a FAIL.
A re-measure (origin ``recheck``) proposes a configuration seen before: the objective must
measure it again (user attribute ``remeasure`` is True), not answer from a cache.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from autotune.search import _records
from autotune.search._logic import (
    CONDITIONAL_KNOBS,
    ORDERED_KNOBS,
    TrialRecord,
    candidate_from_choice,
    candidate_id,
    candidate_label,
    derive_grad_accum,
    expert_seeds,
    infer_infeasible,
    median,
    runnable_candidates,
    usable_micro_batches,
    usable_worlds,
)
from autotune.search._model import (
    CPU_NOISE_SD,
    MARGIN,
    NOISE_SD,
    ModelPolicy,
    ModelStop,
    Option,
    Row,
    worth_a_probe,
)
from autotune.search._strategies import STRATEGIES
from autotune.search._walk import FollowUps
from autotune.spec.levers import inactive
from autotune.spec.probe_request import Candidate
from autotune.spec.space import DIMENSIONS, SearchSpace

if TYPE_CHECKING:
    from autotune.estimate import CostPrior

__all__ = ["AutotuneSampler", "SamplerSettings", "STRATEGIES", "Observation"]

NUDGE_EVERY = 8  # the base sampler repeated seen configurations this many times in a row: coverage
_NOT_PROPOSED = ("baseline", "enqueued")  # origins the policy did not choose (the scripts skip them)

BaseFactory = Callable[[int], BaseSampler]
# a scripted strategy: yields (candidate, origin) to measure, is sent its tok/s (None: did not fit)
Script = Generator[tuple[Candidate, str], "float | None", None]


@dataclass(frozen=True)
class Observation:
    """A finished trial as the policy sees it."""

    number: int
    key: str
    candidate: Candidate | None
    params: dict[str, Any]
    status: str
    value: float
    measured: bool  # a probe measured it (not answered from a cache, inferred or skipped)
    origin: str
    memory: float | None = None  # the memory constraint told: (peak - usable) / usable; None: not measured

    def record(self) -> TrialRecord:
        return _records.observed(key=self.key, status=self.status, params=self.params, origin=self.origin,
                                 candidate=self.candidate, value=self.value, was_measured=self.measured)


def tpe_factory(*, n_startup_trials: int = 10, multivariate: bool = True) -> BaseFactory:
    """A base-sampler factory: TPE seeded with the given seed (one per trial)."""

    def make(seed: int) -> BaseSampler:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials,
                                              multivariate=multivariate, group=multivariate)

    return make


@dataclass(frozen=True)
class SamplerSettings:
    """How an ``AutotuneSampler`` proposes (its docstring says what each setting does).

    ``max_world``: the GPUs available (None: no limit on ``gpus_per_trial``); ``seeds``: the most expert
    seeds; ``variable_lengths``: a length distribution or a real dataset (the seeds pack sequences);
    ``follow_ups`` / ``neighbours``: the walk's step-downs / its neighbourhood moves; ``ordinal``: ordered
    knobs suggested as an index into their sorted choices instead of as categories; ``prior``: what the
    estimator predicts before any probe, for the model strategy; ``probe_seconds``: a probe's predicted
    seconds (the model strategy weighs what a probe may gain by what it costs; None, or a configuration it
    cannot predict: every probe costs the same)."""

    strategy: str = "walk"
    seed: int = 42
    base: BaseFactory | None = None
    device: str = "cuda"
    max_world: int | None = None
    seeds: int = 3
    variable_lengths: bool = True
    baseline: Candidate | None = None
    defaults: Candidate | None = None
    recheck_tolerance: float | None = None
    follow_ups: bool = True
    neighbours: bool = True
    ordinal: bool = False
    prior: CostPrior | None = None  # the model strategy's prior (``autotune.estimate.CostPrior``); None: flat
    probe_seconds: Callable[[Candidate], float | None] | None = None  # a probe's predicted seconds


class AutotuneSampler(BaseSampler):
    """The proposal policy over an autotune search space (see the module docstring).

    ``settings`` (a ``SamplerSettings``; or its fields as keywords, the earlier form:
    ``AutotuneSampler(space, effective_batch=16, seed=0)``, each overriding ``settings``).
    ``base`` makes the fallback sampler from a seed; each fallback proposal gets a fresh one seeded
    by (seed, trial number), so it is a function of the trials too. ``baseline`` is the
    configuration a user would type: never a walk centre, and the defaults of ``largest-fits`` and
    ``deepspeed`` (unless ``defaults`` is given; without either, each knob's first choice). ``recheck_tolerance``: re-measure a would-be walk centre that beats the current
    one by less than this share (``ConfirmPolicy.tolerance``); None never re-measures.
    """

    def __init__(
        self,
        space: SearchSpace,
        settings: SamplerSettings | None = None,
        *,
        effective_batch: int,
        **options: Any,
    ) -> None:
        settings = dataclasses.replace(settings or SamplerSettings(), **options)
        self.settings = settings
        strategy, seed, device = settings.strategy, settings.seed, settings.device
        baseline = settings.baseline
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        worlds, _ = usable_worlds(space, settings.max_world)
        mbs, _ = usable_micro_batches(space, effective_batch, worlds)
        if not worlds or not mbs:
            raise ValueError(f"no micro_batch x gpus_per_trial of the space divides the effective batch {effective_batch}")
        self.space = space
        self.effective_batch = effective_batch
        self.strategy = strategy
        self.seed = seed
        self.base = settings.base or tpe_factory()
        self.device = device
        self.worlds = worlds
        self.micro_batches = mbs
        self.baseline = baseline
        self.baseline_key = candidate_id(baseline) if baseline is not None else None
        self.default_knobs = settings.defaults if settings.defaults is not None else baseline
        self.recheck_tolerance = settings.recheck_tolerance
        self.follow_ups = settings.follow_ups
        self.neighbours = settings.neighbours
        self.choices: dict[str, list[Any]] = {}
        self.distributions: dict[str, BaseDistribution] = {}
        self.fixed: dict[str, Any] = {}
        for d in DIMENSIONS:
            choices = mbs if d == "micro_batch" else worlds if d == "gpus_per_trial" else list(space.choices(d))
            if len(choices) > 1:
                if d in ORDERED_KNOBS and settings.ordinal:
                    choices = sorted(choices)
                    self.distributions[d] = IntDistribution(0, len(choices) - 1)
                else:
                    self.distributions[d] = CategoricalDistribution(choices)
                self.choices[d] = list(choices)
            else:
                self.fixed[d] = choices[0]
        self.seed_choices = expert_seeds(space, effective_batch=effective_batch, micro_batches=mbs, worlds=worlds,
                                         device=device, limit=settings.seeds,
                                         variable_lengths=settings.variable_lengths) \
            if strategy == "walk" else []
        self._all: list[tuple[dict[str, Any], Candidate]] | None = None
        self._bases: dict[int, BaseSampler] = {}
        self._policy: ModelPolicy | None = None
        self._options: dict[str, Option] = {}
        self._keyed: dict[str, Candidate] | None = None
        self._memo: tuple[Any, tuple[str | None, ModelStop | None]] | None = None

    # ------------------------------------------------------------------ space <-> params (the one mapping)

    def choice_of(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A full choice (every dimension) from a trial's params (plain values)."""
        choice = dict(self.fixed)
        for d, v in params.items():
            if d in self.distributions:
                choice[d] = self.choices[d][v] if isinstance(self.distributions[d], IntDistribution) else v
        for d in DIMENSIONS:  # offload/sharding are not suggested without a ZeRO stage
            if d not in choice:
                choice[d] = self.choices[d][0] if d in self.choices else getattr(Candidate, d, None)
        return choice

    def suggest_choice(self, trial: optuna.Trial) -> dict[str, Any]:
        """Suggest every searched knob on ``trial`` (offload and sharding only with a ZeRO stage) and return
        the choice in plain values: the fixed knobs, then the suggested ones (``candidate_from_choice`` builds it)."""
        choice: dict[str, Any] = dict(self.fixed)
        for d in self.distributions:
            if d not in CONDITIONAL_KNOBS:
                choice[d] = self._suggest_one(trial, d)
        for d in CONDITIONAL_KNOBS:  # suggested only where they act (offload and sharding with a ZeRO stage)
            if d in self.distributions and not inactive(d, choice):
                choice[d] = self._suggest_one(trial, d)
        return choice

    def _suggest_one(self, trial: optuna.Trial, d: str) -> Any:
        dist = self.distributions[d]
        if isinstance(dist, IntDistribution):  # ordinal: an index into the sorted choices
            return self.choices[d][trial.suggest_int(d, dist.low, dist.high)]
        return trial.suggest_categorical(d, self.choices[d])

    def suggest(self, trial: optuna.Trial) -> Candidate | None:
        """``suggest_choice``'s configuration; None when the combination cannot run (tell it 0: it is not
        proposed again). Whether it is a re-measure: ``trial.user_attrs.get("remeasure")``."""
        built = candidate_from_choice(self.suggest_choice(trial), effective_batch=self.effective_batch)
        return built if isinstance(built, Candidate) else None

    def candidate_of(self, params: Mapping[str, Any]) -> Candidate | None:
        built = candidate_from_choice(self.choice_of(params), effective_batch=self.effective_batch)
        return built if isinstance(built, Candidate) else None

    def plain_params(self, choice: Mapping[str, Any]) -> dict[str, Any]:
        """The searched knobs' values of a choice, in plain values (what a ``TrialRecord`` keeps); offload and
        sharding only with a ZeRO stage."""
        params = {d: v for d, v in choice.items() if d in self.distributions}
        for d in CONDITIONAL_KNOBS:
            if inactive(d, choice):
                params.pop(d, None)
        return params

    def to_optuna(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """Plain values -> Optuna's params (indices for ordinal knobs); None if outside this space."""
        out: dict[str, Any] = {}
        for d, v in params.items():
            if d not in self.distributions or v not in self.choices[d]:
                return None
            out[d] = self.choices[d].index(v) if isinstance(self.distributions[d], IntDistribution) else v
        return out

    def params_of(self, cand: Candidate) -> dict[str, Any] | None:
        """Optuna params (internal repr) that produce exactly ``cand``; None when outside the space."""
        choice = {d: getattr(cand, d) for d in DIMENSIONS if d != "gpus_per_trial"}
        choice["gpus_per_trial"] = cand.world_size
        if any(choice[d] != v for d, v in self.fixed.items()):
            return None
        built = candidate_from_choice(choice, effective_batch=self.effective_batch)
        if not isinstance(built, Candidate) or candidate_id(built) != candidate_id(cand):
            return None
        return self.to_optuna(self.plain_params(choice))

    def _all_candidates(self) -> list[tuple[dict[str, Any], Candidate]]:
        """Every distinct runnable configuration (first choice producing it), in the space's order."""
        if self._all is None:
            self._all = list(runnable_candidates(self.space, effective_batch=self.effective_batch,
                                                 micro_batches=self.micro_batches, worlds=self.worlds))
        return self._all

    # ------------------------------------------------------------------ the trials

    def observations(self, study: Study) -> tuple[list[Observation], set[str]]:
        """Finished trials (by number) and the keys of the running ones that have params."""
        obs: list[Observation] = []
        running: set[str] = set()
        for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
            if t.state == TrialState.RUNNING:
                cand = self.candidate_of(t.params) if t.params else None
                if cand is not None:
                    running.add(candidate_id(cand))
                continue
            if t.state not in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED) or t.user_attrs.get("interrupted"):
                continue  # waiting, or in flight when a run was killed (not evidence: it is proposed again)
            cand = self.candidate_of(t.params)
            key = t.user_attrs.get("key") or (candidate_id(cand) if cand is not None else f"skip-{t.number}")
            value = float(t.value) if t.state == TrialState.COMPLETE and t.value is not None else 0.0
            status = t.user_attrs.get("status") or (
                "crash" if t.state != TrialState.COMPLETE else "ok" if value > 0 else "over_budget")
            obs.append(Observation(number=t.number, key=key, candidate=cand, params=dict(t.params), status=status,
                                   value=value, measured=bool(t.user_attrs.get("measured", True)),
                                   origin=str(t.user_attrs.get("origin", "")),
                                   memory=_measured_memory(t)))
        return obs, running

    @staticmethod
    def replay(obs: Sequence[Observation], cache: dict[str, TrialRecord]) -> Iterator[tuple[TrialRecord, int]]:
        """The trials' records as the trials land, in trial-number order: one per configuration (built from
        its first trial) in ``cache``, its tok/s the median of its measurements so far. Yields (record, how
        many measurements it has) after each trial that tells something new (not a repeat answered from a cache)."""
        values: dict[str, list[float]] = {}
        for o in obs:
            if o.measured and o.status == "ok":
                values.setdefault(o.key, []).append(o.value)
            rec = cache.get(o.key)
            if rec is None:
                rec = cache[o.key] = o.record()
            elif not o.measured:
                continue
            if o.key in values:
                rec.tokens_per_s = median(values[o.key])
            yield rec, len(values.get(o.key, [])) or 1

    @classmethod
    def records(cls, obs: Sequence[Observation]) -> list[TrialRecord]:
        """One record per configuration (first trial), tok/s the median of its measurements."""
        cache: dict[str, TrialRecord] = {}
        for _ in cls.replay(obs, cache):
            pass
        return list(cache.values())

    # ------------------------------------------------------------------ the policy

    def propose(self, study: Study, number: int) -> tuple[Candidate, str] | None:
        """What the policy proposes for trial ``number`` (None: the base sampler proposes)."""
        obs, running = self.observations(study)
        obs = [o for o in obs if o.number < number]
        salt = self.seed * 1_000_003 + self.position(study, number)
        seen = {o.key for o in obs} | running
        if self.strategy == "walk":
            for choice in self.seed_choices:
                c = candidate_from_choice(choice, effective_batch=self.effective_batch)
                if isinstance(c, Candidate) and candidate_id(c) not in seen:
                    if self.follow_ups and obs:
                        # a seed over budget: its own step-down (same levers, the next smaller
                        # micro-batch) before the next seed (the fast region is right below it)
                        _, cache = self._cache(obs)
                        step = self.replay_walk(obs).peek_step_down(cache, dict.fromkeys(running, ""))
                        if step is not None:
                            return step
                    return c, "seed"
            if self.follow_ups:
                walk = self.replay_walk(obs)
                _, cache = self._cache(obs)
                nxt = walk.peek(cache, dict.fromkeys(running, ""))
                if nxt is not None:
                    return nxt
        if self.strategy in ("walk", "tpe"):
            repeats = 0
            keys: set[str] = set()
            firsts = []
            for o in obs:
                firsts.append(o.key in keys and not o.measured)
                keys.add(o.key)
            for dup in reversed(firsts):
                if not dup:
                    break
                repeats += 1
            if repeats and repeats % NUDGE_EVERY == 0:
                c = self._unseen(seen, obs, random.Random(salt))
                if c is not None:
                    return c, "coverage"
            return None
        if self.strategy == "model":
            key, _ = self._model_step(obs, running)
            if key is None:
                return None
            return self._by_key()[key], "seed" if key in self.model_policy().first else "model"
        if self.strategy == "random":
            c = self._unseen(seen, obs, random.Random(salt))
            return (c, "random") if c is not None else None
        if self.strategy == "grid":
            order = list(self._all_candidates())
            random.Random(self.seed).shuffle(order)
            c = next((c for _, c in order if candidate_id(c) not in seen), None)
            return (c, "grid") if c is not None else None
        return self._scripted(obs, running)

    def converged(self, study: Study) -> bool:
        """The walk strategy has settled (``FollowUps.converged``): nothing in flight, and the best's
        neighbourhood closed without a better configuration (the Searcher checks that every seed landed)."""
        if self.strategy != "walk" or not self.follow_ups:
            return False
        obs, running = self.observations(study)
        return not running and bool(obs) and self.replay_walk(obs).converged()

    def waiting(self, study: Study) -> bool:
        """A scripted strategy has no proposal until a probe in flight lands, or none at all (``finished``)."""
        if self.strategy == "model":
            obs, running = self.observations(study)
            return self._model_step(obs, running)[0] is None
        if self.strategy not in ("largest-fits", "deepspeed"):
            return False
        obs, running = self.observations(study)
        return self._scripted(obs, running) is None

    def finished(self, study: Study) -> bool:
        """True when the strategy has nothing more to propose (``model``, ``largest-fits``, ``deepspeed``)."""
        if self.strategy not in ("model", "largest-fits", "deepspeed"):
            return False
        return not self.observations(study)[1] and self.waiting(study)

    def stop_text(self, study: Study) -> str:
        """Why the strategy proposes nothing more (the run's stop reason)."""
        if self.strategy == "model":
            stop = self._model_step(*self.observations(study))[1]
            if stop is not None:
                return stop.text
        return f"the {self.strategy} strategy has nothing more to propose"

    # ------------------------------------------------------------------ the model strategy

    def unfinished_text(self, study: Study) -> str:
        """A strategy stopped from outside (trials, time): what it would still have probed ("" when nothing was
        left worth a probe, and for the strategies that keep no such account)."""
        if self.strategy == "walk" and self.follow_ups:
            return self._walk_unfinished(study)
        if self.strategy != "model":
            return ""
        rows = self._rows(self.observations(study)[0])
        policy = self.model_policy()
        keys = {o.key for o in policy.options}
        if not any(r.status == "ok" and r.tokens_per_s > 0 and r.option.key in keys for r in rows):
            # nothing of the space measured (the HF default outside it, say): nothing was judged, nothing ruled out
            return (f"; the model had not started: none of the space's {len(policy.options)} configurations was "
                    "measured, so none was judged; more trials or time would have probed them")
        n, key, chance = policy.unfinished(rows)
        if not n or key is None:
            return ""
        return (f"; the model had not finished: {n} unprobed configuration(s) still had a {worth_a_probe():.0%} "
                f"chance or more of fitting and beating the best by more than {MARGIN:.0%} (the likeliest: "
                f"{candidate_label(self._by_key()[key])}, {chance:.0%}); more trials or time would have probed them")

    def _walk_unfinished(self, study: Study) -> str:
        """The walk stopped before it settled: how many configurations it had queued, and the next."""
        obs, _ = self.observations(study)
        walk = self.replay_walk(obs) if obs else None
        if walk is None or walk.converged():
            return ""
        queued = [*walk.step_downs, *walk.queue]
        if not queued:
            return "; the walk had not settled: the best configuration's neighbours were not all measured"
        return (f"; the walk had not settled: {len(queued)} configuration(s) queued around the best (the next: "
                f"{candidate_label(queued[0])}); more trials or time would have probed them")

    def lever_decisions(self, study: Study, winner: Candidate) -> list[dict[str, Any]]:
        """The model strategy's account of the winner's alternatives: each lever changed alone, measured by a
        probe or predicted by the model (``_model.LeverDecision``); [] for the other strategies."""
        if self.strategy != "model":
            return []
        obs, _ = self.observations(study)
        rows = self._rows(obs)
        return [d.to_dict() for d in self.model_policy().decisions(rows, candidate_id(winner), self.choices)]

    def _by_key(self) -> dict[str, Candidate]:
        """Every runnable configuration by its key (built once: the model strategy looks one up per ask)."""
        if self._keyed is None:
            self._keyed = {candidate_id(c): c for _, c in self._all_candidates()}
        return self._keyed

    def _option(self, choice: Mapping[str, Any], c: Candidate) -> Option:
        prior = self.settings.prior
        return Option(key=candidate_id(c), choice=self._searched(choice),
                      speed_prior=prior.speeds(c) if prior is not None else (0.0,),
                      memory_prior=prior.memory(c) if prior is not None else None)

    def _costed(self, options: dict[str, Option]) -> dict[str, Option]:
        """``options`` with each probe's predicted seconds as its cost; one the predictor cannot price costs the
        median of those it can (neither favoured nor shunned); none priced: all cost the same."""
        predict = self.settings.probe_seconds
        if predict is None:
            return options
        by_key = self._by_key()
        costs = {k: v for k in options if (v := predict(by_key[k])) is not None and v > 0}
        if not costs:
            return options
        middle = statistics.median(costs.values())
        return {k: dataclasses.replace(o, cost=float(costs.get(k, middle))) for k, o in options.items()}

    def model_policy(self) -> ModelPolicy:
        """The ``model`` strategy's policy over this space (built once): every runnable configuration as an
        ``Option`` with the prior's figures, the expert seeds first, the device's measurement noise."""
        if self._policy is None:
            first = []
            for choice in expert_seeds(self.space, effective_batch=self.effective_batch, micro_batches=self.micro_batches,
                                       worlds=self.worlds, device=self.device, limit=self.settings.seeds,
                                       variable_lengths=self.settings.variable_lengths):
                c = candidate_from_choice(choice, effective_batch=self.effective_batch)
                if isinstance(c, Candidate):
                    first.append(candidate_id(c))
            self._options = {candidate_id(c): self._option(choice, c) for choice, c in self._all_candidates()}
            self._options = self._costed(self._options)
            self._policy = ModelPolicy(list(self._options.values()), self.choices, first=first,
                                       noise_sd=CPU_NOISE_SD if self.device == "cpu" else NOISE_SD)
        return self._policy

    def _rows(self, obs: Sequence[Observation]) -> list[Row]:
        """The finished trials as the model strategy's rows (a skip, or a repeat answered from the cache, is none)."""
        self.model_policy()
        rows = []
        for o in obs:
            if o.candidate is None or (not o.measured and o.status == "ok"):
                continue
            memory = math.log1p(o.memory) if o.memory is not None and o.memory > -1.0 else None
            option = self._options.get(o.key) or self._option(self.choice_of(o.params), o.candidate)
            rows.append(Row(option=option, status=o.status, tokens_per_s=o.value if o.status == "ok" else 0.0,
                            memory=memory, proposed=o.origin not in _NOT_PROPOSED))
        return rows

    def _searched(self, choice: Mapping[str, Any]) -> dict[str, Any]:
        """The searched levers' values of a choice (a lever inactive under it at its first choice)."""
        out = {d: choice.get(d) for d in self.choices}
        for d in CONDITIONAL_KNOBS:
            if d in out and inactive(d, choice):
                out[d] = self.choices[d][0]
        return out

    def _model_step(self, obs: Sequence[Observation], running: set[str]) -> tuple[str | None, ModelStop | None]:
        memo = (tuple((o.number, o.status, o.value) for o in obs), frozenset(running))
        if self._memo is not None and self._memo[0] == memo:
            return self._memo[1]
        policy = self.model_policy()
        out = policy.next(self._rows(obs), running)
        self._memo = (memo, out)
        return out

    def _cache(self, obs: Sequence[Observation]) -> tuple[list[TrialRecord], dict[str, TrialRecord]]:
        recs = self.records(obs)
        return recs, {r.key: r for r in recs}

    def replay_walk(self, obs: Sequence[Observation]) -> FollowUps:
        """The walk's state after these trials: each lands in turn, in trial-number order."""
        cache: dict[str, TrialRecord] = {}
        walk = FollowUps(
            choices=self.choices, micro_batches=self.micro_batches, grad_ckpt_choices=self.space.grad_ckpt,
            effective_batch=self.effective_batch, in_space=lambda c: self.params_of(c) is not None,
            records=lambda: list(cache.values()), baseline_key=self.baseline_key, neighbours=self.neighbours,
            recheck_tolerance=self.recheck_tolerance,
        )
        for rec, measurements in self.replay(obs, cache):
            walk.measurements[rec.key] = measurements
            walk.land(rec, cache)
        return walk

    def _unseen(self, seen: set[str], obs: Sequence[Observation], rng: random.Random) -> Candidate | None:
        """A random configuration not seen; one not provably infeasible when there is one."""
        known, _ = self._cache(obs)
        fresh = [c for _, c in self._all_candidates() if candidate_id(c) not in seen]
        probeable = [c for c in fresh if infer_infeasible(c, known) is None]
        pool = probeable or fresh
        return rng.choice(pool) if pool else None

    # ------------------------------------------------------------------ scripted strategies

    def defaults(self, **override: Any) -> dict[str, Any]:
        """The baseline's knobs, each replaced by the space's first choice where the space lacks it."""
        d = dataclasses.asdict(self.default_knobs) if self.default_knobs is not None else {}
        out: dict[str, Any] = {}
        for dim in DIMENSIONS:
            if dim == "gpus_per_trial":
                continue
            choices = self.space.choices(dim)
            out[dim] = d[dim] if d.get(dim) in choices else choices[0]
        out.update(override)
        return out

    def _make(self, knobs: Mapping[str, Any], mb: int) -> Candidate | None:
        world = 1 if 1 in self.worlds else min(self.worlds)
        accum = derive_grad_accum(self.effective_batch, mb, world)
        if accum is None:
            return None
        fields = {f.name for f in dataclasses.fields(Candidate)}
        c = Candidate(**{**{k: v for k, v in knobs.items() if k in fields}, "micro_batch": mb, "grad_accum": accum,
                         "world_size": world})
        return c if self.params_of(c) is not None else None

    def _scripted(self, obs: Sequence[Observation], running: set[str]) -> tuple[Candidate, str] | None:
        """Replay the strategy's script over its trials; the first request not yet answered (None when
        it is in flight: the script needs its answer first)."""
        script = self._largest_fits() if self.strategy == "largest-fits" else self._deepspeed()
        answers = iter([o for o in obs if o.origin not in _NOT_PROPOSED])
        try:
            ask = next(script)
            while True:
                o = next(answers, None)
                if o is None:
                    return None if running else ask
                ask = script.send(o.value if o.status == "ok" else None)
        except StopIteration:
            return None

    def _start_index(self, mbs: list[int]) -> int:
        start = self.default_knobs.micro_batch if self.default_knobs is not None else 8
        return min(range(len(mbs)), key=lambda j: (abs(mbs[j] - start), -mbs[j]))

    def _largest_fits(self) -> Script:
        knobs = self.defaults()
        mbs = [mb for mb in self.micro_batches if self._make(knobs, mb) is not None]
        if not mbs:
            return
        i = self._start_index(mbs)
        fits: dict[int, bool] = {}

        def measure(j: int) -> Generator[tuple[Candidate, str], float | None, bool]:
            if j not in fits:
                c = self._make(knobs, mbs[j])
                assert c is not None
                fits[j] = (yield c, "largest-fits") is not None
            return fits[j]

        if (yield from measure(i)):
            while i + 1 < len(mbs) and (yield from measure(i + 1)):
                i += 1
        else:
            while i > 0 and not (yield from measure(i)):
                i -= 1
            yield from measure(i)

    def _deepspeed(self) -> Script:
        if len(self.space.zero_stage) > 1:
            stages: list[dict[str, Any]] = [{"zero_stage": z} for z in sorted(self.space.zero_stage)]
        else:
            stages = [{}] + ([{"grad_ckpt": True}] if {True, False} <= set(self.space.grad_ckpt) else [])
        best: float | None = None
        for stage in stages:
            knobs = self.defaults(**stage)
            mbs = [mb for mb in self.micro_batches if self._make(knobs, mb) is not None]
            top = None
            measured: dict[int, float] = {}
            for mb in mbs:  # the largest micro-batch that fits: up from the smallest until one does not
                c = self._make(knobs, mb)
                assert c is not None
                t = yield c, "deepspeed"
                if t is None:
                    break
                top, measured[mb] = mb, t
            if top is None:
                continue
            near = [mb for mb in mbs if abs(mb - top) <= 0.05 * top]  # within +-5 % of it, at least its lower neighbour
            lower = [mb for mb in mbs if mb < top]
            if len(near) < 2 and lower:
                near.append(lower[-1])
            stage_best: float | None = None
            for mb in near:  # measured again (DeepSpeed's own tuning runs): a re-measure
                c = self._make(knobs, mb)
                assert c is not None
                t = yield c, "recheck"
                if t is not None and mb in measured:
                    t = (t + measured[mb]) / 2.0
                if t is not None and (stage_best is None or t > stage_best):
                    stage_best = t
            if stage_best is None:
                continue
            if best is not None and stage_best < 1.05 * best:
                return
            best = stage_best if best is None else max(best, stage_best)

    # ------------------------------------------------------------------ optuna's interface

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.distributions)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        proposal = self.propose(study, trial.number)
        if proposal is not None:
            cand, origin = proposal
            params = self.params_of(cand)
            if params is not None:
                _set_attr(study, trial, "origin", origin)
                if origin == "recheck":
                    _set_attr(study, trial, "remeasure", True)
                return {d: v for d, v in params.items() if d in search_space}
        base = self._base_for(study, trial.number)
        _set_attr(study, trial, "origin", _base_name(base))
        return base.sample_relative(study, trial, base.infer_relative_search_space(study, trial))

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if "origin" not in trial.user_attrs:
            _set_attr(study, trial, "origin", _base_name(self._base_for(study, trial.number)))
        return self._base_for(study, trial.number).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs and "origin" not in trial.user_attrs:
            _set_attr(study, trial, "origin", "enqueued")

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        base = self._bases.pop(trial.number, None)
        if base is not None:
            base.after_trial(study, trial, state, values)

    def _base_for(self, study: Study, number: int) -> BaseSampler:
        if number not in self._bases:
            self._bases[number] = self.base(self.seed * 1_000_003 + self.position(study, number))
        return self._bases[number]

    @staticmethod
    def position(study: Study, number: int) -> int:
        """How many trials came before trial ``number``, not counting those a killed run left in flight
        (so a resumed study seeds its random choices as the uninterrupted one did)."""
        return sum(1 for t in study.get_trials(deepcopy=False)
                   if t.number < number and not t.user_attrs.get("interrupted"))


def _measured_memory(t: FrozenTrial) -> float | None:
    """The memory constraint a trial was told, when its probe measured a peak (-1 and 1 stand for "no peak
    measured": ``constraint_value``)."""
    c = (t.constraints or {}).get("memory") if hasattr(t, "constraints") else None
    return None if c is None or c in (-1.0, 1.0) else float(c)


def _base_name(base: BaseSampler) -> str:
    name = type(base).__name__.removesuffix("Sampler").lower()
    return name or "base"


def _set_attr(study: Study, trial: FrozenTrial, key: str, value: Any) -> None:
    """A user attribute in the storage and on ``trial`` (the running Trial's cached copy: the objective
    sees it in ``trial.user_attrs`` at once)."""
    study._storage.set_trial_user_attr(trial._trial_id, key, value)
    trial.set_user_attr(key, value)
