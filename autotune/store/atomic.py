"""Atomic file writes: write a temporary file in the same directory, fsync, then ``os.replace``.

A reader sees either the old file or the new one, never a half-written one; if anything fails
before the replace (serialisation included), the old file is left as it was. The new file gets the
permissions ``open(path, "w")`` would give it (the umask's, or the old file's), not ``mkstemp``'s
0600; an ``OSError`` (disk full, read-only) is a one-line ``WriteError``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from autotune.errors import WriteError

__all__ = ["write_text_atomic", "write_json_atomic", "write_error"]


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically (parent directories are created). Returns the path."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise write_error(path, exc) from exc
    try:
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise write_error(path, exc) from exc
        raise
    return path


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: the usual read-and-restore
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    """The permissions a plain ``open(path, "w")`` would give: the old file's, or 0666 less the umask.

    (``mkstemp`` makes its file 0600; results are shared files in pipelines, so that is not kept.)
    """
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def write_error(path: str | os.PathLike[str], exc: OSError) -> WriteError:
    """The one-line WriteError for an OSError met while writing ``path`` (disk full, read-only, ...)."""
    err = WriteError(f"could not write {path}: {exc.strerror or exc} (errno {exc.errno}); "
                     "the file was left as it was: free space or fix the permissions and retry")
    return err


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> Path:
    """Serialise ``obj`` first (a failure leaves ``path`` untouched), then write it atomically."""
    text = json.dumps(obj, indent=indent, sort_keys=False) + "\n"
    return write_text_atomic(path, text)
