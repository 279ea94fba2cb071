"""Bounds on what autotune reads and on what it agrees to run: numbers in any file (one bounded parser for
JSON and YAML), file sizes checked before reading, and a run whose predicted time to answer is absurd."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _hub_stand_in import Repo, serve  # noqa: E402

from autotune.cli.app import app  # noqa: E402
from autotune.errors import SpecError  # noqa: E402
from autotune.models import HubAccess, resolve_model  # noqa: E402
from autotune.spec.files import MAX_FILE_BYTES, MAX_NUMBER_CHARS, load_json, load_yaml  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = json.loads((ROOT / "autotune" / "models" / "tiny" / "tiny-llama" / "config.json").read_text())
HUGE = "9" * 5001  # past Python's int max-str-digits (4,300): int() raises ValueError


def _one_line_exit_2(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, (res.exit_code, res.output)
    assert "this is a bug" not in lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize("name, text", [("c.yaml", f"learning_rate: 1.0e-5\nwarmup_steps: {HUGE}\n"),
                                         ("c.json", f'{{"learning_rate": 1e-5, "warmup_steps": {HUGE}}}')])
def test_a_huge_number_in_a_config_given_to_check_is_one_line_naming_the_key(tmp_path: Path, name: str,
                                                                              text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    line = _one_line_exit_2(CliRunner().invoke(app, ["check", str(path)]))
    assert name in line and "warmup_steps" in line and ("line 2" if name.endswith(".yaml") else "line 1") in line
    assert "out of range" in line and "write the value" in line


def test_a_huge_number_in_a_local_model_config_json_is_one_line(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY)[:-1] + f', "vocab_size_extra": {HUGE}}}')
    with pytest.raises(SpecError, match=r"config\.json: the number at vocab_size_extra .* out of range"):
        resolve_model(str(model))
    line = _one_line_exit_2(CliRunner().invoke(app, ["plan", "--model", str(model), "--gpu", "L4"]))
    assert "vocab_size_extra" in line


def test_a_huge_number_in_a_hub_models_config_json_is_one_line(tmp_path: Path) -> None:
    config = (json.dumps(TINY)[:-1] + f', "rope_theta": {HUGE}}}').encode()
    with serve(Repo("standin/huge-number", "model", {"config.json": config})) as hub:
        with pytest.raises(SpecError, match=r"config\.json: the number at rope_theta .* out of range"):
            resolve_model("standin/huge-number", hub=HubAccess(endpoint=hub.url), hf_cache=tmp_path / "hub")


@pytest.mark.parametrize("load", [load_json, load_yaml])
def test_json_and_yaml_bound_numbers_alike(load) -> None:
    # the longest number a real config holds (tokenizers' int(1e30) sentinel) is read as it is
    assert load('{"model_max_length": 1000000000000000019884624838656}', what="t") == {
        "model_max_length": 1000000000000000019884624838656}
    assert load('{"x": 1.5e+300, "y": -7}', what="t") == {"x": 1.5e300, "y": -7}
    too_long = "1" * (MAX_NUMBER_CHARS + 1)
    for doc, where in ((f'{{"a": {{"b": [1, {too_long}]}}}}', r"a\.b\[1\]"), ('{"a": [1.0e+999]}', r"a\[0\]"),
                       (too_long, "the document")):
        with pytest.raises(SpecError, match=rf"^t: the number at {where} \(line 1\), .* is out of range"):
            load(doc, what="t")


def test_yaml_only_forms_are_bounded_too() -> None:
    with pytest.raises(SpecError, match=r"the number at x \(line 2\).*characters long"):
        load_yaml("a: 1\nx: 0x" + "f" * MAX_NUMBER_CHARS + "\n", what="t")
    with pytest.raises(SpecError, match=r"the number at a key of the top level \(line 1\)"):
        load_yaml("? " + "1" * (MAX_NUMBER_CHARS + 1) + "\n: v\n", what="t")
    assert load_yaml("a: .inf\nb: -.inf\n", what="t") == {"a": float("inf"), "b": float("-inf")}


# ------------------------------------------------------------------------------------ sizes


def test_an_oversized_model_config_json_is_refused_before_it_is_read(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m"
    model.mkdir()
    cfg = model / "config.json"
    cfg.write_text(json.dumps(TINY))
    with open(cfg, "r+b") as fh:  # sparse: the size without the bytes
        fh.truncate(MAX_FILE_BYTES + 1)
    opened: list[str] = []
    real_open = open

    def spy(file, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    with pytest.raises(SpecError, match=r"config\.json' is 8,388,609 bytes, more than the 8,388,608 allowed"):
        resolve_model(str(model))
    assert str(cfg) not in opened, "the size is checked before the file is opened"


def test_remote_code_detection_reads_through_the_same_bounded_reader(tmp_path: Path) -> None:
    from autotune.models.trust import remote_code_request

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": [None, "x.Tok"]}}))
    assert remote_code_request(tmp_path) == "AutoTokenizer -> x.Tok (tokenizer_config.json)"
    with open(tmp_path / "tokenizer_config.json", "r+b") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(SpecError, match="more than the"):  # over the cap: refused by name, never skipped unread
        remote_code_request(tmp_path)


# ------------------------------------------------------------------------------ absurd requests


def test_a_run_predicted_to_take_over_a_day_without_a_time_budget_is_refused_before_anything(tmp_path: Path) -> None:
    from _fakes import FakeExecutor

    from autotune.run._forecast import MAX_UNBUDGETED_S
    from autotune.run._tune import tune
    from autotune.spec.parse import duration_text

    ex = FakeExecutor()
    out = tmp_path / "out"
    request = dict(gpu_budget="8GB", device="cpu", seq_len=64, effective_batch=8, out=out, executor=ex)
    with pytest.raises(SpecError) as info:
        tune("tiny-llama", steps=1_000_000_000, **request)
    msg = str(info.value)
    assert "\n" not in msg and f"more than the {duration_text(MAX_UNBUDGETED_S)}" in msg
    assert "smaller --steps than 1000000000" in msg and "--max-trials" in msg and "--time-budget" in msg
    assert ex.requests == [] and not out.exists(), "refused before any probe and before anything is written"
    # a --time-budget is the user's own bound: the request is judged by it instead
    with pytest.raises(SpecError, match="--time-budget 8h cannot hold even the HF-default baseline"):
        tune("tiny-llama", steps=1_000_000_000, time_budget="8h", **request)


def test_a_typo_in_steps_at_the_users_scale_is_refused_though_nothing_fits_the_memory_model(tmp_path: Path) -> None:
    """8B LoRA at seq 4096 in 24 GB on this CPU: the memory model fits no configuration (fp32 weights alone
    are 32 GB), which once let ``--steps 1000000000`` start a run whose probes had a year-long window."""
    from _fakes import FakeExecutor

    from autotune.run._tune import tune

    ex = FakeExecutor()
    out = tmp_path / "out"
    with pytest.raises(SpecError, match="even its fastest configuration's one probe is predicted") as info:
        tune("llama-3.1-8b", gpu_budget="24GB", device="cpu", mode="lora", seq_len=4096, effective_batch=32,
             steps=1_000_000_000, out=out, executor=ex)
    assert "smaller --steps than 1000000000" in str(info.value)
    assert ex.requests == [] and not out.exists(), "refused before any probe and before anything is written"


def test_a_forecast_where_nothing_fits_or_a_fixed_probe_timeout_bounds_it_is_judged_by_that_bound() -> None:
    from autotune.run._forecast import MAX_UNBUDGETED_S, check_time_budget

    fc = {"time_to_answer_s": 10 * MAX_UNBUDGETED_S, "search_probes": 40, "confirm_probes": 8, "slots": 1,
          "probe_s": MAX_UNBUDGETED_S / 4, "fitting": 12}
    kw = dict(time_budget_s=None, time_budget_text=None, steps=5, model_ref="m", max_trials=40)
    with pytest.raises(SpecError, match="--time-budget"):
        check_time_budget(dict(fc), **kw)
    # where nothing fits the memory model, most probes stop at their out-of-memory error: the bound is the
    # fastest configuration's one probe, which runs its whole window if the memory model misjudged it
    check_time_budget({**fc, "fitting": 0, "min_probe_s": MAX_UNBUDGETED_S / 2}, **kw)
    with pytest.raises(SpecError, match=r"even its fastest configuration's one probe is predicted to take ~48\.0 h"):
        check_time_budget({**fc, "fitting": 0, "min_probe_s": 2 * MAX_UNBUDGETED_S}, **kw)
    check_time_budget({**fc, "fitting": 0, "min_probe_s": 2 * MAX_UNBUDGETED_S}, **kw, probe_timeout_s=3600.0)
    check_time_budget(dict(fc), **kw, probe_timeout_s=60.0)  # 48 probes of at most a minute
    with pytest.raises(SpecError, match=r"of at most 1\.0 h each \(--probe-timeout\)"):
        check_time_budget(dict(fc), **kw, probe_timeout_s=3600.0)
