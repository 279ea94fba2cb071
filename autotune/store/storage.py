"""The Optuna storage, safe to share between runs started at the same moment.

Two ``autotune run`` on one SQLite file (``--storage sqlite:///shared.db``) race when Optuna
creates its tables: the loser fails with ``table studies already exists``. So the storage is
opened under an exclusive file lock (``<db>.lock``, ``fcntl.flock``) held only while the schema is
created or checked; afterwards, concurrent writers wait for SQLite's lock for up to
``SQLITE_BUSY_TIMEOUT_S`` instead of failing with ``database is locked`` after 5 s. Other URLs
(PostgreSQL, MySQL) are handed to Optuna unchanged: their servers do the locking.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["open_storage", "SQLITE_BUSY_TIMEOUT_S"]

SQLITE_BUSY_TIMEOUT_S = 120.0


def _sqlite_file(url: str) -> Path | None:
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    import fcntl

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def open_storage(url: str) -> Any:
    """An Optuna storage for ``url`` (an ``RDBStorage`` for a SQLite file; else ``url`` itself)."""
    db = _sqlite_file(url)
    if db is None:
        return url
    import optuna

    with _exclusive(db.with_name(db.name + ".lock")):
        return optuna.storages.RDBStorage(
            url, engine_kwargs={"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
        )
