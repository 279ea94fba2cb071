"""Each probe's deadline from its prediction: the rule, the run's correction, the overrides, the budget."""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fakes import FakeExecutor  # noqa: E402

from autotune.cli.app import app  # noqa: E402
from autotune.errors import SpecError  # noqa: E402
from autotune.estimate import (  # noqa: E402
    CPU_DEADLINE_FLOOR_S,
    DEADLINE_FLOOR_S,
    DEADLINE_MARGIN,
    UNPREDICTED_S,
    DeadlineRule,
    Deadlines,
    arch_from_config,
    find_gpu,
    make_predictor,
    predict_probe_time,
)
from autotune.models import resolve_model  # noqa: E402
from autotune.run import ProbeCount, forecast, parse_probe_timeout, tune  # noqa: E402
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload  # noqa: E402
from autotune.spec.result import ProbeResult  # noqa: E402
from autotune.spec.space import load_space  # noqa: E402

SETTINGS = ProbeSettings(device="cuda", warmup_steps=2, steps=5)
WL = Workload(model="m", seq_len=4096, mode="lora")


def _req(c: Candidate, settings: ProbeSettings = SETTINGS) -> ProbeRequest:
    return ProbeRequest(workload=WL, candidate=c, settings=settings)


def _landed(d: Deadlines, ticket: str, req: ProbeRequest, status: str, wall: float | None) -> ProbeResult:
    metrics = {} if wall is None else {"wall_s": wall}
    return d.landed(ticket, ProbeResult(status=status, request=req.to_dict(), metrics=metrics,
                                        reason="no result after 1 s; the probe process was killed"
                                        if status == "timeout" else ""))


# ---------------------------------------------------------------------------------- the rule


def test_the_deadline_is_margin_times_prediction_with_a_floor() -> None:
    preds = {1: 10.0, 2: 400.0}
    d = Deadlines(rule=DeadlineRule(), predictor=lambda c, s: preds[c.micro_batch])
    assert d.deadline(Candidate(micro_batch=1), SETTINGS) == (10.0, DEADLINE_FLOOR_S)
    assert d.deadline(Candidate(micro_batch=2), SETTINGS) == (400.0, DEADLINE_MARGIN * 400.0)
    req, predicted, deadline = d.apply(_req(Candidate(micro_batch=2)))
    assert req.settings.timeout_s == deadline == 1200.0 and predicted == 400.0


def test_the_correction_is_the_median_measured_over_predicted_of_finished_probes() -> None:
    d = Deadlines(rule=DeadlineRule(), predictor=lambda c, s: 100.0)
    for i, (status, wall) in enumerate([("ok", 200.0), ("over_budget", 300.0), ("ok", 400.0),
                                        ("oom", 5.0), ("crash", 1.0), ("timeout", 900.0), ("ok", None)]):
        req, p, dl = d.apply(_req(Candidate()))
        d.issued(f"t{i}", p, dl)
        res = _landed(d, f"t{i}", req, status, wall)
        assert res.metrics["predicted_s"] == 100.0 and res.metrics["deadline_s"] == dl
    # oom / crash stop early, a timeout is censored, no wall: not counted
    assert d.ratios == [2.0, 3.0, 4.0] and d.correction() == 3.0
    assert d.deadline(Candidate(), SETTINGS) == (100.0, DEADLINE_MARGIN * 100.0 * 3.0)
    assert d.summary()["correction_factor"] == 3.0 and d.summary()["probes_counted"] == 3


def test_a_pessimistic_prediction_is_corrected_down_but_never_below_the_floor() -> None:
    d = Deadlines(rule=DeadlineRule(), predictor=lambda c, s: 1000.0)
    d.issued("a", 1000.0, 3000.0)
    _landed(d, "a", _req(Candidate()), "ok", 10.0)
    assert d.deadline(Candidate(), SETTINGS) == (1000.0, DEADLINE_FLOOR_S)


def test_a_probe_stopped_at_its_deadline_says_it_was_far_slower_than_predicted() -> None:
    d = Deadlines(rule=DeadlineRule(), predictor=lambda c, s: 100.0)
    req, p, dl = d.apply(_req(Candidate()))
    d.issued("t", p, dl)
    res = _landed(d, "t", req, "timeout", 300.0)
    assert res.reason.startswith("far slower than predicted: predicted 100 s, deadline 300 s")
    assert "the probe process was killed" in res.reason


def test_the_fixed_override_gives_every_probe_the_same_deadline() -> None:
    d = Deadlines(rule=DeadlineRule(fixed_s=42.0), predictor=lambda c, s: 1000.0)
    assert d.deadline(Candidate(), SETTINGS) == (1000.0, 42.0)
    d.issued("t", 1000.0, 42.0)
    res = _landed(d, "t", _req(Candidate()), "timeout", 42.0)
    assert "past the --probe-timeout of 42 s (predicted 1,000 s)" in res.reason


def test_an_unpredictable_probe_gets_the_fixed_fallback() -> None:
    d = Deadlines(rule=DeadlineRule(), predictor=lambda c, s: None)
    assert d.deadline(Candidate(), SETTINGS) == (None, UNPREDICTED_S)
    d2 = Deadlines(rule=DeadlineRule(), predictor=lambda c, s: 1 / 0)  # a failing estimator never stops a search
    assert d2.deadline(Candidate(), SETTINGS) == (None, UNPREDICTED_S)


@pytest.mark.parametrize("text,expected", [("predicted", None), ("PREDICTED", None), (None, None), ("300", 300.0),
                                           (90, 90.0), ("10m", 600.0), ("1h30m", 5400.0)])
def test_probe_timeout_values(text: Any, expected: float | None) -> None:
    assert parse_probe_timeout(text) == expected


@pytest.mark.parametrize("bad", ["soon", "0", "-5", 0, True, "nan"])
def test_bad_probe_timeouts_are_one_clear_error(bad: Any) -> None:
    with pytest.raises(SpecError, match="probe timeout must be 'predicted' or positive seconds"):
        parse_probe_timeout(bad)


# ---------------------------------------------------------------------------------- the prediction


def test_the_probe_window_not_the_accumulation_sets_a_gpu_probes_predicted_time() -> None:
    arch = arch_from_config(resolve_model("llama-3.1-8b").config)
    gpu = find_gpu("A10G")
    small = predict_probe_time(arch, WL, Candidate(micro_batch=2, grad_accum=16, grad_ckpt=True), SETTINGS,
                               device="cuda", gpu=gpu)
    huge = predict_probe_time(arch, WL, Candidate(micro_batch=2, grad_accum=4096, grad_ckpt=True), SETTINGS,
                              device="cuda", gpu=gpu)
    assert small is not None and huge is not None
    assert small.total_s == pytest.approx(huge.total_s) and small.micro_batches == (2 + 5) * 2
    # the window is the planner's step time at the probe accumulation, for every optimizer step
    assert small.optimizer_steps == 7 and small.window_s > 0 and small.setup_s > 0
    assert predict_probe_time(arch, WL, Candidate(), SETTINGS, device="cuda", gpu=None) is None


def test_the_cpu_prediction_grows_with_the_window_and_the_micro_batch() -> None:
    arch = arch_from_config(resolve_model("tiny-llama").config)
    wl = Workload(model="tiny-llama", seq_len=256)
    cpu = ProbeSettings(device="cpu", warmup_steps=1, steps=3)
    a = predict_probe_time(arch, wl, Candidate(micro_batch=1), cpu, device="cpu", cores=2)
    b = predict_probe_time(arch, wl, Candidate(micro_batch=4), cpu, device="cpu", cores=2)
    c = predict_probe_time(arch, wl, Candidate(micro_batch=1, grad_accum=64), cpu, device="cpu", cores=2)
    assert a is not None and b is not None and c is not None
    assert b.window_s == pytest.approx(4 * a.window_s) and c.window_s == pytest.approx(2 * a.window_s)
    assert a.setup_s == b.setup_s


def test_the_forecast_counts_search_and_confirmation_probes_over_the_slots() -> None:
    space = load_space("cpu")
    count = ProbeCount(max_trials=6, top_k=3, confirm_rounds=2, confirm_steps=10,
                       baseline=Candidate(micro_batch=8), slots=2)
    fc = forecast(lambda c, s: 10.0 * s.steps, space=space, settings=ProbeSettings(device="cpu", steps=5),
                  effective_batch=8, max_world=1, count=count)
    assert fc["search_probes"] == 6 and fc["confirm_probes"] == (3 + 1) * 2
    assert fc["probe_s"] == 50.0 and fc["confirm_probe_s"] == 100.0
    assert fc["time_to_answer_s"] == (6 * 50 + 8 * 100) / 2
    # the confirmation re-measures what the search measured: one search probe (the baseline) is one configuration
    one = forecast(lambda c, s: 10.0 * s.steps, space=space, settings=ProbeSettings(device="cpu", steps=5),
                   effective_batch=8, max_world=1, count=dataclasses.replace(count, max_trials=1))
    assert one["search_probes"] == 1 and one["confirm_probes"] == 1 * 2


def test_a_search_that_stops_by_itself_is_forecast_as_a_bound() -> None:
    """The model strategy and ``--stop-when-converged`` end when more probes cannot change the answer: their
    forecast is ``--max-trials``' time as an upper bound, said as one; the walk's is the count."""
    from autotune.run import forecast_line

    fc = {"time_to_answer_s": 600.0, "search_probes": 40, "confirm_probes": 4, "slots": 1, "probe_s": 14.0}
    walk = forecast_line(fc)
    assert walk.startswith("predicted time to answer: ~10 min (40 search") and "at most" not in walk
    model = forecast_line({**fc, "stops_early": True})
    assert model.startswith("predicted time to answer: at most ~10 min (up to 40 search")
    assert "stops sooner once no unprobed configuration can change the answer" in model
    assert "of up to 40 search probes done" in forecast_line({**fc, "stops_early": True}, done=5)


# ---------------------------------------------------------------------------------- through tune


def _space(tmp_path: Path) -> str:
    p = tmp_path / "s.yaml"
    p.write_text("micro_batch: [1, 2, 4]\ngrad_ckpt: [false, true]\nprecision: [fp32]\npin_memory: [false]\n")
    return str(p)


def _tune(tmp_path: Path, ex: FakeExecutor, **kw: Any) -> Any:
    args: dict[str, Any] = dict(gpu_budget="10GiB", seq_len=64, effective_batch=8, space=_space(tmp_path),
                                device="cpu", max_trials=3, top_k=1, out=tmp_path / "out", executor=ex, steps=3,
                                warmup_steps=1)
    args.update(kw)
    return tune("tiny-llama", **args)


class SlowerThanPredicted(FakeExecutor):
    """Every probe takes 4x its prediction (read back from its deadline: 3 x prediction at first)."""

    def result_for(self, request: ProbeRequest) -> ProbeResult:
        res = super().result_for(request)
        res.metrics = {**res.metrics, "wall_s": self.wall}
        return res

    wall = 200.0


def test_each_probe_and_each_confirmation_gets_its_predicted_deadline(tmp_path: Path) -> None:
    ex = SlowerThanPredicted()
    result = _tune(tmp_path, ex)
    predict = make_predictor(resolve_model("tiny-llama").config, Workload(model="tiny-llama", seq_len=64),
                             device="cpu", gpu_infos=[])
    records = json.loads(json.dumps(result.summary))["search"]["deadlines"]
    assert records["kind"] == "predicted" and records["margin"] == DEADLINE_MARGIN
    assert records["forecast"]["time_to_answer_s"] > 0 and records["probes_counted"] >= 2
    seen_correction = False
    ratios: list[float] = []
    for req in ex.requests:
        p = predict(req.candidate, req.settings)
        assert p is not None
        corr = statistics.median(ratios) if ratios else 1.0
        assert req.settings.timeout_s == pytest.approx(max(CPU_DEADLINE_FLOOR_S, DEADLINE_MARGIN * p * corr),
                                                       abs=0.1)
        seen_correction |= bool(ratios)
        ratios.append(ex.wall / p)
    assert seen_correction
    confirms = [r for r in ex.requests if r.settings.steps == 6]
    assert confirms, "the confirmation's probes go through the same deadlines"
    assert result.summary["search"]["deadlines"]["correction_factor"] == pytest.approx(ex.wall / p, rel=0.05)


def test_an_explicit_probe_timeout_is_every_probes_deadline(tmp_path: Path) -> None:
    ex = FakeExecutor()
    result = _tune(tmp_path, ex, probe_timeout_s="45")
    assert ex.requests and {r.settings.timeout_s for r in ex.requests} == {45.0}
    assert result.summary["search"]["deadlines"]["kind"] == "fixed"


def test_the_cache_key_holds_the_rule_not_a_probes_seconds(tmp_path: Path) -> None:
    first = _tune(tmp_path, SlowerThanPredicted())
    again = _tune(tmp_path, FakeExecutor())  # other walls, other deadlines: the same request
    assert again.from_cache and again.summary["cache_key"] == first.summary["cache_key"]
    fixed = _tune(tmp_path, FakeExecutor(), probe_timeout_s=300.0)
    assert not fixed.from_cache and fixed.summary["cache_key"] != first.summary["cache_key"]


def test_run_json_records_the_rule_and_the_forecast(tmp_path: Path) -> None:
    result = _tune(tmp_path, FakeExecutor())
    run = json.loads((result.run_dir / "run.json").read_text())
    dl = run["request"]["search"]["deadlines"]
    assert dl["kind"] == "predicted" and dl["floor_s"] == CPU_DEADLINE_FLOOR_S  # a CPU run's floor
    assert dl["forecast"]["search_probes"] == 3 and dl["forecast"]["probe_s"] > 0


def test_the_forecast_is_printed_before_the_search(tmp_path: Path) -> None:
    notes: list[str] = []
    _tune(tmp_path, FakeExecutor(), progress=lambda ev, d: notes.append(d["text"]) if ev == "note" else None)
    line = next(n for n in notes if n.startswith("predicted time to answer"))
    assert "3 search + 4 confirmation probes" in line  # (top-1 + the baseline) x 2 rounds


def test_a_time_budget_too_small_for_two_probes_is_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", "--model", "tiny-llama", "--device", "cpu", "--gpu-budget", "8GB",
                                   "--seq-len", "64", "--effective-batch", "8", "--time-budget", "2s",
                                   "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "--time-budget 2s cannot hold even the HF-default baseline and one candidate" in lines[0]
    assert "smaller --steps" in lines[0] and "more GPUs" in lines[0] and "autotune plan" in lines[0]
    assert not out.exists()


def test_a_time_budget_says_how_many_probes_it_buys(tmp_path: Path) -> None:
    notes: list[str] = []
    _tune(tmp_path, FakeExecutor(), time_budget="10m",
          progress=lambda ev, d: notes.append(d["text"]) if ev == "note" else None)
    line = next(n for n in notes if n.startswith("predicted time to answer"))
    assert "the --time-budget buys about" in line


def test_a_bad_probe_timeout_on_the_command_line_is_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["run", "--model", "tiny-llama", "--device", "cpu", "--gpu-budget", "8GB",
                                   "--probe-timeout", "soon", "--out", str(tmp_path / "out")], catch_exceptions=False)
    assert res.exit_code == 2 and "probe timeout must be 'predicted' or positive seconds" in res.stderr
    assert not (tmp_path / "out").exists()


def test_a_gpu_run_predicts_from_the_planner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = {"index": 0, "name": "NVIDIA A10G", "memory_total_bytes": 24 * 10**9, "driver": "x",
           "compute_capability": [8, 6]}
    monkeypatch.setattr("autotune.env.nvml_device_info", lambda: [dict(gpu)])
    ex = FakeExecutor()
    result = tune("tiny-llama", gpu_budget="10GiB", seq_len=64, effective_batch=8, device="auto", max_trials=2,
                  top_k=0, out=tmp_path, executor=ex)
    fc = result.summary["search"]["deadlines"]["forecast"]
    assert fc["probe_s"] is not None and ex.requests
    assert all(r.settings.timeout_s == DEADLINE_FLOOR_S for r in ex.requests)  # a tiny model: the GPU floor


def test_confirmation_probes_are_short_probes_at_any_accumulation(tmp_path: Path) -> None:
    """The confirmation's requests keep the true accumulation and run the probe window, with deadlines."""
    from autotune.spec.probe_window import probe_grad_accum, probe_window

    ex = FakeExecutor()
    _tune(tmp_path, ex, effective_batch=4096, max_trials=3, top_k=2)
    confirms = [r for r in ex.requests if r.settings.steps == 6]
    assert confirms
    for r in confirms:
        c = r.candidate
        assert c.micro_batch * c.grad_accum == 4096 and c.grad_accum >= 512
        win = probe_window(r.settings, c)
        assert win.max_micro_batches == (1 + 6) * probe_grad_accum(c) == 14
        assert r.settings.timeout_s >= CPU_DEADLINE_FLOOR_S


def test_before_any_probe_lands_the_time_budget_counts_the_predicted_probe_time() -> None:
    d = Deadlines(rule=DeadlineRule(), predictor=lambda c, s: 100.0)
    assert d.expected_s() is None
    d.issued("a", 100.0, 300.0)
    d.issued("b", 300.0, 900.0)
    assert d.expected_s() == 200.0
    _landed(d, "a", _req(Candidate()), "ok", 150.0)
    assert d.expected_s() == 200.0 * 1.5


def test_a_resumed_run_keeps_its_correction() -> None:
    d = Deadlines(rule=DeadlineRule(), predictor=lambda c, s: 100.0)
    d.restore([{"status": "ok", "metrics": {"predicted_s": 100.0, "wall_s": 250.0}},
               {"status": "oom", "metrics": {"predicted_s": 100.0, "wall_s": 5.0}},
               {"status": "ok", "metrics": {"wall_s": 5.0}}])
    assert d.ratios == [2.5] and d.deadline(Candidate(), SETTINGS) == (100.0, DEADLINE_MARGIN * 250.0)
