"""What the HTML and markdown diagnosis sections show, computed once from a run's results.  [pure]"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.diagnose import Diagnosis, RunDiagnosis, diagnose, diagnose_run, gpu_for_result, probe_mfu
from autotune.estimate import GPU
from autotune.report._importance import Importance, param_importance
from autotune.report.markdown import candidate_of, levers, ranked_by_figure
from autotune.spec.probe_request import Candidate
from autotune.spec.result import ProbeResult
from autotune.spec.trial import candidate_label

__all__ = [
    "ReportModel",
    "build_model",
    "CostRow",
    "cost_rows",
    "LEVER_ROWS",
    "lever_rows",
    "candidate_of",
    "short_label",
    "family_of",
    "on_cpu",
]


def family_of(c: Candidate) -> str:
    """Every choice except the batch split: the "family" a micro-batch sweep belongs to."""
    text = levers(c)
    if c.world_size > 1:
        text += f", {c.world_size} GPUs"
    return text


def short_label(c: Candidate | None) -> str:
    """The candidate's one label (:func:`autotune.spec.candidate_label`), ``?`` when unknown."""
    return candidate_label(c) if c is not None else "?"


def on_cpu(summary: Mapping[str, Any], results: Iterable[ProbeResult]) -> bool:
    if summary.get("device") == "cpu":
        return True
    if summary.get("device") == "cuda":
        return False
    types = {(r.env or {}).get("device_type") for r in results} - {None}
    return types == {"cpu"}


@dataclass
class ReportModel:
    summary: dict[str, Any]
    results: list[ProbeResult]  # probes that ran (search phase)
    baseline: ProbeResult | None
    best: ProbeResult | None  # the chosen, confirmed probe
    gpu: GPU | None  # the catalog card the probes ran on (None: CPU or unknown)
    device_name: str | None
    cpu: bool
    config: dict[str, Any] | None
    mfus: list[float | None]  # aligned with results
    best_mfu: float | None
    baseline_mfu: float | None
    diagnosis: RunDiagnosis
    importance: Importance
    inferred: list[ProbeResult] = field(default_factory=list)  # concluded without running
    notes: list[str] = field(default_factory=list)
    baseline_diagnosis: Diagnosis | None = None

    @property
    def ok(self) -> list[ProbeResult]:
        """The configurations that fit, in the report's one order (``markdown.ranked_by_figure``)."""
        return [r for r, _, _ in ranked_by_figure(self.results, self.summary)]

    @property
    def budget_bytes(self) -> int | None:
        b = self.summary.get("budget_bytes")
        if b:
            return int(b)
        for r in self.results:
            if r.metrics.get("budget_bytes"):
                return int(r.metrics["budget_bytes"])
        return None

    @property
    def usable_bytes(self) -> int | None:
        u = self.summary.get("usable_bytes")
        if u:
            return int(u)
        for r in self.results:
            if r.metrics.get("usable_bytes"):
                return int(r.metrics["usable_bytes"])
        return None

    def chosen(self) -> ProbeResult | None:
        if self.best is not None:
            return self.best
        ok = self.ok
        return ok[0] if ok else None


def build_model(
    summary: Mapping[str, Any],
    results: Sequence[ProbeResult],
    *,
    baseline: ProbeResult | None = None,
    best: ProbeResult | None = None,
    config: Mapping[str, Any] | None = None,
    gpu: GPU | None = None,
    inferred: Sequence[ProbeResult] = (),
    study: Any = None,
    notes: Sequence[str] = (),
) -> ReportModel:
    """Diagnose every probe, compute MFU and parameter importance. ``gpu`` overrides the card
    recorded in the probes' environment (e.g. a GPU name missing from the catalog)."""
    results = list(results)
    cpu = on_cpu(summary, results + ([best] if best else []))
    device_name = None
    for r in ([best] if best else []) + results:
        if (r.env or {}).get("device"):
            device_name = str(r.env["device"])
            break
    if gpu is None and not cpu:
        for r in ([best] if best else []) + results:
            gpu = gpu_for_result(r)
            if gpu is not None:
                break
    cfg = dict(config) if config else None
    note_list = list(notes)
    if not cpu and gpu is None:
        note_list.append(
            f"GPU {device_name!r} is not in the catalog: no MFU and no price are shown "
            "(extend the catalog with $AUTOTUNE_GPU_CATALOG, or pass --gpu NAME)"
        )

    def m(r: ProbeResult | None) -> float | None:
        if r is None or cpu or gpu is None:
            return None
        return probe_mfu(r, cfg, gpu=gpu)

    mfus = [m(r) for r in results]
    diag = diagnose_run(results, best=best, gpu=gpu, config=cfg, mfus=mfus)
    if diag.chosen is not None and best is not None and diag.chosen.mfu is None:
        diag = dataclasses.replace(diag, chosen=dataclasses.replace(diag.chosen, mfu=m(best)))
    return ReportModel(
        summary=dict(summary),
        results=results,
        baseline=baseline,
        best=best,
        gpu=gpu,
        device_name=device_name,
        cpu=cpu,
        config=cfg,
        mfus=mfus,
        best_mfu=m(best),
        baseline_mfu=m(baseline),
        diagnosis=diag,
        importance=param_importance(results, study=study),
        inferred=list(inferred),
        notes=note_list,
        baseline_diagnosis=(
            diagnose(baseline, gpu=gpu, config=cfg, mfu=m(baseline)) if baseline is not None else None
        ),
    )


# ------------------------------------------------------------------------------------ cost


@dataclass(frozen=True)
class CostRow:
    label: str
    tokens_per_s: float
    gpus: int
    hours_per_1b: float  # device-hours (GPU-hours on a GPU) per 1e9 real tokens
    cost_per_1b: float | None  # USD; None: no price
    figure: str = ""  # where tokens_per_s comes from (markdown.one_figure): re-measured median or search probe


def cost_rows(model: ReportModel, top: int = 5) -> tuple[list[CostRow], str]:
    """GPU-hours and cost per 1B real tokens for the fastest configurations, and the price note."""
    rows: list[CostRow] = []
    price = None if model.cpu or model.gpu is None else model.gpu.price_per_hour_usd
    # each configuration at its one figure (the re-measured median where the run has one), as in the top table
    for r, tps, source in ranked_by_figure(model.results, model.summary)[:top]:
        c = candidate_of(r)
        if tps <= 0:
            continue
        world = c.world_size if c else 1
        hours = world * 1e9 / tps / 3600
        rows.append(CostRow(short_label(c), tps, world, hours, hours * price if price is not None else None,
                            figure=source))
    if model.cpu:
        note = "CPU run: hours are machine-hours of this CPU; no price (the catalog prices GPUs only)."
    elif model.gpu is None:
        note = f"no price: GPU {model.device_name!r} is not in the catalog."
    elif price is None:
        note = f"no price: the catalog has none for {model.gpu.name}."
    else:
        note = (
            f"{model.gpu.name} at ${price:.2f} per GPU-hour ({model.gpu.price_date or 'undated'}; "
            f"{model.gpu.price_source or 'catalog'}); edit the catalog for your provider."
        )
    return rows, note


# ------------------------------------------------------------------------------------ levers

# (lever, candidate field or None, keeps the training math identical?, why)
LEVER_ROWS: tuple[tuple[str, str | None, bool, str], ...] = (
    ("micro-batch × accumulation", "micro_batch", True,
     "same effective batch and loss normalisation; only the floating-point summation order differs"),
    ("activation checkpointing", "grad_ckpt", True, "recomputes the same forward in backward (dropout RNG replayed)"),
    ("data-loader workers", "workers", True, "same batches, fetched in parallel"),
    ("pinned memory", "pin_memory", True, "same bytes, faster host→device copies"),
    ("ZeRO / FSDP sharding, CPU offload", "zero_stage", True,
     "same update, partitioned across devices or memory; reduction order differs"),
    ("fused vs plain AdamW", "optim", True, "adamw_torch and adamw_torch_fused are the same algorithm "
     "(adamw_8bit and adafactor are NOT: they change the optimizer state)"),
    ("precision", "precision", False, "bf16/fp16 autocast or TF32 matmuls round differently than fp32"),
    ("packing", "packing", False, "the same sequences and loss terms per step (micro-batch counts sequences), "
     "laid out in rows with per-sequence attention masks: rounding differs slightly, as for attention"),
    ("attention implementation", "attn", False, "same maths, different kernels: results differ slightly (rounding)"),
    ("torch.compile / Liger kernels", "torch_compile", False, "fused kernels: results differ slightly (rounding)"),
)  # fmt: skip


_SAME_MATH_OPTIMIZERS = {"adamw_torch", "adamw_torch_fused"}


def _lever_value(c: Candidate | None, name: str | None) -> str:
    if c is None or name is None:
        return "n/a"
    if name == "micro_batch":
        return f"{c.micro_batch} × {c.grad_accum}"
    if name == "zero_stage":
        if not c.zero_stage:
            return "none"
        return f"{c.sharding} stage {c.zero_stage}" + (
            f", offload {c.offload}" if c.offload != "none" else ""
        )
    if name == "torch_compile":
        return ", ".join(x for x, on in (("compile", c.torch_compile), ("liger", c.liger)) if on) or "off"
    v = getattr(c, name)
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def lever_rows(chosen: Candidate | None, default: Candidate | None) -> list[tuple[str, str, str, bool, str]]:
    """(lever, HF default value, chosen value, keeps the math identical, why) per lever."""
    rows = []
    for name, field_, same, why in LEVER_ROWS:
        if field_ == "optim":
            used = {c.optim for c in (chosen, default) if c is not None}
            same = used <= _SAME_MATH_OPTIMIZERS
        rows.append((name, _lever_value(default, field_), _lever_value(chosen, field_), same, why))
    return rows
