"""The ``model`` strategy: a model fitted to the run's own probes ranks every configuration, and a probe
is spent only where the model cannot decide.  [pure]

Two Bayesian linear models over the searched levers, fitted again from the trials at every ask:

* speed:   ``log tok/s            = prior_speed(c)  + b + sum over levers of beta[lever = value]``
* memory:  ``log(peak / usable)   = prior_memory(c) + m + sum over levers of gamma[lever = value]``

The priors are what the estimator knows before a probe (``autotune.estimate.CostPrior``: the compute per real
token of the configuration's padded or packed layout, checkpointing's recomputed FLOPs; the memory model's peak),
0 without one. The speed prior comes in several versions, one per fixed per-micro-batch cost the device may have
(on a CPU; one on a GPU): at every fit the speed model takes the one under which the measured speeds are likeliest
(``log_evidence``, the Gaussian marginal likelihood; the first while fewer than two probes ran), so a small
model's per-micro-batch overheads, which dominate its step on a CPU, are learned from the first probes as one
constant rather than as a coefficient per micro-batch value. Every value of a lever other than its first
choice has one coefficient, a departure from the prior with a Gaussian prior of its own centred on 0
(``SPEED_PRIOR_SD``; memory ``MEMORY_DEPARTURE_SD`` around the estimator's peak, ``MEMORY_PRIOR_SD``
without it); the speed intercept is free, the memory intercept may move the estimator's peak by about 2x
(``MEMORY_INTERCEPT_SD``). A measurement's noise is ``NOISE_SD`` on a GPU, ``CPU_NOISE_SD`` on a CPU (log
units). The posterior gives each configuration a predicted mean and standard deviation: a lever value no
probe has used keeps its prior's width, so a configuration that combines untried values stays uncertain
until one is measured. The additive form assumes the levers' effects multiply; an interaction it cannot
hold shows as a misfit, and the noise is widened to the fit's residual spread once there are more rows
than terms.

The policy, at every ask:

1. out: configurations measured or in flight; those a probe proved over budget (a probe that did not fit
   needed no more memory: a micro-batch no larger, checkpointing on where this one has it off, every
   other lever the same); and those the memory model gives under ``FEASIBLE_MIN`` chance of fitting;
2. first the expert seeds (the calibration probes), each unless it cannot fit;
3. then the configuration with the highest expected gain over the best measured one (as fitted, so a lucky
   single measurement does not set the bar), weighed by its chance of fitting, per second of its probe
   (``Option.cost``, the probe's predicted seconds: what a lever value is worth is learnt as well from a cheap
   probe as from a dear one); before anything fits, the likeliest to fit weighed by how fast it could be,
   per second of its probe;
4. **stop** when no remaining configuration has a ``1 - Phi(Z)`` (16 %) chance of fitting *and* beating
   the best measured one by more than ``MARGIN`` (``ModelStop``: how many configurations that rules out,
   how many were left out as over the budget; its ``text`` is the run's stop reason).

The constants are round values chosen on the recorded CPU landscapes and the simulated story-1 landscapes
(``benchmarks/search_quality.py``, ``benchmarks/time_to_answer.py simulate``: benchmarks/README.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["log_evidence", "worth_a_probe", "SpeedFit", "CPU_NOISE_SD", "MARGIN", "NOISE_SD", "LeverDecision", "LeverModel", "ModelPolicy", "ModelStop", "Option", "Row", "Z"]

SPEED_PRIOR_SD = 0.35  # a lever value moves tok/s by up to ~x1.4 either way before it is measured
MEMORY_PRIOR_SD = 0.5  # without the estimator's prior: a lever value may move the peak by ~x1.6 either way
MEMORY_DEPARTURE_SD = 0.15  # with it: what the memory model misses about one lever value (~15 %)
INTERCEPT_SD = 10.0  # free
# the memory model's constant error: up to ~2x either way (CPU landscapes, estimate / peak: 0.71-1.11x per landscape)
MEMORY_INTERCEPT_SD = 0.7
NOISE_SD = 0.03  # one measurement's spread on a GPU, log units (~3 %)
CPU_NOISE_SD = 0.08  # on a CPU (repeats of one configuration on a quiet 2-core machine: 3-15 %, median ~8 %)
Z = 1.0  # optimism: one standard deviation (an 84 % one-sided bound)
MARGIN = 0.03  # a gain under 3 % is within the noise of one measurement: not worth a probe
FEASIBLE_MIN = 0.2  # a configuration the memory model gives under a 20 % chance of fitting is not probed


def _cholesky(a: list[list[float]]) -> list[list[float]]:
    """The lower factor ``L`` of a symmetric positive-definite matrix, ``a = L L^T`` (small matrices, pure Python)."""
    n = len(a)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = a[i][j] - sum(low[i][k] * low[j][k] for k in range(j))
            low[i][j] = math.sqrt(max(s, 1e-300)) if i == j else s / low[j][j]
    return low


def _cholesky_inverse(a: list[list[float]]) -> list[list[float]]:
    """The inverse of a symmetric positive-definite matrix (Cholesky; small matrices, pure Python)."""
    n = len(a)
    low = _cholesky(a)
    inv_low = [[0.0] * n for _ in range(n)]  # L^-1 by forward substitution
    for i in range(n):
        inv_low[i][i] = 1.0 / low[i][i]
        for j in range(i):
            inv_low[i][j] = -sum(low[i][k] * inv_low[k][j] for k in range(j, i)) / low[i][i]
    return [[sum(inv_low[k][i] * inv_low[k][j] for k in range(max(i, j), n)) for j in range(n)] for i in range(n)]


class LeverModel:
    """Bayesian linear regression on one-hot lever values (intercept first); ``fit`` then ``predict``."""

    def __init__(self, features: Sequence[tuple[str, Any]], *, prior_sd: float, noise_sd: float,
                 intercept_sd: float = INTERCEPT_SD) -> None:
        self.features = list(features)
        self.index = {f: i + 1 for i, f in enumerate(self.features)}
        self.sds = [intercept_sd] + [prior_sd] * len(self.features)
        self.noise_sd = noise_sd
        self.mean = [0.0] * len(self.sds)
        self.cov = [[0.0] * len(self.mean) for _ in self.mean]
        self.rows = 0
        self.fitted_noise_sd = noise_sd
        self.fit([], [])

    def active(self, choice: Mapping[str, Any]) -> list[int]:
        """The indices of the terms a configuration switches on (the intercept always)."""
        return [0] + [i for (d, v), i in self.index.items() if choice.get(d) == v]

    def fit(self, choices: Sequence[Mapping[str, Any]], ys: Sequence[float]) -> None:
        n = len(self.mean)
        noise = self.noise_sd
        for _ in range(2):  # the second pass widens the noise to the residual spread, when it can be measured
            prec = [[0.0] * n for _ in range(n)]
            rhs = [0.0] * n
            for i in range(n):
                prec[i][i] = 1.0 / self.sds[i] ** 2
            for choice, y in zip(choices, ys, strict=True):
                act = self.active(choice)
                for i in act:
                    rhs[i] += y / noise**2
                    for j in act:
                        prec[i][j] += 1.0 / noise**2
            self.cov = _cholesky_inverse(prec)
            self.mean = [sum(self.cov[i][j] * rhs[j] for j in range(n)) for i in range(n)]
            dof = len(ys) - len({i for c in choices for i in self.active(c)})
            if dof < 2:
                break
            rss = sum((y - self.predict(c)[0]) ** 2 for c, y in zip(choices, ys, strict=True))
            wider = math.sqrt(rss / dof)
            if wider <= noise * 1.05:
                break
            noise = wider
        self.rows = len(ys)
        self.fitted_noise_sd = noise

    def predict(self, choice: Mapping[str, Any]) -> tuple[float, float]:
        """(mean, standard deviation) of the modelled quantity for a configuration."""
        act = self.active(choice)
        mean = sum(self.mean[i] for i in act)
        var = sum(self.cov[i][j] for i in act for j in act)
        return mean, math.sqrt(max(var, 0.0))


def log_evidence(model: LeverModel, choices: Sequence[Mapping[str, Any]], ys: Sequence[float]) -> float:
    """log p(ys) under the model's prior (before ``fit``): ``ys ~ N(0, noise^2 I + X S X^T)``, ``S`` the terms'
    prior variances, ``X`` the terms each row switches on. It compares priors for the same rows: the one the
    measurements make likeliest."""
    n = len(ys)
    if n == 0:
        return 0.0
    acts = [set(model.active(c)) for c in choices]
    var = [s * s for s in model.sds]
    cov = [[sum(var[k] for k in acts[i] & acts[j]) + (model.noise_sd**2 if i == j else 0.0) for j in range(n)]
           for i in range(n)]
    low = _cholesky(cov)  # cov = L L^T
    z = []  # L^-1 y
    for i in range(n):
        z.append((ys[i] - sum(low[i][k] * z[k] for k in range(i))) / low[i][i])
    return -0.5 * sum(v * v for v in z) - sum(math.log(low[i][i]) for i in range(n)) - 0.5 * n * math.log(2 * math.pi)


@dataclass
class SpeedFit:
    """The speed model fitted on the rows, with the prior it chose: ``index`` into each option's ``speed_prior``
    (the fixed per-micro-batch cost whose prior makes the measured speeds likeliest; the first until two rows
    can tell them apart)."""

    model: LeverModel
    index: int = 0

    def predict(self, o: Option) -> tuple[float, float]:
        """(mean, standard deviation) of a configuration's log tok/s."""
        mean, sd = self.model.predict(o.choice)
        return mean + o.speed_prior[self.index], sd


_MEMORY_ORDERED = ("micro_batch", "grad_ckpt", "ckpt_every")


def _needs_at_least(c: Mapping[str, Any], o: Mapping[str, Any]) -> bool:
    """Configuration ``c`` needs at least the memory ``o`` does (activations grow with the micro-batch and
    shrink with checkpointing, and with checkpointing one layer in fewer)."""
    if c.get("micro_batch", 0) < o.get("micro_batch", 0):
        return False
    if c.get("grad_ckpt") and not o.get("grad_ckpt"):
        return False
    if c.get("grad_ckpt") and o.get("grad_ckpt") and c.get("ckpt_every", 1) < o.get("ckpt_every", 1):
        return False
    return all(o.get(d) == v for d, v in c.items() if d not in _MEMORY_ORDERED)


def worth_a_probe() -> float:
    """The chance of fitting and beating the best by ``MARGIN`` below which a configuration is not probed."""
    return 1.0 - _normal_cdf(Z)


def _expected_gain(mean: float, sd: float, bar: float) -> float:
    """E[max(0, S - e^bar)] for log S ~ N(mean, sd^2): how much a configuration is expected to beat the bar by."""
    b = math.exp(bar)
    return (math.exp(mean + sd * sd / 2) * _normal_cdf((mean + sd * sd - bar) / sd)
            - b * _normal_cdf((mean - bar) / sd))


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True)
class ModelStop:
    """Why the model strategy proposes nothing more (its ``text`` is the run's stop reason)."""

    best_tokens_per_s: float  # the best measured configuration's fitted speed
    ruled_out: int  # configurations left unprobed because the model says they cannot beat the best
    over_budget: int  # left unprobed because they do not fit (proven, or predicted)
    best_chance: float  # the highest chance, among the ruled-out ones, of fitting and beating the best

    @property
    def text(self) -> str:
        head = (f"the model rules out the {self.ruled_out} unprobed configuration(s) that may fit: none has a "
                f"{worth_a_probe():.0%} chance of fitting and beating the best measured configuration "
                f"({self.best_tokens_per_s:,.0f} tok/s as fitted) by more than {MARGIN:.0%}")
        if self.ruled_out:
            head += f" (the likeliest: {self.best_chance:.0%})"
        if self.over_budget:
            head += f"; {self.over_budget} more left out as over the budget"
        return head


@dataclass(frozen=True)
class LeverDecision:
    """How one alternative to the winner was decided: the winner with one lever set to another value, either
    measured by a probe or predicted by the model (its speed relative to the winner's, with the
    prediction's standard deviation, and its chance of fitting)."""

    lever: str
    value: Any
    decided_by: str  # "probe" or "model"
    ratio: float | None  # its tok/s / the winner's: measured (probe) or predicted (model); None: it did not fit
    sd: float | None = None  # the prediction's relative standard deviation (model)
    fit_chance: float | None = None  # the chance it fits (model)
    status: str = "ok"  # the probe's status (probe)

    def to_dict(self) -> dict[str, Any]:
        return {"lever": self.lever, "value": self.value, "decided_by": self.decided_by,
                "ratio": None if self.ratio is None else round(self.ratio, 4),
                "sd": None if self.sd is None else round(self.sd, 4),
                "fit_chance": None if self.fit_chance is None else round(self.fit_chance, 4), "status": self.status}


@dataclass
class _Ranked:
    """What one pass over the unprobed configurations found (``ModelPolicy._rank``)."""

    best: float
    top: str | None = None
    ruled: int = 0
    excluded: int = 0
    top_ruled: float = 0.0
    open: list[tuple[float, str]] = field(default_factory=list)  # (chance, key) still worth a probe


@dataclass(frozen=True)
class Option:
    """One configuration of the space as the models see it: its searched levers' values, the prior's log speed
    under each of the prior's fixed per-micro-batch costs (``autotune.estimate.FIXED_COSTS``; ``(0.0,)``
    without a prior), its log(peak / usable) (None without a prior) and what its probe costs."""

    key: str
    choice: Mapping[str, Any]
    speed_prior: tuple[float, ...] = (0.0,)
    memory_prior: float | None = None
    cost: float = 1.0  # its probe's predicted seconds (1 for every option when they cannot be predicted)


@dataclass(frozen=True)
class Row:
    """One finished trial as the models see it."""

    option: Option
    status: str
    tokens_per_s: float  # 0 unless it ran and fitted
    memory: float | None  # log(peak / usable budget); None when the probe did not measure it
    proposed: bool  # the search proposed it (not the HF-default baseline the run adds)

    @property
    def key(self) -> str:
        return self.option.key


class ModelPolicy:
    """The ``model`` strategy's decisions over one space (see the module docstring).

    ``options``: every runnable configuration, in the space's order; ``dims``: the searched levers and their
    choices; ``first``: the keys to probe first, in order, before the search has measured anything of its
    own (the expert seeds). With a memory prior (the options carry one), the memory intercept starts at
    the prior's and may move by ``MEMORY_INTERCEPT_SD``; without, it is free and nothing is left out as
    over the budget before a probe has measured a peak."""

    def __init__(self, options: Sequence[Option], dims: Mapping[str, Sequence[Any]], first: Iterable[str] = (),
                 *, noise_sd: float = NOISE_SD) -> None:
        self.options = list(options)
        self.noise_sd = noise_sd
        self.features = [(d, v) for d, values in dims.items() for v in list(values)[1:]]
        self.first = list(first)
        self.memory_prior = bool(self.options) and all(o.memory_prior is not None for o in self.options)
        self.fixed_costs = min((len(o.speed_prior) for o in self.options), default=1)

    def models(self, rows: Sequence[Row]) -> tuple[SpeedFit, LeverModel]:
        ok = [r for r in rows if r.status == "ok" and r.tokens_per_s > 0]
        choices = [r.option.choice for r in ok]
        speed = LeverModel(self.features, prior_sd=SPEED_PRIOR_SD, noise_sd=self.noise_sd)
        index = 0
        if len(ok) >= 2 and self.fixed_costs > 1:  # the fixed cost the measured speeds make likeliest
            evidence = [log_evidence(speed, choices, [math.log(r.tokens_per_s) - r.option.speed_prior[j] for r in ok])
                        for j in range(self.fixed_costs)]
            index = max(range(self.fixed_costs), key=lambda j: (evidence[j], -j))
        speed.fit(choices, [math.log(r.tokens_per_s) - r.option.speed_prior[index] for r in ok])
        memory = LeverModel(self.features, prior_sd=MEMORY_DEPARTURE_SD if self.memory_prior else MEMORY_PRIOR_SD,
                            noise_sd=NOISE_SD,
                            intercept_sd=MEMORY_INTERCEPT_SD if self.memory_prior else INTERCEPT_SD)
        mem = [r for r in rows if r.memory is not None]
        memory.fit([r.option.choice for r in mem], [float(r.memory) - (r.option.memory_prior or 0.0) for r in mem])
        return SpeedFit(speed, index), memory

    @staticmethod
    def _proven_over(choice: Mapping[str, Any], over: Sequence[Mapping[str, Any]]) -> bool:
        """A probe proved it over budget: one that did not fit needed no more memory than this one would
        (every other lever the same; a micro-batch no larger; checkpointing on where this one has it off,
        or on for more layers)."""
        return any(_needs_at_least(choice, o) for o in over)

    def _fits(self, rows: Sequence[Row], memory: LeverModel) -> Callable[[Option], float]:
        """``fits(option)``: the chance that it fits (0 when a probe proved it does not; 1 with nothing to judge by)."""
        over = [r.option.choice for r in rows if r.status in ("oom", "over_budget")]
        judge_memory = self.memory_prior or memory.rows > 0

        def fits(o: Option) -> float:
            if self._proven_over(o.choice, over):
                return 0.0
            if not judge_memory:
                return 1.0
            m_mean, m_sd = memory.predict(o.choice)
            return _normal_cdf(-(m_mean + (o.memory_prior or 0.0)) / max(m_sd, 1e-9))

        return fits

    def next(self, rows: Sequence[Row], running: set[str]) -> tuple[str | None, ModelStop | None]:
        """The key of the configuration to probe next, or (None, why the search can stop). (None, None):
        nothing to propose until a probe in flight lands (every remaining one is in flight)."""
        seen = {r.key for r in rows} | running
        speed, memory = self.models(rows)
        fits = self._fits(rows, memory)
        by_key = {o.key: o for o in self.options}
        for key in self.first:  # the calibration probes: the experts' guesses, unless they cannot fit
            if key not in seen and key in by_key and fits(by_key[key]) >= FEASIBLE_MIN:
                return key, None
        ranked = self._rank(rows, seen, speed, fits)
        if ranked.top is not None:
            return ranked.top, None
        if running:
            return None, None
        return None, ModelStop(best_tokens_per_s=ranked.best, ruled_out=ranked.ruled, over_budget=ranked.excluded,
                               best_chance=ranked.top_ruled)

    def _rank(self, rows: Sequence[Row], seen: set[str], speed: SpeedFit,
              fits: Callable[[Option], float]) -> _Ranked:
        """Every configuration not seen, judged against the best measured one (see the module docstring)."""
        # the best measured configuration as fitted (a lucky single measurement does not end the search early)
        best = max((math.exp(speed.predict(r.option)[0]) for r in rows if r.status == "ok" and r.tokens_per_s > 0),
                   default=0.0)
        bar = math.log(best * (1.0 + MARGIN)) if best > 0 else -math.inf
        enough = worth_a_probe()
        out = _Ranked(best=best)
        top_score = -math.inf
        for o in self.options:
            if o.key in seen:
                continue
            p_fit = fits(o)
            if p_fit < FEASIBLE_MIN:
                out.excluded += 1
                continue
            s_mean, s_sd = speed.predict(o)
            if best > 0:
                chance = p_fit * (1.0 - _normal_cdf((bar - s_mean) / max(s_sd, 1e-9)))
                if chance < enough:
                    out.ruled += 1
                    out.top_ruled = max(out.top_ruled, chance)
                    continue
                out.open.append((chance, o.key))
                score = math.log(max(p_fit * _expected_gain(s_mean, max(s_sd, 1e-9), bar), 1e-300))
            else:  # nothing fits yet: the likeliest to fit, weighed by how fast it could be
                score = math.log(p_fit) + s_mean + Z * s_sd
            score -= math.log(max(o.cost, 1e-9))  # per second of the probe
            if score > top_score:
                out.top, top_score = o.key, score
        return out

    def unfinished(self, rows: Sequence[Row]) -> tuple[int, str | None, float]:
        """When the search was stopped from outside (trials, time): how many unprobed configurations still had a
        ``1 - Phi(Z)`` chance of fitting and beating the best by ``MARGIN``, the likeliest, and its chance."""
        speed, memory = self.models(rows)
        ranked = self._rank(rows, {r.key for r in rows}, speed, self._fits(rows, memory))
        if not ranked.open:
            return 0, None, 0.0
        chance, key = max(ranked.open)
        return len(ranked.open), key, chance

    def decisions(self, rows: Sequence[Row], winner: str, dims: Mapping[str, Sequence[Any]]) -> list[LeverDecision]:
        """For each searched lever and each value the winner does not have: the winner with that one change,
        as a probe measured it or as the model predicts it (``LeverDecision``). Alternatives that cannot be
        built (no such configuration in the space) are left out."""
        by_key = {o.key: o for o in self.options}
        w = by_key.get(winner)
        if w is None:
            return []
        speed, memory = self.models(rows)
        over = [r.option.choice for r in rows if r.status in ("oom", "over_budget")]
        measured: dict[str, list[Row]] = {}
        for r in rows:
            measured.setdefault(r.key, []).append(r)
        w_mean = speed.predict(w)[0]
        w_runs = [r.tokens_per_s for r in measured.get(winner, []) if r.status == "ok" and r.tokens_per_s > 0]
        by_choice = {tuple(sorted(o.choice.items(), key=lambda kv: kv[0])): o for o in self.options}
        out: list[LeverDecision] = []
        for d, values in dims.items():
            for v in values:
                if v == w.choice.get(d):
                    continue
                o = by_choice.get(tuple(sorted({**w.choice, d: v}.items(), key=lambda kv: kv[0])))
                if o is None:
                    continue
                runs = measured.get(o.key, [])
                if runs:
                    ok = [r.tokens_per_s for r in runs if r.status == "ok" and r.tokens_per_s > 0]
                    ratio = (sorted(ok)[len(ok) // 2] / sorted(w_runs)[len(w_runs) // 2]) if ok and w_runs else None
                    out.append(LeverDecision(d, v, "probe", ratio, status=runs[0].status))
                    continue
                s_mean, s_sd = speed.predict(o)
                if self._proven_over(o.choice, over):
                    p_fit = 0.0
                elif self.memory_prior or memory.rows:
                    m_mean, m_sd = memory.predict(o.choice)
                    p_fit = _normal_cdf(-(m_mean + (o.memory_prior or 0.0)) / max(m_sd, 1e-9))
                else:
                    p_fit = 1.0
                out.append(LeverDecision(d, v, "model", math.exp(s_mean - w_mean), sd=s_sd,
                                         fit_chance=p_fit))
        return out
