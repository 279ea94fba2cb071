"""Is something else using the machine? A monitor that runs beside a search.

A probe's tokens/s is only worth reporting if the probe had the machine to itself. This monitor
samples, once a second, how much CPU the processes *outside* autotune's own process tree used
(system busy time minus the busy time of this process, its descendants and the children they
reaped, so a probe that starts and ends between two samples is still counted as ours), and on a
GPU machine asks NVML, before a probe starts and when it lands, for compute processes that are not
ours, for utilisation of a GPU none of our processes is on, and for clock throttling (thermal,
hardware slowdown, power brake).

Each finding is a dict ``{"kind", "message", "value"}``; the Searcher turns them into progress lines
and the ``warnings`` of ``summary.json``.

Threshold: other processes using more than ``cpu_threshold`` (default 15 %) of the machine's cores,
on average over a probe's window (or the last two seconds before one starts). A CPU probe uses every
core, so another process's share comes straight off its tokens/s: 15 % is about half of the 25 %
repeat tolerance of a CPU confirmation (search/_confirm.py), below which the spread of repeats
already hides it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any

import psutil

__all__ = ["LoadMonitor", "THROTTLE_REASONS"]

# nvmlClocksEventReasons / nvmlClocksThrottleReasons bits that mean the GPU runs slower than it could
# for a reason outside the probe (idle, application clocks and the power cap under full load are not
# listed: they are the normal state of a busy card)
THROTTLE_REASONS = {
    0x0000000000000008: "hardware slowdown",
    0x0000000000000020: "software thermal slowdown",
    0x0000000000000040: "hardware thermal slowdown",
    0x0000000000000080: "hardware power brake",
}
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


def _busy(times: Any) -> float:
    return sum(float(getattr(times, f, 0.0) or 0.0) for f in _BUSY_FIELDS)


class LoadMonitor:
    """Samples other processes' CPU use in a thread; answers ``check(phase, since)`` (a LoadCheck)."""

    def __init__(self, *, device: str = "cpu", interval_s: float = 1.0, cpu_threshold: float = 0.15,
                 gpu_util_threshold: int = 10, nvml: Any = None, root_pid: int | None = None) -> None:
        self.device = device
        self.interval_s = interval_s
        self.cpu_threshold = cpu_threshold
        self.gpu_util_threshold = gpu_util_threshold
        self.ncpu = psutil.cpu_count() or 1
        self._root = psutil.Process(root_pid or os.getpid())
        self.samples: deque[tuple[float, float]] = deque(maxlen=3600)  # (monotonic time, other cores)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: tuple[float, float, float] | None = None  # (time, system busy, own busy)
        self._nvml = nvml
        self._nvml_owned = False
        self._hidden_pids_noted = False
        if nvml is None and device == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml, self._nvml_owned = pynvml, True
            except Exception:
                self._nvml = None

    # ------------------------------------------------------------------ CPU

    def own_pids(self) -> set[int]:
        try:
            return {self._root.pid} | {p.pid for p in self._root.children(recursive=True)}
        except psutil.Error:
            return {self._root.pid}

    def _own_busy(self) -> float:
        total = 0.0
        procs = [self._root]
        try:
            procs += self._root.children(recursive=True)
        except psutil.Error:
            pass
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        return total

    def sample(self) -> float | None:
        """Take one sample; return the other processes' cores since the previous one."""
        now, system, own = time.monotonic(), _busy(psutil.cpu_times()), self._own_busy()
        prev, self._last = self._last, (now, system, own)
        if prev is None or now <= prev[0]:
            return None
        # the two clocks tick apart (a process's times are read a moment after the system's), so the
        # difference can stray past the machine by a tick: clamp to [0, cores]
        other = min(float(self.ncpu), max(0.0, ((system - prev[1]) - (own - prev[2])) / (now - prev[0])))
        self.samples.append((now, other))
        return other

    def start(self) -> LoadMonitor:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="autotune-load", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # never let the monitor take a search down
                continue

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=2.0)
        if self._nvml_owned:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def other_cores(self, since: float | None) -> float | None:
        """Mean cores used by other processes since ``since`` (monotonic), or over the last 2 s."""
        if since is None:
            since = time.monotonic() - 2.0 * self.interval_s
        vals = [v for t, v in list(self.samples) if t >= since]
        if not vals:  # a window shorter than one sample: take one now
            v = self.sample()
            vals = [v] if v is not None else []
        return sum(vals) / len(vals) if vals else None

    # ------------------------------------------------------------------ GPU

    def _gpu_findings(self, phase: str) -> list[dict[str, Any]]:
        nv = self._nvml
        if nv is None:
            return []
        out: list[dict[str, Any]] = []
        own = self.own_pids()
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception:
            return []
        for i in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception:
                continue
            pids: list[int] = []
            try:
                pids = [int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)]
            except Exception:
                pass
            visible = [p for p in pids if psutil.pid_exists(p)]
            if pids and not visible and not self._hidden_pids_noted:
                self._hidden_pids_noted = True
                out.append({"kind": "gpu_pids_hidden", "value": len(pids),
                            "message": f"GPU {i}: NVML lists {len(pids)} process(es) whose ids this PID namespace "
                                       "cannot see; other jobs on the card cannot be told apart from probes"})
            foreign = [p for p in visible if p not in own]
            if foreign:
                out.append({"kind": "gpu_process", "value": foreign,
                            "message": f"GPU {i}: {len(foreign)} other process(es) use the GPU (pid "
                                       f"{', '.join(map(str, foreign[:5]))}); figures measured now are shared"})
            if phase == "before" and not any(p in own for p in visible) and not (pids and not visible):
                try:
                    util = int(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
                except Exception:
                    util = None
                if util is not None and util > self.gpu_util_threshold:
                    out.append({"kind": "gpu_busy", "value": util,
                                "message": f"GPU {i} is {util}% busy before the probe starts, with no probe of "
                                           "autotune on it"})
            reasons = None
            for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
                fn = getattr(nv, name, None)
                if fn is None:
                    continue
                try:
                    reasons = int(fn(handle))
                    break
                except Exception:
                    continue
            if reasons:
                named = [text for bit, text in THROTTLE_REASONS.items() if reasons & bit]
                if named:
                    out.append({"kind": "gpu_throttle", "value": reasons,
                                "message": f"GPU {i} is throttling ({', '.join(named)})"})
        return out

    # ------------------------------------------------------------------ the LoadCheck

    def check(self, phase: str, since: float | None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        other = self.other_cores(since)
        if other is not None and other > self.cpu_threshold * self.ncpu:
            when = "during the probe" if phase == "during" else "before the probe starts"
            out.append({"kind": "cpu", "value": round(other, 2),
                        "message": f"other processes used {other:.1f} of {self.ncpu} CPU cores {when}"})
        out += self._gpu_findings(phase)
        return out

    __call__ = check
