"""The probe steps of the one-pass GPU check (benchmarks/gpu_check.sh runs each as its own process).

    python benchmarks/gpu_pass.py environment --out OUT/environment.json --device cuda
    python benchmarks/gpu_pass.py spread      --jsonl OUT/rows.jsonl --out OUT/spread.json [workload]
    python benchmarks/gpu_pass.py levers      --jsonl OUT/rows.jsonl [workload] [--lengths SPEC]
    python benchmarks/gpu_pass.py tuned       --jsonl OUT/rows.jsonl [workload]

Every probe is a fresh process (``run_probe_process``, no Ray, no Optuna) and every row is appended
to ``--jsonl`` the moment it lands (one JSON object a line, ``step`` naming the step), so a pass
cut short keeps every finished row. ``--time-box S`` stops starting probes after S seconds.

* ``spread``: two configurations, ``--repeats`` (3+) probes each, interleaved (A B A B ...) so that
  drift hits both; ``spread.json`` holds each one's tok/s and relative spread ((max - min) /
  median), rewritten after every probe: the tolerance of repeat agreement is set from it.
* ``levers``: sdpa vs eager (and flash_attention_2 when flash-attn is installed), packing off/on on
  a long-tailed length distribution, the unpacked one again under the default CUDA allocator
  (``expandable_segments:False``, against the run's ``expandable_segments:True``: its speed and its
  reserved / allocated memory), Liger and QLoRA when their packages are installed (a row with
  status ``skipped`` and the reason otherwise: no probe spent on a refusal), MFU on every row.
* ``tuned``: the fastest configuration measured so far in this pass on the main workload (read
  back from ``--jsonl``), then it and the HF default (``hf_default_candidate``) at the *same
  precision* probed back to back; the default gets gradient checkpointing if it does not fit, as a
  user would add it. The speedup is like for like and says which precision it compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload, cuda_alloc_conf  # noqa: E402

# metrics copied into each row (the rest of a probe's metrics stay out of the JSONL)
ROW_METRICS = (
    "step_time_median_s", "step_time_spread", "padding_fraction", "data_wait_fraction", "window_s",
    "overhead_s", "process_wall_s", "mem_torch_allocated_bytes", "mem_torch_reserved_bytes",
    "cuda_context_bytes", "mem_nvml_process_bytes", "non_torch_bytes", "nvml_process_visible",
    "memory_source", "gpu_util_mean", "cpu_util_mean", "recompiles_in_window", "warnings", "distributed_type",
    "param_type", "port_attempts", "cuda_alloc_conf",
)  # fmt: skip
# the long-tailed length distribution of the packing rows (median ~150 tokens, a tail to seq_len)
LONG_TAIL = "lognormal:5.0,1.0"


def append_jsonl(path: str | Path, obj: dict[str, Any]) -> None:
    """One line, written at once and flushed: a killed step leaves whole lines."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(obj, default=str) + "\n")
        fh.flush()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file; a torn last line (a step killed mid-write) is skipped."""
    rows: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def relative_spread(values: list[float]) -> float | None:
    """(max - min) / median of repeated tok/s; None below two values."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else None


class Pass:
    """The workload and settings one step probes with, and how it writes rows."""

    def __init__(self, a: argparse.Namespace) -> None:
        from autotune.models import resolve_model

        self.a = a
        self.model = resolve_model(a.model)
        self.device = a.device
        self.t0 = time.monotonic()
        self.settings = ProbeSettings(
            device=a.device, warmup_steps=a.warmup, steps=a.steps, timeout_s=a.timeout,
            cpu_threads=a.threads or None, cuda_alloc_conf=cuda_alloc_conf(a.device, os.environ),
        )  # fmt: skip

    def workload(self, lengths: str = "fixed", mode: str = "full") -> Workload:
        return Workload(model=self.model.name, model_path=self.model.path, seq_len=self.a.seq_len,
                        lengths=lengths, mode=mode)  # fmt: skip

    def out_of_time(self) -> bool:
        return bool(self.a.time_box) and time.monotonic() - self.t0 > self.a.time_box

    def base(self, **kw: Any) -> Candidate:
        eb = self.a.effective_batch
        mb = min(kw.pop("micro_batch", self.a.micro_batch), eb)
        return Candidate(micro_batch=mb, grad_accum=max(1, eb // mb), precision=self.a.precision,
                         optim="adamw_torch_fused", **kw)  # fmt: skip

    def row(self, step: str, name: str, cand: Candidate, wl: Workload, **extra: Any) -> dict[str, Any]:
        return {"step": step, "name": name, "label": _label(cand), "candidate": dataclasses.asdict(cand),
                "model": self.model.name, "seq_len": wl.seq_len, "lengths": wl.lengths, "mode": wl.mode,
                "device": self.device, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}  # fmt: skip

    def probe(self, step: str, name: str, cand: Candidate, wl: Workload | None = None,
              settings: ProbeSettings | None = None) -> dict[str, Any]:
        """Probe one configuration (with the pass's settings, or ``settings``), append its row to the JSONL,
        return the row."""
        from autotune.diagnose import probe_mfu
        from autotune.executors.local import run_probe_process

        wl = wl or self.workload()
        t = time.monotonic()
        res = run_probe_process(ProbeRequest(workload=wl, candidate=cand, settings=settings or self.settings))
        row = self.row(step, name, cand, wl, status=res.status, reason=res.reason[:400],
                       tokens_per_s=res.tokens_per_s, peak_mem_bytes=res.peak_mem_bytes,
                       mfu=probe_mfu(res, self.model.config) if res.status == "ok" else None,
                       probe_s=round(time.monotonic() - t, 1),
                       metrics={k: res.metrics.get(k) for k in ROW_METRICS if res.metrics.get(k) is not None},
                       gpu=res.env.get("device"))  # fmt: skip
        if res.status == "crash" and res.env.get("stderr_tail"):
            row["stderr_tail"] = str(res.env["stderr_tail"])[-1200:]
        append_jsonl(self.a.jsonl, row)
        tps, mfu = row["tokens_per_s"], row["mfu"]
        print(f"[{step}] {name}: {res.status}" + (f" {tps:.0f} tok/s" if tps else "")
              + (f" MFU {mfu:.1%}" if mfu else "")
              + (f" peak {res.peak_mem_bytes / 2**30:.2f} GiB" if res.peak_mem_bytes else "")
              + ("" if res.status == "ok" else f" [{res.reason[:200]}]") + f" ({row['probe_s']:.0f} s)",
              flush=True)  # fmt: skip
        return row

    def skip(self, step: str, name: str, cand: Candidate, wl: Workload, reason: str) -> dict[str, Any]:
        row = self.row(step, name, cand, wl, status="skipped", reason=reason)
        append_jsonl(self.a.jsonl, row)
        print(f"[{step}] {name}: skipped ({reason})", flush=True)
        return row


def _label(c: Candidate) -> str:
    from autotune.search import candidate_label

    return candidate_label(c)


# --- environment -------------------------------------------------------------------------------


def cmd_environment(a: argparse.Namespace) -> int:
    from autotune.env import fingerprint
    from autotune.store.atomic import write_json_atomic

    fp = fingerprint(a.device)
    fp["importable"] = {
        m: importlib.util.find_spec(m) is not None
        for m in ("optuna", "ray", "deepspeed", "flash_attn", "bitsandbytes", "liger_kernel", "pynvml", "pytest")
    }
    fp["date"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    if a.device == "cuda":
        fp["nvml_self_check"] = _nvml_self_check()
    write_json_atomic(a.out, fp)
    print(json.dumps({k: fp.get(k) for k in ("device", "compute_capability", "driver", "importable")}, default=str))
    return 0


def _nvml_self_check() -> dict[str, Any]:
    """Whether NVML lists this process once it holds a context (False in a PID namespace)."""
    import torch

    from autotune.probe.memory import NvmlSampler

    s = NvmlSampler(device_index=0)
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    s.sample_once()
    s.stop()
    return {"process_visible": s.process_visible, "process_bytes": s.peak_process_bytes,
            "device_used_bytes": s.peak_device_used_bytes, "utilisation_samples": len(s.util_samples),
            "errors": s.query_errors}  # fmt: skip


# --- spread ------------------------------------------------------------------------------------


def spread_configs(p: Pass) -> list[tuple[str, Candidate]]:
    """Two configurations unlike each other: the likely best, and a checkpointed smaller micro-batch."""
    mb = p.a.micro_batch
    return [
        (f"A mb{mb} no-ckpt", p.base(micro_batch=mb)),
        (f"B mb{max(1, mb // 2)} ckpt", p.base(micro_batch=max(1, mb // 2), grad_ckpt=True)),
    ]


def spread_record(p: Pass, results: dict[str, list[dict[str, Any]]], complete: bool) -> dict[str, Any]:
    configs = []
    for name, rows in results.items():
        tps = [r["tokens_per_s"] for r in rows if r["status"] == "ok" and r.get("tokens_per_s")]
        configs.append({"name": name, "label": rows[0]["label"] if rows else None,
                        "candidate": rows[0]["candidate"] if rows else None, "tokens_per_s": tps,
                        "statuses": [r["status"] for r in rows],
                        "median_tokens_per_s": statistics.median(tps) if tps else None,
                        "relative_spread": relative_spread(tps),
                        "peak_mem_bytes": [r.get("peak_mem_bytes") for r in rows]})  # fmt: skip
    spreads = [c["relative_spread"] for c in configs if c["relative_spread"] is not None]
    return {
        "what": "tok/s of repeated probes of the same configuration; relative_spread = (max - min) / median",
        "date": time.strftime("%Y-%m-%d"), "model": p.model.name, "seq_len": p.a.seq_len, "device": p.device,
        "steps": p.a.steps, "warmup_steps": p.a.warmup, "effective_batch": p.a.effective_batch,
        "repeats_asked": p.a.repeats, "complete": complete, "configs": configs,
        "max_relative_spread": max(spreads) if spreads else None,
        "median_relative_spread": statistics.median(spreads) if spreads else None,
    }  # fmt: skip


def cmd_spread(a: argparse.Namespace) -> int:
    from autotune.store.atomic import write_json_atomic

    p = Pass(a)
    configs = spread_configs(p)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in configs}
    for rep in range(a.repeats):
        for name, cand in configs:
            if p.out_of_time():
                print(f"[spread] time box reached at repeat {rep + 1}", flush=True)
                write_json_atomic(a.out, spread_record(p, results, complete=False))
                return 0
            results[name].append(p.probe("spread", f"{name} #{rep + 1}", cand))
            write_json_atomic(a.out, spread_record(p, results, complete=False))
    rec = spread_record(p, results, complete=True)
    write_json_atomic(a.out, rec)
    print(f"[spread] max relative spread {rec['max_relative_spread']}", flush=True)
    return 0


# --- levers ------------------------------------------------------------------------------------


# the CUDA caching allocator without expandable segments (a run's probes have them: autotune.spec.probe_request)
DEFAULT_ALLOCATOR = "expandable_segments:False"


def cmd_levers(a: argparse.Namespace) -> int:
    p = Pass(a)
    fixed, tail = p.workload(), p.workload(lengths=a.lengths)
    has = {m: importlib.util.find_spec(m) is not None for m in ("flash_attn", "liger_kernel", "bitsandbytes")}
    # (name, candidate, workload, why it is skipped or None, settings other than the pass's or None)
    no_expandable = dataclasses.replace(p.settings, cuda_alloc_conf=DEFAULT_ALLOCATOR)
    plan: list[tuple[str, Candidate, Workload, str | None, ProbeSettings | None]] = [
        ("sdpa", p.base(attn="sdpa"), fixed, None, None),
        ("eager", p.base(attn="eager"), fixed, None, None),
        ("flash_attention_2", p.base(attn="flash_attention_2"), fixed,
         None if has["flash_attn"] else "flash-attn is not installed (PyPI has no wheel of it to carry)", None),
        (f"no packing, {a.lengths}", p.base(), tail, None, None),
        (f"packing, {a.lengths}", p.base(packing=True), tail, None, None),
        # as the unpacked row, without expandable segments (a run's probes have them)
        (f"no packing, {a.lengths}, {DEFAULT_ALLOCATOR}", p.base(), tail, None, no_expandable),
        ("liger", p.base(liger=True), fixed, None if has["liger_kernel"] else "liger-kernel is not installed", None),
        ("qlora", p.base(), p.workload(mode="qlora"),
         None if has["bitsandbytes"] else "bitsandbytes is not installed", None),
    ]  # fmt: skip
    if a.device == "cpu":  # what cannot run on a CPU is refused by the probe's precheck: spare the process
        for i, (name, cand, wl, why, settings) in enumerate(plan):
            if why is None and settings is not None:
                plan[i] = (name, cand, wl, "the CUDA allocator's setting needs a CUDA GPU", settings)
            elif why is None and name in ("flash_attention_2", "liger", "qlora"):
                plan[i] = (name, cand, wl, f"{name} needs a CUDA GPU", settings)
    for name, cand, wl, why, settings in plan:
        if p.out_of_time():
            print("[levers] time box reached", flush=True)
            return 0
        if why is not None:
            p.skip("levers", name, cand, wl, why)
        else:
            p.probe("levers", name, cand, wl, settings)
    return 0


# --- tuned vs HF default ----------------------------------------------------------------------


def best_measured(rows: list[dict[str, Any]], model: str, seq_len: int, device: str) -> dict[str, Any] | None:
    """The fastest ok single-GPU row of this pass on the main workload (fixed lengths, full mode)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("tokens_per_s") and r.get("model") == model
          and r.get("seq_len") == seq_len and r.get("lengths") == "fixed" and r.get("mode") == "full"
          and r.get("device") == device and r.get("step") != "tuned"
          and (r.get("candidate") or {}).get("zero_stage", 0) == 0]  # fmt: skip
    return max(ok, key=lambda r: r["tokens_per_s"]) if ok else None


def cmd_tuned(a: argparse.Namespace) -> int:
    from autotune.spec.baseline import hf_default_candidate

    p = Pass(a)
    best = best_measured(read_jsonl(a.jsonl), p.model.name, a.seq_len, a.device)
    if best is None:
        tuned = p.base()
        source = "no configuration measured earlier in this pass: the pass's base configuration"
    else:
        tuned = Candidate(**best["candidate"])
        source = f"the fastest configuration measured earlier in this pass ({best['step']}: {best['name']})"
    default = hf_default_candidate(a.effective_batch, precision=tuned.precision)
    t = p.probe("tuned", "tuned", tuned)
    d = p.probe("tuned", f"HF default ({tuned.precision})", default)
    if d["status"] in ("oom", "over_budget"):  # made to fit, as a user would
        d = p.probe("tuned", f"HF default ({tuned.precision}) + checkpointing", dataclasses.replace(default, grad_ckpt=True))
    speedup = (t["tokens_per_s"] / d["tokens_per_s"]
               if t["status"] == "ok" and d["status"] == "ok" and d["tokens_per_s"] else None)  # fmt: skip
    summary = {"step": "tuned", "name": "speedup", "status": "ok" if speedup else "failed", "tuned_source": source, "precision": tuned.precision,
               "tuned_label": t["label"], "default_label": d["label"], "tuned_mfu": t["mfu"],
               "default_mfu": d["mfu"], "speedup": speedup,
               "note": "both at the same precision: the speedup holds no precision gain"}  # fmt: skip
    append_jsonl(a.jsonl, summary)
    print(f"[tuned] {t['label']} vs HF default {d['label']}: "
          + (f"{speedup:.2f}x at {tuned.precision}" if speedup else "no speedup (a probe failed)"), flush=True)  # fmt: skip
    return 0


# --- arguments ---------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    env = sub.add_parser("environment")
    env.add_argument("--out", required=True)
    env.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    for name in ("spread", "levers", "tuned"):
        s = sub.add_parser(name)
        s.add_argument("--jsonl", required=True)
        s.add_argument("--model", default="llama-3.2-1b")
        s.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
        s.add_argument("--seq-len", type=int, default=2048)
        s.add_argument("--effective-batch", type=int, default=16)
        s.add_argument("--micro-batch", type=int, default=4)
        s.add_argument("--precision", default="bf16")
        s.add_argument("--warmup", type=int, default=2)
        s.add_argument("--steps", type=int, default=5)
        s.add_argument("--threads", type=int, default=0)
        s.add_argument("--timeout", type=float, default=240.0)
        s.add_argument("--time-box", type=float, default=0.0, help="seconds; stop starting probes after it")
        if name == "spread":
            s.add_argument("--out", required=True)
            s.add_argument("--repeats", type=int, default=3)
        if name == "levers":
            s.add_argument("--lengths", default=LONG_TAIL)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if getattr(a, "repeats", 3) < 2:
        print("--repeats must be at least 2 (a spread needs two values); the GPU pass uses 3", file=sys.stderr)
        return 2
    return {"environment": cmd_environment, "spread": cmd_spread, "levers": cmd_levers, "tuned": cmd_tuned}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
