"""``autotune check CONFIG``: the notes' checklist over a TrainingArguments / TRL SFTConfig JSON or
YAML, an Axolotl or LLaMA-Factory YAML, an accelerate YAML, a DeepSpeed JSON, or a run's ``best/``
directory, in the file's own vocabulary. Exit 0 when nothing fails, 1 when an item fails, 2 when the
input cannot be read."""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.check import CONFIG_FILE_KINDS, ConfigBundle, bundle_from_texts, gather, gpu_info, render_text
from autotune.cli.render import dumps_json
from autotune.errors import SpecError
from autotune.formats import FORMATS, key_source_label, known_keys, read_config

__all__ = ["command", "load_bundle", "bundle_from_file", "installed_training_fields", "installed_sft_fields"]


def _read(path: Path) -> str:
    from autotune.spec.files import read_text_file

    return read_text_file(path, what="config")


def load_bundle(path: Path) -> ConfigBundle:
    """Read one config file, or every known config file of a directory (e.g. a run's best/)."""
    if path.is_dir():
        texts = {name: _read(path / name) for name in CONFIG_FILE_KINDS if (path / name).is_file()}
        if not texts:
            raise SpecError(f"{str(path)!r} holds none of {', '.join(CONFIG_FILE_KINDS)}")
        return bundle_from_texts(str(path), texts, directory=True)
    return bundle_from_file(path)


def installed_sft_fields() -> set[str] | None:
    """The installed TRL SFTConfig's field names (None if trl is not installed)."""
    try:
        import dataclasses

        from trl import SFTConfig
    except Exception:
        return None
    return {f.name for f in dataclasses.fields(SFTConfig)}


def _linked_deepspeed(path: Path, value: object) -> Path | None:
    """A DeepSpeed JSON the config names by path (relative to the working directory or to the file)."""
    if not isinstance(value, str) or not value.endswith(".json"):
        return None
    for cand in (Path(value), path.parent / value):
        if cand.is_file():
            return cand
    return None


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
        ta_fields, _ = installed_training_fields()
        b.known_keys = known_keys(cfg.format, ta_fields=ta_fields, trl_fields=installed_sft_fields())
        b.key_source = key_source_label(cfg.format)
    ds_path = _linked_deepspeed(path, cfg.data.get("deepspeed"))
    if ds_path is not None and "deepspeed" not in b.data:
        b.data["deepspeed"] = read_config(ds_path.name, _read(ds_path), fmt="deepspeed").data
        b.sources["deepspeed"] = ds_path.name
    return b


def installed_training_fields() -> tuple[set[str] | None, str | None]:
    """The installed TrainingArguments' field names and transformers' version (None, None if absent)."""
    try:
        import dataclasses

        import transformers
        from transformers import TrainingArguments
    except Exception:  # transformers missing or broken: check names against the v5 table only
        return None, None
    return {f.name for f in dataclasses.fields(TrainingArguments)}, transformers.__version__


def command(
    config: Path = typer.Argument(
        ..., help="training_args.json, accelerate_config.yaml, deepspeed.json, or a run's best/ directory"
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
    fields, version = installed_training_fields()
    if bundle.fmt == "trl":
        fields = installed_sft_fields() or fields
    report = gather(bundle, gpu=info, fields=fields, transformers_version=version)
    if json_out:
        typer.echo(dumps_json(report.to_dict(), indent=2))
    else:
        typer.echo(render_text(report), nl=False)
    raise typer.Exit(report.exit_code)
