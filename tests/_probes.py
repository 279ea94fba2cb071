"""Real CPU probes forked from one warm server per test process (``autotune.executors.warm``), as ``autotune run``
makes them on a CPU: the same probe as a fresh process (tests/test_warm.py, benchmarks/warm_start.py) without
its ~4 s of imports. Tests about the fresh process itself (its timeout, a crashing interpreter, the thread count
it inherits) call ``run_probe_process`` directly; a request whose environment differs starts fresh anyway.
"""

from __future__ import annotations

import atexit
from typing import Any

from autotune.executors.local import LocalExecutor, run_probe_process
from autotune.executors.warm import WarmStarter
from autotune.spec.probe_request import ProbeRequest
from autotune.spec.result import ProbeResult

_WARM: WarmStarter | None = None
# pytest sets this variable anew for every test (and each of its phases); the server compares a probe's
# environment with its own and, where they differ, starts a server of the new one (at most three times, then every
# probe starts fresh), so with it the suite's probes forked from a warm server for its first tests only
_PER_TEST_ENV = "PYTEST_CURRENT_TEST"


class _SuiteWarmStarter(WarmStarter):
    """The warm server a run uses, for probes whose environments differ only by the test that asks."""

    def start(self, argv: list[str], env: dict[str, str], *args: Any, **kw: Any) -> Any:
        return super().start(argv, {k: v for k, v in env.items() if k != _PER_TEST_ENV}, *args, **kw)


def _server() -> WarmStarter:
    global _WARM
    if _WARM is None:
        _WARM = _SuiteWarmStarter()
        atexit.register(_WARM.close)
    return _WARM


def probe(request: ProbeRequest, **kw: Any) -> ProbeResult:
    """``run_probe_process(request, warm=<this process's server>)``."""
    return run_probe_process(request, warm=_server(), **kw)


class Executor(LocalExecutor):
    """``LocalExecutor(slots, warm=True)`` (the pool ``autotune run`` uses on a CPU) on this process's server, which
    outlives it."""

    def __init__(self, slots: int = 1) -> None:
        super().__init__(slots)
        self.warm = _server()

    def close(self) -> None:
        self.warm = None  # the server is this process's, not the executor's
        super().close()
