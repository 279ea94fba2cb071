"""autotune: measure, don't guess, the fastest fine-tuning configuration that fits a GPU budget."""

from __future__ import annotations

from autotune.errors import (
    AutotuneError,
    DatasetError,
    MissingDependencyError,
    ModelNotFoundError,
    NothingFitsError,
    SpecError,
)
from autotune.run import TuneResult, tune
from autotune.spec.budget import Budget, parse_budget
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.space import SearchSpace, load_space

__version__ = "0.3.0"

__all__ = [
    "AutotuneError",
    "Budget",
    "Candidate",
    "DatasetError",
    "MissingDependencyError",
    "ModelNotFoundError",
    "NothingFitsError",
    "ProbeRequest",
    "ProbeSettings",
    "SearchSpace",
    "SpecError",
    "TuneResult",
    "Workload",
    "load_space",
    "parse_budget",
    "tune",
]
