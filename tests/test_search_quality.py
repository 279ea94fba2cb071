"""benchmarks/search_quality.py: strategies scored on a landscape through the replay executor."""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import record_landscape  # noqa: E402
import search_quality as sq  # noqa: E402

from autotune.search import candidate_id  # noqa: E402
from autotune.spec.probe_request import Candidate  # noqa: E402
from autotune.spec.space import SearchSpace  # noqa: E402

MiB = 2**20
SPACE = SearchSpace(micro_batch=(1, 2, 4, 8), grad_ckpt=(False, True), attn=("eager", "sdpa"), packing=(False, True),
                    precision=("fp32",), pin_memory=(False,), optim=("adamw_torch_fused",), workers=(0,))


def _speed_mem(c: Candidate) -> tuple[float, int]:
    """Memory grows with micro-batch (checkpointing saves it); speed grows with it, packing helps."""
    mem = 100 * MiB + int(15 * MiB * c.micro_batch * (0.4 if c.grad_ckpt else 1.0))
    tps = 300.0 * c.micro_batch ** 0.5 * (0.8 if c.grad_ckpt else 1.0) * (1.5 if c.packing else 1.0)
    tps *= 1.1 if c.attn == "sdpa" else 1.0
    return tps, mem


def landscape(budget: int = 190 * MiB) -> dict:
    entries = []
    for c in record_landscape.grid(SPACE, 8):
        tps, mem = _speed_mem(c)
        reps = [{"status": "ok", "metrics": {"tokens_per_s": tps * f, "peak_mem_bytes": mem, "process_wall_s": 20.0}}
                for f in (0.95, 1.05)]
        entries.append({"id": candidate_id(c), "candidate": dataclasses.asdict(c), "repeats": reps})
    land = {"model": "tiny-llama", "device": "cpu", "seq_len": 128, "lengths": "lognormal:3.5,1.0",
            "effective_batch": 8, "budget_bytes": budget, "headroom": 0.05, "steps": 3, "warmup_steps": 1,
            "space": SPACE.to_dict(), "entries": entries, "space_name": "test"}
    return record_landscape.relabel(land)


def test_relabel_decides_fit_from_the_landscape_budget() -> None:
    land = landscape()
    assert land["grid_size"] == 32 and 0 < land["infeasible_share"] < 0.5
    over = [e for e in land["entries"] if e["status"] == "over_budget"]
    assert all(e["peak_mem_bytes"] > 190 * MiB * 0.95 for e in over) and "usable" in over[0]["reason"]


def test_largest_micro_batch_takes_the_largest_that_fits_at_hf_defaults() -> None:
    p = sq.problem(landscape())
    chosen, ex = sq.run_largest_mb(p, 0, 99)
    # HF defaults: sdpa, no checkpointing, no packing; 8 does not fit (220 MiB), 4 does (160 MiB)
    assert (chosen.micro_batch, chosen.grad_ckpt, chosen.packing, chosen.attn) == (4, False, False, "sdpa")
    assert ex.probes == 2


def test_deepspeed_strategy_walks_its_stages_and_stops_when_not_5_percent_better() -> None:
    p = sq.problem(landscape())
    chosen, ex = sq.run_deepspeed(p, 0, 99)
    assert chosen is not None and not chosen.packing  # DeepSpeed leaves the other knobs alone
    assert ex.probes >= 4


def test_evaluate_scores_every_strategy_and_the_last_line_is_autotunes_summary() -> None:
    p = sq.problem(landscape())
    res = sq.evaluate(p, seeds=3, share=0.25)
    assert set(res["strategies"]) == {*sq.STRATEGIES, sq.REFERENCE, sq.WALK_AT_MODEL, sq.ZERO_PROBE}
    assert res["probe_budget"] == 8 and res["strategies"][sq.ZERO_PROBE]["probes_median"] == 0
    assert res["strategies"]["model"]["probes_median"] == round(statistics.median(res["strategies"]["model"]["shares"]) * 32)
    paired = res["strategies"][sq.WALK_AT_MODEL]["shares"]  # given the model's probe count (it may settle sooner)
    assert all(a <= b + 2 / 32 for a, b in zip(paired, res["strategies"]["model"]["shares"], strict=True))
    auto = res["strategies"]["autotune"]
    assert all(0.0 <= r <= 1.0 for r in auto["ratios"]) and max(auto["shares"]) <= 8 / 32
    assert res["strategies"]["random"]["shares"] == auto["shares"]  # the same probe count
    text = sq.render([res], 3, 0.25)
    last = text.splitlines()[-1]
    assert last.startswith("autotune: best/optimum ") and "of the grid's probes" in last


def test_the_zero_probe_pick_is_the_fastest_by_the_prior_among_those_it_predicts_to_fit() -> None:
    p = sq.problem(landscape())
    prior = sq.model_prior(p)
    chosen, ex = sq.run_zero_probe(p, 0, 99)
    assert ex.probes == 0 and chosen is not None and prior.memory(chosen) <= 0
    fitting = [c for c in p.grid if prior.memory(c) <= 0]
    assert (prior.speed(chosen), chosen.micro_batch) == max((prior.speed(c), c.micro_batch) for c in fitting)
    # with a budget the prior puts everything over, there is no pick (scored 0)
    tight = dataclasses.replace(p, settings=dataclasses.replace(p.settings, budget_bytes=1 * MiB))
    assert sq.run_zero_probe(tight, 0, 99)[0] is None and tight.score(None) == 0.0


def test_main_reads_landscape_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    f = tmp_path / "cpu-x-test.json"
    f.write_text(json.dumps(landscape()))
    sq.main([str(f), "--seeds", "2", "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr().out
    assert "cpu-x-test: grid 32 configurations" in out and (tmp_path / "out.json").exists()


def test_recorded_landscapes_load_and_have_a_feasible_optimum() -> None:
    files = sorted((REPO / "benchmarks" / "landscapes").glob("*.json"))
    assert len(files) >= 2
    for f in files:
        p = sq.problem(f)
        assert p.optimum > 0 and len(p.grid) == p.landscape["grid_size"]


def test_knob_effects_are_the_ratios_of_one_knob_pairs() -> None:
    import knob_effects

    def entry(packing: bool, attn: str, tps: float) -> dict:
        return {"candidate": {"micro_batch": 2, "packing": packing, "attn": attn}, "tokens_per_s": tps}

    land = {"space": {"micro_batch": [1, 2], "packing": [False, True], "attn": ["eager", "sdpa"]},
            "entries": [entry(False, "eager", 100.0), entry(True, "eager", 200.0), entry(False, "sdpa", 110.0),
                        entry(True, "sdpa", 330.0)]}
    eff = knob_effects.effects(land)
    assert eff["packing=True vs False"] == (2.5, 2.0, 3.0, 2)
    assert eff["attn=sdpa vs eager"][1:] == (1.1, 1.65, 2)
    assert not any(k.startswith("micro_batch") for k in eff)


def test_packing_on_fixed_length_landscape_f_gains_nothing_and_costs_memory() -> None:
    """The figures behind leaving packing out of a fixed-length situation's space (docs/search.md): on landscape F
    (fixed 256-token rows) packed / unpacked tok/s 0.96-1.02 over 12 pairs, peaks 1.01-1.13 (median 1.05)."""
    import knob_effects

    land = json.loads((REPO / "benchmarks" / "landscapes" / "cpu-tiny-llama-landscape-cpu-f.json").read_text())
    assert land["lengths"] == "fixed"
    med, lo, hi, n = knob_effects.effects(land)["packing=True vs False"]
    assert n == 12 and 0.95 < lo and hi < 1.03 and abs(med - 1) < 0.02
    med, lo, hi, n = knob_effects.effects(land, "peak_mem_bytes")["packing=True vs False"]
    assert n == 12 and 1.0 < lo and hi < 1.15 and 1.03 < med < 1.07


def test_seed_only_steps_the_first_seed_down_until_it_fits_and_unpacked_best_is_reported() -> None:
    p = sq.problem(landscape(budget=150 * MiB))
    chosen, ex = sq.run_seed_only(p, 0, 99)
    # the first seed: micro-batch 8, no checkpointing, sdpa, packed (lengths vary); 8 and 4 do not
    # fit 150 MiB (220, 160 MiB), 2 does
    assert (chosen.micro_batch, chosen.grad_ckpt, chosen.packing, chosen.attn) == (2, False, True, "sdpa")
    assert ex.probes == 3
    res = sq.evaluate(p, seeds=1, share=0.25)
    # packing is worth 1.5x here: the best unpacked configuration is 1/1.5 of the optimum
    assert res["unpacked_best_over_optimum"] == pytest.approx(1 / 1.5)
    assert "unpacked-best 0.667" in sq.render([res], 1, 0.25)


def test_the_new_landscapes_budget_rule_puts_the_usable_memory_at_the_median_peak() -> None:
    land = landscape()
    text = record_landscape.median_budget_text(land)
    land["budget_bytes"] = int(text.removesuffix("MiB")) * MiB
    record_landscape.relabel(land)
    over = sum(e["status"] == "over_budget" for e in land["entries"])
    assert abs(over - len(land["entries"]) / 2) <= 2  # about half (ties at the median fit)
    land["entries"][0]["peak_mem_bytes"] = None
    with pytest.raises(SystemExit, match="finish the recording"):
        record_landscape.median_budget_text(land)


def test_stop_when_converged_ends_the_search_once_the_walk_settles_with_the_baseline_measured() -> None:
    """On a recorded 80-configuration landscape (C), with a 40-probe budget: the converged search stops well
    short of it, says why, has measured the HF default, and picks as well as the full search here."""
    import optuna

    from autotune.executors.replay import ReplayExecutor
    from autotune.search import Searcher, candidate_id

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    p = sq.problem(REPO / "benchmarks" / "landscapes" / "cpu-tiny-llama-landscape-cpu-c.json")
    base = sq._baseline(p)
    assert base is not None
    outs = {}
    for stop in (False, True):
        ex = ReplayExecutor(p.landscape, seed=0, noise=True)
        outs[stop] = Searcher(space=p.space, workload=p.workload, settings=p.settings, effective_batch=p.effective_batch,
                              executor=ex, max_trials=34, seed=0, top_k=2, device="cpu", baseline=base,
                              poll_interval_s=0.0, stop_when_converged=stop).run()
    full, settled = outs[False], outs[True]
    assert full.stop_reason.startswith("max trials") and settled.stop_reason.startswith("converged")
    probed = lambda o: sum(1 for r in o.records if r.phase == "search" and r.probed)  # noqa: E731
    assert probed(settled) < probed(full) / 2
    assert any(r.key == candidate_id(base) and r.probed for r in settled.records)
    assert settled.best_record is not None and full.best_record is not None
    assert (p.truth.true_tokens_per_s(settled.best_record.candidate_obj()) or 0) >= 0.97 * p.optimum


def test_spearman_matches_the_rank_correlation_with_ties_averaged() -> None:
    import calibration

    assert calibration.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert calibration.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties take their average rank: ranks (0.5, 0.5, 2, 3) against (0, 1, 2, 3)
    assert calibration.spearman([5, 5, 6, 7], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert calibration.spearman([1, 2], [1, 2]) is None and calibration.spearman([1, 1, 1], [1, 2, 3]) is None


def test_calibration_fits_on_the_strategys_first_probes_and_scores_the_rest() -> None:
    import calibration

    p = sq.problem(landscape())
    r = calibration.calibrate(p, 0, 3)
    assert len(r["first"]) == 3 and len(set(r["first"])) == 3
    fitting = {candidate_id(c) for c in p.grid if p.score(c) > 0}
    assert r["ranked"] == len(fitting - set(r["first"]))
    assert -1.0 <= r["spearman"] <= 1.0 and 0.0 <= r["memory_within"] <= 1.0
    # more probes, a model that knows more: the ranking does not get worse on a landscape whose speeds are lever
    # effects multiplied, with fixed lengths (no padding, which the prior would model and this landscape lacks)
    fixed = sq.problem({**landscape(), "lengths": "fixed"})
    assert calibration.calibrate(fixed, 0, 8)["spearman"] >= calibration.calibrate(fixed, 0, 3)["spearman"] - 1e-9


def test_calibration_reports_how_the_recording_agrees_with_itself_and_packings_gain() -> None:
    import calibration

    p = sq.problem(landscape())
    # every configuration's two repeats are 0.95x and 1.05x its speed: each ranks the grid as the other does
    assert calibration.repeat_agreement(p) == pytest.approx(1.0)
    gains = calibration.layout_gains(p)
    assert gains and all(n >= 1 for _, _, n in gains.values())
    predicted = [pred for pred, _, _ in gains.values()]
    assert predicted == sorted(predicted)  # a larger micro-batch pads more, so packing gains more
    if 1 in gains:
        assert gains[1][0] == pytest.approx(0.0)  # one sequence per micro-batch: nothing to pack


def test_calibration_refuses_a_missing_landscape_or_no_seeds_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import calibration

    for argv, said in (([str(tmp_path / "nope.json")], "no landscape file"), (["--seeds", "0"], "at least 1")):
        with pytest.raises(SystemExit) as exc:
            calibration.main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and said in err and len(err.strip().splitlines()) == 1
