"""The searcher driven directly against a fake executor over a synthetic landscape."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna
import pytest
from _fakes import FakeExecutor, GiB, synthetic

from autotune.errors import SpecError
from autotune.search import (
    ConfirmPolicy,
    Searcher,
    Skip,
    TrialRecord,
    candidate_from_choice,
    candidate_id,
    constraint_value,
    derive_grad_accum,
    expert_seeds,
    infer_infeasible,
    iter_choices,
    median,
    relative_spread,
    usable_micro_batches,
)
from autotune.spec.probe_request import Candidate, ProbeSettings, Workload
from autotune.spec.space import DIMENSIONS, SearchSpace, parse_space

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = parse_space(
    {
        "micro_batch": [1, 2, 3, 4, 8, 16],
        "grad_ckpt": [False, True],
        "attn": ["eager", "sdpa"],
        "precision": ["fp32", "bf16"],
        "packing": [False, True],
        "workers": [0, 1],
        "pin_memory": [False],
        "optim": ["adamw_torch"],
    }
)
WL = Workload(model="tiny-llama", seq_len=512)
# usable = 10 GiB * 0.95: no-ckpt fp32 fits up to mb 5, no-ckpt bf16 up to mb 9, ckpt everywhere
SETTINGS = ProbeSettings(device="cpu", budget_bytes=10 * GiB)


def make(executor: FakeExecutor, **kw) -> Searcher:
    args = dict(space=SPACE, workload=WL, settings=SETTINGS, effective_batch=16, executor=executor,
                max_trials=20, device="cpu", seed=7)
    args.update(kw)
    return Searcher(**args)


def full_choice(**kw) -> dict:
    base = {d: SearchSpace().choices(d)[0] for d in DIMENSIONS}
    base.update(kw)
    return base


# ----------------------------------------------------------------------------- pure rules


def test_derive_grad_accum_holds_the_effective_batch() -> None:
    assert derive_grad_accum(64, 4, 1) == 16
    assert derive_grad_accum(64, 4, 2) == 8
    assert derive_grad_accum(64, 3, 1) is None  # never rounded
    assert derive_grad_accum(8, 16, 1) is None  # accumulation < 1 is not a thing
    assert derive_grad_accum(16, 16, 1) == 1


def test_micro_batches_that_do_not_divide_are_skipped_and_reported() -> None:
    keep, dropped = usable_micro_batches(SPACE, 16, [1])
    assert keep == [1, 2, 4, 8, 16]
    assert len(dropped) == 1 and "micro_batch 3 skipped" in dropped[0] and "not a multiple" in dropped[0]


def test_candidate_from_choice() -> None:
    c = candidate_from_choice(full_choice(micro_batch=4, gpus_per_trial=2), effective_batch=64)
    assert isinstance(c, Candidate)
    assert (c.micro_batch, c.grad_accum, c.world_size) == (4, 8, 2)
    skip = candidate_from_choice(full_choice(micro_batch=3), effective_batch=64)
    assert isinstance(skip, Skip) and "not a multiple" in skip.reason
    # zero_stage 0 collapses offload/sharding: the same candidate, whatever was proposed
    a = candidate_from_choice(full_choice(zero_stage=0, offload="optimizer", sharding="fsdp"), effective_batch=8)
    b = candidate_from_choice(full_choice(zero_stage=0), effective_batch=8)
    assert isinstance(a, Candidate) and candidate_id(a) == candidate_id(b)
    bad = candidate_from_choice(full_choice(zero_stage=2, offload="params"), effective_batch=8)
    assert isinstance(bad, Skip) and "zero_stage 3" in bad.reason
    assert isinstance(candidate_from_choice(full_choice(zero_stage=1, sharding="fsdp"), effective_batch=8), Skip)


def _rec(c: Candidate, status: str) -> TrialRecord:
    return TrialRecord(key=candidate_id(c), status=status, candidate=dataclasses.asdict(c), result={})


def test_infer_infeasible_is_monotone_in_micro_batch_only() -> None:
    small = Candidate(micro_batch=4, grad_accum=4)
    known = [_rec(small, "oom")]
    assert infer_infeasible(Candidate(micro_batch=8, grad_accum=2), known) is known[0]
    assert infer_infeasible(Candidate(micro_batch=2, grad_accum=8), known) is None  # smaller: must be probed
    assert infer_infeasible(Candidate(micro_batch=8, grad_accum=2, grad_ckpt=True), known) is None  # other knob
    assert infer_infeasible(Candidate(micro_batch=8, grad_accum=2), [_rec(small, "crash")]) is None
    assert infer_infeasible(Candidate(micro_batch=8, grad_accum=2), [_rec(small, "ok")]) is None


def test_expert_seeds_are_valid_and_sensible() -> None:
    seeds = expert_seeds(SPACE, effective_batch=16, micro_batches=[1, 2, 4, 8, 16], worlds=[1], device="cpu")
    assert len(seeds) == 3
    first = seeds[0]
    assert first["micro_batch"] == 8 and first["grad_ckpt"] is False and first["attn"] == "sdpa"
    assert first["precision"] == "fp32"  # on CPU: bf16 is not assumed to be faster
    assert seeds[1]["micro_batch"] == 1 and seeds[1]["grad_ckpt"] is True  # the most likely to fit
    assert seeds[2]["micro_batch"] == 16 and seeds[2]["grad_ckpt"] is True
    gpu = expert_seeds(SPACE, effective_batch=16, micro_batches=[1, 2, 4, 8, 16], worlds=[1], device="cuda")
    assert gpu[0]["precision"] == "bf16"
    for s in seeds:
        for d, v in s.items():
            assert v in SPACE.choices(d) or d == "micro_batch"


def test_constraint_signs() -> None:
    assert constraint_value("ok", 5, 10) <= 0
    assert constraint_value("over_budget", 15, 10) > 0
    assert constraint_value("oom", None, 10) > 0
    assert constraint_value("ok", None, None) <= 0
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([1.0, 3.0]) == 2.0
    assert relative_spread([90.0, 110.0]) == pytest.approx(0.2)
    assert relative_spread([5.0]) == 0.0


# ----------------------------------------------------------------------------- the loop


def test_budget_respected_and_best_is_the_fastest_fitting() -> None:
    ex = FakeExecutor()
    out = make(ex, max_trials=30).run()
    usable = SETTINGS.usable_bytes()
    assert out.best is not None and out.best.fits
    assert out.best.peak_mem_bytes <= usable
    for r in out.records:
        if r.status == "ok":
            assert r.peak_mem_bytes <= usable
    # the chosen one is the fastest fitting configuration that was measured
    ok = [r for r in out.records if r.phase == "search" and r.status == "ok"]
    assert out.best_record.tokens_per_s == max(r.tokens_per_s for r in ok)
    assert out.counts["probed"] == 30


def test_over_budget_is_complete_with_a_constraint_not_a_failure() -> None:
    ex = FakeExecutor()
    s = make(ex, max_trials=25)
    s.run()
    trials = s.study.get_trials(deepcopy=False)
    over = [t for t in trials if t.user_attrs.get("status") == "over_budget"]
    assert over, "the landscape has over-budget configurations"
    for t in over:
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert t.value == 0.0 and t.constraints["memory"] > 0
    for t in trials:
        if t.user_attrs.get("status") == "ok":
            assert t.constraints["memory"] <= 0


def test_inferred_infeasibility_is_recorded_without_running() -> None:
    ex = FakeExecutor()
    small = parse_space({"micro_batch": [1, 2, 4, 8, 16], "grad_ckpt": [False, True],
                         "precision": ["fp32", "bf16"], "attn": ["sdpa"]})
    out = make(ex, space=small, max_trials=40).run()
    inferred = [r for r in out.records if r.inferred]
    assert inferred, "larger micro-batches of an over-budget config must be inferred"
    probed_keys = {candidate_id(r.candidate) for r in ex.requests}
    for r in inferred:
        assert r.status in ("oom", "over_budget") and r.reason.startswith("inferred:")
        assert r.key not in probed_keys
        proof = infer_infeasible(r.candidate_obj(), [x for x in out.records if x.number < r.number])
        assert proof is not None and proof.probed
    # slots=1: nothing was submitted that was already provably infeasible
    landed: list[TrialRecord] = []
    by_key = {r.key: r for r in out.records if r.phase == "search" and r.probed}
    for req in ex.requests:
        if req.settings.steps != SETTINGS.steps:
            continue  # confirmation
        assert infer_infeasible(req.candidate, landed) is None
        landed.append(by_key[candidate_id(req.candidate)])


def test_effective_batch_is_held_and_skips_are_reported() -> None:
    ex = FakeExecutor()
    out = make(ex).run()
    for req in ex.requests:
        c = req.candidate
        assert c.micro_batch * c.grad_accum * c.world_size == 16
        assert c.micro_batch != 3
    assert any("micro_batch 3" in s for s in out.skipped_choices)


def test_no_configuration_is_probed_twice() -> None:
    ex = FakeExecutor()
    tiny = parse_space({"micro_batch": [2, 4], "grad_ckpt": [False, True], "precision": ["fp32"]})
    out = make(ex, space=tiny, max_trials=20, top_k=0).run()
    keys = [candidate_id(r.candidate) for r in ex.requests]
    assert len(keys) == len(set(keys)) == 4  # the whole space, once each
    assert out.stop_reason.startswith("space exhausted")


def test_parallel_slots_are_used() -> None:
    ex = FakeExecutor(slots=3)
    out = make(ex, max_trials=12, top_k=0).run()
    assert ex.max_concurrent == 3
    assert out.counts["probed"] == 12
    keys = [candidate_id(r.candidate) for r in ex.requests]
    assert len(keys) == len(set(keys))


def test_a_crash_or_timeout_does_not_stop_the_search() -> None:
    def crash(c: Candidate) -> str | None:
        if c.attn == "eager":
            return "crash" if c.workers == 0 else "timeout"
        return None

    ex = FakeExecutor(crash=crash)
    s = make(ex, max_trials=20)
    out = s.run()
    assert out.counts["probed"] == 20
    assert out.counts["failed"] >= 1
    assert out.best is not None and out.best_record.candidate["attn"] == "sdpa"
    failed = [t for t in s.study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) >= out.counts["failed"]


def test_confirmation_chooses_on_the_confirmed_median() -> None:
    ex = FakeExecutor()
    out = make(ex, max_trials=25, top_k=3, confirm=ConfirmPolicy(min_rounds=2, max_rounds=2)).run()
    confirms = [r for r in ex.requests if r.settings.steps == SETTINGS.steps * 2]
    assert len(confirms) == 6  # top 3 x 2 rounds, longer window
    assert len(out.ranking) == 3
    # the figure is the re-measurements alone: the search value that selected it is not one of them
    assert all(e["status"] == "confirmed" and len(e["measurements"]) == 2 for e in out.ranking)
    assert out.best.metrics["confirmed_tokens_per_s"] == max(e["median_tokens_per_s"] for e in out.ranking)
    assert "measurement_spread" in out.best.metrics


def test_a_config_that_does_not_fit_on_re_measurement_is_not_chosen() -> None:
    state = {"confirming": False}

    def landscape(c: Candidate, seq: int) -> tuple[int, float]:
        peak, speed = synthetic(c, seq)
        return peak, speed

    ex = FakeExecutor(landscape=landscape)
    orig = ex.result_for

    def flaky(request):
        res = orig(request)
        if request.settings.steps == SETTINGS.steps * 2 and not state["confirming"]:
            state["confirming"] = True  # the first confirmation (of the fastest) goes over budget
            res.status, res.reason = "over_budget", "peak above budget on the longer window"
        return res

    ex.result_for = flaky
    out = make(ex, max_trials=20, top_k=3).run()
    failed = [e for e in out.ranking if e["status"] == "failed_confirm"]
    assert len(failed) == 1
    assert out.best_record.key != failed[0]["key"]


def test_time_budget_stops_the_search() -> None:
    now = {"t": 0.0}

    def clock() -> float:
        return now["t"]

    ex = FakeExecutor()
    orig = ex.poll

    def slow_poll(timeout=None):
        now["t"] += 10.0  # every probe takes 10 s of fake time
        return orig(timeout)

    ex.poll = slow_poll
    out = make(ex, max_trials=40, time_budget_s=95.0, clock=clock, top_k=0).run()
    assert out.stop_reason.startswith("time budget reached; the walk had not settled: ")
    assert out.counts["probed"] == 9  # the 10th would have ended past the budget


def test_the_first_probes_cold_start_is_not_reserved_for_every_probe_to_come() -> None:
    """The first probe also pays the executor's start (6 s here, 1 s for each next one, predicted 1 s): a 60 s budget
    had stopped after it, reserving twelve of its walls for a confirmation of four contenders."""
    now = {"t": 0.0, "n": 0}

    def clock() -> float:
        return now["t"]

    ex = FakeExecutor()
    orig = ex.poll

    def poll(timeout=None):
        out = orig(timeout)
        for _, result in out:
            now["n"] += 1
            now["t"] += 6.0 if now["n"] == 1 else 1.0
            result.metrics["predicted_s"] = 1.0
        return out

    ex.poll = poll
    out = make(ex, max_trials=8, time_budget_s=60.0, clock=clock, top_k=3).run()
    assert out.counts["probed"] >= 6, (out.counts, out.stop_reason)


def test_pruner_hook_records_inferred_without_probing() -> None:
    ex = FakeExecutor()
    out = make(ex, pruner=lambda c: "predicted 40 GiB > budget" if c.micro_batch == 16 else None).run()
    assert all(r.candidate.micro_batch != 16 for r in ex.requests)
    pruned = [r for r in out.records if r.inferred and "predicted" in r.reason]
    assert pruned and all(r.status == "over_budget" for r in pruned)


def test_a_pruner_that_rejects_every_configuration_stops_the_search_before_any_probe() -> None:
    ex = FakeExecutor()
    out = make(ex, pruner=lambda c: "predicted 40 GiB > budget").run()
    assert ex.requests == [] and out.records == [] and out.best is None
    assert out.stop_reason == "the memory model predicts every configuration far above the budget"
    # one configuration let through: the search runs
    ex = FakeExecutor()
    out = make(ex, max_trials=4, top_k=0, pruner=lambda c: None if c.micro_batch == 1 else "too big").run()
    assert ex.requests and out.stop_reason != "the memory model predicts every configuration far above the budget"


def test_resume_from_the_journal_does_not_re_run(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    journal: list[TrialRecord] = []
    first = FakeExecutor()
    make(first, max_trials=6, top_k=0, storage=storage, study_name="r", sink=journal.append).run()
    done = {r.key for r in journal if r.probed}
    assert len(done) == 6
    # a killed run leaves its in-flight asks RUNNING in the study: the resume must cope
    optuna.load_study(study_name="r", storage=storage).ask()
    second = FakeExecutor()
    out = make(second, max_trials=10, top_k=0, storage=storage, study_name="r",
               history=[TrialRecord.from_dict(r.to_dict()) for r in journal]).run()
    again = {candidate_id(r.candidate) for r in second.requests}
    assert not (again & done), "finished probes were re-run"
    assert len(second.requests) == 4 and out.counts["probed"] == 10


def test_resume_with_a_fresh_study_replays_the_journal_into_it() -> None:
    journal: list[TrialRecord] = []
    make(FakeExecutor(), max_trials=5, top_k=0, sink=journal.append).run()
    s = make(FakeExecutor(), max_trials=5, top_k=0, history=journal)
    out = s.run()
    assert out.counts["probed"] == 5
    restored = [t for t in s.study.get_trials(deepcopy=False) if t.user_attrs.get("restored")]
    assert len(restored) == 5


def test_bad_requests_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="no micro_batch in"):
        make(FakeExecutor(), space=parse_space({"micro_batch": [3, 5]}))
    with pytest.raises(SpecError, match="max trials must be an integer >= 1"):
        make(FakeExecutor(), max_trials=0)
    with pytest.raises(SpecError, match="no gpus_per_trial choice"):
        make(FakeExecutor(), space=parse_space({"micro_batch": [1], "gpus_per_trial": [4]}), max_world=2)


def test_multi_gpu_choices_above_the_hardware_are_skipped() -> None:
    space = parse_space({"micro_batch": [1, 2, 4], "gpus_per_trial": [1, 2, 8],
                         "zero_stage": [0, 2, 3], "offload": ["none", "optimizer", "params"]})
    ex = FakeExecutor(slots=2)
    out = make(ex, space=space, max_world=2, max_trials=15, top_k=0).run()
    assert any("gpus_per_trial 8 skipped" in s for s in out.skipped_choices)
    for req in ex.requests:
        c = req.candidate
        assert c.world_size in (1, 2) and c.micro_batch * c.grad_accum * c.world_size == 16
        assert not (c.offload == "params" and c.zero_stage != 3)


def test_exhausts_a_space_with_contradictory_corners() -> None:
    space = parse_space({"micro_batch": [2, 4], "zero_stage": [0, 3], "offload": ["none", "optimizer", "params"],
                         "sharding": ["deepspeed", "fsdp"]})
    ex = FakeExecutor()
    out = make(ex, space=space, max_trials=40, top_k=0).run()
    assert out.distinct_candidates == 12
    keys = [candidate_id(r.candidate) for r in ex.requests]
    assert len(keys) == len(set(keys)) == 12
    assert out.stop_reason.startswith("space exhausted")
    assert all(not (r.candidate.sharding == "fsdp" and r.candidate.offload == "optimizer") for r in ex.requests)


def test_ordinal_encoding_searches_and_resumes() -> None:
    journal: list[TrialRecord] = []
    first = make(FakeExecutor(), max_trials=6, top_k=0, ordinal=True, sink=journal.append)
    first.run()
    assert any(isinstance(t.params.get("micro_batch"), int) and t.params["micro_batch"] < 5
               for t in first.study.trials)
    assert all(r.params.get("micro_batch", 1) in SPACE.micro_batch for r in journal)  # plain values kept
    again = FakeExecutor()
    out = make(again, max_trials=9, top_k=0, ordinal=True, history=journal).run()
    assert len(again.requests) == 3 and out.counts["probed"] == 9


def test_a_baseline_outside_the_space_is_probed_once_and_ranked() -> None:
    hf = Candidate(micro_batch=4, grad_accum=4, attn="sdpa", precision="fp32", optim="adamw_torch_fused")
    ex = FakeExecutor()
    out = make(ex, max_trials=8, baseline=hf).run()
    keys = [candidate_id(r.candidate) for r in ex.requests if r.settings.steps == SETTINGS.steps]
    assert keys.count(candidate_id(hf)) == 1 and len(keys) == 8
    assert any(r.key == candidate_id(hf) and r.phase == "search" for r in out.records)
    assert candidate_id(ex.requests[0].candidate) != candidate_id(hf)  # not first: a cold start hits a seed
    # re-measured with the top-k, so the comparison is between confirmed medians
    assert any(e["key"] == candidate_id(hf) and e["status"] == "confirmed" for e in out.ranking)


def test_a_baseline_outside_the_space_is_not_counted_among_the_spaces_configurations() -> None:
    # three configurations in the space and the baseline beside it: all three are probed before the
    # space counts as exhausted (the baseline is not one of its distinct configurations), on resume too
    space = parse_space({"micro_batch": [1, 2, 4], "attn": ["sdpa"], "precision": ["fp32"], "optim": ["adamw_torch"],
                         "workers": [0], "pin_memory": [False], "packing": [False], "grad_ckpt": [False]})
    hf = Candidate(micro_batch=4, grad_accum=4, attn="sdpa", precision="fp32", optim="adamw_torch_fused")
    journal: list[TrialRecord] = []
    ex = FakeExecutor()
    out = make(ex, space=space, max_trials=10, top_k=0, baseline=hf, sink=journal.append).run()
    assert out.distinct_candidates == 3
    assert sorted(r.candidate.micro_batch for r in ex.requests if r.candidate.optim == "adamw_torch") == [1, 2, 4]
    assert out.stop_reason == "space exhausted (all 3 distinct configurations seen)" and out.counts["probed"] == 4
    cut = [TrialRecord.from_dict(r.to_dict()) for r in journal[:2]]  # a seed and the baseline
    assert candidate_id(hf) in {r.key for r in cut}
    again = FakeExecutor()
    resumed = make(again, space=space, max_trials=10, top_k=0, baseline=hf, history=cut).run()
    assert len(again.requests) == 2 and resumed.counts["probed"] == 4


def test_a_re_measure_in_flight_counts_once_among_the_configurations_seen() -> None:
    # two of three configurations seen, one of them re-measured in flight: the third may still start
    from autotune.search._searcher import _InFlight, _Loop

    space = parse_space({"micro_batch": [1, 2, 4], "attn": ["sdpa"], "precision": ["fp32"], "optim": ["adamw_torch"],
                         "workers": [0], "pin_memory": [False], "packing": [False], "grad_ckpt": [False]})
    s = make(FakeExecutor(slots=2), space=space, max_trials=10, top_k=0)
    assert s.distinct == 3
    cands = [Candidate(micro_batch=mb, grad_accum=16 // mb, attn="sdpa", precision="fp32") for mb in (1, 2)]
    loop = _Loop(start=0.0, cache={candidate_id(c): _rec(c, "ok") for c in cands}, probes=2)
    loop.in_flight["t9"] = _InFlight(None, cands[0], candidate_id(cands[0]), {}, remeasure=True)
    loop.in_flight_keys[candidate_id(cands[0])] = "t9"
    assert s._why_stop(loop) == ""
    loop.cache["k3"] = _rec(cands[1], "ok")  # the third seen: now the space is exhausted
    assert s._why_stop(loop).startswith("space exhausted")


def test_a_baseline_inside_the_space_is_an_ordinary_trial() -> None:
    hf = Candidate(micro_batch=8, grad_accum=2, attn="sdpa", precision="fp32", optim="adamw_torch", pin_memory=False)
    ex = FakeExecutor()
    s = make(ex, max_trials=6, baseline=hf)
    s.run()
    assert [candidate_id(r.candidate) for r in ex.requests].count(candidate_id(hf)) == 1
    assert any(t.user_attrs.get("key") == candidate_id(hf) for t in s.study.trials)


# ----------------------------------------------------------------------------- the neighbourhood walk


def _fitting_optimum() -> float:
    usable = SETTINGS.usable_bytes()
    best = 0.0
    for choice in iter_choices(SPACE, micro_batches=[1, 2, 4, 8, 16], worlds=[1]):
        c = candidate_from_choice(choice, effective_batch=16)
        if isinstance(c, Candidate):
            peak, speed = synthetic(c)
            if peak <= usable:
                best = max(best, speed)
    return best


def test_the_neighbourhood_walk_finds_the_optimum_of_a_multiplicative_landscape_in_ten_probes() -> None:
    opt = _fitting_optimum()
    for seed in range(4):
        out = make(FakeExecutor(), max_trials=10, top_k=0, seed=seed).run()
        assert out.best_record is not None and out.best_record.tokens_per_s == pytest.approx(opt), seed
    # what the walk is for: with the same ten probes, seeds + boundary follow-ups + TPE alone miss it
    alone = [make(FakeExecutor(), max_trials=10, top_k=0, seed=s, neighbours=False).run().best_record
             for s in range(4)]
    assert any(r is None or (r.tokens_per_s or 0.0) < 0.99 * opt for r in alone)


def test_the_changes_that_beat_the_centre_are_tried_together_and_a_harmful_one_is_not_retried() -> None:
    from autotune.search._walk import one_knob_change as _change

    ex = FakeExecutor()
    out = make(ex, max_trials=10, top_k=0, seed=0).run()
    probed = [r for r in out.records if r.probed]
    ok = [r for r in probed if r.status == "ok"]
    centre = max(ok[:3], key=lambda r: r.tokens_per_s or 0.0)  # best of the seeds (the baseline is not set)
    base = centre.candidate_obj()
    singles = {}
    for r in probed:
        ch = _change(base, r.candidate_obj())
        if ch is not None and ch[0] != "grad_ckpt":
            singles[ch] = r
    better = {ch for ch, r in singles.items() if r.status == "ok" and r.tokens_per_s > centre.tokens_per_s}
    assert len(better) >= 2 and any(r.status == "ok" and r.tokens_per_s < centre.tokens_per_s for r in singles.values())
    combined = dataclasses.replace(base, **dict(better))
    keys = [r.key for r in probed]
    assert candidate_id(combined) in keys
    assert next(r for r in probed if r.key == candidate_id(combined)).origin == "combination"
    assert {singles[ch].origin for ch in singles} == {"neighbour"}
    # the first seed is over budget: its own step-down (same levers, the next smaller micro-batch)
    # comes before the other seeds
    assert [r.origin for r in probed[:4]] == ["seed", "boundary", "seed", "seed"] and probed[0].status == "over_budget"
    first, down = probed[0].candidate_obj(), probed[1].candidate_obj()
    assert dataclasses.replace(down, micro_batch=first.micro_batch, grad_accum=first.grad_accum) == first
    assert down.micro_batch < first.micro_batch
    assert keys.index(candidate_id(combined)) > max(keys.index(r.key) for r in singles.values())
    # eager attention lost to sdpa at the first centre: no later centre tries it again
    assert sum(r.candidate_obj().attn == "eager" for r in probed) == 1
    assert _change(base, dataclasses.replace(base, micro_batch=4, attn="eager")) is None  # two knobs: not one change


def test_a_step_down_from_over_budget_goes_before_the_walk() -> None:
    from autotune.search._walk import FollowUps

    records: list[TrialRecord] = []
    walk = FollowUps(choices={"micro_batch": [1, 2, 4, 8], "grad_ckpt": [False, True], "attn": ["eager", "sdpa"]},
                     micro_batches=[1, 2, 4, 8], grad_ckpt_choices=(False, True), effective_batch=8,
                     in_space=lambda c: True, records=lambda: records)

    def land(status: str, tps: float | None, **kw) -> TrialRecord:
        c = Candidate(**{"micro_batch": 1, "grad_accum": 8, "attn": "sdpa", **kw})
        c = dataclasses.replace(c, grad_accum=8 // c.micro_batch)
        r = TrialRecord(key=candidate_id(c), status=status, candidate=dataclasses.asdict(c), tokens_per_s=tps,
                        result={"status": status}, origin="seed")
        records.append(r)
        walk.after_probe(r, {x.key: x for x in records})
        return r

    land("over_budget", None, micro_batch=8)  # no checkpointing: too big
    land("ok", 100.0, micro_batch=1, grad_ckpt=True)  # the first centre
    cache = {r.key: r for r in records}
    first = walk.next(cache, {})
    assert first is not None and (first.micro_batch, first.grad_ckpt) == (4, False)  # the step-down leads
    assert walk.origins[candidate_id(first)] == "boundary"
    second = walk.next(cache, {candidate_id(first): "t"})
    assert second is not None and (second.micro_batch, second.grad_ckpt) == (2, True)  # then the walk climbs


def test_a_seed_the_memory_model_prunes_steps_down_to_the_largest_micro_batch_it_lets_through() -> None:
    """On a GPU the pruner skips a configuration predicted far over the budget: its step-downs follow as after an
    over-budget probe (those also pruned cost nothing), so the first it lets through is probed, as the step-downs
    of a probed one would have found it."""
    ex = FakeExecutor()
    # the model sees no-checkpointing as far over at any micro-batch above 1, checkpointing above 4
    pruner = (lambda c: "predicted 40 GiB > budget"  # noqa: E731
              if c.micro_batch > (4 if c.grad_ckpt else 1) else None)
    out = make(ex, max_trials=12, top_k=0, pruner=pruner).run()
    seeds = [r for r in out.records if r.origin == "seed" and r.inferred]
    assert seeds, "no seed was pruned: the case does not apply"
    for seed in seeds:
        down = dataclasses.replace(seed.candidate_obj(), micro_batch=4 if seed.candidate["grad_ckpt"] else 1)
        down = dataclasses.replace(down, grad_accum=16 // down.micro_batch)
        rec = next((r for r in out.records if r.key == candidate_id(down)), None)
        assert rec is not None and rec.probed and rec.origin == "boundary", seed.label


def test_a_walk_stopped_by_max_trials_says_what_it_had_left() -> None:
    """A --max-trials too small for the walk to settle is not an error: the run answers, and its stop reason
    says how many configurations the walk still had queued around the best, and the next one."""
    out = make(FakeExecutor(), max_trials=4, top_k=0).run()
    assert out.stop_reason.startswith("max trials (4) reached; the walk had not settled: "), out.stop_reason
    assert "queued around the best (the next: mb" in out.stop_reason and "more trials or time" in out.stop_reason
    settled = make(FakeExecutor(), max_trials=200, top_k=0, stop_when_converged=True).run()
    assert "had not settled" not in settled.stop_reason, settled.stop_reason
