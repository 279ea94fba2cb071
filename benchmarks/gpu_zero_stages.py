"""ZeRO stages 0-3, with and without CPU offload, on one GPU: tok/s and peak memory per stage.

    python benchmarks/gpu_zero_stages.py results/gpu_zero_stages-h200.json            # GPU, llama-3.2-1b, seq 2048
    python benchmarks/gpu_zero_stages.py /tmp/zero-dry.json --dry-run                 # CPU, tiny-llama, seq 64

Each row is one real probe (``run_probe_process``: the launcher, the HF Trainer with the DeepSpeed
config or FSDP, a timed window) of the same workload with a different ZeRO stage / offload. With
deepspeed installed the rows use DeepSpeed; without it (the H200 box has none) FSDP stands in
where it is equivalent (ZeRO-3 ~ full_shard, ZeRO-1/2 ~ shard_grad_op, ZeRO-3 param offload ~ FSDP
CPU offload); optimizer-only offload has no FSDP twin and is recorded as unsupported. Every row is
written to the JSON file as soon as it is measured, so a run cut short keeps what it measured.

``--sharding both`` probes each stage under DeepSpeed and under FSDP (the one-pass GPU check
carries a deepspeed wheel, so the two engines are compared rather than FSDP standing in twice for
ZeRO-1 and ZeRO-2, which made one configuration run twice). ``--order pass`` puts the rows in the
order the pass values them (stage 0, ZeRO-2, ZeRO-3, offload; ZeRO-1 last), ``--jsonl FILE``
appends each row to FILE as it lands, ``--time-box S`` stops starting rows after S seconds.

``run_zero_stages(out, dry_run=...)`` is the entry point the one-pass GPU script calls.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
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
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload, cuda_alloc_conf  # noqa: E402
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


# (zero stage, offload, engine) in the order the one-pass GPU check values them: the baseline, the
# ZeRO stages users ask about (2, 3) under both engines, the offloads, then ZeRO-1
PASS_ORDER: tuple[tuple[int, str, str], ...] = (
    (0, "none", "none"),
    (2, "none", "deepspeed"),
    (3, "none", "deepspeed"),
    (3, "none", "fsdp"),
    (3, "params", "fsdp"),
    (3, "params", "deepspeed"),
    (2, "optimizer", "deepspeed"),
    (2, "none", "fsdp"),
    (1, "none", "deepspeed"),
    (3, "optimizer", "deepspeed"),
)


def _rows_plan(
    stages: tuple[tuple[int, str], ...], sharding: str, order: str
) -> list[tuple[int, str, str]]:
    """(stage, offload, engine) rows: engine is deepspeed, fsdp (stand-in or compared), or none."""
    if order == "pass":
        engines = {"deepspeed", "fsdp"} if sharding == "both" else {sharding}
        return [r for r in PASS_ORDER if r[2] == "none" or r[2] in engines]
    engines_list = ["deepspeed", "fsdp"] if sharding == "both" else [sharding]
    out: list[tuple[int, str, str]] = []
    for stage, offload in stages:
        if stage == 0:
            out.append((0, offload, "none"))
        else:
            out.extend((stage, offload, e) for e in engines_list)
    return out


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
            cuda_alloc_conf=cuda_alloc_conf(cfg["device"], os.environ),  # as autotune run's probes
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
    order: str = "stages",
    jsonl: str | Path | None = None,
    time_box: float = 0.0,
) -> dict[str, Any]:
    """Probe every (stage, offload) in ``stages``; write ``out`` after each row; return the record."""
    cfg = dict(DRY_DEFAULTS if dry_run else GPU_DEFAULTS)
    cfg.update(overrides or {})
    has_ds = importlib.util.find_spec("deepspeed") is not None
    if sharding == "auto" or (sharding == "both" and not has_ds):
        # without deepspeed its rows would only be refused, one process each
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
    t_start = time.monotonic()

    def land(row: dict[str, Any]) -> None:
        record["rows"].append(row)
        write_json_atomic(out, record)
        if jsonl:
            with open(jsonl, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": "zero", "model": cfg["model"], "seq_len": cfg["seq_len"],
                                     "device": cfg["device"], **row}, default=str) + "\n")  # fmt: skip

    for stage, offload, engine in _rows_plan(stages, sharding, order):
        if time_box and time.monotonic() - t_start > time_box:
            print(f"time box of {time_box:.0f}s reached", flush=True)
            break
        cand = replace(base, zero_stage=stage, offload=offload, sharding="deepspeed")
        row: dict[str, Any] = {"zero_stage": stage, "offload": offload}
        if stage > 0 and engine == "fsdp":
            stand_in = fsdp_stand_in(cand)
            if stand_in is None:
                row.update(status="unsupported", sharding="fsdp",
                           reason="no FSDP equivalent of optimizer-only offload")  # fmt: skip
                land(row)
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
        land(row)
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
    ap.add_argument("--sharding", choices=("auto", "deepspeed", "fsdp", "both"), default="auto",
                    help="auto: deepspeed if installed, else the FSDP stand-ins; both: each stage under each")  # fmt: skip
    ap.add_argument("--order", choices=("stages", "pass"), default="stages",
                    help="pass: the one-pass check's order (baseline, ZeRO-2/3 both engines, offloads, ZeRO-1)")
    ap.add_argument("--jsonl", help="append every row here as it lands")
    ap.add_argument("--time-box", type=float, default=0.0, help="seconds; stop starting rows after it")
    ap.add_argument("--warmup", type=int)
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
            "warmup_steps": a.warmup,
        }.items()
        if v is not None
    }
    record = run_zero_stages(
        a.out, dry_run=a.dry_run, sharding=a.sharding, world_size=a.world_size, overrides=overrides,
        order=a.order, jsonl=a.jsonl, time_box=a.time_box,
    )
    print(json.dumps({"out": a.out, "rows": len(record["rows"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
