"""One budget resolver for `probe` and `run`, and one resolved plan per run that everything reads."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
from _fakes import FakeExecutor

from autotune.errors import SpecError
from autotune.spec.budget import PERCENT_RULE, budget_reference_bytes, parse_budget, resolve_budget
from autotune.spec.probe_request import Candidate, ProbeSettings, Workload

GiB = 2**30
# a mixed machine: a large GPU 0 and a small GPU 1
MIXED = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GiB, "driver": "x",
          "compute_capability": [9, 0]},
         {"index": 1, "name": "NVIDIA A10G", "memory_total_bytes": 24 * GiB, "driver": "x",
          "compute_capability": [8, 6]}]  # fmt: skip


def mixed_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.env.nvml_device_info", lambda: [dict(g) for g in MIXED])


# ------------------------------------------------------------------------------ the budget rule


def test_a_percentage_is_a_share_of_the_smallest_gpu() -> None:
    assert "smallest GPU" in PERCENT_RULE
    assert budget_reference_bytes("cuda", MIXED) == 24 * GiB
    assert resolve_budget("50%", device="cuda", gpu_infos=MIXED) == 12 * GiB
    assert resolve_budget("50%", device="cuda", gpu_infos=MIXED[:1]) == 40 * GiB  # --gpus 0
    assert resolve_budget("10GiB", device="cuda", gpu_infos=MIXED) == 10 * GiB
    assert resolve_budget(parse_budget("25%"), device="cpu", ram_bytes=lambda: 64 * GiB) == 16 * GiB


def test_the_device_memory_is_read_only_for_a_percentage() -> None:
    def ram() -> int:
        raise AssertionError("read for an absolute budget")

    assert resolve_budget("8GB", device="cpu", ram_bytes=ram) == 8 * 10**9
    with pytest.raises(SpecError, match="memory is unknown"):
        resolve_budget("80%", device="cuda", gpu_infos=[])


def test_probe_and_run_resolve_a_percentage_to_the_same_bytes_on_a_mixed_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.cli.probe import build_probe_request
    from autotune.run import plan_search, read_request

    mixed_machine(monkeypatch)
    req = build_probe_request(Workload(model="tiny-llama", seq_len=64), Candidate(micro_batch=2),
                              ProbeSettings(budget_text="50%", device="auto"))
    assert req.settings.budget_bytes == 12 * GiB  # the small GPU's half, not GPU 0's (40 GiB)
    plan = plan_search(read_request(_args(tmp_path, gpu_budget="50%", device="auto", space=None)))
    assert plan.device == "cuda" and plan.settings.budget_bytes == req.settings.budget_bytes


def test_read_request_parses_each_option_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.run._request as tune_module

    calls: dict[str, int] = {}

    def counting(name: str) -> Any:
        real = getattr(tune_module, name)

        def wrapper(*a: Any, **kw: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return real(*a, **kw)

        return wrapper

    for name in ("parse_budget", "parse_duration", "parse_gpus"):
        monkeypatch.setattr(tune_module, name, counting(name))
    r = tune_module.read_request(_args(tmp_path, time_budget="1m"))
    assert calls == {"parse_budget": 1, "parse_duration": 1, "parse_gpus": 1}
    assert r.budget.bytes == 10 * GiB and r.time_budget_s == 60


# ------------------------------------------------------------------------------ the resolved plan


def test_the_plan_holds_every_resolved_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.run import plan_search, read_request

    plan = plan_search(read_request(_args(tmp_path, steps=4)))
    assert plan.budget_bytes == 10 * GiB == plan.settings.budget_bytes
    assert (plan.max_world, plan.confirm_steps, plan.prune, plan.load_monitor) == (1, 8, False, False)
    assert plan.rule is not None and plan.settings.timeout_s == plan.rule.unpredicted_s
    assert plan.settings.cuda_alloc_conf is None  # a CPU run sets no CUDA allocator
    mixed_machine(monkeypatch)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    gpu_args = _args(tmp_path, device="cuda", space=None, executor=None, load_monitor=None)
    gpu = plan_search(read_request(gpu_args))
    assert (gpu.prune, gpu.load_monitor, gpu.max_world) == (True, True, 2)
    # GPU probes (and the scripts the run writes) get expandable segments, unless the user set their own
    assert gpu.settings.cuda_alloc_conf == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256")
    own = plan_search(read_request(gpu_args))
    assert own.settings.cuda_alloc_conf == "max_split_size_mb:256" and own.key != gpu.key


def test_the_cache_key_and_the_run_read_the_same_plan(tmp_path: Path) -> None:
    """Change a resolved value in the plan: the key changes with it, and the run does what it says."""
    from autotune.run import plan_search, read_request, run_search, start_run, summarize
    from autotune.run._plan import _cache_key
    from autotune.store import RunDir, make_run_id

    r = read_request(_args(tmp_path, top_k=1, max_trials=3))
    plan = plan_search(r)
    assert _cache_key(r, plan)[2] == plan.key  # the key is the plan's
    changed = dataclasses.replace(plan, confirm_steps=7)
    assert _cache_key(r, changed)[2] != plan.key
    rd = RunDir.create(tmp_path, make_run_id("tiny-llama", plan.key))
    started = start_run(r, changed, rd, resumed=False)
    assert started.base_summary["search"]["confirm_steps"] == 7
    # summary.json states the plan's other resolved defaults (CPU: no pruner, one GPU-less process)
    assert {k: started.base_summary["search"][k] for k in ("prune", "load_monitor", "max_world")} == {
        "prune": plan.prune, "load_monitor": plan.load_monitor, "max_world": plan.max_world}
    assert (plan.prune, plan.max_world) == (False, 1)
    searched = run_search(r, changed, rd, started)
    confirms = [rec for rec in searched.outcome.records if rec.phase == "confirm"]
    assert confirms and all(ProbeStepsOf(rec) == 7 for rec in confirms)
    assert summarize(r, changed, searched, started.base_summary)["search"]["confirm_steps"] == 7


def ProbeStepsOf(rec: Any) -> int:  # noqa: N802 - reads like the quantity
    return int((rec.result or {})["request"]["settings"]["steps"])


def test_on_a_cluster_the_searcher_gets_the_preflights_world_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Local GPUs do not bound a cluster's probes: the pre-flight and the searcher agree (no bound until
    the executor reports its nodes), where the searcher used to take the local GPU count."""
    import autotune.search

    mixed_machine(monkeypatch)
    monkeypatch.setattr("autotune.run._preflight.check_ray", lambda *a, **kw: None)
    seen: dict[str, Any] = {}
    real = autotune.search.Searcher

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, **kw: Any) -> None:
            seen.update(kw)
            super().__init__(**kw)

    monkeypatch.setattr(autotune.search, "Searcher", Recording)
    from autotune.run import plan_search, read_request, tune

    a = _args(tmp_path, device="cuda", space=None, gpu_budget="10GiB", ray_address="ray://head:10001",
              max_trials=2, top_k=0, seq_len=64, effective_batch=8)
    plan = plan_search(read_request(a))
    assert plan.max_world is None
    tune(a)
    assert "max_world" in seen and seen["max_world"] is None
    assert seen["policy"].confirm_steps == plan.confirm_steps


def test_an_executor_that_reports_its_gpus_narrows_the_plans_bound() -> None:
    from autotune.spec.run_defaults import max_world

    assert max_world("cuda", 8, cluster=False) == 8
    assert max_world("cuda", 8, cluster=False, executor_gpus=4) == 4
    assert max_world("cuda", 2, cluster=True) is None
    assert max_world("cuda", 2, cluster=True, executor_gpus=4) == 4
    assert max_world("cpu", 0, cluster=False, executor_gpus=4) == 1


# ------------------------------------------------------------------------------ one list of names


def test_run_options_and_the_run_request_list_the_same_names() -> None:
    from autotune.cli.run import COMMAND_ONLY, RENAMED, command
    from autotune.run import API_ONLY, RunRequest

    fields = [f.name for f in dataclasses.fields(RunRequest)]
    options = [n for n in inspect.signature(command).parameters if n not in COMMAND_ONLY]
    as_fields = {RENAMED.get(n, n) for n in options}
    assert as_fields == set(fields) - set(API_ONLY)
    assert not set(API_ONLY) & as_fields


def test_run_passes_each_of_its_options_into_the_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from autotune.cli.app import app
    from autotune.run import API_ONLY, RunRequest

    got: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_tune(request: Any) -> Any:
        got["request"] = request
        raise Stop

    monkeypatch.setattr("autotune.run.tune", fake_tune)
    argv = ["run", "--model", "tiny-llama", "--gpu-budget", "8GB", "--out", str(tmp_path), "--seq-len", "96",
            "--lora-r", "0", "--top-k", "2", "--offline"]
    CliRunner().invoke(app, argv)
    request = got.get("request")
    assert isinstance(request, RunRequest), "tune() was not called with a RunRequest"
    assert (request.seq_len, request.lora_r, request.top_k, request.hub) == (96, 0, 2, None)  # flags as given
    assert request.effective_batch == 64 and request.mode == "full"  # what neither flag nor file gives: defaults
    assert request.progress is not None and request.source is None
    assert {"progress", "source"} <= {f.name for f in dataclasses.fields(RunRequest)} - set(API_ONLY) | {"progress"}


# ------------------------------------------------------------------------------ helpers


def _args(tmp_path: Path, **kw: Any) -> Any:
    from autotune.run import RunRequest

    base = dict(model="tiny-llama", gpu_budget="10GiB", seq_len=512, effective_batch=16, space="cpu", max_trials=6,
                device="cpu", out=tmp_path, executor=FakeExecutor(), top_k=2, load_monitor=False)
    return RunRequest(**{**base, **kw})




# ------------------------------------------------------------------------------ the situation's space


def test_the_default_space_is_the_requests_situation() -> None:
    from autotune.run import default_space_for

    assert default_space_for("cpu", "lora", 0) == "cpu"
    assert [default_space_for("cuda", m, 1) for m in ("full", "lora", "qlora")] == ["default", "lora", "lora"]
    assert default_space_for("cuda", "lora", 4) == "multi-gpu"


def test_a_situations_space_leaves_torch_compile_out_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.run import plan_search, read_request

    monkeypatch.setattr("autotune.env.nvml_device_info", lambda: [dict(MIXED[1])])  # one A10G
    monkeypatch.setattr("autotune.run._preflight._has_module", lambda name: True)
    lora = plan_search(read_request(_args(tmp_path, device="cuda", space=None, mode="lora", seq_len=256)))
    assert lora.space.name == "lora" and lora.space.torch_compile == (False,)
    (dear,) = [d for d in lora.dropped if d.knob == "torch_compile"]
    assert dear.value is True and "repay" in dear.reason
    assert any("searching the `lora` space" in n for n in lora.notes)
    named = plan_search(read_request(_args(tmp_path, device="cuda", space="lora", mode="lora", seq_len=256)))
    assert named.space.torch_compile == (False, True) and not [d for d in named.dropped if d.knob == "torch_compile"]


def test_a_situations_space_searches_packing_only_when_the_lengths_vary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fixed-length data fills every row: packing has nothing to remove (landscape F, fixed 256-token rows:
    packed / unpacked tok/s 0.96-1.02 over 12 pairs, peaks 1.01-1.13: tests/test_search_quality.py), so a situation's space leaves it out and
    says why; a length distribution or a named space keeps it."""
    from autotune.run import plan_search, read_request

    monkeypatch.setattr("autotune.env.nvml_device_info", lambda: [dict(MIXED[1])])  # one A10G
    monkeypatch.setattr("autotune.run._preflight._has_module", lambda name: True)
    fixed = plan_search(read_request(_args(tmp_path, device="cuda", space=None, mode="lora", seq_len=256)))
    assert fixed.space.packing == (False,)
    (why,) = [d for d in fixed.dropped if d.knob == "packing"]
    assert why.value is True and "fixed-length" in why.reason and "--lengths" in why.reason
    varied = plan_search(read_request(_args(tmp_path, device="cuda", space=None, mode="lora", seq_len=256,
                                            lengths="lognormal:4.0,1.0")))
    assert varied.space.packing == (False, True) and not [d for d in varied.dropped if d.knob == "packing"]
    named = plan_search(read_request(_args(tmp_path, device="cuda", space="lora", mode="lora", seq_len=256)))
    assert named.space.packing == (False, True)


def test_torch_compile_is_left_out_only_while_the_cost_model_predicts_it_no_gain() -> None:
    """The reason given says the model predicts no speed-up: when the speed model gains a torch.compile term,
    this rule must weigh it (its probe's cost against the training it speeds up) instead."""
    from autotune.estimate.speed import COMPILE_FACTOR
    from autotune.run._preflight import DEAR_LEVERS

    assert "predicts no speed-up" in DEAR_LEVERS["torch_compile"][1]
    assert COMPILE_FACTOR == 1.0
