"""Stages 3 and 6-7 of a run: a stored answer to the same request, then the summary of the search and the
answer written out: trials.csv, best_result.json, best/ (every format), a ``--from`` file written back,
the reports, and summary.json, written once, last (a run killed before it is resumable).

``RunResult`` is what ``tune`` hands back; its ``summary`` is summary.json, and what ``--json`` prints.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import NothingFitsError, SpecError
from autotune.run._plan import SearchPlan
from autotune.run._request import ProgressFn, Request, WriteBackPlan
from autotune.run._search import Searched
from autotune.search import FAILED, TrialRecord, candidate_id, candidate_label
from autotune.spec.budget import format_bytes
from autotune.spec.probe_request import (
    Candidate,
)
from autotune.spec.result import ProbeResult
from autotune.spec.space import SearchSpace
from autotune.spec.summary import BaselineEntry, BestEntry, RankingEntry

if TYPE_CHECKING:  # the searcher imports optuna: loaded when a search actually runs
    from autotune.search import SearchOutcome

__all__ = ["RunResult", "TuneResult", "answer_from_cache", "summarize", "write_answer", "write_back",
           "nothing_fits_message", "trust_verdict"]

@dataclass
class RunResult:
    """What ``tune`` hands back. ``best`` is the chosen (confirmed) probe; ``summary`` is summary.json as
    written (what ``autotune run --json`` prints), or a stored run's with ``from_cache`` and
    ``answered_in_s`` (and this request's ``write_back``) added."""

    best: ProbeResult
    summary: dict[str, Any]
    run_dir: Path
    from_cache: bool = False
    records: list[TrialRecord] = field(default_factory=list)

    @property
    def candidate(self) -> Candidate:
        return self.best.probe_request().candidate

    @property
    def tokens_per_s(self) -> float | None:
        return self.summary.get("best", {}).get("tokens_per_s") or self.best.tokens_per_s

    def training_arguments_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``best/training_args.json`` (or rebuilt from the candidate)."""
        path = self.run_dir / "best" / "training_args.json"
        if path.exists():
            return dict(json.loads(path.read_text(encoding="utf-8")))
        from autotune.formats.training_args import emitted_training_args

        req = self.best.probe_request()
        device = "cpu" if self.summary.get("device") == "cpu" else "cuda"
        return emitted_training_args(req, fields=_training_args_fields(), device=device)

    def training_arguments(self, output_dir: str | Path, **overrides: Any) -> Any:
        """A ``transformers.TrainingArguments`` for the best configuration (overrides win)."""
        from transformers import TrainingArguments  # noqa: TID251 - effectful on purpose, lazily

        kw = {**self.training_arguments_kwargs(), **overrides}
        return TrainingArguments(output_dir=str(output_dir), **kw)


def _training_args_fields() -> set[str]:
    from autotune.env import training_fields

    fields = training_fields()[0]
    if fields is None:
        from autotune.errors import MissingDependencyError

        raise MissingDependencyError("the emitted TrainingArguments need transformers: pip install autotune")
    return fields


TuneResult = RunResult  # the name of one release ago


def answer_from_cache(r: Request, plan: SearchPlan, *, started: float) -> RunResult | None:
    """Stage 3: a stored answer to the same request (None: search). A stored, measured "nothing fits"
    is raised again (NothingFitsError). ``--fresh`` skips this stage."""
    from autotune.store import find_cached, find_cached_nothing_fits, stored_answer_problem

    a = r.args
    if a.fresh or a.resume:  # --resume continues the unfinished run of this request, never a stored answer
        return None
    out_path = Path(a.out)
    rejected: list[Any] = []  # stored answers inconsistent with the request (edited, damaged): re-measured
    cached = find_cached(out_path, plan.key, rejected=rejected, validate=lambda best: stored_answer_problem(
        best, effective_batch=a.effective_batch, device=plan.device, seq_len=a.seq_len, usable_bytes=plan.usable))
    for stored, problem in rejected if a.progress is not None else []:
        a.progress("note", {"text": f"the stored run {stored.path} was not used: its best_result.json {problem}; "
                                    "searching again"})
    if cached is not None:
        summary = cached.read_json("summary.json") or {}
        best = ProbeResult.from_dict(cached.read_json("best_result.json"))
        # the folder it is served from (a results folder moved or restored elsewhere names its old path)
        summary = {**summary, "run_dir": str(cached.path), "from_cache": True,
                   "answered_in_s": round(time.monotonic() - started, 3), **_moved_study(summary, cached)}
        _restore_best(cached, best, summary, plan.device, a.progress)
        if a.progress is not None:
            a.progress("cached", {"run_dir": str(cached.path), "summary": summary})
        if r.write_back is not None:  # this request's file, tuned from the stored answer (the stored run is kept)
            summary["write_back"] = write_back(r.write_back, a.source, best, cached.path, a.progress)
            _refuse_if_set_aside(summary["write_back"])
        return RunResult(best=best, summary=summary, run_dir=cached.path, from_cache=True)
    refused = find_cached_nothing_fits(out_path, plan.key)
    if refused is not None:
        stored, stored_summary = refused
        if a.progress is not None:
            a.progress("cached", {"run_dir": str(stored.path), "summary": stored_summary})
        raise NothingFitsError(str(stored_summary.get("message", "nothing fits (cached answer)")) + " [cached]",
                               summary={**stored_summary, "from_cache": True})
    return None


def _moved_study(summary: dict[str, Any], cached: Any) -> dict[str, Any]:
    """``search`` naming the served folder's own study where the stored summary names it at the folder's old place
    (a results folder moved or restored elsewhere); nothing to change otherwise (a --storage of the user's own)."""
    search, prefix = summary.get("search"), "sqlite:///"
    url = search.get("storage") if isinstance(search, dict) else None
    if not isinstance(url, str) or not url.startswith(prefix):
        return {}
    old = Path(url[len(prefix):])
    if old.name != "study.db" or old.parent.name != cached.path.name or old == cached.study_db.resolve():
        return {}
    return {"search": {**search, "storage": cached.storage_url()}}


def _whole(path: Path) -> bool:
    """An emitted file that is there, not empty, and (JSON, YAML) parses: a write cut off by a full disk does not."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return False
        if path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        elif path.suffix == ".yaml":
            import yaml

            yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - unreadable or any parse error: not whole
        return False
    return True


def _restore_best(stored: Any, best: ProbeResult, summary: dict[str, Any], device: str,
                  progress: ProgressFn | None) -> None:
    """A stored answer's emitted files, written again from its best_result.json when one is missing, empty or cut
    short (a partial restore of a cached results folder): what is served is the answer whole, or an error."""
    listed = [n for n in summary.get("files", []) if n.startswith("best/") and not n.startswith("best/tuned/")]
    damaged = [n for n in listed if not _whole(stored.path / n)]
    if not damaged:
        return
    from autotune.emit import emit_all
    from autotune.errors import WriteError

    try:
        emit_all(best, stored.best_dir, fields=_training_args_fields(), device=device)
    except OSError as exc:
        raise WriteError(f"the stored answer {stored.path} lacks {damaged[0]} and it could not be written again: "
                         f"{exc}; free space or give --fresh") from exc
    if progress is not None:
        progress("note", {"text": f"the stored answer's {', '.join(damaged[:3])}{' ...' if len(damaged) > 3 else ''} "
                                  f"{'was' if len(damaged) == 1 else 'were'} missing, empty or cut short: written again from its "
                                  "best_result.json"})


def summarize(r: Request, plan: SearchPlan, searched: Searched, base_summary: dict[str, Any]) -> dict[str, Any]:
    """Stage 6: summary.json from the confirmed ranking: top-k, best, the HF default and the speedup over
    it, trust, and, when nothing fits, why (the message NothingFitsError carries)."""
    outcome = searched.outcome
    summary = _build_summary(outcome=outcome, base=base_summary, usable=plan.usable,
                             budget_bytes=plan.settings.budget_bytes)
    if plan.baseline is not None:
        _, summary["baseline"] = _baseline_summary(outcome, plan.baseline)
        summary.update(_speedup_summary(outcome, plan.baseline))
    summary["trust"] = trust_verdict(summary)
    if plan.deadlines is not None:  # the rule, the forecast and what the run's probes corrected it by
        summary["search"] = {**summary["search"], "deadlines": {**summary["search"].get("deadlines", {}),
                                                                **plan.deadlines.summary()}}
    if outcome.best is None:
        a = r.args
        message = nothing_fits_message(outcome.records, budget_text=r.budget.text, usable_bytes=plan.usable,
                                       space=plan.space, mode=a.mode, seq_len=a.seq_len,
                                       predicted=searched.predictions)  # fmt: skip
        smallest = _smallest_footprint(outcome.records)
        # only a measured oom/over_budget makes "nothing fits" an answer worth caching
        measured = sum(1 for rec in outcome.records if rec.probed and rec.status in ("oom", "over_budget"))
        summary.update({"status": "nothing_fits", "message": message, "measured_infeasible": measured,
                        "smallest_footprint_bytes": smallest.peak_mem_bytes if smallest else None})
    return summary


def _build_summary(
    *, outcome: SearchOutcome, base: dict[str, Any], usable: int | None, budget_bytes: int,
) -> dict[str, Any]:
    summary = dict(base)
    best, rec = outcome.best, outcome.best_record
    summary["wall_s"] = round(outcome.wall_s, 3)
    summary["counts"] = outcome.counts
    summary["probes_run"] = outcome.counts.get("probed", 0) + outcome.counts.get("confirm_probes", 0)
    summary["inferred"] = outcome.counts.get("inferred", 0)
    summary["failed"] = outcome.counts.get("failed", 0)
    summary["skipped_choices"] = outcome.skipped_choices
    summary["stop_reason"] = outcome.stop_reason
    summary["distinct_candidates"] = outcome.distinct_candidates
    # probes run, by what proposed them (TrialRecord.origin)
    summary["probes_by_origin"] = dict(Counter(r.origin or "unknown" for r in outcome.records
                                               if r.phase in ("search", "recheck") and r.probed))
    summary["top"] = [RankingEntry.from_ranking(e).model_dump(mode="json") for e in outcome.ranking]
    summary["warnings"] = outcome.warnings
    summary["tie"] = outcome.tie
    if outcome.lever_decisions:
        summary["lever_decisions"] = outcome.lever_decisions
    if best is not None and rec is not None:
        summary["best"] = BestEntry.of(best, origin=rec.origin, budget_bytes=budget_bytes,
                                       usable=usable).model_dump(mode="json")
    return summary


def nothing_fits_message(
    records: list[TrialRecord], *, budget_text: str, usable_bytes: int | None, space: SearchSpace, mode: str,
    seq_len: int, predicted: dict[str, tuple[int, str]] | None = None,
) -> str:
    """Why nothing fits, by how much, and the lever that would be needed."""
    probed = [r for r in records if r.probed and r.phase == "search"]
    usable = f" (usable {format_bytes(usable_bytes)})" if usable_bytes else ""
    head = f"nothing fits the budget {budget_text}{usable}"
    levers: list[str] = []
    if True not in space.grad_ckpt:
        levers.append("allow gradient checkpointing in the search space")
    if mode == "full":
        levers.append("try --mode lora")
    elif mode == "lora":
        levers.append("try --mode qlora")
    if seq_len > 512:
        levers.append(f"a shorter --seq-len than {seq_len}")
    if not probed:
        if predicted:
            low, label = min(predicted.values())
            return (f"{head}: the memory model predicts >= {format_bytes(low)} even for the smallest configuration "
                    f"({label}); nothing was probed; " + "; ".join(levers + [
                        f"a budget of at least {format_bytes(int(low * 1.06))}"]))
        return f"{head}: no probe ran (every choice was skipped or inferred infeasible)"
    smallest = _smallest_footprint(probed)
    statuses = sorted({r.status for r in probed})
    if all(r.status in FAILED + ("unsupported",) for r in probed):
        first = probed[0]
        counts = ", ".join(f"{sum(1 for r in probed if r.status == s)} {s}" for s in statuses)
        return f"{head}: no probe could be measured ({counts}); first: {first.status}: {first.reason}"
    if smallest is None:
        statuses_text = ", ".join(f"{sum(1 for r in probed if r.status == s)} {s}" for s in statuses)
        return f"{head}: every probe ran out of memory ({statuses_text}); " + "; ".join(levers or ["a larger budget"])
    c = smallest.candidate or {}
    where = f"micro_batch {c.get('micro_batch')} " + ("with" if c.get("grad_ckpt") else "without") + " checkpointing"
    levers.append(f"a budget of at least {format_bytes(int((smallest.peak_mem_bytes or 0) * 1.06))}")
    return (
        f"{head}: needs >= {format_bytes(smallest.peak_mem_bytes)} at {where} "
        f"({smallest.label}, the smallest footprint measured); " + "; ".join(levers)
    )


def _smallest_footprint(records: list[TrialRecord]) -> TrialRecord | None:
    measured = [r for r in records if r.probed and r.peak_mem_bytes]
    return min(measured, key=lambda r: r.peak_mem_bytes or 0) if measured else None


def write_answer(r: Request, run_dir: Any, summary: dict[str, Any], searched: Searched, *,
                 device: str) -> RunResult:
    """Stage 7: trials.csv, best_result.json, best/, the ``--from`` file written back, the reports (from
    this summary), then summary.json, once, with the list of files (NothingFitsError after writing when
    nothing fits)."""
    outcome, verified, progress = searched.outcome, searched.verified, r.args.progress
    run_dir.write_trials_csv(outcome.records)
    if outcome.best is None:
        _write_reports(run_dir, summary, progress)
        run_dir.write_json("summary.json", summary)
        raise NothingFitsError(summary["message"], summary=summary)
    best = outcome.best
    run_dir.write_json("best_result.json", best.to_dict())
    files = _emit(best, run_dir, device)
    summary["status"] = "complete"
    if best.metrics.get("quality_notes"):  # e.g. TRL's packing (--trainer trl)
        summary["quality_notes"] = list(best.metrics["quality_notes"])
    if verified is not None:
        run_dir.write_json("verify_loss.json", verified)
        files.append(run_dir.path / "verify_loss.json")
        summary["verify_loss"] = {k: verified.get(k) for k in ("steps", "max_abs_diff", "max_at_step", "tolerance",
                                                               "exceeds", "expected_identical", "verdict")}
        summary["trust"] = trust_verdict(summary)
    if r.write_back is not None:
        summary["write_back"] = write_back(r.write_back, r.args.source, best, run_dir.path, progress)
        files += [_diff_path(run_dir.path, r.args.source), Path(summary["write_back"]["path"])]
    files += _write_reports(run_dir, summary, progress)
    summary["files"] = sorted({str(p.relative_to(run_dir.path)) for p in files + [
        run_dir.path / n for n in ("trials.csv", "best_result.json", "summary.json")] if p.is_relative_to(run_dir.path)})
    run_dir.write_json("summary.json", summary)
    _refuse_if_set_aside(summary.get("write_back"))
    return RunResult(best=best, summary=summary, run_dir=run_dir.path, records=outcome.records)


# where the tuned copy of a --from file goes without --write-back, and its diff: a folder of its own, so that a
# file named like one autotune emits (training_args.json, axolotl.yaml, ...) never replaces the emitted one
TUNED_DIR = ("best", "tuned")


def _diff_path(run_path: Path, source: Any) -> Path:
    """Where the write-back's diff goes: ``best/tuned/<the file's name>.diff``."""
    return run_path.joinpath(*TUNED_DIR) / (source.name + ".diff")


def write_back(plan: WriteBackPlan, source: Any, best: ProbeResult, run_path: Path,
               progress: ProgressFn | None) -> dict[str, Any]:
    """The user's ``--from`` file with the tuned keys changed (nothing else), at the target checked before
    the search (default ``best/tuned/<its name>``), and its diff beside it (``best/tuned/<name>.diff``).

    A target whose content changed during the search (the user edited it) is not overwritten: the tuned
    file goes beside it, and the entry says so (``set_aside``; the run then exits 2)."""
    from autotune.formats import tuned_file, unified_diff
    from autotune.store.atomic import (
        beside,
        check_write_target,
        content_state,
        write_text_atomic,
        write_text_if_changed,
    )

    cand = dataclasses.asdict(best.probe_request().candidate)
    text, updates = tuned_file(source, cand, fields=plan.fields, best=best)
    diff = unified_diff(source.name, source.text, text)
    write_text_if_changed(_diff_path(run_path, source), diff)  # a stored answer's, served from a read-only folder
    target = plan.target or run_path.joinpath(*TUNED_DIR) / source.name
    entry: dict[str, Any] = {"path": str(target), "format": source.format, "changed": updates, "diff": diff}
    if plan.target is not None:
        check_write_target(target, what="--write-back")
        if content_state(target) != plan.state:
            aside = beside(target)
            write_text_atomic(aside, text)
            return {**entry, "path": str(aside), "set_aside": (
                f"--write-back {str(target)!r} changed during the search, so it was left as it is; the tuned file "
                f"is {str(aside)!r} (from the file as it was read): merge the two")}
    write_text_if_changed(target, text)
    if progress is not None:
        progress("write_back", {"path": str(target), "label": source.module.LABEL, "changed": len(updates),
                                "diff": diff})
    return entry


def _refuse_if_set_aside(entry: dict[str, Any] | None) -> None:
    if entry and entry.get("set_aside"):
        raise SpecError(entry["set_aside"])


def _no_speedup_why(outcome: SearchOutcome, key: str) -> str:
    """Why the answer has no "x over the HF default": never probed, probed and not run, or not re-measured."""
    rec = next((r for r in outcome.records if r.key == key and r.phase == "search"), None)
    if rec is None:
        return ("the HF default was not probed: the search ended (its --max-trials or --time-budget) before it; "
                "a larger budget measures it beside the winner")
    if rec.status != "ok":
        how = "inferred" if rec.inferred else "measured"
        return (f"the HF default does not run here ({how} {rec.status}"
                + (f": {' '.join(str(rec.reason).split())[:120]})" if rec.reason else ")"))
    return "the HF default was probed but not re-measured beside the winner (its re-measurements did not run)"


def _speedup_summary(outcome: SearchOutcome, baseline: Candidate) -> dict[str, Any]:
    """best vs the HF default from the medians of their side-by-side re-measurements, with the range."""
    from autotune.search import speedup

    if outcome.best_record is None:
        return {}
    key = candidate_id(baseline)
    base = next((e for e in outcome.ranking if e["key"] == key), None)
    best = next((e for e in outcome.ranking if e["key"] == outcome.best_record.key), None)
    if base is None or best is None or base["status"] not in ("confirmed", "noisy"):
        return {"speedup_vs_baseline": None, "speedup_note": _no_speedup_why(outcome, key)}
    searched = (best.get("search_tokens_per_s"), base.get("search_tokens_per_s"))
    s = speedup(best["measurements"], base["measurements"], best_by_round=best.get("by_round"),
                base_by_round=base.get("by_round"),
                best_loaded=best.get("loaded_rounds") or (), base_loaded=base.get("loaded_rounds") or (),
                search_ratio=searched[0] / searched[1]
                if outcome.confirm_policy.get("search_agrees") and all(searched) else None)
    if s is None:
        return {"speedup_vs_baseline": None,
                "speedup_note": "the winner and the HF default were never re-measured alike (other load spoiled "
                                "every re-measurement of one side, none of the other's): no speed-up is claimed"}
    return {"speedup_vs_baseline": s["ratio"], "speedup_range": s["range"],
            "speedup_distinguishable": s["distinguishable"], "speedup_paired_rounds": s["paired_rounds"]}


def trust_verdict(summary: dict[str, Any]) -> dict[str, Any]:
    """Whether the answer is doubtful (``--strict`` exits 5 on it), and why."""
    reasons: list[str] = []
    status = (summary.get("best") or {}).get("confirm_status")
    if summary.get("best") and status != "confirmed":
        reasons.append(f"the winner's re-measurements are {status}")
    kinds = sorted({str(w.get("kind")) for w in summary.get("warnings") or []})
    if kinds:
        load = [k for k in kinds if k != "composition_noisy"]
        n_load = sum(1 for w in summary["warnings"] if str(w.get("kind")) != "composition_noisy")
        if load:
            reasons.append(f"{n_load} load warning(s) ({', '.join(load)})")
        if "composition_noisy" in kinds:
            reasons.append(f"{len(summary['warnings']) - n_load} probe(s) whose composed figure was too noisy")
    verified = summary.get("verify_loss") or {}
    if verified.get("exceeds") and (verified.get("expected_identical") or "not verified" in str(verified.get("verdict"))):
        # the losses part where the math is the same (or the check could not run): not a difference the levers
        # explain (an expected one, bf16 against fp32 or packed against padded batches, is said, not doubted)
        reasons.append(f"--verify-loss: {verified.get('verdict')}")
    return {"doubtful": bool(reasons), "reasons": reasons}


def _baseline_summary(outcome: SearchOutcome, cand: Candidate) -> tuple[ProbeResult | None, dict[str, Any]]:
    """The baseline's figures: its confirmed median when it made the top-k, else its one probe."""
    key = candidate_id(cand)
    info: dict[str, Any] = {"label": candidate_label(cand), "candidate": dataclasses.asdict(cand),
                            "status": "not measured"}
    rec = next((r for r in outcome.records if r.key == key and r.phase == "search" and r.result is not None), None)
    if rec is None:
        return None, BaselineEntry(**info).model_dump(mode="json", exclude_unset=True)
    result = ProbeResult.from_dict(rec.result or {})
    info.update(status=rec.status, reason=rec.reason, tokens_per_s=rec.tokens_per_s,
                peak_mem_bytes=rec.peak_mem_bytes, confirmed=False)
    entry = next((e for e in outcome.ranking if e["key"] == key), None)
    if entry is not None and entry["status"] in ("confirmed", "noisy"):
        info.update(tokens_per_s=entry["median_tokens_per_s"], measurements=entry["measurements"],
                    range=entry["range"], confirm_status=entry["status"], confirmed=entry["status"] == "confirmed",
                    peak_mem_bytes=entry["peak_mem_bytes"])  # the highest, search and re-measurements, as the best's
    return result, BaselineEntry(**info).model_dump(mode="json", exclude_unset=True)


def _emit(best: ProbeResult, run_dir: Any, device: str) -> list[Path]:
    try:
        from autotune.emit import emit_all
    except ImportError:  # pragma: no cover - the emitters are part of the package
        return []
    try:
        return list(emit_all(best, run_dir.best_dir, fields=_training_args_fields(), device=device))
    except OSError as exc:  # the answer is its files: no exit 0 without them (summary.json unwritten: resumable)
        from autotune.errors import WriteError
        from autotune.store.run_dir import RESUME_HINT

        raise WriteError(f"could not write best/: {exc}; {RESUME_HINT.format(path=run_dir.path)}") from exc


def _write_reports(run_dir: Any, summary: dict[str, Any], progress: ProgressFn | None) -> list[Path]:
    """report.md and report.html from ``summary`` and the run directory's journal (as `autotune report`
    rebuilds them from summary.json)."""
    from autotune.report.build import write_reports

    try:
        return write_reports(run_dir.path, summary=summary)
    except Exception as exc:  # the report must never cost the user the answer
        if progress is not None:
            progress("note", {"text": f"could not write the report: {exc!r}; `autotune report` retries"})
        return []
