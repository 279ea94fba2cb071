"""``autotune schema``: the JSON Schema of ``summary.json`` and of ``autotune run --json``.

The committed copy is ``docs/summary.schema.json`` (``autotune schema > docs/summary.schema.json``
regenerates it; a test keeps the two equal).
"""

from __future__ import annotations

import json

import typer

from autotune.spec.summary import summary_json_schema

__all__ = ["command", "schema_text"]


def schema_text() -> str:
    return json.dumps(summary_json_schema(), indent=2, ensure_ascii=False) + "\n"


def command() -> None:
    """Print the JSON Schema of summary.json (what `autotune run --json` prints), versioned by schema_version."""
    typer.echo(schema_text(), nl=False)
