"""Memory and throughput model, GPU catalog and capacity planning.  [pure: no torch, no disk
beyond the package's own gpus.yaml and catalog files passed in explicitly]

    arch_from_config(config.json dict) -> Arch
    estimate_memory(arch, workload, candidate, device=..., gpu=...) -> MemoryBreakdown
    predict_speed(...) / predict_step_time(...) (the one step-time model) / mfu(...) / calibrate(...);  cpu_probe_seconds(...) (a CPU probe's least time)
    find_gpu(name) / load_catalog(extra=...)
    plan(config, gpus=..., ...) -> PlanResult;  predict_peak_bytes / should_prune (PRUNE_FACTOR)
    CostPrior(config, workload, device=..., usable_bytes=...) (the model strategy's prior: log speed, log peak/usable)
    predict_probe_time(...) / make_predictor(...) (one probe's seconds);  DeadlineRule / Deadlines (its deadline)
"""

from __future__ import annotations

from autotune.estimate.arch import Arch, arch_from_config, lora_param_count
from autotune.estimate.catalog import GPU, find_gpu, find_gpus, load_catalog
from autotune.estimate.cpu import CPU_FLOPS_PER_CORE, cpu_probe_seconds
from autotune.estimate.memory import MemoryBreakdown, estimate_memory
from autotune.estimate.plan import (
    HEADROOM,
    MAX_GPUS_PER_NODE,
    PRUNE_FACTOR,
    GPUPlan,
    PlanLora,
    PlanOption,
    PlanResult,
    PlanWorkload,
    fits,
    plan,
    predict_peak_bytes,
    should_prune,
)
from autotune.estimate.prior import FIXED_COSTS, CostPrior
from autotune.estimate.probe_time import (
    CPU_DEADLINE_FLOOR_S,
    DEADLINE_FLOOR_S,
    DEADLINE_MARGIN,
    UNPREDICTED_S,
    DeadlineRule,
    Deadlines,
    Predictor,
    ProbeTime,
    make_predictor,
    predict_probe_time,
)
from autotune.estimate.speed import (
    DEFAULT_EFFICIENCY,
    SpeedEstimate,
    calibrate,
    calibration_pairs,
    checkpointed_layers,
    hardware_flops_per_token,
    mfu,
    model_flops_per_token,
    predict_speed,
    predict_step_time,
    recomputed,
)

__all__ = [
    "CostPrior",
    "FIXED_COSTS",
    "CPU_DEADLINE_FLOOR_S",
    "CPU_FLOPS_PER_CORE",
    "DEADLINE_FLOOR_S",
    "DEADLINE_MARGIN",
    "UNPREDICTED_S",
    "DeadlineRule",
    "Deadlines",
    "Predictor",
    "ProbeTime",
    "make_predictor",
    "predict_probe_time",
    "DEFAULT_EFFICIENCY",
    "GPU",
    "HEADROOM",
    "MAX_GPUS_PER_NODE",
    "PRUNE_FACTOR",
    "Arch",
    "GPUPlan",
    "MemoryBreakdown",
    "PlanOption",
    "PlanLora",
    "PlanWorkload",
    "PlanResult",
    "SpeedEstimate",
    "arch_from_config",
    "calibrate",
    "calibration_pairs",
    "cpu_probe_seconds",
    "estimate_memory",
    "find_gpu",
    "find_gpus",
    "fits",
    "hardware_flops_per_token",
    "checkpointed_layers",
    "recomputed",
    "load_catalog",
    "lora_param_count",
    "mfu",
    "model_flops_per_token",
    "plan",
    "predict_peak_bytes",
    "predict_speed",
    "predict_step_time",
    "should_prune",
]
