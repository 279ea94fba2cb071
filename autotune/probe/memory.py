"""Peak-memory measurement inside the probe process.

CPU: peak RSS growth of this process over a baseline taken before the model is built, sampled by a
thread (and ``ru_maxrss`` at the end, which catches spikes between samples).
GPU: ``torch.cuda.max_memory_reserved`` (what the caching allocator held) and NVML's per-process
figure, which includes the CUDA context that torch does not count.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from autotune.env import usable_cores

__all__ = ["RssSampler", "NvmlSampler", "rusage_peak_bytes"]


def rusage_peak_bytes() -> int:
    """Peak RSS of this process so far (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class RssSampler:
    """Samples this process's RSS; calls ``on_exceed(growth)`` once if growth passes ``limit``."""

    def __init__(
        self,
        interval_s: float = 0.005,
        limit_bytes: int | None = None,
        on_exceed: Callable[[int], None] | None = None,
    ) -> None:
        self._proc = psutil.Process(os.getpid())
        self.interval_s = interval_s
        self.limit_bytes = limit_bytes
        self.on_exceed = on_exceed
        self.baseline = self._proc.memory_info().rss
        self.baseline_maxrss = rusage_peak_bytes()
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autotune-rss", daemon=True)
        self._fired = False
        # (perf_counter time, share of the available cores in use) every ~100 ms
        self.cpu_samples: list[tuple[float, float]] = []
        self._ncpu = usable_cores()

    def rebase(self) -> None:
        """Take the baseline now (just before the model is built)."""
        self.baseline = self._proc.memory_info().rss
        self.baseline_maxrss = rusage_peak_bytes()
        self.peak = max(self.peak, self.baseline)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        self._proc.cpu_percent(None)
        next_cpu = time.perf_counter() + 0.1
        while not self._stop.is_set():
            now = time.perf_counter()
            if now >= next_cpu:
                self.cpu_samples.append((now, self._proc.cpu_percent(None) / 100.0 / self._ncpu))
                next_cpu = now + 0.1
            rss = self._proc.memory_info().rss
            if rss > self.peak:
                self.peak = rss
            if (
                self.limit_bytes is not None
                and not self._fired
                and rss - self.baseline > self.limit_bytes
                and self.on_exceed is not None
            ):
                self._fired = True
                self.on_exceed(rss - self.baseline)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)

    def growth(self) -> int:
        """Peak RSS growth over the baseline, including spikes between samples."""
        peak = self.peak
        maxrss = rusage_peak_bytes()
        # ru_maxrss is a lifetime peak: only meaningful if it grew after the baseline was taken
        if maxrss > self.baseline_maxrss:
            peak = max(peak, maxrss)
        return max(0, peak - self.baseline)


class NvmlSampler:
    """Samples NVML memory for this process (and device utilisation) at about 10 Hz.

    Silently inactive without NVML (no driver, no library): figures are then ``None``. The three
    queries (this process's memory, the device's memory, utilisation) are independent: a driver
    that refuses one (per-process accounting is often unavailable in containers and VMs) loses
    that figure only, and ``query_errors`` says which failed and why.

    ``process_visible``: None while the process query has never answered; False when it answered
    but never listed this PID (in a PID namespace NVML reports the host's PIDs, so ours never
    matches and ``peak_process_bytes`` stays None: the caller must not claim an NVML figure);
    True once this process was seen.
    """

    def __init__(self, device_index: int = 0, interval_s: float = 0.1, *, nvml: Any = None) -> None:
        self.interval_s = interval_s
        self.peak_process_bytes: int | None = None
        self.peak_device_used_bytes: int | None = None
        self.process_visible: bool | None = None
        # the most compute processes NVML listed on the device at once (others' included)
        self.max_processes_listed = 0
        self.query_errors: dict[str, str] = {}
        # (perf_counter time, GPU utilisation %) pairs
        self.util_samples: list[tuple[float, int]] = []
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autotune-nvml", daemon=True)
        self._nvml = None
        self._handle = None
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            self._nvml = nvml
            self._handle = nvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception as exc:
            self.query_errors["init"] = repr(exc)[:200]
            self._nvml = None

    def _failed(self, what: str, exc: Exception) -> None:
        self.query_errors.setdefault(what, repr(exc)[:200])

    def sample_once(self) -> None:
        if self._nvml is None:
            return
        nv = self._nvml
        now = time.perf_counter()
        try:
            procs = list(nv.nvmlDeviceGetComputeRunningProcesses(self._handle))
        except Exception as exc:
            self._failed("processes", exc)
        else:
            self.max_processes_listed = max(self.max_processes_listed, len(procs))
            mine = [p for p in procs if p.pid == self._pid]
            if mine:
                self.process_visible = True
            elif self.process_visible is None:
                self.process_visible = False
            for p in mine:
                if p.usedGpuMemory is not None:
                    used = int(p.usedGpuMemory)
                    if self.peak_process_bytes is None or used > self.peak_process_bytes:
                        self.peak_process_bytes = used
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception as exc:
            self._failed("memory", exc)
        else:
            if self.peak_device_used_bytes is None or mem.used > self.peak_device_used_bytes:
                self.peak_device_used_bytes = int(mem.used)
        try:
            util = int(nv.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except Exception as exc:
            self._failed("utilisation", exc)
        else:
            self.util_samples.append((now, util))

    def start(self) -> NvmlSampler:
        if self._nvml is not None:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.perf_counter() - t0)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
