"""Stages 4-5 of a run: claim the run folder (locked; a resumed run's journal restored), then the search
over the executor (Optuna ask/tell, each probe a fresh process), its confirmation of the top-k, and the
loss check of ``--verify-loss``. A refusal before any probe landed leaves no run folder behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError, SpecError
from autotune.executors.base import Executor
from autotune.run._plan import SearchPlan, _prune_setting
from autotune.run._request import ProgressFn, Request
from autotune.search import TrialRecord, candidate_id, candidate_label
from autotune.spec.budget import format_bytes
from autotune.spec.probe_request import (
    Candidate,
    ProbeSettings,
    Workload,
)
from autotune.spec.summary import SCHEMA_VERSION

if TYPE_CHECKING:  # the searcher imports optuna: loaded when a search actually runs
    from autotune.search import Pruner, SearchOutcome

__all__ = ["RunStart", "Searched", "EstimatePruner", "claim_run_dir", "start_run", "run_search"]

@dataclass
class RunStart:
    """Stage 4's output: the restored history (a resumed run) and the summary's request part."""

    history: list[TrialRecord]
    base_summary: dict[str, Any]
    storage_url: str
    resumed: bool


def start_run(r: Request, plan: SearchPlan, run_dir: Any, resumed: bool) -> RunStart:
    """Stage 4 (in the claimed run folder): restore a resumed run's journal, write run.json, announce."""
    a, progress = r.args, r.args.progress
    history, unreadable = run_dir.journal.load_checked() if resumed else ([], [])
    if unreadable and progress is not None:
        shown = ", ".join(map(str, unreadable[:5])) + (", ..." if len(unreadable) > 5 else "")
        progress("note", {"text": f"journal: skipped {len(unreadable)} unreadable line(s) ({shown}); "
                                  f"{len(history)} record(s) restored, the skipped probes run again"})
    storage_url = a.storage or run_dir.storage_url()
    space = plan.space
    base_summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "status": "running",
        "run_id": run_dir.run_id,
        "run_dir": str(run_dir.path),
        "cache_key": plan.key,
        "from_cache": False,
        "resumed": resumed,
        "model": a.model,
        "model_name": r.resolved.name,
        "model_source": str(r.resolved.source),
        "mode": a.mode,
        "trainer": a.trainer,
        "seq_len": a.seq_len,
        "lengths": a.lengths,
        "dataset": a.dataset,
        "split": a.split,
        "effective_batch": a.effective_batch,
        "device": plan.device,
        "gpu_budget": r.budget.text,
        "budget_bytes": plan.settings.budget_bytes,
        "usable_bytes": plan.usable,
        "headroom": plan.settings.headroom,
        # the CUDA allocator's setting the probes ran with and the emitted scripts set (None: none set)
        "cuda_alloc_conf": plan.settings.cuda_alloc_conf,
        "seed": a.seed,
        "space": {"name": space.name, "source": space.source, "dimensions": space.to_dict()},
        "dropped_choices": [d.to_dict() for d in plan.dropped],
        "search": {"max_trials": a.max_trials, "time_budget_s": r.time_budget_s, "top_k": a.top_k, "steps": a.steps,
                   "confirm_steps": plan.confirm_steps, "confirm": plan.confirm_policy.to_dict(), "storage": storage_url,
                   "study_name": run_dir.run_id, "strategy": a.strategy, "stop_when_converged": a.stop_when_converged,
                   "prune": _prune_setting(r, plan), "load_monitor": plan.load_monitor,
                   "max_world": plan.max_world,
                   "deadlines": {**(plan.deadlines.rule.describe() if plan.deadlines is not None else {}),
                                 "forecast": plan.forecast}},
        "environment": {"hardware": plan.hardware, "software": plan.software},
    }
    if not resumed:
        run_dir.write_json("run.json", {"cache_key": plan.key, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                        "request": {k: base_summary[k] for k in (
                                            "model", "mode", "trainer", "seq_len", "lengths", "dataset", "split",
                                            "effective_batch", "device",
                                            "gpu_budget", "seed", "space", "search")},
                                        **({"model_revision": r.resolved.revision, "model_path": r.resolved.path}
                                           if r.resolved.revision else {})})  # fmt: skip
    if progress is not None:
        progress("run_dir", {"run_dir": str(run_dir.path), "resumed": resumed, "restored": len(history)})
        for text in _notes(plan, history):
            progress("note", {"text": text})
    return RunStart(history=history, base_summary=base_summary, storage_url=storage_url, resumed=resumed)


def _notes(plan: SearchPlan, history: list[Any]) -> list[str]:
    """The plan's notes; for a resumed run, the time to answer counts only the search probes still to run."""
    from autotune.run._forecast import forecast_line

    done = sum(1 for rec in history if getattr(rec, "phase", None) == "search" and getattr(rec, "probed", False))
    whole = forecast_line(plan.forecast) if plan.forecast else None
    if not done or whole is None:
        return list(plan.notes)
    return [forecast_line(plan.forecast, done=done) if text == whole else text for text in plan.notes]


def claim_run_dir(out: Path, key: str, model_name: str, resume: bool, fresh: bool = False,
                  progress: ProgressFn | None = None) -> tuple[Any, Any, bool]:
    """The run folder this process works in, locked: (run_dir, lock, resumed).

    With ``resume`` the newest unfinished run of the same request is taken over, unless a live
    process still holds it: then ``RunInProgressError`` (exit 4), and nothing is written. Without
    ``resume`` or ``fresh``, an interrupted run of the same request that no live process holds is
    continued too (a repeated command picks up where Ctrl-C left it, with a note); one still running
    elsewhere is left alone and a new run starts.
    """
    from autotune.errors import RunInProgressError
    from autotune.store import RunDir, find_resumable, make_run_id
    from autotune.store.run_dir import RunLock

    if resume:
        found = find_resumable(out, key)
        if found is None:
            raise SpecError(f"--resume: no unfinished run of this request under {out}; drop --resume to start "
                            "a new search (or give the --out and flags of the run to continue)")
        lock = found.try_lock()
        if lock is None:
            raise RunInProgressError(
                f"run {found.path} is still running in another process (pid {RunLock.holder(found.path)}): "
                "wait for it (the same request is then answered from its result), or drop --resume to "
                "start a separate search")
        return found, lock, True
    found = None if fresh else find_resumable(out, key)
    lock = found.try_lock() if found is not None else None
    if found is not None and lock is not None:
        if progress is not None:
            progress("note", {"text": f"continuing the interrupted run {found.path} of this request (its finished "
                                      "probes are kept; --fresh starts over)"})
        return found, lock, True
    run_dir = RunDir.create(out, make_run_id(model_name, key))
    lock = run_dir.try_lock()  # a new folder: nobody else can hold it
    assert lock is not None
    return run_dir, lock, False


@dataclass
class Searched:
    """Stage 5's output: the search and its confirmation, the loss check, the pruner's predictions."""

    outcome: SearchOutcome
    verified: dict[str, Any] | None
    predictions: dict[str, tuple[int, str]] | None  # candidate id -> (predicted peak, label), when pruned


def run_search(r: Request, plan: SearchPlan, run_dir: Any, started: RunStart) -> Searched:
    """Stage 5: probe (Optuna ask/tell over the executor), confirm the top-k, then ``--verify-loss``.

    A refusal before any probe landed leaves no run folder behind; a storage write failure becomes
    one WriteError line with the resume hint.
    """
    a, progress = r.args, r.args.progress
    own_executor = a.executor is None
    executor = a.executor
    monitor = None
    if plan.load_monitor:
        from autotune.executors.load import LoadMonitor

        monitor = LoadMonitor(device=plan.device).start()
    try:
        import optuna
    except ImportError:  # e.g. a GPU box with only the training stack installed
        from autotune.errors import MissingDependencyError

        raise MissingDependencyError("autotune run needs optuna: pip install 'optuna>=5.0'") from None

    prev_verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    journal = run_dir.journal
    try:
        if executor is None:
            executor = _default_executor(device=plan.device, gpus=r.gpu_list, ray_address=a.ray_address,
                                         gpus_per_probe=min(plan.space.gpus_per_trial), progress=progress,
                                         pool=a.pool)
        searcher, pruner = _searcher(r, plan, run_dir, started, executor, monitor)
        outcome = searcher.run()
        verified = _verify_loss(a.verify_loss, a.verify_loss_tolerance, outcome, plan.baseline, executor,
                                plan.workload, plan.settings, a.effective_batch, progress)  # fmt: skip
    except AutotuneError:
        # refused before any probe landed (an unreachable cluster, ...): leave nothing half-written
        if not started.resumed and not journal.path.exists():
            import shutil

            shutil.rmtree(run_dir.path, ignore_errors=True)
        raise
    except Exception as exc:
        from autotune.errors import WriteError
        from autotune.store.run_dir import RESUME_HINT
        from autotune.store.storage import storage_write_failure

        why = storage_write_failure(exc)
        if why is None:
            raise
        raise WriteError(f"{why}; {RESUME_HINT.format(path=run_dir.path)}") from exc
    finally:
        optuna.logging.set_verbosity(prev_verbosity)
        if monitor is not None:
            monitor.close()
        if own_executor and executor is not None:
            executor.close()
    predictions = pruner.predictions if isinstance(pruner, EstimatePruner) else None
    return Searched(outcome=outcome, verified=verified, predictions=predictions)


def _searcher(r: Request, plan: SearchPlan, run_dir: Any, started: RunStart, executor: Executor,
              monitor: Any) -> tuple[Any, Pruner | None]:
    """The Searcher for this run (and the pruner it was given): world size, pruning, the study storage."""
    from autotune.search import Searcher, SearchHooks, SearchPolicy, SearchRecords
    from autotune.store.storage import open_run_storage, open_storage

    a, dev, progress = r.args, plan.device, r.args.progress
    pruner = a.pruner
    if pruner is None and plan.prune:
        pruner = _estimate_pruner(r.resolved.config, plan.workload, dev, plan.budget_bytes)
    if a.storage is None:  # the run's own study: a damaged one is rebuilt from the journal
        study_storage, recovered = open_run_storage(run_dir.study_db)
        if recovered and progress is not None:
            progress("note", {"text": f"recovered: {recovered} from {len(started.history)} journal record(s)"})
    else:
        study_storage = open_storage(started.storage_url)
    searcher = Searcher(
        space=plan.space, workload=plan.workload, settings=plan.settings, effective_batch=a.effective_batch,
        executor=executor, device=dev, max_world=_run_max_world(plan, executor, cluster=a.ray_address is not None),
        baseline=plan.baseline,
        policy=SearchPolicy(max_trials=a.max_trials, time_budget_s=r.time_budget_s, seed=a.seed, top_k=a.top_k,
                            confirm_steps=plan.confirm_steps, confirm=plan.confirm_policy, strategy=a.strategy,
                            stop_when_converged=a.stop_when_converged),
        records=SearchRecords(storage=study_storage, study_name=run_dir.run_id, history=started.history,
                              sink=run_dir.journal),
        hooks=SearchHooks(progress=progress, pruner=pruner, deadlines=plan.deadlines,
                          load_check=monitor.check if monitor is not None else None,
                          prior=_model_prior(r, plan) if a.strategy == "model" else None),
    )  # fmt: skip
    return searcher, pruner


def _model_prior(r: Request, plan: SearchPlan) -> Any:
    """The estimator's prior for the model strategy (``autotune.estimate.CostPrior``); None when the estimator
    cannot read the model's architecture (the model then starts flat)."""
    from autotune.errors import AutotuneError, SpecError
    from autotune.estimate import CostPrior
    from autotune.run._preflight import dataset_lengths

    try:  # a dataset's own lengths (read from the tokenize cache the probes share): the prior counts their padding
        sample = dataset_lengths(plan.workload)
    except (AutotuneError, OSError, ValueError):  # a file the tokenizer or reader cannot take
        sample = []  # the probes will say what is wrong with the dataset; the prior then assumes no padding
    try:
        return CostPrior(r.resolved.config, plan.workload, device=plan.device,
                         usable_bytes=plan.settings.usable_bytes() or plan.budget_bytes, gpu_infos=plan.gpu_infos,
                         lengths_sample=sample)
    except SpecError:
        return None


def _run_max_world(plan: SearchPlan, executor: Executor, *, cluster: bool) -> int | None:
    """The plan's bound on one probe's GPUs, narrowed by what the executor reports (the same rule:
    ``spec.max_world``); without a report it is ``plan.max_world``."""
    from autotune.spec.run_defaults import max_world

    # a distributed probe's ranks run on one node: on a cluster, the largest node bounds the world
    ex_gpus = getattr(executor, "max_gpus_per_node", None) or getattr(executor, "total_gpus", None)
    if plan.device != "cuda" or not ex_gpus:
        return plan.max_world
    return max_world(plan.device, len(plan.gpu_infos), cluster=cluster, executor_gpus=int(ex_gpus))


class EstimatePruner:
    """The estimator's rule: skip a candidate predicted above budget x PRUNE_FACTOR.

    ``predictions`` (candidate id -> (predicted peak bytes, label)) holds every prediction made, for
    the nothing-fits message when the search probed nothing.
    """

    def __init__(self, config: dict[str, Any], workload: Workload, device: str, budget_bytes: int) -> None:
        self.config, self.workload, self.device, self.budget_bytes = config, workload, device, budget_bytes
        self.predictions: dict[str, tuple[int, str]] = {}

    def __call__(self, candidate: Candidate) -> str | None:
        from autotune.estimate import PRUNE_FACTOR, predict_peak_bytes, should_prune

        try:
            predicted = predict_peak_bytes(self.workload, candidate, self.config, self.device)
        except Exception:  # an architecture the model does not know: let the probe decide
            return None
        self.predictions[candidate_id(candidate)] = (int(predicted), candidate_label(candidate))
        if should_prune(predicted, self.budget_bytes):
            return (f"predicted peak {format_bytes(predicted)} is above the budget "
                    f"{format_bytes(self.budget_bytes)} x {PRUNE_FACTOR:g} (not probed)")
        return None


def _estimate_pruner(config: dict[str, Any], workload: Workload, device: str, budget_bytes: int) -> EstimatePruner:
    return EstimatePruner(config, workload, device, budget_bytes)


def _default_executor(
    *, device: str, gpus: list[int] | None, ray_address: str | None, gpus_per_probe: int,
    progress: ProgressFn | None, pool: str = "auto",
) -> Executor:
    """The run's executor: ``pool`` (``spec.run_defaults.pool_for``) local or Ray.

    Local probes run one at a time; single-process CPU probes are forked from a warm server
    (``autotune.executors.warm``), which halves a tiny CPU probe."""
    from autotune.spec.run_defaults import pool_for

    if pool_for(pool, device=device, ray_address=ray_address) == "local":
        from autotune.executors.local import LocalExecutor

        return LocalExecutor(slots=1, warm=True)
    try:
        import ray  # noqa: F401, TID251 - only to see whether the Ray pool is available
    except ImportError:
        if ray_address is not None or pool == "ray":
            from autotune.errors import MissingDependencyError

            raise MissingDependencyError(f"{'--ray-address' if ray_address else '--pool ray'} needs ray: "
                                         "pip install 'ray>=2.52'") from None
        from autotune.executors.local import LocalExecutor

        # one at a time: local subprocesses are not pinned to GPUs, and two probes sharing a GPU
        # would spoil each other's memory figures
        if progress is not None:
            progress("note", {"text": "ray is not installed: probes run one at a time as local subprocesses"})
        return LocalExecutor(slots=1, warm=True)
    from autotune.executors.ray_pool import RayExecutor
    from autotune.run._preflight import RAY_CONNECT_TIMEOUT_S

    return RayExecutor(ray_address, device=device, gpus=gpus, gpus_per_probe=gpus_per_probe,
                       connect_timeout_s=RAY_CONNECT_TIMEOUT_S)


def _verify_loss(steps: int, tolerance: float | None, outcome: SearchOutcome, baseline_cand: Candidate | None,
                 executor: Executor, workload: Workload, settings: ProbeSettings, effective_batch: int,
                 progress: ProgressFn | None) -> dict[str, Any] | None:
    """The quality guard (``--verify-loss K``): chosen vs HF-default reference, K steps each."""
    if not steps or outcome.best_record is None:
        return None
    from autotune.run._verify import DEFAULT_TOLERANCE, reference_candidate, run_verify

    chosen = outcome.best_record.candidate_obj()
    assert chosen is not None
    base = next((r for r in outcome.records if baseline_cand is not None and r.phase == "search"
                 and r.key == candidate_id(baseline_cand) and r.result is not None), None)
    reference = reference_candidate(effective_batch, world_size=chosen.world_size,
                                    needs_checkpointing=base is not None and base.status in ("oom", "over_budget"))
    if progress is not None:
        progress("note", {"text": f"verify-loss: {candidate_label(chosen)} vs {candidate_label(reference)}, "
                                  f"{steps} steps each"})
    result = run_verify(executor, chosen=chosen, reference=reference, workload=workload, settings=settings,
                        steps=steps, tolerance=DEFAULT_TOLERANCE if tolerance is None else tolerance)
    if progress is not None:
        progress("note", {"text": f"verify-loss {result['verdict']}"})
    return result
