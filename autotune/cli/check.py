"""``autotune check CONFIG``: the notes' checklist over a TrainingArguments JSON, an accelerate YAML,
a DeepSpeed JSON, or a run's ``best/`` directory. Exit 0 when nothing fails, 1 when an item fails,
2 when the input cannot be read."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from autotune.check import bundle_from_texts, gather, gpu_info, render_text
from autotune.check._rules import _FILE_KIND, ConfigBundle
from autotune.errors import SpecError

__all__ = ["command", "load_bundle", "installed_training_fields"]


def _read(path: Path) -> str:
    from autotune.spec.files import read_text_file

    return read_text_file(path, what="config")


def load_bundle(path: Path) -> ConfigBundle:
    """Read one config file, or every known config file of a directory (e.g. a run's best/)."""
    if path.is_dir():
        texts = {name: _read(path / name) for name in _FILE_KIND if (path / name).is_file()}
        if not texts:
            raise SpecError(f"{str(path)!r} holds none of {', '.join(_FILE_KIND)}")
        return bundle_from_texts(str(path), texts, directory=True)
    return bundle_from_texts(str(path), {path.name: _read(path)}, directory=False)


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
) -> None:
    """Check a configuration against the fine-tuning checklist (exit 1 when an item fails)."""
    bundle = load_bundle(config)
    info = gpu_info(gpu) if gpu else None
    fields, version = installed_training_fields()
    report = gather(bundle, gpu=info, fields=fields, transformers_version=version)
    if json_out:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        typer.echo(render_text(report), nl=False)
    raise typer.Exit(report.exit_code)
