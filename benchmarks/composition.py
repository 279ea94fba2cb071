"""Is the composed step right? A short probe's composed tokens/s and peak vs a whole-step measurement.

    python benchmarks/composition.py --repeats 2 --json-out benchmarks/results/composition.json
    python benchmarks/composition.py --only full-a16,lora-a32 --repeats 3
    python benchmarks/composition.py --device cuda --model llama-3.2-1b --seq-len 2048 --micro-batch 4 \
        --grad-accum 8 --precision bf16 --repeats 1 --jsonl rows.jsonl    # one given configuration (the GPU pass)

For each configuration, interleaved (composed, whole, composed, whole, ...) so that drifting load hits
both alike:

composed  ``autotune probe ... --json`` (the default adaptive window): the Trainer runs at
          accumulation 2, a non-boundary micro-step and the boundary are timed, and the step at the
          configuration's accumulation A is composed as (A - 1) x micro-step + boundary.
whole     the same with ``--window whole``: ``--steps`` whole optimizer steps at accumulation A,
          timed directly (what every probe did before; its cost grows with A).

Printed per configuration: the median tokens/s of each (with every repeat and the spread), the
ratio composed / whole (goal: within +-10 % on a quiet machine), the peak memory of each (CPU: peak
RSS growth) and their ratio, and the wall time of each probe (the point: the composed one should not
grow with A). Run it on a quiet machine: nothing else may run (CPU figures swing by 20 % alone, and
far more beside other work).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# name -> probe flags; A spans 2-64; full, LoRA, packing, variable-length padding, torch.compile, 2-rank
# DDP, ZeRO-2
CASES: dict[str, list[str]] = {
    "full-a2": ["--model", "tiny-llama", "--seq-len", "64", "--micro-batch", "2", "--grad-accum", "2"],
    "full-a4": ["--model", "tiny-llama", "--seq-len", "64", "--micro-batch", "2", "--grad-accum", "4"],
    "full-a16": ["--model", "tiny-llama", "--seq-len", "64", "--micro-batch", "2", "--grad-accum", "16"],
    "full-a64": ["--model", "tiny-llama", "--seq-len", "64", "--micro-batch", "2", "--grad-accum", "64"],
    "qwen2-a32": ["--model", "tiny-qwen2", "--seq-len", "128", "--micro-batch", "4", "--grad-accum", "32"],
    "lora-a8": ["--model", "tiny-llama", "--seq-len", "64", "--micro-batch", "2", "--grad-accum", "8",
                "--mode", "lora"],
    "lora-a32": ["--model", "tiny-llama", "--seq-len", "64", "--micro-batch", "2", "--grad-accum", "32",
                 "--mode", "lora"],
    "packing-a16": ["--model", "tiny-llama", "--seq-len", "128", "--micro-batch", "4", "--grad-accum", "16",
                    "--packing", "--lengths", "uniform:16-128"],
    "padded-varlen-a16": ["--model", "tiny-llama", "--seq-len", "128", "--micro-batch", "4", "--grad-accum", "16",
                          "--lengths", "lognormal:3.8,0.6"],
    # not tuned on: recorded only after the slot pricing was added
    "padded-varlen-mb8-a32": ["--model", "tiny-qwen2", "--seq-len", "256", "--micro-batch", "8", "--grad-accum", "32",
                              "--lengths", "lognormal:4.2,0.8"],
    "compile-a16": ["--model", "tiny-llama", "--seq-len", "64", "--micro-batch", "2", "--grad-accum", "16",
                    "--compile"],
    "ddp2-a8": ["--model", "tiny-llama", "--seq-len", "64", "--micro-batch", "2", "--grad-accum", "8",
                "--world-size", "2"],
    "zero2-a8": ["--model", "tiny-llama", "--seq-len", "64", "--micro-batch", "2", "--grad-accum", "8",
                 "--world-size", "2", "--zero-stage", "2"],
}


def _probe(flags: list[str], *, window: str, a: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "autotune.cli.app", "probe", *flags, "--device", a.device, "--precision", a.precision,
           "--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps), "--window", window,
           "--timeout", str(a.timeout), "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ), timeout=a.timeout + 60)
    wall = time.perf_counter() - t0
    try:
        res = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"status": "crash", "reason": (proc.stderr or proc.stdout)[-400:], "wall_s": wall}
    m = res.get("metrics", {})
    return {"status": res.get("status"), "reason": res.get("reason", ""), "wall_s": wall,
            "tokens_per_s": m.get("tokens_per_s"), "peak_mem_bytes": m.get("peak_mem_bytes"),
            "composed": m.get("composed"), "rel_std_error": m.get("rel_std_error"),
            "timed_steps": m.get("timed_steps"), "probe_micro_batches": m.get("probe_micro_batches"),
            "stopped_early": m.get("stopped_early"), "composition": m.get("composition")}


def _spread(values: list[float]) -> float | None:
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--jsonl", default="", help="append one JSON row per configuration to this file")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--model", default="", help="one given configuration instead of the CPU cases")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=8)
    a = ap.parse_args(argv)
    if a.model:
        CASES.clear()
        CASES[f"{a.model}-a{a.grad_accum}"] = ["--model", a.model, "--seq-len", str(a.seq_len), "--micro-batch",
                                               str(a.micro_batch), "--grad-accum", str(a.grad_accum)]
    names = [n for n in a.only.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        runs: dict[str, list[dict[str, Any]]] = {"composed": [], "whole": []}
        for _ in range(a.repeats):
            for window, label in (("adaptive", "composed"), ("whole", "whole")):
                runs[label].append(_probe(CASES[name], window=window, a=a))
        row: dict[str, Any] = {"case": name, "flags": CASES[name], "runs": runs}
        for label in runs:
            ok = [r for r in runs[label] if r["status"] == "ok" and r["tokens_per_s"]]
            tps = [float(r["tokens_per_s"]) for r in ok]
            row[label] = {
                "ok": len(ok), "of": len(runs[label]),
                "tokens_per_s": tps, "median_tokens_per_s": statistics.median(tps) if tps else None,
                "spread": _spread(tps) if tps else None,
                "peak_mem_bytes": statistics.median([float(r["peak_mem_bytes"]) for r in ok]) if ok else None,
                "wall_s": statistics.median([r["wall_s"] for r in runs[label]]),
                "probe_micro_batches": [r.get("probe_micro_batches") for r in ok],
                "failures": [r["reason"][:200] for r in runs[label] if r["status"] != "ok"],
            }
        c, w = row["composed"], row["whole"]
        row["ratio"] = (c["median_tokens_per_s"] / w["median_tokens_per_s"]
                        if c["median_tokens_per_s"] and w["median_tokens_per_s"] else None)
        row["peak_ratio"] = (c["peak_mem_bytes"] / w["peak_mem_bytes"]
                             if c["peak_mem_bytes"] and w["peak_mem_bytes"] else None)
        row["within_10pct"] = row["ratio"] is not None and abs(row["ratio"] - 1) <= 0.10
        rows.append(row)
        _print_row(row)
        if a.jsonl:
            with open(a.jsonl, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": "composition", **{k: v for k, v in row.items() if k != "runs"}}) + "\n")
    met = sum(1 for r in rows if r["within_10pct"])
    print(f"\n{met}/{len(rows)} configurations within +-10 % (composed / whole tokens/s)")
    if a.json_out:
        out = Path(a.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps({"config": vars(a), "rows": rows}, indent=1))
        os.replace(tmp, out)
    return 0


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _print_row(r: dict[str, Any]) -> None:
    c, w = r["composed"], r["whole"]
    print(
        f"{r['case']:<18} composed {_fmt(c['median_tokens_per_s'], ',.0f')} tok/s "
        f"({', '.join(f'{v:,.0f}' for v in c['tokens_per_s'])}; spread {_fmt(c['spread'], '.0%')}) "
        f"| whole {_fmt(w['median_tokens_per_s'], ',.0f')} ({', '.join(f'{v:,.0f}' for v in w['tokens_per_s'])}; "
        f"spread {_fmt(w['spread'], '.0%')}) | ratio {_fmt(r['ratio'], '.3f')} | peak ratio "
        f"{_fmt(r['peak_ratio'], '.3f')} | wall {c['wall_s']:.0f} s vs {w['wall_s']:.0f} s"
        + (f" | failures: {c['failures'] + w['failures']}" if c["failures"] or w["failures"] else ""),
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
