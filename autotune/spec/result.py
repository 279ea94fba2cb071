"""The outcome of one probe, as plain JSON-serialisable data.  [pure: no torch here]"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.spec.probe_request import STATUSES, ProbeRequest

__all__ = ["ProbeResult"]


@dataclass
class ProbeResult:
    """Status is one of ``ok | oom | over_budget | unsupported | timeout | crash``.

    ``metrics`` holds what was measured (possibly partial for a failed probe):
    tokens_per_s (real tokens only), samples_per_s, step_time_median_s, step_time_p10_s,
    step_time_p90_s, step_time_spread, step_times_s, real_tokens, token_slots, padding_fraction,
    loss_first, loss_last, losses, peak_mem_bytes (the figure compared with the budget),
    mem_torch_reserved_bytes, mem_torch_allocated_bytes, mem_nvml_process_bytes,
    mem_rss_growth_bytes, overhead_s (launch to first timed step), wall_s, data_wait_fraction,
    num_params, trainable_params, budget_bytes, usable_bytes.
    """

    status: str
    request: dict[str, Any]
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def died(self) -> bool:
        """A crash of the probe's process itself (killed by a signal, the kernel's out-of-memory killer, an
        exit without a result: the executors record its ``exit_code``), not an error the probe classified:
        often the machine's doing rather than the configuration's, so worth one more try."""
        return self.status == "crash" and "exit_code" in self.metrics

    @property
    def fits(self) -> bool:
        """Measured and within budget (the only status a search may choose)."""
        return self.status == "ok"

    @property
    def tokens_per_s(self) -> float | None:
        v = self.metrics.get("tokens_per_s")
        return float(v) if v is not None else None

    @property
    def peak_mem_bytes(self) -> int | None:
        v = self.metrics.get("peak_mem_bytes")
        return int(v) if v is not None else None

    def probe_request(self) -> ProbeRequest:
        return ProbeRequest.from_dict(self.request)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        return cls(
            status=data["status"],
            request=data["request"],
            reason=data.get("reason", ""),
            metrics=dict(data.get("metrics", {})),
            env=dict(data.get("env", {})),
        )
