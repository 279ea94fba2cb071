"""The reaper: every process an embedded Ray runtime started dies with the process that started it.

Ray's own fate-sharing takes the GCS and the raylet down with the driver, but not everything: after a
``kill -9`` of the driver, ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` stay (about 170 MB;
they ignore SIGTERM), and so would a probe running in a Ray worker.

So before the embedded runtime starts, the driver puts a unique marker in its environment
(``AUTOTUNE_REAP=<pid>-<random>``): every process Ray starts inherits it, down to the probes. It also
starts this reaper (``python -I .../_reaper.py MARKER [DIR]``) in a session of its own,
with a pipe from the driver on its stdin. When the pipe closes (the driver closed the pool, exited,
or was killed, however), or when the reaper itself gets a SIGTERM (a job's stop signals every process
of the job), the reaper SIGTERMs, then SIGKILLs, every process whose environment
carries the marker, or whose command line, working folder or open files lie in ``DIR`` (the
runtime's private temporary folder: the agents rewrite their environment area with their process
title), removes ``DIR`` and exits.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["MARKER_VAR", "Reaper", "marked_pids", "sweep"]

MARKER_VAR = "AUTOTUNE_REAP"
_TERM_GRACE_S = 2.0


def marked_pids(marker: str, private_dir: str | None = None) -> list[int]:
    """Pids of the live processes (other than this one) that belong to the runtime being reaped.

    A process belongs when its environment carries ``marker``, or, for the processes that rewrite
    their environment area to set their title (``ray::DashboardAgent``), when its command line, its
    working folder or one of its open files lies in ``private_dir``.
    """
    needle = f"{MARKER_VAR}={marker}".encode()
    prefix = os.path.join(private_dir, "") if private_dir else None
    spared = {os.getpid(), _driver_pid(marker)}  # never the driver itself: it has files in there too
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                out.append(int(entry.name))
                continue
            if prefix is None:
                continue
            if prefix.encode() in (entry / "cmdline").read_bytes():
                out.append(int(entry.name))
                continue
            links = [entry / "cwd", *(entry / "fd").iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        for link in links:
            try:
                if os.readlink(link).startswith(prefix):
                    out.append(int(entry.name))
                    break
            except OSError:
                continue
    return out


def _driver_pid(marker: str) -> int:
    """The pid of the driver, the first part of its marker (``<pid>-<random>``)."""
    try:
        return int(marker.split("-", 1)[0])
    except ValueError:
        return -1


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def sweep(marker: str, private_dir: str | None = None) -> int:
    """SIGTERM every process of the runtime, SIGKILL what is left after a grace; the number found."""
    found: set[int] = set()
    for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGKILL):
        pids = [p for p in marked_pids(marker, private_dir) if _alive(p)]
        if not pids:
            break
        found.update(pids)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (_TERM_GRACE_S if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
    return len(found)


class Reaper:
    """The driver's side: the marker in ``os.environ`` and the reaper process holding the other pipe end."""

    def __init__(self, cleanup_dir: str | None = None) -> None:
        self.marker = f"{os.getpid()}-{secrets.token_hex(8)}"
        self._saved = os.environ.get(MARKER_VAR)
        env = {k: v for k, v in os.environ.items() if k != MARKER_VAR}
        self._proc: subprocess.Popen[bytes] | None = None
        if not sys.platform.startswith("linux"):  # /proc is how it finds the processes
            return
        self._proc = subprocess.Popen(
            # by path, not -m: the reaper needs only the standard library, whatever sys.path holds
            [sys.executable, "-I", os.path.abspath(__file__), self.marker, *([cleanup_dir] if cleanup_dir else [])],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True, close_fds=True,
        )
        os.environ[MARKER_VAR] = self.marker

    def release(self, timeout: float = 15.0) -> None:
        """Close the pipe: the reaper sweeps (the runtime was shut down already) and exits."""
        if self._saved is None:
            os.environ.pop(MARKER_VAR, None)
        else:
            os.environ[MARKER_VAR] = self._saved
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            pass


class _Terminated(Exception):
    """SIGTERM reached the reaper: reap now instead of dying with the work undone."""


def _terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the sweep short
    raise _Terminated


def main(argv: list[str]) -> int:
    marker = argv[0]
    cleanup_dir = argv[1] if len(argv) > 1 else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the driver must not stop the reaper
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Slurm (scancel, a job's time limit) and systemd send SIGTERM to every process of the job, this one
    # included, and SIGKILL only after a grace (Slurm's KillWait, 30 s by default): the reaper uses it to
    # sweep and remove the folder, which nobody would do once it had died of the SIGTERM
    signal.signal(signal.SIGTERM, _terminated)
    try:
        while sys.stdin.buffer.read(4096):  # nothing is ever written: this returns at EOF
            pass
    except (OSError, _Terminated):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sweep(marker, cleanup_dir)
    if cleanup_dir:
        shutil.rmtree(cleanup_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
