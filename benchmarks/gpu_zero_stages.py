"""ZeRO stages 0-3, with and without CPU offload, on one GPU: tok/s and peak memory per stage.

    python benchmarks/gpu_zero_stages.py results/gpu_zero_stages-h200.json            # GPU, llama-3.2-1b, seq 2048
    python benchmarks/gpu_zero_stages.py /tmp/zero-dry.json --dry-run                 # CPU, tiny-llama, seq 64

Each row is one real probe (``run_probe_process``: the launcher, the HF Trainer with the DeepSpeed
config or FSDP, a timed window) of the same workload with a different ZeRO stage / offload. With
deepspeed installed the rows use DeepSpeed; without it (the H200 box has none) FSDP stands in
where it is equivalent (ZeRO-3 ~ full_shard, ZeRO-1/2 ~ shard_grad_op, ZeRO-3 param offload ~ FSDP
CPU offload); optimizer-only offload has no FSDP twin and is recorded as unsupported. Every row is
written to the JSON file as soon as it is measured, so a run cut short keeps what it measured.

``run_zero_stages(out, dry_run=...)`` is the entry point the one-pass GPU script calls.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.executors.local import run_probe_process  # noqa: E402
from autotune.probe.launch import fsdp_stand_in  # noqa: E402
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload  # noqa: E402
from autotune.store.atomic import write_json_atomic  # noqa: E402

# (zero stage, offload): every stage plain, then each offload where it is defined
STAGES: tuple[tuple[int, str], ...] = (
    (0, "none"),
    (1, "none"),
    (2, "none"),
    (3, "none"),
    (1, "optimizer"),
    (2, "optimizer"),
    (3, "optimizer"),
    (3, "params"),
)

GPU_DEFAULTS = {"model": "llama-3.2-1b", "seq_len": 2048, "micro_batch": 4, "precision": "bf16",
                "attn": "sdpa", "device": "cuda", "warmup_steps": 2, "steps": 5, "timeout_s": 600.0}  # fmt: skip
DRY_DEFAULTS = {"model": "tiny-llama", "seq_len": 64, "micro_batch": 2, "precision": "fp32",
                "attn": "sdpa", "device": "cpu", "warmup_steps": 1, "steps": 2, "timeout_s": 600.0}  # fmt: skip

ROW_METRICS = (
    "tokens_per_s",
    "peak_mem_bytes",
    "step_time_median_s",
    "step_time_spread",
    "mem_torch_reserved_bytes",
    "mem_torch_allocated_bytes",
    "mem_nvml_process_bytes",
    "mem_rss_growth_bytes",
    "overhead_s",
    "wall_s",
    "distributed_type",
    "param_type",
    "num_params",
    "real_tokens",
    "window_s",
)


def _request(cfg: dict[str, Any], candidate: Candidate) -> ProbeRequest:
    from autotune.models import resolve_model

    resolved = resolve_model(cfg["model"])
    return ProbeRequest(
        Workload(model=resolved.name, model_path=resolved.path, seq_len=cfg["seq_len"]),
        candidate,
        ProbeSettings(
            device=cfg["device"],
            warmup_steps=cfg["warmup_steps"],
            steps=cfg["steps"],
            timeout_s=cfg["timeout_s"],
        ),
    ).validate()


def run_zero_stages(
    out: str | Path,
    *,
    dry_run: bool = False,
    sharding: str = "auto",
    world_size: int = 1,
    stages: tuple[tuple[int, str], ...] = STAGES,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Probe every (stage, offload) in ``stages``; write ``out`` after each row; return the record."""
    cfg = dict(DRY_DEFAULTS if dry_run else GPU_DEFAULTS)
    cfg.update(overrides or {})
    has_ds = importlib.util.find_spec("deepspeed") is not None
    if sharding == "auto":
        sharding = "deepspeed" if has_ds else "fsdp"
    record: dict[str, Any] = {
        "benchmark": "gpu_zero_stages",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "dry_run": dry_run,
        "model": cfg["model"],
        "config": cfg,
        "world_size": world_size,
        "sharding": sharding,
        "deepspeed_installed": has_ds,
        "host": platform.node(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "env": None,
        "rows": [],
    }
    base = Candidate(
        micro_batch=cfg["micro_batch"], precision=cfg["precision"], attn=cfg["attn"], world_size=world_size
    )
    for stage, offload in stages:
        cand = replace(base, zero_stage=stage, offload=offload, sharding="deepspeed")
        row: dict[str, Any] = {"zero_stage": stage, "offload": offload}
        if stage > 0 and sharding == "fsdp":
            stand_in = fsdp_stand_in(cand)
            if stand_in is None:
                row.update(status="unsupported", sharding="fsdp",
                           reason="no FSDP equivalent of optimizer-only offload (deepspeed not installed)")  # fmt: skip
                record["rows"].append(row)
                write_json_atomic(out, record)
                print(f"ZeRO-{stage} offload={offload}: unsupported (no FSDP equivalent)", flush=True)
                continue
            cand = stand_in
        row["sharding"] = cand.sharding if stage > 0 else "none"
        t0 = time.time()
        res = run_probe_process(_request(cfg, cand))
        row.update(status=res.status, reason=res.reason, probe_s=round(time.time() - t0, 1))
        row.update({k: res.metrics.get(k) for k in ROW_METRICS})
        if record["env"] is None and res.env.get("packages"):
            record["env"] = {k: v for k, v in res.env.items() if k != "stderr_tail"}
        if res.status == "crash" and res.env.get("stderr_tail"):
            row["stderr_tail"] = res.env["stderr_tail"][-1500:]
        record["rows"].append(row)
        write_json_atomic(out, record)
        tps = row.get("tokens_per_s")
        peak = row.get("peak_mem_bytes")
        print(
            f"ZeRO-{stage} offload={offload} ({row['sharding']}): {res.status}"
            + (f", {tps:.0f} tok/s" if tps else "")
            + (f", peak {peak / 2**30:.2f} GiB" if peak else "")
            + (f" [{res.reason[:160]}]" if res.status != "ok" else ""),
            flush=True,
        )
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_json_atomic(out, record)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write (rewritten after every row)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny-llama, seq 64: the same code, small")
    ap.add_argument("--sharding", choices=("auto", "deepspeed", "fsdp"), default="auto",
                    help="auto: deepspeed if installed, else the FSDP stand-ins")  # fmt: skip
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--model")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--micro-batch", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--timeout", type=float)
    a = ap.parse_args(argv)
    overrides = {
        k: v
        for k, v in {
            "model": a.model,
            "seq_len": a.seq_len,
            "micro_batch": a.micro_batch,
            "steps": a.steps,
            "timeout_s": a.timeout,
        }.items()
        if v is not None
    }
    record = run_zero_stages(
        a.out, dry_run=a.dry_run, sharding=a.sharding, world_size=a.world_size, overrides=overrides
    )
    print(json.dumps({"out": a.out, "rows": len(record["rows"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
