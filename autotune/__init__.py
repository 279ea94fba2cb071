"""autotune: measure, don't guess, the fastest fine-tuning configuration that fits a GPU budget."""

from __future__ import annotations

from autotune.errors import (
    AutotuneError,
    DatasetError,
    MissingDependencyError,
    ModelNotFoundError,
    NothingFitsError,
    ProbeError,
    SpecError,
)
from autotune.spec.budget import Budget, parse_budget
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload

__version__ = "0.1.0"

__all__ = [
    "AutotuneError",
    "Budget",
    "Candidate",
    "DatasetError",
    "MissingDependencyError",
    "ModelNotFoundError",
    "NothingFitsError",
    "ProbeError",
    "ProbeRequest",
    "ProbeSettings",
    "SpecError",
    "Workload",
    "parse_budget",
]
