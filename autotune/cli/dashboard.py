"""``autotune dashboard RUN_DIR``: open the run's Optuna study in optuna-dashboard.

The study is the run's ``study.db`` (or the ``--storage`` URL the run recorded in ``summary.json``);
its name is the run id. optuna-dashboard is an optional extra (``pip install 'autotune[dashboard]'``);
it serves on 127.0.0.1 by default (``--host 0.0.0.0`` to share it) until Ctrl-C. A folder with no
study, or a missing extra, is one line on stderr and exit 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from autotune.errors import MissingDependencyError, SpecError

__all__ = ["command", "RunStudy", "run_study", "dashboard_app"]

INSTALL_HINT = "pip install 'autotune[dashboard]' (or pip install optuna-dashboard)"


@dataclass(frozen=True)
class RunStudy:
    """Where a run's study lives: the Optuna storage URL and the study's name (the run id)."""

    storage: str
    study_name: str | None
    run_dir: Path


def run_study(run_dir: str | Path) -> RunStudy:
    """The storage and study of ``run_dir``; SpecError (one line, with the fix) when it has none."""
    d = Path(run_dir).expanduser()
    if not d.is_dir():
        raise SpecError(f"run folder {str(d)!r} does not exist; pass a run folder, e.g. results/<run-id>/")
    search: dict[str, Any] = {}
    summary = d / "summary.json"
    if summary.is_file():
        try:
            search = dict(json.loads(summary.read_text(encoding="utf-8")).get("search") or {})
        except (OSError, ValueError, AttributeError):
            search = {}
    name = search.get("study_name") or d.name
    db = d / "study.db"
    if db.is_file() and db.stat().st_size > 0:
        from autotune.store.storage import sqlite_damage

        damage = sqlite_damage(db)
        if damage:
            raise SpecError(f"{db} is not a readable Optuna study ({' '.join(damage.split())[:160]}); "
                            "`autotune run ... --resume` with the same request rebuilds it from the run's journal")
        return RunStudy(storage=f"sqlite:///{db.resolve()}", study_name=name, run_dir=d)
    url = search.get("storage")
    if isinstance(url, str) and url and not url.startswith("sqlite:///"):
        return RunStudy(storage=url, study_name=name, run_dir=d)
    if isinstance(url, str) and url.startswith("sqlite:///") and Path(url[len("sqlite:///") :]).is_file():
        return RunStudy(storage=url, study_name=name, run_dir=d)
    raise SpecError(
        f"{d} holds no Optuna study (no study.db and no --storage recorded in summary.json); pass the folder "
        "an `autotune run` wrote, e.g. results/<run-id>/"
    )


def _import_dashboard() -> Any:
    try:
        import optuna_dashboard
    except ImportError:
        raise MissingDependencyError(f"autotune dashboard needs optuna-dashboard: {INSTALL_HINT}") from None
    return optuna_dashboard


def dashboard_app(study: RunStudy) -> Any:
    """optuna-dashboard's WSGI application over the run's storage (what ``command`` serves)."""
    return _import_dashboard().wsgi(study.storage)


def command(
    run_dir: Path = typer.Argument(..., help="A run folder written by `autotune run` (results/<run-id>/)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 to share it)."),
    port: int = typer.Option(8080, "--port", help="Port to listen on."),
) -> None:
    """Open the run's Optuna study (study.db) in optuna-dashboard: every probe, its parameters and attributes."""
    from autotune.spec.redact import redact

    study = run_study(run_dir)
    dash = _import_dashboard()
    if not 0 < port < 65536:
        raise SpecError(f"--port must be 1-65535, got {port}")
    typer.echo(
        f"optuna-dashboard on http://{host}:{port}/dashboard — study {study.study_name} in {redact(study.storage)} "
        "(Ctrl-C to stop)",
        err=True,
    )
    dash.run_server(study.storage, host=host, port=port)
