"""Quality guard: does the tuned configuration train the same model as the HF-default one?

``autotune run --verify-loss [K]`` runs, after the search, the chosen configuration and the
reference (the HF defaults for the same effective batch, ``hf_default_candidate``, with gradient
checkpointing when the plain default did not fit) for ``K`` optimizer steps each, from the same
seed and the same data in the same order (synthetic or ``--dataset`` sequences, read sequentially;
no warm-up; no memory ceiling, so the probe does not reorder its data to put the worst case
first), and compares the two loss trajectories step by step.

What to expect. Measured on CPU (tiny-llama, fp32 weights, seq 64, lognormal lengths, effective
batch 8, 20 steps, seed 42; reference 8x1 sdpa; see benchmarks/README.md), max |dloss| over the
20 steps:

* identical math -- the same config again 0; data-loader workers 1: 0; accumulation 2x4:
  1.4e-6; 1x8 with checkpointing: 9.5e-7; plain vs fused AdamW: 4.8e-7 (floating-point summation
  order only);
* the attention implementation (eager vs sdpa): 9.5e-7 here (another kernel, same math);
* bf16 autocast: 3.5e-4 (a real, small numerical difference);
* packing: 9.5e-7 (8x1, and 2x4) -- the micro-batch counts sequences, so each optimizer step holds
  the same sequences as unpacked, packed whole into rows under block-causal masks and restarting
  positions; only the attention layout differs. (Before micro_batch counted sequences, a packed row
  of seq_len tokens was one item and packing changed the batches: 0.055.)

The tolerance. The flag is raised when the largest per-step difference exceeds ``tolerance``
(default :data:`DEFAULT_TOLERANCE` = 0.01 nats). Why that figure: it is four orders of magnitude
above what identical math produces (~1e-6), some 30x above the bf16-autocast difference, and 5x
below what a change of the batches produced (packed rows counted as items, before micro_batch
counted sequences), so a flag means "this configuration optimises differently", not rounding. On a GPU, bf16 kernels and flash attention differ more than
on this CPU; the figures recorded there belong next to these. A difference above the tolerance is
reported with the knobs that differ and what they are expected to do; it is not an error
(an 8-bit optimizer, for instance, is a legitimate choice that changes the update).

``compare_losses`` and ``expected_differences`` are pure; ``run_verify`` submits the two probes
through any :class:`~autotune.executors.base.Executor`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from autotune.executors.base import Executor
from autotune.search import candidate_label
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

__all__ = [
    "DEFAULT_STEPS",
    "DEFAULT_TOLERANCE",
    "IDENTICAL_KNOBS",
    "compare_losses",
    "expected_differences",
    "reference_candidate",
    "verify_requests",
    "run_verify",
]

DEFAULT_STEPS = 20
DEFAULT_TOLERANCE = 0.01
# knobs whose change leaves the math identical (up to floating-point summation order)
IDENTICAL_KNOBS = ("micro_batch", "grad_accum", "grad_ckpt", "workers", "pin_memory", "optim")
_EXPECT = {
    "micro_batch": "identical math (the effective batch is held; only the summation order changes)",
    "grad_accum": "identical math (the effective batch is held; only the summation order changes)",
    "grad_ckpt": "identical math (activations are recomputed, not approximated)",
    "workers": "identical math (same items, same order)",
    "pin_memory": "identical math",
    "optim": "identical math up to rounding (fused and plain AdamW implement the same update)",
    "attn": "small difference (another attention kernel, same math)",
    "precision": "small numerical difference (reduced-precision autocast)",
    "packing": "small difference (the same sequences per step, laid out in rows with block-causal masks)",
    "torch_compile": "small difference (fused kernels, same math)",
    "liger": "small difference (fused kernels, same math)",
    "world_size": "identical math when the effective batch is held (gradients are averaged)",
    "zero_stage": "identical math up to rounding (sharding, not approximation)",
    "offload": "identical math up to rounding (the update runs on the CPU)",
    "sharding": "identical math up to rounding",
}


# through TRL's SFTTrainer (--trainer trl) packing is TRL's own: measured 0.144 max |dloss| over 20
# steps on tiny-llama chats (benchmarks/README.md, "TRL probes")
_EXPECT_TRL = {
    "packing": "changed batches (TRL packs the whole dataset into rows ahead of training: a step holds other "
               "sequences than unpacked)",
}


def expected_differences(chosen: Candidate, reference: Candidate, *, trainer: str = "hf") -> list[dict[str, Any]]:
    """The knobs that differ between the two, each with what it is expected to do to the loss
    (``trainer``: the workload's, ``hf`` or ``trl``)."""
    a, b = dataclasses.asdict(chosen), dataclasses.asdict(reference)
    expect = {**_EXPECT, **_EXPECT_TRL} if trainer == "trl" else _EXPECT
    return [{"knob": k, "chosen": a[k], "reference": b[k], "expected": expect.get(k, "unknown")}
            for k in a if a[k] != b[k]]


def compare_losses(chosen: list[float], reference: list[float], *,
                   tolerance: float = DEFAULT_TOLERANCE) -> dict[str, Any]:
    """Step-by-step comparison of two loss trajectories (the shorter length is compared).

    Returns ``max_abs_diff`` (nats), the step where it occurs (1-based), ``mean_abs_diff``,
    ``final_abs_diff``, ``exceeds`` (max above ``tolerance``) and the tolerance. A trajectory that
    holds a non-finite loss, or an empty one, gives ``max_abs_diff`` None and ``exceeds`` True.
    """
    if tolerance < 0 or not math.isfinite(tolerance):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    n = min(len(chosen), len(reference))
    out: dict[str, Any] = {"steps_compared": n, "steps_chosen": len(chosen), "steps_reference": len(reference),
                           "tolerance": tolerance}
    pairs = list(zip(chosen[:n], reference[:n], strict=True))
    if n == 0 or not all(math.isfinite(x) and math.isfinite(y) for x, y in pairs):
        out.update(max_abs_diff=None, max_at_step=None, mean_abs_diff=None, final_abs_diff=None, exceeds=True,
                   problem="no comparable loss" if n == 0 else "a non-finite loss")
        return out
    diffs = [abs(x - y) for x, y in pairs]
    worst = max(range(n), key=lambda i: diffs[i])
    out.update(max_abs_diff=diffs[worst], max_at_step=worst + 1, mean_abs_diff=sum(diffs) / n,
               final_abs_diff=diffs[-1], exceeds=diffs[worst] > tolerance)
    return out


def reference_candidate(effective_batch: int, *, world_size: int = 1, precision: str = "fp32",
                        needs_checkpointing: bool = False) -> Candidate:
    """The HF default for this effective batch, made to fit with checkpointing when it did not."""
    from autotune.spec.baseline import hf_default_candidate

    ref = hf_default_candidate(effective_batch, world_size=world_size, precision=precision)
    return dataclasses.replace(ref, grad_ckpt=True) if needs_checkpointing else ref


def verify_requests(chosen: Candidate, reference: Candidate, *, workload: Workload, settings: ProbeSettings,
                    steps: int = DEFAULT_STEPS) -> tuple[ProbeRequest, ProbeRequest]:
    """The two probes: ``steps`` optimizer steps, no warm-up, no memory ceiling, same workload."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"verify-loss steps must be an integer >= 1, got {steps!r}")
    # whole steps at the true accumulation: the loss comparison must train exactly the user's batches
    s = dataclasses.replace(settings, warmup_steps=0, steps=steps, budget_bytes=None, budget_text=None, window="whole",
                            timeout_s=max(settings.timeout_s, 60.0) * max(1.0, steps / max(1, settings.steps)))
    return (ProbeRequest(workload=workload, candidate=chosen, settings=s),
            ProbeRequest(workload=workload, candidate=reference, settings=s))


def run_verify(executor: Executor, *, chosen: Candidate, reference: Candidate, workload: Workload,
               settings: ProbeSettings, steps: int = DEFAULT_STEPS,
               tolerance: float = DEFAULT_TOLERANCE) -> dict[str, Any]:
    """Run both probes through ``executor`` (concurrently when it has the slots) and compare."""
    req_c, req_r = verify_requests(chosen, reference, workload=workload, settings=settings, steps=steps)
    tickets = {executor.submit(req_c): "chosen", executor.submit(req_r): "reference"}
    results: dict[str, ProbeResult] = {}
    while len(results) < 2:
        for ticket, res in executor.poll(timeout=None):
            if ticket in tickets:
                results[tickets[ticket]] = res
    out: dict[str, Any] = {"steps": steps, "seed": workload.seed, "same_candidate": chosen == reference}
    for side, cand in (("chosen", chosen), ("reference", reference)):
        r = results[side]
        out[side] = {"label": candidate_label(cand), "candidate": dataclasses.asdict(cand), "status": r.status,
                     "reason": r.reason, "losses": [float(x) for x in r.metrics.get("losses") or []]}
    out["differences"] = expected_differences(chosen, reference, trainer=workload.trainer)
    out["expected_identical"] = all(d["knob"] in IDENTICAL_KNOBS for d in out["differences"])
    out.update(compare_losses(out["chosen"]["losses"], out["reference"]["losses"], tolerance=tolerance))
    if results["chosen"].status != "ok" or results["reference"].status != "ok":
        bad = [f"{s}: {results[s].status} {results[s].reason}".strip() for s in ("chosen", "reference")
               if results[s].status != "ok"]
        out["problem"] = "; ".join(bad)
        out["exceeds"] = True
    out["verdict"] = _verdict(out)
    return out


def _verdict(v: dict[str, Any]) -> str:
    if v.get("problem"):
        return f"not verified: {v['problem']}"
    knobs = ", ".join(d["knob"] for d in v["differences"]) or "none"
    head = (f"max |dloss| {v['max_abs_diff']:.2e} over {v['steps_compared']} steps "
            f"(tolerance {v['tolerance']:g}; knobs that differ: {knobs})")
    if not v["exceeds"]:
        return f"ok: {head}"
    why = "; ".join(f"{d['knob']}: {d['expected']}" for d in v["differences"] if d["knob"] not in IDENTICAL_KNOBS)
    return f"FLAG: {head}" + (f" -- expected from {why}" if why else " -- unexpected: only identical-math knobs differ")
