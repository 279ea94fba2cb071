"""The embedded Ray pool is private (issue 13, item 5): loopback only, token auth on whatever the
environment says, and nothing it started outlives it.

In a file of its own: it needs a Ray runtime this test starts (test_ray_pool.py keeps one up for the
whole module, and an existing runtime is reused, not made private).
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ray")

from _fakes import drain as _drain  # noqa: E402

from autotune.executors.ray_pool import RayExecutor  # noqa: E402
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload  # noqa: E402
from autotune.spec.result import ProbeResult  # noqa: E402

pytestmark = pytest.mark.ray


def _make_ok():
    def ok(request: ProbeRequest) -> ProbeResult:
        return ProbeResult(status="ok", request=request.to_dict(), metrics={"tokens_per_s": 1.0})

    return ok


_ok = _make_ok()


def _req() -> ProbeRequest:
    return ProbeRequest(workload=Workload(model="tiny-llama"), candidate=Candidate(precision="fp32"),
                        settings=ProbeSettings(device="cpu"))



def _listening(pids: set[int]) -> list[tuple[int, str, int]]:
    import psutil

    return [(c.pid, c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
            if c.pid in pids and c.status == psutil.CONN_LISTEN]


def _outside_address() -> str | None:
    """This machine's address on a non-loopback interface, if it has one."""
    import ipaddress

    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not ipaddress.ip_address(a.address).is_loopback:
                return str(a.address)
    return None


def test_the_embedded_pool_is_private_loopback_only_token_auth_on_and_reaped(tmp_path, monkeypatch) -> None:
    import ipaddress
    import os
    import socket
    import stat
    import subprocess
    import sys

    import psutil

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # what the user's environment says
    monkeypatch.setenv("HOME", str(tmp_path))  # so ~/.ray/auth_token is this test's
    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}  # (this test process's warm server: tests/_probes.py)
    with RayExecutor(device="cpu", num_cpus=1, probe_fn=_ok) as pool:
        pool.submit(_req())
        assert _drain(pool, 1)  # it works
        started = {c.pid for c in me.children(recursive=True)} - before
        ports = _listening(started | {me.pid})
        assert ports, "the pool listens nowhere?"
        for pid, ip, port in ports:
            assert ipaddress.ip_address(ip.removeprefix("::ffff:")).is_loopback, (pid, ip, port)
        outside = _outside_address()
        if outside is not None:  # no port of the pool accepts a connection from another interface
            for _, _, port in ports:
                with pytest.raises(OSError), socket.create_connection((outside, port), timeout=2):
                    pass
        # token auth is on whatever RAY_AUTH_MODE said; the token is in a 0600 file of its own
        assert os.environ["RAY_AUTH_MODE"] == "token"
        token = os.environ["RAY_AUTH_TOKEN_PATH"]
        assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
        import ray

        gcs = ray.get_runtime_context().gcs_address
        # a client without the token cannot use the pool
        code = ("import ray, sys\n"
                f"ray.init(address={gcs!r}, log_to_driver=False)\n"
                "print('CONNECTED', ray.get(ray.remote(lambda: 1).remote()))\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "AUTOTUNE_REAP"))}
        env["RAY_AUTH_MODE"] = "disabled"
        try:
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, env=env)
            assert "CONNECTED" not in p.stdout, p.stdout
        except subprocess.TimeoutExpired as exc:
            assert b"CONNECTED" not in (exc.stdout or b"")
    # the environment is the user's again, ~/.ray/auth_token was never created, nothing is left running
    assert os.environ["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN_PATH" not in os.environ
    assert not (tmp_path / ".ray" / "auth_token").exists()
    assert not os.path.exists(os.path.dirname(token))
    time.sleep(1.0)
    left = [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, [psutil.Process(p).name() for p in left]


def _make_hang():
    def hang(request: ProbeRequest) -> ProbeResult:
        time.sleep(600)
        raise AssertionError("not reached")

    return hang


# a closure, so Ray ships it by value: a module-level function is pickled by its module's name, which a Ray
# worker may not be able to import (the tests folder is not a package)
_hang = _make_hang()


@pytest.mark.serial  # it bounds the time to close
def test_a_pool_whose_processes_were_all_sent_sigterm_closes_within_seconds() -> None:
    """Slurm (a job's time limit, ``scancel``) and systemd stop every process of a job, not one process
    group: Ray's GCS, raylet, workers and agents get the SIGTERM with autotune. Closing the pool then
    must not wait on the dead GCS (``ray.shutdown`` flushed its task events to it for 5 s), and leaves
    nothing running."""
    import os
    import signal

    import psutil

    def command_line(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # ended, or a zombie, between the listing and the read
            return ""

    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}  # (this test process's warm server: tests/_probes.py)
    pool = RayExecutor(device="cpu", num_cpus=1, probe_fn=_hang)
    private_dir = pool._private.temp_dir if pool._private is not None else None
    try:
        pool.submit(_req())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("_probe_task" in command_line(p)
                                                       for p in me.children(recursive=True)):
            time.sleep(0.1)
        assert time.monotonic() < deadline, "the probe task never started: nothing to stop"
        started = {(p.pid, p.create_time()) for p in me.children(recursive=True) if p.pid not in before}
        for pid, _ in started:  # every process of the job, as slurmstepd signals them
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        time.sleep(0.5)
        t0 = time.monotonic()
        pool.close()
        took = time.monotonic() - t0
    finally:
        pool.close()  # (again, if something above failed: a second close does nothing)
    assert took < 5.0, f"closing took {took:.1f} s"  # (about 8 s while ray.shutdown flushed task events)
    time.sleep(1.0)
    left = []
    for pid, created in started:
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.cmdline())[:100])
                p.kill()
        except psutil.Error:
            continue
    assert not left, left
    # the reaper got the SIGTERM too: it swept and removed the runtime's folder instead of dying with it
    assert private_dir is not None and not os.path.exists(private_dir), os.listdir(private_dir)
