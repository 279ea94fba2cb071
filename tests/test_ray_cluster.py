"""``autotune run --ray-address`` against a real Ray cluster of two nodes (issue 13, item 9).

On this one machine: a head node and a worker node, each a ``ray start --block`` process of its own
(its own process group and temporary folder), token authentication on as autotune configures it for
an embedded pool (``RAY_AUTH_MODE=token``, the token in a 0600 file named by ``RAY_AUTH_TOKEN_PATH``).
The driver is the real CLI in a process of its own; each probe is a real process started by the node's
Ray worker, whose measurement is fake (``tests/_fake_cli.py``, ``FAKE_PROBE_POOL=ray``): a real training
probe through Ray is proven by ``tests/test_ray_pool.py``, and here it cost about a minute and a half. The test checks that the probes ran in the
cluster's workers (the node ids recorded in the journal are the cluster's, and the driver started no
Ray runtime of its own), that the study and results are written on the driver's side, and that
killing the worker node while it runs a probe loses no finished probe: the lost probe is retried on
the head (or recorded as a crash) and the run completes. The cluster is torn down whatever happens,
and no process of it may remain.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
FAKE_CLI = REPO / "tests" / "_fake_cli.py"
RAY_CLI = Path(sys.executable).with_name("ray")
START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Node:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    node_id: str = ""
    raylet_pid: int = 0


@dataclass
class _Cluster:
    root: Path  # short: Ray's socket paths must fit 107 bytes
    env: dict[str, str]
    address: str = ""
    nodes: dict[str, _Node] = field(default_factory=dict)

    def start_node(self, name: str, *args: str) -> _Node:
        log = self.root / f"{name}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [str(RAY_CLI), "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                 "--object-store-memory", str(80 * 2**20), "--disable-usage-stats",
                 "--temp-dir", str(self.root / name), "--dashboard-agent-listen-port", str(_free_port()),
                 "--resources", json.dumps({f"autotune_test_{name}": 1}), *args],
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True,  # its own process group: killing it is losing the machine
            )
        node = _Node(name, proc, log)
        self.nodes[name] = node
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"ray start ({name}) ended: {log.read_text()[-2000:]}"
            for p in _group(proc.pid):
                try:
                    if p.name() == "raylet":
                        ids = [a.split("=", 1)[1] for a in p.cmdline() if a.startswith("--node_id=")]
                        if ids and "Ray runtime started" in log.read_text():
                            node.node_id, node.raylet_pid = ids[0], p.pid
                            return node
                except psutil.Error:
                    continue
            time.sleep(0.5)
        raise AssertionError(f"the {name} node did not start within {START_TIMEOUT_S} s: {log.read_text()[-2000:]}")

    def processes(self) -> list[psutil.Process]:
        """Every live process of the cluster: its nodes' process groups, and anything naming its folder."""
        out: dict[int, psutil.Process] = {}
        for node in self.nodes.values():
            for p in _group(node.proc.pid):
                out[p.pid] = p
        for p in psutil.process_iter(["cmdline", "status"]):
            try:
                if p.info["status"] != psutil.STATUS_ZOMBIE and str(self.root) in " ".join(p.info["cmdline"] or []):
                    out[p.pid] = p
            except psutil.Error:
                continue
        return [p for p in out.values() if _alive(p)]

    def kill_node(self, name: str) -> None:
        """The node's machine is lost: its ``ray start``, raylet, agents and workers die at once."""
        node = self.nodes[name]
        victims = _group(node.proc.pid) + [p for p in self.processes() if str(self.root / name) in _cmd(p)]
        for p in victims:
            try:
                p.kill()
            except psutil.Error:
                pass
        node.proc.wait(timeout=30)

    def teardown(self) -> list[str]:
        """Kill everything of the cluster (gracefully first); return what is still alive after."""
        for node in self.nodes.values():
            try:
                os.killpg(node.proc.pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.25)
        for _ in range(3):
            for p in self.processes():
                try:
                    p.kill()
                except psutil.Error:
                    pass
            time.sleep(0.5)
        for node in self.nodes.values():
            try:
                node.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        left = [f"{p.pid} {_cmd(p)[:120]}" for p in self.processes()]
        shutil.rmtree(self.root, ignore_errors=True)
        return left


def _group(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and _alive(p):
                out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()) or p.name()
    except psutil.Error:
        return ""


@pytest.fixture
def cluster() -> Iterator[_Cluster]:
    root = Path(tempfile.mkdtemp(prefix="atc-"))
    home = root / "home"
    home.mkdir()
    token = root / "auth_token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "AUTOTUNE_REAP")) and k not in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
    # (no OMP_NUM_THREADS from the suite's worker: the nodes' own environment leaves it unset, as a user's
    # does, so that the thread-count check below sees Ray's per-task value undone)
    env.update({
        "HOME": str(home),  # ~/.ray is the test's
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),  # token auth, as for an embedded pool
        "RAY_USAGE_STATS_ENABLED": "0",
        # the nodes' workers import this checkout's autotune (on a real cluster: the same autotune installed)
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    })
    c = _Cluster(root=root, env=env)
    try:
        port = _free_port()
        c.start_node("head", "--head", "--port", str(port), "--include-dashboard", "false")
        c.address = f"127.0.0.1:{port}"
        c.start_node("worker", "--address", c.address)
        yield c
    finally:
        left = c.teardown()
        assert not left, f"Ray processes of the test cluster still alive after teardown: {left}"


def _journal(rd: Path) -> list[dict]:
    path = rd / "journal.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    return out


def _probe_on(node: _Node) -> psutil.Process | None:
    """A probe worker process running under ``node``'s raylet, if any."""
    try:
        for p in psutil.Process(node.raylet_pid).children(recursive=True):
            if "autotune.probe.worker" in _cmd(p):
                return p
    except psutil.Error:
        pass
    return None


def _has_result(probe: psutil.Process) -> bool:
    """Whether the probe wrote its result (or is gone): too late to lose it."""
    try:
        paths = [a for a in probe.cmdline() if a.endswith("result.json")]
    except psutil.Error:
        return True
    return not paths or Path(paths[0]).exists()


def _hold(probe: psutil.Process) -> bool:
    """Stop the probe where it is (SIGSTOP); False if it is already gone."""
    try:
        probe.suspend()
        return True
    except psutil.Error:
        return False


def _release(probe: psutil.Process) -> None:
    try:
        probe.resume()
    except psutil.Error:
        pass


def _probe_request(probe: psutil.Process) -> dict | None:
    for arg in probe.cmdline():
        if arg.endswith("request.json"):
            try:
                return json.loads(Path(arg).read_text())
            except (OSError, json.JSONDecodeError):
                return None
    return None


@pytest.mark.timeout(900)  # a real end-to-end run: minutes on 2 cores
def test_a_run_on_a_two_node_cluster_survives_losing_the_worker_node(cluster: _Cluster, tmp_path: Path) -> None:
    out = tmp_path / "out"
    head, worker = cluster.nodes["head"], cluster.nodes["worker"]
    cmd = [sys.executable, str(FAKE_CLI), "run", "--model", "tiny-llama", "--device", "cpu",
           "--gpu-budget", "10GiB", "--seq-len", "64", "--effective-batch", "4", "--space", "cpu",
           "--max-trials", "4", "--steps", "3", "--top-k", "1", "--confirm-rounds", "1:1",
           "--probe-timeout", "300", "--ray-address", cluster.address, "--out", str(out), "--json"]
    # each probe a real process the node's Ray worker starts, whose measurement is fake (tests/_fake_probe.py):
    # a real training probe through Ray is tests/test_ray_pool.py's; here it would only add minutes
    fake_python = tmp_path / "fake-python"
    fake_python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "tests" / "_fake_probe.py"}" "$@"\n')
    fake_python.chmod(0o755)
    env = {**cluster.env, "AUTOTUNE_CACHE": str(tmp_path / "cache"), "FAKE_PROBE_POOL": "ray",
           "FAKE_PROBE_PYTHON": str(fake_python), "FAKE_PROBE_S": "1.5"}
    driver = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    driver_children: set[str] = set()
    finished_before: list[dict] = []
    lost_request: dict | None = None
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert driver.poll() is None, ("the run ended before the worker node could be lost",
                                           driver.communicate())
            try:
                driver_children |= {_cmd(p) for p in psutil.Process(driver.pid).children(recursive=True)}
            except psutil.Error:
                pass
            rds = [p for p in out.iterdir() if p.is_dir()] if out.is_dir() else []
            finished = [r for r in _journal(rds[0]) if r.get("result")] if rds else []
            assert worker.proc.poll() is None, f"the worker node died on its own: {worker.log.read_text()[-2000:]}"
            probe = _probe_on(worker)
            # a probe that has not written its result yet: held still (so it cannot write one between this
            # look and the node's loss) and killed with its node, its task cannot return one
            if finished and probe is not None and _hold(probe):
                if not _has_result(probe):
                    lost_request = _probe_request(probe)
                    if lost_request is not None:
                        finished_before = [r for r in _journal(rds[0]) if r.get("result")]
                        break
                _release(probe)
            time.sleep(0.3)
        else:
            raise AssertionError("no moment with a finished probe and a probe on the worker node within 400 s")
        cluster.kill_node("worker")  # mid-probe
        stdout, stderr = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 0 and stdout.strip(), (driver.returncode, stdout[-1000:], stderr[-3000:])

    # (b) the study and the results are on the driver's side, in the run folder
    (tmp_path / "driver.stdout").write_text(stdout)
    (tmp_path / "driver.stderr").write_text(stderr)
    summary = json.loads(stdout)
    (rd,) = [p for p in out.iterdir() if p.is_dir()]
    for name in ("summary.json", "journal.jsonl", "study.db", "trials.csv", "best/train.py"):
        assert (rd / name).is_file(), name
    assert json.loads((rd / "summary.json").read_text())["run_id"] == summary["run_id"] == rd.name
    assert summary["best"] is not None

    # (a) the probes ran in the cluster's workers (the worker node's raylet ran the probe it lost,
    # seen above), not in a runtime of the driver's own
    records = [r for r in _journal(rd) if r.get("result")]
    nodes = {r["result"]["env"].get("ray_node_id") for r in records}
    assert nodes <= {head.node_id, worker.node_id} and head.node_id in nodes, (nodes, head, worker)
    assert all(r["result"]["env"].get("ray_worker_pid") for r in records)
    # started without the OMP_NUM_THREADS Ray sets to a task's CPU count (1 here): a real probe then measures
    # with the threads the emitted train.py gets, torch's default (the nodes' environment has none)
    assert {r["result"]["env"].get("omp_num_threads", "absent") for r in records} == {None}, records[0]["result"]["env"]
    assert not [c for c in driver_children if any(x in c for x in ("raylet", "gcs_server", "_reaper.py"))], \
        driver_children  # a driver of a cluster starts no Ray runtime

    # (c) no finished probe was lost, and the probe the lost node was running is accounted for
    def ident(r: dict) -> tuple:
        return (r["key"], r["phase"], r["repeat"], r["result"]["env"].get("ray_worker_pid"))

    after = {ident(r) for r in records}
    assert {ident(r) for r in finished_before} <= after
    assert len(records) > len(finished_before)
    lost_cand = lost_request["candidate"]
    later = [r for r in records if r["result"]["request"]["candidate"] == lost_cand
             and ident(r) not in {ident(f) for f in finished_before}]
    assert later, "the probe the lost node was running is neither retried nor recorded"
    assert all(r["status"] != "crash" or "lost" in r["reason"].lower() for r in later), later
    assert any(r["result"]["env"].get("ray_node_id") == head.node_id or r["status"] == "crash" for r in later)
