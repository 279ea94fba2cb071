"""Does autotune's answer survive noise? Recorded landscapes replayed with injected noise (seconds).

    python benchmarks/noise.py                               # every benchmarks/landscapes/*.json
    python benchmarks/noise.py LANDSCAPE.json ... --seeds 40 --trials 8 --json out.json

Each landscape's recorded median tok/s per configuration is the *truth*. The real Searcher runs
over a replay executor whose answers are the truth times a noise factor, once with the old
confirmation and once with the new one, with the same seeds and the same number of search probes:

old  what autotune did before: one re-measurement of the top 2 (and the HF default), averaged with
     the search measurement that selected it; the higher figure wins; always "confirmed".
new  ``ConfirmPolicy.for_device("cpu")``: 2 to 4 interleaved rounds of the top 2 and the HF default,
     the selecting measurement left out, "confirmed" only when the repeats agree within 25 %, else
     "noisy"; overlapping ranges are a tie (fewer numerics levers, then less memory).

Noise models (the time axis is the recorded probe wall time, so a burst spans several probes):

quiet  multiplicative log-normal noise, sigma from the landscape's own median repeat spread
       (range of 3 draws ~ 1.69 sigma): what a quiet 2-core machine gave when recording.
drift  quiet noise times a slowly drifting machine speed: a random walk of log-speed (sigma 0.03
       per probe-second, kept in 0.45..1.0), like a neighbour whose load comes and goes.
burst  quiet noise; another job starts at random (on average every 120 s of probing) and runs for
       an exponential 60 s, taking the probe down to 0.15-0.6 of its speed. The spreads seen on this
       machine with other work running (2026-11-30): 910 vs 8,012 tok/s (0.11), 1,240 vs 8,865
       (0.14), 930 vs 3,380 (0.28). Such a job is another process: autotune's load monitor
       (executors/load.py, tested with a real CPU burner in tests/test_load.py) sees it, so with the
       monitor on, a probe that overlapped a burst carries a load warning (``new``); ``new-nomon`` is
       the new confirmation without the monitor. The drift is not shown to the monitor (a slow
       change of the machine's own speed, e.g. clocks, that no process accounts for).

Scored per landscape x model x policy, over seeds:
- within 3 %: the share of seeds whose chosen configuration's true tok/s is >= 0.97 of the optimum;
- reported error: median and 90th percentile of |reported tok/s - chosen's true tok/s| / true;
- flagged: share of seeds whose answer says it is doubtful (status noisy, or load warnings: what
  ``--strict`` exits 5 on), and of the seeds whose
  pick is off by > 3 % or whose reported figure is off by > 25 %, the share that were flagged;
- probes: median probes per seed, confirmation included.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_quality import LANDSCAPES, Problem, _baseline, _cid, problem  # noqa: E402

from autotune.executors.replay import ReplayExecutor  # noqa: E402
from autotune.search import ConfirmPolicy  # noqa: E402

# name -> (policy, whether the load monitor is on)
POLICIES = {
    "old": (ConfirmPolicy(min_rounds=1, max_rounds=1, tolerance=1e9, include_search=True, ties=False), False),
    "new-nomon": (ConfirmPolicy.for_device("cpu"), False),
    "new": (ConfirmPolicy.for_device("cpu"), True),
}
MODELS = ("quiet", "drift", "burst")


class NoisyReplay(ReplayExecutor):
    """Answers the recorded median times a noise factor drawn from ``model``."""

    def __init__(self, landscape: dict[str, Any], *, seed: int, model: str, sigma: float) -> None:
        super().__init__(landscape, seed=seed, noise=False)
        self.model = model
        self.sigma = sigma
        self.noise_rng = random.Random(seed * 7919 + MODELS.index(model))
        self._t = 0.0  # probe-seconds seen so far
        self._log_speed = 0.0
        self._burst_until = -1.0
        self._burst_factor = 1.0
        self._next_burst = self.noise_rng.expovariate(1 / 120.0)
        self.last_loaded = False

    def _advance(self, now: float) -> None:
        rng = self.noise_rng
        dt, self._t = max(0.0, now - self._t), now
        if self.model == "drift":
            self._log_speed += rng.gauss(0.0, 0.03 * math.sqrt(dt))
            self._log_speed = min(0.0, max(math.log(0.45), self._log_speed))
        elif self.model == "burst":
            while now >= self._next_burst:
                start = self._next_burst
                self._burst_until = start + rng.expovariate(1 / 60.0)
                self._burst_factor = rng.uniform(0.15, 0.6)
                self._next_burst = self._burst_until + rng.expovariate(1 / 120.0)

    def loaded(self) -> bool:
        return self.model == "burst" and self._t < self._burst_until

    def answer(self, request: Any) -> Any:
        res = super().answer(request)
        self.last_loaded = self.loaded()
        return res

    def load_check(self, phase: str, since: float | None) -> list[dict[str, Any]]:
        """What the load monitor would have said: a burst is another process burning the CPU."""
        busy = self.last_loaded if phase == "during" else self.loaded()
        return [{"kind": "cpu", "message": "another job ran during the probe"}] if busy else []

    def factor(self) -> float:
        f = math.exp(self.noise_rng.gauss(0.0, self.sigma))
        if self.model == "drift":
            f *= math.exp(self._log_speed)
        elif self.model == "burst" and self._t < self._burst_until:
            f *= self._burst_factor
        return f

    def _tokens(self, entry: dict[str, Any]) -> float | None:
        base = super()._tokens(entry)
        self._advance(self.probe_seconds)
        return None if base is None else base * self.factor()


def run(p: Problem, *, seed: int, model: str, policy: ConfirmPolicy, monitor: bool, trials: int,
        sigma: float) -> dict[str, Any]:
    import optuna

    from autotune.search import Searcher

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    ex = NoisyReplay(p.landscape, seed=seed, model=model, sigma=sigma)
    out = Searcher(space=p.space, workload=p.workload, settings=p.settings, effective_batch=p.effective_batch,
                   executor=ex, max_trials=trials, seed=seed, top_k=2, device=p.settings.device,
                   baseline=_baseline(p), poll_interval_s=0.0, confirm=policy,
                   load_check=ex.load_check if monitor else None).run()
    chosen = out.best_record.candidate_obj() if out.best_record else None
    true = p.truth.true_tokens_per_s(chosen) if chosen is not None else None
    reported = out.best.metrics.get("confirmed_tokens_per_s") if out.best is not None else None
    doubtful = out.best is not None and (out.best.metrics.get("confirm_status") != "confirmed" or bool(out.warnings))
    return {
        "score": p.score(chosen),
        "error": abs(reported - true) / true if reported and true else None,
        "status": out.best.metrics.get("confirm_status") if out.best is not None else None,
        "doubtful": doubtful,
        "probes": ex.probes,
        "chosen": _cid(chosen) if chosen is not None else None,
    }


def evaluate(p: Problem, *, seeds: int, trials: int) -> dict[str, Any]:
    sigma = float(p.landscape.get("median_repeat_spread") or p.truth.default_spread or 0.15) / 1.69
    res: dict[str, Any] = {"landscape": p.name, "grid": len(p.grid), "trials": trials, "sigma": sigma, "models": {}}
    for model in MODELS:
        res["models"][model] = {}
        for name, (policy, monitor) in POLICIES.items():
            rows = [run(p, seed=s, model=model, policy=policy, monitor=monitor, trials=trials, sigma=sigma)
                    for s in range(seeds)]
            errs = sorted(r["error"] for r in rows if r["error"] is not None)
            bad = [r for r in rows if r["score"] < 0.97 or (r["error"] or 0) > 0.25]
            res["models"][model][name] = {
                "within_3pct": sum(r["score"] >= 0.97 for r in rows) / len(rows),
                "score_median": statistics.median(r["score"] for r in rows),
                "error_median": statistics.median(errs) if errs else None,
                "error_p90": errs[min(len(errs) - 1, int(0.9 * len(errs)))] if errs else None,
                "flagged": sum(r["doubtful"] for r in rows) / len(rows),
                "bad": len(bad),
                "bad_flagged": (sum(r["doubtful"] for r in bad) / len(bad)) if bad else None,
                "probes_median": statistics.median(r["probes"] for r in rows),
            }
    return res


def render(results: list[dict[str, Any]], seeds: int) -> str:
    lines = []
    for res in results:
        lines.append(f"{res['landscape']}: grid {res['grid']}, {res['trials']} search probes, sigma {res['sigma']:.3f}, "
                     f"{seeds} seeds")
        lines.append(f"  {'noise':<7}{'policy':<11}{'within 3%':>10}{'score':>7}{'err med':>9}{'err p90':>9}"
                     f"{'flagged':>9}{'bad':>5}{'bad flagged':>12}{'probes':>8}")
        for model, pols in res["models"].items():
            for name, s in pols.items():
                bf = f"{s['bad_flagged']:.0%}" if s["bad_flagged"] is not None else "-"
                em = f"{s['error_median']:.1%}" if s["error_median"] is not None else "-"
                ep = f"{s['error_p90']:.1%}" if s["error_p90"] is not None else "-"
                lines.append(f"  {model:<7}{name:<11}{s['within_3pct']:>10.0%}{s['score_median']:>7.3f}{em:>9}{ep:>9}"
                             f"{s['flagged']:>9.0%}{s['bad']:>5}{bf:>12}{s['probes_median']:>8.0f}")
    for model in MODELS:
        parts = []
        for name in POLICIES:
            w = [r["models"][model][name]["within_3pct"] for r in results]
            e = [r["models"][model][name]["error_p90"] for r in results if r["models"][model][name]["error_p90"]]
            parts.append(f"{name}: within 3% {statistics.mean(w):.0%}, error p90 "
                         f"{statistics.median(e) if e else float('nan'):.1%}")
        lines.append(f"{model} (mean over landscapes): " + " | ".join(parts))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("landscapes", nargs="*", help="landscape JSON files (default: benchmarks/landscapes/*.json)")
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--trials", type=int, default=0,
                    help="search probes per run (default: 12.5%% of the grid, at least 4)")
    ap.add_argument("--json", default="", help="also write the full results here")
    a = ap.parse_args(argv)
    paths = [Path(x) for x in a.landscapes] or sorted(LANDSCAPES.glob("*.json"))
    results = []
    for path in paths:
        p = problem(path)
        trials = a.trials or max(4, math.floor(0.125 * len(p.grid)))
        results.append(evaluate(p, seeds=a.seeds, trials=trials))
    print(render(results, a.seeds))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


if __name__ == "__main__":
    main()
