"""What does measuring through the Trainer cost?

1. Fixed overhead as a share of a default probe's wall time: the setup (launch -> first step:
   imports, model build, data, Trainer construction), and separately the warm-up steps, which are
   the measurement's own cost (they take as long as timed steps, so 2 warm-up + 5 timed steps are
   2/7 of the step time whatever the model).
2. Probe tokens/s vs a plain hand-written training loop (same model, dtype, data, AdamW, same
   window) in a fresh process each, alternated to share the machine's drift.

    python benchmarks/probe_overhead.py --model smollm2-135m --repeats 3 \\
        --out benchmarks/results/probe_overhead-cpu.json

Prints what it measured and the command that produced it.
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
sys.path.insert(0, str(ROOT))

from autotune.executors.local import run_probe_process, worker_env  # noqa: E402
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload, cuda_alloc_conf  # noqa: E402


def plain_loop(req: ProbeRequest) -> dict[str, Any]:
    """The same configuration as a hand-written loop: no Trainer, no callbacks."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from autotune.formats.model import model_dtype
    from autotune.probe.collate import pop_counts
    from autotune.probe.data import build_train_data

    w, c, s = req.workload, req.candidate, req.settings
    device = "cuda" if s.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(s.cpu_threads or torch.get_num_threads())
    torch.manual_seed(w.seed)
    cfg = AutoConfig.from_pretrained(w.model_path, local_files_only=True)
    cfg.use_cache = False
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[model_dtype(c, w)]
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=c.attn)
    if c.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    n_steps = s.warmup_steps + s.steps
    data = build_train_data(w, c, num_optimizer_steps=n_steps, vocab_size=cfg.vocab_size, pad_token_id=0)
    loader = torch.utils.data.DataLoader(
        data.dataset, batch_size=c.micro_batch, collate_fn=data.collator, sampler=data.sampler
    )
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    amp = c.precision == "bf16"

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    it = iter(loader)
    ends: list[float] = []
    tokens: list[int] = []
    sync()
    start = time.perf_counter()
    for _ in range(n_steps):
        step_tokens = 0
        for _ in range(c.grad_accum):
            batch = next(it)
            step_tokens += pop_counts(batch).real_tokens
            batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
                loss = model(**batch).loss / c.grad_accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        ends.append(time.perf_counter())
        tokens.append(step_tokens)
    marks = [start, *ends]
    durations = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    window = durations[s.warmup_steps :]
    return {
        "tokens_per_s": sum(tokens[s.warmup_steps :]) / sum(window),
        "step_time_median_s": statistics.median(window),
    }


def run_plain_loop_process(req: ProbeRequest) -> dict[str, Any]:
    req_file = Path("/tmp") / f"autotune-plain-{time.time_ns()}.json"
    req_file.write_text(json.dumps(req.to_dict()))
    try:
        p = subprocess.run(
            [sys.executable, __file__, "--plain-loop", str(req_file)],
            capture_output=True,
            text=True,
            env=worker_env(req, time.time()),
            timeout=req.settings.timeout_s,
        )
    finally:
        req_file.unlink(missing_ok=True)
    if p.returncode != 0:
        raise RuntimeError(f"plain loop failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plain-loop", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.plain_loop:
        req = ProbeRequest.from_dict(json.loads(a.plain_loop.read_text()))
        print(json.dumps(plain_loop(req)))
        return 0

    from autotune.env import fingerprint
    from autotune.models import resolve_model

    resolved = resolve_model(a.model)
    req = ProbeRequest(
        Workload(model=resolved.name, model_path=resolved.path, seq_len=a.seq_len),
        Candidate(micro_batch=a.micro_batch, precision=a.precision),
        ProbeSettings(device=a.device, warmup_steps=a.warmup_steps, steps=a.steps, timeout_s=a.timeout,
                      cuda_alloc_conf=cuda_alloc_conf(a.device, os.environ)),
    ).validate()
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    probes: list[dict[str, Any]] = []
    loops: list[dict[str, Any]] = []
    for i in range(a.repeats):
        r = run_probe_process(req)
        if r.status != "ok":
            print(f"probe {i}: {r.status}: {r.reason}", file=sys.stderr)
            return 1
        m = r.metrics
        probes.append(
            {
                "tokens_per_s": m["tokens_per_s"],
                "overhead_s": m["overhead_s"],
                "wall_s": m["process_wall_s"],
                "overhead_fraction": m["overhead_s"] / m["process_wall_s"],
                "setup_s": m["setup_s"],
                "warmup_s": m["warmup_s"],
                "setup_fraction": m["setup_s"] / m["process_wall_s"],
                "import_s": m.get("import_s"),
                "build_s": m.get("build_s"),
                "step_time_median_s": m["step_time_median_s"],
            }
        )
        loops.append(run_plain_loop_process(req))
        print(
            f"repeat {i}: probe {m['tokens_per_s']:.1f} tok/s, setup {m['setup_s']:.1f} s + warm-up "
            f"{m['warmup_s']:.1f} s of {m['process_wall_s']:.1f} s wall; plain loop "
            f"{loops[-1]['tokens_per_s']:.1f} tok/s",
            file=sys.stderr,
        )
    med = statistics.median
    summary = {
        "date": time.strftime("%Y-%m-%d"),
        "command": command,
        "model": resolved.name,
        "settings": {"seq_len": a.seq_len, "micro_batch": a.micro_batch, "precision": a.precision,
                     "warmup_steps": a.warmup_steps, "steps": a.steps, "device": a.device},  # fmt: skip
        "environment": fingerprint(),
        "probes": probes,
        "plain_loops": loops,
        "median_overhead_s": med(p["overhead_s"] for p in probes),
        "median_wall_s": med(p["wall_s"] for p in probes),
        "median_overhead_fraction": med(p["overhead_fraction"] for p in probes),
        "median_setup_s": med(p["setup_s"] for p in probes),
        "median_setup_fraction": med(p["setup_fraction"] for p in probes),
        "median_probe_tokens_per_s": med(p["tokens_per_s"] for p in probes),
        "median_plain_tokens_per_s": med(p["tokens_per_s"] for p in loops),
    }
    summary["probe_vs_plain"] = summary["median_probe_tokens_per_s"] / summary["median_plain_tokens_per_s"]
    if a.out:
        from autotune.store.atomic import write_json_atomic

        write_json_atomic(a.out, summary)
    print(f"command: {command}")
    print(
        f"setup {summary['median_setup_s']:.1f} s of {summary['median_wall_s']:.1f} s wall "
        f"= {summary['median_setup_fraction']:.1%} (target <= 20%); with the 2 warm-up steps "
        f"{summary['median_overhead_fraction']:.1%}; probe "
        f"{summary['median_probe_tokens_per_s']:.1f} tok/s vs plain loop "
        f"{summary['median_plain_tokens_per_s']:.1f} tok/s = {summary['probe_vs_plain']:.3f}x "
        f"(median of {a.repeats})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
