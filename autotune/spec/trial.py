"""What the search records and how it names a candidate: the types every layer exchanges.  [pure]

``TrialRecord`` is one line of a run's ``trials.jsonl``; ``candidate_id`` is the dedupe key and
``candidate_label`` the one short human label of a candidate (progress lines, trials, diagnoses,
reports all use it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from autotune.spec.levers import LABEL_ORDER, LEVERS
from autotune.spec.probe_request import Candidate

__all__ = ["TrialRecord", "candidate_id", "candidate_label"]


@dataclass
class TrialRecord:
    """One line of the search's history: a probe, an inference, a skip, or a confirmation.

    ``status`` is a probe status (ok, oom, over_budget, unsupported, timeout, crash) or ``skipped``.
    ``inferred`` marks infeasibility concluded without running (monotone in micro-batch, or the
    estimator's pruner). ``phase`` is ``search`` or ``confirm``. ``result`` is the ProbeResult as a
    dict when a probe ran. ``origin`` says what proposed it: ``seed`` (an expert default),
    ``baseline`` (the HF default), ``boundary`` (a memory-boundary follow-up), ``neighbour`` or
    ``combination`` (the neighbourhood walk), ``coverage`` (an unseen configuration handed to TPE
    when it kept repeating itself) or ``tpe``; empty in journals written before it existed.
    ``session`` marks a confirmation's process; ``warnings`` what the load monitor saw during the probe.
    """

    key: str
    status: str
    candidate: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    inferred: bool = False
    phase: str = "search"
    repeat: int = 0
    result: dict[str, Any] | None = None
    tokens_per_s: float | None = None
    peak_mem_bytes: int | None = None
    step_time_spread: float | None = None
    wall_s: float | None = None
    number: int = -1
    label: str = ""
    origin: str = ""
    # the process that measured a confirmation (values of an interrupted run are not mixed with later ones)
    session: str = ""
    # what the load monitor found while this probe ran (other processes on the CPU or GPU, throttling)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def candidate_obj(self) -> Candidate | None:
        return Candidate(**self.candidate) if self.candidate is not None else None

    @property
    def probed(self) -> bool:
        """A probe actually ran (not inferred, not skipped)."""
        return self.result is not None and not self.inferred


def candidate_id(candidate: Candidate) -> str:
    """Stable short identity of a candidate (hash of its fields): the dedupe key."""
    fields = {k: v for k, v in dataclasses.asdict(candidate).items()
              if not (LEVERS[k].id_omits_default and v == LEVERS[k].default)}
    text = json.dumps(fields, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def candidate_label(c: Candidate) -> str:
    """Short human label: ``mb4x8 ckpt sdpa bf16 pack w2-pin`` (every knob that tells candidates apart), each
    lever's piece as its declaration (``spec.levers``) writes it."""
    order = [*LABEL_ORDER, *(name for name in LEVERS if name not in LABEL_ORDER)]
    labels = (LEVERS[name].label for name in order)
    return " ".join(piece for label in labels if label is not None and (piece := label(c)))
