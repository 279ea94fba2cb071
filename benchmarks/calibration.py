"""How well the model strategy's models predict a landscape after the run's first three probes.

    python benchmarks/calibration.py [LANDSCAPE.json ...] [--seeds 30] [--probes 3] [--json OUT]
    python benchmarks/calibration.py [LANDSCAPE.json ...] --layout

For each recorded landscape (default: every file in ``benchmarks/landscapes/``) and seed: the model strategy
runs as ``benchmarks/search_quality.py`` runs it (replay, the estimator's prior, the baseline); its first
``--probes`` probes (whatever they were: the baseline, the seeds, over the budget or not) are measured again by
a replay with that seed's noise, and ``autotune.search.ModelPolicy`` fits its speed and memory models on those
rows alone, as the run does at that point. Then, over every other configuration of the landscape:

* speed: Spearman's rank correlation between the predicted mean speed and the recorded median tok/s, over the
  configurations that fit the landscape's budget (what a ranking is for);
* memory: the share whose predicted peak is within +-15 % of the recorded peak (every configuration: the
  landscapes measured each peak under a generous ceiling), and the median predicted / recorded ratio.

The figures per landscape are medians over the seeds; the last line is the median over landscapes. Beside them,
how far the recording agrees with itself: Spearman of one recorded repeat against the median of the others over
the same configurations (median over repeats), the ceiling a noisy landscape leaves to any ranking. Nothing is
fitted here: it reads the strategy as it is.

``--layout`` prints instead, for each landscape with variable lengths and each micro-batch, the gain of packing
over padding in log tok/s as the prior's layout term predicts it (no fixed cost) and as recorded (the median
over the pairs of configurations that differ only in packing and both fit).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import search_quality as sq  # noqa: E402

from autotune.executors.replay import ReplayExecutor  # noqa: E402
from autotune.search import AutotuneSampler, Row, SamplerSettings, candidate_id  # noqa: E402

__all__ = ["calibrate", "layout_gains", "repeat_agreement", "spearman", "main"]

WITHIN = 0.15


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho (average ranks for ties); None with fewer than three pairs or no spread."""
    if len(xs) < 3:
        return None

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    syy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return None if sxx == 0 or syy == 0 else sxy / (sxx * syy)


def repeat_agreement(p: sq.Problem) -> float | None:
    """Spearman of one recorded repeat against the median of the others, over the configurations that fit and
    have every repeat measured (median over repeats); None with fewer than two repeats."""
    runs = []
    for c in p.grid:
        if p.score(c) <= 0:
            continue
        reps = [float(r["metrics"]["tokens_per_s"]) for r in p.truth.entries[candidate_id(c)].get("repeats", [])
                if r.get("status") == "ok" and (r.get("metrics") or {}).get("tokens_per_s")]
        runs.append(reps)
    n = min((len(r) for r in runs), default=0)
    if n < 2:
        return None
    rho = [spearman([r[i] for r in runs], [statistics.median(r[:i] + r[i + 1:n]) for r in runs]) for i in range(n)]
    rho = [v for v in rho if v is not None]
    return statistics.median(rho) if rho else None


def layout_gains(p: sq.Problem) -> dict[int, tuple[float, float, int]]:
    """Per micro-batch: (predicted, recorded median, pairs) gain of packing over padding in log tok/s."""
    prior = sq.model_prior(p)
    by_key = {candidate_id(c): c for c in p.grid}
    out: dict[int, list[tuple[float, float]]] = {}
    for c in p.grid:
        if c.packing or p.score(c) <= 0:
            continue
        packed = by_key.get(candidate_id(dataclasses.replace(c, packing=True)))
        if packed is None or p.score(packed) <= 0:
            continue
        measured = math.log(p.truth.true_tokens_per_s(packed) / p.truth.true_tokens_per_s(c))
        out.setdefault(c.micro_batch, []).append((prior.speed(packed) - prior.speed(c), measured))
    return {mb: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v), len(v))
            for mb, v in sorted(out.items())}


def calibrate(p: sq.Problem, seed: int, probes: int) -> dict[str, Any]:
    """One seed: the model fitted on the strategy's first ``probes`` probes, scored on the rest."""
    _, ran = sq.run_model(p, seed, 0)
    by_key = {candidate_id(c): c for c in p.grid}
    # the first probes the landscape holds (an HF-default baseline outside the space, answered as a crash, is none)
    first = [key for key, _ in ran.answered if key in by_key][:probes]
    # the policy (its options, priors and noise) exactly as the run's sampler builds it
    policy = AutotuneSampler(p.space, SamplerSettings(strategy="model", device=p.settings.device,
                                                      prior=sq.model_prior(p)),
                             effective_batch=p.effective_batch).model_policy()
    options = {o.key: o for o in policy.options}
    ex = ReplayExecutor(p.landscape, seed=seed, noise=True)
    usable = p.settings.usable_bytes()
    rows = []
    for key in first:
        r = ex.answer(p.request(by_key[key]))
        peak = r.metrics.get("peak_mem_bytes")
        rows.append(Row(option=options[key], status=r.status,
                        tokens_per_s=float(r.metrics.get("tokens_per_s") or 0.0) if r.status == "ok" else 0.0,
                        memory=math.log(peak / usable) if peak else None, proposed=True))
    speed, memory = policy.models(rows)
    pred_s, true_s, mem_ratio = [], [], []
    for key, c in by_key.items():
        if key in first:
            continue
        o = options[key]
        entry = p.truth.entries.get(key)
        if entry is None:
            continue
        if entry.get("peak_mem_bytes"):
            m_mean, _ = memory.predict(o.choice)
            mem_ratio.append(math.exp(m_mean + (o.memory_prior or 0.0)) * usable / float(entry["peak_mem_bytes"]))
        if p.score(c) > 0:
            pred_s.append(speed.predict(o)[0])
            true_s.append(p.truth.true_tokens_per_s(c) or 0.0)
    return {"spearman": spearman(pred_s, true_s), "ranked": len(pred_s),
            "memory_within": sum(abs(r - 1) <= WITHIN for r in mem_ratio) / len(mem_ratio) if mem_ratio else None,
            "memory_ratio_median": statistics.median(mem_ratio) if mem_ratio else None, "first": first}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("landscapes", nargs="*")
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--probes", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--layout", action="store_true", help="packing's gain, predicted by the layout term and recorded")
    a = ap.parse_args(argv)
    files = [Path(f) for f in a.landscapes] or sorted((Path(__file__).resolve().parent / "landscapes").glob("*.json"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing or a.seeds < 1 or a.probes < 1:
        problem = (f"no landscape file {', '.join(missing)}: give recorded landscapes (benchmarks/landscapes/*.json)"
                   if missing else "--seeds and --probes must be at least 1")
        print(f"calibration.py: {problem}", file=sys.stderr)
        raise SystemExit(2)
    if a.layout:
        print("| landscape | lengths | micro-batch | packing's gain, predicted (log tok/s) | recorded (median) | pairs |")
        print("|---|---|---|---|---|---|")
        for f in files:
            p = sq.problem(f)
            if p.workload.lengths == "fixed":
                continue
            for mb, (pred, meas, n) in layout_gains(p).items():
                print(f"| {p.name} | {p.workload.lengths} | {mb} | {pred:+.2f} | {meas:+.2f} | {n} |")
        return []
    out = []
    print(f"| landscape | grid | Spearman, predicted vs recorded speed (median; min-max over {a.seeds} seeds) "
          f"| memory within +-{WITHIN:.0%} | predicted / recorded peak (median) | recorded repeats agree at |")
    print("|---|---|---|---|---|---|")
    for f in files:
        p = sq.problem(f)
        runs = [calibrate(p, s, a.probes) for s in range(a.seeds)]
        rho = [r["spearman"] for r in runs if r["spearman"] is not None]
        within = [r["memory_within"] for r in runs if r["memory_within"] is not None]
        ratio = [r["memory_ratio_median"] for r in runs if r["memory_ratio_median"] is not None]
        res = {"landscape": p.name, "grid": len(p.grid), "probes": a.probes, "seeds": a.seeds,
               "spearman_median": statistics.median(rho) if rho else None,
               "spearman_min": min(rho) if rho else None, "spearman_max": max(rho) if rho else None,
               "memory_within_median": statistics.median(within) if within else None,
               "memory_ratio_median": statistics.median(ratio) if ratio else None,
               "repeat_spearman": repeat_agreement(p), "runs": runs}
        out.append(res)

        def f3(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        print(f"| {p.name} | {len(p.grid)} | {f3(res['spearman_median'])} ({f3(res['spearman_min'])}-"
              f"{f3(res['spearman_max'])}) | {f3(res['memory_within_median'])} | {f3(res['memory_ratio_median'])} "
              f"| {f3(res['repeat_spearman'])} |")
    rhos = [r["spearman_median"] for r in out if r["spearman_median"] is not None]
    mems = [r["memory_within_median"] for r in out if r["memory_within_median"] is not None]
    if rhos:
        print(f"median over {len(out)} landscape(s): Spearman {statistics.median(rhos):.2f} (goal >= 0.8), "
              f"memory within +-{WITHIN:.0%} on {statistics.median(mems):.0%} of configurations")
    if a.json:
        tmp = Path(a.json + ".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(a.json)
    return out


if __name__ == "__main__":
    main()
