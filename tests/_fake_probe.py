"""Stands in for ``python -m autotune.probe.worker REQUEST.json RESULT.json`` (tests).

    python tests/_fake_probe.py -m autotune.probe.worker REQUEST.json RESULT.json

A real process started by the real ``run_probe_process`` (its own session, the parent-death signal,
the timeout), which answers from the fake landscape (``_fakes.synthetic``) after ``FAKE_PROBE_S``
seconds (default 0.3) instead of training, and writes the result as the worker does, with the
``OMP_NUM_THREADS`` it was started with (``env["omp_num_threads"]``, None if unset).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fakes import FakeExecutor  # noqa: E402

from autotune.spec.probe_request import ProbeRequest  # noqa: E402
from autotune.store.atomic import write_json_atomic  # noqa: E402


def main(argv: list[str]) -> int:
    request_path, result_path = argv[-2:]  # after "-m autotune.probe.worker"
    request = ProbeRequest.from_dict(json.loads(Path(request_path).read_text(encoding="utf-8")))
    time.sleep(float(os.environ.get("FAKE_PROBE_S", "0.3")))
    result = FakeExecutor().result_for(request)
    # the thread count a real probe would take: torch's default unless OMP_NUM_THREADS reaches it
    result.env["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    write_json_atomic(Path(result_path), result.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
