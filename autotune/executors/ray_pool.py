"""Run probes on a Ray pool: embedded (quiet, no dashboard) or on a cluster (``--ray-address``).

Each probe is a Ray task with ``max_calls=1`` (a fresh worker process) that calls
``autotune.executors.local.run_probe_process``: so a probe is still a fresh ``python -m
autotune.probe.worker`` process with a hard timeout, and Ray only decides *where* it runs and
reserves its GPUs (``num_gpus`` = GPUs per probe, or the candidate's world size if larger). Ray
sets ``CUDA_VISIBLE_DEVICES`` for the task; the probe process inherits it.

A lost worker (worker or node died, object lost) is retried once, then recorded as a ``crash``
result; an exception inside the task is a ``crash`` with its message. Neither raises: a probe's
failure is a result. ``ray`` is imported lazily (it is an optional part of the install on some
machines); without it, use ``LocalExecutor``.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from autotune.errors import MissingDependencyError, SpecError
from autotune.spec.probe_request import ProbeRequest
from autotune.spec.result import ProbeResult

__all__ = ["RayExecutor", "check_reachable", "import_ray"]

_OBJECT_STORE_BYTES = 100 * 2**20  # probes pass small JSON dicts; 30 % of RAM (the default) is waste
_LOST_WORKER_RETRIES = 1


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingDependencyError(
            "the Ray pool needs ray: pip install 'ray>=2.52' (or run with a LocalExecutor)"
        ) from exc
    return ray


def _probe_task(request_dict: dict[str, Any], probe_fn: Callable[[ProbeRequest], ProbeResult] | None) -> dict[str, Any]:
    """Body of the Ray task (runs in the Ray worker process, on whichever node Ray chose).

    The result says where it ran (``env``: ``ray_node_id``, ``hostname``, ``ray_worker_pid``), so
    a journal line shows which machine measured it.
    """
    request = ProbeRequest.from_dict(request_dict)
    _drop_rays_thread_default()
    if probe_fn is None:
        from autotune.executors.local import run_probe_process

        result = run_probe_process(request)
    else:
        result = probe_fn(request)
    result.env.update(_where())
    return result.to_dict()


def _drop_rays_thread_default() -> None:
    """Undo the OMP_NUM_THREADS Ray set for this task, so the probe gets torch's default threads.

    A Ray worker sets ``OMP_NUM_THREADS`` to the task's CPU count when its node's environment has
    none (``ray._private.utils.set_omp_num_threads_if_unset``): a probe reserving every logical CPU
    would then run with as many threads, while the emitted train.py runs with torch's default (the
    physical cores it may use). The node's own environment is its raylet's, this worker's parent:
    a value set there (by the user) is kept.
    """
    if "OMP_NUM_THREADS" not in os.environ:
        return
    try:
        import psutil

        node_env = psutil.Process(os.getppid()).environ()
    except Exception:  # cannot tell: leave it
        return
    if "OMP_NUM_THREADS" not in node_env:
        os.environ.pop("OMP_NUM_THREADS", None)


def _where() -> dict[str, Any]:
    where: dict[str, Any] = {"hostname": socket.gethostname(), "ray_worker_pid": os.getpid()}
    try:
        import ray

        where["ray_node_id"] = ray.get_runtime_context().get_node_id()
    except Exception:  # pragma: no cover - outside a Ray worker (a test calling the body directly)
        pass
    return where


def _alive_nodes(ray: Any) -> list[dict[str, float]]:
    """The resources of each alive node of the runtime (one entry for an embedded one)."""
    try:
        nodes = [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]
    except Exception:  # pragma: no cover - a Ray without the node table: the whole as one node
        nodes = []
    return nodes or [dict(ray.cluster_resources())]


class RayExecutor:
    """Executor over Ray tasks.

    ``address``: None starts Ray embedded in this process (or reuses one already initialised);
    otherwise ``ray://host:10001`` or ``host:6379`` of a running cluster, reached within
    ``connect_timeout_s`` or a SpecError. ``device``: ``cpu`` or ``cuda``. ``gpus``: GPU indices
    the embedded Ray may use (default: all it sees). ``cpus_per_probe``: CPUs reserved per probe
    (default on CPU: every core of the smallest node, so one probe per node at a time, since a
    probe uses every core of the machine it runs on). Slots and limits are counted per node: a
    probe runs on one node, ranks of a distributed probe included (``max_gpus_per_node``).
    ``probe_fn`` replaces ``run_probe_process`` (tests).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        device: str = "cuda",
        gpus_per_probe: int = 1,
        cpus_per_probe: int | None = None,
        gpus: list[int] | None = None,
        num_cpus: int | None = None,
        connect_timeout_s: float = 60.0,
        object_store_bytes: int = _OBJECT_STORE_BYTES,
        probe_fn: Callable[[ProbeRequest], ProbeResult] | None = None,
    ) -> None:
        if gpus_per_probe < 1:
            raise SpecError(f"gpus per probe must be >= 1; got {gpus_per_probe}")
        self._ray = ray = import_ray()
        self.device = device
        self.address = address
        self.gpus_per_probe = gpus_per_probe
        self._probe_fn = probe_fn
        self._started = False
        self._private: _PrivateRuntime | None = None
        self._restore_messages: Callable[[], None] | None = None
        if address is not None and ray.is_initialized():
            check_reachable(address, connect_timeout_s)  # a wrong address is an error even then
        if not ray.is_initialized():
            self._init(address, gpus=gpus, num_cpus=num_cpus, timeout=connect_timeout_s,
                       object_store_bytes=object_store_bytes)
            self._started = True
        # A probe runs on one node: what it may ask for, and how many run at once, are counted per
        # node (a cluster's totals would ask a CPU probe for every core of every node: no node has
        # them, and Ray would leave the task pending for ever).
        nodes = _alive_nodes(ray)
        where = f"the Ray cluster at {address}" if address else "this machine"
        node_cpus = [int(n.get("CPU", 0)) for n in nodes]
        node_gpus = [int(n.get("GPU", 0)) for n in nodes] if device == "cuda" else [0 for _ in nodes]
        self.total_cpus = max(1, sum(node_cpus))
        self.total_gpus = sum(node_gpus)
        #: the most GPUs one probe can have (a distributed probe's ranks run on one node)
        self.max_gpus_per_node = max(node_gpus, default=0)
        if device == "cuda" and self.total_gpus < 1:
            self.close()
            raise SpecError(f"device cuda was asked for, but {where} has no GPU visible to Ray")
        if device == "cuda" and self.max_gpus_per_node < gpus_per_probe:
            self.close()
            raise SpecError(f"{gpus_per_probe} GPUs per probe were asked for, but no node of {where} has more "
                            f"than {self.max_gpus_per_node}; lower --gpus-per-trial")
        if cpus_per_probe is None and device == "cpu":
            # a CPU probe uses every core of its node: reserve a whole node (the smallest, so that
            # every node can take one)
            cpus_per_probe = min((c for c in node_cpus if c >= 1), default=1)
        self.cpus_per_probe = cpus_per_probe or 1
        if not any(c >= self.cpus_per_probe for c in node_cpus):
            self.close()
            raise SpecError(f"{self.cpus_per_probe} CPUs per probe were asked for, but no node of {where} has "
                            f"that many (largest: {max(node_cpus, default=0)})")
        if device == "cuda":
            self._slots = max(1, sum(min(g // gpus_per_probe, c // self.cpus_per_probe)
                                     for g, c in zip(node_gpus, node_cpus, strict=True)))
        else:
            self._slots = max(1, sum(c // self.cpus_per_probe for c in node_cpus))
        self._remote = ray.remote(max_calls=1, max_retries=0)(_probe_task)
        self._ids = itertools.count()
        self._refs: dict[Any, tuple[str, ProbeRequest, int]] = {}  # ObjectRef -> (ticket, request, tries)

    # --------------------------------------------------------------- setup

    def _init(
        self, address: str | None, *, gpus: list[int] | None, num_cpus: int | None, timeout: float,
        object_store_bytes: int,
    ) -> None:
        ray = self._ray
        kwargs: dict[str, Any] = {
            "log_to_driver": False,
            "configure_logging": False,
            "logging_level": logging.ERROR,
        }
        if address is None:
            # private: bound to the loopback interface, token auth on whatever the environment says,
            # its own temporary folder, and every process it starts dies with this one
            self._private = _PrivateRuntime(ray)
            kwargs.update(
                include_dashboard=False,
                num_cpus=num_cpus or os.cpu_count() or 1,
                object_store_memory=object_store_bytes,
                _node_ip_address="127.0.0.1",
                _temp_dir=self._private.temp_dir,
            )
            if self.device == "cpu":
                kwargs["num_gpus"] = 0
            elif gpus is not None:
                kwargs["num_gpus"] = len(gpus)
        else:
            kwargs["address"] = address
        if address is not None:
            check_reachable(address, timeout)
        saved_cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if address is None and self.device == "cuda" and gpus is not None:
            # the embedded raylet reads the visible GPUs from its environment when it starts
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        # ray.init must run on the main thread (signal handlers, and its GCS connection failed from
        # a helper thread here); the bounded wait for a cluster is the TCP check above.
        auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
        saved_level = auth_log.level
        auth_log.setLevel(logging.ERROR)  # "token authentication is enabled" on every embedded start
        where = f"the Ray cluster at {address!r}" if address else "an embedded Ray runtime"
        self._restore_messages = _ray_messages_to_stderr()
        handlers = _python_signal_handlers()
        # an embedded runtime's processes start in a session of their own, out of this one's process group
        own_session = _runtime_in_its_own_session() if address is None else None
        try:
            ray.init(**kwargs)
            _reinstall(handlers)  # ray.init replaced them; the caller's decide how an interruption unwinds
        except Exception as exc:
            if self._private is not None:
                self._private.release()
                self._private = None
            if self._restore_messages is not None:
                self._restore_messages()
                self._restore_messages = None
            msg = " ".join(str(exc).split())[:300]
            raise SpecError(f"could not start or reach {where}: {type(exc).__name__}: {msg}") from exc
        finally:
            if own_session is not None:
                own_session()
            auth_log.setLevel(saved_level)
            if address is None and self.device == "cuda" and gpus is not None:
                if saved_cvd is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved_cvd

    # --------------------------------------------------------------- protocol

    @property
    def slots(self) -> int:
        return self._slots

    def _launch(self, request: ProbeRequest) -> Any:
        opts: dict[str, Any] = {"num_cpus": self.cpus_per_probe}
        if self.device == "cuda":
            opts["num_gpus"] = max(self.gpus_per_probe, request.candidate.world_size)
        else:
            opts["num_gpus"] = 0
        return self._remote.options(**opts).remote(request.to_dict(), self._probe_fn)

    def submit(self, request: ProbeRequest) -> str:
        ticket = f"ray-{next(self._ids)}"
        self._refs[self._launch(request)] = (ticket, request, 0)
        return ticket

    def _collect(self, ref: Any) -> tuple[str, ProbeResult] | None:
        """The result for a finished ref, or None when it was resubmitted after a lost worker."""
        ray = self._ray
        ticket, request, tries = self._refs.pop(ref)
        lost = (
            ray.exceptions.WorkerCrashedError,
            ray.exceptions.RayActorError,
            ray.exceptions.NodeDiedError,
            ray.exceptions.ObjectLostError,
            ray.exceptions.OwnerDiedError,
        )
        try:
            return ticket, ProbeResult.from_dict(ray.get(ref))
        except lost as exc:
            if tries < _LOST_WORKER_RETRIES:
                self._refs[self._launch(request)] = (ticket, request, tries + 1)
                return None
            reason = f"Ray worker lost twice ({type(exc).__name__}: {_first_line(exc)})"
        except ray.exceptions.TaskCancelledError:
            reason = "probe cancelled"
        except ray.exceptions.RayTaskError as exc:
            reason = f"probe task raised: {_first_line(exc.cause if getattr(exc, 'cause', None) else exc)}"
        except Exception as exc:  # anything else Ray may raise must not stop the search
            reason = f"Ray error: {type(exc).__name__}: {_first_line(exc)}"
        return ticket, ProbeResult(status="crash", request=request.to_dict(), reason=reason)

    def poll(self, timeout: float | None = None) -> list[tuple[str, ProbeResult]]:
        ray = self._ray
        out: list[tuple[str, ProbeResult]] = []
        if not self._refs:
            return out
        ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        if ready:
            more, _ = ray.wait([r for r in self._refs if r not in ready], num_returns=len(self._refs) - len(ready),
                               timeout=0)
            for ref in list(ready) + list(more):
                got = self._collect(ref)
                if got is not None:
                    out.append(got)
        return out

    def pending(self) -> int:
        return len(self._refs)

    def close(self) -> None:
        ray = self._ray
        for ref in list(getattr(self, "_refs", {})):
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        if hasattr(self, "_refs"):
            self._refs.clear()
        if self._started and ray.is_initialized():
            ray.shutdown()
            self._started = False
        if getattr(self, "_private", None) is not None:
            self._private.release()  # type: ignore[union-attr]
            self._private = None
        if getattr(self, "_restore_messages", None) is not None:
            self._restore_messages()  # type: ignore[misc]
            self._restore_messages = None

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _PrivateRuntime:
    """What an embedded Ray runtime needs to stay private to this process, and to die with it.

    * loopback only: Ray resolves ``127.0.0.1`` to the machine's address unless it runs in its
      single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read by Ray's constants): then
      the GCS, raylet, workers and agents all listen on 127.0.0.1;
    * token authentication on, even with ``RAY_AUTH_MODE=disabled`` in the user's environment, with
      a fresh token in a 0600 file in the runtime's own 0700 temporary folder
      (``RAY_AUTH_TOKEN_PATH``), so ``~/.ray/auth_token`` is neither read nor created;
    * the reaper (``autotune.executors._reaper``): every process the runtime starts dies with this
      one, ``kill -9`` included, and the temporary folder is removed;
    * probes at normal priority: Ray starts its workers at niceness 15 (its ``worker_niceness``
      config), and a probe inherits it, so on a machine where anything else runs it would measure a
      program starved far more than the user's training (niceness 0) would be.
      ``RAY_worker_niceness=0`` starts them as the user's training runs;
    * no task events (``RAY_task_events_report_interval_ms=0``): only Ray's dashboard and state API
      read them, and ``ray.shutdown`` waits up to 5 s to flush them to a GCS that may have died first
      (a signal to every process of a Slurm job or a systemd unit reaches the GCS too).

    The environment variables are set for the life of the pool (the runtime's processes inherit
    them) and restored by ``release``.
    """

    _ENV = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN",
            "RAY_worker_niceness", "RAY_task_events_report_interval_ms", "AUTOTUNE_PROBE_TMPDIR")

    def __init__(self, ray: Any) -> None:
        import secrets
        import tempfile

        from autotune.executors._reaper import Reaper

        self._saved = {k: os.environ.get(k) for k in self._ENV}
        self.temp_dir = tempfile.mkdtemp(prefix="atray-")  # short: Ray's socket paths must fit 107 bytes
        token_path = os.path.join(self.temp_dir, "auth_token")
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        os.environ.pop("RAY_AUTH_TOKEN", None)
        os.environ.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
                           "RAY_AUTH_TOKEN_PATH": token_path, "RAY_worker_niceness": "0",
                           "RAY_task_events_report_interval_ms": "0",
                           # the probes' folders inside this one, which the reaper removes on every exit path
                           # (a Ray worker killed with the driver never runs its own cleanup)
                           "AUTOTUNE_PROBE_TMPDIR": os.path.join(self.temp_dir, "probes")})
        self._constants = None
        try:  # already imported by now: its value was read when ray was imported
            from ray._private import ray_constants

            self._constants = ray_constants
            self._saved_cluster = ray_constants.ENABLE_RAY_CLUSTER
            ray_constants.ENABLE_RAY_CLUSTER = False
        except (ImportError, AttributeError):  # pragma: no cover - another ray layout
            pass
        _refresh_ray_auth()
        self.reaper = Reaper(cleanup_dir=self.temp_dir)

    def release(self) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self._constants is not None:
            self._constants.ENABLE_RAY_CLUSTER = self._saved_cluster
            self._constants = None
        _refresh_ray_auth()
        self.reaper.release()  # sweeps what the shutdown left and removes the temporary folder


_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def _python_signal_handlers() -> dict[int, Any]:
    """The Python handlers the caller installed (the CLI turns SIGTERM/SIGHUP into KeyboardInterrupt).

    ``ray.init`` replaces them: SIGTERM with ``sys.exit`` at the Python level, and its core worker
    puts a C-level failure handler on top ("*** SIGTERM received ..."), so ``autotune run`` killed
    by SIGTERM ended with exit 1 and skipped its own unwinding (probes stopped, pool closed, lock
    released). Only callables are kept: a default disposition stays Ray's choice.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    out: dict[int, Any] = {}
    for name in _SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        handler = signal.getsignal(sig)
        if callable(handler):
            out[int(sig)] = handler
    return out


def _reinstall(handlers: dict[int, Any]) -> None:
    import signal

    for sig, handler in handlers.items():
        try:
            signal.signal(sig, handler)
        except (ValueError, OSError):  # pragma: no cover - not the main thread after all
            pass


def _runtime_in_its_own_session() -> Callable[[], None] | None:
    """Start the processes ``ray.init`` starts (GCS, raylet, and through the raylet the agents and
    workers) in a session of their own, out of this process's process group; return the undo.

    ``timeout``, CI runners and Ctrl-C in a terminal signal the whole process group. A SIGTERM
    that reached the GCS with autotune left its unwinding (``ray.shutdown``) waiting on the
    dead GCS: about 9 s instead of 2 on an idle machine, past ``timeout -k 5``'s SIGKILL. Out of the
    group, a signal to it is a signal to autotune alone, which stops its probes and shuts the runtime
    down in order. (The runtime's processes die with autotune all the same: Ray's parent-death signal
    and the reaper, which is in a session of its own for the same reason; so are the probes.) None
    when this Ray starts its processes some other way (nothing to undo).
    """
    import subprocess

    try:
        from ray._private import services
    except ImportError:  # pragma: no cover - another ray layout
        return None
    original = getattr(services, "ConsolePopen", None)
    if not (isinstance(original, type) and issubclass(original, subprocess.Popen)) or os.name != "posix":
        return None

    class _OwnSession(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = _OwnSession

    def undo() -> None:
        if services.ConsolePopen is _OwnSession:
            services.ConsolePopen = original

    return undo


def _ray_messages_to_stderr() -> Callable[[], None] | None:
    """Send the messages Ray's driver prints about the cluster to stderr; return the undo.

    Ray's driver prints the cluster's error messages ("Raylet is terminated", "A worker died or was
    killed") on **stdout**, whatever ``log_to_driver`` says: a node lost mid-run would otherwise
    corrupt ``autotune run --json``, whose stdout is summary.json alone. None when this Ray has no
    such printer (nothing to undo).
    """
    try:
        from ray._private import worker as ray_worker
    except ImportError:  # pragma: no cover - another ray layout
        return None
    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "_autotune_to_stderr", False):
        return None

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    to_stderr._autotune_to_stderr = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = to_stderr

    def undo() -> None:
        if ray_worker.print_to_stdstream is to_stderr:
            ray_worker.print_to_stdstream = original

    return undo


def _refresh_ray_auth() -> None:
    """Make this process's Ray see the current RAY_AUTH_* variables (it caches them)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # pragma: no cover - a ray without token auth
        pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def _split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of ``ray://host:port`` or ``host:port``; None for ``auto`` and the like."""
    text = address.strip()
    if text.startswith("ray://"):
        text = text[len("ray://") :]
    if ":" not in text:
        return None
    host, _, port = text.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def check_reachable(address: str, timeout: float) -> None:
    """Bounded wait for the cluster's port to accept a connection, else a one-line SpecError.

    Without it an unreachable address leaves ``ray.init`` retrying for a minute and then
    terminating the whole process.
    """
    hp = _split_address(address)
    if hp is None:
        if address.strip() != "auto":
            raise SpecError(f"--ray-address {address!r} is not ray://HOST:PORT, HOST:PORT or auto")
        return
    host, port = hp
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(5.0, left))):
                return
        except OSError as exc:
            last = exc
        if time.monotonic() + 1.0 > deadline:
            break
        time.sleep(1.0)
    raise SpecError(
        f"could not reach the Ray cluster at {address!r} within {timeout:g} s ({last}); "
        "check --ray-address and that the head node is up"
    )
