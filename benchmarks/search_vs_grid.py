"""Exhaustive grid vs autotune's search, on the same space and the same measurements.

Goal: autotune finds >= 0.97 of the grid's optimum tok/s for <= 15 % of the grid's
probe-seconds.

Probes are noisy on CPU (the same configuration measured 633-861 tok/s over 8 runs), so comparing a
live grid with a live search mostly measures noise. Instead the grid is measured once and recorded
(a *landscape*: every configuration's status, tok/s, peak memory and probe wall time); the search is
then replayed against the recording over several seeds, and both sides are scored on the same
numbers. Replay is autotune.executors.replay.ReplayExecutor (recorded spread as noise); replayed
confirmation probes cost the recorded wall time pro rata to their timed steps. The recorder is
benchmarks/record_landscape.py; benchmarks/search_quality.py compares autotune with other strategies.

    # 1. record a landscape with real probes (slow: every configuration of the space, one by one)
    python benchmarks/search_vs_grid.py record --model tiny-llama --device cpu --space cpu \
        --seq-len 128 --effective-batch 16 --gpu-budget 3GB --out benchmarks/landscapes/cpu-tiny-llama-cpu.json
    # 2. replay the search against it
    python benchmarks/search_vs_grid.py replay benchmarks/landscapes/cpu-tiny-llama-cpu.json --trials 20 --seeds 10
    # or without a recording: a synthetic landscape (memory grows with micro-batch, etc.)
    python benchmarks/search_vs_grid.py synthetic --space default --trials 40 --seeds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_landscape import grid  # noqa: E402

from autotune.executors.replay import ReplayExecutor  # noqa: E402
from autotune.spec.budget import parse_budget
from autotune.spec.probe_request import Candidate, ProbeSettings, Workload
from autotune.spec.space import SearchSpace, load_space

GiB = 2**30


# ------------------------------------------------------------------------------ landscapes


def synthetic_entry(c: Candidate, usable: int, seq_len: int = 512) -> dict[str, Any]:
    act = 1.0 * GiB * c.micro_batch * seq_len / 512 * (0.3 if c.grad_ckpt else 1.0)
    act *= {"bf16": 0.6, "fp16": 0.6}.get(c.precision, 1.0) * (0.8 if c.liger else 1.0)
    peak = int(4 * GiB + act - (GiB if c.optim == "adamw_8bit" else 0))
    speed = 1000.0 * c.micro_batch**0.5 * (0.75 if c.grad_ckpt else 1.0)
    speed *= {"bf16": 1.3, "fp16": 1.35, "tf32": 0.9}.get(c.precision, 1.0)
    speed *= {"sdpa": 1.2, "flash_attention_2": 1.45}.get(c.attn, 1.0)
    speed *= (1.05 if c.packing else 1.0) * (1.0 + 0.02 * c.workers) * (1.15 if c.torch_compile else 1.0)
    speed *= (1.1 if c.liger else 1.0) * (0.97 if c.optim == "adamw_8bit" else 1.0)
    wall = 8.0 + (25.0 if c.torch_compile else 0.0) + 2.0 * c.micro_batch / max(speed / 1000.0, 0.1)
    status = "ok" if peak <= usable else "over_budget"
    return {"candidate": dataclasses.asdict(c), "status": status, "tokens_per_s": speed, "peak_mem_bytes": peak,
            "wall_s": wall}


def replay(landscape: dict[str, Any], *, trials: int, seeds: int, top_k: int, noise: bool = True) -> dict[str, Any]:
    import optuna

    from autotune.search import Searcher
    from autotune.spec.baseline import hf_default_candidate

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    space = SearchSpace(**{k: tuple(v) for k, v in landscape["space"].items()})
    ok = [e for e in landscape["entries"] if e["status"] == "ok" and e.get("tokens_per_s")]
    if not ok:
        raise SystemExit("the landscape has no configuration that fits")
    optimum = max(float(e["tokens_per_s"]) for e in ok)
    grid_seconds = sum(float(e.get("wall_s") or 0.0) for e in landscape["entries"])
    settings = ProbeSettings(device=landscape["device"], budget_bytes=landscape["budget_bytes"],
                             steps=int(landscape.get("steps") or 5))
    workload = Workload(model=landscape["model"], seq_len=landscape["seq_len"],
                        lengths=landscape.get("lengths", "fixed"))
    eb = landscape["effective_batch"]
    rows = []
    for seed in range(seeds):
        ex = ReplayExecutor(landscape, seed=seed, noise=noise)
        out = Searcher(space=space, workload=workload, settings=settings, effective_batch=eb, executor=ex,
                       max_trials=trials, seed=seed, top_k=top_k, device=landscape["device"],
                       baseline=hf_default_candidate(eb)).run()
        found = (ex.true_tokens_per_s(out.best_record.candidate_obj()) or 0.0) if out.best_record else 0.0
        rows.append({"seed": seed, "ratio": found / optimum, "cost": ex.probe_seconds / grid_seconds,
                     "probes": ex.probes})
    ratios = [r["ratio"] for r in rows]
    costs = [r["cost"] for r in rows]
    return {
        "grid_configurations": len(landscape["entries"]),
        "grid_probe_seconds": grid_seconds,
        "optimum_tokens_per_s": optimum,
        "trials": trials,
        "top_k": top_k,
        "seeds": seeds,
        "best_over_optimum_median": statistics.median(ratios),
        "best_over_optimum_min": min(ratios),
        "share_of_seeds_at_0.97": sum(r >= 0.97 for r in ratios) / len(ratios),
        "probe_seconds_over_grid_median": statistics.median(costs),
        "probe_seconds_over_grid_max": max(costs),
        "runs": rows,
    }


# ------------------------------------------------------------------------------ commands


def cmd_synthetic(a: argparse.Namespace) -> dict[str, Any]:
    space = load_space(a.space)
    usable = int(parse_budget(a.gpu_budget).resolve(None) * 0.95)
    entries = [synthetic_entry(c, usable) for c in grid(space, a.effective_batch)]
    return {"model": "synthetic", "device": "cuda", "seq_len": 512, "effective_batch": a.effective_batch,
            "budget_bytes": parse_budget(a.gpu_budget).resolve(None), "space": space.to_dict(), "entries": entries}


def cmd_record(a: argparse.Namespace) -> dict[str, Any]:
    """Delegates to benchmarks/record_landscape.py (one recorder: repeats, resume, atomic writes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import record_landscape

    return record_landscape.main(["--model", a.model, "--device", a.device, "--space", a.space,
                                  "--seq-len", str(a.seq_len), "--effective-batch", str(a.effective_batch),
                                  "--gpu-budget", a.gpu_budget, "--out", a.out])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    syn = sub.add_parser("synthetic", help="replay against a synthetic landscape")
    syn.add_argument("--space", default="default")
    syn.add_argument("--gpu-budget", default="14GiB")
    syn.add_argument("--effective-batch", type=int, default=32)
    rec = sub.add_parser("record", help="measure the whole grid with real probes and write the landscape")
    rec.add_argument("--model", required=True)
    rec.add_argument("--device", default="cpu")
    rec.add_argument("--space", default="cpu")
    rec.add_argument("--seq-len", type=int, default=128)
    rec.add_argument("--effective-batch", type=int, default=16)
    rec.add_argument("--gpu-budget", default="3GB")
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay", help="replay the search against a recorded landscape")
    rep.add_argument("landscape")
    for sp in (syn, rep):
        sp.add_argument("--trials", type=int, default=20)
        sp.add_argument("--seeds", type=int, default=10)
        sp.add_argument("--top-k", type=int, default=3)
    a = p.parse_args(argv)
    if a.cmd == "record":
        land = cmd_record(a)
        print(f"wrote {a.out} ({len(land['entries'])} configurations)")
        return
    land = cmd_synthetic(a) if a.cmd == "synthetic" else json.loads(Path(a.landscape).read_text())
    res = replay(land, trials=a.trials, seeds=a.seeds, top_k=a.top_k)
    runs = res.pop("runs")
    print(json.dumps(res, indent=1))
    for r in runs:
        print(f"seed {r['seed']}: best/optimum {r['ratio']:.3f}  probe-seconds/grid {r['cost']:.3f}  probes {r['probes']}")


if __name__ == "__main__":
    main()
