"""Why a configuration is slow: the notes' symptom -> bottleneck table applied to probe results,
and MFU with one stated convention.  [pure: no torch, ray, pynvml; no disk]

    diagnose(result, *, gpu=None, config=None, ...) -> Diagnosis
    diagnose_run(results, *, best=None, gpu=None, config=None, mfus=None) -> RunDiagnosis
    probe_mfu(result, config, *, gpu=None) -> float | None      (MFU_CONVENTION says how)
"""

from __future__ import annotations

from autotune.diagnose._mfu import (
    MFU_CONVENTION,
    attention_span,
    gpu_for_device_name,
    gpu_for_result,
    probe_mfu,
)
from autotune.diagnose._rules import (
    DATA_WAIT_THRESHOLD,
    HIGH_UTIL_PERCENT,
    IDLE_UTIL_PERCENT,
    LOW_MEMORY_SHARE,
    LOW_UTIL_PERCENT,
    PADDING_THRESHOLD,
    SCALING_OK,
    SWING_IDLE_SHARE,
    CapacityNeed,
    Diagnosis,
    Finding,
    RunDiagnosis,
    capacity_need,
    diagnose,
    diagnose_run,
    smallest_card,
)

__all__ = [
    "DATA_WAIT_THRESHOLD",
    "HIGH_UTIL_PERCENT",
    "IDLE_UTIL_PERCENT",
    "LOW_MEMORY_SHARE",
    "LOW_UTIL_PERCENT",
    "MFU_CONVENTION",
    "attention_span",
    "PADDING_THRESHOLD",
    "SCALING_OK",
    "SWING_IDLE_SHARE",
    "CapacityNeed",
    "Diagnosis",
    "Finding",
    "RunDiagnosis",
    "capacity_need",
    "diagnose",
    "diagnose_run",
    "gpu_for_device_name",
    "gpu_for_result",
    "probe_mfu",
    "smallest_card",
]
