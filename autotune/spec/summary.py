"""The typed shape of ``summary.json`` (and of ``autotune run --json``), versioned.  [pure]

``RunSummary`` is what a run writes, whatever its outcome (``complete``, ``nothing_fits``) and
however it was answered (searched, from the cache). ``autotune schema`` prints its JSON Schema;
``docs/summary.schema.json`` is the committed copy (a test keeps it equal to this model, another
validates the summary.json of a real run against it). ``SCHEMA_VERSION`` changes when a field
changes meaning or type or is removed; new optional fields keep it.

The ranking entries (``top``) and the chosen configuration (``best``) are built here, from the
searcher's ranking and the winner's probe, and nowhere else.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.spec.probe_request import Candidate
from autotune.spec.result import ProbeResult
from autotune.spec.trial import candidate_label

__all__ = [
    "SCHEMA_VERSION",
    "BaselineEntry",
    "BestEntry",
    "EffectiveBatch",
    "RankingEntry",
    "RunSummary",
    "summary_json_schema",
]

SCHEMA_VERSION = 1


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EffectiveBatch(_Closed):
    """The requested effective batch and what the measured optimizer steps held."""

    value: int = Field(description="micro_batch x grad_accum x world_size")
    micro_batch: int
    grad_accum: int
    world_size: int
    text: str = Field(description="'4 × 8 × 1'")
    sequences_per_step: dict[str, float | int | None] | None = Field(
        None, description="mean/min/max sequences per measured optimizer step (packing changes it)")
    tokens_per_step: dict[str, float | int | None] | None = Field(
        None, description="mean real tokens per measured optimizer step")

    @classmethod
    def of(cls, c: Candidate, metrics: dict[str, Any] | None = None) -> EffectiveBatch:
        m = metrics or {}
        seqs = {k: m.get(f"sequences_per_step_{k}") for k in ("mean", "min", "max")}
        tokens = m.get("tokens_per_step_mean")
        return cls(
            value=c.micro_batch * c.grad_accum * c.world_size, micro_batch=c.micro_batch,
            grad_accum=c.grad_accum, world_size=c.world_size,
            text=f"{c.micro_batch} × {c.grad_accum} × {c.world_size}",
            sequences_per_step=seqs if seqs["mean"] is not None else None,
            tokens_per_step={"mean": tokens} if tokens is not None else None,
        )  # fmt: skip


class RankingEntry(_Closed):
    """One confirmed candidate of ``top``, best first (the confirmation's ranking)."""

    label: str
    status: str = Field(description="confirmed | noisy | pending | failed (search._confirm)")
    median_tokens_per_s: float | None = Field(description="median of the re-measurements: the figure ranked")
    measurements: list[float]
    spread: float | None
    range: list[float] | None = Field(description="[low, high] of the measurements")
    rounds: int
    search_tokens_per_s: float | None = Field(description="the search probe's figure (not ranked)")
    step_time_spread: float | None
    peak_mem_bytes: int | None
    candidate: dict[str, Any] | None
    reason: str
    indistinguishable: bool | None = Field(description="true: within the noise of the winner")
    load_warnings: list[str]

    @classmethod
    def from_ranking(cls, e: dict[str, Any]) -> RankingEntry:
        """From one entry of the searcher's ranking (``SearchOutcome.ranking``)."""
        return cls.model_validate({k: e.get(k) for k in cls.model_fields})


class BestEntry(_Closed):
    """The chosen configuration, with its confirmed figure."""

    label: str
    candidate: dict[str, Any]
    tokens_per_s: float | None = Field(description="the confirmed median (the search figure if unconfirmed)")
    tokens_per_s_measurements: list[float] | None
    tokens_per_s_range: list[float] | None
    search_tokens_per_s: float | None
    spread: float | None
    step_time_spread: float | None
    confirm_status: str | None
    peak_mem_bytes: int | None
    peak_vs_budget: float | None
    peak_vs_usable: float | None
    effective_batch: EffectiveBatch
    origin: str = Field(description="what proposed it: seed, baseline, boundary, neighbour, combination, coverage, tpe")

    @classmethod
    def of(cls, best: ProbeResult, *, origin: str, budget_bytes: int, usable: int | None) -> BestEntry:
        c = best.probe_request().candidate
        m = best.metrics
        peak = m.get("peak_mem_bytes_max") or best.peak_mem_bytes
        return cls(
            label=candidate_label(c), candidate=dataclasses.asdict(c),
            tokens_per_s=m.get("confirmed_tokens_per_s", best.tokens_per_s),
            tokens_per_s_measurements=m.get("tokens_per_s_measurements"),
            tokens_per_s_range=m.get("tokens_per_s_range"), search_tokens_per_s=m.get("search_tokens_per_s"),
            spread=m.get("measurement_spread"), step_time_spread=m.get("step_time_spread"),
            confirm_status=m.get("confirm_status"), peak_mem_bytes=peak,
            peak_vs_budget=(peak / budget_bytes) if peak and budget_bytes else None,
            peak_vs_usable=(peak / usable) if peak and usable else None,
            effective_batch=EffectiveBatch.of(c, m), origin=origin,
        )  # fmt: skip


class BaselineEntry(_Closed):
    """The HF default (``autotune.spec.baseline``): its confirmed median when it made the top-k."""

    label: str
    candidate: dict[str, Any]
    status: str = Field(description="a probe status, or 'not measured'")
    reason: str | None = None
    tokens_per_s: float | None = None
    peak_mem_bytes: int | None = None
    confirmed: bool | None = None
    measurements: list[float] | None = None
    range: list[float] | None = None
    confirm_status: str | None = None


class SpaceInfo(_Closed):
    name: str
    source: str | None
    dimensions: dict[str, list[Any]]


class SearchInfo(BaseModel):
    """The search settings (open: new settings are added here without a version change)."""

    model_config = ConfigDict(extra="allow")

    max_trials: int
    time_budget_s: float | None
    top_k: int
    steps: int
    confirm_steps: int
    confirm: dict[str, Any]
    storage: str | None
    study_name: str
    prune: bool | str | None = Field(None, description="the memory model's pruner ran (\"custom:NAME\": a pruner of yours)")
    load_monitor: bool | None = Field(None, description="other load on the machine was watched")
    max_world: int | None = Field(None, description="most GPUs one probe could use, as planned (null: bounded only by what the executor reports)")
    stop_when_converged: bool | None = Field(None, description="the search ended once the walk had settled (--stop-when-converged)")


class Environment(_Closed):
    hardware: dict[str, Any]
    software: dict[str, str | None]


class Trust(_Closed):
    doubtful: bool = Field(description="true: --strict exits 5")
    reasons: list[str]


class RunSummary(_Closed):
    """``summary.json``: the request, the search, the answer and its trust."""

    schema_version: int = Field(SCHEMA_VERSION, description="bumped when a field changes meaning or type")
    status: Literal["running", "complete", "nothing_fits"]
    run_id: str
    run_dir: str
    cache_key: str
    from_cache: bool
    resumed: bool
    # the request
    model: str
    model_name: str
    model_source: str
    mode: str
    trainer: str = Field("hf", description="hf: probes through transformers.Trainer; trl: TRL's SFTTrainer")
    seq_len: int
    lengths: str = Field(description="the synthetic length distribution (unused with a dataset)")
    dataset: str | None = Field(None, description="the data the probes read (None: synthetic sequences of lengths)")
    split: str | None = None
    effective_batch: int
    device: str
    gpu_budget: str
    budget_bytes: int
    usable_bytes: int | None
    headroom: float
    cuda_alloc_conf: str | None = Field(None, description="the PYTORCH_CUDA_ALLOC_CONF the GPU probes ran with and the "
                                        "emitted train.py / train_sft.py set (None: a CPU run, none set)")
    seed: int
    space: SpaceInfo
    dropped_choices: list[dict[str, Any]]
    search: SearchInfo
    environment: Environment
    # the search
    wall_s: float | None = None
    counts: dict[str, int] | None = None
    probes_run: int | None = None
    inferred: int | None = None
    failed: int | None = None
    skipped_choices: list[str] | None = None
    stop_reason: str | None = None
    distinct_candidates: int | None = None
    probes_by_origin: dict[str, int] | None = None
    top: list[RankingEntry] | None = None
    warnings: list[dict[str, Any]] | None = Field(None, description="load monitor findings {kind, message, value}")
    tie: list[str] | None = None
    lever_decisions: list[dict[str, Any]] | None = Field(
        None, description="--strategy model: each lever of the winner changed alone, {lever, value, decided_by "
        "(probe|model), ratio (its tok/s / the winner's: measured, or predicted), sd (the prediction's relative "
        "deviation), fit_chance, status}")
    # the answer
    best: BestEntry | None = None
    baseline: BaselineEntry | None = None
    speedup_vs_baseline: float | None = None
    speedup_note: str | None = None
    speedup_range: list[float] | None = None
    speedup_distinguishable: bool | None = None
    speedup_paired_rounds: int | None = None
    trust: Trust | None = None
    verify_loss: dict[str, Any] | None = None
    quality_notes: list[str] | None = Field(None, description="how the measured path trains differently, "
                                            "e.g. TRL's packing (--trainer trl)")
    files: list[str] | None = None
    # nothing fits
    message: str | None = None
    measured_infeasible: int | None = None
    smallest_footprint_bytes: int | None = None
    # answered from the cache; written back into the user's config (``autotune run --write-back``)
    answered_in_s: float | None = None
    write_back: dict[str, Any] | None = None


def summary_json_schema() -> dict[str, Any]:
    """The JSON Schema of ``summary.json`` (what ``autotune schema`` prints)."""
    return RunSummary.model_json_schema()
