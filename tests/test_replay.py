"""The replay executor: answers from a recorded landscape, with its recorded spread as noise."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autotune.executors.base import Executor, run_one
from autotune.executors.replay import ReplayExecutor
from autotune.search import candidate_id
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload

MiB = 2**20
REPO = Path(__file__).resolve().parents[1]


def _entry(c: Candidate, tps: list[float], peak: int, status: str = "ok") -> dict:
    return {"id": candidate_id(c), "candidate": dataclasses.asdict(c), "status": status,
            "tokens_per_s_all": tps, "tokens_per_s": sorted(tps)[len(tps) // 2] if tps else None,
            "peak_mem_bytes": peak, "wall_s": 10.0,
            "repeats": [{"status": status, "metrics": {"tokens_per_s": t, "overhead_s": 4.0}} for t in tps]
            or [{"status": status, "metrics": {}}]}


A = Candidate(micro_batch=1, grad_accum=4)
B = Candidate(micro_batch=2, grad_accum=2)
C = Candidate(micro_batch=4, grad_accum=1)
D = Candidate(micro_batch=4, grad_accum=1, grad_ckpt=True)
LAND = {"model": "m", "device": "cpu", "seq_len": 64, "effective_batch": 4, "budget_bytes": 200 * MiB,
        "headroom": 0.05, "steps": 3, "space": {},
        "entries": [_entry(A, [100.0, 120.0], 100 * MiB), _entry(B, [200.0], 150 * MiB),
                    _entry(C, [300.0, 330.0], 250 * MiB), _entry(D, [], 90 * MiB, status="crash")]}


def _req(c: Candidate, budget: int | None = 200 * MiB, steps: int = 3) -> ProbeRequest:
    return ProbeRequest(workload=Workload(model="m", seq_len=64), candidate=c,
                        settings=ProbeSettings(device="cpu", budget_bytes=budget, steps=steps))


def test_it_is_an_executor_and_answers_within_the_recorded_spread() -> None:
    ex = ReplayExecutor(LAND, seed=1)
    assert isinstance(ex, Executor) and ex.slots == 1
    seen = [run_one(ex, _req(A)).tokens_per_s for _ in range(50)]
    assert all(100.0 <= v <= 120.0 for v in seen) and len(set(seen)) > 10
    # one repeat only: the landscape's median relative spread around it (here 20 % and 10 %: 15 %)
    single = [run_one(ex, _req(B)).tokens_per_s for _ in range(50)]
    assert all(200 * (1 - 0.076) <= v <= 200 * (1 + 0.076) for v in single)
    assert ex.probes == 100 and ex.pending() == 0


def test_without_noise_the_answer_is_the_median_and_seeds_repeat() -> None:
    assert run_one(ReplayExecutor(LAND, seed=0, noise=False), _req(A)).tokens_per_s == 110.0
    a = [run_one(ReplayExecutor(LAND, seed=3), _req(C)).tokens_per_s for _ in range(2)]
    assert a[0] == a[1]


def test_fit_follows_the_requests_budget_and_failures_stay_failures() -> None:
    ex = ReplayExecutor(LAND, seed=0)
    r = run_one(ex, _req(C))
    assert r.status == "over_budget" and "over the usable budget" in r.reason and r.tokens_per_s is not None
    assert run_one(ex, _req(C, budget=400 * MiB)).status == "ok"
    assert run_one(ex, _req(C, budget=None)).status == "ok"  # no budget: the recorded status
    assert run_one(ex, _req(D, budget=400 * MiB)).status == "crash"


def test_an_unknown_configuration_is_a_crash_saying_so() -> None:
    ex = ReplayExecutor(LAND, seed=0)
    r = run_one(ex, _req(Candidate(micro_batch=8)))
    assert r.status == "crash" and "not in the landscape" in r.reason
    assert ex.answered[-1][1] == "crash"


def test_cost_counts_recorded_wall_time_and_longer_windows_pro_rata() -> None:
    ex = ReplayExecutor(LAND, seed=0)
    run_one(ex, _req(A))
    assert ex.probe_seconds == pytest.approx(10.0)
    run_one(ex, _req(A, steps=6))  # 4 s fixed + 6 s timed x 2
    assert ex.probe_seconds == pytest.approx(10.0 + 16.0)
    # windows that stopped, stable, at 2 of their 3 timed steps: a longer maximum stops there too
    ex = ReplayExecutor(dict(LAND, timed_steps=2), seed=0)
    run_one(ex, _req(A, steps=6))
    assert ex.probe_seconds == pytest.approx(10.0)


def test_an_entry_that_stops_at_its_out_of_memory_error_costs_only_that_when_over_budget() -> None:
    land = dict(LAND, entries=[dict(_entry(C, [300.0], 250 * MiB), over_budget_wall_s=3.0)])
    ex = ReplayExecutor(land, seed=0)
    assert run_one(ex, _req(C)).status == "over_budget" and ex.probe_seconds == pytest.approx(3.0)
    assert run_one(ex, _req(C, budget=400 * MiB)).status == "ok" and ex.probe_seconds == pytest.approx(13.0)


def test_it_reads_a_file_and_several_slots_answer_together(tmp_path: Path) -> None:
    p = tmp_path / "l.json"
    p.write_text(json.dumps(LAND))
    ex = ReplayExecutor(p, seed=0, slots=2)
    t1, t2 = ex.submit(_req(A)), ex.submit(_req(B))
    assert {t for t, _ in ex.poll()} == {t1, t2}


def test_the_benchmark_uses_the_packaged_executor_not_a_copy() -> None:
    text = (REPO / "benchmarks" / "search_vs_grid.py").read_text()
    assert "from autotune.executors.replay import ReplayExecutor" in text
    assert "class ReplayExecutor" not in text
