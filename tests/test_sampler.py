"""AutotuneSampler: the search policy as an Optuna sampler, replayed on a recorded landscape (no probes)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import optuna
import pytest

from autotune.executors.replay import ReplayExecutor, load_landscape
from autotune.search import STRATEGIES, AutotuneSampler, SamplerSettings, Searcher, candidate_id
from autotune.spec.probe_request import Candidate, ProbeSettings, Workload
from autotune.spec.space import SearchSpace

ROOT = Path(__file__).resolve().parents[1]
LAND = load_landscape(ROOT / "benchmarks" / "landscapes" / "cpu-tiny-llama-landscape-cpu-c.json")
SPACE = SearchSpace(**{k: tuple(v) for k, v in LAND["space"].items()})
SETTINGS = ProbeSettings(device="cpu", budget_bytes=LAND["budget_bytes"], headroom=LAND["headroom"], steps=5,
                         warmup_steps=1)
WORKLOAD = Workload(model=LAND["model"], seq_len=LAND["seq_len"], lengths=LAND["lengths"])
EB = int(LAND["effective_batch"])


def searcher(storage, *, max_trials: int, seed: int = 3, history=None, strategy: str = "walk",
             top_k: int = 0) -> Searcher:
    from autotune.search import TrialRecord  # noqa: F401 (the history's type)

    return Searcher(space=SPACE, workload=WORKLOAD, settings=SETTINGS, effective_batch=EB,
                    executor=ReplayExecutor(LAND, seed=seed), max_trials=max_trials, seed=seed, top_k=top_k,
                    storage=storage, study_name="s", history=history, device="cpu", poll_interval_s=0.0,
                    strategy=strategy)


def _probed_keys(records) -> list[str]:
    return [r.key for r in records if r.probed and r.phase in ("search", "recheck")]


class Killed(ReplayExecutor):
    """Answers ``k`` probes, then the process dies (at the next submit)."""

    def __init__(self, *a, k: int, **kw) -> None:
        super().__init__(*a, **kw)
        self.k, self.submits = k, 0

    def submit(self, request):
        if self.submits >= self.k:
            raise RuntimeError("killed")
        self.submits += 1
        return super().submit(request)


RESUMED_N = 16


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory):
    """The uninterrupted search every resume point is compared with (deterministic: searched once)."""
    return searcher(f"sqlite:///{tmp_path_factory.mktemp('whole') / 'whole.db'}", max_trials=RESUMED_N).run()


@pytest.mark.parametrize("k", [2, 4, 7, 10, 13])
def test_a_resumed_search_proposes_the_same_next_trial_as_an_uninterrupted_one(tmp_path: Path, k: int,
                                                                               uninterrupted) -> None:
    n, whole = RESUMED_N, uninterrupted
    url = f"sqlite:///{tmp_path / 'cut.db'}"
    journal: list = []
    cut = searcher(url, max_trials=n)
    cut.executor = Killed(LAND, seed=3, k=k)
    cut.sink = journal.append
    with pytest.raises(RuntimeError, match="killed"):
        cut.run()
    assert _probed_keys(journal) == _probed_keys(whole.records)[:k]
    # a new Searcher (and sampler) over the same storage and journal: the walk's state is rebuilt
    # from the trials alone, the killed probe's trial is set aside and proposed again
    resumed = searcher(url, max_trials=n, history=journal).run()
    assert _probed_keys(resumed.records)[: k + 1] == _probed_keys(whole.records)[: k + 1]
    origins = [r.origin for r in whole.records if r.probed]
    assert origins[0] == "seed" and set(origins) <= {"seed", "boundary", "neighbour", "combination",
                                                     "recheck", "coverage", "tpe"}


def test_a_killed_probe_is_proposed_again_on_resume(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    first = searcher(url, max_trials=4).run()
    study = optuna.load_study(study_name="s", storage=url)
    ghost = study.ask()  # asked, never told: what a killed run leaves behind
    ghost.suggest_categorical("micro_batch", [1, 2, 4, 8, 16])
    resumed = searcher(url, max_trials=6, history=first.records)
    resumed._restore()
    t = next(t for t in resumed.study.get_trials() if t.number == ghost.number)
    assert t.state == optuna.trial.TrialState.FAIL and t.user_attrs["interrupted"] is True
    obs, _ = resumed.sampler.observations(resumed.study)
    assert ghost.number not in [o.number for o in obs]


def test_the_study_holds_the_origin_of_every_trial(tmp_path: Path) -> None:
    from autotune.run._tune import tune

    result = tune(LAND["model"], gpu_budget=LAND["budget_text"], seq_len=LAND["seq_len"], effective_batch=EB,
                  space=SPACE, lengths=LAND["lengths"], max_trials=8, device="cpu", out=tmp_path,
                  executor=ReplayExecutor(LAND, seed=1), top_k=1, steps=5, warmup_steps=1, seed=1)
    db = next(tmp_path.rglob("study.db"))
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{db}")
    trials = study.get_trials()
    assert trials and all(t.user_attrs.get("origin") for t in trials)
    assert trials[0].user_attrs["origin"] == "seed"
    # the HF default pins memory, which this CPU space does not offer: probed outside the study
    assert "baseline" in result.summary["probes_by_origin"]
    counts = result.summary["probes_by_origin"]
    assert sum(counts.values()) == sum(1 for t in trials if t.user_attrs.get("measured")) + counts["baseline"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_runs_end_to_end_on_a_recorded_landscape(tmp_path: Path, strategy: str) -> None:
    out = searcher(None, max_trials=10, strategy=strategy, top_k=1).run()
    probed = [r for r in out.records if r.probed and r.phase == "search"]
    assert probed and out.best_record is not None and out.best_record.status == "ok"
    origins = {r.origin for r in probed}
    expected = {"walk": {"seed"}, "model": {"seed"}, "tpe": {"tpe"}, "random": {"random"}, "grid": {"grid"},
                "largest-fits": {"largest-fits"}, "deepspeed": {"deepspeed"}}[strategy]
    assert expected <= origins
    if strategy == "largest-fits":  # defaults fixed, only the micro-batch moves; then it stops
        assert len({(r.candidate["attn"], r.candidate["packing"]) for r in probed}) == 1
        assert "nothing more to propose" in out.stop_reason
    if strategy == "grid":
        assert len({r.key for r in probed}) == len(probed)
    if strategy == "model":  # the seeds, then the model's own picks; it never proposes a configuration twice
        assert origins <= {"seed", "model", "baseline"} and len({r.key for r in probed}) == len(probed)


def test_a_would_be_centre_within_the_noise_is_re_measured_before_the_walk_moves() -> None:
    # a hand-made study: the first seed A at 1000 tok/s (the centre), then its boundary move B (the
    # next larger micro-batch) at 1050: 5 % better, within a 25 % tolerance -> the sampler asks for B
    # again (origin recheck, remeasure) before moving the centre. (fp32 only: from a full-precision
    # centre, half precision would be asked first)
    space = dataclasses.replace(SPACE, precision=("fp32",))
    sampler = AutotuneSampler(space, SamplerSettings(seed=0, device="cpu", seeds=1, recheck_tolerance=0.25),
                              effective_batch=EB)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen: list[tuple[str, str]] = []

    def objective(trial: optuna.Trial) -> float:
        cand = study.sampler.suggest(trial)
        origin = trial.user_attrs.get("origin", "")
        seen.append((candidate_id(cand), origin))
        if len(seen) == 1:
            return 1000.0
        if len(seen) == 2:
            return 1050.0
        return 10.0

    study.optimize(objective, n_trials=3)
    assert seen[2] == (seen[1][0], "recheck")
    assert study.trials[2].user_attrs["remeasure"] is True
    # with rechecks off, the walk moves to B at once (no repeat)
    plain = AutotuneSampler(space, sampler.settings, effective_batch=EB, recheck_tolerance=None)
    study2 = optuna.create_study(direction="maximize", sampler=plain)
    seen.clear()
    study2.optimize(objective, n_trials=3)
    assert seen[2][0] != seen[1][0]


def test_an_over_budget_seed_steps_down_first_and_half_precision_is_tried_early() -> None:
    # seed A (mb8, no checkpointing, fp32) over budget -> its step-down B (mb4, same levers) next;
    # B fits -> from a full-precision centre, half precision first (B in bf16); it beats B while B's
    # larger micro-batch was over budget -> B in bf16 at that micro-batch (the lighter precision may fit it)
    sampler = AutotuneSampler(SPACE, SamplerSettings(seed=0, device="cpu", seeds=2), effective_batch=EB)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen: list[tuple[Candidate, str]] = []

    def objective(trial: optuna.Trial) -> float:
        cand = study.sampler.suggest(trial)
        seen.append((cand, trial.user_attrs.get("origin", "")))
        if cand.micro_batch >= 8 and cand.precision == "fp32" and not cand.grad_ckpt:
            trial.set_user_attr("status", "over_budget")
            return 0.0
        return 1000.0 * cand.micro_batch ** 0.1 * (1.3 if cand.precision == "bf16" else 1.0) * (0.7 if cand.grad_ckpt else 1.0)

    study.optimize(objective, n_trials=5)
    (a, oa), (b, ob), (c, oc) = seen[:3]
    assert (oa, a.micro_batch, a.grad_ckpt, a.precision) == ("seed", 8, False, "fp32")
    assert ob == "boundary" and dataclasses.replace(b, micro_batch=8, grad_accum=a.grad_accum) == a and b.micro_batch == 4
    assert oc == "seed" and c.grad_ckpt  # then the memory-safe seed
    assert seen[3][1] == "neighbour" and seen[3][0] == dataclasses.replace(b, precision="bf16")
    # b's next larger micro-batch (mb8 fp32) is known over budget, b in bf16 beat b: mb8 in bf16 next
    assert seen[4][1] == "boundary" and seen[4][0] == dataclasses.replace(a, precision="bf16")


def test_the_docs_sampler_example_runs_as_written() -> None:
    text = (ROOT / "docs" / "search.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- sampler-example -->\s*```python\n(.*?)```", text, re.S)
    assert block is not None, "docs/search.md lost its AutotuneSampler example"
    scope: dict = {}
    exec(compile(block.group(1), "docs/search.md", "exec"), scope)  # noqa: S102 (our own docs)
    study = scope["study"]
    assert len(study.trials) == scope["N_TRIALS"] and all(t.user_attrs.get("origin") for t in study.trials)
    assert study.best_value > 0


def test_the_settings_may_be_given_as_keywords() -> None:
    # the earlier form (the docs' example): SamplerSettings' fields as keywords, each overriding `settings`
    kw = AutotuneSampler(SPACE, effective_batch=EB, seed=0, device="cpu", seeds=2)
    given = AutotuneSampler(SPACE, SamplerSettings(seed=0, device="cpu", seeds=2), effective_batch=EB)
    assert kw.settings == given.settings and kw.seed_choices == given.seed_choices
    assert AutotuneSampler(SPACE, given.settings, effective_batch=EB, seed=1).settings.seed == 1
    with pytest.raises(TypeError, match="no_such_setting"):
        AutotuneSampler(SPACE, effective_batch=EB, no_such_setting=1)


def test_strategy_on_the_command_line(tmp_path: Path) -> None:
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_hardening import RUN, autotune, one_line, tree

    bad = tmp_path / "bad"
    one_line(autotune(tmp_path, *RUN, "--out", str(bad), "--strategy", "nope", fake=True),
             "unknown strategy 'nope'", "largest-fits")
    assert tree(bad) == []
    out = tmp_path / "out"
    args = [("8GB" if a == "3GB" else a) for a in RUN[:-1]]  # the HF defaults fit 8 GB here, not 3
    p = autotune(tmp_path, *args, "6", "--out", str(out), "--strategy", "largest-fits", "--json", fake=True)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert set(summary["probes_by_origin"]) <= {"largest-fits", "baseline"} and summary["probes_by_origin"]
    db = next(out.rglob("study.db"))
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{db}")
    assert {t.user_attrs["origin"] for t in study.trials} <= {"largest-fits", "baseline"}


@pytest.mark.parametrize("ordinal", [False, True])
def test_the_journal_and_the_study_hold_each_trial_through_the_samplers_one_mapping(ordinal: bool) -> None:
    # the params a record keeps (plain values) and the params its trial holds (Optuna's: indices for
    # ordinal knobs) are one mapping, the sampler's: to_optuna / candidate_of / params_of agree on every trial
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _fakes import FakeExecutor

    from autotune.spec.space import parse_space

    space = parse_space({"micro_batch": [1, 2, 4, 8], "grad_ckpt": [False, True], "zero_stage": [0, 3],
                         "offload": ["none", "optimizer", "params"], "sharding": ["deepspeed", "fsdp"]})
    s = Searcher(space=space, workload=Workload(model="tiny-llama", seq_len=512), effective_batch=16,
                 settings=ProbeSettings(device="cpu", budget_bytes=10 * 2**30), executor=FakeExecutor(),
                 max_trials=12, top_k=0, device="cpu", seed=5, ordinal=ordinal, poll_interval_s=0.0)
    out = s.run()
    first = {}
    for r in out.records:
        first.setdefault(r.key, r)
    trials = [t for t in s.study.trials if t.user_attrs.get("key") in first]
    assert len(trials) >= 12
    for t in trials:
        rec = first[t.user_attrs["key"]]
        if rec.status == "skipped":
            assert s.sampler.candidate_of(t.params) is None
            continue
        cand = rec.candidate_obj()
        assert s.sampler.to_optuna(rec.params) == t.params
        assert candidate_id(s.sampler.candidate_of(t.params)) == rec.key
        assert s.sampler.params_of(cand) == t.params
    assert not any(hasattr(s, name) for name in ("_suggest", "_to_optuna", "_optuna_params_of", "_choice_params"))
