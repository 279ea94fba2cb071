"""Spec: the types and parsers every layer shares (requests, results, trials, budgets).  [pure]"""

from __future__ import annotations

from autotune.spec.baseline import HF_DEFAULT_MICRO_BATCH, hf_default_candidate
from autotune.spec.budget import PERCENT_RULE, resolve_budget
from autotune.spec.probe_window import ProbeWindow, composes, probe_grad_accum, probe_window
from autotune.spec.result import ProbeResult
from autotune.spec.run_defaults import confirm_steps, load_monitor_default, max_world, prune_default
from autotune.spec.trial import TrialRecord, candidate_id, candidate_label

__all__ = [
    "HF_DEFAULT_MICRO_BATCH",
    "PERCENT_RULE",
    "ProbeResult",
    "ProbeWindow",
    "TrialRecord",
    "candidate_id",
    "candidate_label",
    "composes",
    "confirm_steps",
    "hf_default_candidate",
    "load_monitor_default",
    "max_world",
    "probe_grad_accum",
    "probe_window",
    "prune_default",
    "resolve_budget",
]
