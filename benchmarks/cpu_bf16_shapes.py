"""How a CPU process's memory grows with the number of distinct batch widths under bf16 autocast.

    python benchmarks/cpu_bf16_shapes.py [--model tiny-gpt2] [--micro-batch 8] [--max-len 256] [--steps 80]
                                         [--json OUT]

Each case trains the model (random weights, AdamW) for ``--steps`` steps in a fresh process and reports the
growth of its peak RSS (``ru_maxrss``) over the model's build after 5, 10, 20, 40 ... steps, with the number of
distinct widths seen by then:

* ``fixed``: every batch ``--max-len`` wide;
* ``ten``: ten widths, 64 to ``--max-len`` (what padding to a multiple of a tenth of the length gives);
* ``uniform``: any width in 64 to ``--max-len`` (unpacked real data, padded to its longest row);

in fp32 and under ``torch.autocast("cpu", dtype=torch.bfloat16)``, and the uniform bf16 case again with oneDNN's
primitive cache off (``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0``) and with torch's oneDNN (mkldnn) kernels off.

What it shows (benchmarks/README.md has the figures): in fp32 the peak is flat whatever the widths; in bf16 it is
flat for fixed widths, stops growing once the ten widths have all been seen, and keeps growing with every new width
in the uniform case, by tens of MiB per width for a 4-layer model: the bf16 matmuls run through oneDNN, which keeps
per-shape primitives and scratch buffers. A short probe sees a few dozen widths; a long run sees every width its
data has. So on a CPU, a bf16 probe with variable-length batches measures a lower bound of a long run's peak.
Run it alone on a quiet machine (the steps take seconds; the memory figures do not depend on load).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

CHECKPOINTS = (5, 10, 20, 40, 80, 160, 320)

_CHILD = r"""
import json, os, random, resource, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from autotune.models import resolve_model
a = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(a["threads"])
if a["mkldnn_off"]:
    torch.backends.mkldnn.enabled = False
cfg = AutoConfig.for_model(**resolve_model(a["model"]).config)
model = AutoModelForCausalLM.from_config(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base, rng, seen, out = rss(), random.Random(0), set(), []
hi = a["max_len"]
tenth = max(1, (hi - 64) // 9)
for step in range(1, a["steps"] + 1):
    width = hi if a["widths"] == "fixed" else (64 + tenth * rng.randint(0, 9) if a["widths"] == "ten" else rng.randint(64, hi))
    seen.add(width)
    x = torch.randint(0, cfg.vocab_size, (a["micro_batch"], width))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a["precision"] == "bf16"):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step in a["checkpoints"]:
        out.append({"step": step, "widths": len(seen), "rss_growth_bytes": rss() - base})
print(json.dumps(out))
"""


def case(model: str, widths: str, precision: str, *, micro_batch: int, max_len: int, steps: int,
         threads: int, env: dict[str, str] | None = None, mkldnn_off: bool = False) -> list[dict[str, Any]]:
    """One case in a fresh process: the RSS growth at each checkpoint."""
    args = {"model": model, "widths": widths, "precision": precision, "micro_batch": micro_batch,
            "max_len": max_len, "steps": steps, "threads": threads, "mkldnn_off": mkldnn_off,
            "checkpoints": [c for c in CHECKPOINTS if c <= steps]}
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    res = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True,
                         env=full_env, check=True, timeout=1800)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-gpt2")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    kw = {"micro_batch": a.micro_batch, "max_len": a.max_len, "steps": a.steps, "threads": a.threads}
    cases = [(f"{w} {p}", {"widths": w, "precision": p}) for p in ("fp32", "bf16") for w in ("fixed", "ten", "uniform")]
    cases += [("uniform bf16, ONEDNN_PRIMITIVE_CACHE_CAPACITY=0",
               {"widths": "uniform", "precision": "bf16", "env": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}}),
              ("uniform bf16, torch.backends.mkldnn off", {"widths": "uniform", "precision": "bf16", "mkldnn_off": True})]
    out: dict[str, Any] = {"command": "python benchmarks/cpu_bf16_shapes.py " + " ".join(argv or sys.argv[1:]),
                           "model": a.model, **kw, "cases": {}}
    for name, spec in cases:
        rows = case(a.model, **spec, **kw)
        out["cases"][name] = rows
        print(f"{name:50s} " + "  ".join(f"{r['step']}:{r['widths']}w {r['rss_growth_bytes'] / 2**20:.0f}MiB" for r in rows),
              flush=True)
    if a.json:
        from autotune.store.atomic import write_text_atomic

        write_text_atomic(a.json, json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
