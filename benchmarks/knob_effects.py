"""What each knob does to throughput in a recorded landscape: the tok/s ratio between every pair of
configurations that differ in that knob alone (median and range over the pairs); with ``--peak``, the same pairs'
peak-memory ratio.

    python benchmarks/knob_effects.py benchmarks/landscapes/cpu-tiny-llama-landscape-cpu-c.json
    python benchmarks/knob_effects.py --peak benchmarks/landscapes/cpu-tiny-llama-landscape-cpu-f.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def effects(landscape: dict[str, Any], field: str = "tokens_per_s") -> dict[str, tuple[float, float, float, int]]:
    """knob=value vs knob=other -> (median, min, max, pairs) of the ratio (value / other) of each entry's
    ``field``: tok/s, or ``peak_mem_bytes``."""
    by_cand = {json.dumps(e["candidate"], sort_keys=True): e for e in landscape["entries"] if e.get(field)}
    ratios: dict[str, list[float]] = {}
    for e in by_cand.values():
        c = e["candidate"]
        for knob, choices in landscape["space"].items():
            if knob in ("micro_batch", "gpus_per_trial") or len(choices) != 2:
                continue
            a, b = choices
            if c.get(knob) != a:
                continue
            other = by_cand.get(json.dumps({**c, knob: b}, sort_keys=True))
            if other is not None:
                ratios.setdefault(f"{knob}={b} vs {a}", []).append(other[field] / e[field])
    return {k: (statistics.median(v), min(v), max(v), len(v)) for k, v in sorted(ratios.items())}


def main(argv: list[str] | None = None) -> None:
    args = list(argv if argv is not None else sys.argv[1:])
    field = "peak_mem_bytes" if "--peak" in args else "tokens_per_s"
    for path in (a for a in args if a != "--peak"):
        print(Path(path).stem + (" (peak memory)" if field != "tokens_per_s" else ""))
        for k, (med, lo, hi, n) in effects(json.loads(Path(path).read_text()), field).items():
            print(f"  {k:40} median {med:.2f}x  range {lo:.2f}-{hi:.2f}x  ({n} pairs)")


if __name__ == "__main__":
    main()
