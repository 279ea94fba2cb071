"""Record a probe *landscape*: every configuration of a search space measured with real probes.

    python benchmarks/record_landscape.py --model tiny-llama --space landscape-cpu-a --device cpu \
        --seq-len 128 --lengths lognormal:3.5,1.0 --effective-batch 8 --gpu-budget 200MiB

writes ``benchmarks/landscapes/<device>-<model>-<space>.json`` (``--out`` overrides). Probes run one
at a time through the local subprocess executor (no Ray, no Optuna: this also runs on a machine
that has neither). Each configuration is probed ``--repeats`` times (default 2) and every tok/s is
kept: the replay executor draws its noise from that spread.

Robust to being killed: the file is rewritten atomically after *every* probe, and a rerun resumes
(configurations that already have ``--repeats`` measurements are skipped). Probes go in passes:
first every configuration once, then the second repeat, so a recording cut short is still a
complete (single-repeat) landscape. ``--time-box`` stops starting new probes after that many
seconds. ``--threads 1`` pins each CPU probe to one thread: on a machine shared with other work,
two OpenMP threads competing for descheduled cores made probes several times slower (the first
recording attempt here measured 28 tok/s for a configuration that does ~10x that unloaded).

The budget. Probes run with a generous ceiling (``--probe-budget``, default 64 GiB) so that every
configuration is *measured*, memory included; the landscape's own budget (``--gpu-budget``) then
decides each entry's status (``over_budget`` when the largest peak seen exceeds the budget less the
probe headroom). Rerunning with another ``--gpu-budget`` re-labels the entries without probing.
Genuine failures (oom, crash, timeout, unsupported) keep their probe status.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# runnable as a script from the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.search import (  # noqa: E402
    candidate_from_choice,
    candidate_id,
    candidate_label,
    iter_choices,
    usable_micro_batches,
)
from autotune.spec.budget import parse_budget, parse_size  # noqa: E402
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload, cuda_alloc_conf  # noqa: E402
from autotune.spec.space import SearchSpace, load_space  # noqa: E402

__all__ = ["grid", "landscape_path", "entry_status", "relabel", "record", "main", "median_budget_text"]

LANDSCAPES = Path(__file__).resolve().parent / "landscapes"
FORMAT = 1
# metrics kept per repeat (the rest of a probe's metrics are not needed for replay)
_KEEP = ("tokens_per_s", "peak_mem_bytes", "step_time_median_s", "step_time_spread", "padding_fraction",
         "data_wait_fraction", "wall_s", "process_wall_s", "overhead_s", "loss_first", "loss_last", "mfu",
         # GPU memory parts: what calibrates CUDA_CONTEXT_BYTES and ALLOCATOR_RESERVE on a GPU
         "mem_torch_allocated_bytes", "mem_torch_reserved_bytes", "cuda_context_bytes", "mem_nvml_process_bytes",
         "non_torch_bytes", "nvml_process_visible", "memory_source", "gpu_util_mean", "cpu_util_mean",
         "recompiles_in_window")


def grid(space: SearchSpace, effective_batch: int) -> list[Candidate]:
    """Every distinct runnable candidate of ``space`` at ``effective_batch``, in a stable order."""
    mbs, _ = usable_micro_batches(space, effective_batch, list(space.gpus_per_trial))
    seen: dict[str, Candidate] = {}
    for choice in iter_choices(space, micro_batches=mbs, worlds=list(space.gpus_per_trial)):
        c = candidate_from_choice(choice, effective_batch=effective_batch)
        if isinstance(c, Candidate):
            seen.setdefault(candidate_id(c), c)
    return list(seen.values())


def landscape_path(device: str, model: str, space: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in f"{device}-{model}-{space}")
    return LANDSCAPES / f"{safe}.json"


def entry_status(entry: dict[str, Any], usable: int | None) -> str:
    """An entry's status under the landscape budget (see the module docstring)."""
    statuses = [r["status"] for r in entry.get("repeats", [])]
    if not statuses:
        return "missing"
    bad = [s for s in statuses if s not in ("ok", "over_budget")]
    if bad and len(bad) == len(statuses):
        return bad[0]
    peak = entry.get("peak_mem_bytes")
    if usable is not None and peak is not None and peak > usable:
        return "over_budget"
    return "ok" if any(s in ("ok", "over_budget") for s in statuses) else statuses[0]


def summarise(entry: dict[str, Any], usable: int | None) -> dict[str, Any]:
    """Fill an entry's summary fields from its repeats: median tok/s, spread, max peak, status."""
    reps = entry.get("repeats", [])
    measured = [r for r in reps if r["status"] in ("ok", "over_budget")]
    tps = [float(r["metrics"]["tokens_per_s"]) for r in measured if r["metrics"].get("tokens_per_s")]
    peaks = [int(r["metrics"]["peak_mem_bytes"]) for r in reps if r["metrics"].get("peak_mem_bytes") is not None]
    walls = [float(r["metrics"].get("process_wall_s") or r["metrics"].get("wall_s") or 0.0) for r in reps]
    entry["tokens_per_s_all"] = tps
    entry["tokens_per_s"] = statistics.median(tps) if tps else None
    entry["spread"] = (max(tps) - min(tps)) / statistics.median(tps) if len(tps) > 1 else 0.0
    entry["peak_mem_bytes"] = max(peaks) if peaks else None
    entry["wall_s"] = statistics.median(walls) if walls else None
    entry["status"] = entry_status(entry, usable)
    entry["reason"] = next((r["reason"] for r in reps if r.get("reason")), "")
    if entry["status"] == "over_budget" and usable is not None and entry["peak_mem_bytes"] is not None:
        entry["reason"] = f"peak {entry['peak_mem_bytes'] / 2**20:.0f} MiB > usable {usable / 2**20:.0f} MiB"
    return entry


def median_budget_text(land: dict[str, Any]) -> str:
    """The budget rule of benchmarks/record_new_landscapes.sh: usable memory = the median peak of the
    configurations (about half are over budget), i.e. budget = median / (1 - headroom), whole MiB up."""
    import math

    peaks = [e["peak_mem_bytes"] for e in land["entries"] if e.get("peak_mem_bytes")]
    missing = len(land["entries"]) - len(peaks)
    if missing or not peaks:
        raise SystemExit(f"{missing} configuration(s) have no peak memory yet: finish the recording first")
    usable = statistics.median(peaks)
    return f"{math.ceil(usable / (1 - land.get('headroom', 0.05)) / 2**20)}MiB"


def relabel(land: dict[str, Any]) -> dict[str, Any]:
    usable = int(land["budget_bytes"] * (1.0 - land.get("headroom", 0.05))) if land.get("budget_bytes") else None
    for e in land["entries"]:
        summarise(e, usable)
    ok = [e for e in land["entries"] if e["status"] == "ok" and e.get("tokens_per_s")]
    land["grid_size"] = len(land["entries"])
    land["feasible"] = len(ok)
    land["infeasible_share"] = 1.0 - len(ok) / max(1, len(land["entries"]))
    land["optimum_tokens_per_s"] = max((e["tokens_per_s"] for e in ok), default=None)
    best = max(ok, key=lambda e: e["tokens_per_s"], default=None)
    land["optimum_label"] = candidate_label(Candidate(**best["candidate"])) if best else None
    spreads = [e["spread"] for e in land["entries"] if len(e.get("tokens_per_s_all") or []) > 1]
    land["median_repeat_spread"] = statistics.median(spreads) if spreads else None
    land["repeats"] = min((len(e.get("repeats", [])) for e in land["entries"]), default=0)
    return land


def _write(out: Path, land: dict[str, Any]) -> None:
    from autotune.store.atomic import write_json_atomic

    write_json_atomic(out, land, indent=1)
    out.chmod(0o644)  # the atomic write's temporary file is private; a landscape is for reading


def _fingerprint(device: str) -> dict[str, Any]:
    try:
        from autotune.env import fingerprint

        return fingerprint(device)
    except Exception as exc:  # the fingerprint is informative, never a reason to stop
        return {"error": repr(exc)}


def record(a: argparse.Namespace, *, log: Any = print) -> dict[str, Any]:
    from autotune.executors.local import run_probe_process
    from autotune.models import resolve_model
    space = load_space(a.space)
    resolved = resolve_model(a.model)
    budget = parse_budget(a.gpu_budget).resolve(None)
    probe_budget = parse_size(a.probe_budget, what="probe budget")
    out = Path(a.out) if a.out else landscape_path(a.device, a.model, Path(a.space).stem)
    workload = Workload(model=resolved.name, model_path=resolved.path, seq_len=a.seq_len, lengths=a.lengths,
                        mode=a.mode)
    settings = ProbeSettings(device=a.device, budget_bytes=probe_budget, budget_text=a.probe_budget,
                             warmup_steps=a.warmup, steps=a.steps, timeout_s=a.timeout,
                             cpu_threads=a.threads or None, cuda_alloc_conf=cuda_alloc_conf(a.device, os.environ))
    cands = grid(space, a.effective_batch)
    if a.shuffle:  # a recording cut short by --time-box is then a random sample, not one corner
        import random

        random.Random(0).shuffle(cands)
    meta = {"format": FORMAT, "model": a.model, "device": a.device, "space_name": Path(a.space).stem,
            "seq_len": a.seq_len, "lengths": a.lengths, "mode": a.mode, "effective_batch": a.effective_batch,
            "budget_text": a.gpu_budget, "budget_bytes": budget, "headroom": settings.headroom,
            "probe_budget_bytes": probe_budget, "warmup_steps": a.warmup, "steps": a.steps,
            "cpu_threads": a.threads or None,
            "space": space.to_dict()}
    land: dict[str, Any] = {**meta, "command": " ".join(sys.argv), "environment": [], "entries": []}
    if out.exists():
        import json

        old = json.loads(out.read_text())
        for k in ("model", "device", "seq_len", "lengths", "mode", "effective_batch", "warmup_steps", "steps",
                  "space", "cpu_threads"):
            was = old.get(k, "full" if k == "mode" else None)  # (recordings before --mode were all full)
            if was != meta[k]:
                raise SystemExit(f"{out} was recorded with {k}={was!r}, not {meta[k]!r}: use another --out")
        land = {**old, **meta}
    by_id = {e["id"]: e for e in land["entries"]}
    for c in cands:
        cid = candidate_id(c)
        if cid not in by_id:
            by_id[cid] = {"id": cid, "candidate": dataclasses.asdict(c), "repeats": []}
            land["entries"].append(by_id[cid])
    fp = _fingerprint(a.device)
    if not land["environment"] or land["environment"][-1] != fp:
        land["environment"].append(fp)
    relabel(land)
    _write(out, land)
    t0 = time.monotonic()
    todo = sum(max(0, a.repeats - len(by_id[candidate_id(c)]["repeats"])) for c in cands)
    done = 0
    for rep in range(a.repeats):
        for c in cands:
            e = by_id[candidate_id(c)]
            if len(e["repeats"]) > rep:
                continue
            if a.time_box and time.monotonic() - t0 > a.time_box:
                log(f"time box of {a.time_box:.0f}s reached: {todo - done} probe(s) left; rerun to resume")
                return land
            r = run_probe_process(ProbeRequest(workload=workload, candidate=c, settings=settings))
            e["repeats"].append({"status": r.status, "reason": r.reason[:500],
                                 "metrics": {k: r.metrics.get(k) for k in _KEEP if k in r.metrics},
                                 "losses": r.metrics.get("losses"), "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
            relabel(land)
            _write(out, land)
            done += 1
            tps = r.tokens_per_s
            log(f"[{done}/{todo} {time.monotonic() - t0:.0f}s] repeat {rep + 1} {r.status} "
                f"{'' if tps is None else f'{tps:.0f} tok/s'} peak "
                f"{(r.peak_mem_bytes or 0) / 2**20:.0f} MiB  {candidate_label(c)}")
    spread = land["median_repeat_spread"]
    log(f"wrote {out}: {land['grid_size']} configurations x {land['repeats']} repeats, {land['feasible']} fit, "
        f"{land['infeasible_share']:.0%} infeasible, median repeat spread "
        f"{'-' if spread is None else f'{spread:.0%}'}, optimum {land['optimum_tokens_per_s']:.0f} tok/s "
        f"({land['optimum_label']})" if land["optimum_tokens_per_s"] else f"wrote {out}: nothing fits")
    return land


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--space", required=True, help="search space name or YAML path")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lengths", default="fixed", help="sequence lengths, e.g. lognormal:3.5,1.0")
    p.add_argument("--mode", default="full", choices=("full", "lora"), help="fine-tuning mode of every probe")
    p.add_argument("--effective-batch", type=int, default=8)
    p.add_argument("--gpu-budget", required=True, help="the landscape's budget (decides over_budget)")
    p.add_argument("--probe-budget", default="64GiB", help="ceiling the probes themselves run with")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads per probe (0: the probe's default, all cores); 1 is steadier on a busy machine")
    p.add_argument("--time-box", type=float, default=0.0, help="seconds; stop starting probes after it")
    p.add_argument("--shuffle", action="store_true", help="probe in a (seeded) random order")
    p.add_argument("--out", default="")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parser().parse_args(argv)
    return record(a, log=lambda m: print(m, file=sys.stderr, flush=True))


if __name__ == "__main__":
    main()
