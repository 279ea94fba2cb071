"""A real `autotune run` with a CPU-burning job started half-way: honest figure, or a warning?

    python benchmarks/busy_run.py --model tiny-qwen2 --seq-len 256 --effective-batch 16 \\
        --gpu-budget 350MB --max-trials 8 --burn-after 60 --burners 2 --json-out busy.json

1. ``autotune run --device cpu --space cpu --fresh --json`` starts on a quiet machine;
2. after ``--burn-after`` seconds, ``--burners`` processes that burn a core each start (not children
   of autotune: another user's job, as far as autotune can tell) and run until the search ends;
3. then, quiet again, the chosen configuration is probed ``--quiet-repeats`` times with the
   confirmation's window (2 x steps) by ``autotune probe``.

Passes when the run's reported tok/s is within ±25 % of the quiet median, or the run says its
answer is doubtful (``summary.json`` ``trust.doubtful``, with load warnings). Prints both.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BURN = "import time\nwhile True: pass"


def candidate_flags(c: dict[str, Any]) -> list[str]:
    return ["--micro-batch", str(c["micro_batch"]), "--grad-accum", str(c["grad_accum"]),
            "--grad-ckpt" if c["grad_ckpt"] else "--no-grad-ckpt", "--attn", c["attn"], "--workers", str(c["workers"]),
            "--pin-memory" if c["pin_memory"] else "--no-pin-memory", "--precision", c["precision"],
            "--packing" if c["packing"] else "--no-packing", "--optim", c["optim"]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-qwen2")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--effective-batch", type=int, default=16)
    ap.add_argument("--gpu-budget", default="350MB")
    ap.add_argument("--lengths", default="fixed")
    ap.add_argument("--max-trials", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--confirm-rounds", default="2:4")
    ap.add_argument("--burn-after", type=float, default=60.0)
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--quiet-repeats", type=int, default=3)
    ap.add_argument("--json-out", default="")
    a = ap.parse_args(argv)
    py = [sys.executable, "-m", "autotune"]
    with tempfile.TemporaryDirectory(prefix="autotune-busy-") as tmp:
        cmd = py + ["run", "--model", a.model, "--device", "cpu", "--space", "cpu", "--gpu-budget", a.gpu_budget,
                    "--seq-len", str(a.seq_len), "--effective-batch", str(a.effective_batch), "--lengths", a.lengths,
                    "--max-trials", str(a.max_trials), "--steps", str(a.steps), "--top-k", str(a.top_k),
                    "--confirm-rounds", a.confirm_rounds, "--fresh", "--json", "--out", tmp]
        t0 = time.monotonic()
        run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        burners: list[subprocess.Popen[bytes]] = []
        try:
            while run.poll() is None and time.monotonic() - t0 < a.burn_after:
                time.sleep(0.5)
            burn_started = time.monotonic() - t0
            if run.poll() is None:
                burners = [subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
                           for _ in range(a.burners)]
            out, err = run.communicate()
        finally:
            for b in burners:
                os.killpg(b.pid, signal.SIGKILL)
                b.wait()
        wall = time.monotonic() - t0
        if run.returncode != 0:
            raise SystemExit(f"autotune run exited {run.returncode}: {err[-1500:]}")
        summary = json.loads(out)
    best = summary["best"]
    quiet = []
    for _ in range(a.quiet_repeats):
        p = subprocess.run(py + ["probe", "--model", a.model, "--device", "cpu", "--seq-len", str(a.seq_len),
                                 "--lengths", a.lengths, "--steps", str(2 * a.steps), "--json",
                                 *candidate_flags(best["candidate"])], capture_output=True, text=True)
        quiet.append(float(json.loads(p.stdout)["metrics"]["tokens_per_s"]))
    q = statistics.median(quiet)
    reported = float(best["tokens_per_s"])
    off = reported / q - 1.0
    trust = summary.get("trust") or {}
    res = {
        "command": " ".join(cmd[2:]), "burn_started_s": round(burn_started, 1), "wall_s": round(wall, 1),
        "burners": a.burners, "chosen": best["label"], "reported_tokens_per_s": reported,
        "reported_values": best.get("tokens_per_s_measurements"), "confirm_status": best.get("confirm_status"),
        "quiet_tokens_per_s": quiet, "quiet_median": q, "reported_vs_quiet": off,
        "warnings": len(summary.get("warnings") or []), "doubtful": bool(trust.get("doubtful")),
        "reasons": trust.get("reasons"), "speedup_vs_baseline": summary.get("speedup_vs_baseline"),
        "speedup_range": summary.get("speedup_range"),
    }
    res["pass"] = abs(off) <= 0.25 or (res["doubtful"] and res["warnings"] > 0)
    print(f"burners started at {res['burn_started_s']} s of a {res['wall_s']} s run; chosen {res['chosen']}")
    print(f"reported {reported:,.0f} tok/s ({res['confirm_status']}, values {res['reported_values']}); quiet "
          f"re-measurement {q:,.0f} ({', '.join(f'{v:,.0f}' for v in quiet)}): {off:+.0%}")
    print(f"warnings {res['warnings']}, doubtful {res['doubtful']} ({'; '.join(res['reasons'] or [])})")
    print("PASS" if res["pass"] else "FAIL: a figure more than 25 % off, reported without a warning")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return res


if __name__ == "__main__":
    main()
