"""Search: Optuna ask/tell over the search space, with the pure rules it relies on.  [pure + optuna]

``Searcher`` (and optuna) load on first use; the rules in ``_logic`` are importable without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.search._confirm import ConfirmPolicy, choose_winner, confirmation_probes, speedup
from autotune.search._logic import (
    FAILED,
    MEMORY_INFEASIBLE,
    Skip,
    candidate_from_choice,
    constraint_value,
    derive_grad_accum,
    distinct_candidates,
    expert_seeds,
    infer_infeasible,
    iter_choices,
    median,
    relative_spread,
    same_except_micro_batch,
    usable_micro_batches,
    usable_worlds,
)
from autotune.search._model import ModelPolicy, Option, Row
from autotune.search._strategies import STRATEGIES
from autotune.spec.trial import TrialRecord, candidate_id, candidate_label

if TYPE_CHECKING:
    from autotune.search._sampler import AutotuneSampler, Observation, SamplerSettings
    from autotune.search._searcher import (
        LoadCheck,
        ProgressFn,
        Pruner,
        Searcher,
        SearchHooks,
        SearchOutcome,
        SearchPolicy,
        SearchRecords,
    )

_LAZY = ("LoadCheck", "ProgressFn", "Pruner", "Searcher", "SearchOutcome", "SearchPolicy", "SearchRecords", "SearchHooks")
_LAZY_SAMPLER = ("AutotuneSampler", "Observation", "SamplerSettings")


def __getattr__(name: str) -> Any:
    # the loop imports optuna (~0.3 s); the pure rules above do not need it
    if name in _LAZY:
        from autotune.search import _searcher

        return getattr(_searcher, name)
    if name in _LAZY_SAMPLER:
        from autotune.search import _sampler

        return getattr(_sampler, name)
    raise AttributeError(f"module 'autotune.search' has no attribute {name!r}")

__all__ = [
    "AutotuneSampler",
    "ConfirmPolicy",
    "FAILED",
    "LoadCheck",
    "MEMORY_INFEASIBLE",
    "ModelPolicy",
    "Observation",
    "Option",
    "ProgressFn",
    "Pruner",
    "Row",
    "STRATEGIES",
    "SamplerSettings",
    "SearchHooks",
    "SearchOutcome",
    "SearchPolicy",
    "SearchRecords",
    "Searcher",
    "Skip",
    "TrialRecord",
    "candidate_from_choice",
    "choose_winner",
    "confirmation_probes",
    "candidate_id",
    "candidate_label",
    "constraint_value",
    "derive_grad_accum",
    "distinct_candidates",
    "expert_seeds",
    "infer_infeasible",
    "iter_choices",
    "median",
    "relative_spread",
    "same_except_micro_batch",
    "speedup",
    "usable_micro_batches",
    "usable_worlds",
]
