"""How long `autotune run` takes to answer: on paper for the target workloads' GPUs, measured on a tiny model.

    python benchmarks/time_to_answer.py paper [--json OUT]
    python benchmarks/time_to_answer.py simulate [--draws 30] [--costless] [--keep-packing] [--interactions X] [--json OUT]
    python benchmarks/time_to_answer.py measure [--model tiny-llama] [--batches 8,32,128] [--json OUT]

``paper``: for each workload, the planner's configuration (``autotune plan``'s choice: micro-batch,
accumulation, levers) and its step time (``autotune.estimate.predict_speed``), and the probes a
default ``autotune run`` makes (``--max-trials`` 40, or fewer when the default space holds fewer
distinct configurations; then the confirmation: (``--top-k`` 3 + the HF-default baseline) x the GPU
policy's rounds, ``ConfirmPolicy.for_device("cuda").rounds_for(3)``, at twice ``--steps``). Per probe:

* before: set-up + (warm-up + steps) whole optimizer steps at the true accumulation ``A``, under the
  fixed 300 s deadline (a probe predicted past it is killed there: the search measures nothing);
* after: set-up + the probe window (``autotune.spec.probe_window``: ``probe_grad_accum`` micro-batches
  per optimizer step), at its maximum (every timed step) and at the adaptive window's minimum
  (``MIN_TIMED_STEPS``), as ``autotune.estimate.probe_time`` predicts it.

Time to answer = search probes x probe + confirmation probes x confirmation probe, one at a time
(one GPU). Goals: story 1 (Llama-3.1-8B LoRA, seq 4096, effective batch 32) in at most 15 min on
an A10G and 5 min on an H100; the script says whether each is met.

``simulate``: counts the probes instead of assuming them. For each story-1 GPU it builds a simulated
landscape of the space a default run searches there (``search_spaces/lora.yaml``, torch.compile left out as
the run leaves it out): every configuration's tok/s is the planner's prediction (``predict_speed``) times
one factor per lever value, drawn uniformly in 0.7-1.3 (each lever's effect perturbed by up to +-30 %),
its peak the memory model's times one factor per lever value in 0.9-1.1, and its probe time
``predict_probe_time``'s set-up plus its window (the adaptive window's minimum, ``MIN_TIMED_STEPS``) at the
configuration's simulated speed; repeats spread 3 %. A GPU window is taken as stable at its minimum, so a
confirmation probe (twice the maximum steps) stops there too and costs what a search probe costs (the
landscape's ``timed_steps``, as ``paper`` counts it). Then the real ``Searcher`` searches it
through the replay executor, with the ``model`` strategy (``--strategy model``, the estimator's prior), with
the default walk (``--max-trials`` 40) and with the walk stopped once it has settled
(``--stop-when-converged``), ``--draws`` landscapes each (the baseline and a top-2 confirmation for all; the
model strategy weighs each probe by the run's own probe-time prediction, ``--costless``: every probe the same;
``--interactions X``: each pair of values of two searched levers multiplies tok/s by one more factor in 1 +- X, effects
that do not multiply as the model strategy's additive model assumes). Printed: probes,
time to answer (the probes' predicted times, one GPU) and best found / the landscape's optimum, median and
worst draw.

``measure``: runs ``autotune run --model tiny-llama --device cpu`` (``--fresh``, its own ``--out``)
at effective batch 8, 32 and 128 and reports each wall time; goal: the 128 run takes at most
1.5 x the 8 run. Run it on a quiet machine; ``--max-trials``/``--steps`` make a quick dry run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.search import ConfirmPolicy  # noqa: E402

# (label, model, gpu, mode, seq_len, effective_batch, story goal in seconds or None)
WORKLOADS = [
    ("story 1: 8B LoRA", "llama-3.1-8b", "A10G", "lora", 4096, 32, 15 * 60),
    ("story 1: 8B LoRA", "llama-3.1-8b", "A100-80GB", "lora", 4096, 32, None),
    ("story 1: 8B LoRA", "llama-3.1-8b", "H100-SXM", "lora", 4096, 32, 5 * 60),
    ("1B full fine-tune", "llama-3.2-1b", "H100-SXM", "full", 2048, 64, None),
    ("story 2: 7B QLoRA", "qwen2.5-7b", "T4", "qlora", 2048, 64, None),
]
OLD_DEADLINE_S = 300.0
# `autotune run`'s defaults (cli/run.py)
MAX_TRIALS, TOP_K, STEPS, WARMUP = 40, 3, 5, 2
# the GPU confirmation's rounds for the top-k (ConfirmPolicy.rounds_for: one, the search measurements the second ordering)
CONFIRM_ROUNDS = ConfirmPolicy.for_device("cuda").rounds_for(TOP_K)


def _minutes(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min"


def paper() -> list[dict[str, Any]]:
    from autotune.estimate import arch_from_config, find_gpu, plan, predict_speed
    from autotune.estimate.probe_time import predict_probe_time
    from autotune.models import resolve_model
    from autotune.run import baseline_candidate, default_space_for
    from autotune.search import confirmation_probes, distinct_candidates, usable_micro_batches, usable_worlds
    from autotune.spec.probe_request import ProbeSettings, Workload
    from autotune.spec.probe_window import MIN_TIMED_STEPS
    from autotune.spec.space import load_space

    rows = []
    for label, model, gpu_name, mode, seq, eb, goal in WORKLOADS:
        space = load_space(default_space_for("cuda", mode, 1))  # what a default run on one GPU searches
        resolved = resolve_model(model)
        arch = arch_from_config(resolved.config)
        gpu = find_gpu(gpu_name)
        p = plan(resolved.config, gpus=[gpu], gpus_per_node=1, seq_len=seq, effective_batch=eb, mode=mode,
                 model_name=resolved.name)
        opt = p.rows[0].option
        if opt is None:
            rows.append({"workload": label, "gpu": gpu_name, "error": "the planner finds nothing that fits"})
            continue
        cand, wl = opt.candidate, Workload(model=resolved.name, seq_len=seq, mode=opt.mode)
        step = predict_speed(arch, wl, cand, gpu).step_time_s
        worlds, _ = usable_worlds(space, 1)
        mbs, _ = usable_micro_batches(space, eb, worlds)
        distinct = distinct_candidates(space, effective_batch=eb, micro_batches=mbs, worlds=worlds)
        search = min(MAX_TRIALS, distinct) if distinct else MAX_TRIALS
        confirm = confirmation_probes(TOP_K, baseline_candidate(space, eb, "cuda") is not None, CONFIRM_ROUNDS)
        s_search = ProbeSettings(device="cuda", warmup_steps=WARMUP, steps=STEPS)
        s_confirm = dataclasses.replace(s_search, steps=2 * STEPS)
        s_adaptive = dataclasses.replace(s_search, steps=MIN_TIMED_STEPS)
        after = predict_probe_time(arch, wl, cand, s_search, device="cuda", gpu=gpu)
        after_c = predict_probe_time(arch, wl, cand, s_confirm, device="cuda", gpu=gpu)
        adaptive = predict_probe_time(arch, wl, cand, s_adaptive, device="cuda", gpu=gpu)
        # torch.compile does not compose (the probe times whole steps at the true accumulation)
        compiled = predict_probe_time(arch, wl, dataclasses.replace(cand, torch_compile=True), s_search,
                                      device="cuda", gpu=gpu)
        assert after is not None and after_c is not None and adaptive is not None and compiled is not None
        setup = after.setup_s
        before = setup + (WARMUP + STEPS) * step
        before_c = setup + (WARMUP + 2 * STEPS) * step
        killed = before > OLD_DEADLINE_S
        before_tta = search * min(before, OLD_DEADLINE_S) + confirm * min(before_c, OLD_DEADLINE_S)
        after_tta = search * after.total_s + confirm * after_c.total_s
        adaptive_tta = (search + confirm) * adaptive.total_s
        row = {
            "workload": label, "model": model, "gpu": gpu_name, "mode": opt.mode, "seq_len": seq,
            "effective_batch": eb, "candidate": f"mb{cand.micro_batch}x{cand.grad_accum}",
            "plan_step_time_s": round(step, 2), "setup_s": round(setup, 1), "search_probes": search,
            "confirm_probes": confirm, "before_probe_s": round(before, 1), "before_killed_at_300s": killed,
            "before_time_to_answer_s": round(before_tta, 1), "after_probe_s": round(after.total_s, 1),
            "after_time_to_answer_s": round(after_tta, 1), "after_adaptive_probe_s": round(adaptive.total_s, 1),
            "after_adaptive_time_to_answer_s": round(adaptive_tta, 1), "goal_s": goal,
            "after_compile_probe_s": round(compiled.total_s, 1),
        }
        if goal is not None:
            row["goal_met"] = adaptive_tta <= goal
            row["probes_in_goal"] = int(goal // adaptive.total_s)
        rows.append(row)
    return rows


def print_paper(rows: list[dict[str, Any]]) -> None:
    head = ("| workload | GPU | plan config | step s | probes (search + confirm) | before: probe | before: answer | "
            "after: probe (max / adaptive) | after: answer (max / adaptive) | after: a torch.compile probe | goal |")
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for r in rows:
        if "error" in r:
            print(f"| {r['workload']} | {r['gpu']} | {r['error']} |")
            continue
        before = f"{r['before_probe_s']:.0f} s" + (" (killed at 300 s)" if r["before_killed_at_300s"] else "")
        answer_before = _minutes(r["before_time_to_answer_s"]) + (" (no answer)" if r["before_killed_at_300s"] else "")
        goal = "" if r["goal_s"] is None else (
            f"<= {_minutes(r['goal_s'])}: " + ("met" if r["goal_met"] else
                                               f"NOT met ({r['probes_in_goal']} probes fit in it)"))
        print(f"| {r['workload']} | {r['gpu']} | {r['candidate']} | {r['plan_step_time_s']:.1f} | "
              f"{r['search_probes']} + {r['confirm_probes']} | {before} | {answer_before} | "
              f"{r['after_probe_s']:.0f} / {r['after_adaptive_probe_s']:.0f} s | "
              f"{_minutes(r['after_time_to_answer_s'])} / {_minutes(r['after_adaptive_time_to_answer_s'])} | "
              f"{r['after_compile_probe_s']:.0f} s | {goal} |")
    missed = [r for r in rows if r.get("goal_met") is False]
    for r in missed:
        print(f"goal NOT met: {r['workload']} on {r['gpu']} answers in ~"
              f"{_minutes(r['after_adaptive_time_to_answer_s'])} at best, above {_minutes(r['goal_s'])} "
              f"(a probe is ~{r['after_adaptive_probe_s']:.0f} s; {r['search_probes'] + r['confirm_probes']} probes)")


# the levers whose every larger value holds more memory with the same other levers (simulated_landscape)
MONOTONE_MEMORY = ("micro_batch", "ckpt_every")


def simulated_landscape(model: str, gpu_name: str, mode: str, seq: int, eb: int, draw: int, *,
                        keep_packing: bool = False, interactions: float = 0.0) -> dict[str, Any]:
    """A story's space on one GPU as the planner predicts it, each lever value's effect perturbed (``simulate``).
    ``keep_packing``: the space with packing searched on the fixed-length story too (``--keep-packing``: the
    situation's space before it left packing out), for an A/B on the same draws. ``interactions``: each pair of
    values of two searched levers also multiplies tok/s by a factor drawn in 1 +- it (``--interactions``), drawn
    after the per-value factors, so the per-value factors of a draw stay what they were without it."""
    import random

    sys.path.insert(0, str(REPO / "benchmarks"))
    from record_landscape import grid

    from autotune.estimate import arch_from_config, estimate_memory, find_gpu, predict_speed
    from autotune.estimate.probe_time import predict_probe_time
    from autotune.models import resolve_model
    from autotune.run import default_space_for, situation_space
    from autotune.spec.probe_request import ProbeSettings, Workload
    from autotune.spec.probe_window import MIN_TIMED_STEPS
    from autotune.spec.space import DIMENSIONS, load_space

    # the space a run with no --space searches for this fixed-length story: torch.compile and packing left out;
    # each lever value's factors are drawn over it with packing kept (as before packing was left out), so a draw
    # is the same landscape with or without the packed configurations
    named, _ = situation_space(load_space(default_space_for("cuda", mode, 1)), variable_lengths=True)
    space = named if keep_packing else situation_space(named, variable_lengths=False)[0]
    resolved = resolve_model(model)
    arch, gpu = arch_from_config(resolved.config), find_gpu(gpu_name)
    wl = Workload(model=resolved.name, seq_len=seq, mode=mode)
    rng = random.Random(draw)
    speed_fx = {(d, v): rng.uniform(0.7, 1.3) for d in DIMENSIONS for v in named.choices(d)}
    mem_fx = {(d, v): rng.uniform(0.9, 1.1) for d in DIMENSIONS for v in named.choices(d)}
    # memory grows with the micro-batch and with the layers left unchecked (ckpt_every): their factors go up
    # with the value, so a larger micro-batch never needs less memory than a smaller one with the same levers
    for d in MONOTONE_MEMORY:
        values = sorted(space.choices(d))
        for v, f in zip(values, sorted(mem_fx[(d, v)] for v in values), strict=True):
            mem_fx[(d, v)] = f
    # two levers' joint effect beyond their separate ones (the effects of a real GPU need not multiply)
    searched = [d for d in DIMENSIONS if len(named.choices(d)) > 1]
    pair_fx = {((d1, v1), (d2, v2)): rng.uniform(1 - interactions, 1 + interactions)
               for i, d1 in enumerate(searched) for d2 in searched[i + 1:]
               for v1 in named.choices(d1) for v2 in named.choices(d2)} if interactions else {}
    settings = ProbeSettings(device="cuda", warmup_steps=WARMUP, steps=MIN_TIMED_STEPS)
    entries = []
    for c in grid(space, eb):
        values = [(d, c.world_size if d == "gpus_per_trial" else getattr(c, d)) for d in DIMENSIONS]
        planned = tps = predict_speed(arch, wl, c, gpu).tokens_per_s
        peak = estimate_memory(arch, wl, c, gpu=gpu).total
        for key in values:
            tps *= speed_fx.get(key, 1.0)
            peak *= mem_fx.get(key, 1.0)
        for i, a in enumerate(values):
            for b in values[i + 1:]:
                tps *= pair_fx.get((a, b), 1.0)
        probe_s = predict_probe_time(arch, wl, c, settings, device="cuda", gpu=gpu)
        # the window runs at the configuration's simulated speed, not the planner's
        window_s = None if probe_s is None else probe_s.window_s * planned / tps
        # over the budget, the probe (capped at it) stops at its out-of-memory error in the first optimizer
        # step: its set-up and at most two micro-batches (the composed window's first boundary) of its window
        oom_s = None if probe_s is None or window_s is None else \
            probe_s.setup_s + window_s * min(1.0, 2 / max(1, probe_s.micro_batches))
        entries.append({"candidate": dataclasses.asdict(c), "tokens_per_s_all": [tps * 0.985, tps * 1.015],
                        "peak_mem_bytes": int(peak), "status": "ok",
                        "wall_s": probe_s.setup_s + window_s if probe_s is not None and window_s is not None else 60.0,
                        "over_budget_wall_s": oom_s})
    # a run's probes have up to STEPS timed steps; on a GPU each window is stable after its MIN_TIMED_STEPS and stops
    # there (timed_steps): a confirmation probe, whose maximum is twice as long, stops there too
    return {"model": model, "device": "cuda", "gpu": gpu_name, "seq_len": seq, "lengths": "fixed", "mode": mode, "effective_batch": eb,
            "budget_bytes": int(gpu.memory_bytes), "headroom": 0.05, "steps": STEPS, "timed_steps": MIN_TIMED_STEPS,
            "warmup_steps": WARMUP, "space": space.to_dict(), "entries": entries,
            "name": f"{model} {mode} on {gpu_name}, draw {draw}"}


def simulate(draws: int, *, costless: bool = False, keep_packing: bool = False,
             interactions: float = 0.0) -> list[dict[str, Any]]:
    import statistics

    sys.path.insert(0, str(REPO / "benchmarks"))
    import search_quality as sq

    sq.COSTLESS = costless

    rows = []
    for label, model, gpu_name, mode, seq, eb, goal in WORKLOADS:
        if not label.startswith("story 1"):
            continue
        runs: dict[str, list[tuple[int, float, float]]] = {"model": [], "walk": [], "walk, converged stop": []}
        nothing_fits = 0
        for draw in range(draws):
            try:
                p = sq.problem(simulated_landscape(model, gpu_name, mode, seq, eb, draw, keep_packing=keep_packing,
                                                   interactions=interactions))
            except SystemExit:  # the draw's memory factors put every configuration over the budget
                nothing_fits += 1
                continue
            for name in runs:
                sq.SEARCHER_OPTIONS.clear()
                if name == "walk, converged stop":
                    sq.SEARCHER_OPTIONS["stop_when_converged"] = True
                chosen, ex = (sq.run_model(p, draw, 0) if name == "model"
                              else sq.run_autotune(p, draw, MAX_TRIALS + (TOP_K + 1) * CONFIRM_ROUNDS))
                runs[name].append((ex.probes, ex.probe_seconds, p.score(chosen)))
            sq.SEARCHER_OPTIONS.clear()
        for name, vals in runs.items():
            if not vals:
                continue
            probes, secs, scores = zip(*vals, strict=True)
            rows.append({"workload": label, "gpu": gpu_name, "strategy": name, "draws": draws - nothing_fits,
                         "draws_where_nothing_fits": nothing_fits,
                         "probes_median": statistics.median(probes), "probes_max": max(probes),
                         "time_s_median": statistics.median(secs), "time_s_max": max(secs),
                         "best_over_optimum_median": statistics.median(scores),
                         "best_over_optimum_min": min(scores), "goal_s": goal,
                         "goal_met": None if goal is None else statistics.median(secs) <= goal})
    return rows


def print_simulate(rows: list[dict[str, Any]]) -> None:
    print("| workload | GPU | strategy | draws | probes (median / most) | time to answer (median / worst) | "
          "best / optimum (median / worst) | goal |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        goal = "" if r["goal_s"] is None else f"<= {_minutes(r['goal_s'])}: " + ("met" if r["goal_met"] else "NOT met")
        draws = f"{r['draws']}" + (f" (+{r['draws_where_nothing_fits']} where nothing fits)"
                                   if r["draws_where_nothing_fits"] else "")
        print(f"| {r['workload']} | {r['gpu']} | {r['strategy']} | {draws} | {r['probes_median']:g} / {r['probes_max']} | "
              f"{_minutes(r['time_s_median'])} / {_minutes(r['time_s_max'])} | "
              f"{r['best_over_optimum_median']:.3f} / {r['best_over_optimum_min']:.3f} | {goal} |")


def measure(model: str, batches: list[int], max_trials: int | None, steps: int | None, extra: list[str]) \
        -> list[dict[str, Any]]:
    rows = []
    cli = [sys.executable, "-m", "autotune.cli.app"] if not (Path(sys.executable).parent / "autotune").exists() \
        else [str(Path(sys.executable).parent / "autotune")]
    with tempfile.TemporaryDirectory(prefix="time-to-answer-") as out:
        for eb in batches:
            cmd = cli + ["run", "--model", model, "--device", "cpu", "--gpu-budget", "8GB", "--seq-len", "128",
                         "--effective-batch", str(eb), "--fresh", "--json", "--out", out]
            if max_trials is not None:
                cmd += ["--max-trials", str(max_trials)]
            if steps is not None:
                cmd += ["--steps", str(steps)]
            cmd += extra
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
            wall = time.perf_counter() - t0
            summary: dict[str, Any] = {}
            try:
                summary = json.loads(proc.stdout)
            except ValueError:
                pass
            rows.append({"effective_batch": eb, "wall_s": round(wall, 1), "exit": proc.returncode,
                         "probes_run": summary.get("probes_run"),
                         "predicted_s": ((summary.get("search") or {}).get("deadlines") or {}).get("forecast", {})
                         .get("time_to_answer_s"),
                         "stderr_tail": proc.stderr.strip().splitlines()[-1:] if proc.returncode else []})
            print(f"effective batch {eb}: {wall:.1f} s (exit {proc.returncode}, {summary.get('probes_run')} probes)",
                  file=sys.stderr)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    sub.add_parser("paper").add_argument("--json", default=None)
    sim = sub.add_parser("simulate")
    sim.add_argument("--draws", type=int, default=30)
    sim.add_argument("--costless", action="store_true",
                     help="the model strategy without a cost per probe: every probe the same (for an A/B of the cost)")
    sim.add_argument("--keep-packing", action="store_true",
                     help="search packing on the fixed-length story too, as the situation's space did before it left "
                          "packing out (the same draws: for an A/B of that rule)")
    sim.add_argument("--interactions", type=float, default=0.0, metavar="X",
                     help="also multiply tok/s by a factor in 1 +- X per pair of searched lever values (0 <= X < 1): "
                          "effects that do not multiply, as a real GPU's need not")
    sim.add_argument("--json", default=None)
    m = sub.add_parser("measure")
    m.add_argument("--model", default="tiny-llama")
    m.add_argument("--batches", default="8,32,128")
    m.add_argument("--max-trials", type=int, default=None)
    m.add_argument("--steps", type=int, default=None)
    m.add_argument("--json", default=None)
    a, extra = ap.parse_known_args()
    if a.mode == "paper":
        rows = paper()
        print_paper(rows)
        out: Any = rows
        ok = all(r.get("goal_met") is not False for r in rows)
    elif a.mode == "simulate":
        if not 0.0 <= a.interactions < 1.0:
            ap.error(f"--interactions takes a number in [0, 1); got {a.interactions}")
        rows = simulate(a.draws, costless=a.costless, keep_packing=a.keep_packing, interactions=a.interactions)
        print_simulate(rows)
        out = rows
        ok = all(r["goal_met"] is not False for r in rows if r["strategy"] == "model")
    else:
        rows = measure(a.model, [int(b) for b in a.batches.split(",")], a.max_trials, a.steps, extra)
        first, last = rows[0], rows[-1]
        ratio = last["wall_s"] / first["wall_s"] if first["wall_s"] else None
        ok = all(r["exit"] == 0 for r in rows) and ratio is not None and ratio <= 1.5
        print("| effective batch | wall | probes | predicted |\n|---|---|---|---|")
        for r in rows:
            pred = f"{r['predicted_s']:.0f} s" if r["predicted_s"] else "-"
            print(f"| {r['effective_batch']} | {r['wall_s']:.1f} s | {r['probes_run']} | {pred} |")
        verdict = "met" if ok else "NOT met"
        print(f"goal (effective batch {last['effective_batch']} within 1.5x of {first['effective_batch']}): "
              f"{verdict}, ratio {ratio:.2f}" if ratio is not None else "goal: no measurement")
        out = {"rows": rows, "ratio": ratio, "goal_met": ok}
    if a.json:
        from autotune.store.atomic import write_text_atomic

        write_text_atomic(Path(a.json), json.dumps(out, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
