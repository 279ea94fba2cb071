"""``autotune check CONFIG``: the notes' checklist over a TrainingArguments / TRL SFTConfig JSON or
YAML, an Axolotl or LLaMA-Factory YAML, an accelerate YAML, a DeepSpeed JSON, or a run's ``best/``
directory, in the file's own vocabulary. Exit 0 when nothing fails, 1 when an item fails, 2 when the
input cannot be read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from autotune.check import (
    CONFIG_FILE_KINDS,
    DEFAULT_FIT_SEQ_LEN,
    ConfigBundle,
    FitTarget,
    bundle_from_texts,
    gather,
    gpu_info,
    render_text,
    requested_model,
)
from autotune.cli.render import dumps_json
from autotune.env import sft_fields, training_enums, training_fields
from autotune.errors import SpecError
from autotune.formats import ENUMS_JUDGED, FORMATS, is_yaml_name, key_source_label, known_keys, read_config

__all__ = ["command", "load_bundle", "bundle_from_file"]


def _read(path: Path) -> str:
    from autotune.spec.files import read_text_file

    return read_text_file(path, what="config")


def load_bundle(path: Path) -> ConfigBundle:
    """Read one config file, or every known config file of a directory (e.g. a run's best/)."""
    if path.is_dir():
        texts = {name: _read(path / name) for name in CONFIG_FILE_KINDS if (path / name).is_file()}
        if not texts:
            raise SpecError(f"{str(path)!r} holds none of {', '.join(CONFIG_FILE_KINDS)}")
        b = bundle_from_texts(str(path), texts, directory=True)
        if "train.py" in texts and "training_args.json" not in texts:  # an answer folder copied in part
            b.missing.append(("training_args.json", "its train.py"))
        for kind in ("training_args", "accelerate"):  # the files they name (a best/ folder moved elsewhere)
            if isinstance(b.data.get(kind), dict):
                _check_references(path / b.sources[kind], b, kind, b.data[kind])
        return b
    return bundle_from_file(path)


def _check_references(path: Path, b: ConfigBundle, fmt: str, data: dict[str, object]) -> None:
    """Every local file the config names (``autotune.formats.file_references``): a missing one, or one that is
    not a regular file, is recorded for a FAIL naming the key; a DeepSpeed JSON that is there is read too."""
    from autotune.formats import file_references, locate_reference

    for key, value, kind in file_references(fmt, data):
        found, problem = locate_reference(path, value, kind)
        ds = None
        if found is not None and kind == "deepspeed":
            ds, problem = _deepspeed_json(found)
        b.references.append((path.name, key, value, problem))
        if ds is not None and "deepspeed" not in b.data:
            b.data["deepspeed"] = ds
            b.sources["deepspeed"] = found.name


def _deepspeed_json(found: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the DeepSpeed config a referenced file holds, None) or (None, why the training tool could not read it:
    transformers reads it with ``json.load``, whatever its suffix)."""
    from autotune.spec.files import load_json

    try:
        data = load_json(_read(found), what=str(found))
    except SpecError as exc:
        return None, f"{found} is not a DeepSpeed JSON file ({' '.join(str(exc).split())[:160]})"
    if not isinstance(data, dict):
        return None, f"{found} holds no JSON object, so it is not a DeepSpeed config"
    return read_config(found.name, json.dumps(data), fmt="deepspeed").data, None


def bundle_from_file(path: Path, fmt: str | None = None) -> ConfigBundle:
    """One config file in any known format, read in its own vocabulary (autotune.formats)."""
    text = _read(path)
    try:
        cfg = read_config(path.name, text, fmt=fmt)
    except SpecError as exc:
        if fmt is not None or path.suffix.lower() in (".yaml", ".yml") or "it reads as YAML" in str(exc):
            raise
        # model_kwargs / lora_config JSON of a best/ directory, or a JSON of unknown keys: the classic reader
        return bundle_from_texts(str(path), {path.name: text}, directory=False)
    mod = FORMATS[cfg.format]
    b = ConfigBundle(target=str(path), fmt=cfg.format)
    try:
        checklist = mod.to_checklist(cfg.data)
    except (TypeError, AttributeError, ValueError, KeyError):  # a wrong type in the format's own keys
        checklist = mod.to_checklist(cfg.clean)
        b.problems = list(cfg.problems)
    for kind, data in checklist.items():
        b.data[kind] = data
        b.sources[kind] = path.name
    if cfg.format in ("axolotl", "llamafactory", "trl"):
        b.native = cfg.data
        ta_fields, _ = training_fields()
        b.known_keys = known_keys(cfg.format, ta_fields=ta_fields, trl_fields=sft_fields())
        b.key_source = key_source_label(cfg.format)
    if cfg.format == "axolotl":  # no type table covers its own keys: the values run --from refuses are FAILs here
        from autotune.formats import value_problems

        b.problems += [m for m in value_problems(cfg.format, cfg.data, path.name) if "are both true" not in m]
    _check_references(path, b, cfg.format, cfg.data)
    from autotune.spec.files import repeated_keys

    # read as read_config read it (parse_text: YAML by the name, else JSON)
    b.repeated = [(k, n, lines, cfg.data.get(k)) for k, n, lines in repeated_keys(text, yaml_text=is_yaml_name(path.name))]
    return b


def fit_target(bundle: ConfigBundle, gpu: str | None, ask: FitAsk) -> tuple[FitTarget | None, str]:
    """The model and catalog GPU the file's memory is judged on, or why not ("" with no ``--gpu``).

    A model given with ``--model`` that cannot be resolved is bad input (SpecError); one the file names is
    judged where it resolves and said to be unjudged where it does not (the rest of the checklist stands)."""
    if gpu is None:
        if ask.model or ask.seq_len or ask.mode:
            raise SpecError("--model, --seq-len and --mode judge memory on a GPU: give --gpu too (e.g. --gpu A10G)")
        return None, ""
    if ask.mode is not None and ask.mode not in ("full", "lora", "qlora"):
        raise SpecError(f"--mode must be full, lora or qlora, got {ask.mode!r}")
    if ask.seq_len is not None and ask.seq_len < 1:
        raise SpecError(f"--seq-len must be a positive number of tokens, got {ask.seq_len}")
    from autotune.estimate import arch_from_config, find_gpu
    from autotune.models import HubAccess, resolve_model

    run = _run_of(Path(bundle.target)) if ask.model is None else {}
    name = ask.model or requested_model(bundle) or run.get("model")
    if name is None:
        return None, "the file names no model"
    try:
        resolved = resolve_model(name, hub=HubAccess.from_env(offline=ask.offline))
        arch = arch_from_config(resolved.config)
    except SpecError as exc:
        if ask.model:
            raise
        return None, f"its model {name!r} could not be read ({' '.join(str(exc).split())})"  # whole: it holds the fix
    return FitTarget(model=resolved.name, arch=arch, gpu=find_gpu(gpu), seq_len=ask.seq_len or run.get("seq_len"),
                     mode=ask.mode or run.get("mode")), ""


def _run_of(path: Path) -> dict[str, object]:
    """A run's ``best/`` folder: the model, sequence length and mode its run's summary.json records."""
    from autotune.spec.files import load_json

    summary = path / ".." / "summary.json"
    if not path.is_dir() or path.name != "best" or not summary.is_file():
        return {}
    try:
        data = load_json(_read(summary), what="the run's summary.json")
    except (SpecError, OSError):
        return {}
    out = {k: data.get(k) for k in ("model", "seq_len", "mode")} if isinstance(data, dict) else {}
    ok = {"model": str, "seq_len": int, "mode": str}
    return {k: v for k, v in out.items() if isinstance(v, ok[k]) and not isinstance(v, bool)}


@dataclass(frozen=True)
class FitAsk:
    """``check``'s options for judging memory on ``--gpu``: the model, sequence length and mode over the file's."""

    model: str | None = None
    seq_len: int | None = None
    mode: str | None = None
    offline: bool = False


def command(
    config: Path = typer.Argument(
        ..., help="A training config (TrainingArguments or TRL SFTConfig / trl sft --config JSON or YAML, Axolotl or "
                  "LLaMA-Factory YAML), an accelerate or DeepSpeed config, or a run's best/ directory"
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    gpu: str = typer.Option(
        None, "--gpu", help="Target GPU (e.g. A10G, T4): judges bf16 / TF32 / FlashAttention, and the file's "
                            "predicted memory and micro-batch there for the model it names (or --model)."
    ),
    fmt: str = typer.Option(
        None, "--format", help=f"The file's format ({', '.join(FORMATS)}); default: detected from its keys."
    ),
    model: str = typer.Option(
        None, "--model", "-m", help="With --gpu: the model (preset, directory, or hub id), over the one the file names."
    ),
    seq_len: int = typer.Option(
        None, "--seq-len", help=f"With --gpu: tokens per sequence, over the file's (default {DEFAULT_FIT_SEQ_LEN})."
    ),
    mode: str = typer.Option(None, "--mode", help="With --gpu: full | lora | qlora, over what the file shows."),
    offline: bool = typer.Option(False, "--offline", help="Never contact the Hub for the model's config.json."),
) -> None:
    """Check a configuration against the fine-tuning checklist (exit 1 when an item fails)."""
    bundle = bundle_from_file(config, fmt) if fmt and not config.is_dir() else load_bundle(config)
    info = gpu_info(gpu) if gpu else None
    target, unjudged = fit_target(bundle, gpu, FitAsk(model=model, seq_len=seq_len, mode=mode, offline=offline))
    fields, version = training_fields()
    if bundle.fmt == "trl":
        fields = sft_fields() or fields
    enums = training_enums() if bundle.fmt in ENUMS_JUDGED else None  # (a parse of transformers' sources)
    report = gather(bundle, gpu=info, fields=fields, transformers_version=version, target=target, unjudged=unjudged,
                    enums=enums)
    if json_out:
        typer.echo(dumps_json(report.to_dict(), indent=2))
    else:
        typer.echo(render_text(report), nl=False)
    raise typer.Exit(report.exit_code)
