"""The simulated story-1 landscape ``benchmarks/time_to_answer.py simulate`` searches: what a probe costs there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_a_simulated_probe_runs_its_window_at_the_configurations_own_speed_and_confirmations_stop_with_it() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import time_to_answer as tta

    from autotune.estimate import arch_from_config, find_gpu, predict_speed
    from autotune.estimate.probe_time import predict_probe_time
    from autotune.executors.base import run_one
    from autotune.executors.replay import ReplayExecutor
    from autotune.models import resolve_model
    from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
    from autotune.spec.probe_window import MIN_TIMED_STEPS

    land = tta.simulated_landscape("llama-3.1-8b", "A10G", "lora", 4096, 32, draw=0)
    assert land["steps"] == tta.STEPS and land["timed_steps"] == MIN_TIMED_STEPS
    arch, gpu = arch_from_config(resolve_model("llama-3.1-8b").config), find_gpu("A10G")
    wl = Workload(model=resolve_model("llama-3.1-8b").name, seq_len=4096, mode="lora")
    settings = ProbeSettings(device="cuda", warmup_steps=tta.WARMUP, steps=MIN_TIMED_STEPS)
    for e in land["entries"][:: max(1, len(land["entries"]) // 5)]:
        c = Candidate(**e["candidate"])
        planned = predict_speed(arch, wl, c, gpu).tokens_per_s
        simulated = sum(e["tokens_per_s_all"]) / 2
        t = predict_probe_time(arch, wl, c, settings, device="cuda", gpu=gpu)
        assert t is not None
        assert e["wall_s"] == pytest.approx(t.setup_s + t.window_s * planned / simulated)
    # a confirmation probe (twice the steps at most) stops where the search probe's window did: the same cost
    e = land["entries"][0]
    for steps in (tta.STEPS, 2 * tta.STEPS):
        ex = ReplayExecutor(land, seed=0)
        request = ProbeRequest(workload=wl, candidate=Candidate(**e["candidate"]),
                               settings=ProbeSettings(device="cuda", steps=steps))  # no budget: as recorded
        run_one(ex, request)
        assert ex.probe_seconds == pytest.approx(e["wall_s"])
