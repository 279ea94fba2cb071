"""The Optuna storage, safe to share between runs started at the same moment.

Two ``autotune run`` on one SQLite file (``--storage sqlite:///shared.db``) race when Optuna
creates its tables: the loser fails with ``table studies already exists``. So the storage is
opened under an exclusive file lock (``<db>.lock``, ``fcntl.flock``) held only while the schema is
created or checked; afterwards, concurrent writers wait for SQLite's lock for up to
``SQLITE_BUSY_TIMEOUT_S`` instead of failing with ``database is locked`` after 5 s. Other URLs
(PostgreSQL, MySQL) are opened as they are: their servers do the locking. A URL that cannot work
is refused up front (``check_storage_url``), and one that cannot be opened is a SpecError.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.spec.redact import redact

__all__ = ["open_storage", "open_run_storage", "check_storage_url", "sqlite_damage", "storage_write_failure",
           "SQLITE_BUSY_TIMEOUT_S"]

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


def check_storage_url(url: str | None) -> None:
    """SpecError (naming the URL and the fix) for a ``--storage`` that cannot work; cheap, no connection.

    Refused: text that is not a SQLAlchemy URL, a scheme no installed SQLAlchemy dialect or driver
    knows, and a SQLite file whose folder is missing, not a folder or not writable.
    """
    if url is None:
        return
    hint = "use e.g. sqlite:////abs/path/study.db or postgresql://user@host/db"
    if not str(url).strip():
        raise SpecError(f"--storage is empty; {hint}")
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise SpecError(f"--storage {redact(url)!r} is not a database URL; {hint}") from None
    try:
        dialect = parsed.get_dialect()
        if _sqlite_file(str(url)) is None and hasattr(dialect, "import_dbapi"):
            dialect.import_dbapi()  # the driver itself (psycopg2, pymysql ...): missing is refused now, not later
    except ArgumentError:  # NoSuchModuleError
        raise SpecError(f"--storage {redact(url)!r}: unknown database scheme {parsed.drivername!r}; {hint}") from None
    except ImportError as exc:  # the dialect is known, its driver is not installed
        raise SpecError(f"--storage {redact(url)!r} needs a database driver that is not installed ({exc}); "
                        f"pip install it, or {hint}") from None
    db = _sqlite_file(str(url))
    if db is None:
        return
    folder = db.parent
    if db.is_dir():
        raise SpecError(f"--storage {redact(url)!r}: {db} is a folder, not a database file; {hint}")
    if not folder.is_dir():
        raise SpecError(f"--storage {redact(url)!r}: the folder {folder} does not exist or is not a folder; {hint}")
    if not os.access(folder, os.W_OK | os.X_OK) or (db.exists() and not os.access(db, os.R_OK | os.W_OK)):
        raise SpecError(f"--storage {redact(url)!r}: {db} is not writable by this user; {hint}")


def open_storage(url: str) -> Any:
    """An Optuna ``RDBStorage`` for ``url`` (a SQLite file: opened under the schema lock).

    A storage that cannot be opened (an unwritable or damaged file, a server that does not answer)
    is a SpecError naming the URL, not a traceback.
    """
    import optuna

    db = _sqlite_file(url)
    try:
        if db is None:  # a server (or an in-memory SQLite): its own locking
            return optuna.storages.RDBStorage(url)
        with _exclusive(db.with_name(db.name + ".lock")):
            return optuna.storages.RDBStorage(
                url, engine_kwargs={"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
            )
    except Exception as exc:  # sqlalchemy/optuna/OS errors alike: the storage is unusable
        full = _disk_refusal(exc)
        if full is not None:  # a full or read-only disk: its reason, not the SQL statement it failed in
            raise SpecError(redact(f"could not open the Optuna storage {url!r}: {full}; free space (or give a "
                                   "writable --out / --storage) and rerun")) from None
        text = " ".join(str(exc).split())[:200]
        raise SpecError(redact(f"could not open the Optuna storage {url!r}: {type(exc).__name__}: {text}")) from None


def sqlite_damage(db: Path) -> str | None:
    """Why the SQLite file ``db`` is unusable (``PRAGMA quick_check``), or None when it is sound or absent."""
    import sqlite3

    if not db.exists() or db.stat().st_size == 0:
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=SQLITE_BUSY_TIMEOUT_S)
        try:
            rows = con.execute("PRAGMA quick_check").fetchall()
        finally:
            con.close()
    except sqlite3.Error as exc:
        return f"{type(exc).__name__}: {exc}"
    if rows != [("ok",)]:
        return "integrity check: " + "; ".join(str(r[0]) for r in rows[:3])
    return None


def open_run_storage(db: Path) -> tuple[Any, str | None]:
    """The run folder's own study (``db``), recovering a damaged file: (storage, note or None).

    A ``study.db`` that is not a database, fails SQLite's integrity check or cannot be opened is
    moved aside to ``study.db.damaged`` (never deleted) and a fresh one is made: the journal holds
    every probe result, and the search replays it into the new study. The note says so in one line.
    """
    url = f"sqlite:///{db.resolve()}"
    why = sqlite_damage(db)
    if why is None:
        try:
            return open_storage(url), None
        except SpecError as exc:
            why = str(exc)
    aside = db.with_name(db.name + ".damaged")
    n = 2
    while aside.exists():
        aside = db.with_name(f"{db.name}.damaged-{n}")
        n += 1
    os.replace(db, aside)
    for extra in ("-journal", "-wal", "-shm"):  # SQLite's side files belong to the damaged copy
        side = db.with_name(db.name + extra)
        if side.exists():
            os.replace(side, aside.with_name(aside.name + extra))
    return open_storage(url), f"{db.name} was damaged ({why[:160]}); moved to {aside.name} and rebuilt"


_DISK_WORDS = ("disk is full", "disk full", "disk i/o error", "readonly database", "read-only", "no space left",
               "unable to open database file")


def storage_write_failure(exc: BaseException) -> str | None:
    """A one-line reason when ``exc`` is the study's database refusing a write (disk full, read-only,
    I/O error), else None: a bug stays a bug. Optuna raises its own ``StorageInternalError`` from the
    database's error, so the chain of causes is read, not only ``exc``."""
    text = _disk_refusal(exc)
    return None if text is None else f"the Optuna study could not be written ({text})"


def _disk_refusal(exc: BaseException) -> str | None:
    """The database's own words when ``exc`` (or an error it was raised from) is a disk refusing a write."""
    import sqlite3

    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:  # pragma: no cover
        OperationalError = sqlite3.OperationalError  # type: ignore[misc,assignment]  # noqa: N806
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, (OperationalError, sqlite3.OperationalError)):
            orig = getattr(link, "orig", None) or link
            text = " ".join(str(orig).split())
            if any(w in text.lower() for w in _DISK_WORDS):
                return text[:160]
        link = link.__cause__ or link.__context__
    return None
