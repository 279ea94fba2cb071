"""What the whole suite shares: a time limit per test, the client tier last with its venvs built in the
background while everything else runs, and session fixtures that several files read instead of each
building their own (see tests/README.md for the tiers and what each costs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# the client tier's first test may wait for its venvs to be built (about 12-16 minutes cold on 2 cores)
CLIENT_BUILD_TIMEOUT_S = 2400

_builders: list[subprocess.Popen[bytes]] = []


def _client_venvs_missing() -> list[str]:
    sys.path.insert(0, str(TESTS))
    import _clients

    return [name for name, client in _clients.CLIENTS.items()
            if not (_clients.venv_dir(client) / ".complete").exists()]


def pytest_configure(config: pytest.Config) -> None:
    """DeepSpeed's ops are this venv's (``tests/_build_ops.py``). Under pytest-xdist each worker's probes get
    their share of the cores (``OMP_NUM_THREADS``, which a probe and the emitted train.py both honour), unless
    the caller set it: two workers whose probes each take every core make OpenMP threads wait on each other,
    and the same probe tests took 2.6x as long (tests/README.md)."""
    sys.path.insert(0, str(TESTS))
    import _build_ops

    _build_ops.use_venv_ops_dir()  # DeepSpeed's ops where make setup built them (tests/_build_ops.py)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // int(workerinput.get("workercount", 1)))))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """The client tier runs last (its venvs build meanwhile) and gets the build's time limit."""
    clients = [it for it in items if it.get_closest_marker("clients")]
    if not clients:
        return
    rest = [it for it in items if not it.get_closest_marker("clients")]
    items[:] = rest + clients
    for it in clients:
        if it.get_closest_marker("timeout") is None:
            it.add_marker(pytest.mark.timeout(CLIENT_BUILD_TIMEOUT_S))


def _start_builders(*, stop_with_session: bool) -> None:
    """Start building the missing client venvs in the background, one builder per client (the downloads of
    one overlap the other's unpacking); the tier's fixtures wait on the build's lock (tests/_clients.py)."""
    missing = _client_venvs_missing()
    if not missing:
        return
    import _clients

    root = _clients.cache_root()
    root.mkdir(parents=True, exist_ok=True)
    for name in missing:
        with open(root / f"background-build-{name}.log", "ab") as out:
            builder = subprocess.Popen([sys.executable, str(TESTS / "_clients.py"), "build", name], stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        if stop_with_session:
            _builders.append(builder)


def pytest_sessionstart(session: pytest.Session) -> None:
    """``AUTOTUNE_CLIENTS_BUILD_EARLY=1`` (``make test``'s first phase, which runs no client test): start the
    missing client venvs' build now and leave it running for the second phase, whose client tier waits on
    it. Started once, by the controlling process (not by each pytest-xdist worker)."""
    if os.environ.get("AUTOTUNE_CLIENTS_BUILD_EARLY") != "1" or hasattr(session.config, "workerinput"):
        return
    if session.config.option.collectonly or os.environ.get("AUTOTUNE_NO_BACKGROUND_CLIENTS"):
        return
    _start_builders(stop_with_session=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the missing client venvs now, in the background, when the client tier is selected
    and other tests run first."""
    if session.config.option.collectonly or os.environ.get("AUTOTUNE_NO_BACKGROUND_CLIENTS"):
        return
    items = session.items
    if not any(it.get_closest_marker("clients") for it in items) or all(
            it.get_closest_marker("clients") for it in items):
        return
    _start_builders(stop_with_session=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A build still running when the session ends (stopped early by -x or Ctrl-C) is stopped with it; the
    next build starts over (tests/_clients.py removes a half-built venv)."""
    import signal

    for builder in _builders:
        if builder.poll() is not None:
            continue
        try:
            os.killpg(builder.pid, signal.SIGTERM)
            builder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(builder.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
