"""Rebuild ``report.md`` and ``report.html`` from a run directory.  [effect: reads the run dir and the
model's config.json, writes the two reports atomically; the rendering itself is pure]

    data = load_run(run_dir)            # summary.json + journal.jsonl (+ best_result.json)
    paths = write_reports(run_dir)      # -> [report.md, report.html]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.estimate import GPU
from autotune.spec.result import ProbeResult

__all__ = ["RunData", "load_run", "read_model_config", "render_reports", "write_reports"]


@dataclass
class RunData:
    """A run directory read back: what the reports are rendered from."""

    path: Path
    summary: dict[str, Any]
    results: list[ProbeResult]  # probes of the search phase (what report.md lists)
    baseline: ProbeResult | None
    best: ProbeResult | None
    inferred: list[ProbeResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _read_json(path: Path) -> Any:
    from autotune.spec.files import load_json, read_text_file

    if not path.exists():
        return None
    return load_json(read_text_file(path, what="run file", max_bytes=256 * 2**20), what=f"cannot read {str(path)!r}")


# the types the renderers rely on, for the summary.json keys they read (None is always accepted)
_SUMMARY_TYPES: dict[str, type | tuple[type, ...]] = {
    "best": dict, "baseline": dict, "top": list, "counts": dict, "probes_by_origin": dict, "space": dict,
    "search": dict, "environment": dict, "verify_loss": dict, "skipped_choices": list, "quality_notes": list,
    "budget_bytes": int, "usable_bytes": int, "seq_len": int, "effective_batch": int,
    "wall_s": (int, float), "speedup_vs_baseline": (int, float), "headroom": (int, float),
    "status": str, "model": str, "model_name": str, "run_id": str, "mode": str, "device": str,
    "gpu_budget": str, "message": str, "stop_reason": str, "trainer": str, "cuda_alloc_conf": str,
}


def _summary_problems(summary: dict[str, Any]) -> list[str]:
    bad = []
    for key, want in _SUMMARY_TYPES.items():
        v = summary.get(key)
        if v is None:
            continue
        wants = want if isinstance(want, tuple) else (want,)
        if isinstance(v, bool) or not isinstance(v, wants):
            names = " or ".join("a number" if t in (int, float) else f"a {t.__name__}" for t in wants)
            bad.append(f"{key!r} should be {names}, got {type(v).__name__}")
    return bad


def _journal_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line (a line cut short by a kill is ignored, as the store does)."""
    if not path.exists():
        return []
    out = []
    for raw in path.read_bytes().split(b"\n"):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
            continue
        if isinstance(d, dict):
            out.append(d)
    return out


def _result(d: Any) -> ProbeResult | None:
    if not isinstance(d, dict):
        return None
    try:
        return ProbeResult.from_dict(d)
    except (KeyError, TypeError, ValueError):
        return None


def load_run(run_dir: str | os.PathLike[str], *, summary: dict[str, Any] | None = None) -> RunData:
    """Read ``summary.json``, ``journal.jsonl`` and ``best_result.json`` of a run directory (``summary``:
    the run's summary as it is about to be written, instead of the file).

    Raises SpecError when the path is not a run directory (no summary.json and no journal).
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise SpecError(f"run directory {str(path)!r} does not exist or is not a directory")
    if summary is None:
        summary = _read_json(path / "summary.json")
    records = _journal_lines(path / "journal.jsonl")
    if summary is None and not any(_result(r.get("result")) is not None or r.get("inferred") for r in records):
        journal = path / "journal.jsonl"
        if journal.exists():
            raise SpecError(f"{str(path)!r} has no summary.json and its journal.jsonl holds no probe this version can "
                            "read (the run stopped before its first probe, or the file is damaged): run it again")
        raise SpecError(
            f"{str(path)!r} is not an autotune run directory: it has neither summary.json nor journal.jsonl"
        )
    notes: list[str] = []
    if summary is None:
        summary = {"run_id": path.name, "status": "running"}
        notes.append("summary.json is missing (the run did not finish): built from the journal alone")
    if not isinstance(summary, dict):
        raise SpecError(f"{str(path / 'summary.json')!r} must hold a JSON object")
    problems = _summary_problems(summary)
    if problems:
        raise SpecError(f"run directory {str(path)!r}: summary.json: " + "; ".join(problems[:3])
                        + " (edited, or written by another program?)")

    results: list[ProbeResult] = []
    inferred: list[ProbeResult] = []
    baseline: ProbeResult | None = None
    template_request: dict[str, Any] | None = None
    pending_inferred: list[dict[str, Any]] = []
    for rec in records:
        phase = rec.get("phase", "search")
        res = _result(rec.get("result"))
        if res is not None and template_request is None:
            template_request = res.request
        if rec.get("inferred"):
            pending_inferred.append(rec)
        elif res is not None and phase == "search":
            results.append(res)
        elif res is not None and phase == "baseline":
            baseline = res
    # infeasibility concluded without running: status by candidate for the feasibility map
    if template_request is not None:
        for rec in pending_inferred:
            if rec.get("status") not in ("oom", "over_budget") or not isinstance(rec.get("candidate"), dict):
                continue
            req = dict(template_request)
            req["candidate"] = rec["candidate"]
            inferred.append(ProbeResult(status=rec["status"], request=req, reason=str(rec.get("reason", "")),
                                        metrics={"inferred": True}))  # fmt: skip

    if baseline is None:  # the search measured the HF default, or the run stopped before its baseline phase
        baseline = _find_default(summary, results)
    best = _result(_read_json(path / "best_result.json"))
    return RunData(path, summary, results, baseline, best, inferred, notes)


def _find_default(summary: dict[str, Any], results: list[ProbeResult]) -> ProbeResult | None:
    """The search probe that was the HF default (the search measured it, so no baseline record)."""
    from dataclasses import asdict

    from autotune.spec.baseline import hf_default_candidate

    eb = summary.get("effective_batch")
    world = ((summary.get("best") or {}).get("candidate") or {}).get("world_size", 1)
    if eb is None and results:  # a run that stopped before its summary: its probes hold the effective batch
        c = results[0].request.get("candidate") or {}
        try:
            eb, world = int(c["micro_batch"]) * int(c["grad_accum"]) * int(c.get("world_size", 1)), c.get("world_size", 1)
        except (KeyError, TypeError, ValueError):
            return None
    if eb is None:
        return None
    try:  # like with like: bf16 on a GPU whose space has it, fp32 otherwise
        wants = [asdict(hf_default_candidate(int(eb), world_size=int(world), precision=p)) for p in ("fp32", "bf16")]
    except (TypeError, ValueError):
        return None
    for r in results:
        if r.request.get("candidate") in wants:
            return r
    return None


def read_model_config(data: RunData) -> tuple[dict[str, Any] | None, str | None]:
    """The model's config.json (from the probes' ``workload.model_path``), or (None, why not)."""
    from autotune.spec.files import read_json_file

    for r in ([data.best] if data.best else []) + data.results:
        mp = (r.request.get("workload") or {}).get("model_path")
        if not mp:
            continue
        cfg_path = Path(mp) / "config.json"
        try:
            cfg = read_json_file(cfg_path, what="model config")
        except SpecError as exc:
            return None, f"{exc}: no MFU"
        return (cfg if isinstance(cfg, dict) else None), None
    return None, "no probe records its model_path: no MFU"


def render_reports(
    data: RunData,
    *,
    config: dict[str, Any] | None = None,
    gpu: GPU | None = None,
    notes: list[str] | None = None,
) -> tuple[str, str]:
    """(report.md text, report.html text). Pure given ``data`` and ``config``."""
    from autotune.report._model import build_model
    from autotune.report.diagnosis import render_diagnosis_md
    from autotune.report.html import render_html
    from autotune.report.markdown import render_report_md

    model = build_model(data.summary, data.results, baseline=data.baseline, best=data.best, config=config,
                        gpu=gpu, inferred=data.inferred, notes=list(data.notes) + list(notes or []))  # fmt: skip
    md = render_report_md(data.summary, data.results, baseline=data.baseline, best=data.best)
    md += render_diagnosis_md(model)
    return md, render_html(model)


def write_reports(run_dir: str | os.PathLike[str], *, gpu: GPU | None = None,
                  summary: dict[str, Any] | None = None) -> list[Path]:
    """Rebuild ``report.md`` and ``report.html`` in ``run_dir`` (each written atomically); ``summary``: the
    run's, before summary.json is written (a run writes it last)."""
    from autotune.store.atomic import write_text_atomic

    data = load_run(run_dir, summary=summary)
    where = f"run directory {str(data.path)!r}: summary.json"
    config, why = read_model_config(data)
    # on a CPU run there is no MFU anyway: a missing config is not worth a note there
    notes = [why] if why and data.summary.get("device") != "cpu" else []
    try:
        md, page = render_reports(data, config=config, gpu=gpu, notes=notes)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:  # a field deeper down
        msg = " ".join(str(exc).split())[:160]
        raise SpecError(f"{where} or the journal holds a value of the wrong type ({type(exc).__name__}: {msg}); "
                        "edited, or written by another program?") from None
    return [
        write_text_atomic(data.path / "report.md", md),
        write_text_atomic(data.path / "report.html", page),
    ]
