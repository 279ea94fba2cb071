"""The warm start: one process imports the probe's libraries once, and each CPU probe is forked from it.

A CPU probe of a small model spends about half its wall time importing torch, transformers, peft and
datasets (a tiny-llama probe on a 2-core machine: ~3.5 s of ~7 s). ``autotune.executors.warm`` starts
this module once per executor (``python -m autotune.probe.zygote``), with the environment every probe
of the run gets; it imports what ``autotune.probe.worker`` imports and then forks one child per probe.
Each child is a probe process like a fresh one, because:

* **it starts from the same state**: the parent has only imported modules (no model, no tensors, no
  thread pool started, no CUDA: it refuses to serve once torch's CUDA or a second Python thread is
  up); the child takes the probe's own environment (``TMPDIR``, the launch time), stdout/stderr
  files, working folder (the executor's, as a fresh process inherits it) and ``sys.argv``,
  gets back the SIGINT handler the server set aside, and then runs
  ``autotune.probe.worker.main`` as ``python -m autotune.probe.worker`` would. What is read from the
  environment at import time (the Hub's offline flags, OpenMP's thread count) was read from the same
  values: the executor only forks from a parent started with the probe's environment (TMPDIR and the
  launch time aside), starting another server (or, past a few, a fresh probe process) otherwise.
* **it is isolated as one**: its own session and process group (a timeout kills its data-loader
  workers too), a parent-death signal (the server dies with the executor's thread that started it,
  and a child with the server), the worker's own deadline, and the server kills every child's group
  when its command pipe closes.
* **its memory is measured the same way**: RSS growth over a baseline taken just before the model is
  built; the imported libraries are in the baseline in both cases.

Protocol (one JSON object per line): the server writes ``{"ready": ..., "import_s": ...}`` once, then
reads ``{"id", "argv", "env", "cwd", "stdout", "stderr"}`` and answers ``{"id", "pid"}`` (or
``{"id", "error"}``); when a child ends it writes ``{"exit": pid, "code": returncode}`` (negative: the
signal), as ``subprocess.Popen.returncode`` would say. CPU only in ``autotune run``: a GPU probe is still a
fresh process until ``benchmarks/warm_start.py --device cuda`` has measured forked CUDA probes against fresh ones
(the executor's ``WarmStarter(devices=...)`` opts in).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
from typing import Any

__all__ = ["PRELOAD", "preload", "serve"]

# what every single-process CPU probe imports before it measures anything (the worker's _begin and
# _preload_libraries, the data and collation modules, the RSS sampler)
PRELOAD = (
    "torch", "transformers", "transformers.trainer", "transformers.training_args", "accelerate", "peft",
    "datasets", "torch.utils.data", "torch.optim", "psutil",
    "autotune.probe.worker", "autotune.probe.data", "autotune.probe.collate", "autotune.probe.memory",
    "autotune.env",
)  # fmt: skip


def preload(model_path: str | None = None) -> float:
    """Import ``PRELOAD`` (and the modeling module of ``model_path``'s config); the seconds it took."""
    import importlib

    t0 = time.perf_counter()
    for name in PRELOAD:
        importlib.import_module(name)
    from autotune.probe.worker import import_modeling_module

    import_modeling_module(model_path)  # (never remote code: the server runs nothing a probe did not ask for)
    return time.perf_counter() - t0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_POPULATE_READ = 22  # Linux 5.14+


def resident_file_pages() -> list[tuple[int, int]]:
    """(address, pages) runs of this process's readable file-backed mappings that are resident now.

    A fork copies the page tables of anonymous memory only: the child maps the libraries' pages again
    on first touch, so without ``restore_residency`` its RSS baseline would lack ~130 MB of library
    pages a fresh probe process has by then, and its RSS growth would count them (tiny-llama: +8 %)."""
    import array

    runs: list[tuple[int, int]] = []
    try:
        with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
            for line in maps:
                parts = line.split()
                if len(parts) < 6 or parts[4] == "0" or parts[5].startswith("[") or "r" not in parts[1]:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                pagemap.seek(lo // _PAGE * 8)
                flags = array.array("Q")
                flags.frombytes(pagemap.read((hi - lo) // _PAGE * 8))
                start = None
                for i, v in enumerate(flags):
                    if v >> 63:  # present
                        start = i if start is None else start
                    elif start is not None:
                        runs.append((lo + start * _PAGE, i - start))
                        start = None
                if start is not None:
                    runs.append((lo + start * _PAGE, len(flags) - start))
    except OSError:  # no /proc: the child's baseline will lack them (the probe still runs)
        return []
    return runs


def restore_residency(runs: list[tuple[int, int]]) -> None:
    """Map ``runs`` into this (forked) process's page tables, as they were in the server's."""
    import ctypes

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for addr, pages in runs:
        if madvise(addr, pages * _PAGE, _MADV_POPULATE_READ) != 0:
            for i in range(pages):  # a kernel without MADV_POPULATE_READ: touch each page
                ctypes.string_at(addr + i * _PAGE, 1)


def _unsafe_to_fork() -> str | None:
    """Why forking a probe from this process would not give a clean one, or None."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads are running"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "torch has initialised CUDA"
    return None


def _child(cmd: dict[str, Any], control: tuple[int, ...], parent: int, started: int,
           resident: list[tuple[int, int]], sigint: Any) -> None:
    """In the forked child: become the probe process, run the worker, and never return.

    ``started``: a pipe's write end, closed once the child leads its own process group, so the
    server names the pid only when killing its group kills the child."""
    code = 1
    try:
        os.setsid()
        from autotune.probe.lifetime import die_with_parent

        die_with_parent()
        if os.getppid() != parent:  # the server died between fork and prctl
            os._exit(1)
        os.close(started)
        # the server changed SIGINT alone: every other disposition is the one a fresh interpreter started by
        # the executor has (SIGPIPE ignored, as Python sets it at start-up; SIGHUP as inherited)
        signal.signal(signal.SIGINT, sigint)
        for fd in control:
            os.close(fd)
        restore_residency(resident)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(cmd["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        err = os.open(cmd["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for src, dst in ((null, 0), (out, 1), (err, 2)):
            os.dup2(src, dst)
            os.close(src)
        os.chdir(cmd["cwd"])
        os.environ.clear()
        os.environ.update(cmd["env"])
        import tempfile

        tempfile.tempdir = None  # TMPDIR is the probe's own folder now
        from autotune.probe import worker

        sys.argv = [worker.__file__, *cmd["argv"]]
        code = worker.main(list(cmd["argv"]), own_process=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child must end here, never in the server's loop
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()  # what a fresh process's interpreter would run at exit
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(model_path: str | None = None) -> int:
    """The server's loop (``python -m autotune.probe.zygote [MODEL_PATH]``)."""
    sigint = signal.getsignal(signal.SIGINT)  # what a fresh interpreter would have: the children get it back
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the executor stops it (its own session besides)
    cmd_fd, reply_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # nothing a library prints may corrupt the replies
    os.close(null)
    reply = os.fdopen(reply_fd, "w", buffering=1)

    def say(obj: dict[str, Any]) -> None:
        reply.write(json.dumps(obj) + "\n")
        reply.flush()

    import_s = preload(model_path)
    resident = resident_file_pages()
    why_not = _unsafe_to_fork()
    say({"ready": why_not is None, "import_s": import_s, "why_not": why_not})
    children: set[int] = set()
    buf = b""
    try:
        while True:
            readable, _, _ = select.select([cmd_fd], [], [], 0.1)
            _reap(children, say)
            if not readable:
                continue
            chunk = os.read(cmd_fd, 65536)
            if not chunk:  # the executor closed the pipe (or died): end every probe, then ourselves
                return 0
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = json.loads(line)
                why = _unsafe_to_fork()
                if why is not None:
                    say({"id": cmd["id"], "error": why})
                    continue
                reply.flush()
                r, w = os.pipe()
                server = os.getpid()  # (the child compares its parent with this: the server may die meanwhile)
                pid = os.fork()
                if pid == 0:
                    os.close(r)
                    _child(cmd, (cmd_fd, reply_fd), server, w, resident, sigint)
                os.close(w)
                children.add(pid)
                ok, _, _ = select.select([r], [], [], 30.0)  # EOF: it leads its group (or it died)
                os.close(r)
                if not ok:
                    _kill(pid)
                    say({"id": cmd["id"], "error": "the forked probe did not start within 30 s"})
                    continue
                say({"id": cmd["id"], "pid": pid})
    finally:
        for pid in children:
            _kill(pid)
        _reap(children, say, block=True)


def _kill(pid: int) -> None:
    """SIGKILL a child's process group, and the child itself if it has not made its group yet."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _reap(children: set[int], say: Any, *, block: bool = False) -> None:
    """Collect ended children and report their exit codes."""
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        try:
            say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        except (OSError, ValueError):  # the executor is gone: nobody to tell
            pass


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1] if len(sys.argv) > 1 else None))
