"""Atomic file writes: write a temporary file in the same directory, fsync, then ``os.replace``.

A reader sees either the old file or the new one, never a half-written one; if anything fails
before the replace (serialisation included), the old file is left as it was.
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


def write_error(path: str | os.PathLike[str], exc: OSError) -> WriteError:
    """The one-line WriteError for an OSError met while writing ``path`` (disk full, read-only, ...)."""
    err = WriteError(f"could not write {path}: {exc.strerror or exc} (errno {exc.errno}); "
                     "the file was left as it was: free space or fix the permissions and retry")
    return err


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> Path:
    """Serialise ``obj`` first (a failure leaves ``path`` untouched), then write it atomically."""
    text = json.dumps(obj, indent=indent, sort_keys=False) + "\n"
    return write_text_atomic(path, text)
