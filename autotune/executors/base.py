"""The executor protocol: where probes run. One protocol, several backends.  [pure]

``submit`` queues a probe and returns a ticket; ``poll`` blocks until at least one submitted probe
has finished (or ``timeout`` passes) and returns the finished ones. A probe's failure (OOM,
timeout, crash, lost worker) is a ProbeResult with that status, never an exception.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from autotune.spec.probe_request import ProbeRequest
from autotune.spec.result import ProbeResult

__all__ = ["Executor", "run_one"]


@runtime_checkable
class Executor(Protocol):
    @property
    def slots(self) -> int:
        """How many probes may run at once."""
        ...

    def submit(self, request: ProbeRequest) -> str: ...

    def poll(self, timeout: float | None = None) -> list[tuple[str, ProbeResult]]: ...

    def pending(self) -> int: ...

    def close(self) -> None: ...


def run_one(executor: Executor, request: ProbeRequest) -> ProbeResult:
    """Submit one probe and wait for it."""
    ticket = executor.submit(request)
    while True:
        for done_ticket, result in executor.poll(timeout=None):
            if done_ticket == ticket:
                return result
