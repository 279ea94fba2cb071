"""Fake executor over a synthetic landscape (shared by the search and tune tests)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from autotune.spec.probe_request import Candidate, ProbeRequest
from autotune.spec.result import ProbeResult

GiB = 2**30


def synthetic(c: Candidate, seq_len: int = 512) -> tuple[int, float]:
    """(peak bytes, tokens/s): memory grows with micro-batch, checkpointing saves activations and
    costs ~25 % speed, bf16 halves activations and is faster, sdpa beats eager."""
    act = 1.0 * GiB * c.micro_batch * seq_len / 512
    if c.grad_ckpt:
        act *= 0.3
    if c.precision == "bf16":
        act *= 0.6
    peak = int(4 * GiB + act)
    speed = 1000.0 * (c.micro_batch ** 0.5)
    speed *= 0.75 if c.grad_ckpt else 1.0
    speed *= 1.3 if c.precision == "bf16" else 1.0
    speed *= 1.2 if c.attn == "sdpa" else 1.0
    speed *= 1.05 if c.packing else 1.0
    speed *= 1.0 + 0.02 * c.workers
    return peak, speed


class FakeExecutor:
    """Answers probes from a landscape function; records every request and the concurrency seen."""

    def __init__(
        self,
        landscape: Callable[[Candidate, int], tuple[int, float]] = synthetic,
        *,
        slots: int = 1,
        crash: Callable[[Candidate], str | None] | None = None,
        noise: Callable[[Candidate, int], float] | None = None,
    ) -> None:
        self._slots = slots
        self.landscape = landscape
        self.crash = crash
        self.noise = noise
        self.requests: list[ProbeRequest] = []
        self._pending: dict[str, ProbeRequest] = {}
        self._ids = itertools.count()
        self.max_concurrent = 0
        self.closed = False

    @property
    def slots(self) -> int:
        return self._slots

    def submit(self, request: ProbeRequest) -> str:
        ticket = f"t{next(self._ids)}"
        self.requests.append(request)
        self._pending[ticket] = request
        self.max_concurrent = max(self.max_concurrent, len(self._pending))
        return ticket

    def result_for(self, request: ProbeRequest) -> ProbeResult:
        c = request.candidate
        kind = self.crash(c) if self.crash else None
        if kind:
            return ProbeResult(status=kind, request=request.to_dict(), reason=f"fake {kind}")
        peak, speed = self.landscape(c, request.workload.seq_len)
        if self.noise is not None:
            speed *= self.noise(c, len(self.requests))
        usable = request.settings.usable_bytes()
        metrics = {"peak_mem_bytes": peak, "tokens_per_s": speed, "step_time_spread": 0.02, "wall_s": 3.0}
        if usable is not None and peak > usable:
            return ProbeResult(status="over_budget", request=request.to_dict(),
                               reason=f"peak {peak} > usable {usable}", metrics=metrics)
        return ProbeResult(status="ok", request=request.to_dict(), metrics=metrics)

    def poll(self, timeout: float | None = None) -> list[tuple[str, ProbeResult]]:
        # finish the oldest one (so several stay in flight while the searcher refills)
        if not self._pending:
            return []
        ticket = next(iter(self._pending))
        request = self._pending.pop(ticket)
        return [(ticket, self.result_for(request))]

    def pending(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        self.closed = True


def drain(executor: object, n: int, timeout: float = 120.0) -> dict[str, ProbeResult]:
    """Poll ``executor`` until ``n`` results have landed (or ``timeout`` seconds): {ticket: result}."""
    import time

    got: dict[str, ProbeResult] = {}
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got.update(executor.poll(timeout=5.0))  # type: ignore[attr-defined]
    return got
