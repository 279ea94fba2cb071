"""The model strategy: the fit, its uncertainty, the rules that leave configurations out, the stop rule,
and the strategy end to end through the Searcher on a replayed landscape (no probes: seconds)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from autotune.search._model import (
    MARGIN,
    SPEED_PRIOR_SD,
    LeverModel,
    ModelPolicy,
    ModelStop,
    Option,
    Row,
    log_evidence,
)

REPO = Path(__file__).resolve().parents[1]
DIMS = {"micro_batch": [1, 2, 4], "attn": ["eager", "sdpa"], "packing": [False, True]}


def _options(prior: dict[str, float] | None = None) -> list[Option]:
    out = []
    for mb in DIMS["micro_batch"]:
        for attn in DIMS["attn"]:
            for packing in DIMS["packing"]:
                choice = {"micro_batch": mb, "attn": attn, "packing": packing}
                key = f"mb{mb}-{attn}-{packing}"
                out.append(Option(key=key, choice=choice, memory_prior=(prior or {}).get(key)))
    return out


def _truth(choice: dict) -> float:
    """log tok/s of an additive landscape: micro-batch 2 +20 %, 4 +30 %; sdpa +10 %; packing +40 %."""
    return (math.log(1000.0) + {1: 0.0, 2: 0.18, 4: 0.26}[choice["micro_batch"]]
            + (0.1 if choice["attn"] == "sdpa" else 0.0) + (0.34 if choice["packing"] else 0.0))


def test_the_fit_recovers_additive_effects_and_an_untried_value_keeps_its_prior_width() -> None:
    features = [(d, v) for d, vs in DIMS.items() for v in vs[1:]]
    m = LeverModel(features, prior_sd=SPEED_PRIOR_SD, noise_sd=0.02)
    tried = [o.choice for o in _options() if o.choice["micro_batch"] != 4]  # micro-batch 4 never measured
    m.fit(tried, [_truth(c) for c in tried])
    for c in tried:
        mean, sd = m.predict(c)
        assert abs(mean - _truth(c)) < 0.03 and sd < 0.05
    _, sd4 = m.predict({"micro_batch": 4, "attn": "sdpa", "packing": True})
    assert sd4 > 0.8 * SPEED_PRIOR_SD  # nothing measured at 4: as uncertain as the prior says
    # a misfit the additive form cannot hold (a three-lever interaction: the parity of the row's index
    # bits) widens the noise to the residual spread
    noisy = [_truth(c) + (0.2 if bin(i).count("1") % 2 else -0.2) for i, c in enumerate(tried)]
    m.fit(tried, noisy)
    assert m.fitted_noise_sd > 0.1


def _search(options: list[Option], truth, over: set[str] = frozenset(), first: tuple[str, ...] = ()):
    policy = ModelPolicy(options, DIMS, first=first, noise_sd=0.02)
    by_key = {o.key: o for o in options}
    rows: list[Row] = []
    while True:
        key, stop = policy.next(rows, set())
        if key is None:
            return rows, stop
        o = by_key[key]
        status = "over_budget" if key in over else "ok"
        rows.append(Row(option=o, status=status, tokens_per_s=math.exp(truth(o.choice)) if status == "ok" else 0.0,
                        memory=0.1 if status != "ok" else -0.2, proposed=True))


def test_the_policy_finds_the_best_and_stops_saying_what_it_ruled_out() -> None:
    options = _options()
    rows, stop = _search(options, _truth, first=("mb1-sdpa-False",))
    assert rows[0].key == "mb1-sdpa-False"  # the experts' guess is the calibration probe
    best = max(rows, key=lambda r: r.tokens_per_s)
    assert best.key == "mb4-sdpa-True"
    assert len(rows) < len(options)  # the model decided some without a probe
    assert isinstance(stop, ModelStop) and stop.ruled_out == len(options) - len(rows)
    assert f"by more than {MARGIN:.0%}" in stop.text and "tok/s as fitted" in stop.text


def test_a_probe_over_budget_rules_out_what_needs_more_memory() -> None:
    over = ModelPolicy._proven_over
    assert over({"micro_batch": 4, "grad_ckpt": False, "attn": "sdpa"}, [{"micro_batch": 2, "grad_ckpt": False,
                                                                          "attn": "sdpa"}])
    # checkpointing on did not fit: off needs more
    assert over({"micro_batch": 2, "grad_ckpt": False, "attn": "sdpa"}, [{"micro_batch": 2, "grad_ckpt": True,
                                                                          "attn": "sdpa"}])
    # a smaller micro-batch, or another lever changed: the probe proves nothing about it
    assert not over({"micro_batch": 1, "grad_ckpt": False, "attn": "sdpa"}, [{"micro_batch": 2, "grad_ckpt": False,
                                                                              "attn": "sdpa"}])
    assert not over({"micro_batch": 4, "grad_ckpt": False, "attn": "eager"}, [{"micro_batch": 2, "grad_ckpt": False,
                                                                               "attn": "sdpa"}])
    rows, stop = _search(_options(), _truth, over={"mb2-sdpa-True"})
    assert "mb4-sdpa-True" not in {r.key for r in rows} and stop is not None and stop.over_budget >= 1


def test_the_memory_prior_keeps_configurations_predicted_far_over_budget_unprobed() -> None:
    # the estimator puts micro-batch 4 at twice the usable budget (log 2 = 0.69): never proposed
    prior = {o.key: (0.69 if o.choice["micro_batch"] == 4 else -0.5) for o in _options()}
    rows, stop = _search(_options(prior), _truth)
    assert all(r.option.choice["micro_batch"] != 4 for r in rows)
    assert stop is not None and stop.over_budget == 4
    assert max(rows, key=lambda r: r.tokens_per_s).key == "mb2-sdpa-True"


def test_the_cost_prior_charges_recompute_and_grows_memory_with_the_micro_batch() -> None:
    import json

    from autotune.estimate import CostPrior
    from autotune.models import resolve_model
    from autotune.spec.probe_request import Candidate, Workload

    resolved = resolve_model("tiny-llama")
    config = json.loads((Path(resolved.path) / "config.json").read_text())
    prior = CostPrior(config, Workload(model="tiny-llama", seq_len=256), device="cpu", usable_bytes=400 * 2**20)
    plain, ckpt = Candidate(micro_batch=4, grad_accum=4), Candidate(micro_batch=4, grad_accum=4, grad_ckpt=True)
    assert prior.speed(ckpt) < prior.speed(plain)  # the recomputed forward
    assert prior.memory(Candidate(micro_batch=8, grad_accum=2)) > prior.memory(plain) > prior.memory(ckpt)


def test_the_speed_prior_counts_padding_and_a_fixed_cost_per_micro_batch() -> None:
    import json

    from autotune.estimate import FIXED_COSTS, CostPrior, arch_from_config
    from autotune.estimate.speed import flops_per_real_token, hardware_flops_per_token
    from autotune.models import resolve_model
    from autotune.spec.probe_request import Candidate, Workload

    config = json.loads((Path(resolve_model("tiny-llama").path) / "config.json").read_text())
    arch = arch_from_config(config)
    fixed, chat = Workload(model="tiny-llama", seq_len=256), Workload(model="tiny-llama", seq_len=256,
                                                                      lengths="lognormal:3.5,1.0")

    def c(mb: int, **kw: object) -> Candidate:
        return Candidate(micro_batch=mb, grad_accum=8 // mb, **kw)

    assert flops_per_real_token(arch, fixed, c(8)) == pytest.approx(hardware_flops_per_token(arch, 256, "full"))
    padded, packed = flops_per_real_token(arch, chat, c(8)), flops_per_real_token(arch, chat, c(8, packing=True))
    flat = flops_per_real_token(arch, chat, c(8, packing=True, attn="flash_attention_2"))
    assert padded > 1.5 * packed and packed > flat  # short chat rows padded to the batch's longest
    # one sequence per micro-batch: nothing to pad, nothing to pack
    assert flops_per_real_token(arch, chat, c(1)) == pytest.approx(flops_per_real_token(arch, chat, c(1, packing=True)))
    prior = CostPrior(config, fixed, device="cpu", usable_bytes=400 * 2**20)
    s1, s8 = prior.speeds(c(1)), prior.speeds(c(8))
    assert len(s1) == len(FIXED_COSTS) and FIXED_COSTS[0] == 0.0 and prior.speed(c(1)) == s1[0]
    # with no fixed cost the micro-batch changes nothing per token; with one, a larger micro-batch spreads it
    assert s8[0] == pytest.approx(s1[0]) and all(b - a > 0 for a, b in zip(s1[1:], s8[1:], strict=True))
    assert [b - a for a, b in zip(s1, s8, strict=True)] == sorted(b - a for a, b in zip(s1, s8, strict=True))


def test_on_a_dataset_run_the_speed_prior_draws_its_layout_from_the_datasets_lengths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from autotune.estimate import CostPrior
    from autotune.models import resolve_model
    from autotune.run import dataset_lengths
    from autotune.spec.probe_request import Candidate, Workload

    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    ds = tmp_path / "ids.jsonl"
    ds.write_text("".join(json.dumps({"input_ids": list(range(1, n + 1))}) + "\n" for n in (30, 250, 12, 400, 60, 9)))
    wl = Workload(model="tiny-llama", seq_len=256, dataset=str(ds))
    assert dataset_lengths(wl) == [30, 250, 12, 256, 60, 9]  # as the probes read them: truncated to seq_len
    assert dataset_lengths(Workload(model="tiny-llama", seq_len=256)) == []
    config = json.loads((Path(resolve_model("tiny-llama").path) / "config.json").read_text())
    plain = CostPrior(config, wl, device="cpu", usable_bytes=400 * 2**20)  # the workload's lengths say "fixed"
    real = CostPrior(config, wl, device="cpu", usable_bytes=400 * 2**20, lengths_sample=dataset_lengths(wl))
    padded, packed = Candidate(micro_batch=4, grad_accum=2), Candidate(micro_batch=4, grad_accum=2, packing=True)
    assert plain.speed(packed) == plain.speed(padded)  # nothing to pad without the dataset's lengths
    assert real.speed(packed) > real.speed(padded) + 0.3  # short rows padded to the batch's longest


def test_the_evidence_is_the_gaussian_likelihood_and_picks_the_fixed_cost_that_made_the_speeds() -> None:
    model = LeverModel([("micro_batch", 2)], prior_sd=0.3, noise_sd=0.1, intercept_sd=2.0)
    # one row switching on the intercept and one term: y ~ N(0, 2^2 + 0.3^2 + 0.1^2)
    var = 4.0 + 0.09 + 0.01
    assert log_evidence(model, [{"micro_batch": 2}], [0.7]) == pytest.approx(
        -0.5 * 0.7**2 / var - 0.5 * math.log(2 * math.pi * var))
    ks = (0.0, 0.3, 3.0)

    def opts() -> list[Option]:
        return [Option(key=f"mb{mb}", choice={"micro_batch": mb},
                       speed_prior=tuple(-math.log(1.0 + k / mb) for k in ks)) for mb in (1, 2, 4, 8, 16)]

    policy = ModelPolicy(opts(), {"micro_batch": [1, 2, 4, 8, 16]})
    by = {o.key: o for o in policy.options}

    def rows(keys: list[str], j: int) -> list[Row]:
        return [Row(by[k], "ok", 1000.0 * math.exp(by[k].speed_prior[j]), None, True) for k in keys]

    assert policy.models(rows(["mb1"], 2))[0].index == 0  # one row cannot tell the priors apart: the first
    for j in range(len(ks)):
        speed, _ = policy.models(rows(["mb1", "mb4", "mb16"], j))
        assert speed.index == j
        # the chosen prior ranks the unprobed micro-batches as the truth does
        assert speed.predict(by["mb8"])[0] >= speed.predict(by["mb2"])[0] - 1e-9


def test_a_probe_is_chosen_by_its_expected_gain_per_second() -> None:
    import dataclasses

    # after the calibration probe (sdpa), an untried eager configuration promises the most (its kernel's effect
    # is still as uncertain as the prior): it goes next when every probe costs the same ...
    first = next(o for o in _options() if o.key == "mb1-sdpa-False")
    rows = [Row(option=first, status="ok", tokens_per_s=1000.0, memory=-0.2, proposed=True)]
    key, _ = ModelPolicy(_options(), DIMS, noise_sd=0.02).next(rows, set())
    assert key is not None and "eager" in key
    # ... but not when its probe is predicted to take three times as long as an sdpa one
    options = [dataclasses.replace(o, cost=30.0 if o.choice["attn"] == "eager" else 10.0) for o in _options()]
    rows = [dataclasses.replace(rows[0], option=next(o for o in options if o.key == first.key))]
    key, _ = ModelPolicy(options, DIMS, noise_sd=0.02).next(rows, set())
    assert key is not None and "sdpa" in key


def test_the_sampler_costs_each_option_by_its_predicted_probe_time() -> None:
    from autotune.search import AutotuneSampler, SamplerSettings
    from autotune.spec.space import SearchSpace

    space = SearchSpace(micro_batch=(1, 2, 4), grad_ckpt=(False,), attn=("sdpa", "eager"), precision=("fp32",),
                        packing=(False,), workers=(0,), pin_memory=(False,), torch_compile=(False,), liger=(False,))

    def policy(predict):
        return AutotuneSampler(space, SamplerSettings(strategy="model", device="cpu", probe_seconds=predict),
                               effective_batch=4).model_policy()

    costs = {o.choice["micro_batch"]: o.cost for o in policy(lambda c: 2.0 * c.micro_batch).options}
    assert costs == {1: 2.0, 2: 4.0, 4: 8.0}
    # one it cannot price costs the median of the others; none priced, or no predictor: all the same
    costs = {(o.choice["micro_batch"], o.choice["attn"]): o.cost
             for o in policy(lambda c: None if c.attn == "eager" and c.micro_batch == 4 else float(c.micro_batch)).options}
    assert costs[(4, "eager")] == 2.0 and costs[(4, "sdpa")] == 4.0
    assert {o.cost for o in policy(lambda c: None).options} == {1.0}
    assert {o.cost for o in policy(None).options} == {1.0}


def test_the_model_strategy_through_the_searcher_on_a_recorded_landscape() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import search_quality as sq

    p = sq.problem(REPO / "benchmarks" / "landscapes" / "cpu-tiny-llama-landscape-cpu-f.json")
    import optuna

    from autotune.executors.replay import ReplayExecutor
    from autotune.search import Searcher

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    ex = ReplayExecutor(p.landscape, seed=0, noise=True)
    searcher = Searcher(space=p.space, workload=p.workload, settings=p.settings, effective_batch=p.effective_batch,
                        executor=ex, max_trials=len(p.grid), seed=0, top_k=2, device="cpu", baseline=sq._baseline(p),
                        poll_interval_s=0.0, strategy="model", prior=sq.model_prior(p), deadlines=sq.run_deadlines(p))
    out = searcher.run()
    # each configuration's cost is its probe's predicted seconds, as the run's deadlines predict them
    costs = {o.key: o.cost for o in searcher.sampler.model_policy().options}
    assert len(set(costs.values())) > 1 and all(v > 1.0 for v in costs.values())
    assert out.stop_reason.startswith("the model rules out")
    assert p.score(out.best_record.candidate_obj()) >= 0.97
    origins = {r.origin for r in out.records if r.phase == "search"}
    assert "model" in origins and origins <= {"baseline", "seed", "model"}
    assert ex.probes < len(p.grid)
    # the winner's alternatives, each lever changed alone: measured or predicted
    kinds = {d["decided_by"] for d in out.lever_decisions}
    assert out.lever_decisions and kinds <= {"probe", "model"} and "probe" in kinds


def test_on_a_known_gpu_the_memory_prior_is_the_planners_with_its_cuda_context() -> None:
    from autotune.estimate import CostPrior, arch_from_config, estimate_memory, find_gpu
    from autotune.models import resolve_model
    from autotune.spec.probe_request import Candidate, Workload

    config = resolve_model("llama-3.1-8b").config
    wl = Workload(model="llama-3.1-8b", seq_len=4096, mode="lora")
    usable = 22 * 2**30
    # NVML's name for the card, as the run's pre-flight reports it
    prior = CostPrior(config, wl, device="cuda", usable_bytes=usable, gpu_infos=[{"name": "NVIDIA A10G"}])
    assert prior.gpu is not None and prior.gpu.name == find_gpu("A10G").name
    c = Candidate(micro_batch=2, grad_accum=16, grad_ckpt=True, liger=True)
    peak = estimate_memory(arch_from_config(config), wl, c, device="cuda", gpu=prior.gpu).total
    assert prior.memory(c) == pytest.approx(math.log(peak / usable))
    assert len(prior.speeds(c)) == 1  # on a GPU the speed prior is FLOPs alone, no fixed cost to choose
    # a GPU the catalog does not know: no GPU, the device's generic figures
    unknown = CostPrior(config, wl, device="cuda", usable_bytes=usable, gpu_infos=[{"name": "NVIDIA Mystery"}])
    assert unknown.gpu is None and unknown.memory(c) is not None


def test_each_alternative_to_the_winner_says_whether_a_probe_or_the_model_decided_it() -> None:
    options = _options()
    rows, _ = _search(options, _truth, first=("mb1-sdpa-False",))
    policy = ModelPolicy(options, DIMS, noise_sd=0.02)
    got = {(d.lever, d.value): d for d in policy.decisions(rows, "mb4-sdpa-True", DIMS)}
    # every other value of every lever, the winner's other levers unchanged
    assert set(got) == {("micro_batch", 1), ("micro_batch", 2), ("attn", "eager"), ("packing", False)}
    probed = {r.key for r in rows}
    for (lever, value), d in got.items():
        key = "mb{micro_batch}-{attn}-{packing}".format(**{**{"micro_batch": 4, "attn": "sdpa", "packing": True},
                                                            lever: value})
        assert d.decided_by == ("probe" if key in probed else "model")
        alt = {"micro_batch": 4, "attn": "sdpa", "packing": True, lever: value}
        truth = math.exp(_truth(alt) - _truth({"micro_batch": 4, "attn": "sdpa", "packing": True}))
        assert d.ratio is not None and d.ratio < 1.0  # the winner is the best: every alternative is slower
        if d.decided_by == "model":  # the prediction holds the true ratio within three of its deviations
            assert d.sd is not None and d.fit_chance is not None and d.fit_chance > 0.9  # all measured peaks fit
            assert abs(math.log(d.ratio) - math.log(truth)) <= 3 * d.sd + 0.05, (lever, value, d.ratio, truth)
        else:
            assert d.ratio == pytest.approx(truth, rel=1e-6)


def test_the_summary_and_the_report_show_how_each_lever_was_decided() -> None:
    from autotune.report.markdown import _lever_decisions_section
    from autotune.spec.summary import RunSummary

    rows = [{"lever": "packing", "value": False, "decided_by": "probe", "ratio": 0.71, "sd": None, "fit_chance": None,
             "status": "ok"},
            {"lever": "attn", "value": "eager", "decided_by": "model", "ratio": 0.9, "sd": 0.05, "fit_chance": 0.97,
             "status": "ok"}]
    text = "\n".join(_lever_decisions_section({"lever_decisions": rows}))
    assert "| packing | False | probe | 0.71× (measured) | yes |" in text
    assert "| attn | eager | model | 0.90× ± 5 % | 97 % chance |" in text
    assert _lever_decisions_section({}) == []  # the other strategies: no section
    assert "lever_decisions" in RunSummary.model_fields


def test_a_trial_cap_that_stops_the_model_early_says_what_more_probes_would_have_decided() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import optuna
    import search_quality as sq

    from autotune.executors.replay import ReplayExecutor
    from autotune.search import Searcher

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    p = sq.problem(REPO / "benchmarks" / "landscapes" / "cpu-tiny-llama-landscape-cpu-c.json")
    out = Searcher(space=p.space, workload=p.workload, settings=p.settings, effective_batch=p.effective_batch,
                   executor=ReplayExecutor(p.landscape, seed=0), max_trials=3, seed=0, top_k=1, device="cpu",
                   baseline=sq._baseline(p), poll_interval_s=0.0, strategy="model", prior=sq.model_prior(p)).run()
    # not an error: the answer is what was measured, and the reason says what was left undecided
    assert out.best_record is not None
    assert out.stop_reason.startswith("max trials (3) reached; the model had not finished: "), out.stop_reason
    assert "(the likeliest: mb" in out.stop_reason and "more trials or time would have probed them" in out.stop_reason
    # one trial: only the HF default (outside landscape F's space) ran; it said nothing was left when nothing had
    # been judged
    p = sq.problem(REPO / "benchmarks" / "landscapes" / "cpu-tiny-llama-landscape-cpu-f.json")
    one = Searcher(space=p.space, workload=p.workload, settings=p.settings, effective_batch=p.effective_batch,
                   executor=ReplayExecutor(p.landscape, seed=0), max_trials=1, seed=0, top_k=1, device="cpu",
                   baseline=sq._baseline(p), poll_interval_s=0.0, strategy="model", prior=sq.model_prior(p)).run()
    assert "the model had not started: none of the space's 24 configurations was measured" in one.stop_reason, \
        one.stop_reason
