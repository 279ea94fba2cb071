"""The load monitor: other processes' CPU, other GPU jobs, throttling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from autotune.executors.load import LoadMonitor


def test_cpu_arithmetic_subtracts_our_own_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    mon = LoadMonitor(device="cpu")
    clock = iter([100.0, 101.0, 102.0])
    system = iter([50.0, 51.8, 53.6])  # 1.8 cores busy each second
    own = iter([10.0, 11.0, 12.6])  # we used 1.0 then 1.6 of them
    monkeypatch.setattr("autotune.executors.load.time.monotonic", lambda: next(clock))
    monkeypatch.setattr("autotune.executors.load.psutil.cpu_times",
                        lambda: SimpleNamespace(user=next(system), nice=0.0, system=0.0))
    monkeypatch.setattr(mon, "_own_busy", lambda: next(own))
    assert mon.sample() is None
    assert mon.sample() == pytest.approx(0.8)
    assert mon.sample() == pytest.approx(0.2)


def _orphan_burner() -> int:
    """A CPU-burning process that is not a descendant of this one (as another user's job would be)."""
    out = subprocess.run(
        ["bash", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )
    return int(out.stdout.strip())


def test_another_process_burning_cpu_is_reported() -> None:
    pid = _orphan_burner()
    mon = LoadMonitor(device="cpu", interval_s=0.25).start()
    try:
        assert pid not in mon.own_pids()
        since = time.monotonic()
        time.sleep(2.0)
        found = mon.check("during", since)
    finally:
        mon.close()
        os.kill(pid, signal.SIGKILL)
    cpu = [f for f in found if f["kind"] == "cpu"]
    assert cpu, f"no CPU finding: {mon.samples}"
    assert cpu[0]["value"] >= 0.5 and "during the probe" in cpu[0]["message"]


class FakeNvml:
    def __init__(self, pids: list[int], util: int, reasons: int) -> None:
        self.pids, self.util, self.reasons = pids, util, reasons

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - NVML's names
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:  # noqa: N802
        return f"gpu{i}"

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list:  # noqa: N802
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in self.pids]

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=self.util)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:  # noqa: N802
        return self.reasons


def _gpu_kinds(mon: LoadMonitor, phase: str) -> dict[str, dict]:
    return {f["kind"]: f for f in mon._gpu_findings(phase)}


def test_gpu_other_jobs_busy_card_and_throttling_are_reported() -> None:
    other = 1  # init: visible, and never one of ours
    assert psutil.pid_exists(other)
    mon = LoadMonitor(device="cuda", nvml=FakeNvml([other], util=85, reasons=0x20 | 0x1))
    kinds = _gpu_kinds(mon, "before")
    assert set(kinds) == {"gpu_process", "gpu_busy", "gpu_throttle"}
    assert "software thermal" in kinds["gpu_throttle"]["message"]
    # our own process on the card: no "other job", and its utilisation is ours
    mine = LoadMonitor(device="cuda", nvml=FakeNvml([os.getpid()], util=99, reasons=0x4))
    assert _gpu_kinds(mine, "before") == {}  # 0x4 (power cap under load) is not noise


def test_gpu_pids_from_another_namespace_are_said_once() -> None:
    hidden = 2**22 + 12345  # above pid_max: no such process here
    assert not psutil.pid_exists(hidden)
    mon = LoadMonitor(device="cuda", nvml=FakeNvml([hidden], util=90, reasons=0))
    first = _gpu_kinds(mon, "before")
    assert set(first) == {"gpu_pids_hidden"}
    assert _gpu_kinds(mon, "before") == {}
