"""Atomic file writes: write a temporary file in the same directory, fsync, then ``os.replace``.

A reader sees either the old file or the new one, never a half-written one; if anything fails
before the replace (serialisation included), the old file is left as it was. The new file gets the
permissions ``open(path, "w")`` would give it (the umask's, or the old file's), not ``mkstemp``'s
0600; an ``OSError`` (disk full, read-only) is a one-line ``WriteError``. A path that is a symbolic
link or not a regular file (a device, a FIFO, a folder) is never written: ``os.replace`` would put a
regular file in its place (the link or device gone), so it is a ``WriteError`` instead.

``check_write_target`` refuses such a target up front (before a search whose answer it would hold),
``content_state`` and ``beside`` let a caller leave a file the user changed meanwhile untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from autotune.errors import WriteError

__all__ = ["beside", "check_write_target", "content_state", "new_file_mode", "target_problem", "write_text_atomic",
           "write_text_if_changed", "write_json_atomic", "write_error"]


def target_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be replaced by a regular file autotune writes, or None.

    A symbolic link (also a dangling one), a folder, a device, a FIFO or a socket is refused; so is
    a regular file without write permission (even for root: its mode says "do not change me"), and a
    parent that is not a folder or cannot be written."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return f"cannot be examined ({exc.strerror or exc})"
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            return "is a symbolic link (autotune does not write through links); name the real file"
        if stat.S_ISDIR(st.st_mode):
            return "is a folder; name a file"
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file (a device, pipe or socket); name a regular file"
        if not st.st_mode & 0o222 or not os.access(p, os.W_OK):
            return "is read-only; make it writable (chmod u+w) or name another file"
    parent = p.parent if str(p.parent) else Path(".")
    for up in (parent, *parent.parents):
        try:
            pst = os.stat(up)
        except FileNotFoundError:
            continue  # created when written
        except OSError as exc:
            return f"has a folder that cannot be examined ({exc.strerror or exc})"
        if not stat.S_ISDIR(pst.st_mode):
            return f"is under {str(up)!r}, which is not a folder"
        if not os.access(up, os.W_OK | os.X_OK):
            return f"is in {str(up)!r}, which cannot be written to"
        break
    return None


def check_write_target(path: str | os.PathLike[str], *, what: str) -> None:
    """SpecError (one line, exit 2) when ``path`` is not a file autotune may write (``target_problem``)."""
    from autotune.errors import SpecError

    why = target_problem(path)
    if why:
        raise SpecError(f"{what} {str(path)!r} {why}")


def content_state(path: str | os.PathLike[str] | None) -> str | None:
    """The sha256 of a regular file's content ("absent" when there is none), to tell later whether it changed."""
    if path is None:
        return None
    try:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"unreadable:{exc.errno}"


def beside(path: str | os.PathLike[str]) -> Path:
    """A free name next to ``path`` for the tuned copy: ``live.json`` -> ``live.tuned.json`` (``.tuned-2`` ...)."""
    p = Path(path)
    for n in range(1, 1000):
        tag = "tuned" if n == 1 else f"tuned-{n}"
        cand = p.with_name(f"{p.stem}.{tag}{p.suffix}")
        if not os.path.lexists(cand):
            return cand
    raise WriteError(f"could not find a free name beside {p}")


def write_text_if_changed(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`write_text_atomic`, unless ``path`` holds ``text`` already: nothing is written (a file another run
    wrote word for word, on a folder that may be read-only)."""
    path = Path(path)
    try:
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return path
    except (OSError, UnicodeDecodeError):
        pass
    return write_text_atomic(path, text)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically (parent directories are created). Returns the path.

    Never replaces a symbolic link or a non-regular file (WriteError)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise WriteError(f"could not write {path}: it is {kind}, which autotune does not replace; "
                         "the file was left as it was")
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


def new_file_mode(path: str | os.PathLike[str]) -> int:
    """The permissions :func:`write_text_atomic` gives ``path``, for a file written another way (streamed bytes):
    the old file's, or 0666 less the umask. ``os.fchmod`` the temporary file to it before ``os.replace``."""
    return _mode_for(Path(path))


def write_error(path: str | os.PathLike[str], exc: OSError) -> WriteError:
    """The one-line WriteError for an OSError met while writing ``path`` (disk full, read-only, ...)."""
    err = WriteError(f"could not write {path}: {exc.strerror or exc} (errno {exc.errno}); "
                     "the file was left as it was: free space or fix the permissions and retry")
    return err


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> Path:
    """Serialise ``obj`` first (a failure leaves ``path`` untouched), then write it atomically."""
    text = json.dumps(obj, indent=indent, sort_keys=False) + "\n"
    return write_text_atomic(path, text)
