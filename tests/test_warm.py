"""The warm start: CPU probes forked from a server that has imported the libraries once.

A forked probe must be the probe a fresh process would have run (same figures, same memory baseline,
its own environment and process group), and must die like one; where it cannot be, the probe starts
fresh as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from test_probe import tiny_request

from autotune.executors.local import run_probe_process
from autotune.executors.warm import WarmStarter
from autotune.probe.zygote import resident_file_pages, restore_residency


@pytest.fixture
def warm() -> Iterator[WarmStarter]:
    w = WarmStarter()
    try:
        yield w
    finally:
        w.close()


def _status(field: str, pid: int | str = "self") -> str:
    """A field of /proc/PID/status (its first word)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(f"{field}:"):
            return line.split()[1]
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _sig_ignored(pid: int) -> str:
    return _status("SigIgn", pid)


def _rss_file_kib() -> int:
    return int(_status("RssFile"))


def test_a_forked_child_gets_back_the_library_pages_its_parent_had_mapped() -> None:
    """A fork copies anonymous page tables only: without the restore, a forked probe's RSS baseline
    lacks the library pages a fresh probe has mapped by then, and its peak counts them as growth."""
    import torch  # noqa: F401  (a library's worth of mapped pages)

    runs = resident_file_pages()
    assert sum(n for _, n in runs) * os.sysconf("SC_PAGE_SIZE") > 20 * 2**20
    parent_kib = _rss_file_kib()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report RssFile before and after the restore, then leave at once
        try:
            before = _rss_file_kib()
            restore_residency(runs)
            os.write(w, f"{before} {_rss_file_kib()}".encode())
        finally:
            os._exit(0)
    os.close(w)
    before, after = (int(x) for x in os.read(r, 100).split())
    os.close(r)
    os.waitpid(pid, 0)
    assert before < 0.5 * parent_kib, (before, parent_kib)  # what the restore is for
    assert after > 0.9 * parent_kib, (after, parent_kib)


@pytest.mark.slow
def test_a_forked_probe_measures_what_a_fresh_one_does_and_dies_like_one(warm: WarmStarter) -> None:
    """Same request, fresh then forked: the same window, tokens and threads, without the imports (the figures
    agree within a CPU's repeat spread: benchmarks/warm_start.py measures that with repeats). OpenMP reads its
    thread count once, when the server loads it: a probe asking for other threads gets a server started with
    them. A forked probe past its deadline is killed with its group, and the server forks the next one."""
    fresh = run_probe_process(tiny_request())
    forked = run_probe_process(tiny_request(), warm=warm)
    assert fresh.status == forked.status == "ok", (fresh.reason, forked.reason)
    assert "start" not in fresh.env and forked.env["start"] == "forked", forked.env
    f, w = fresh.metrics, forked.metrics
    assert w["import_s"] < 0.05 < f["import_s"]
    assert w["probe_micro_batches"] == f["probe_micro_batches"] and w["steps_completed"] == f["steps_completed"]
    assert forked.env["torch_threads"] == fresh.env["torch_threads"]
    assert 0.5 < w["peak_mem_bytes"] / f["peak_mem_bytes"] < 1.5  # both measured, same order (spread: above)
    assert warm.import_s is not None and warm.import_s > 0.5

    # another environment: a server of its own (OpenMP read OMP_NUM_THREADS when the first one loaded it)
    threads = 2 if forked.env["torch_threads"] == 1 else 1  # other than the first server's
    other = run_probe_process(tiny_request(steps=1, warmup_steps=0, cpu_threads=threads), warm=warm)
    assert other.env["start"] == "forked" and other.status == "ok", other.reason
    assert other.env["torch_threads"] == threads and warm.restarts == 1 and warm.unavailable is None
    out: list = []
    t = threading.Thread(target=lambda: out.append(run_probe_process(
        tiny_request(timeout_s=3.0, steps=5000, window="whole", cpu_threads=threads), warm=warm)))
    t.start()
    deadline = time.monotonic() + 30
    while not warm._children and time.monotonic() < deadline:
        time.sleep(0.01)
    # the signals it ignores are a fresh interpreter's (Python ignores SIGPIPE and SIGXFSZ at start-up)
    fresh = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        child = next(iter(warm._children))
        assert _sig_ignored(child) == _sig_ignored(fresh.pid)
        assert os.readlink(f"/proc/{child}/cwd") == os.getcwd()  # where a fresh probe runs (relative paths)
    finally:
        fresh.kill()
        fresh.wait()
    t.join(timeout=60)
    slow = out[0]
    assert (slow.status, slow.env["start"]) == ("timeout", "forked"), slow.reason
    assert not warm._children  # reaped and reported
    after = run_probe_process(tiny_request(steps=1, warmup_steps=0, cpu_threads=threads), warm=warm)
    assert after.env["start"] == "forked" and after.status == "ok", after.reason
    assert warm.restarts == 1


@pytest.mark.slow
def test_a_probe_whose_server_dies_under_it_runs_again_fresh(warm: WarmStarter) -> None:
    """The server killed mid-probe: its child dies with it (parent-death signal), the probe is run again as a
    fresh process, and the executor forks no more."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(run_probe_process(tiny_request(), warm=warm)))
    t.start()
    deadline = time.monotonic() + 120  # the server's imports, then the fork
    while not warm._children and time.monotonic() < deadline:
        time.sleep(0.02)
    (child,) = list(warm._children)
    assert warm._proc is not None
    os.kill(warm._proc.pid, signal.SIGKILL)
    t.join(timeout=200)
    assert out and out[0].status == "ok" and out[0].env["start"] == "fresh", out and out[0].reason
    assert warm.unavailable is not None
    import psutil

    def alive() -> bool:
        try:
            return psutil.Process(child).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 5
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(), "the forked child outlived its server"


def test_a_run_on_a_cpu_forks_its_probes_locally_and_a_contradictory_pool_is_refused(tmp_path) -> None:
    """--pool auto: local (warm) on a CPU without a cluster, Ray otherwise; --pool local with --ray-address is
    bad input, refused before anything is written."""
    from autotune.errors import SpecError
    from autotune.executors.local import LocalExecutor
    from autotune.run import RunRequest, tune
    from autotune.run._search import _default_executor
    from autotune.spec.run_defaults import pool_for

    assert pool_for("auto", device="cpu", ray_address=None) == "local"
    assert pool_for("auto", device="cuda", ray_address=None) == "ray"
    assert pool_for("auto", device="cpu", ray_address="ray://h:10001") == "ray"
    assert pool_for("local", device="cuda", ray_address=None) == "local"
    ex = _default_executor(device="cpu", gpus=None, ray_address=None, gpus_per_probe=1, progress=None)
    try:
        assert isinstance(ex, LocalExecutor) and ex.warm is not None
    finally:
        ex.close()
    for pool, ray, why in (("local", "ray://h:10001", "drop --ray-address"), ("nearby", None, "unknown pool")):
        with pytest.raises(SpecError, match=why):
            tune(RunRequest(model="tiny-llama", gpu_budget="1GB", device="cpu", pool=pool, ray_address=ray,
                            out=str(tmp_path / "out")))
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_closing_while_the_server_imports_returns_at_once_and_starts_no_probe() -> None:
    """close() (Ctrl-C's path) while the first probe waits for the server's imports: it neither waits for them
    nor lets that probe start afterwards, fresh or forked."""
    warm = WarmStarter()
    out: list = []
    t = threading.Thread(target=lambda: out.append(run_probe_process(tiny_request(), warm=warm)))
    t.start()
    deadline = time.monotonic() + 30
    while warm._launching is None and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    warm.close()
    t.join(timeout=30)
    assert time.monotonic() - t0 < 10 and not t.is_alive()
    assert out[0].status == "crash" and "executor was closed" in out[0].reason, out[0].reason


def test_a_warm_server_forks_only_the_devices_it_was_opted_in_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU probes by default; a CUDA probe only where the caller opted in (benchmarks/warm_start.py --device
    cuda measures forked CUDA probes against fresh ones before ``autotune run`` would)."""
    import autotune.executors.local as local

    handed: list[WarmStarter | None] = []

    def start(argv, env, workdir, timeout, live, *, warm=None, model_path=None):  # type: ignore[no-untyped-def]
        handed.append(warm)
        return 0, False, "fresh"

    monkeypatch.setattr(local, "_run_and_wait", start)
    default, opted = WarmStarter(), WarmStarter(devices=("cpu", "cuda"))
    for device in ("cpu", "cuda"):
        for starter in (default, opted):
            run_probe_process(tiny_request(device=device, precision="bf16" if device == "cuda" else "fp32"),
                              warm=starter)
    assert handed == [default, opted, None, opted]
