"""The real ``autotune`` CLI in a real process, with the probe executor swapped for the fake one.

    python tests/_fake_cli.py run --model tiny-llama ...      (same arguments as ``autotune``)

Everything but the probes is real: flag parsing, the run directory, the journal, the SQLite
study, summary and reports. Each probe takes ``FAKE_PROBE_S`` seconds (default 0.3) and, as it
starts, appends ``<pid> <steps> <candidate key>`` to ``FAKE_PROBE_LOG`` (if set) and fsyncs it,
so a test can count which probes ran in which process, also across a ``kill -9``.

With ``FAKE_PROBE_POOL=ray`` the probes run as in a real run instead: on the real embedded Ray
pool (one CPU), or on the cluster ``--ray-address`` names, each in a real process started by
``run_probe_process``, whose interpreter is ``FAKE_PROBE_PYTHON`` (an executable that runs
``tests/_fake_probe.py`` with its arguments): only the measurement is fake.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fakes import FakeExecutor  # noqa: E402

import autotune.run._search as tune_mod  # noqa: E402
from autotune.search import candidate_id  # noqa: E402


def _log_probe(request) -> None:  # type: ignore[no-untyped-def]
    log = os.environ.get("FAKE_PROBE_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {request.settings.steps} {candidate_id(request.candidate)}\n")
            fh.flush()
            os.fsync(fh.fileno())


class SlowFake(FakeExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.delay = float(os.environ.get("FAKE_PROBE_S", "0.3"))

    def submit(self, request):  # type: ignore[no-untyped-def]
        _log_probe(request)
        return super().submit(request)

    def poll(self, timeout=None):  # type: ignore[no-untyped-def]
        if self._pending:
            time.sleep(self.delay)
        return super().poll(timeout)


def _ray_pool(address: str | None = None):  # type: ignore[no-untyped-def]
    from autotune.executors.local import run_probe_process
    from autotune.executors.ray_pool import RayExecutor

    class LoggedRay(RayExecutor):
        def submit(self, request):  # type: ignore[no-untyped-def]
            _log_probe(request)
            return super().submit(request)

    probe = functools.partial(run_probe_process, python=os.environ["FAKE_PROBE_PYTHON"])
    if address is not None:  # --ray-address: the cluster's nodes, as a real run reaches them
        return LoggedRay(address, device="cpu", probe_fn=probe)
    return LoggedRay(device="cpu", num_cpus=1, probe_fn=probe)


def _factory(**kwargs):  # type: ignore[no-untyped-def]
    if os.environ.get("FAKE_PROBE_POOL") == "ray":
        return _ray_pool(kwargs.get("ray_address"))
    return SlowFake()


if __name__ == "__main__":
    tune_mod._default_executor = _factory  # type: ignore[assignment]
    from autotune.cli.app import main

    sys.exit(main())
