"""Run probes as fresh local subprocesses with a hard timeout.

Every probe is a new ``python -m autotune.probe.worker`` process (a fresh CUDA context; nothing a
failed configuration did can leak into the next). A distributed candidate (world size > 1, or a
ZeRO/FSDP stage) runs ``python -m autotune.probe.launch`` instead, which starts one worker per rank
in its own process group and merges their results; the timeout kills the whole group, every rank
included. The parent never imports torch for this.
``LocalExecutor`` runs up to ``slots`` of them at once on threads; the Ray pool runs the same
``run_probe_process`` inside its tasks. With ``warm``, a single-process CPU probe is forked from a server
that has imported the libraries once instead (``autotune.executors.warm``: the same process, without
the imports), and starts fresh wherever it could not be the same.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from autotune.env import tail_lines
from autotune.executors.warm import ForkedProbe, WarmStarter
from autotune.spec.probe_request import ProbeRequest, alloc_conf_env
from autotune.spec.result import ProbeResult

__all__ = ["run_probe_process", "LocalExecutor", "worker_env"]

_STDERR_TAIL_LINES = 15
# seconds a worker gets after SIGTERM before SIGKILL
_KILL_GRACE_S = 3.0


def worker_env(request: ProbeRequest, launch_time: float) -> dict[str, str]:
    """The probe's environment: offline hub, no telemetry, threads for CPU probes, the CUDA allocator's setting."""
    env = dict(os.environ)
    env.update(
        {
            "AUTOTUNE_LAUNCH_TIME": repr(launch_time),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "WANDB_DISABLED": "true",
            "TRANSFORMERS_VERBOSITY": "error",
        }
    )
    threads = request.settings.cpu_threads
    if threads:
        # an explicit thread count is what the probe runs with, whatever OMP_NUM_THREADS says (the
        # worker sets torch's count to it too; the distributed launcher does the same per rank)
        env["OMP_NUM_THREADS"] = str(threads)
    elif request.settings.device == "cpu" and request.candidate.world_size > 1:
        # the ranks of a distributed CPU probe share the cores. A single-process probe sets none: it
        # runs with torch's default (the user's OMP_NUM_THREADS, else the cores this process may use),
        # as the emitted train.py does.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // request.candidate.world_size)))
    # the CUDA caching allocator's setting the emitted scripts set too (autotune.spec.probe_request.cuda_alloc_conf),
    # unless this environment sets one already
    env.update(alloc_conf_env(request.settings.cuda_alloc_conf, env))
    # No host-allocator tuning: the probe's timed window must run with the allocator the user's training
    # will have. (MALLOC_MMAP_THRESHOLD_=65536, set here before, made RSS follow the live tensors but
    # slowed CPU steps 1.7x and not alike for every candidate: STACK-NOTES "Allocator and CPU
    # throughput".) Peak memory on CPU is the peak RSS growth under glibc's defaults, which is what
    # the user's process will hold, heap retention included.
    return env


def _tail(path: Path, lines: int = _STDERR_TAIL_LINES) -> str:
    return tail_lines(path, lines)


def _stderr_tail(err_path: Path, res_path: Path) -> str:
    """The probe's stderr tail; for a distributed probe, each rank's (the launcher's own is quiet)."""
    parts = [_tail(err_path)]
    for rank_err in sorted(res_path.parent.glob(f"{res_path.name}.rank*.stderr")):
        tail = _tail(rank_err)
        if tail:
            parts.append(f"[{rank_err.name.rsplit('.', 2)[-2]}]\n{tail}")
    return "\n".join(p for p in parts if p)


def _kill_group(proc: subprocess.Popen[bytes] | ForkedProbe) -> None:
    """Stop the worker and anything it started (data-loader workers): TERM, then KILL."""
    try:
        # a forked probe leads its group from before its pid was reported (and its server, not this
        # process, reaps it: asking the kernel for the group of an ended pid could name another's)
        pgid = proc.pid if isinstance(proc, ForkedProbe) else os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):  # gone (or the id is no longer ours)
            return
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # the leader (a launcher) may be gone while its ranks linger in the group: KILL what is left,
    # and return only once the group is empty (SIGKILL is delivered asynchronously)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and _live_members(pgid):
        time.sleep(0.05)


def _live_members(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still alive (zombies awaiting their reaper do not count)."""
    import psutil

    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return False


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _temp_env(workdir: Path) -> dict[str, str]:
    """TMPDIR inside the probe's folder; torch's compile cache kept where it would be otherwise (shared)."""
    import getpass

    env = {"TMPDIR": str(workdir)}
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        try:
            user = getpass.getuser()
        except Exception:  # no user name (a container's uid): torch's own fallback
            user = "unknown"
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
    return env


def run_probe_process(
    request: ProbeRequest, *, python: str | None = None, live: set[Any] | None = None,
    extra_env: dict[str, str] | None = None, warm: WarmStarter | None = None,
) -> ProbeResult:
    """Measure one configuration in a fresh process. Never raises for a failed probe.

    The probe dies with this process (``autotune.probe.lifetime``): a parent-death signal, its own
    deadline, and, if waiting for it is interrupted (Ctrl-C, a SIGTERM turned into an exception),
    its whole process group is killed before the exception goes on. ``live`` (optional) holds the
    running probe while it runs, so an executor can kill it on close. ``extra_env`` is added to the
    probe's environment (benchmarks only: e.g. an allocator setting the estimator was fitted under; a run's
    probes take the CUDA allocator's setting from their request, ``ProbeSettings.cuda_alloc_conf``).
    ``warm``: fork a single-process probe on one of its devices (CPU unless the caller opted in) from this
    warm server (``autotune.executors.warm``) instead of starting a fresh interpreter, where it can; the
    result's ``env.start`` says which.
    """
    request.validate()
    req_dict = request.to_dict()
    workdir = _probe_workdir()
    req_path, res_path = workdir / "request.json", workdir / "result.json"
    err_path = workdir / "stderr.log"
    req_path.write_text(json.dumps(req_dict), encoding="utf-8")
    launch = time.time()
    timeout = float(request.settings.timeout_s)
    from autotune.probe.launch import is_distributed

    module = "autotune.probe.launch" if is_distributed(request.candidate) else "autotune.probe.worker"
    try:
        argv = [python or sys.executable, "-m", module, str(req_path), str(res_path)]
        # the launcher starts its ranks with the same interpreter
        argv += ["--python", python] if python and module.endswith("launch") else []
        env = {**worker_env(request, launch), **(extra_env or {}), **_temp_env(workdir)}
        forkable = warm is not None and module.endswith("worker") and request.settings.device in warm.devices
        code, timed_out, start = _run_and_wait(argv, env, workdir, timeout, live,
                                               warm=warm if forkable else None,
                                               model_path=request.workload.model_path)
        if start == "closed":
            return ProbeResult(status="crash", request=req_dict, metrics={},
                               reason="not run: the executor was closed before this probe started")
        if start == "lost" and warm is not None and warm.unavailable != "closed":
            # its warm server died under it (not the probe's doing): once more, fresh
            return run_probe_process(request, python=python, live=live, extra_env=extra_env, warm=warm)
        wall = time.time() - launch
        if timed_out:
            result = ProbeResult(
                status="timeout",
                request=req_dict,
                reason=f"no result after {timeout:g} s; the probe process was killed"
                + (f" (all {request.candidate.world_size} ranks)" if module.endswith("launch") else ""),
                metrics={"wall_s": wall},
                env={"stderr_tail": _stderr_tail(err_path, res_path)},
            )
        elif res_path.exists():
            result = _read_result(req_dict, res_path, err_path, wall)
        else:
            result = _no_result(req_dict, code, err_path, wall)
        if warm is not None:
            result.env["start"] = start
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


_WORKDIR_PREFIX = "autotune-probe-"
_OWNER_FILE = "owner"


def _probe_workdir() -> Path:
    """The probe's folder, and (TMPDIR) every temporary folder its worker makes (the Trainer's output
    folder): the caller removes it on every exit path, also when the worker was killed and ran no
    cleanup. A pool that may itself be killed names a folder its reaper removes (AUTOTUNE_PROBE_TMPDIR).
    Otherwise the folder names its owner, this process, and the folders of owners killed before they could
    remove theirs (``kill -9`` of ``autotune run``) are removed here, by the next probe on this machine."""
    base = os.environ.get("AUTOTUNE_PROBE_TMPDIR") or None
    if base is not None:
        os.makedirs(base, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX, dir=base))
    _remove_orphaned_workdirs(Path(tempfile.gettempdir()))
    workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
    (workdir / _OWNER_FILE).write_text(_owner(os.getpid()) or "", encoding="utf-8")
    return workdir


def _owner(pid: int) -> str | None:
    """What names a live process on this machine: host, pid namespace, pid and its start time (a pid is
    reused); None when no such process runs."""
    import socket

    import psutil

    try:
        created = psutil.Process(pid).create_time()
        namespace = os.stat("/proc/self/ns/pid").st_ino if os.path.exists("/proc/self/ns/pid") else 0
    except (psutil.Error, OSError):
        return None
    return f"{socket.gethostname()} {namespace} {pid} {created:.2f}"


def _remove_orphaned_workdirs(base: Path) -> None:
    """Remove the probe folders under ``base`` whose owner (same host and pid namespace, so a folder
    shared with another machine or container is never judged) no longer runs. A folder without a
    readable owner (being created, or from an older autotune) is left alone."""
    me = _owner(os.getpid())
    if me is None:
        return
    host_ns = me.rsplit(" ", 2)[0]
    for folder in base.glob(_WORKDIR_PREFIX + "*"):
        try:
            owner = (folder / _OWNER_FILE).read_text(encoding="utf-8")
        except OSError:
            continue
        parts = owner.rsplit(" ", 2)
        if len(parts) != 3 or parts[0] != host_ns or not parts[1].isdigit():
            continue
        if _owner(int(parts[1])) != owner:
            shutil.rmtree(folder, ignore_errors=True)


def _run_and_wait(
    argv: list[str], env: dict[str, str], workdir: Path, timeout: float,
    live: set[Any] | None, *, warm: WarmStarter | None = None, model_path: str | None = None,
) -> tuple[int | None, bool, str]:
    """Start the probe (output to ``workdir``'s stdout.log and stderr.log) and wait for it: (exit code,
    timed out, how it started: "fresh", "forked" or "lost"). On a timeout, or an interrupted wait, its
    whole process group is killed (the interruption re-raised)."""
    from autotune.probe.lifetime import preexec_fn

    with open(workdir / "stdout.log", "wb") as out, open(workdir / "stderr.log", "wb") as err:
        proc: subprocess.Popen[bytes] | ForkedProbe | None = None
        if warm is not None:
            # in this process's folder, where a fresh probe would run (a relative --dataset path resolves alike)
            proc = warm.start(argv[3:5], env, Path.cwd(), workdir / "stdout.log", workdir / "stderr.log",
                              model_path=model_path)
            if proc is None and warm.unavailable == "closed":
                return None, False, "closed"
        if proc is None:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own process group: a timeout kills data-loader workers too
                preexec_fn=preexec_fn(),  # and the kernel kills it if this process dies
            )
        start = "forked" if isinstance(proc, ForkedProbe) else "fresh"
        if live is not None:
            live.add(proc)
        try:
            code = proc.wait(timeout=timeout)
            if isinstance(proc, ForkedProbe) and proc.lost:
                _kill_group(proc)  # what it started (data-loader workers) goes before any rerun
                return code, False, "lost"
            return code, False, start
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return proc.returncode, True, start
        except BaseException:  # interrupted while waiting: the probe must not outlive the wait
            _kill_group(proc)
            raise
        finally:
            if live is not None:
                live.discard(proc)


def _read_result(req_dict: dict[str, Any], res_path: Path, err_path: Path, wall: float) -> ProbeResult:
    """The result the probe wrote, with its process's wall time; a crash if it cannot be read."""
    try:
        result = ProbeResult.from_dict(json.loads(res_path.read_text(encoding="utf-8")))
    except (ValueError, KeyError) as exc:
        return ProbeResult(
            status="crash",
            request=req_dict,
            reason=f"unreadable probe result ({exc})",
            metrics={"wall_s": wall},
            env={"stderr_tail": _tail(err_path)},
        )
    result.metrics.setdefault("wall_s", wall)
    result.metrics["process_wall_s"] = wall
    if result.status == "crash":
        # a distributed probe's launcher has put the failing rank's own stderr there already
        result.env.setdefault("stderr_tail", _tail(err_path))
    return result


def _no_result(req_dict: dict[str, Any], code: int | None, err_path: Path, wall: float) -> ProbeResult:
    """A crash: the probe process ended (exit code or signal ``code``) without writing a result."""
    how = f"killed by {_signal_name(code)}" if code is not None and code < 0 else f"exit code {code}"
    tail = _tail(err_path)
    reason = f"probe process {how} without a result"
    if code == -signal.SIGKILL and ("Killed" in tail or not tail):
        reason += " (SIGKILL: possibly the kernel's out-of-memory killer)"
    if tail:
        reason += f"; last stderr: {tail.splitlines()[-1][:300]}"
    return ProbeResult(
        status="crash",
        request=req_dict,
        reason=reason,
        metrics={"wall_s": wall, "exit_code": code},
        env={"stderr_tail": tail},
    )


class LocalExecutor:
    """Up to ``slots`` probes at once as local subprocesses (default one: a CPU probe uses all cores).

    ``warm``: fork single-process CPU probes from one warm server (``autotune.executors.warm``),
    started on the first probe and stopped by ``close``."""

    def __init__(self, slots: int = 1, *, python: str | None = None, warm: bool = False) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self._slots = slots
        self._python = python
        self.warm = WarmStarter(python) if warm else None
        self._ids = itertools.count()
        self._todo: queue.Queue[tuple[str, ProbeRequest] | None] = queue.Queue()
        self._done: queue.Queue[tuple[str, ProbeResult]] = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._live: set[Any] = set()
        self._threads = [
            threading.Thread(target=self._work, name=f"autotune-probe-{i}", daemon=True) for i in range(slots)
        ]
        for t in self._threads:
            t.start()

    @property
    def slots(self) -> int:
        return self._slots

    def _work(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            ticket, request = item
            try:
                result = run_probe_process(request, python=self._python, live=self._live, warm=self.warm)
            except Exception as exc:  # a bug in the executor itself must not stop the search
                result = ProbeResult(status="crash", request=request.to_dict(), reason=f"executor: {exc!r}")
            self._done.put((ticket, result))

    def submit(self, request: ProbeRequest) -> str:
        ticket = f"local-{next(self._ids)}"
        with self._lock:
            self._pending += 1
        self._todo.put((ticket, request))
        return ticket

    def poll(self, timeout: float | None = None) -> list[tuple[str, ProbeResult]]:
        out: list[tuple[str, ProbeResult]] = []
        try:
            out.append(self._done.get(timeout=timeout))
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            self._pending -= len(out)
        return out

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def close(self) -> None:
        """Stop the threads, and kill the probes still running (their whole process groups)."""
        for _ in self._threads:
            self._todo.put(None)
        for proc in list(self._live):
            _kill_group(proc)
        if self.warm is not None:
            self.warm.close()

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
