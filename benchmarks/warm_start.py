"""Does a probe forked from the warm server measure what a fresh probe process measures, and how much sooner?

The same request run alternately as a fresh ``python -m autotune.probe.worker`` process and forked from a
warm server (``autotune.executors.warm``; the server is started before the first pair, so its one-off
imports are reported apart), ``--repeats`` pairs. Prints, per start, the median and range of the wall
time, the set-up (launch -> first step), tokens/s and peak memory, and the forked/fresh ratios.

    python benchmarks/warm_start.py --repeats 7 --out benchmarks/results/warm_start-cpu.json
    python benchmarks/warm_start.py --device cuda --precision bf16 --seq-len 512 --micro-batch 8 \
        --repeats 3 --time-box 30 --jsonl rows.jsonl    # on a GPU (benchmarks/gpu_check.sh's "warm" step)

With ``--device cuda`` the server is opted in to fork CUDA probes (``WarmStarter(devices=...)``; ``autotune run``
forks CPU probes only): the server imports without initialising CUDA and each child initialises its own. What
the GPU figures decide: whether a forked CUDA probe measures what a fresh one does (tok/s, peak) and how much
of a GPU probe's set-up the fork saves. ``--time-box S``: start no new pair after S seconds (at least one pair
runs). ``--jsonl FILE``: append every row (``"step": "warm"``) and the summary to FILE.

Run it on a quiet machine (nothing else running: two processes on 2 cores slow each other many times).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.executors.local import run_probe_process  # noqa: E402
from autotune.executors.warm import WarmStarter  # noqa: E402
from autotune.models import resolve_model  # noqa: E402
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload, cuda_alloc_conf  # noqa: E402


def _request(args: argparse.Namespace) -> ProbeRequest:
    m = resolve_model(args.model)
    return ProbeRequest(
        Workload(model=m.name, model_path=m.path, seq_len=args.seq_len),
        Candidate(micro_batch=args.micro_batch, precision=args.precision, attn="sdpa"),
        ProbeSettings(device=args.device, warmup_steps=args.warmup, steps=args.steps, window="whole",
                      timeout_s=args.timeout, cuda_alloc_conf=cuda_alloc_conf(args.device, os.environ)),
    )


def _row(start: str, wall: float, r: Any) -> dict[str, Any]:
    m = r.metrics
    return {"start": start, "status": r.status, "wall_s": round(wall, 2), "setup_s": round(m.get("setup_s", 0), 2),
            "tokens_per_s": round(m.get("tokens_per_s", 0), 1), "peak_mib": round(m.get("peak_mem_bytes", 0) / 2**20, 1)}


def _summary(rows: list[dict[str, Any]], start: str) -> dict[str, Any]:
    """Median and range of each figure over the rows of one start that measured ({} when none did)."""
    ok = [r for r in rows if r["start"] == start and r["status"] == "ok"]
    out: dict[str, Any] = {}
    for key in ("wall_s", "setup_s", "tokens_per_s", "peak_mib"):
        v = [r[key] for r in ok]
        if v:
            out[key] = {"median": round(statistics.median(v), 3), "min": min(v), "max": max(v)}
    return out


def _append(path: Path | None, row: dict[str, Any]) -> None:
    if path is not None:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    ap.add_argument("--timeout", type=float, default=600.0, help="each probe's own limit (s)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--time-box", type=float, default=0.0, help="start no new pair after this many seconds")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--jsonl", type=Path, help="append each row and the summary to this JSON-lines file")
    args = ap.parse_args()
    began = time.time()
    warm = WarmStarter(devices=(args.device,))
    rows: list[dict[str, Any]] = []
    try:
        t = time.time()
        first = run_probe_process(_request(args), warm=warm)  # starts the server: its imports are reported apart
        server = {"import_s": warm.import_s, "first_probe_wall_s": round(time.time() - t, 2), "status": first.status,
                  "start": first.env.get("start"), "reason": first.reason}
        print(f"server: imports {warm.import_s} s; first probe ({first.env.get('start')}, {first.status}; waits for "
              f"them) {server['first_probe_wall_s']} s" + (f": {first.reason}" if first.status != "ok" else ""))
        _append(args.jsonl, {"step": "warm", "server": server, "device": args.device})
        for i in range(args.repeats):
            if i and args.time_box and time.time() - began > args.time_box:
                print(f"time box of {args.time_box:g} s reached after {i} pairs", flush=True)
                break
            for start in ("fresh", "forked"):
                t = time.time()
                r = run_probe_process(_request(args), warm=warm if start == "forked" else None)
                rows.append(_row(r.env.get("start", "fresh"), time.time() - t, r))
                _append(args.jsonl, {"step": "warm", "device": args.device, **rows[-1]})
                print(f"pair {i}: {rows[-1]}", flush=True)
                if r.status != "ok":
                    print(f"  {r.reason}", flush=True)
    finally:
        warm.close()
    result = {"command": " ".join(["python", "benchmarks/warm_start.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%d"), "server": server, "rows": rows,
              "fresh": _summary(rows, "fresh"), "forked": _summary(rows, "forked")}  # fmt: skip
    f, w = result["fresh"], result["forked"]
    if not f or not w:  # no forked (or no fresh) row: say so rather than a ratio of nothing
        print(f"no pair to compare: {len(rows)} rows, starts {sorted({r['start'] for r in rows})}")
        _append(args.jsonl, {"step": "warm", "device": args.device, "summary": result})
        return 1
    ratios = {k: round(w[k]["median"] / f[k]["median"], 3) if f[k]["median"] else None
              for k in ("wall_s", "setup_s", "tokens_per_s", "peak_mib")}
    result["forked_over_fresh"] = ratios
    _append(args.jsonl, {"step": "warm", "device": args.device, "summary": result})
    for start in ("fresh", "forked"):
        s = result[start]
        print(f"{start:6}: wall {s['wall_s']['median']} s ({s['wall_s']['min']}-{s['wall_s']['max']}), "
              f"set-up {s['setup_s']['median']} s, {s['tokens_per_s']['median']} tok/s "
              f"({s['tokens_per_s']['min']}-{s['tokens_per_s']['max']}), peak {s['peak_mib']['median']} MiB "
              f"({s['peak_mib']['min']}-{s['peak_mib']['max']})")
    print(f"forked / fresh (medians): wall {ratios['wall_s']}, set-up {ratios['setup_s']}, "
          f"tok/s {ratios['tokens_per_s']}, peak {ratios['peak_mib']}")
    if args.out:
        from autotune.store.atomic import write_text_atomic

        write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
