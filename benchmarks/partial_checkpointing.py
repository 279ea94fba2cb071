"""What partial activation checkpointing (``--ckpt-every K``: one decoder layer in K recomputed) does to
speed and memory, measured by real probes: no checkpointing, one layer in 4, one in 2, every layer,
interleaved, each repeated, each in a fresh process (``autotune probe``).

    python benchmarks/partial_checkpointing.py --model tiny-llama --seq-len 1024 --micro-batch 8 \
        --repeats 3 --out benchmarks/results/partial_checkpointing-cpu.json

Prints, per configuration, the median tokens/s with the range over the repeats, and the peak memory the
probe measured (on a CPU: the resident-set peak, which also holds the interpreter and the model). Run it
alone: other processes on the machine move CPU figures far more than the lever does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CONFIGS: list[tuple[str, list[str]]] = [
    ("no checkpointing", ["--no-grad-ckpt"]),
    ("1 layer in 4", ["--grad-ckpt", "--ckpt-every", "4"]),
    ("1 layer in 2", ["--grad-ckpt", "--ckpt-every", "2"]),
    ("every layer", ["--grad-ckpt", "--ckpt-every", "1"]),
]


def probe(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "autotune", "probe", "--model", args.model, "--device", args.device,
           "--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch), "--precision", args.precision,
           "--gpu-budget", args.gpu_budget, "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode not in (0, 3):
        raise SystemExit(f"probe failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout)
    m = result.get("metrics") or {}
    return {"status": result["status"], "tokens_per_s": m.get("tokens_per_s"), "peak_mem_bytes": m.get("peak_mem_bytes"),
            "memory_source": m.get("memory_source"), "step_time_median_s": m.get("step_time_median_s")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--gpu-budget", default="20GB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in CONFIGS}
    for r in range(args.repeats):  # interleaved: drift hits every configuration alike
        for name, extra in CONFIGS:
            runs[name].append(probe(args, extra))
            last = runs[name][-1]
            print(f"repeat {r}: {name:16} {last['status']:>6} {last['tokens_per_s'] or 0:8.1f} tok/s  "
                  f"peak {(last['peak_mem_bytes'] or 0) / 2**20:8.1f} MiB", flush=True)
    summary = {}
    for name, _ in CONFIGS:
        tps = [x["tokens_per_s"] for x in runs[name] if x["tokens_per_s"]]
        peaks = [x["peak_mem_bytes"] for x in runs[name] if x["peak_mem_bytes"]]
        summary[name] = {"tokens_per_s_median": statistics.median(tps) if tps else None,
                         "tokens_per_s_range": [min(tps), max(tps)] if tps else None,
                         "peak_mem_bytes_median": statistics.median(peaks) if peaks else None,
                         "peak_mem_bytes_range": [min(peaks), max(peaks)] if peaks else None}
        s = summary[name]
        if tps and peaks:
            print(f"{name:16} {s['tokens_per_s_median']:8.1f} tok/s ({min(tps):.1f}-{max(tps):.1f})  peak "
                  f"{s['peak_mem_bytes_median'] / 2**20:8.1f} MiB ({min(peaks) / 2**20:.1f}-{max(peaks) / 2**20:.1f})")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": {k: str(v) for k, v in vars(args).items()},
                                        "runs": runs, "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
