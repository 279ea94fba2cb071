"""The lever registry (autotune/spec/levers.py): each lever and each rule declared once, and every layer that
validates, searches or plans applying the same declaration."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from autotune.errors import SpecError
from autotune.estimate.plan import plan
from autotune.search import Skip, candidate_from_choice
from autotune.spec.levers import LEVERS, RULES, inactive, rule_problems, value_problem
from autotune.spec.probe_request import Candidate
from autotune.spec.space import DIMENSIONS, parse_space

AUTOTUNE = Path(__file__).resolve().parents[1] / "autotune"


def test_every_candidate_field_is_a_declared_lever_with_its_default() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(Candidate)}
    assert fields == {name: lv.default for name, lv in LEVERS.items()}
    assert set(DIMENSIONS.values()) == set(LEVERS) - {"grad_accum"}  # accumulation is derived


def test_the_hf_default_baseline_is_the_declared_hf_defaults() -> None:
    from autotune.spec import hf_default_candidate

    base = dataclasses.asdict(hf_default_candidate(8))
    declared = {n: lv.hf_default for n, lv in LEVERS.items() if lv.hf_default is not None}
    assert {n: base[n] for n in declared} == declared


@pytest.mark.parametrize("name", sorted(LEVERS))
def test_each_levers_values_are_accepted_and_a_wrong_one_refused_in_one_wording(name: str) -> None:
    lv = LEVERS[name]
    good = [lv.default, *lv.values, *([True, False] if lv.kind == "bool" else [])]
    assert all(value_problem(name, v) is None for v in good)
    bad = {"bool": "yes", "int": -1, "str": "warp_drive"}[lv.kind]
    msg = value_problem(name, bad)
    assert msg is not None and msg.startswith(f"{name} must be ") and msg.endswith(f"; got {bad!r}")
    assert msg in Candidate(**{name: bad}).problems()


def _breaking(rule) -> dict:
    """A candidate's levers that break ``rule``, the lever it binds kept acting where a value allows it."""
    wrong = [v for v in LEVERS[rule.other].values if v not in rule.allowed]
    base = {"zero_stage": 3, "world_size": 2, rule.lever: rule.value}
    acting = [v for v in wrong if not inactive(rule.lever, {**base, rule.other: v})]
    return {**base, rule.other: (acting or wrong)[0]}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.lever}={r.value}/{r.other}")
def test_each_rule_holds_in_the_candidate_the_space_and_the_search(rule) -> None:
    bad = _breaking(rule)
    ok = {**bad, rule.other: rule.allowed[0]}
    assert rule_problems(ok, searched=True) == []
    assert rule.message() in rule_problems(bad, searched=True)
    # the Candidate refuses only what no probe can run
    assert (rule.message() in Candidate(**bad).problems()) is rule.invalid
    # the search does not probe it: a skip with the rule's reason, or, where the lever does nothing (offload
    # without ZeRO), the lever held at its default
    choice = {d: bad.get(n, LEVERS[n].default) for d, n in DIMENSIONS.items()}
    built = candidate_from_choice({**choice, "gpus_per_trial": 2}, effective_batch=8)
    if inactive(rule.lever, bad):
        assert isinstance(built, Candidate) and getattr(built, rule.lever) == LEVERS[rule.lever].default
    else:
        assert isinstance(built, Skip) and built.reason == rule.message()
    # a space whose only choices break it is refused, naming the rule's reason
    dim_of = {n: d for d, n in DIMENSIONS.items()}
    space = {"zero_stage": [bad["zero_stage"]], dim_of[rule.lever]: [rule.value], dim_of[rule.other]: [bad[rule.other]]}
    with pytest.raises(SpecError, match=re.escape(f"({rule.why})")):
        parse_space(space)


def test_the_planners_pins_apply_the_invalid_rules() -> None:
    from autotune.estimate import find_gpu
    from autotune.models import resolve_model

    cfg = resolve_model("tiny-llama").config
    for rule in (r for r in RULES if r.invalid):
        bad = _breaking(rule)
        with pytest.raises(SpecError, match=re.escape(rule.message())):
            plan(cfg, gpus=[find_gpu("A10G")], pin={rule.lever: rule.value, rule.other: bad[rule.other]})


def test_no_lever_value_list_or_rule_is_written_twice_in_the_package() -> None:
    """A lever's list of values (three or more of them, in their declared order) and a rule's reason appear in
    autotune/ only in the registry."""
    home = AUTOTUNE / "spec" / "levers.py"
    spellings = [", ".join(repr(v).replace("'", q) for v in lv.values[:3]) for lv in LEVERS.values()
                 if lv.kind == "str" and len(lv.values) >= 3 for q in ("'", '"')]
    spellings += [r.why for r in RULES]
    found = [f"{p.relative_to(AUTOTUNE.parent)}: {s}" for p in AUTOTUNE.rglob("*.py") if p != home
             for s in spellings if s in p.read_text(encoding="utf-8")]
    assert not found, found


@pytest.mark.parametrize("fmt", ["training_args", "trl", "axolotl", "llamafactory"])
def test_every_lever_has_a_spelling_in_each_framework_or_says_where_it_goes(fmt: str) -> None:
    """Adding a lever means deciding, per framework, its keys (LEVER_KEYS), or what a file of that framework
    does instead (UNEXPRESSED: noted in the emitted file, held at its default before a write-back), or that
    the launch carries it (CARRIED_ELSEWHERE)."""
    from autotune.formats import FORMATS
    from autotune.formats._common import CARRIED_ELSEWHERE

    module = FORMATS[fmt]
    unexpressed = getattr(module, "UNEXPRESSED", None)
    assert isinstance(unexpressed, dict), f"{fmt} declares no UNEXPRESSED"
    missing = set(LEVERS) - set(module.LEVER_KEYS) - set(unexpressed) - set(CARRIED_ELSEWHERE)
    assert not missing, f"{fmt}: no spelling for {sorted(missing)}"
    assert not set(module.LEVER_KEYS) & set(unexpressed), f"{fmt}: a lever both spelled and unexpressed"


def test_a_levers_advice_is_worded_once_and_check_and_diagnose_both_give_it() -> None:
    from autotune.check import bundle_from_texts, gather
    from autotune.diagnose import diagnose  # noqa: F401  (the advice is its too: _data_fix, the attention rule)
    from autotune.spec.levers import ADVICE

    package = Path(__file__).resolve().parents[1] / "autotune"
    for lever, text in ADVICE.items():
        holders = [p.name for p in package.rglob("*.py") if text in p.read_text(encoding="utf-8")]
        assert holders == ["levers.py"], f"{lever}'s advice is written in {holders}"
    texts = {"training_args.json": '{"output_dir": "o", "dataloader_num_workers": 0}'}
    report = gather(bundle_from_texts("t", texts, directory=False))
    assert ADVICE["workers"] in report.by_id("dataloader_workers")[0].fix
    diag = (package / "diagnose" / "_rules.py").read_text(encoding="utf-8")
    assert 'ADVICE["workers"]' in diag and 'ADVICE["attn"]' in diag and "ADVICE['micro_batch']" in diag


def test_a_declared_lever_is_a_field_a_dimension_a_label_piece_a_pin_and_an_option() -> None:
    """What a lever's declaration drives, with nothing else to edit by hand: its Candidate and SearchSpace
    fields, its piece of the label, the planner's pin and the `probe` / `plan` options."""
    import typer

    from autotune.cli.app import app
    from autotune.estimate.plan import PIN_FIELDS
    from autotune.spec.space import SearchSpace
    from autotune.spec.trial import candidate_label

    assert [f.name for f in dataclasses.fields(Candidate)] == list(LEVERS)
    assert [f.name for f in dataclasses.fields(SearchSpace)][:len(DIMENSIONS)] == list(DIMENSIONS)
    assert PIN_FIELDS == tuple(n for n, lv in LEVERS.items() if lv.planned)
    assert candidate_label(Candidate(liger=True, micro_batch=4, grad_accum=8)).split()[:2] == ["mb4x8", "no-ckpt"]
    assert candidate_label(Candidate(liger=True)).endswith("liger")
    cli = typer.main.get_command(app)
    options = {name: {p.name for p in cli.commands[name].params} for name in ("probe", "plan")}  # type: ignore[attr-defined]
    assert set(LEVERS) <= options["probe"]  # precision: `probe --precision auto` (a probe setting), still the lever
    assert set(PIN_FIELDS) <= options["plan"]


def test_a_new_levers_option_comes_from_its_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer
    from typer.testing import CliRunner

    from autotune.cli._levers import lever_options
    from autotune.spec.levers import Lever

    monkeypatch.setitem(LEVERS, "offload_activations", Lever("offload_activations", "bool", False, False,
                                                             help="move saved activations to host memory"))
    monkeypatch.setitem(LEVERS, "layers_per_stage", Lever("layers_per_stage", "int", 1, 1, values=(1, 2, 4),
                                                          help="decoder layers per pipeline stage"))
    seen: dict = {}
    cmd = typer.Typer()

    @cmd.command()
    @lever_options(["offload_activations", "layers_per_stage"], pin=True)
    def go(model: str = typer.Option("m", "--model"), levers: dict | None = None) -> None:
        seen.update(levers or {}, model=model)

    res = CliRunner().invoke(cmd, ["--layers-per-stage", "3"])  # checked against its declaration, named as its flag
    assert res.exit_code != 0 and "--layers-per-stage must be 1, 2 or 4; got 3" in str(res.exception)
    res = CliRunner().invoke(cmd, ["--offload-activations", "--layers-per-stage", "2"])
    assert res.exit_code == 0, res.output
    assert seen == {"offload_activations": True, "layers_per_stage": 2, "model": "m"}
    helps = {p.name: p.help for p in typer.main.get_command(cmd).params}
    assert "pipeline stage" in helps["layers_per_stage"] and "1 | 2 | 4" in helps["layers_per_stage"]
    seen.clear()
    assert CliRunner().invoke(cmd, []).exit_code == 0 and seen["layers_per_stage"] is None  # not pinned


def test_check_and_diagnose_word_no_advice_twice() -> None:
    """No text of check's rules is a near-copy of one of diagnose's (their shared advice lives in ADVICE)."""
    import ast
    import difflib

    def texts(path: Path) -> list[str]:
        out = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append(node.value)
            elif isinstance(node, ast.JoinedStr):
                out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
        return [t for t in out if len(t) >= 40]

    check, diagnose = texts(AUTOTUNE / "check" / "_rules.py"), texts(AUTOTUNE / "diagnose" / "_rules.py")
    near = [(a, b) for a in check for b in diagnose if difflib.SequenceMatcher(None, a, b).ratio() > 0.6]
    assert not near, near
