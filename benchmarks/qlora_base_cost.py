"""What a QLoRA probe saves now that its random-weight base is built once: build + save time on a CPU.

    python benchmarks/qlora_base_cost.py --model llama-3.2-1b --repeats 3 \
        --out benchmarks/results/qlora_base_cost-llama-3.2-1b.json

Each repeat, in a fresh temporary cache: the random-weight build (``from_config`` on the CPU, as a
QLoRA probe did before) and its safetensors save timed apart, then a second ``ensure_qlora_base`` (the
cache hit every later probe of the run, and of later runs, takes). Before the cache each QLoRA probe
paid build + save; now the first pays it once and the others pay the hit. The 4-bit load itself
(bitsandbytes, GPU only) is paid by every probe either way and is not timed here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one(cfg: object, dtype: str, seed: int) -> dict[str, float]:
    from autotune.probe import qlora_base

    with tempfile.TemporaryDirectory(prefix="qlora-base-bench-") as root:
        real = qlora_base._build_into
        split: dict[str, float] = {}

        def timed(folder: Path, cfg: object, *, dtype: str, seed: int, trust_remote_code: bool) -> None:
            import torch
            from transformers import AutoModelForCausalLM

            t0 = time.perf_counter()
            torch.manual_seed(seed)
            with torch.device("cpu"):
                m = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
            t1 = time.perf_counter()
            m.save_pretrained(str(folder), safe_serialization=True)
            split["build_s"] = t1 - t0
            split["save_s"] = time.perf_counter() - t1
            del m

        qlora_base._build_into = timed  # type: ignore[assignment]
        try:
            t0 = time.perf_counter()
            path, built = qlora_base.ensure_qlora_base(cfg, dtype=dtype, seed=seed, root=root)
            first = time.perf_counter() - t0
        finally:
            qlora_base._build_into = real  # type: ignore[assignment]
        assert built
        t0 = time.perf_counter()
        _, built_again = qlora_base.ensure_qlora_base(cfg, dtype=dtype, seed=seed, root=root)
        hit = time.perf_counter() - t0
        assert not built_again
        size = sum(p.stat().st_size for p in Path(path).iterdir())
        return {**split, "first_call_s": first, "hit_s": hit, "bytes": size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from transformers import AutoConfig

    from autotune.estimate import arch_from_config
    from autotune.models import resolve_model

    resolved = resolve_model(a.model)
    cfg = AutoConfig.from_pretrained(resolved.path, local_files_only=True)
    params = arch_from_config(resolved.config).params_total
    runs = [one(cfg, a.dtype, 42) for _ in range(a.repeats)]
    saved = [r["first_call_s"] - r["hit_s"] for r in runs]
    out = {
        "model": a.model, "params": params, "dtype": a.dtype, "repeats": a.repeats, "runs": runs,
        "median_build_s": statistics.median(r["build_s"] for r in runs),
        "median_save_s": statistics.median(r["save_s"] for r in runs),
        "median_hit_s": statistics.median(r["hit_s"] for r in runs),
        "median_saved_per_probe_s": statistics.median(saved), "saved_range_s": [min(saved), max(saved)],
        "cpu_count": os.cpu_count(), "platform": platform.platform(),
        "load_avg_at_end": os.getloadavg(),
    }
    text = json.dumps(out, indent=1)
    print(text)
    print(f"{a.model} ({params / 1e9:.2f}B, {a.dtype}): build {out['median_build_s']:.1f} s + save "
          f"{out['median_save_s']:.1f} s per probe before; a cache hit {out['median_hit_s'] * 1000:.1f} ms; "
          f"saved per probe {out['median_saved_per_probe_s']:.1f} s (range {min(saved):.1f}-{max(saved):.1f})",
          file=sys.stderr)
    if a.out:
        from autotune.store.atomic import write_text_atomic

        write_text_atomic(Path(a.out), text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
