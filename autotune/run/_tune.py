"""``autotune.tune``: search for the fastest configuration that fits, and hand it back ready to use.

    result = autotune.tune("llama-3.1-8b", gpu_budget="24GB", mode="lora", seq_len=4096,
                           effective_batch=32)
    args = result.training_arguments("out/")        # a transformers.TrainingArguments

The data path: validate the request once -> resolve the model -> cache key (a repeat request is
answered from the stored summary) -> run directory -> Searcher (Optuna ask/tell) over an Executor
(the Ray pool by default; each probe a fresh process) -> confirm the top few -> write
``summary.json``, ``trials.csv``, ``best/``, ``report.md``. Nothing fits -> NothingFitsError (exit 3)
whose message gives the smallest footprint measured and the lever that would be needed.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError, NothingFitsError, SpecError
from autotune.executors.base import Executor
from autotune.search import FAILED, TrialRecord, candidate_id, candidate_label
from autotune.spec.budget import Budget, format_bytes, parse_budget, resolve_budget
from autotune.spec.parse import parse_duration, parse_gpus
from autotune.spec.probe_request import (
    DEVICE_CHOICES,
    MODE_CHOICES,
    Candidate,
    ProbeSettings,
    Workload,
    parse_lora_targets,
)
from autotune.spec.result import ProbeResult
from autotune.spec.space import SearchSpace, load_space
from autotune.spec.summary import SCHEMA_VERSION, BaselineEntry, BestEntry, RankingEntry

if TYPE_CHECKING:  # the searcher imports optuna: loaded when a search actually runs
    from autotune.search import Pruner, SearchOutcome

__all__ = [
    "tune", "TuneResult", "TuneArgs", "Request", "SearchPlan", "RunStart", "Searched", "EstimatePruner",
    "read_request", "plan_search", "answer_from_cache", "predict_run", "start_run", "run_search", "summarize", "write_answer",
    "nothing_fits_message", "API_ONLY",
]

ProgressFn = Callable[[str, dict[str, Any]], None]

# tune()'s arguments that `autotune run` has no option for (Python objects, or settings only the API offers)
API_ONLY = ("executor", "progress", "pruner", "prune", "baseline", "load_monitor", "verify_loss_tolerance",
            "warmup_steps")

# sequences per optimizer step: far above any real fine-tuning batch (1,024 x 4k tokens = 4M tokens),
# and below what would have a probe build and accumulate millions of micro-steps
MAX_EFFECTIVE_BATCH = 65_536

@dataclass
class TuneResult:
    """What ``tune`` hands back. ``best`` is the chosen (confirmed) probe; ``summary`` is summary.json."""

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
    from transformers import TrainingArguments  # noqa: TID251 - needs the installed field names

    return {f.name for f in dataclasses.fields(TrainingArguments)}


# ------------------------------------------------------------------------------------ helpers


def _validate(
    *, seq_len: Any, effective_batch: Any, mode: Any, max_trials: Any, device: Any, resume: bool, fresh: bool,
    top_k: Any, gpus_per_trial: Any,
) -> list[str]:
    p: list[str] = []
    for name, value, minimum in (("seq_len", seq_len, 8), ("effective batch", effective_batch, 1),
                                 ("max trials", max_trials, 1), ("top_k", top_k, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            p.append(f"{name} must be an integer >= {minimum}; got {value!r}")
    if isinstance(effective_batch, int) and not isinstance(effective_batch, bool) \
            and effective_batch > MAX_EFFECTIVE_BATCH:
        p.append(f"effective batch {effective_batch:,} is more than the {MAX_EFFECTIVE_BATCH:,} sequences per "
                 "optimizer step autotune searches (each probe would accumulate that many per step); "
                 "give a smaller --effective-batch")
    if mode not in MODE_CHOICES:
        p.append(f"mode must be one of {', '.join(MODE_CHOICES)}; got {mode!r}")
    if device not in DEVICE_CHOICES:
        p.append(f"device must be one of {', '.join(DEVICE_CHOICES)}; got {device!r}")
    if resume and fresh:
        p.append("--resume and --fresh contradict each other: --resume continues a run, --fresh ignores stored ones")
    if gpus_per_trial is not None and (isinstance(gpus_per_trial, bool) or not isinstance(gpus_per_trial, int)
                                       or gpus_per_trial < 1):
        p.append(f"gpus per trial must be an integer >= 1; got {gpus_per_trial!r}")
    return p


def _lora_problems(a: TuneArgs) -> list[str]:
    p = []
    if isinstance(a.lora_r, bool) or not isinstance(a.lora_r, int) or a.lora_r < 1:
        p.append(f"LoRA rank must be an integer >= 1; got {a.lora_r!r}")
    if a.lora_alpha is not None and (isinstance(a.lora_alpha, bool) or not isinstance(a.lora_alpha, (int, float))
                                     or not a.lora_alpha > 0):
        p.append(f"LoRA alpha must be a number > 0; got {a.lora_alpha!r}")
    if not isinstance(a.lora_targets, (str, tuple, list)) or not _lora_targets(a.lora_targets):
        p.append(f"LoRA targets must be attn, all-linear or module names separated by commas; got {a.lora_targets!r}")
    return p


def _detect_device(device: str, gpus: list[int] | None, ray_address: str | None) -> tuple[str, list[dict[str, Any]]]:
    """(``cpu``|``cuda``, the NVML records of the GPUs in use). Reads NVML only; no torch."""
    from autotune.env import nvml_device_info

    if device == "cpu":
        if gpus:
            raise SpecError("--gpus was given with --device cpu; drop one of them")
        return "cpu", []
    infos = nvml_device_info()
    if gpus is not None and infos:
        by_index = {int(g["index"]): g for g in infos}
        missing = [g for g in gpus if g not in by_index]
        if missing:
            raise SpecError(f"--gpus {','.join(map(str, gpus))}: no GPU with index {missing[0]}; "
                            f"visible: {','.join(map(str, sorted(by_index))) or 'none'}")
        infos = [by_index[g] for g in gpus]
    if device == "cuda":
        if not infos and ray_address is None:
            raise SpecError("device cuda requested but no NVIDIA GPU is visible (NVML found none); use --device cpu")
        return "cuda", infos
    if infos or (ray_address is not None and gpus is not None):
        return "cuda", infos
    if gpus is not None and ray_address is None:
        raise SpecError(f"--gpus {','.join(map(str, gpus))} given but no NVIDIA GPU is visible here")
    return "cpu", []


def _ram_bytes() -> int:
    """The system memory: what a percentage budget is a share of on cpu (``spec.budget.PERCENT_RULE``)."""
    import psutil

    return int(psutil.virtual_memory().total)


def _default_executor(
    *, device: str, gpus: list[int] | None, ray_address: str | None, gpus_per_probe: int,
    progress: ProgressFn | None,
) -> Executor:
    try:
        import ray  # noqa: F401, TID251 - only to see whether the Ray pool is available
    except ImportError:
        if ray_address is not None:
            from autotune.errors import MissingDependencyError

            raise MissingDependencyError("--ray-address needs ray: pip install 'ray>=2.52'") from None
        from autotune.executors.local import LocalExecutor

        # one at a time: local subprocesses are not pinned to GPUs, and two probes sharing a GPU
        # would spoil each other's memory figures
        if progress is not None:
            progress("note", {"text": "ray is not installed: probes run one at a time as local subprocesses"})
        return LocalExecutor(slots=1)
    from autotune.executors.ray_pool import RayExecutor
    from autotune.run._preflight import RAY_CONNECT_TIMEOUT_S

    return RayExecutor(ray_address, device=device, gpus=gpus, gpus_per_probe=gpus_per_probe,
                       connect_timeout_s=RAY_CONNECT_TIMEOUT_S)


def _smallest_footprint(records: list[TrialRecord]) -> TrialRecord | None:
    measured = [r for r in records if r.probed and r.peak_mem_bytes]
    return min(measured, key=lambda r: r.peak_mem_bytes or 0) if measured else None


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
    if best is not None and rec is not None:
        summary["best"] = BestEntry.of(best, origin=rec.origin, budget_bytes=budget_bytes,
                                       usable=usable).model_dump(mode="json")
    return summary


# ------------------------------------------------------------------------------------ tune


def tune(
    model: str,
    *,
    gpu_budget: str | int | Budget,
    seq_len: int = 2048,
    effective_batch: int = 64,
    mode: str = "full",
    space: str | Path | SearchSpace | None = None,
    dataset: str | None = None,
    split: str | None = None,
    tokenizer: str | None = None,
    lengths: str = "fixed",
    max_trials: int = 40,
    time_budget: str | float | None = None,
    gpus: str | list[int] | None = None,
    ray_address: str | None = None,
    device: str = "auto",
    storage: str | None = None,
    out: str | Path = "results",
    seed: int = 42,
    resume: bool = False,
    fresh: bool = False,
    executor: Executor | None = None,
    progress: ProgressFn | None = None,
    gpus_per_trial: int | None = None,
    top_k: int = 3,
    steps: int = 5,
    warmup_steps: int = 2,
    probe_timeout_s: float | str = "predicted",
    baseline: bool = True,
    trust_remote_code: bool = False,
    pruner: Pruner | None = None,
    prune: bool | None = None,
    verify_loss: int = 0,
    verify_loss_tolerance: float | None = None,
    confirm_rounds: tuple[int, int] | None = None,
    confirm_tolerance: float | None = None,
    load_monitor: bool | None = None,
    trainer: str = "hf",
    lora_r: int = 16,
    lora_alpha: int | None = None,
    lora_targets: str | tuple[str, ...] = "attn",
    strategy: str = "walk",
    hub: Any = None,
    config_name: str | None = None,
    sample_rows: int | None = None,
) -> TuneResult:
    """Find the fastest configuration of ``model`` that fits ``gpu_budget``, by measuring.

    Raises SpecError (exit 2) for a bad request, NothingFitsError (exit 3) when no configuration
    fits. ``executor`` replaces the default Ray pool (and is not closed here). ``prune`` (default: on
    for GPUs, off on CPU where the memory model is rougher) skips candidates the estimator predicts
    far above the budget (recorded as inferred); ``pruner`` replaces that rule. ``progress(event,
    data)`` receives ``start``, ``submit``, ``record``, ``tick``, ``confirm``, ``done``, ``cached``
    and ``note`` events. ``verify_loss`` (K > 0) runs the quality guard after the search: the chosen
    configuration and the HF-default reference for K steps each, same seed and data order, loss
    trajectories compared (``autotune.run._verify``; ``verify_loss.json``, ``summary["verify_loss"]``).
    ``space`` None is the device's own: ``cpu`` on a CPU (also when ``device="auto"`` finds no GPU),
    ``default`` on a GPU. Choices the device or installation cannot run are dropped before any
    probe (``summary["dropped_choices"]``, one ``note``).
    ``confirm_rounds`` (min, max) and ``confirm_tolerance`` set the confirmation policy (default:
    ``ConfirmPolicy.for_device``). ``load_monitor`` (default: on when autotune runs its own probes on
    this machine) watches for other load and fills ``summary["warnings"]``.
    ``trainer`` ``"trl"`` measures every probe through TRL's SFTTrainer with the candidate's
    ``sft_config.json`` (``autotune.probe.trl_probe``; it needs a ``tokenizer``).
    ``hub`` (an ``autotune.models.HubAccess``; None: never the network) lets a model id missing from
    the cache be fetched (config.json, tokenizer files) and a Hub ``dataset`` missing from the datasets
    cache be read as a streamed sample of ``sample_rows`` rows (default 1000) of ``split``
    (``config_name``). ``lora_r``, ``lora_alpha`` (default 2 x rank) and ``lora_targets`` (``attn``,
    ``all-linear``, or module names) are the adapters a lora/qlora run measures and emits.

    The stages, in order: :func:`read_request` (validate, parse, resolve the model) ->
    :func:`plan_search` (device, space, budget, preflight, cache key) -> :func:`answer_from_cache`
    -> :func:`predict_run` (each probe's deadline, the time to answer, ``--time-budget``) -> :func:`start_run` (claim the run folder) -> :func:`run_search` (probe, confirm the top-k,
    verify the loss) -> :func:`summarize` -> :func:`write_answer`. Nothing is written before
    ``start_run``.
    """
    # (long for its signature and this docstring: the body is the stages below, one line each)
    given = dict(locals())  # every argument above, by name
    t0 = time.monotonic()
    args = TuneArgs(**{f.name: given[f.name] for f in dataclasses.fields(TuneArgs)})
    request = read_request(args)
    plan = plan_search(request)
    cached = answer_from_cache(request, plan, started=t0)
    if cached is not None:
        return cached
    plan = predict_run(request, plan)
    run_dir, lock, resumed = _claim_run_dir(Path(out), plan.key, request.resolved.name, resume)
    with lock:  # held until the run ends; the kernel drops it if this process is killed
        started = start_run(request, plan, run_dir, resumed)
        searched = run_search(request, plan, run_dir, started)
        summary = summarize(request, plan, searched, started.base_summary)
        return write_answer(run_dir, summary, searched, device=plan.device, progress=progress)


@dataclass(frozen=True)
class TuneArgs:
    """``tune``'s arguments as given (see :func:`tune`), with its defaults (a test holds the two and
    `autotune run`'s options to the same names)."""

    model: str
    gpu_budget: str | int | Budget
    seq_len: int = 2048
    effective_batch: int = 64
    mode: str = "full"
    space: str | Path | SearchSpace | None = None
    dataset: str | None = None
    split: str | None = None
    tokenizer: str | None = None
    lengths: str = "fixed"
    max_trials: int = 40
    time_budget: str | float | None = None
    gpus: str | list[int] | None = None
    ray_address: str | None = None
    device: str = "auto"
    storage: str | None = None
    out: str | Path = "results"
    seed: int = 42
    resume: bool = False
    fresh: bool = False
    executor: Executor | None = None
    progress: ProgressFn | None = None
    gpus_per_trial: int | None = None
    top_k: int = 3
    steps: int = 5
    warmup_steps: int = 2
    probe_timeout_s: float | str | None = "predicted"
    baseline: bool = True
    trust_remote_code: bool = False
    pruner: Pruner | None = None
    prune: bool | None = None
    verify_loss: int = 0
    verify_loss_tolerance: float | None = None
    confirm_rounds: tuple[int, int] | None = None
    confirm_tolerance: float | None = None
    load_monitor: bool | None = None
    trainer: str = "hf"
    lora_r: int = 16
    lora_alpha: int | None = None  # None: 2 x lora_r
    lora_targets: str | tuple[str, ...] = "attn"  # attn, all-linear, a comma-separated list, or the names
    strategy: str = "walk"
    hub: Any = None  # autotune.models.HubAccess: online; None: offline
    config_name: str | None = None
    sample_rows: int | None = None


@dataclass(frozen=True)
class Request:
    """Stage 1's output: the arguments, checked and parsed, and the model resolved."""

    args: TuneArgs
    budget: Budget
    time_budget_s: float | None
    gpu_list: list[int] | None
    space: SearchSpace | None  # None: the device's own (chosen in plan_search)
    resolved: Any  # autotune.models.ResolvedModel
    probe_timeout_s: float | None = None  # --probe-timeout's fixed seconds (None: predicted)


def read_request(a: TuneArgs) -> Request:
    """Stage 1: every problem with the arguments at once (SpecError), then the model, offline."""
    parsed = _parse_args(a)
    resolved = _resolve_inputs(a)
    return Request(args=a, budget=parsed["budget"], time_budget_s=parsed["time_budget_s"],
                   gpu_list=parsed["gpu_list"], space=parsed["space"], resolved=resolved,
                   probe_timeout_s=parsed["probe_timeout_s"])


def _parse_args(a: TuneArgs) -> dict[str, Any]:
    """Every option checked, each parsed once (the Request carries the values); SpecError listing every
    problem at once."""
    problems = _validate(seq_len=a.seq_len, effective_batch=a.effective_batch, mode=a.mode,
                         max_trials=a.max_trials, device=a.device, resume=a.resume, fresh=a.fresh, top_k=a.top_k,
                         gpus_per_trial=a.gpus_per_trial)  # fmt: skip
    problems += _lora_problems(a)
    if isinstance(a.verify_loss, bool) or not isinstance(a.verify_loss, int) or a.verify_loss < 0:
        problems.append(f"verify-loss steps must be an integer >= 0; got {a.verify_loss!r}")
    from autotune.search import STRATEGIES

    if a.strategy not in STRATEGIES:
        problems.append(f"unknown strategy {a.strategy!r}; choose one of {', '.join(STRATEGIES)}")
    from autotune.run._forecast import parse_probe_timeout
    from autotune.spec.lengths import parse_lengths
    from autotune.store.run_dir import check_out_dir
    from autotune.store.storage import check_storage_url

    parsed: dict[str, Any] = {}
    for name, fn in (("time_budget_s", lambda: parse_duration(a.time_budget)),
                     ("budget", lambda: parse_budget(a.gpu_budget)),
                     ("probe_timeout_s", lambda: parse_probe_timeout(a.probe_timeout_s)),
                     ("gpu_list", lambda: parse_gpus(a.gpus)), ("lengths", lambda: parse_lengths(a.lengths)),
                     ("out", lambda: check_out_dir(a.out)), ("storage", lambda: check_storage_url(a.storage))):
        try:
            parsed[name] = fn()
        except SpecError as exc:
            problems += exc.problems
    try:
        parsed["space"] = a.space if isinstance(a.space, SearchSpace) or a.space is None else load_space(a.space)
    except SpecError as exc:
        problems += exc.problems
    try:
        _confirm_policy(a.device, a.confirm_rounds, a.confirm_tolerance)
    except SpecError as exc:
        problems += exc.problems
    if problems:
        raise SpecError(problems)
    return parsed


def _resolve_inputs(a: TuneArgs) -> Any:
    """The model (offline unless ``hub``), checked, and the dataset found; the ``ResolvedModel``."""
    from autotune.models import check_seq_len, resolve_model
    from autotune.run._preflight import check_model_config

    resolved = resolve_model(a.model, trust_remote_code=a.trust_remote_code, hub=a.hub,
                             tokenizer=a.dataset is not None and a.tokenizer is None)
    check_model_config(resolved.config, resolved.config_path)
    check_seq_len(resolved, a.seq_len)
    if a.progress is not None:
        for text in resolved.notes:
            a.progress("note", {"text": text})
    if a.dataset is not None:
        from autotune.probe.hub_sample import prepare_hub_dataset

        note = prepare_hub_dataset(a.dataset, split=a.split, config_name=a.config_name, rows=a.sample_rows,
                                   hub=a.hub, seq_len=a.seq_len)
        if note and a.progress is not None:
            a.progress("note", {"text": note})
        from autotune.spec.dataset_ref import (
            check_dataset_files,
            find_hub_dataset,
            find_hub_sample,
            is_hub_dataset_id,
            missing_hub_dataset_message,
        )

        if is_hub_dataset_id(a.dataset) and find_hub_dataset(a.dataset) is None \
                and (a.hub is None or find_hub_sample(a.dataset, a.split) is None):
            raise SpecError(missing_hub_dataset_message(a.dataset))
        if not is_hub_dataset_id(a.dataset) and not Path(a.dataset).exists():
            raise SpecError(f"dataset {a.dataset!r} does not exist")
        # every file's size, by stat, before anything reads or hashes one (the cache key hashes the data)
        local = (find_hub_dataset(a.dataset) or find_hub_sample(a.dataset, a.split)) if is_hub_dataset_id(a.dataset) \
            else Path(a.dataset).expanduser()
        if local is not None:
            check_dataset_files(local)
    if a.split is not None and a.dataset is None:
        raise SpecError("--split names a split of --dataset; pass --dataset too, or drop --split")
    return resolved


@dataclass(frozen=True)
class SearchPlan:
    """Stage 2's output, the run's resolved plan: what will be searched, where, under which budget, with
    every default resolved once (the cache key, the pre-flight, the forecast, the searcher and
    summary.json read it from here, so the key describes the run that runs)."""

    device: str  # cpu | cuda
    gpu_infos: list[dict[str, Any]]  # the GPUs in use (--gpus, default all visible)
    space: SearchSpace
    dropped: list[Any]
    notes: list[str]
    confirm_policy: Any  # search.ConfirmPolicy
    settings: ProbeSettings  # budget_bytes (spec.budget.resolve_budget) and the run-level timeout_s
    workload: Workload
    baseline: Candidate | None  # the HF default measured beside the search (None: --no-baseline)
    capabilities: dict[str, Any]
    max_world: int | None  # most GPUs one probe may use before the executor reports (spec.max_world)
    confirm_steps: int  # timed steps of a confirmation probe (spec.confirm_steps)
    prune: bool  # the memory model's pruner runs (spec.prune_default; a custom pruner replaces it)
    load_monitor: bool  # other load is watched (spec.load_monitor_default)
    rule: Any  # search.DeadlineRule: --probe-timeout's
    hardware: dict[str, Any] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)
    key: str = ""  # the cache key, from this plan (_cache_key)
    deadlines: Any = None  # search.Deadlines: each probe's deadline from its prediction (predict_run)
    forecast: dict[str, Any] = field(default_factory=dict)  # the predicted time to answer (_forecast.forecast)

    @property
    def budget_bytes(self) -> int:
        return int(self.settings.budget_bytes or 0)

    @property
    def usable(self) -> int | None:
        return self.settings.usable_bytes()


def plan_search(r: Request) -> SearchPlan:
    """Stage 2: the device and its space, the probe settings and workload, every default resolved, the
    preflight, then the cache key from the plan."""
    from autotune.spec.run_defaults import confirm_steps, load_monitor_default, max_world, prune_default

    a = r.args
    dev, gpu_infos = _detect_device(a.device, r.gpu_list, a.ray_address)
    space_obj, dropped, caps, notes = _space_for_device(r.space, dev, gpu_infos, a.device, a.ray_address, a.mode)
    if a.gpus_per_trial is not None:
        space_obj = dataclasses.replace(space_obj, gpus_per_trial=(a.gpus_per_trial,))
    settings, rule = _probe_settings(r, dev, gpu_infos)
    workload = _workload(r)
    problems = workload.problems() + settings.problems()
    if not problems:
        from autotune.probe.trl_probe import trainer_problems

        problems = trainer_problems(workload)
    if problems:
        raise SpecError(problems)
    plan = SearchPlan(
        device=dev, gpu_infos=gpu_infos, space=space_obj, dropped=dropped, notes=notes,
        confirm_policy=_confirm_policy(dev, a.confirm_rounds, a.confirm_tolerance), settings=settings,
        workload=workload, baseline=_baseline_candidate(space_obj, a.effective_batch, dev) if a.baseline else None,
        capabilities=caps, max_world=max_world(dev, len(gpu_infos), cluster=a.ray_address is not None),
        confirm_steps=confirm_steps(a.steps), prune=prune_default(a.prune, dev),
        load_monitor=load_monitor_default(a.load_monitor, own_executor=a.executor is None,
                                          cluster=a.ray_address is not None),
        rule=rule,
    )  # fmt: skip
    if dev == "cpu":  # the --device auto refusal reads the prediction (a CPU space is small: milliseconds)
        deadlines, fc = _predict(r, plan)
        plan = dataclasses.replace(plan, deadlines=deadlines, forecast=fc)
    plan = dataclasses.replace(plan, notes=[*notes, *_preflight(r, plan)])
    hardware, software, key = _cache_key(r, plan)
    return dataclasses.replace(plan, hardware=hardware, software=software, key=key)


def _probe_settings(r: Request, dev: str, gpu_infos: list[dict[str, Any]]) -> tuple[ProbeSettings, Any]:
    """(the probes' settings, the deadline rule): the budget in bytes and the run-level timeout."""
    from autotune.estimate import DeadlineRule

    a = r.args
    budget_bytes = resolve_budget(r.budget, device=dev, gpu_infos=gpu_infos, ram_bytes=_ram_bytes)
    rule = DeadlineRule.for_device(dev, r.probe_timeout_s)
    # the run-level timeout: the fixed one, else what an unpredictable probe gets (each probe's own
    # deadline is set when it is submitted: search.Deadlines)
    settings = ProbeSettings(device=dev, budget_bytes=budget_bytes, budget_text=r.budget.text,
                             warmup_steps=a.warmup_steps, steps=a.steps,
                             timeout_s=rule.fixed_s if rule.fixed_s is not None else rule.unpredicted_s)
    return settings, rule


def _workload(r: Request) -> Workload:
    a = r.args
    if a.dataset is not None and a.lengths != "fixed":
        raise SpecError("--lengths describes synthetic sequences and --dataset brings real ones: give one of them")
    return Workload(model=r.resolved.name, model_path=r.resolved.path, seq_len=a.seq_len, mode=a.mode,
                    dataset=a.dataset, trust_remote_code=a.trust_remote_code, seed=a.seed, lengths=a.lengths,
                    split=a.split, tokenizer=a.tokenizer, trainer=a.trainer, lora_r=a.lora_r,
                    lora_alpha=2 * a.lora_r if a.lora_alpha is None else a.lora_alpha,
                    lora_targets=_lora_targets(a.lora_targets))


def _lora_targets(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return parse_lora_targets(value) if isinstance(value, str) else tuple(value)


def predict_run(r: Request, plan: SearchPlan) -> SearchPlan:
    """Stage 3b (a search will run, nothing is written yet): each probe's deadline rule and the predicted
    time to answer, printed with the run's notes; SpecError (exit 2) when ``--time-budget`` cannot hold
    the baseline and one candidate."""
    from autotune.run._forecast import check_time_budget, forecast_line

    a = r.args
    deadlines, fc = plan.deadlines, plan.forecast
    if deadlines is None:
        deadlines, fc = _predict(r, plan)
    check_time_budget(fc, time_budget_s=r.time_budget_s, time_budget_text=a.time_budget, steps=a.steps,
                      model_ref=a.model, max_trials=a.max_trials, probe_timeout_s=r.probe_timeout_s)
    return dataclasses.replace(plan, deadlines=deadlines, forecast=fc, notes=[*plan.notes, forecast_line(fc)])


def _slots(r: Request, plan: SearchPlan) -> int:
    """Probes that will run at once (before the executor exists: its rule, read from the request)."""
    if r.args.executor is not None:
        return max(1, int(r.args.executor.slots))
    if plan.device == "cuda" and plan.gpu_infos and r.args.ray_address is None:
        return max(1, len(plan.gpu_infos) // max(1, min(plan.space.gpus_per_trial)))
    return 1  # a CPU probe takes every core; a cluster's GPUs are not visible from here (at least 1)


def _predict(r: Request, plan: SearchPlan) -> tuple[Any, dict]:
    """(the run's Deadlines, the forecast of its time to answer)."""
    from autotune.estimate import Deadlines, make_predictor
    from autotune.run._forecast import forecast
    from autotune.run._preflight import mean_sequence_tokens
    from autotune.search import distinct_candidates, usable_micro_batches, usable_worlds

    a, dev, space, workload, settings, rule = r.args, plan.device, plan.space, plan.workload, plan.settings, plan.rule
    predictor = make_predictor(r.resolved.config, workload, device=dev, gpu_infos=plan.gpu_infos,
                               mean_tokens=mean_sequence_tokens(workload) if dev == "cpu" else None)

    def fits(c: Candidate) -> bool:
        from autotune.estimate import fits as fits_budget

        try:
            return fits_budget(workload, c, r.resolved.config, settings.budget_bytes, device=dev)
        except Exception:  # an architecture the memory model does not know: count it
            return True

    worlds, _ = usable_worlds(space, plan.max_world)
    mbs, _ = usable_micro_batches(space, a.effective_batch, worlds)
    distinct = distinct_candidates(space, effective_batch=a.effective_batch, micro_batches=mbs, worlds=worlds) \
        if worlds and mbs else None
    fc = forecast(predictor, space=space, settings=settings, effective_batch=a.effective_batch,
                  max_world=plan.max_world, max_trials=a.max_trials, top_k=a.top_k,
                  confirm_min_rounds=plan.confirm_policy.min_rounds, confirm_steps=plan.confirm_steps,
                  baseline=plan.baseline, slots=_slots(r, plan), distinct=distinct, fits=fits)  # fmt: skip
    fc["deadline_text"] = rule.text() if fc.get("time_to_answer_s") is not None or rule.fixed_s is not None \
        else f"{rule.unpredicted_s:g} s"
    return Deadlines(rule=rule, predictor=predictor), fc


def _preflight(r: Request, plan: SearchPlan) -> list[str]:
    """Before anything is written: the CPU probe time, the batch, the weights, --ray-address, the dataset.

    Raises SpecError for what cannot run; returns notes for what can but the user should know."""
    from autotune.run._preflight import AUTO_CPU_PROBE_LIMIT_S, check_cpu_probe_time, preflight

    a, rule, notes = r.args, plan.rule, []
    if plan.device == "cpu":
        limit = rule.fixed_s if rule.fixed_s is not None else AUTO_CPU_PROBE_LIMIT_S
        limit_text = (f"{limit:g} s probe timeout (--probe-timeout)" if rule.fixed_s is not None
                      else f"{limit:g} s one probe may take on a CPU that --device auto fell back to")
        cpu_s = check_cpu_probe_time(plan.forecast.get("min_probe_s"), workload=plan.workload,
                                     effective_batch=a.effective_batch, limit_s=limit, limit_text=limit_text,
                                     requested_device=a.device, model_ref=a.model)  # fmt: skip
        if cpu_s is not None and rule.fixed_s is not None and cpu_s > rule.fixed_s:
            notes.append(f"one probe is predicted to take at least {cpu_s:,.0f} s on this CPU, past the "
                         f"{rule.fixed_s:g} s probe timeout (--probe-timeout)")
    preflight(config=r.resolved.config, name=r.resolved.name, workload=plan.workload, space=plan.space,
              effective_batch=a.effective_batch, device=plan.device, budget_text=r.budget.text,
              budget_bytes=plan.budget_bytes, max_world=plan.max_world, ray_address=a.ray_address)  # fmt: skip
    return notes


def _cache_key(r: Request, plan: SearchPlan) -> tuple[dict, dict, str]:
    """(hardware, software, key) of ``plan``: everything that changes the answer
    (autotune/store/cache_key.py lists it)."""
    from autotune.store import (
        cache_key,
        dataset_identity,
        hardware_fingerprint,
        probe_fields,
        software_versions,
        workload_fields,
    )

    a = r.args
    probe = probe_fields(plan.settings)
    if plan.rule is not None and plan.rule.fixed_s is None:
        # each probe's deadline comes from its prediction: the key holds the rule, not the seconds
        probe["timeout_s"] = plan.rule.describe()
    hardware = hardware_fingerprint(plan.device, plan.gpu_infos)
    if a.ray_address is not None:
        hardware["ray_address"] = a.ray_address
    software = software_versions()
    if a.trainer == "trl":  # the probes measure TRL's code too
        from autotune.env import versions_of

        software.update(versions_of("trl", "datasets"))
    key = cache_key(model_config=r.resolved.config, space=plan.space.to_dict(), budget_bytes=plan.budget_bytes,
                    seq_len=a.seq_len, effective_batch=a.effective_batch, mode=a.mode, hardware=hardware,
                    software=software, dataset=dataset_identity(a.dataset, a.split) if a.hub is not None else
                    dataset_identity(a.dataset), search=_search_settings(r, plan), model_revision=r.resolved.revision,
                    workload=workload_fields(plan.workload), probe=probe, capabilities=plan.capabilities)  # fmt: skip
    return hardware, software, key


def _prune_setting(r: Request, plan: SearchPlan) -> bool | str:
    """Whether the memory model's pruner runs (the plan's), or ``custom:NAME`` for a pruner of yours."""
    pruner = r.args.pruner
    return f"custom:{getattr(pruner, '__qualname__', type(pruner).__name__)}" if pruner is not None else plan.prune


def _search_settings(r: Request, plan: SearchPlan) -> dict[str, Any]:
    """The search's part of the cache key, from the plan's resolved defaults."""
    a = r.args
    return {"max_trials": a.max_trials, "seed": a.seed, "top_k": a.top_k, "confirm_steps": plan.confirm_steps,
            "time_budget_s": r.time_budget_s, "gpus": r.gpu_list, "baseline": a.baseline,
            "prune": _prune_setting(r, plan),
            "verify_loss": a.verify_loss, "verify_loss_tolerance": a.verify_loss_tolerance,
            "confirm": plan.confirm_policy.to_dict(),
            **({"strategy": a.strategy} if a.strategy != "walk" else {}),  # (walk: keys as before)
            "load_monitor": plan.load_monitor}  # fmt: skip


def answer_from_cache(r: Request, plan: SearchPlan, *, started: float) -> TuneResult | None:
    """Stage 3: a stored answer to the same request (None: search). A stored, measured "nothing fits"
    is raised again (NothingFitsError). ``--fresh`` skips this stage."""
    from autotune.store import find_cached, find_cached_nothing_fits, stored_answer_problem

    a = r.args
    if a.fresh:
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
        summary = {**summary, "from_cache": True, "answered_in_s": round(time.monotonic() - started, 3)}
        if a.progress is not None:
            a.progress("cached", {"run_dir": str(cached.path), "summary": summary})
        return TuneResult(best=best, summary=summary, run_dir=cached.path, from_cache=True)
    refused = find_cached_nothing_fits(out_path, plan.key)
    if refused is not None:
        stored, stored_summary = refused
        if a.progress is not None:
            a.progress("cached", {"run_dir": str(stored.path), "summary": stored_summary})
        raise NothingFitsError(str(stored_summary.get("message", "nothing fits (cached answer)")) + " [cached]")
    return None


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
        "effective_batch": a.effective_batch,
        "device": plan.device,
        "gpu_budget": r.budget.text,
        "budget_bytes": plan.settings.budget_bytes,
        "usable_bytes": plan.usable,
        "headroom": plan.settings.headroom,
        "seed": a.seed,
        "space": {"name": space.name, "source": space.source, "dimensions": space.to_dict()},
        "dropped_choices": [d.to_dict() for d in plan.dropped],
        "search": {"max_trials": a.max_trials, "time_budget_s": r.time_budget_s, "top_k": a.top_k, "steps": a.steps,
                   "confirm_steps": plan.confirm_steps, "confirm": plan.confirm_policy.to_dict(), "storage": storage_url,
                   "study_name": run_dir.run_id, "strategy": a.strategy,
                   "prune": _prune_setting(r, plan), "load_monitor": plan.load_monitor,
                   "max_world": plan.max_world,
                   "deadlines": {**(plan.deadlines.rule.describe() if plan.deadlines is not None else {}),
                                 "forecast": plan.forecast}},
        "environment": {"hardware": plan.hardware, "software": plan.software},
    }
    if not resumed:
        run_dir.write_json("run.json", {"cache_key": plan.key, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                        "request": {k: base_summary[k] for k in (
                                            "model", "mode", "trainer", "seq_len", "lengths", "effective_batch", "device",
                                            "gpu_budget", "seed", "space", "search")},
                                        **({"model_revision": r.resolved.revision, "model_path": r.resolved.path}
                                           if r.resolved.revision else {})})  # fmt: skip
    if progress is not None:
        progress("run_dir", {"run_dir": str(run_dir.path), "resumed": resumed, "restored": len(history)})
        for text in plan.notes:
            progress("note", {"text": text})
    return RunStart(history=history, base_summary=base_summary, storage_url=storage_url, resumed=resumed)


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
                                         gpus_per_probe=min(plan.space.gpus_per_trial), progress=progress)
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
    from autotune.search import Searcher
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
        executor=executor, max_trials=a.max_trials, time_budget_s=r.time_budget_s, seed=a.seed,
        storage=study_storage, study_name=run_dir.run_id, top_k=a.top_k, device=dev,
        max_world=_run_max_world(plan, executor, cluster=a.ray_address is not None),
        confirm_steps=plan.confirm_steps,
        history=started.history, sink=run_dir.journal, pruner=pruner, progress=progress, baseline=plan.baseline,
        confirm=plan.confirm_policy, load_check=monitor.check if monitor is not None else None,
        strategy=a.strategy, deadlines=plan.deadlines,
    )
    return searcher, pruner


def _run_max_world(plan: SearchPlan, executor: Executor, *, cluster: bool) -> int | None:
    """The plan's bound on one probe's GPUs, narrowed by what the executor reports (the same rule:
    ``spec.max_world``); without a report it is ``plan.max_world``."""
    from autotune.spec.run_defaults import max_world

    # a distributed probe's ranks run on one node: on a cluster, the largest node bounds the world
    ex_gpus = getattr(executor, "max_gpus_per_node", None) or getattr(executor, "total_gpus", None)
    if plan.device != "cuda" or not ex_gpus:
        return plan.max_world
    return max_world(plan.device, len(plan.gpu_infos), cluster=cluster, executor_gpus=int(ex_gpus))


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


def write_answer(run_dir: Any, summary: dict[str, Any], searched: Searched, *, device: str,
                 progress: ProgressFn | None) -> TuneResult:
    """Stage 7: trials.csv, summary.json, the reports; then best_result.json and best/ (NothingFitsError
    after writing when nothing fits). summary.json is written before the reports (they read it) and
    again with the file list."""
    outcome, verified = searched.outcome, searched.verified
    run_dir.write_trials_csv(outcome.records)
    if outcome.best is None:
        run_dir.write_json("summary.json", summary)
        _write_reports(run_dir, progress)
        raise NothingFitsError(summary["message"])
    best = outcome.best
    run_dir.write_json("best_result.json", best.to_dict())
    files = _emit(best, run_dir, device, progress)
    summary["status"] = "complete"
    if best.metrics.get("quality_notes"):  # e.g. TRL's packing (--trainer trl)
        summary["quality_notes"] = list(best.metrics["quality_notes"])
    if verified is not None:
        run_dir.write_json("verify_loss.json", verified)
        summary["verify_loss"] = {k: verified.get(k) for k in ("steps", "max_abs_diff", "max_at_step", "tolerance",
                                                               "exceeds", "expected_identical", "verdict")}
    run_dir.write_json("summary.json", summary)  # the reports are rendered from the run directory
    files += _write_reports(run_dir, progress)
    summary["files"] = sorted(str(p.relative_to(run_dir.path)) for p in files + [
        run_dir.path / n for n in ("trials.csv", "best_result.json", "summary.json")])
    try:  # the answer is on disk already: a failure to add the file list must not turn it into an error
        run_dir.write_json("summary.json", summary)
    except AutotuneError as exc:
        if progress is not None:
            progress("note", {"text": f"summary.json kept without its file list: {exc}"})
    return TuneResult(best=best, summary=summary, run_dir=run_dir.path, records=outcome.records)


def _claim_run_dir(out: Path, key: str, model_name: str, resume: bool) -> tuple[Any, Any, bool]:
    """The run folder this process works in, locked: (run_dir, lock, resumed).

    With ``resume`` the newest unfinished run of the same request is taken over, unless a live
    process still holds it: then ``RunInProgressError`` (exit 4), and nothing is written.
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
    run_dir = RunDir.create(out, make_run_id(model_name, key))
    lock = run_dir.try_lock()  # a new folder: nobody else can hold it
    assert lock is not None
    return run_dir, lock, False


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


def _space_for_device(
    space: SearchSpace | None, dev: str, gpu_infos: list[dict[str, Any]], requested: str, ray_address: str | None,
    mode: str,
) -> tuple[SearchSpace, list[Any], dict[str, Any], list[str]]:
    """(the space to search, the dropped choices, the capabilities, progress notes for the run).

    No space given: the device's own (``cpu`` or ``default``). Then the choices this device or
    installation cannot run are dropped (SpecError when a knob is left with none).
    """
    from autotune.run._preflight import default_space_for, detect_capabilities
    from autotune.spec.capabilities import dropped_line, filter_space

    notes: list[str] = []
    if space is None:
        space = load_space(default_space_for(dev))
        if requested == "auto" and dev == "cpu":
            notes.append("--device auto found no GPU: searching on cpu with the `cpu` search space "
                         "(--space names another, --device cuda insists on a GPU)")
    caps = detect_capabilities(dev, gpu_infos, ray_address)
    space, dropped = filter_space(space, caps, mode=mode)
    if dropped:
        notes.append(dropped_line(dropped, dev))
    return space, dropped, caps, notes
def _confirm_policy(device: str, rounds: tuple[int, int] | None, tolerance: float | None) -> Any:
    """The confirmation policy for ``device`` with the user's overrides (SpecError when they make no sense)."""
    from autotune.search import ConfirmPolicy

    overrides: dict[str, Any] = {}
    if rounds is not None:
        overrides.update(min_rounds=rounds[0], max_rounds=rounds[1])
    if tolerance is not None:
        overrides["tolerance"] = tolerance
    try:
        return ConfirmPolicy.for_device(device, **overrides)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"confirmation: {exc}") from None


def _speedup_summary(outcome: SearchOutcome, baseline: Candidate) -> dict[str, Any]:
    """best vs the HF default from the medians of their side-by-side re-measurements, with the range."""
    from autotune.search import speedup

    if outcome.best_record is None:
        return {}
    key = candidate_id(baseline)
    base = next((e for e in outcome.ranking if e["key"] == key), None)
    best = next((e for e in outcome.ranking if e["key"] == outcome.best_record.key), None)
    if base is None or best is None or base["status"] not in ("confirmed", "noisy"):
        return {"speedup_vs_baseline": None,
                "speedup_note": "the HF default was not re-measured beside the winner (it did not run, or failed)"}
    s = speedup(best["measurements"], base["measurements"], best_by_round=best.get("by_round"),
                base_by_round=base.get("by_round"))
    if s is None:
        return {"speedup_vs_baseline": None}
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
    return {"doubtful": bool(reasons), "reasons": reasons}


def _baseline_candidate(space: SearchSpace, effective_batch: int, device: str = "cpu") -> Candidate | None:
    """The "HF default" (what a user would type) for this effective batch, on the fewest GPUs.

    Compared like with like: on a GPU at bf16 when the space searches bf16 (everyone fine-tunes in
    bf16 there; an fp32 default would fold bf16-vs-fp32 into the speedup and often not fit), else fp32.
    """
    from autotune.spec.baseline import hf_default_candidate

    world = 1 if 1 in space.gpus_per_trial else min(space.gpus_per_trial)
    precision = "bf16" if device == "cuda" and "bf16" in space.precision else "fp32"
    try:
        cand = hf_default_candidate(effective_batch, world_size=world, precision=precision)
    except ValueError:
        return None
    if cand.micro_batch * cand.grad_accum * cand.world_size != effective_batch:
        return None  # it cannot hold this effective batch: no honest comparison
    return cand


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
                    range=entry["range"], confirm_status=entry["status"], confirmed=entry["status"] == "confirmed")
    return result, BaselineEntry(**info).model_dump(mode="json", exclude_unset=True)


def _emit(best: ProbeResult, run_dir: Any, device: str, progress: ProgressFn | None) -> list[Path]:
    try:
        from autotune.emit import emit_all
    except ImportError:  # pragma: no cover - the emitters are part of the package
        return []
    try:
        return list(emit_all(best, run_dir.best_dir, fields=_training_args_fields(), device=device))
    except (AutotuneError, OSError) as exc:
        if progress is not None:
            progress("note", {"text": f"could not write best/: {exc}"})
        return []


def _write_reports(run_dir: Any, progress: ProgressFn | None) -> list[Path]:
    """report.md and report.html, rebuilt from the run directory (as `autotune report` does)."""
    from autotune.report.build import write_reports

    try:
        return write_reports(run_dir.path)
    except Exception as exc:  # the report must never cost the user the answer
        if progress is not None:
            progress("note", {"text": f"could not write the report: {exc!r}; `autotune report` retries"})
        return []


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
