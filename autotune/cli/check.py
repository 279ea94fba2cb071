"""``autotune check CONFIG``: the notes' checklist over a TrainingArguments / TRL SFTConfig JSON or
YAML, an Axolotl or LLaMA-Factory YAML, an accelerate YAML, a DeepSpeed JSON, or a run's ``best/``
directory, in the file's own vocabulary. Exit 0 when nothing fails, 1 when an item fails, 2 when the
input cannot be read."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from autotune.check import CONFIG_FILE_KINDS, ConfigBundle, bundle_from_texts, gather, gpu_info, render_text
from autotune.cli.render import dumps_json
from autotune.env import sft_fields, training_fields
from autotune.errors import SpecError
from autotune.formats import FORMATS, key_source_label, known_keys, read_config

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
        for kind in ("training_args", "accelerate"):  # the files they name (a best/ folder moved elsewhere)
            if isinstance(b.data.get(kind), dict):
                _check_references(path / b.sources[kind], b, kind, b.data[kind])
        return b
    return bundle_from_file(path)


_KIND_WORDS = {"deepspeed": "a DeepSpeed JSON file", "dataset": "a dataset file or folder", "folder": "a folder"}


def _referenced(config: Path, value: str, kind: str) -> tuple[Path | None, str | None]:
    """(the file or folder ``value`` names, None) or (None, what is wrong with it). A relative path is looked
    for in the working directory, then beside the config (where the training tool may be started from)."""
    import stat

    raw = Path(value).expanduser()
    cands = [raw] if raw.is_absolute() else list(dict.fromkeys([raw, config.parent / raw]))
    wrong: str | None = None  # the first candidate that exists but is the wrong kind (another may be right)
    for cand in cands:
        try:
            mode = os.stat(cand).st_mode
        except OSError:
            continue
        ok = (stat.S_ISREG(mode) if kind == "deepspeed" else stat.S_ISDIR(mode) if kind == "folder"
              else stat.S_ISREG(mode) or stat.S_ISDIR(mode))
        if ok:
            return cand, None
        what = "a folder" if stat.S_ISDIR(mode) else "a device or a pipe" \
            if not stat.S_ISREG(mode) else "a file"
        wrong = wrong or f"{cand} is {what}, not {_KIND_WORDS[kind]}"
    if wrong is not None:
        return None, wrong
    where = str(raw) if raw.is_absolute() else f"in the working directory or beside {config.name}"
    return None, f"{value} does not exist ({where})"


def _check_references(path: Path, b: ConfigBundle, fmt: str, data: dict[str, object]) -> None:
    """Every local file the config names (``autotune.formats.file_references``): a missing one, or one that is
    not a regular file, is recorded for a FAIL naming the key; a DeepSpeed JSON that is there is read too."""
    from autotune.formats import file_references

    for key, value, kind in file_references(fmt, data):
        found, problem = _referenced(path, value, kind)
        b.references.append((path.name, key, value, problem))
        if found is not None and kind == "deepspeed" and "deepspeed" not in b.data:
            b.data["deepspeed"] = read_config(found.name, _read(found), fmt="deepspeed").data
            b.sources["deepspeed"] = found.name


def bundle_from_file(path: Path, fmt: str | None = None) -> ConfigBundle:
    """One config file in any known format, read in its own vocabulary (autotune.formats)."""
    text = _read(path)
    try:
        cfg = read_config(path.name, text, fmt=fmt)
    except SpecError:
        if fmt is not None or path.suffix.lower() in (".yaml", ".yml"):
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
    _check_references(path, b, cfg.format, cfg.data)
    return b


def command(
    config: Path = typer.Argument(
        ..., help="A training config (TrainingArguments or TRL SFTConfig / trl sft --config JSON or YAML, Axolotl or "
                  "LLaMA-Factory YAML), an accelerate or DeepSpeed config, or a run's best/ directory"
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    gpu: str = typer.Option(
        None, "--gpu", help="Target GPU (e.g. A10G, T4) to judge bf16 / TF32 / FlashAttention."
    ),
    fmt: str = typer.Option(
        None, "--format", help=f"The file's format ({', '.join(FORMATS)}); default: detected from its keys."
    ),
) -> None:
    """Check a configuration against the fine-tuning checklist (exit 1 when an item fails)."""
    bundle = bundle_from_file(config, fmt) if fmt and not config.is_dir() else load_bundle(config)
    info = gpu_info(gpu) if gpu else None
    fields, version = training_fields()
    if bundle.fmt == "trl":
        fields = sft_fields() or fields
    report = gather(bundle, gpu=info, fields=fields, transformers_version=version)
    if json_out:
        typer.echo(dumps_json(report.to_dict(), indent=2))
    else:
        typer.echo(render_text(report), nl=False)
    raise typer.Exit(report.exit_code)
