"""One error hierarchy. Messages state the rule and the values that broke it."""

from __future__ import annotations

__all__ = [
    "AutotuneError",
    "SpecError",
    "ModelNotFoundError",
    "DatasetError",
    "NothingFitsError",
    "MissingDependencyError",
    "RunInProgressError",
    "WriteError",
]


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose.

    ``exit_code`` is what the CLI exits with: 2 for a bad request, 3 when nothing fits, 4 when the
    run to resume is still running in another process.
    """

    exit_code: int = 2


class SpecError(AutotuneError, ValueError):
    """The request itself is wrong (bad flag value, bad YAML, contradiction)."""

    def __init__(self, message: str | list[str]) -> None:
        if isinstance(message, list):
            self.problems = list(message)
            message = "; ".join(self.problems) if len(self.problems) > 1 else self.problems[0]
        else:
            self.problems = [message]
        super().__init__(message)


class ModelNotFoundError(SpecError):
    """A model reference that is neither a preset, a local directory nor in the HF cache."""


class DatasetError(SpecError):
    """A dataset that cannot be read, is empty, or needs a tokenizer that is not there."""


class MissingDependencyError(AutotuneError, ImportError):
    """An optional dependency is needed; the message carries the install hint."""


class NothingFitsError(AutotuneError):
    """The search finished and no configuration fits the budget. ``summary``: the run's summary.json, as written
    (``--json`` prints it)."""

    exit_code = 3

    def __init__(self, message: str, summary: dict | None = None) -> None:
        super().__init__(message)
        self.summary = summary


class RunInProgressError(AutotuneError):
    """``--resume`` found the run, but another live process is still running it (it holds the lock)."""

    exit_code = 4


class WriteError(AutotuneError, OSError):
    """A file (or the study) could not be written: disk full, read-only, an I/O error.

    The file is left as it was (writes are atomic); a run folder stays resumable with ``--resume``.
    Exit 2, like a folder the user cannot write to: the machine refused, nothing crashed.
    """
