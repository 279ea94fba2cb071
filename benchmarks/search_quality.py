"""How good is each search strategy, on recorded landscapes, over many seeds (seconds, no probes).

    python benchmarks/search_quality.py                       # every benchmarks/landscapes/*.json
    python benchmarks/search_quality.py LANDSCAPE.json ... --seeds 30 --share 0.15
    python benchmarks/search_quality.py --budget 150MiB --budget 160MiB --budget 200MiB   # each budget

Every strategy asks the same :class:`~autotune.executors.replay.ReplayExecutor` (answers from the
recorded landscape, with each configuration's recorded spread as noise, so a strategy picks on
noisy measurements like a real one), and is scored on the *recorded median* tok/s of the
configuration it picks, divided by the landscape's optimum (the best median that fits). Printed
per strategy: the median over seeds of best-found / optimum, the share of seeds at >= 0.97, and the
median of probes / grid size (every probe it caused counts: baseline, search and confirmation), and the
median of the probes' recorded seconds (one device, one probe at a time).

Strategies
----------
Every strategy but ``seed-only`` and the reference is the package's own
:class:`~autotune.search.AutotuneSampler` (``autotune run --strategy NAME``) driven by the real
:class:`~autotune.search.Searcher`, so the benchmark and the product run the same code.

autotune (``--strategy walk``)
    The real :class:`~autotune.search.Searcher` (expert seeds, step-downs, the neighbourhood walk,
    TPE as the fallback, inferred infeasibility, confirmation of the top few), with the HF-default
    baseline as ``autotune run`` passes it, given
    a probe budget of ``--share`` x grid size: ``max_trials`` is the budget less the confirmation
    probes (``top_k`` = 2 and the baseline, in at least 2 interleaved rounds, when the budget is 8 or
    more, else no confirmation; rounds beyond the second, run while re-measurements disagree, count too).
model (``--strategy model``)
    The model strategy (``autotune/search/_model.py``): a model fitted to the run's own probes ranks every
    configuration, the optimistic best is probed next, and the search stops when none can beat the best
    measured by more than the margin; with the HF-default baseline and the same confirmation as autotune.
    Not capped by ``--share``: its probes are its own stop rule's.
tpe (``--strategy tpe``)
    Optuna's multivariate TPE alone (no seeds, no walk), with autotune's probe budget, baseline and
    confirmation.
seed-only
    The first expert seed (largest micro-batch <= 8, no checkpointing, sdpa, fused AdamW, packing
    when lengths vary) and, while it does not fit, its step-downs to the next smaller micro-batch:
    what the rules alone find, without any search.
random (``--strategy random``)
    Uniform sampling without replacement of as many configurations as autotune probed on that
    seed; picks the fastest measured that fits.
largest-micro-batch (``--strategy largest-fits``; HF ``auto_find_batch_size`` / Lightning ``BatchSizeFinder``)
    Every knob at the HF default (``hf_default_candidate``; a default the space does not offer is
    replaced by the space's first choice, e.g. pin_memory on a CPU space), then the micro-batch:
    start at the default (8, or the largest divisor of the effective batch below it), double while
    it fits, halve while it does not; take the largest that fits. The effective batch is held
    (accumulation derived), which HF itself does not do. Picks the fastest measured.
deepspeed (``--strategy deepspeed``; DeepSpeed autotuning's strategy, reproduced and adapted)
    DeepSpeed's autotuner tunes two things: the ZeRO stage and the micro-batch. For each stage in
    order (0, 1, 2, 3) it finds the largest micro-batch that fits (from its memory model; here: by
    probing, doubling from the smallest, because the replay has no model), then measures a few
    micro-batches around it (``max``, and the ones within -5 % .. +5 % of it: in a power-of-two list
    that is the max and its lower neighbour) and keeps the fastest; it moves to the next stage only
    while the last one improved the best by >= 5 %. Adaptation: where a landscape has no ZeRO
    dimension, its memory-for-compute levers take the place of the stages, in the same order of
    cost: stage 0 = HF defaults, then gradient checkpointing on. Every other knob (attention,
    packing, workers, precision) stays at the HF default, as DeepSpeed leaves the user's config
    alone.
grid-once (ceiling) -- a reference, not a competitor
    Every configuration probed once, the fastest measured taken: what measurement noise leaves to
    any strategy that picks on single measurements (on a quiet GPU it is ~1.0; on a busy CPU less).
unpacked-best -- a reference column, per landscape
    The best configuration without packing / the optimum (recorded medians): what any strategy that
    keeps the HF default of no packing (random over the HF knobs, largest-micro-batch, deepspeed)
    could reach at most on a landscape whose lengths vary.

The last line printed is one summary: autotune's median best-found / optimum and median probes /
grid size over all landscapes and seeds. Goal: >= 0.97 of the optimum in <= 15 % of the
grid's probes, ahead of the three others.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_heap_fit import LIVE_HEAP_LANDSCAPES  # noqa: E402
from record_landscape import grid  # noqa: E402

from autotune.executors.base import run_one  # noqa: E402
from autotune.executors.replay import ReplayExecutor, load_landscape  # noqa: E402
from autotune.search import derive_grad_accum  # noqa: E402
from autotune.spec.baseline import hf_default_candidate  # noqa: E402
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload  # noqa: E402
from autotune.spec.space import DIMENSIONS, SearchSpace  # noqa: E402

LANDSCAPES = Path(__file__).resolve().parent / "landscapes"
STRATEGIES = ("autotune", "model", "tpe", "seed-only", "random", "largest-micro-batch", "deepspeed")
# the package strategy (autotune run --strategy) behind each row
PACKAGE_STRATEGY = {"autotune": "walk", "model": "model", "tpe": "tpe", "random": "random", "largest-micro-batch": "largest-fits",
                    "deepspeed": "deepspeed"}
# a reference row, not a competitor: every configuration probed once (noisy), the fastest measured
# taken. Its median score is the ceiling that measurement noise leaves to any strategy.
REFERENCE = "grid-once (ceiling)"
# a paired reference for the model strategy: the walk with as many probes as the model took on the seed
WALK_AT_MODEL = "walk @ model's probes"
# the model strategy's prior alone, no probe: what the estimator would pick (run_zero_probe)
ZERO_PROBE = "model, no probe"


@dataclasses.dataclass
class Problem:
    """One landscape, ready to be searched: space, grid, request template, optimum."""

    name: str
    landscape: dict[str, Any]
    space: SearchSpace
    grid: list[Candidate]
    workload: Workload
    settings: ProbeSettings
    effective_batch: int
    optimum: float
    truth: ReplayExecutor  # noise-free, for scoring

    def request(self, c: Candidate) -> ProbeRequest:
        return ProbeRequest(workload=self.workload, candidate=c, settings=self.settings)

    def score(self, c: Candidate | None) -> float:
        if c is None:
            return 0.0
        ex = self.truth
        entry = ex.entries.get(_cid(c))
        if entry is None or ex.status_of(entry, self.request(c)) != "ok":
            return 0.0
        return (ex.true_tokens_per_s(c) or 0.0) / self.optimum


def _cid(c: Candidate) -> str:
    from autotune.search import candidate_id

    return candidate_id(c)


def problem(source: str | Path | dict[str, Any], *, budget_bytes: int | None = None) -> Problem:
    land = load_landscape(source)
    space = SearchSpace(**{k: tuple(v) for k, v in land["space"].items()})
    eb = int(land["effective_batch"])
    settings = ProbeSettings(device=land.get("device", "cpu"), budget_bytes=budget_bytes or land["budget_bytes"],
                             headroom=float(land.get("headroom", 0.05)), steps=int(land.get("steps") or 5),
                             warmup_steps=int(land.get("warmup_steps") or 2))
    workload = Workload(model=land["model"], seq_len=int(land["seq_len"]), lengths=land.get("lengths", "fixed"),
                        mode=land.get("mode", "full"))
    truth = ReplayExecutor(land, seed=0, noise=False)
    cands = grid(space, eb)
    fits = [truth.true_tokens_per_s(c) or 0.0 for c in cands
            if (e := truth.entries.get(_cid(c))) is not None
            and truth.status_of(e, ProbeRequest(workload=workload, candidate=c, settings=settings)) == "ok"]
    if not fits or max(fits) <= 0:
        raise SystemExit(f"{land.get('model')}/{land.get('space_name')}: no configuration fits the budget")
    name = source.stem if isinstance(source, Path) else str(land.get("name") or land.get("space_name", "?"))
    return Problem(name=name, landscape=land, space=space, grid=cands, workload=workload, settings=settings,
                   effective_batch=eb, optimum=max(fits), truth=truth)


# ------------------------------------------------------------------------------ strategies
# each: (problem, seed, probe budget) -> (chosen candidate or None, executor that counted the probes)

Strategy = Callable[[Problem, int, int], tuple[Candidate | None, ReplayExecutor]]


def _measure(p: Problem, ex: ReplayExecutor, c: Candidate) -> float | None:
    """tok/s when the probe fits, else None."""
    r = run_one(ex, p.request(c))
    return r.tokens_per_s if r.status == "ok" else None


SEARCHER_OPTIONS: dict[str, Any] = {}  # extra Searcher keywords (--no-follow-ups sets follow_ups=False)


def run_autotune(p: Problem, seed: int, budget: int, *, strategy: str = "walk") -> tuple[Candidate | None,
                                                                                       ReplayExecutor]:
    import optuna

    from autotune.search import Searcher

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    from autotune.search import ConfirmPolicy

    top_k = 2 if budget >= 8 else 0
    ex = ReplayExecutor(p.landscape, seed=seed, noise=True)
    baseline = _baseline(p)
    # confirmation re-measures the top_k and the baseline in at least the rounds the policy gives them (more while
    # they disagree): keep room for the least of it
    rounds = ConfirmPolicy.for_device(p.settings.device).rounds_for(top_k)
    max_trials = max(1, budget - ((top_k + 1) * rounds if top_k else 0))
    extra = SEARCHER_OPTIONS if strategy == "walk" else {"prior": model_prior(p)} if strategy == "model" else {}
    out = Searcher(space=p.space, workload=p.workload, settings=p.settings, effective_batch=p.effective_batch,
                   executor=ex, max_trials=max_trials, seed=seed, top_k=top_k, device=p.settings.device,
                   baseline=baseline, poll_interval_s=0.0, strategy=strategy, pruner=run_pruner(p),
                   deadlines=run_deadlines(p), **extra).run()
    return (out.best_record.candidate_obj() if out.best_record else None), ex


def _known_model(p: Problem) -> bool:
    """Whether the landscape's model resolves (a synthetic landscape's ``synthetic`` does not: its strategies then
    run without the estimator's prior, deadlines or pruner, as with ``--flat-prior --costless``)."""
    from autotune.errors import ModelNotFoundError
    from autotune.models import resolve_model

    try:
        resolve_model(p.workload.model)
    except ModelNotFoundError:
        return False
    return True


def run_deadlines(p: Problem) -> Any:
    """The probe-time predictor ``autotune run`` gives its probes' deadlines (and the model strategy's cost per
    probe): the landscape's model, workload and device (a GPU landscape's catalog GPU; a CPU one's recorded threads,
    probes forked from the warm server as the run's local pool does). The replay ignores the deadlines."""
    if COSTLESS or not _known_model(p):
        return None
    from autotune.estimate import DeadlineRule, Deadlines, find_gpu, make_predictor
    from autotune.models import resolve_model
    from autotune.run import mean_sequence_tokens

    device = p.settings.device
    gpu = find_gpu(p.landscape["gpu"]) if p.landscape.get("gpu") else None
    predictor = make_predictor(resolve_model(p.workload.model).config, p.workload, device=device, gpu_infos=[],
                               gpu=gpu, cores=int(p.landscape.get("cpu_threads") or 1),
                               mean_tokens=mean_sequence_tokens(p.workload) if device == "cpu" else None,
                               warm=device == "cpu")
    return Deadlines(rule=DeadlineRule.for_device(device), predictor=predictor)


COSTLESS = False  # --costless: the model strategy without a cost per probe (every probe the same)


def run_pruner(p: Problem) -> Any:
    """The memory model's pruner as ``autotune run`` gives it (on for a GPU landscape, off on CPU: a
    configuration predicted above 1.25 x the budget is recorded over the budget without a probe); None on CPU."""
    from autotune.models import resolve_model
    from autotune.run import EstimatePruner
    from autotune.spec import prune_default

    if not prune_default(None, p.settings.device) or not _known_model(p):
        return None
    return EstimatePruner(resolve_model(p.workload.model).config, p.workload, p.settings.device,
                          p.settings.budget_bytes)


def model_prior(p: Problem) -> Any:
    """The estimator's prior for the landscape's model, as ``autotune run --strategy model`` builds it (None
    with ``--flat-prior``: the model starts from nothing)."""
    if FLAT_PRIOR or not _known_model(p):
        return None
    from autotune.estimate import CostPrior, find_gpu
    from autotune.models import resolve_model

    gpu = find_gpu(p.landscape["gpu"]) if p.landscape.get("gpu") else None  # a GPU landscape names its GPU
    # a CPU landscape recorded while probes returned freed blocks at once holds live-tensor peaks
    live = p.settings.device == "cpu" and str(p.landscape.get("space_name", "")).rsplit("-cpu-", 1)[-1] in LIVE_HEAP_LANDSCAPES
    return CostPrior(resolve_model(p.workload.model).config, p.workload, device=p.settings.device,
                     usable_bytes=p.settings.usable_bytes(), gpu=gpu, retained_heap=not live)


FLAT_PRIOR = False


def run_model(p: Problem, seed: int, budget: int) -> tuple[Candidate | None, ReplayExecutor]:
    """The model strategy with the baseline and confirmation autotune run gives it; it stops by itself
    (its probe cap is the grid, plus the confirmation)."""
    from autotune.search import ConfirmPolicy

    rounds = ConfirmPolicy.for_device(p.settings.device).rounds_for(2)
    return run_autotune(p, seed, len(p.grid) + 3 * rounds, strategy="model")


def run_tpe(p: Problem, seed: int, budget: int) -> tuple[Candidate | None, ReplayExecutor]:
    return run_autotune(p, seed, budget, strategy="tpe")


def run_package(p: Problem, seed: int, max_trials: int, strategy: str) -> tuple[Candidate | None, ReplayExecutor]:
    """A package strategy without the baseline probe or confirmation: the fastest measured is its pick."""
    import optuna

    from autotune.search import Searcher

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    ex = ReplayExecutor(p.landscape, seed=seed, noise=True)
    out = Searcher(space=p.space, workload=p.workload, settings=p.settings, effective_batch=p.effective_batch,
                   executor=ex, max_trials=max(1, max_trials), seed=seed, top_k=0, device=p.settings.device,
                   defaults=_baseline(p), poll_interval_s=0.0, strategy=strategy).run()
    return (out.best_record.candidate_obj() if out.best_record else None), ex


def run_seed_only(p: Problem, seed: int, budget: int) -> tuple[Candidate | None, ReplayExecutor]:
    """The first expert seed, stepped down the micro-batches while it does not fit."""
    from autotune.search import candidate_from_choice, expert_seeds

    ex = ReplayExecutor(p.landscape, seed=seed, noise=True)
    mbs = _mbs(p)
    seeds = expert_seeds(p.space, effective_batch=p.effective_batch, micro_batches=mbs, worlds=[1],
                         device=p.settings.device, limit=1,
                         variable_lengths=p.workload.lengths != "fixed")
    if not seeds:
        return None, ex
    first = seeds[0]
    for mb in sorted((m for m in mbs if m <= first["micro_batch"]), reverse=True):
        c = candidate_from_choice({**first, "micro_batch": mb}, effective_batch=p.effective_batch)
        if isinstance(c, Candidate) and _measure(p, ex, c) is not None:
            return c, ex
    return None, ex


def _baseline(p: Problem) -> Candidate | None:
    """What autotune run passes as the baseline (tune's baseline_candidate), inside the space.

    ``hf_default_candidate`` pins memory; a CPU landscape records pin_memory false only (it does
    nothing without a GPU), so a knob the space does not offer takes the space's first choice, as
    for the largest-micro-batch strategy. Otherwise the baseline would be a probe outside the
    recording (answered as a crash) and cost autotune a probe for nothing.
    """
    world = 1 if 1 in p.space.gpus_per_trial else min(p.space.gpus_per_trial)
    try:
        c = hf_default_candidate(p.effective_batch, world_size=world)
    except ValueError:
        return None
    if c.micro_batch * c.grad_accum * c.world_size != p.effective_batch:
        return None
    return _make(p, hf_defaults_in_space(p), c.micro_batch)


def run_random(p: Problem, seed: int, budget: int) -> tuple[Candidate | None, ReplayExecutor]:
    return run_package(p, seed, budget, PACKAGE_STRATEGY["random"])


def hf_defaults_in_space(p: Problem, **override: Any) -> dict[str, Any]:
    """The HF-default knobs, each replaced by the space's first choice where the space lacks it."""
    d = dataclasses.asdict(hf_default_candidate(p.effective_batch, precision=_prefer_precision(p)))
    out = {}
    for dim in DIMENSIONS:
        if dim == "gpus_per_trial":
            continue
        choices = p.space.choices(dim)
        out[dim] = d[dim] if d[dim] in choices else choices[0]
    out.update(override)
    return out


def _prefer_precision(p: Problem) -> str:
    # HF's default is fp32 unless the user passes bf16; on a GPU landscape users pass bf16
    return "bf16" if p.settings.device == "cuda" and "bf16" in p.space.precision else "fp32"


def _make(p: Problem, knobs: dict[str, Any], mb: int) -> Candidate | None:
    accum = derive_grad_accum(p.effective_batch, mb, 1)
    if accum is None:
        return None
    fields = {f.name for f in dataclasses.fields(Candidate)}
    return Candidate(**{**{k: v for k, v in knobs.items() if k in fields}, "micro_batch": mb, "grad_accum": accum})


def _mbs(p: Problem) -> list[int]:
    return sorted(mb for mb in p.space.micro_batch if derive_grad_accum(p.effective_batch, mb, 1) is not None)


def run_largest_mb(p: Problem, seed: int, budget: int) -> tuple[Candidate | None, ReplayExecutor]:
    return run_package(p, seed, len(p.grid), PACKAGE_STRATEGY["largest-micro-batch"])  # it stops by itself


def run_deepspeed(p: Problem, seed: int, budget: int) -> tuple[Candidate | None, ReplayExecutor]:
    return run_package(p, seed, len(p.grid), PACKAGE_STRATEGY["deepspeed"])  # it stops by itself


def run_grid_once(p: Problem, seed: int, budget: int) -> tuple[Candidate | None, ReplayExecutor]:
    ex = ReplayExecutor(p.landscape, seed=seed, noise=True)
    best: tuple[float, Candidate] | None = None
    for c in p.grid:
        t = _measure(p, ex, c)
        if t is not None and (best is None or t > best[0]):
            best = (t, c)
    return (best[1] if best else None), ex


def run_zero_probe(p: Problem, seed: int, budget: int) -> tuple[Candidate | None, ReplayExecutor]:
    """The model strategy's pick before any probe: of the configurations the estimator's memory prior puts
    within the usable budget, the one its speed prior ranks first (the larger micro-batch on a tie: the prior's
    speed is FLOPs per token, which the micro-batch does not change). No probe; None when nothing is predicted
    to fit (or the estimator cannot read the model)."""
    ex = ReplayExecutor(p.landscape, seed=seed, noise=True)
    prior = model_prior(p)
    if prior is None:
        return None, ex
    best: tuple[float, int, Candidate] | None = None
    for c in p.grid:
        memory = prior.memory(c)
        if memory is None or memory > 0:
            continue
        key = (prior.speed(c), c.micro_batch)
        if best is None or key > best[:2]:
            best = (*key, c)
    return (best[2] if best else None), ex


RUNNERS: dict[str, Strategy] = {
    REFERENCE: run_grid_once,
    "autotune": run_autotune,
    "model": run_model,
    "tpe": run_tpe,
    "seed-only": run_seed_only,
    "random": run_random,
    "largest-micro-batch": run_largest_mb,
    "deepspeed": run_deepspeed,
}


# ------------------------------------------------------------------------------ scoring


def evaluate(p: Problem, *, seeds: int, share: float) -> dict[str, Any]:
    n = len(p.grid)
    budget = max(1, math.floor(share * n + 1e-9))
    # (best / optimum, probes / grid, the probes' recorded seconds) per seed
    rows: dict[str, list[tuple[float, float, float]]] = {s: [] for s in (*STRATEGIES, REFERENCE, WALK_AT_MODEL, ZERO_PROBE)}
    zero = p.score(run_zero_probe(p, 0, 0)[0])  # no probe, no noise: the same pick on every seed
    for seed in range(seeds):
        chosen, ex = run_autotune(p, seed, budget)
        rows["autotune"].append((p.score(chosen), ex.probes / n, ex.probe_seconds))
        same = ex.probes
        for name in (*STRATEGIES[1:], REFERENCE):
            # tpe gets autotune's budget (and confirmation); random as many probes as autotune ran; the
            # model strategy stops by itself
            chosen, ex = RUNNERS[name](p, seed, budget if name == "tpe" else same)
            rows[name].append((p.score(chosen), ex.probes / n, ex.probe_seconds))
            if name == "model":  # the walk given as many probes as the model strategy took on this seed
                chosen, ex = run_autotune(p, seed, ex.probes)
                rows[WALK_AT_MODEL].append((p.score(chosen), ex.probes / n, ex.probe_seconds))
        rows[ZERO_PROBE].append((zero, 0.0, 0.0))
    unpacked = max((p.score(c) for c in p.grid if not c.packing), default=0.0)
    out: dict[str, Any] = {"landscape": p.name, "grid": n, "probe_budget": budget,
                           "infeasible_share": 1.0 - sum(p.score(c) > 0 for c in p.grid) / n,
                           "unpacked_best_over_optimum": unpacked, "strategies": {}}
    for name, vals in rows.items():
        ratios = [v[0] for v in vals]
        shares = [v[1] for v in vals]
        out["strategies"][name] = {
            "best_over_optimum_median": statistics.median(ratios),
            "best_over_optimum_min": min(ratios),
            "share_of_seeds_at_0.97": sum(r >= 0.97 for r in ratios) / len(ratios),
            "probes_over_grid_median": statistics.median(shares),
            "probes_median": statistics.median(round(v * n) for v in shares),
            "probe_seconds_median": round(statistics.median(v[2] for v in vals), 1),
            "ratios": ratios,
            "shares": shares,
        }
    return out


def render(results: list[dict[str, Any]], seeds: int, share: float) -> str:
    lines = []
    for res in results:
        lines.append(f"{res['landscape']}: grid {res['grid']} configurations, {res['infeasible_share']:.0%} "
                     f"infeasible, probe budget {res['probe_budget']} ({share:.0%}), {seeds} seeds; "
                     f"unpacked-best {res['unpacked_best_over_optimum']:.3f} of the optimum")
        lines.append(f"  {'strategy':<22}{'best/optimum (median)':>22}{'min':>7}{'>=0.97':>8}{'probes/grid':>13}"
                     f"{'probes':>8}{'probe s':>9}")
        for name, s in res["strategies"].items():
            lines.append(f"  {name:<22}{s['best_over_optimum_median']:>22.3f}{s['best_over_optimum_min']:>7.3f}"
                         f"{s['share_of_seeds_at_0.97']:>8.0%}{s['probes_over_grid_median']:>13.3f}"
                         f"{s['probes_median']:>8g}{s.get('probe_seconds_median', 0.0):>9.0f}")
    auto_r = [r for res in results for r in res["strategies"]["autotune"]["ratios"]]
    auto_s = [s for res in results for s in res["strategies"]["autotune"]["shares"]]
    others = {name: statistics.median([r for res in results for r in res["strategies"][name]["ratios"]])
              for name in STRATEGIES[1:]}
    med_r, med_s = statistics.median(auto_r), statistics.median(auto_s)
    ahead = all(med_r > v for v in others.values())
    goal = med_r >= 0.97 and med_s <= 0.15 and ahead
    lines.append(f"autotune: best/optimum {med_r:.3f} (median over {len(results)} landscape(s) x {seeds} seeds) "
                 f"in {med_s:.3f} of the grid's probes; goal >=0.97 in <=0.15 and ahead of all "
                 f"({', '.join(f'{k} {v:.3f}' for k, v in others.items())}): {'met' if goal else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("landscapes", nargs="*", help="landscape JSON files (default: benchmarks/landscapes/*.json)")
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--share", type=float, default=0.15, help="probe budget as a share of the grid size")
    ap.add_argument("--json", default="", help="also write the full results here")
    ap.add_argument("--budget", action="append", default=[],
                    help="replay under this budget instead of the recorded one (repeatable: every landscape x budget)")
    ap.add_argument("--synthetic", action="append", default=[], metavar="SPACE:BUDGET:EB",
                    help="also a synthetic landscape from search_vs_grid.py (e.g. cpu:6GiB:16); repeatable")
    ap.add_argument("--no-follow-ups", action="store_true",
                    help="autotune without its boundary follow-ups (for an A/B of that rule)")
    ap.add_argument("--no-neighbours", action="store_true",
                    help="autotune without the one-knob changes of a new best (for an A/B of that rule)")
    ap.add_argument("--no-recheck", action="store_true",
                    help="autotune without re-measuring a would-be walk centre within the noise (A/B of that rule)")
    ap.add_argument("--stop-when-converged", action="store_true",
                    help="autotune stops once its walk has settled instead of spending the rest of its budget (A/B)")
    ap.add_argument("--flat-prior", action="store_true",
                    help="the model strategy without the estimator's prior (for an A/B of the prior)")
    ap.add_argument("--costless", action="store_true",
                    help="the model strategy without a cost per probe: every probe the same (for an A/B of the cost)")
    a = ap.parse_args(argv)
    global FLAT_PRIOR, COSTLESS
    FLAT_PRIOR, COSTLESS = a.flat_prior, a.costless
    SEARCHER_OPTIONS.clear()
    if a.stop_when_converged:
        SEARCHER_OPTIONS["stop_when_converged"] = True
    if a.no_follow_ups:
        SEARCHER_OPTIONS["follow_ups"] = False
    if a.no_neighbours:
        SEARCHER_OPTIONS["neighbours"] = False
    if a.no_recheck:
        SEARCHER_OPTIONS["recheck"] = False
    paths: list[Any] = [Path(x) for x in a.landscapes] or ([] if a.synthetic else sorted(LANDSCAPES.glob("*.json")))
    for spec in a.synthetic:
        import search_vs_grid

        space_name, budget_text, eb = spec.split(":")
        land = search_vs_grid.cmd_synthetic(argparse.Namespace(space=space_name, gpu_budget=budget_text,
                                                               effective_batch=int(eb)))
        paths.append({**land, "name": f"synthetic-{space_name}-{budget_text}-eb{eb}", "steps": 5})
    if not paths:
        raise SystemExit("no landscapes: record one with benchmarks/record_landscape.py")
    from autotune.spec.budget import parse_budget

    budgets = [parse_budget(b).resolve(None) for b in a.budget] or [None]
    results = []
    for path in paths:
        for b in budgets:
            p = problem(path, budget_bytes=b)
            if b is not None:
                p.name += f" @ {b / 2**20:.0f} MiB"
            results.append(evaluate(p, seeds=a.seeds, share=a.share))
    print(render(results, a.seeds, a.share))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
