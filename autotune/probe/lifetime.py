"""A probe process never outlives the process that started it, nor its own deadline.

Three layers, because each covers a way the others fail:

* **parent-death signal** (Linux): ``die_with_parent`` is the ``preexec_fn`` of every probe and of
  every rank of a distributed probe. The kernel sends the child SIGKILL when its parent dies, however
  it dies: ``kill -9``, the OOM killer, ``timeout -s KILL``. (It is tied to the parent *thread* that
  started the child; autotune's probe threads live until their probe ends.)
* **its own deadline**: the worker knows its timeout. ``start_deadline`` kills the probe (and its
  process group when it leads one: data-loader workers, ranks) a grace period after the parent
  should have, so a parent that hangs or is stopped cannot leave it running either.
* **signal forwarding** in the parent: ``run_probe_process`` kills the probe's group on any exception
  while it waits (Ctrl-C), and the CLI turns SIGTERM/SIGHUP into the same path.

Imports nothing heavy: the parent side (``autotune.executors.local``) uses it too.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["DEADLINE_GRACE_S", "die_with_parent", "preexec_fn", "start_deadline"]

# how long after its timeout a probe kills itself, if its parent has not killed it already
DEADLINE_GRACE_S = 20.0
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        from ctypes import CDLL, c_int, c_ulong

        prctl = CDLL(None, use_errno=True).prctl
        prctl.restype = c_int
        prctl.argtypes = [c_int, c_ulong, c_ulong, c_ulong, c_ulong]
        return prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None


# resolved once in the parent: the child, between fork and exec, only calls it
_PRCTL = _load_prctl()


def die_with_parent() -> None:
    """In a freshly forked child: ask the kernel for SIGKILL when the parent dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def preexec_fn() -> Callable[[], None] | None:
    """``die_with_parent`` where the platform has it, else None (``Popen(preexec_fn=...)``)."""
    return die_with_parent if _PRCTL is not None else None


def start_deadline(seconds: float, *, what: str = "probe") -> threading.Thread | None:
    """Kill this process (and the process group it leads) ``seconds`` from now; a daemon thread.

    Call it only in a process of its own (a probe worker or launcher run as ``__main__``).
    """
    if seconds <= 0 or seconds != seconds:
        return None

    def expire() -> None:
        time.sleep(seconds)
        try:
            sys.stderr.write(f"autotune: {what} passed its own deadline ({seconds:.0f} s); killing it\n")
            sys.stderr.flush()
        except Exception:  # noqa: S110 - stderr may be gone; the kill must still happen
            pass
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    t = threading.Thread(target=expire, name="autotune-deadline", daemon=True)
    t.start()
    return t
