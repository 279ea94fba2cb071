"""``autotune report RUN_DIR``: rebuild ``report.md`` and ``report.html`` from a finished (or
interrupted) run directory and print their paths. A bad RUN_DIR is one line on stderr, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import typer

__all__ = ["command"]


def command(
    run_dir: Path = typer.Argument(
        ..., help="A run directory: results/<run-id>/ (summary.json, journal.jsonl)."
    ),
    gpu: str | None = typer.Option(
        None,
        "--gpu",
        help="Catalog GPU the probes ran on, when the recorded device name is not in the catalog "
        "(for MFU and price), e.g. H100-SXM.",
    ),
) -> None:
    """Rebuild report.md and report.html (plots, diagnosis, MFU, cost) from a run directory."""
    from autotune.estimate.catalog import catalog_paths_from_env, find_gpu, load_catalog
    from autotune.report.build import write_reports

    card = None
    if gpu:
        extra = catalog_paths_from_env(os.environ)
        card = find_gpu(gpu, load_catalog(extra=extra) if extra else None)
    for path in write_reports(run_dir, gpu=card):
        typer.echo(str(path))
