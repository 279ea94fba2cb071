"""How long one probe is predicted to take, from its process start to its result.  [pure]

A probe's duration is its set-up plus its window (``autotune.spec.probe_window``):

    setup  = SETUP_S[device]                       imports, CUDA context, data, Trainer set-up
           + parameters / BUILD_PARAMS_PER_S        random-weight model build (on the device)
           + QLoRA: parameters / QLORA_LOAD_PARAMS_PER_S   (4-bit load of the cached base)
           + distributed: DISTRIBUTED_S             launcher, process group, DeepSpeed/FSDP init
    window = optimizer steps x the step time at the probe's own accumulation

A GPU window's step time is the planner's (:func:`autotune.estimate.predict_speed` for the
candidate at the probe accumulation ``ProbeWindow.grad_accum``, on the catalog's GPU); a CPU
window is :func:`autotune.estimate.cpu_probe_seconds` for the sequences the window runs, at
``CPU_PREDICT_FLOPS_PER_CORE`` (the best rate a recorded CPU landscape reached per thread, not the
lower bound's peak). ``None`` when the architecture or the GPU is unknown to the estimator.

The constants are rough on purpose: ``autotune run`` multiplies the prediction by a margin and
corrects it by what the run's own earlier probes took (``autotune.search.deadline``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from autotune.estimate.arch import Arch
from autotune.estimate.catalog import GPU
from autotune.estimate.cpu import CPU_FLOPS_PER_CORE, cpu_probe_seconds
from autotune.estimate.speed import predict_speed
from autotune.spec.probe_request import Candidate, ProbeSettings, Workload
from autotune.spec.probe_window import probe_window

__all__ = [
    "BUILD_PARAMS_PER_S",
    "CPU_PREDICT_FLOPS_PER_CORE",
    "DISTRIBUTED_S",
    "QLORA_LOAD_PARAMS_PER_S",
    "SETUP_S",
    "ProbeTime",
    "predict_probe_time",
]

# fixed set-up: python + torch + transformers imports, the CUDA context, the synthetic data and the
# Trainer (a smollm2-135m CPU probe's set-up was 5.0 s on a quiet 2-core machine:
# benchmarks/results/probe_overhead-cpu.json; 3x that leaves room for a loaded one)
SETUP_S = {"cpu": 15.0, "cuda": 25.0}
# random-weight model build: initialisation kernels on the device (a CPU initialises ~1e8-1e9 params/s)
BUILD_PARAMS_PER_S = {"cpu": 2.0e8, "cuda": 2.0e9}
# a QLoRA probe reads its cached random-weight base and bitsandbytes quantizes it while loading
QLORA_LOAD_PARAMS_PER_S = 5.0e8
# a distributed probe's launcher, process group and DeepSpeed / FSDP engine set-up
DISTRIBUTED_S = 20.0
# the best per-thread rate a recorded CPU landscape reached (landscape H, bf16): 3.2 x below the
# lower bound's CPU_FLOPS_PER_CORE
CPU_PREDICT_FLOPS_PER_CORE = CPU_FLOPS_PER_CORE / 3.2


@dataclass(frozen=True)
class ProbeTime:
    """A probe's predicted seconds, split as above."""

    setup_s: float
    window_s: float
    micro_batches: int  # per rank, at most (ProbeWindow.max_micro_batches)
    optimizer_steps: int
    basis: str  # what the window's step time came from

    @property
    def total_s(self) -> float:
        return self.setup_s + self.window_s

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total_s": self.total_s}


def predict_probe_time(
    arch: Arch, workload: Workload, candidate: Candidate, settings: ProbeSettings, *, device: str,
    gpu: GPU | None = None, cores: int = 1, mean_tokens: float | None = None,
) -> ProbeTime | None:
    """The predicted seconds of one probe of ``candidate`` under ``settings`` (None: cannot say)."""
    win = probe_window(settings, candidate, workload)
    steps = win.max_optimizer_steps
    setup = SETUP_S["cpu" if device == "cpu" else "cuda"]
    setup += arch.params_total / BUILD_PARAMS_PER_S["cpu" if device == "cpu" else "cuda"]
    if workload.mode == "qlora":
        setup += arch.params_total / QLORA_LOAD_PARAMS_PER_S
    if candidate.world_size > 1:
        setup += DISTRIBUTED_S
    if device == "cpu":
        sequences = candidate.micro_batch * win.grad_accum * candidate.world_size
        window = cpu_probe_seconds(
            arch, mode=workload.mode, seq_len=workload.seq_len,
            mean_tokens=float(mean_tokens if mean_tokens is not None else workload.seq_len),
            effective_batch=sequences, optimizer_steps=steps, cores=cores,
            flops_per_core=CPU_PREDICT_FLOPS_PER_CORE)  # fmt: skip
        basis = f"cpu {CPU_PREDICT_FLOPS_PER_CORE / 1e9:.0f} GFLOP/s per core x {cores}"
    else:
        if gpu is None:
            return None
        at_probe = dataclasses.replace(candidate, grad_accum=win.grad_accum)
        try:
            step = predict_speed(arch, workload, at_probe, gpu).step_time_s
        except Exception:  # a precision or lever the planner cannot price
            return None
        window = steps * step
        basis = f"planner step time on {gpu.name} at accumulation {win.grad_accum}"
    return ProbeTime(setup_s=setup, window_s=window, micro_batches=win.max_micro_batches, optimizer_steps=steps,
                     basis=basis)
