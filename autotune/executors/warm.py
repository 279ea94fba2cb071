"""The executor's side of the warm start: CPU probes forked from a server that has imported their libraries.

``WarmStarter.start`` hands a single-process CPU probe to the server (``autotune.probe.zygote``, which
says why each child is still a clean, isolated probe process) and returns a handle that waits and is
killed like a ``subprocess.Popen``: its ``pid`` leads the probe's own process group. It returns None,
and the caller starts a fresh process as before, whenever a forked probe would not be the same
process: a server that could not start, refused to fork, or has died. A probe whose environment differs
from the server's (only ``TMPDIR`` and the launch time may) gets a new server of its environment while no
probe runs, ``_MAX_RESTARTS`` times at most; then it too starts fresh. A probe whose
server died under it is ``lost`` (the caller runs it again, fresh).

Imports nothing heavy: the server imports torch, this side never does.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

__all__ = ["PER_PROBE_ENV", "ForkedProbe", "WarmStarter"]

# what may differ between the server's environment and a probe's: each probe's own values
PER_PROBE_ENV = ("AUTOTUNE_LAUNCH_TIME", "TMPDIR")
# seconds the server may take to import the libraries (a loaded 2-core machine: ~4-15 s)
_READY_TIMEOUT_S = 300.0
_START_TIMEOUT_S = 60.0
# a probe whose environment differs from the server's gets a server of its own environment (an import in the
# caller's process may set a variable: DeepSpeed sets PYTORCH_NVML_BASED_CUDA_CHECK), at most this many times
_MAX_RESTARTS = 3


def _kill_child(pid: int) -> None:
    """SIGKILL a forked probe's group (it leads one from before its pid is reported)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


class ForkedProbe:
    """A probe process forked by the server: ``pid`` (its own group), ``wait``, ``poll``, ``returncode``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.lost = False  # the server died before reporting this probe's end
        self._ended = threading.Event()

    def _end(self, code: int | None, *, lost: bool = False) -> None:
        self.returncode, self.lost = code, lost
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(["autotune.probe.worker", str(self.pid)], timeout or 0.0)
        return self.returncode


class WarmStarter:
    """One warm server, started on the first probe; thread-safe. ``python``: the interpreter probes use.

    ``devices``: the probes' devices it forks. CPU only unless a caller opts in: a CUDA probe forked from
    the server (which never initialises CUDA; the child does) is measured against fresh ones by
    ``benchmarks/warm_start.py --device cuda`` (in ``benchmarks/gpu_check.sh``), and ``autotune run``
    forks GPU probes only once that measurement says they measure what fresh ones do."""

    def __init__(self, python: str | None = None, *, devices: tuple[str, ...] = ("cpu",)) -> None:
        self._python = python or sys.executable
        self.devices = frozenset(devices)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdin: IO[bytes] | None = None
        self._base: dict[str, str] | None = None
        self._err: IO[bytes] | None = None
        self.unavailable: str | None = None  # why it forks no more (None: it does, or has not started)
        self.import_s: float | None = None  # the server's one-off import time
        self._ids = itertools.count()
        self._replies: dict[int, tuple[threading.Event, list[Any]]] = {}  # id -> (answered, [reply, handle])
        self._abandoned: set[int] = set()  # starts whose caller stopped waiting: their child is killed
        self._children: dict[int, ForkedProbe] = {}
        self._ready = threading.Event()
        self._ready_msg: dict[str, Any] = {}
        self._generation = 0  # which server the reader thread's messages belong to
        self._launching: subprocess.Popen[bytes] | None = None  # a server whose imports _launch waits for
        self.restarts = 0

    # ------------------------------------------------------------------ probes

    def start(self, argv: list[str], env: dict[str, str], cwd: Path, stdout: Path, stderr: Path,
              *, model_path: str | None = None) -> ForkedProbe | None:
        """Fork ``python -m autotune.probe.worker *argv`` with ``env`` in ``cwd``; None: start it fresh."""
        base = {k: v for k, v in env.items() if k not in PER_PROBE_ENV}
        with self._lock:
            if self.unavailable is not None:
                return None
            if self._proc is not None and base != self._base:
                # never stop a server for this while a probe of it runs or is being forked
                if self._children or self._replies or self.restarts >= _MAX_RESTARTS:
                    return None
                self.restarts += 1
                self._retire()
            if self._proc is None and not self._launch(base, model_path):
                return None
            ident = next(self._ids)
            done: tuple[threading.Event, list[Any]] = (threading.Event(), [])
            self._replies[ident] = done
            cmd = {"id": ident, "argv": argv, "env": env, "cwd": str(cwd), "stdout": str(stdout),
                   "stderr": str(stderr)}  # fmt: skip
            try:
                assert self._stdin is not None
                self._stdin.write((json.dumps(cmd) + "\n").encode())
                self._stdin.flush()
            except (OSError, ValueError):
                self._replies.pop(ident, None)
                self._fail("its command pipe is closed")
                return None
        try:
            answered = done[0].wait(_START_TIMEOUT_S)
        except BaseException:  # interrupted while waiting: the child it may still fork is killed on arrival
            with self._lock:
                if self._replies.pop(ident, None) is not None:
                    self._abandoned.add(ident)
                elif len(done[1]) == 2:
                    _kill_child(done[1][1].pid)
            raise
        if not answered or len(done[1]) != 2:
            with self._lock:
                self._replies.pop(ident, None)
                if self.unavailable is None:
                    why = done[1][0].get("error") if done[1] else None
                    self._fail(f"it did not fork a probe ({why or f'no answer within {_START_TIMEOUT_S:g} s'})")
            return None
        return done[1][1]  # the handle the reader made when the pid arrived (it may have ended already)

    # ------------------------------------------------------------------ the server

    def _launch(self, base: dict[str, str], model_path: str | None) -> bool:
        """Start the server with ``base`` and wait for its imports; False (and ``unavailable``) if it cannot."""
        from autotune.probe.lifetime import preexec_fn

        argv = [self._python, "-m", "autotune.probe.zygote", *([model_path] if model_path else [])]
        try:
            # its stderr (the reason, if it cannot start) in an unlinked file: nothing to remove on any exit path
            self._err = tempfile.TemporaryFile()
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, env=base,
                start_new_session=True,  # no terminal signal reaches it: the executor stops it
                preexec_fn=preexec_fn(),  # and it dies with the thread that started it
            )  # fmt: skip
            self._base, self._stdin = base, self._proc.stdin
            threading.Thread(target=self._read, args=(self._proc.stdout, self._generation, self._ready),
                             name="autotune-warm", daemon=True).start()
        except (OSError, RuntimeError, ValueError) as exc:  # no server: the probes start fresh
            self._fail(f"it could not start ({exc})")
            return False
        self._launching = self._proc  # close() may kill it meanwhile, without the lock
        try:
            ready = self._ready.wait(_READY_TIMEOUT_S)
        finally:
            self._launching = None
        if self.unavailable == "closed":
            self._stop_server()
            return False
        if not ready:
            self._fail(f"its imports took over {_READY_TIMEOUT_S:g} s")
            return False
        if not self._ready_msg.get("ready"):
            self._fail(str(self._ready_msg.get("why_not") or f"it ended: {self._stderr_tail()}"))
            return False
        self.import_s = float(self._ready_msg.get("import_s") or 0.0)
        return True

    def _read(self, stream: IO[bytes] | None, generation: int, ready: threading.Event) -> None:
        """The server's replies, in order: ready, each fork's pid (or error), each child's exit."""
        assert stream is not None
        for raw in stream:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if "ready" in msg:  # _launch waits for it holding the lock
                self._ready_msg = msg
                ready.set()
                continue
            with self._lock:
                if generation != self._generation:  # a retired server's last words
                    continue
                if "id" in msg:
                    child = None
                    if "pid" in msg:
                        child = self._children[int(msg["pid"])] = ForkedProbe(int(msg["pid"]))
                    if int(msg["id"]) in self._abandoned:
                        self._abandoned.discard(int(msg["id"]))
                        if child is not None:
                            _kill_child(child.pid)
                    waiter = self._replies.pop(int(msg["id"]), None)
                    if waiter is not None:
                        waiter[1].extend([msg, child] if child is not None else [msg])
                        waiter[0].set()
                elif "exit" in msg:
                    child = self._children.pop(int(msg["exit"]), None)
                    if child is not None:
                        child._end(int(msg["code"]))
        ready.set()  # (before the lock: _launch may hold it, waiting for this)
        with self._lock:  # the server has ended: its children died with it (parent-death signal)
            if generation != self._generation:  # retired on purpose, with no probe running
                return
            self.unavailable = self.unavailable or "it has ended"
            for child in self._children.values():
                child._end(-signal.SIGKILL, lost=True)
            self._children.clear()
            for waiter in self._replies.values():
                waiter[0].set()

    def _stderr_tail(self) -> str:
        if self._err is None:
            return ""
        self._err.seek(0)
        lines = self._err.read().decode(errors="replace").strip().splitlines()
        return " / ".join(lines[-3:])

    def _retire(self) -> None:
        """Stop this server for one of another environment (no probe of it runs); the lock is held."""
        self._generation += 1
        self._stop_server()
        self._proc = self._stdin = None
        self._ready, self._ready_msg = threading.Event(), {}
        if self._err is not None:
            self._err.close()
            self._err = None

    def _fail(self, why: str) -> None:
        """Stop forking (callers start fresh processes from now on); the lock is held."""
        self.unavailable = self.unavailable or why
        self._stop_server()

    def _stop_server(self) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the server kills its children's groups and exits
        except OSError:
            pass
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()

    def close(self) -> None:
        """Stop the server (and any probe it still runs). Callers start no probe after it (``closed``)."""
        self.unavailable = "closed"
        launching = self._launching
        if launching is not None:  # _launch holds the lock while the server imports: end it at once
            try:
                os.killpg(launching.pid, signal.SIGKILL)
            except OSError:
                pass
        with self._lock:
            self.unavailable = self.unavailable or "closed"
            self._stop_server()
            if self._err is not None:
                self._err.close()
