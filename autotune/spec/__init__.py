"""Spec: the types and parsers every layer shares (requests, results, trials, budgets).  [pure]"""

from __future__ import annotations

from autotune.spec.baseline import HF_DEFAULT_MICRO_BATCH, hf_default_candidate
from autotune.spec.probe_window import ProbeWindow, composes, probe_grad_accum, probe_window
from autotune.spec.result import ProbeResult
from autotune.spec.trial import TrialRecord, candidate_id, candidate_label

__all__ = [
    "HF_DEFAULT_MICRO_BATCH",
    "ProbeResult",
    "ProbeWindow",
    "TrialRecord",
    "candidate_id",
    "candidate_label",
    "composes",
    "hf_default_candidate",
    "probe_grad_accum",
    "probe_window",
]
