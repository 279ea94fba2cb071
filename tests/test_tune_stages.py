"""tune()'s stages, each alone (issue 17): request -> plan -> cache -> run folder -> search -> summary -> write."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _fakes import FakeExecutor

from autotune.errors import NothingFitsError, SpecError
from autotune.models import resolve_model
from autotune.run import (
    EstimatePruner,
    RunRequest,
    answer_from_cache,
    plan_search,
    read_request,
    run_search,
    start_run,
    summarize,
    tune,
    write_answer,
)
from autotune.spec.probe_request import Candidate, Workload
from autotune.store import RunDir, make_run_id


def args(tmp_path: Path, **kw) -> RunRequest:
    """A small CPU request on the fake executor, and ``kw``."""
    base = dict(model="tiny-llama", gpu_budget="10GiB", seq_len=512, effective_batch=16, space="cpu", max_trials=6,
                device="cpu", out=tmp_path, executor=FakeExecutor(), top_k=2, load_monitor=False)
    return RunRequest(**{**base, **kw})


def test_the_keyword_form_builds_the_same_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.run._tune as tune_module

    seen: list[RunRequest] = []

    def stop(request: RunRequest) -> None:
        seen.append(request)
        raise SpecError("stop")

    monkeypatch.setattr(tune_module, "read_request", stop)
    request = args(tmp_path)
    given = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
    for call in (lambda: tune(request), lambda: tune(**given),
                 lambda: tune(request.model, **{k: v for k, v in given.items() if k != "model"})):
        with pytest.raises(SpecError, match="stop"):
            call()
    assert seen == [request, request, request]
    with pytest.raises(TypeError, match="unexpected keyword argument 'gpu_budgte'"):
        tune("tiny-llama", gpu_budgte="8GB")
    with pytest.raises(TypeError, match="takes no keywords"):
        tune(request, seed=1)


def test_read_request_reports_every_problem_at_once_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        read_request(args(tmp_path / "o", seq_len=2, mode="lol", time_budget="soon", gpus="a"))
    text = str(err.value)
    for part in ("seq_len", "mode", "time budget", "--gpus"):
        assert part in text
    assert not (tmp_path / "o").exists()
    r = read_request(args(tmp_path, time_budget="1m"))
    assert r.time_budget_s == 60 and r.resolved.name == "tiny-llama" and r.space is not None
    # a walk-only flag with another strategy had been accepted, and nothing stopped on it
    with pytest.raises(SpecError, match="--stop-when-converged stops the walk .* the tpe strategy has no such point"):
        read_request(args(tmp_path / "o", strategy="tpe", stop_when_converged=True))


def test_plan_search_is_deterministic_and_picks_the_hf_default(tmp_path: Path) -> None:
    r = read_request(args(tmp_path))
    a, b = plan_search(r), plan_search(r)
    assert a.device == "cpu" and a.key == b.key
    assert a.baseline is not None and a.baseline.micro_batch * a.baseline.grad_accum == 16
    assert a.usable is not None and a.usable < a.settings.budget_bytes
    other = plan_search(read_request(args(tmp_path, seq_len=256)))
    assert other.key != a.key
    assert plan_search(read_request(args(tmp_path, baseline=False))).baseline is None


def test_a_cpu_run_that_may_pick_bf16_on_variable_lengths_says_its_peak_is_a_lower_bound(tmp_path: Path) -> None:
    """oneDNN keeps bf16 buffers per batch width (benchmarks/cpu_bf16_shapes.py): a CPU search with bf16 in its
    space and variable-length batches notes that a bf16 answer's peak is a lower bound; fixed lengths do not."""
    from autotune.run._plan import CPU_BF16_WIDTHS_NOTE

    varied = plan_search(read_request(args(tmp_path, lengths="uniform:16-64")))
    assert "bf16" in varied.space.precision and CPU_BF16_WIDTHS_NOTE in varied.notes
    assert CPU_BF16_WIDTHS_NOTE not in plan_search(read_request(args(tmp_path))).notes


def test_the_stages_in_order_give_tunes_answer(tmp_path: Path) -> None:
    r = read_request(args(tmp_path))
    plan = plan_search(r)
    assert answer_from_cache(r, plan, started=0.0) is None  # nothing stored yet
    rd = RunDir.create(tmp_path, make_run_id("tiny-llama", plan.key))
    started = start_run(r, plan, rd, resumed=False)
    assert (rd.path / "run.json").exists() and started.history == []
    searched = run_search(r, plan, rd, started)
    assert searched.outcome.best is not None and searched.predictions is None  # not pruned on CPU
    summary = summarize(r, plan, searched, started.base_summary)
    assert summary["best"]["label"] == summary["top"][0]["label"]
    result = write_answer(r, rd, summary, searched, device=plan.device)
    assert result.summary["status"] == "complete" and (rd.path / "summary.json").exists()
    # the stored answer now answers the same request
    again = answer_from_cache(r, plan, started=0.0)
    assert again is not None and again.from_cache and again.run_dir == rd.path


def test_the_estimate_pruner_keeps_its_predictions(tmp_path: Path) -> None:
    resolved = resolve_model("llama-3.1-8b")
    wl = Workload(model="llama-3.1-8b", model_path=resolved.path, seq_len=2048)
    pruner = EstimatePruner(resolved.config, wl, "cuda", budget_bytes=40 * 2**30)
    reason = pruner(Candidate(micro_batch=4))
    assert reason is not None and "predicted peak" in reason
    ((peak, label),) = pruner.predictions.values()
    assert peak > 40 * 2**30 and label.startswith("mb4")


def test_nothing_fits_uses_the_pruners_predictions(tmp_path: Path) -> None:
    r = read_request(args(tmp_path, model="llama-3.1-8b", gpu_budget="40GB", seq_len=2048, prune=True))
    plan = plan_search(r)
    rd = RunDir.create(tmp_path, "stage-nothing")
    started = start_run(r, plan, rd, resumed=False)
    searched = run_search(r, plan, rd, started)
    assert searched.predictions  # every candidate predicted, none probed
    summary = summarize(r, plan, searched, started.base_summary)
    assert summary["status"] == "nothing_fits" and "the memory model predicts" in summary["message"]
    with pytest.raises(NothingFitsError, match="the memory model predicts"):
        write_answer(r, rd, summary, searched, device=plan.device)
