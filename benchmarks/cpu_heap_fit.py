"""The CPU memory model's retained heap, fitted on recorded CPU landscapes and scored on others.

    python benchmarks/cpu_heap_fit.py [--fit f,g,h,i,j,k,l] [--held-out s,t,u] [--json OUT]

A CPU probe measures its peak RSS growth with glibc's default malloc (as the user's training runs), which keeps
freed heap mapped; the estimator's tensor model counts live tensors only. ``autotune/estimate/memory.py`` adds

    heap_retained = CPU_HEAP_FIXED_BYTES + (CPU_HEAP_RETAINED + [checkpointing] CPU_HEAP_RETAINED_CKPT) x P

where P is the activation working set (``ACTIVATION_TERMS``) of the same configuration without checkpointing.
This script fits the three constants to ``measured peak - live estimate`` by least squares on the relative error
(each row weighed by 1 / its peak; rows off by more than 10 % down-weighted in proportion, a Huber-like
reweighting, so that a few configurations with an effect of their own do not set the constants) over the
landscapes named by ``--fit`` (default F-L, recorded 2026-11-30 to 2026-12-05), then scores the live-tensor
model and the shipped constants on every landscape, those of the fit, those recorded after the constants were
set (``--held-out``, default S-U) and the others apart: the median predicted / measured peak and the share within
+-15 %.

Landscapes A-E (and B's quiet repeat) are left out: they were recorded while CPU probes ran with
``MALLOC_MMAP_THRESHOLD_=65536`` (freed blocks of 64 KiB and more went back to the system at once), so their
peaks are the live tensors, which the estimate less ``heap_retained`` (``MemoryBreakdown.live``) is.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.estimate import arch_from_config, estimate_memory  # noqa: E402
from autotune.estimate.memory import (  # noqa: E402
    ACTIVATION_TERMS,
    CPU_HEAP_FIXED_BYTES,
    CPU_HEAP_RETAINED,
    CPU_HEAP_RETAINED_CKPT,
)
from autotune.models import resolve_model  # noqa: E402
from autotune.spec.probe_request import Candidate, Workload  # noqa: E402

__all__ = ["LIVE_HEAP_LANDSCAPES", "fit", "rows", "score", "main"]

LANDSCAPES = REPO / "benchmarks" / "landscapes"
# recorded while CPU probes returned freed blocks >= 64 KiB to the system (their peaks are live tensors)
LIVE_HEAP_LANDSCAPES = frozenset({"a", "b", "b-quiet", "c", "d", "e"})
DEFAULT_FIT = ("f", "g", "h", "i", "j", "k", "l")
# recorded after the constants were set (benchmarks/record_new_landscapes.sh S T U)
DEFAULT_HELD_OUT = ("s", "t", "u")
WITHIN = 0.15
MiB = 2**20


def _letter(path: Path) -> str:
    return path.stem.split("-cpu-", 1)[1]


def rows(paths: list[Path]) -> list[dict[str, Any]]:
    """One row per measured configuration: its landscape, peak, live estimate, P and checkpointing."""
    out = []
    for path in paths:
        land = json.loads(path.read_text())
        arch = arch_from_config(resolve_model(land["model"]).config)
        wl = Workload(model=land["model"], seq_len=int(land["seq_len"]), lengths=land.get("lengths", "fixed"),
                      mode=land.get("mode") or "full")
        for e in land["entries"]:
            peak = e.get("peak_mem_bytes")
            if not peak or e.get("status") not in ("ok", "over_budget"):
                continue
            c = Candidate(**e["candidate"])
            est = estimate_memory(arch, wl, c, device="cpu")
            plain = estimate_memory(arch, wl, dataclasses.replace(c, grad_ckpt=False), device="cpu")
            produced = sum(plain.phase_terms["backward_start"].get(k, 0) for k in ACTIVATION_TERMS)
            out.append({"landscape": _letter(path), "id": e.get("id"), "measured": float(peak),
                        "live": float(est.live), "shipped": float(est.total), "produced": float(produced),
                        "ckpt": bool(c.grad_ckpt)})
    return out


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (3 x 3)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit(data: list[dict[str, Any]], *, iterations: int = 20) -> dict[str, float]:
    """The three constants by relative least squares, rows off by more than 10 % down-weighted."""
    xs = [[1.0, r["produced"], r["produced"] * r["ckpt"]] for r in data]
    ys = [r["measured"] - r["live"] for r in data]
    base = [1.0 / r["measured"] for r in data]
    hw = [1.0] * len(data)
    coef = [0.0, 0.0, 0.0]
    for _ in range(iterations + 1):
        w = [(b * h) ** 2 for b, h in zip(base, hw, strict=True)]
        ata = [[sum(wi * x[i] * x[j] for wi, x in zip(w, xs, strict=True)) for j in range(3)] for i in range(3)]
        aty = [sum(wi * x[i] * y for wi, x, y in zip(w, xs, ys, strict=True)) for i in range(3)]
        coef = _solve(ata, aty)
        res = [abs(sum(c * xi for c, xi in zip(coef, x, strict=True)) - y) * b
               for x, y, b in zip(xs, ys, base, strict=True)]
        hw = [1.0 if r < 0.1 else 0.1 / r for r in res]
    return {"fixed_bytes": coef[0], "retained": coef[1], "retained_ckpt": coef[2]}


def score(ratios: list[float]) -> dict[str, Any]:
    return {"rows": len(ratios), "median": round(statistics.median(ratios), 3),
            "within_15": round(sum(abs(r - 1) <= WITHIN for r in ratios) / len(ratios), 3),
            "under_0_85": sum(r < 1 - WITHIN for r in ratios), "min": round(min(ratios), 2),
            "max": round(max(ratios), 2)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", default=",".join(DEFAULT_FIT), help="landscape letters to fit on (comma-separated)")
    ap.add_argument("--held-out", default=",".join(DEFAULT_HELD_OUT),
                    help="landscape letters recorded after the constants were set (comma-separated)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    fit_set = {x.strip() for x in a.fit.split(",") if x.strip()}
    held = {x.strip() for x in a.held_out.split(",") if x.strip()} - fit_set
    paths = [p for p in sorted(LANDSCAPES.glob("cpu-*.json")) if _letter(p) not in LIVE_HEAP_LANDSCAPES]
    data = rows(paths)
    fitted = fit([r for r in data if r["landscape"] in fit_set])
    shipped = {"fixed_bytes": CPU_HEAP_FIXED_BYTES, "retained": CPU_HEAP_RETAINED,
               "retained_ckpt": CPU_HEAP_RETAINED_CKPT}
    groups: dict[str, dict[str, Any]] = {}
    for name, keep in (("fit", lambda r: r["landscape"] in fit_set), ("held out", lambda r: r["landscape"] in held),
                       ("other", lambda r: r["landscape"] not in fit_set | held)):
        sel = [r for r in data if keep(r)]
        if sel:
            groups[name] = {"live tensors": score([r["live"] / r["measured"] for r in sel]),
                            "shipped": score([r["shipped"] / r["measured"] for r in sel])}
    per = {}
    for letter in sorted({r["landscape"] for r in data}):
        sel = [r for r in data if r["landscape"] == letter]
        per[letter] = {"fit": letter in fit_set, "held_out": letter in held, "live tensors": score([r["live"] / r["measured"] for r in sel]),
                       "shipped": score([r["shipped"] / r["measured"] for r in sel])}
    out = {"command": "python benchmarks/cpu_heap_fit.py" + (f" --fit {a.fit}" if a.fit != ",".join(DEFAULT_FIT) else "")
           + (f" --held-out {a.held_out}" if a.held_out != ",".join(DEFAULT_HELD_OUT) else ""),
           "fit_landscapes": sorted(fit_set), "held_out_landscapes": sorted(held), "fitted": fitted, "shipped": shipped, "groups": groups,
           "landscapes": per}
    print(f"fitted on {','.join(sorted(fit_set))}: fixed {fitted['fixed_bytes'] / MiB:.1f} MiB, retained "
          f"{fitted['retained']:.3f}, + with checkpointing {fitted['retained_ckpt']:.3f}; shipped "
          f"{CPU_HEAP_FIXED_BYTES / MiB:.0f} MiB, {CPU_HEAP_RETAINED}, {CPU_HEAP_RETAINED_CKPT}")
    print(f"{'':22s} {'rows':>5s} {'live: median':>13s} {'within 15%':>11s} {'shipped: median':>16s} {'within 15%':>11s} {'< 0.85':>7s}")
    tags = {(True, False): " (fit)", (False, True): " (held out)"}
    for name, g in [*groups.items(), *((f"landscape {k.upper()}" + tags.get((v["fit"], v["held_out"]), ""), v)
                                        for k, v in per.items())]:
        lv, sh = g["live tensors"], g["shipped"]
        print(f"{name:22s} {sh['rows']:5d} {lv['median']:13.2f} {lv['within_15']:11.0%} {sh['median']:16.2f} "
              f"{sh['within_15']:11.0%} {sh['under_0_85']:7d}")
    if a.json:
        from autotune.store.atomic import write_text_atomic

        write_text_atomic(a.json, json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
