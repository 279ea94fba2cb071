"""Stage 1 of a run: the request, built once and validated once.

``RunRequest`` is everything a run is asked (the CLI's options, a ``--from`` file's values, or
``autotune.tune``'s keywords build the same object); ``read_request`` checks every value at once
(SpecError listing each problem), parses each once, resolves the model and the dataset, and, for a
``--from`` file to be written back, checks before the search that the tuned file can be written.
Nothing is written here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import SpecError
from autotune.executors.base import Executor
from autotune.spec.budget import Budget, parse_budget
from autotune.spec.parse import parse_duration, parse_gpus
from autotune.spec.probe_request import (
    DEVICE_CHOICES,
    MODE_CHOICES,
    parse_lora_targets,
)
from autotune.spec.run_defaults import POOLS
from autotune.spec.space import SearchSpace, load_space

if TYPE_CHECKING:  # the searcher imports optuna: loaded when a search actually runs
    from autotune.search import Pruner

__all__ = ["RunRequest", "TuneArgs", "Request", "WriteBackPlan", "announce_source", "read_request", "read_source", "plan_write_back",
           "API_ONLY", "FILLED_FROM_FILE", "MAX_EFFECTIVE_BATCH", "ProgressFn"]

ProgressFn = Callable[[str, dict[str, Any]], None]

# RunRequest's fields that `autotune run` has no option for (Python objects, or settings only the API offers)
API_ONLY = ("executor", "progress", "pruner", "prune", "baseline", "load_monitor", "verify_loss_tolerance",
            "warmup_steps")

# sequences per optimizer step: far above any real fine-tuning batch (1,024 x 4k tokens = 4M tokens),
# and below what would have a probe build and accumulate millions of micro-steps
MAX_EFFECTIVE_BATCH = 65_536


@dataclass(frozen=True)
class RunRequest:
    """What a run is asked, as given, with its defaults (see :func:`autotune.run.tune`; a test holds these
    names and `autotune run`'s options to the same list). ``source`` is a ``--from`` file as read
    (:meth:`from_file`) and ``write_back`` where its tuned copy goes (None: ``best/<its name>``)."""

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
    pool: str = "auto"
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
    stop_when_converged: bool = False  # the walk's settled best ends the search (else max_trials / time)
    hub: Any = None  # autotune.models.HubAccess: online; None: offline
    config_name: str | None = None
    sample_rows: int | None = None
    source: Any = None  # autotune.formats.ReadConfig: the --from file the request was read from
    write_back: str | Path | None = None  # with source: where the tuned file is written

    @classmethod
    def from_file(cls, path: str | Path, *, fmt: str | None = None, **given: Any) -> RunRequest:
        """The request a training config holds (TrainingArguments/TRL, Axolotl, LLaMA-Factory), and the file
        itself as ``source`` for the write-back. A keyword given (not None) wins over the file's value,
        ``lora_r=0`` included (it is then validated, not replaced); what neither gives takes the default."""
        source, from_file = read_source(path, fmt, effective_batch_given=given.get("effective_batch") is not None)
        for text in source.notes if given.get("dataset") is None and given.get("progress") is not None else []:
            given["progress"]("note", {"text": text})
        replaced = {}
        for name, value in from_file.items():
            if given.get(name) is None:
                given[name] = value
            elif given[name] != value:
                replaced[name] = f"--{name.replace('_', '-')} {_shown(given[name])} (the file's: {_shown(value)})"
        if replaced and given.get("progress") is not None:
            given["progress"]("note", {"text": _override_note(replaced, source.name)})
        return cls.with_defaults(source=source, **given)

    @classmethod
    def with_defaults(cls, **given: Any) -> RunRequest:
        """``RunRequest(**given)`` where a None among the fields a ``--from`` file may fill is the default."""
        if given.get("model") is None:
            raise SpecError("--model is required (or --from FILE naming the model)")
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for name in FILLED_FROM_FILE:
            if given.get(name) is None:
                given[name] = defaults[name]
        return cls(**given)


TuneArgs = RunRequest  # the name of one release ago

def _shown(value: Any) -> str:
    """A request value as a flag would be written (module lists joined, peft's default named)."""
    from autotune.formats.model import PEFT_DEFAULT

    if value == PEFT_DEFAULT:
        return "peft's default"
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def _override_note(replaced: dict[str, str], name: str) -> str:
    """What a flag that replaces a --from file's value does: the search measures it; the tuned file is written with
    the sequence length and batch measured, and keeps its own model, mode and adapters."""
    text = f"{', '.join(replaced.values())}: the flag wins and the search measures it"
    written = [{"seq_len": "sequence length"}.get(n, "effective batch") for n in ("seq_len", "effective_batch")
               if n in replaced]
    kept = [n.replace("_", " ") for n in replaced if n not in ("seq_len", "effective_batch", "dataset")]
    if written:
        text += f"; the tuned {name} trains with the {' and '.join(written)} measured"
    if kept:
        text += f"; it keeps its own {', '.join(kept)} (the write-back changes none of them)"
    return text


# what a --from file may give (the flag wins): the request's keys a format's reader returns
FILLED_FROM_FILE = ("model", "mode", "seq_len", "effective_batch", "dataset", "lora_r", "lora_alpha", "lora_targets")


def read_source(path: str | Path, fmt: str | None, *, effective_batch_given: bool) -> tuple[Any, dict[str, Any]]:
    """(the file as read, the request values it holds). Read through the bounded reader (a FIFO,
    ``/dev/zero`` or a huge file is refused in one line); each value is type-checked like a flag, naming
    the key."""
    from autotune.formats import (
        ENUMS_JUDGED,
        distributed_setup,
        enum_problems,
        packs_into_rows,
        read_config,
        unmeasured_problems,
        value_problems,
    )
    from autotune.spec.files import read_text_file

    p = Path(path)
    text = read_text_file(p, what="--from")
    cfg = read_config(p.name, text, fmt=fmt)
    if cfg.format in ("deepspeed", "accelerate"):
        raise SpecError(f"--from {str(path)!r} is a {cfg.module.LABEL} config: pass the training config that names it")
    problems = [f"--from {p.name}: {m}" for m in cfg.problems]
    said = {m.split("; ")[0] for m in problems}  # the type table and the value checks may both name a key
    problems += [m for m in value_problems(cfg.format, cfg.data, f"--from {p.name}") if m.split("; ")[0] not in said]
    problems += unmeasured_problems(cfg.format, cfg.data, f"--from {p.name}")
    if cfg.format in ENUMS_JUDGED:  # names transformers itself refuses (not Axolotl's own)
        from autotune.env import training_enums

        problems += [f"--from {p.name}: {m} (fix: {fix})" for _, m, fix in enum_problems(cfg.data, training_enums())]
    if problems:
        raise SpecError(problems)
    req = cfg.request
    cfg.distributed, cfg.distributed_from = distributed_setup(cfg.data, p)
    if cfg.format == "llamafactory" and cfg.data.get("dataset") is not None and not req.get("dataset"):
        _llamafactory_dataset(cfg, p)
    packed = packs_into_rows(cfg)
    if packed and not effective_batch_given and req.get("effective_batch"):
        # rows of packed sequences per step are not a number of sequences: reading one as the other
        # would hold a different batch than the file trains with, and the data's mean length that
        # converts them is not known before the data is read
        raise SpecError(
            f"--from {p.name} packs sequences into rows ({packed}: true), so its {req['effective_batch']} per "
            f"step counts rows, not the sequences autotune holds fixed; pass --effective-batch SEQUENCES (about "
            f"{req['effective_batch']} x {req.get('seq_len') or 'the sequence length'} / your data's mean sequence length)")
    return cfg, {k: req.get(k) for k in FILLED_FROM_FILE if req.get(k) is not None}


def _llamafactory_dataset(cfg: Any, path: Path) -> None:
    """A LLaMA-Factory file's ``dataset`` as the probes' data: the file its ``dataset_info.json`` names (in
    ``dataset_dir``, default ``data``, from the working directory as LLaMA-Factory reads it, else beside the file),
    when autotune reads that layout; otherwise a note that the probes measure synthetic sequences instead."""
    from autotune.formats.llamafactory import dataset_from_info
    from autotune.spec.files import load_json, read_text_file

    folder = str(cfg.data.get("dataset_dir") or "data")
    tried = [Path(folder)] if Path(folder).is_absolute() else [Path(folder), path.parent / folder]
    where = next((d for d in tried if (d / "dataset_info.json").is_file()), None)
    info = None if where is None else load_json(read_text_file(where / "dataset_info.json", what="dataset_info.json"),
                                                what=f"cannot read {where / 'dataset_info.json'}")
    found, why = dataset_from_info(cfg.data.get("dataset"), info, str(where or tried[0]))
    if found is not None and Path(found).is_file():
        cfg.request["dataset"] = found
        return
    why = why or f"its file {found!r} does not exist"
    cfg.notes.append(f"--from {path.name}: its dataset {cfg.data.get('dataset')!r} was not read ({why}); the probes "
                     "measure synthetic sequences of the file's length instead: pass --dataset FILE (jsonl of "
                     "'messages' or 'text') to measure on your data")


@dataclass(frozen=True)
class WriteBackPlan:
    """The write-back, checked before the search: the target (None: ``best/tuned/<name>``), a hash of what it
    held then (an edit during the search is not overwritten), the installed field names."""

    target: Path | None
    state: Any
    fields: set[str] | None


def _dry_write_back(source: Any, keys: set[str]) -> str | None:
    """Why a write-back into ``source`` would fail, found by writing every key it may change with another value
    (each present scalar changed, each absent key appended) and reading the result back; None when it holds.
    Layouts the structural check lets through (a top-level mapping indented, a byte-order mark before the first
    key, block scalars) fail here, before the search rather than after it."""
    from autotune.errors import AutotuneError
    from autotune.formats import write_back_text

    def other(value: Any) -> Any:
        if isinstance(value, bool):
            return not value
        if isinstance(value, int):
            return value + 1
        if isinstance(value, float):
            return value * 2 + 1
        if isinstance(value, str):
            return value + "x"
        return 1

    data = source.data
    updates = {k: other(data.get(k)) for k in sorted(keys) if not isinstance(data.get(k), (dict, list))}
    if not updates:
        return None
    try:
        write_back_text(source.name, source.text, updates)
    except SpecError as exc:
        return str(exc).removesuffix("; nothing written")
    except AutotuneError:
        return (f"cannot write the tuned keys back into {source.name} in place: its layout does not survive the "
                "edit (a byte-order mark, top-level keys indented, or a block value); save it with its top-level "
                "keys at column 0 and one-line values")
    return None


def plan_write_back(source: Any, out: str | Path | None) -> WriteBackPlan:
    """Check, before the search, that the tuned file can be written: the ``--write-back`` target (not a
    folder, link, device or read-only file) and the file's constructs (editable in place)."""
    from autotune.env import sft_fields, training_fields
    from autotune.formats import uneditable, writable_keys
    from autotune.store.atomic import check_write_target, content_state

    fields = sft_fields() if source.format == "trl" else training_fields()[0]
    keys = writable_keys(source, fields=fields)
    why = uneditable(source.name, source.text, keys) or _dry_write_back(source, keys)
    if why:
        raise SpecError(f"{why} (checked before the search; nothing was run or written)")
    target = Path(out) if out else None
    if target is not None:
        check_write_target(target, what="--write-back")
    return WriteBackPlan(target=target, state=content_state(target) if target is not None else None, fields=fields)


@dataclass(frozen=True)
class Request:
    """Stage 1's output: the arguments, checked and parsed, and the model resolved."""

    args: RunRequest
    budget: Budget
    time_budget_s: float | None
    gpu_list: list[int] | None
    space: SearchSpace | None  # None: the device's own (chosen in plan_search)
    resolved: Any  # autotune.models.ResolvedModel
    probe_timeout_s: float | None = None  # --probe-timeout's fixed seconds (None: predicted)
    write_back: WriteBackPlan | None = None  # a --from file to write back (checked)


def read_request(a: RunRequest) -> Request:
    """Stage 1: the write-back's target, every problem with the arguments at once (SpecError), then the
    model, offline unless ``hub``."""
    if a.write_back is not None and a.source is None:
        raise SpecError("--write-back needs --from FILE (the config to write back into)")
    write_back = plan_write_back(a.source, a.write_back) if a.source is not None else None
    parsed = _parse_args(a)
    resolved = _resolve_inputs(a)
    a = _peft_default_targets(a, resolved)
    return Request(args=a, budget=parsed["budget"], time_budget_s=parsed["time_budget_s"],
                   gpu_list=parsed["gpu_list"], space=parsed["space"], resolved=resolved,
                   probe_timeout_s=parsed["probe_timeout_s"], write_back=write_back)


def announce_source(r: Request) -> None:
    """What the ``--from`` file asks for, said once the request holds (a refusal stays its one line)."""
    a = r.args
    if a.source is not None and a.progress is not None:
        a.progress("source", {"name": a.source.name, "label": a.source.module.LABEL, "model": a.model, "mode": a.mode,
                              "seq_len": a.seq_len, "effective_batch": a.effective_batch})


def _parse_args(a: RunRequest) -> dict[str, Any]:
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
    elif a.stop_when_converged and a.strategy != "walk":  # (accepted, and nothing stopped on it)
        problems.append(f"--stop-when-converged stops the walk when it has settled; the {a.strategy} strategy has no "
                        "such point" + (" (it stops by itself)" if a.strategy == "model" else "")
                        + ": drop it, or use --strategy walk")
    if a.pool not in POOLS:
        problems.append(f"unknown pool {a.pool!r}; choose one of {', '.join(POOLS)}")
    elif a.pool == "local" and a.ray_address is not None:
        problems.append("--pool local runs the probes on this machine: drop --ray-address, or use --pool ray")
    from autotune.run._forecast import parse_probe_timeout
    from autotune.spec.lengths import parse_lengths
    from autotune.store.run_dir import check_out_dir
    from autotune.store.storage import check_storage_url

    parsed: dict[str, Any] = {}
    for name, fn in (("time_budget_s", lambda: parse_duration(a.time_budget)),
                     ("budget", lambda: parse_budget(a.gpu_budget)),
                     ("probe_timeout_s", lambda: parse_probe_timeout(a.probe_timeout_s)),
                     ("gpu_list", lambda: parse_gpus(a.gpus)), ("lengths", lambda: parse_lengths(a.lengths)),
                     ("out", lambda: check_out_dir(a.out, writable=False)), ("storage", lambda: check_storage_url(a.storage))):
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


def _peft_default_targets(a: RunRequest, resolved: Any) -> RunRequest:
    """A ``--from`` file that leaves the LoRA targets to peft (``PEFT_DEFAULT``): the targets peft picks for this
    model type, so the probes measure the adapters the file trains; SpecError where peft has no default (it
    would refuse the file's config)."""
    from autotune.formats.model import PEFT_DEFAULT, PEFT_DEFAULT_PATTERNS, PEFT_DEFAULT_TARGETS

    if a.lora_targets != PEFT_DEFAULT:
        return a
    if a.mode not in ("lora", "qlora"):  # --mode full over the file's adapters: no targets to resolve
        return dataclasses.replace(a, lora_targets="attn")
    model_type = str(resolved.config.get("model_type") or "")
    targets = PEFT_DEFAULT_TARGETS.get(model_type)
    where = f"--from {a.source.name}" if a.source is not None else "the request"
    if targets is None and model_type in PEFT_DEFAULT_PATTERNS:
        raise SpecError(f"{where} leaves the LoRA targets to peft, whose default for model_type {model_type!r} is the "
                        f"pattern {PEFT_DEFAULT_PATTERNS[model_type]!r} over module paths, which the probes cannot "
                        "adapt as peft would; name the modules (lora_target_modules, or --lora-targets)")
    if targets is None:
        raise SpecError(f"{where} leaves the LoRA targets to peft, which has no default for model_type "
                        f"{model_type!r} and refuses such a config; name them (lora_target_modules, or --lora-targets)")
    if a.progress is not None:
        a.progress("note", {"text": f"{where} names no LoRA targets: the probes adapt peft's default for "
                                    f"{model_type}, {', '.join(targets)}, as the file trains"})
    return dataclasses.replace(a, lora_targets=",".join(targets))


def _resolve_inputs(a: RunRequest) -> Any:
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
        if a.split is not None and Path(a.dataset).expanduser().is_file():
            # a .jsonl/.parquet file has one split: --split would only make another cache key of the same data
            raise SpecError(f"--split {a.split!r} names a split, but dataset {a.dataset!r} is one file (one split); "
                            "drop --split")
        # every file's size, by stat, before anything reads or hashes one (the cache key hashes the data)
        local = (find_hub_dataset(a.dataset) or find_hub_sample(a.dataset, a.split)) if is_hub_dataset_id(a.dataset) \
            else Path(a.dataset).expanduser()
        if local is not None:
            check_dataset_files(local)
    if a.split is not None and a.dataset is None:
        raise SpecError("--split names a split of --dataset; pass --dataset too, or drop --split")
    if a.sample_rows is not None and a.dataset is None:
        raise SpecError("--sample-rows samples a Hub --dataset; pass --dataset too, or drop --sample-rows")
    return resolved


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


def _lora_problems(a: RunRequest) -> list[str]:
    p = []
    if isinstance(a.lora_r, bool) or not isinstance(a.lora_r, int) or a.lora_r < 1:
        p.append(f"LoRA rank must be an integer >= 1; got {a.lora_r!r}")
    if a.lora_alpha is not None and (isinstance(a.lora_alpha, bool) or not isinstance(a.lora_alpha, (int, float))
                                     or not a.lora_alpha > 0):
        p.append(f"LoRA alpha must be a number > 0; got {a.lora_alpha!r}")
    if not isinstance(a.lora_targets, (str, tuple, list)) or not _lora_targets(a.lora_targets):
        p.append(f"LoRA targets must be attn, all-linear or module names separated by commas; got {a.lora_targets!r}")
    return p


def _lora_targets(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return parse_lora_targets(value) if isinstance(value, str) else tuple(value)


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
