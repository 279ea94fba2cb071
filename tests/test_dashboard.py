"""``autotune dashboard RUN_DIR``: the run's study, read back through optuna-dashboard's own WSGI app."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import pytest
from _fakes import FakeExecutor
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.cli.dashboard import dashboard_app, run_study
from autotune.run._tune import tune

optuna_dashboard = pytest.importorskip("optuna_dashboard")


pytestmark = pytest.mark.xdist_group("dashboard_run")  # one fake run for the module


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    result = tune("tiny-llama", gpu_budget="10GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu",
                  max_trials=6, out=out, executor=FakeExecutor())  # fmt: skip
    return Path(result.run_dir)


def _get(wsgi_app, path: str) -> tuple[str, dict]:
    env: dict = {}
    setup_testing_defaults(env)
    env.update(PATH_INFO=path, REQUEST_METHOD="GET", QUERY_STRING="")
    seen: dict = {}

    def start_response(status, headers, exc_info=None):
        seen["status"] = status

    body = b"".join(wsgi_app(env, start_response))
    return seen["status"], json.loads(body)


def test_the_dashboard_app_serves_the_runs_trials_and_their_user_attrs(run_dir: Path) -> None:
    study = run_study(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert study.storage == f"sqlite:///{(run_dir / 'study.db').resolve()}"
    assert study.study_name == summary["search"]["study_name"] == run_dir.name
    wsgi = dashboard_app(study)
    status, listing = _get(wsgi, "/api/studies")
    assert status.startswith("200")
    names = {s["study_name"]: s["study_id"] for s in listing["study_summaries"]}
    assert study.study_name in names
    status, detail = _get(wsgi, f"/api/studies/{names[study.study_name]}")
    assert status.startswith("200")
    trials = detail["trials"]
    # every probe the search asked about is a trial (confirmation re-measures are not new trials)
    journal = [json.loads(ln) for ln in (run_dir / "journal.jsonl").read_text().splitlines() if ln.strip()]
    search_keys = {r["key"] for r in journal if r.get("phase", "search") == "search"}
    attrs = [{a["key"]: a["value"] for a in t["user_attrs"]} for t in trials]
    assert len(trials) >= 1 and all(a for a in attrs), "each trial carries its user attributes"
    # whatever attributes the search sets come through as the study holds them
    assert {a["key"] for a in attrs} <= search_keys
    assert all(t["params"] for t in trials if t["state"].lower() == "complete")
    complete = [t for t in trials if t["state"].lower() == "complete"]
    assert complete and detail["best_trials"], "the best trial is shown"


def test_cli_serves_the_study_on_localhost_by_default(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    monkeypatch.setattr(optuna_dashboard, "run_server", lambda storage, **kw: calls.append((storage, kw)))
    res = CliRunner().invoke(app, ["dashboard", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert calls == [(run_study(run_dir).storage, {"host": "127.0.0.1", "port": 8080})]
    assert "http://127.0.0.1:8080/dashboard" in res.stderr
    res = CliRunner().invoke(app, ["dashboard", str(run_dir), "--port", "9123", "--host", "0.0.0.0"])
    assert res.exit_code == 0 and calls[-1][1] == {"host": "0.0.0.0", "port": 9123}


def test_no_study_or_no_extra_is_one_line_and_exit_2(tmp_path: Path, run_dir: Path, monkeypatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for target, needle in ((empty, "holds no Optuna study"), (tmp_path / "nope", "does not exist")):
        res = CliRunner().invoke(app, ["dashboard", str(target)])
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and needle in lines[0], res.stderr
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # as if not installed
    res = CliRunner().invoke(app, ["dashboard", str(run_dir)])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "pip install 'autotune[dashboard]'" in lines[0]
