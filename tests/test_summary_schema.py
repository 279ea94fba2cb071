"""summary.json has a published, versioned JSON Schema (issue 17): ``autotune schema``,
docs/summary.schema.json, and every summary a run writes validates against it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from _fakes import FakeExecutor
from typer.testing import CliRunner

import autotune.run
import autotune.run._search as tune_mod
from autotune.cli.app import app
from autotune.errors import NothingFitsError
from autotune.spec.summary import SCHEMA_VERSION, RunSummary, summary_json_schema

COMMITTED = Path(__file__).resolve().parents[1] / "docs" / "summary.schema.json"
RUN = ["run", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "512", "--effective-batch", "16",
       "--space", "cpu", "--max-trials", "8", "--json"]


def validate(summary: dict) -> None:
    """Against the committed file (what a --json user holds) and the model."""
    jsonschema.validate(summary, json.loads(COMMITTED.read_text(encoding="utf-8")))
    RunSummary.model_validate(summary)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tune_mod, "_default_executor", lambda **kw: FakeExecutor())


def test_the_committed_schema_is_the_models() -> None:
    assert json.loads(COMMITTED.read_text(encoding="utf-8")) == summary_json_schema(), (
        "docs/summary.schema.json is stale: autotune schema > docs/summary.schema.json")


def test_autotune_schema_prints_it() -> None:
    res = CliRunner().invoke(app, ["schema"], catch_exceptions=False)
    assert res.exit_code == 0
    schema = json.loads(res.stdout)
    assert schema == summary_json_schema()
    assert schema["properties"]["schema_version"]["default"] == SCHEMA_VERSION
    assert {"top", "best", "baseline", "trust"} <= set(schema["properties"])


def test_a_runs_summary_and_its_json_output_validate(tmp_path: Path, fake: None) -> None:
    res = CliRunner().invoke(app, [*RUN, "--gpu-budget", "10GiB", "--out", str(tmp_path)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    on_disk = json.loads((Path(printed["run_dir"]) / "summary.json").read_text(encoding="utf-8"))
    assert on_disk["schema_version"] == SCHEMA_VERSION and on_disk["status"] == "complete"
    assert on_disk["top"] and on_disk["best"] and on_disk["baseline"]
    assert printed == on_disk  # one document: what --json prints is summary.json
    validate(on_disk)
    # the repeat is answered from the cache: still the same shape
    again = CliRunner().invoke(app, [*RUN, "--gpu-budget", "10GiB", "--out", str(tmp_path)], catch_exceptions=False)
    cached = json.loads(again.stdout)
    assert cached["from_cache"] is True
    validate(cached)


AXOLOTL = "base_model: tiny-llama\nmicro_batch_size: 2\ngradient_accumulation_steps: 8\nsequence_len: 512\n"


def test_with_a_write_back_summary_json_the_json_output_and_the_result_are_one_document(
    tmp_path: Path, fake: None,
) -> None:
    """The write-back is a stage of the run: it is in summary.json as in --json, and in tune()'s result."""
    src = tmp_path / "ax.yaml"
    src.write_text(AXOLOTL)
    target = tmp_path / "ax.tuned.yaml"
    res = CliRunner().invoke(app, [*RUN, "--gpu-budget", "10GiB", "--out", str(tmp_path / "cli"), "--from", str(src),
                                   "--write-back", str(target)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    run_dir = Path(printed["run_dir"])
    on_disk = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert printed == on_disk and on_disk["write_back"]["path"] == str(target) and target.read_text() != AXOLOTL
    assert "best/tuned/ax.yaml.diff" in on_disk["files"] and (run_dir / "best" / "tuned" / "ax.yaml.diff").exists()
    validate(on_disk)
    # the same request from Python: RunRequest.from_file, tune(request) -> RunResult
    request = autotune.run.RunRequest.from_file(src, gpu_budget="10GiB", device="cpu", space="cpu", max_trials=8,
                                                out=tmp_path / "api", executor=FakeExecutor())
    assert (request.model, request.seq_len, request.effective_batch) == ("tiny-llama", 512, 16)
    result = autotune.run.tune(request)
    stored = json.loads((result.run_dir / "summary.json").read_text(encoding="utf-8"))
    assert result.summary == stored and stored["write_back"]["path"] == str(result.run_dir / "best" / "tuned" / "ax.yaml")
    assert (result.run_dir / "best" / "tuned" / "ax.yaml").read_text() != AXOLOTL and src.read_text() == AXOLOTL


def test_a_nothing_fits_summary_validates(tmp_path: Path) -> None:
    with pytest.raises(NothingFitsError):
        autotune.run.tune("tiny-llama", gpu_budget="1GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu",
                      max_trials=4, out=tmp_path, executor=FakeExecutor())
    (summary_path,) = tmp_path.glob("*/summary.json")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    assert summary["status"] == "nothing_fits"
    validate(summary)


def test_the_schema_rejects_drift() -> None:
    schema = json.loads(COMMITTED.read_text(encoding="utf-8"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema_version": SCHEMA_VERSION, "status": "complete"}, schema)  # fields missing
    entry = {"label": "x", "status": "confirmed", "median_tokens_per_s": 1.0, "measurements": [1.0], "spread": 0.0,
             "range": [1.0, 1.0], "rounds": 2, "search_tokens_per_s": 1.0, "step_time_spread": None,
             "peak_mem_bytes": 1, "candidate": {}, "reason": "", "indistinguishable": None, "load_warnings": [],
             "renamed_field": 1}
    with pytest.raises(jsonschema.ValidationError, match="renamed_field"):
        jsonschema.validate(entry, {**schema, **schema["$defs"]["RankingEntry"]})


def test_a_model_strategy_run_says_how_each_lever_was_decided(tmp_path: Path, fake: None) -> None:
    """The CLI with --strategy model (fake probes): the summary validates, holds the winner's lever decisions,
    and report.md shows them."""
    res = CliRunner().invoke(app, [*RUN, "--gpu-budget", "10GiB", "--strategy", "model", "--max-trials", "20",
                                   "--out", str(tmp_path)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    validate(summary)
    decisions = summary["lever_decisions"]
    assert decisions and {d["decided_by"] for d in decisions} <= {"probe", "model"}
    assert summary["probes_by_origin"].keys() <= {"baseline", "seed", "model"}
    # it stopped by itself, saying why, before the trial cap
    assert summary["stop_reason"].startswith("the model rules out"), summary["stop_reason"]
    report = (Path(summary["run_dir"]) / "report.md").read_text(encoding="utf-8")
    assert "## How each lever was decided" in report


def test_a_from_file_named_like_an_emitted_file_does_not_replace_it(tmp_path: Path) -> None:
    """The tuned copy of a --from file (without --write-back) goes to best/tuned/: a file called axolotl.yaml (or
    training_args.json) used to replace the emitted one of the same name, which best/train.py reads."""
    src = tmp_path / "axolotl.yaml"
    src.write_text(AXOLOTL)
    request = autotune.run.RunRequest.from_file(src, gpu_budget="10GiB", device="cpu", space="cpu", max_trials=4,
                                                out=tmp_path / "api", executor=FakeExecutor())
    result = autotune.run.tune(request)
    best = result.run_dir / "best"
    assert result.summary["write_back"]["path"] == str(best / "tuned" / "axolotl.yaml")
    assert (best / "tuned" / "axolotl.yaml").read_text() != AXOLOTL
    assert (best / "axolotl.yaml").read_text().startswith("# Written by autotune")  # the emitted one, kept
