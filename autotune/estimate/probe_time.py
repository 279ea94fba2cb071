"""How long one probe is predicted to take, from its process start to its result.  [pure]

A probe's duration is its set-up plus its window (``autotune.spec.probe_window``):

    setup  = SETUP_S[device]                       imports, CUDA context, data, Trainer set-up
             (WARM_SETUP_S for a CPU probe forked from the warm server: no imports)
           + parameters / BUILD_PARAMS_PER_S        random-weight model build (on the device)
           + QLoRA: parameters / QLORA_LOAD_PARAMS_PER_S   (4-bit load of the cached base)
           + distributed: DISTRIBUTED_S             launcher, process group, DeepSpeed/FSDP init
    window = optimizer steps x the step time at the probe's own accumulation

A GPU window's step time is the planner's (:func:`autotune.estimate.predict_speed` for the
candidate at the probe accumulation ``ProbeWindow.grad_accum``, on the catalog's GPU); a CPU
window is :func:`autotune.estimate.cpu_probe_seconds` for the sequences the window runs, at
``CPU_PREDICT_FLOPS_PER_CORE`` (125 GFLOP/s per thread, landscape H's best rate, not the lower
bound's peak). ``None`` when the architecture or the GPU is unknown to the estimator.

The constants are rough on purpose: ``autotune run`` multiplies the prediction by a margin and
corrects it by what the run's own earlier probes took: each probe's deadline, below.

Each probe's deadline (``DeadlineRule``, applied by ``Deadlines`` for one run):

    corrected = predicted x correction
    deadline  = max(floor, DEADLINE_MARGIN x corrected)
    floor     = DEADLINE_FLOOR_S on a GPU, CPU_DEADLINE_FLOOR_S on a CPU

``predicted`` is :func:`predict_probe_time`'s total (set-up + the probe window). ``correction`` is 1
until a probe of this run has finished, then the median over the run's finished probes (status ok or
over_budget: they ran their whole window) of ``measured wall seconds / predicted seconds``. A probe
the estimator cannot predict (unknown architecture or GPU) gets ``UNPREDICTED_S``, i.e. the fixed
deadline. ``--probe-timeout SECONDS`` replaces the rule by that fixed deadline for every probe. A
probe stopped at its deadline gets a reason that says it was far slower than predicted, with both
figures. :func:`make_predictor` is the ``Predictor`` of one run (its model, workload and device).

This module is the one home of a probe's time; the run's time to answer (probes x this, over the
parallel slots) and its ``--time-budget`` are ``autotune.run``'s.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import SpecError
from autotune.estimate.arch import Arch
from autotune.estimate.catalog import GPU
from autotune.estimate.cpu import cpu_probe_seconds
from autotune.estimate.speed import predict_speed
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.probe_window import probe_window
from autotune.spec.result import ProbeResult

__all__ = [
    "BUILD_PARAMS_PER_S",
    "CPU_DEADLINE_FLOOR_S",
    "CPU_PREDICT_FLOPS_PER_CORE",
    "DEADLINE_FLOOR_S",
    "DEADLINE_MARGIN",
    "DISTRIBUTED_S",
    "QLORA_LOAD_PARAMS_PER_S",
    "SETUP_S",
    "WARM_SETUP_S",
    "UNPREDICTED_S",
    "DeadlineRule",
    "Deadlines",
    "Predictor",
    "ProbeTime",
    "make_predictor",
    "predict_probe_time",
]

# fixed set-up: python + torch + transformers imports, the CUDA context, the synthetic data and the
# Trainer (a smollm2-135m CPU probe's set-up was 5.0 s on a quiet 2-core machine:
# benchmarks/results/probe_overhead-cpu.json; 3x that leaves room for a loaded one)
SETUP_S = {"cpu": 15.0, "cuda": 25.0}
# a CPU probe forked from the warm server (autotune.executors.warm) skips the imports: its set-up was
# 0.79 s (0.77-0.88) on the same quiet machine (benchmarks/results/warm_start-cpu.json); 3x, as above
WARM_SETUP_S = 2.5
# random-weight model build: initialisation kernels on the device (a CPU initialises ~1e8-1e9 params/s)
BUILD_PARAMS_PER_S = {"cpu": 2.0e8, "cuda": 2.0e9}
# a QLoRA probe reads its cached random-weight base and bitsandbytes quantizes it while loading
QLORA_LOAD_PARAMS_PER_S = 5.0e8
# a distributed probe's launcher, process group and DeepSpeed / FSDP engine set-up
DISTRIBUTED_S = 20.0
# a CPU probe's window at 125 GFLOP/s per thread: landscape H's best (bf16); the probe-time predictor
# (deadlines, the cost per probe) has used this figure since it was recorded. Landscape R reached 239
# later (tiny-mistral, bf16), most configurations far less (fp32, checkpointing)
CPU_PREDICT_FLOPS_PER_CORE = 1.25e11


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
    gpu: GPU | None = None, cores: int = 1, mean_tokens: float | None = None, warm: bool = False,
) -> ProbeTime | None:
    """The predicted seconds of one probe of ``candidate`` under ``settings`` (None: cannot say).

    ``warm``: a CPU probe forked from the warm server (the run's local pool), without the imports."""
    win = probe_window(settings, candidate, workload)
    steps = win.max_optimizer_steps
    setup = SETUP_S["cpu" if device == "cpu" else "cuda"]
    if warm and device == "cpu" and candidate.world_size == 1:
        setup = WARM_SETUP_S
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


def _gpu_of(gpu_infos: list[dict[str, Any]]) -> GPU | None:
    """The catalog's GPU for the first detected one it knows (NVML's names: "NVIDIA A10G", "NVIDIA H100 80GB HBM3")."""
    from autotune.estimate.catalog import find_gpu

    for g in gpu_infos:
        name = str(g.get("name") or "")
        for candidate in (name, name.removeprefix("NVIDIA").strip()):
            try:
                return find_gpu(candidate)
            except SpecError:
                continue
    return None


# predictor(candidate, settings) -> predicted seconds of that probe, or None
Predictor = Callable[[Candidate, ProbeSettings], "float | None"]


def make_predictor(
    config: dict[str, Any], workload: Workload, *, device: str, gpu_infos: list[dict[str, Any]],
    gpu: GPU | None = None, cores: int | None = None, mean_tokens: float | None = None, warm: bool = False,
) -> Predictor | None:
    """``predict(candidate, settings) -> seconds | None`` for one run, or None (unknown architecture).

    ``mean_tokens``: the real tokens of a sequence on average, which a CPU window's time follows (the
    caller reads them from the dataset or the length distribution); None: ``seq_len``."""
    from autotune.estimate.arch import arch_from_config

    try:
        arch = arch_from_config(config)
    except Exception:
        return None
    gpu = gpu if gpu is not None else (_gpu_of(gpu_infos) if device == "cuda" else None)
    n_cores = cores or os.cpu_count() or 1
    tokens = mean_tokens if device == "cpu" else None

    def predict(candidate: Candidate, settings: ProbeSettings) -> float | None:
        t = predict_probe_time(arch, workload, candidate, settings, device=device, gpu=gpu, cores=n_cores,
                               mean_tokens=tokens, warm=warm)
        return None if t is None else t.total_s

    return predict


# x the corrected prediction: room for a slower load, a cold cache, a planner constant that is off
DEADLINE_MARGIN = 3.0
# no GPU probe gets less: the fixed set-up (imports, the CUDA context) varies most with machine load
DEADLINE_FLOOR_S = 120.0
# no CPU probe gets less (the deadline every probe had before): a CPU probe shares its cores with
# whatever else runs, and on this project's 2-core machine at load average 10 a tiny-llama probe
# predicted at 15 s was still running at 180 s
CPU_DEADLINE_FLOOR_S = 300.0
# the deadline of a probe the estimator cannot predict (what every probe had before)
UNPREDICTED_S = 300.0
# statuses whose wall time is a whole window (an oom or crash stops early, a timeout is censored)
_COUNTED = ("ok", "over_budget")

Predictor = Callable[[Candidate, ProbeSettings], "float | None"]


@dataclass(frozen=True)
class DeadlineRule:
    """How deadlines are set: ``fixed_s`` (``--probe-timeout SECONDS``) or the predicted rule."""

    fixed_s: float | None = None
    margin: float = DEADLINE_MARGIN
    floor_s: float = DEADLINE_FLOOR_S
    unpredicted_s: float = UNPREDICTED_S

    @classmethod
    def for_device(cls, device: str, fixed_s: float | None = None) -> DeadlineRule:
        """The rule for probes on ``device`` (``cpu`` or ``cuda``): its floor."""
        return cls(fixed_s=fixed_s, floor_s=CPU_DEADLINE_FLOOR_S if device == "cpu" else DEADLINE_FLOOR_S)

    def describe(self) -> dict[str, Any]:
        """What the cache key and summary.json hold: the rule, never a probe's seconds."""
        if self.fixed_s is not None:
            return {"kind": "fixed", "seconds": float(self.fixed_s)}
        return {"kind": "predicted", "margin": self.margin, "floor_s": self.floor_s,
                "unpredicted_s": self.unpredicted_s,
                "correction": "median of measured/predicted wall over the run's finished (ok, over_budget) probes"}

    def text(self) -> str:
        if self.fixed_s is not None:
            return f"fixed {self.fixed_s:g} s per probe (--probe-timeout)"
        return (f"{self.margin:g} x the predicted probe time (corrected by this run's probes), at least "
                f"{self.floor_s:g} s")


@dataclass
class Deadlines:
    """Deadlines for one run: ``apply`` sets a request's ``timeout_s``, ``landed`` learns from results."""

    rule: DeadlineRule
    predictor: Predictor | None = None
    ratios: list[float] = field(default_factory=list)
    # ticket -> (predicted s or None, deadline s)
    _issued: dict[str, tuple[float | None, float]] = field(default_factory=dict)
    _predictions: list[float] = field(default_factory=list)

    def correction(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 1.0

    def predict(self, candidate: Candidate, settings: ProbeSettings) -> float | None:
        if self.predictor is None:
            return None
        try:
            p = self.predictor(candidate, settings)
        except Exception:  # a prediction must never stop a search
            return None
        return float(p) if p is not None and p > 0 else None

    def deadline(self, candidate: Candidate, settings: ProbeSettings) -> tuple[float | None, float]:
        """(predicted seconds or None, deadline seconds) of a probe submitted now."""
        predicted = self.predict(candidate, settings)
        if self.rule.fixed_s is not None:
            return predicted, float(self.rule.fixed_s)
        if predicted is None:
            return None, float(self.rule.unpredicted_s)
        return predicted, max(self.rule.floor_s, self.rule.margin * predicted * self.correction())

    def apply(self, request: ProbeRequest) -> tuple[ProbeRequest, float | None, float]:
        """``request`` with its deadline as ``settings.timeout_s``; (request, predicted, deadline)."""
        predicted, deadline = self.deadline(request.candidate, request.settings)
        settings = dataclasses.replace(request.settings, timeout_s=round(deadline, 1))
        return dataclasses.replace(request, settings=settings), predicted, settings.timeout_s

    def issued(self, ticket: str, predicted: float | None, deadline: float) -> None:
        self._issued[ticket] = (predicted, deadline)
        if predicted is not None:
            self._predictions.append(predicted)

    def restore(self, results: list[dict[str, Any]]) -> None:
        """Seed the correction from a resumed run's recorded results (their ``predicted_s`` and wall)."""
        for r in results:
            m = r.get("metrics") or {}
            p, wall = m.get("predicted_s"), m.get("wall_s")
            if r.get("status") in _COUNTED and isinstance(p, (int, float)) and p > 0 \
                    and isinstance(wall, (int, float)) and wall > 0:
                self.ratios.append(float(wall) / float(p))

    def expected_s(self) -> float | None:
        """A typical probe's seconds, corrected: the median prediction issued so far x the correction."""
        return statistics.median(self._predictions) * self.correction() if self._predictions else None

    def landed(self, ticket: str, result: ProbeResult) -> ProbeResult:
        """Learn from a finished probe; a timed-out one's reason says how far off the prediction was.

        The probe's prediction and deadline are written into its metrics (``predicted_s``,
        ``deadline_s``, ``deadline_correction``)."""
        predicted, deadline = self._issued.pop(ticket, (None, None))  # type: ignore[arg-type]
        if deadline is None:
            return result
        result.metrics = dict(result.metrics)
        result.metrics["deadline_s"] = deadline
        if predicted is not None:
            result.metrics["predicted_s"] = round(predicted, 1)
            result.metrics["deadline_correction"] = round(self.correction(), 3)
        wall = result.metrics.get("wall_s")
        if predicted is not None and result.status in _COUNTED and isinstance(wall, (int, float)) and wall > 0:
            self.ratios.append(float(wall) / predicted)
        if result.status == "timeout":
            if predicted is not None and self.rule.fixed_s is None:
                why = (f"far slower than predicted: predicted {predicted:,.0f} s"
                       + (f" (x{self.correction():.2f} from this run's earlier probes)" if self.ratios else "")
                       + f", deadline {deadline:,.0f} s ({self.rule.text()})")
            elif predicted is not None:
                why = f"past the --probe-timeout of {deadline:g} s (predicted {predicted:,.0f} s)"
            else:
                why = f"past the {deadline:g} s deadline (the estimator could not predict this probe)"
            result.reason = f"{why}; {result.reason}" if result.reason else why
        return result

    def summary(self) -> dict[str, Any]:
        """summary.json's ``deadlines``: the rule and what the run learned."""
        return {**self.rule.describe(), "correction_factor": round(self.correction(), 3),
                "probes_counted": len(self.ratios)}
