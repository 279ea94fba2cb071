"""``autotune run`` and ``autotune.tune``: flags, outputs, cache, resume, exit codes.

The fast tests swap the Ray pool for the fake executor (a synthetic landscape); the slow one runs
the CLI end to end on CPU through real Ray and real probes on tiny-llama.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from _fakes import FakeExecutor, GiB
from typer.testing import CliRunner

import autotune.run
import autotune.run._search as tune_mod
from autotune.cli.app import app
from autotune.errors import NothingFitsError, SpecError
from autotune.run._tune import tune
from autotune.spec.parse import parse_duration, parse_gpus

ANSI = re.compile(r"\x1b\[")
BASE = ["run", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "512", "--effective-batch", "16",
        "--space", "cpu", "--max-trials", "8"]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[FakeExecutor]:
    made: list[FakeExecutor] = []

    def factory(**kwargs):
        ex = FakeExecutor()
        made.append(ex)
        return ex

    monkeypatch.setattr(tune_mod, "_default_executor", factory)
    return made


def run(args: list[str]):
    return CliRunner().invoke(app, args, catch_exceptions=False)


def only_run_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


# ------------------------------------------------------------------------------ parsing


def test_parse_duration() -> None:
    assert parse_duration("20m") == 1200
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90s") == 90
    assert parse_duration("1.5h") == 5400
    assert parse_duration("300") == 300
    assert parse_duration(None) is None
    assert parse_duration("1h30m5s") == 5405 and parse_duration("10ms") == 0.01
    # too large: no crash later; "1h30" (1 h 30 s?), a unit twice or out of order: not read loosely
    for bad in ("soon", "-5m", "0", "5x", "9" * 310, float("inf"), float("nan"), "1h30", "5m5m", "1m1h"):
        with pytest.raises(SpecError, match="time budget"):
            parse_duration(bad)


def test_parse_gpus() -> None:
    assert parse_gpus("0,1,2,3") == [0, 1, 2, 3]
    assert parse_gpus(None) is None
    for bad in ("a,b", "0,0", "-1", ""):
        with pytest.raises(SpecError, match="--gpus"):
            parse_gpus(bad)


# ------------------------------------------------------------------------------ the CLI


def test_run_writes_everything_and_prints_one_answer(tmp_path: Path, fake) -> None:
    res = run(BASE + ["--gpu-budget", "10GiB", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rd = only_run_dir(tmp_path)
    assert rd.name.startswith("tiny-llama-")
    for name in ("summary.json", "trials.csv", "journal.jsonl", "study.db", "run.json", "report.md",
                 "best_result.json", "best/training_args.json", "best/model_kwargs.json",
                 "best/accelerate_config.yaml", "best/train.py"):
        assert (rd / name).exists(), name
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["status"] == "complete"
    best = summary["best"]
    eb = best["effective_batch"]
    assert eb["value"] == 16 == eb["micro_batch"] * eb["grad_accum"] * eb["world_size"]
    assert best["peak_mem_bytes"] <= summary["usable_bytes"]
    assert summary["counts"]["probed"] == 8
    assert summary["seed"] == 42 and summary["environment"]["software"]["optuna"]
    assert "wall_s" in summary and summary["probes_run"] >= 8
    assert "best:" in res.stdout and "effective batch 16 = " in res.stdout and "tok/s" in res.stdout
    assert "top configurations" in res.stdout
    assert not ANSI.search(res.stdout) and not ANSI.search(res.stderr)  # not a terminal: no colours
    assert "ok" in res.stderr  # each probe's status as it lands
    rows = list(csv.DictReader((rd / "trials.csv").open()))
    assert {"status", "reason", "inferred", "tokens_per_s", "peak_mem_bytes"} <= set(rows[0])
    assert len([r for r in rows if r["phase"] == "search" and r["inferred"] == "False"
                and r["status"] != "skipped"]) == 8
    # what proposed each probe: the expert seeds and the HF default first, then the walk / TPE
    origins = [r["origin"] for r in rows if r["phase"] == "search" and r["inferred"] == "False"
               and r["status"] != "skipped"]
    assert origins[0] == "seed" and "baseline" in origins and set(origins) <= {
        "seed", "baseline", "boundary", "neighbour", "combination", "coverage", "tpe"}
    assert sum(summary["probes_by_origin"].values()) == 8 and summary["best"]["origin"] in origins
    assert "Proposed by: " in (rd / "report.md").read_text()


def test_json_prints_only_the_summary(tmp_path: Path, fake) -> None:
    res = run(BASE + ["--gpu-budget", "10GiB", "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    stored = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert printed == stored


def test_repeat_is_answered_from_the_cache_and_fresh_searches_again(tmp_path: Path, fake) -> None:
    args = BASE + ["--gpu-budget", "10GiB", "--out", str(tmp_path), "--json"]
    first = json.loads(run(args).stdout)
    second_res = run(args)
    second = json.loads(second_res.stdout)
    assert len(fake) == 1, "the cached answer must not start an executor"
    assert second["from_cache"] is True and second["answered_in_s"] < 1.5
    assert second["best"] == first["best"] and second["run_id"] == first["run_id"]
    third = json.loads(run(args + ["--fresh"]).stdout)
    assert len(fake) == 2 and third["run_id"] != first["run_id"]
    # a different request (budget) is a different key
    other = json.loads(run(BASE + ["--gpu-budget", "9GiB", "--out", str(tmp_path), "--json"]).stdout)
    assert other["cache_key"] != first["cache_key"] and not other["from_cache"]


def test_nothing_fits_exits_3_with_the_smallest_footprint_and_a_lever(tmp_path: Path, fake) -> None:
    res = run(BASE + ["--gpu-budget", "2GiB", "--out", str(tmp_path)])
    assert res.exit_code == 3
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("autotune: error:")]
    assert len(lines) == 1
    assert "nothing fits the budget 2GiB" in lines[0]
    assert "needs >= " in lines[0] and "try --mode lora" in lines[0]
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "nothing_fits" and summary["smallest_footprint_bytes"] > 2 * GiB
    # the pipeline's repeat gets the same answer from the stored run, without probing
    again = run(BASE + ["--gpu-budget", "2GiB", "--out", str(tmp_path)])
    assert again.exit_code == 3 and "[cached]" in again.stderr and len(fake) == 1
    # --json prints summary.json on this outcome too (it printed nothing)
    as_json = run(BASE + ["--gpu-budget", "2GiB", "--out", str(tmp_path), "--json"])
    assert as_json.exit_code == 3 and json.loads(as_json.stdout)["status"] == "nothing_fits"


def test_bad_input_exits_2_with_every_problem(tmp_path: Path, fake) -> None:
    res = run(["run", "--model", "tiny-llama", "--gpu-budget", "-3GB", "--effective-batch", "0",
               "--time-budget", "soon", "--space", "nope", "--resume", "--fresh", "--out", str(tmp_path)])
    assert res.exit_code == 2
    err = res.stderr
    for needle in ("effective batch must be an integer >= 1", "--resume and --fresh", "time budget",
                   "gpu budget must be positive", "unknown search space 'nope'"):
        assert needle in err, needle
    assert len(err.strip().splitlines()) == 1
    assert not fake


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--model", "no-such-model-xyz"], "no-such-model-xyz"),
        (["--gpus", "0,1", "--device", "cpu"], "--gpus"),
        (["--mode", "half"], "mode must be one of"),
        (["--device", "tpu"], "device must be one of"),
        (["--max-trials", "0"], "max trials"),
        (["--gpus-per-trial", "0"], "gpus per trial"),
        (["--space", "/nonexistent/space.yaml"], "does not exist"),
        (["--dataset", "/nonexistent/data.jsonl"], "dataset"),
        (["--mode", "lora", "--lora-targets", "bogus_proj"], "match no linear layer"),
    ],
)
def test_each_bad_flag_is_exit_2(tmp_path: Path, fake, extra: list[str], needle: str) -> None:
    args = ["run", "--model", "tiny-llama", "--gpu-budget", "10GiB", "--seq-len", "512", "--space", "cpu",
            "--out", str(tmp_path)]
    # later flags win in click: put the extra ones last
    res = run(args + extra)
    assert res.exit_code == 2, res.output
    assert needle in res.stderr


def test_documented_flags_reach_tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}

    def spy(request):
        seen.update(vars(request))
        raise SpecError("stop here")

    monkeypatch.setattr(autotune.run, "tune", spy)
    res = run(["run", "--model", "m", "--gpu-budget", "24GB", "--seq-len", "4096", "--effective-batch", "32",
               "--mode", "lora", "--space", "lora", "--dataset", "d.jsonl", "--split", "test", "--tokenizer", "tok", "--max-trials", "7",
               "--time-budget", "20m", "--gpus", "0,1", "--ray-address", "ray://h:10001", "--pool", "ray", "--device", "cuda",
               "--storage", "sqlite:///x.db", "--out", "o", "--seed", "3", "--resume", "--gpus-per-trial", "2",
               "--top-k", "2", "--steps", "4", "--probe-timeout", "60", "--confirm-rounds", "3:5",
               "--confirm-tolerance", "0.2", "--strategy", "tpe", "--stop-when-converged", "--trainer", "trl", "--config-name", "cfg",
               "--sample-rows", "9", "--offline",
               "--lora-r", "32", "--lora-alpha", "16", "--lora-targets", "all-linear"])
    assert res.exit_code == 2
    expected = {
        "model": "m", "gpu_budget": "24GB", "seq_len": 4096, "effective_batch": 32, "mode": "lora", "space": "lora",
        "dataset": "d.jsonl", "split": "test", "tokenizer": "tok", "lengths": "fixed", "max_trials": 7, "time_budget": "20m", "gpus": "0,1", "ray_address": "ray://h:10001", "pool": "ray",
        "device": "cuda", "storage": "sqlite:///x.db", "out": "o", "seed": 3, "resume": True, "fresh": False,
        "progress": seen["progress"], "gpus_per_trial": 2, "top_k": 2, "steps": 4, "probe_timeout_s": 60.0,
        "trust_remote_code": False, "verify_loss": 0, "confirm_rounds": (3, 5), "confirm_tolerance": 0.2,
        "trainer": "trl",
        "strategy": "tpe", "stop_when_converged": True,
        "hub": None, "config_name": "cfg", "sample_rows": 9,  # --offline: no HubAccess
        "lora_r": 32, "lora_alpha": 16, "lora_targets": "all-linear", "source": None, "write_back": None,
    }
    assert {k: seen[k] for k in expected} == expected
    assert set(seen) - set(expected) == set(autotune.run.API_ONLY) - {"progress"}  # what the command cannot set


# ------------------------------------------------------------------------------ the library


def test_tune_api_and_training_arguments(tmp_path: Path) -> None:
    ex = FakeExecutor()
    result = tune("tiny-llama", gpu_budget="10GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu",
                  max_trials=6, out=tmp_path, executor=ex)
    assert not ex.closed, "an executor passed in belongs to the caller"
    assert result.best.fits and result.run_dir.parent == tmp_path
    c = result.candidate
    assert c.micro_batch * c.grad_accum * c.world_size == 16
    args = result.training_arguments(tmp_path / "train-out")
    assert args.per_device_train_batch_size == c.micro_batch
    assert args.gradient_accumulation_steps == c.grad_accum
    assert "baseline" in result.summary  # the HF default, measured for the report
    assert "HF default" in (result.run_dir / "report.md").read_text()


def test_nothing_fits_error_is_exit_code_3(tmp_path: Path) -> None:
    with pytest.raises(NothingFitsError, match=r"needs >= .* at micro_batch 1 with checkpointing") as info:
        tune("tiny-llama", gpu_budget="3GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu",
             max_trials=6, out=tmp_path, executor=FakeExecutor())
    assert info.value.exit_code == 3


def test_a_killed_run_resumes_without_re_running_finished_probes(tmp_path: Path) -> None:
    class Killed(FakeExecutor):
        def poll(self, timeout=None):
            if len(self.requests) > 4:
                raise KeyboardInterrupt
            return super().poll(timeout)

    kw = dict(gpu_budget="10GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu", max_trials=10,
              out=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        tune("tiny-llama", executor=Killed(), **kw)
    rd = only_run_dir(tmp_path)
    assert not (rd / "summary.json").exists()
    done = [json.loads(line) for line in (rd / "journal.jsonl").read_text().splitlines()]
    done_keys = {d["key"] for d in done if d["result"] is not None}
    assert len(done_keys) == 4

    ex = FakeExecutor()
    notes: list[str] = []
    result = tune("tiny-llama", executor=ex, resume=True,
                  progress=lambda ev, d: notes.append(d["text"]) if ev == "note" else None, **kw)
    assert result.run_dir == rd and result.summary["resumed"] is True
    # the time to answer it announces counts what is left, not the whole run again
    (left,) = [n for n in notes if n.startswith("predicted time")]
    assert left.startswith("predicted time left") and "4 of 10 search probes done; 6 search +" in left, left
    from autotune.search import candidate_id

    search_keys = [candidate_id(r.candidate) for r in ex.requests if r.settings.steps == 5]
    assert not set(search_keys) & done_keys
    assert result.summary["counts"]["probed"] == 10


def test_estimator_pruning_and_a_predicted_nothing_fits(tmp_path: Path) -> None:
    ex = FakeExecutor()
    with pytest.raises(NothingFitsError, match=r"the memory model predicts >= .* nothing was probed; try --mode lora"):
        # 40GB holds the 32GB of fp32 weights (below that the request is refused up front, exit 2),
        # not the gradients and optimizer states on top
        tune("llama-3.1-8b", gpu_budget="40GB", seq_len=2048, effective_batch=16, space="cpu", device="cpu",
             max_trials=6, out=tmp_path, executor=ex, prune=True)
    assert ex.requests == []


def test_a_custom_pruner_is_used(tmp_path: Path) -> None:
    ex = FakeExecutor()
    result = tune("tiny-llama", gpu_budget="10GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu",
                  max_trials=6, out=tmp_path, executor=ex, top_k=0, baseline=False,
                  pruner=lambda c: "too big" if c.micro_batch >= 8 else None)
    assert all(r.candidate.micro_batch < 8 for r in ex.requests)
    rows = list(csv.DictReader((result.run_dir / "trials.csv").open()))
    assert any(r["inferred"] == "True" and "too big" in r["reason"] for r in rows)


def test_lengths_reach_the_probes_and_the_cache_key_and_bad_ones_are_refused(tmp_path: Path, fake) -> None:
    res = run(BASE + ["--gpu-budget", "10GiB", "--out", str(tmp_path), "--lengths", "lognormal:4.0,1.0", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["lengths"] == "lognormal:4.0,1.0"
    assert {r.workload.lengths for r in fake[-1].requests} == {"lognormal:4.0,1.0"}
    # variable lengths: the expert seeds pack sequences (padding would be the largest waste)
    assert fake[-1].requests[0].candidate.packing
    # another length distribution is another request: not answered from the first one's cache
    res2 = run(BASE + ["--gpu-budget", "10GiB", "--out", str(tmp_path), "--json"])
    assert res2.exit_code == 0 and json.loads(res2.stdout)["from_cache"] is False
    bad = run(BASE + ["--gpu-budget", "10GiB", "--out", str(tmp_path / "bad"), "--lengths", "gaussian:3"])
    assert bad.exit_code == 2 and "lengths" in bad.stderr and not (tmp_path / "bad").exists()
    (tmp_path / "x.jsonl").write_text('{"text": "hello"}\n')
    both = run(BASE + ["--gpu-budget", "10GiB", "--out", str(tmp_path / "both"), "--lengths", "uniform:16-64",
                       "--dataset", str(tmp_path / "x.jsonl")])
    assert both.exit_code == 2 and "give one of them" in both.stderr and not (tmp_path / "both").exists()


# ------------------------------------------------------------------------------ --strict (issue 12)


@pytest.mark.parametrize("busy", [True, False])
def test_strict_exits_5_on_a_doubtful_answer(fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             busy: bool) -> None:
    from autotune.executors import load

    found = [{"kind": "cpu", "message": "other processes used 1.5 of 2 CPU cores during the probe"}] if busy else []
    monkeypatch.setattr(load.LoadMonitor, "check", lambda self, phase, since: list(found))
    args = BASE + ["--gpu-budget", "10GB", "--out", str(tmp_path / "o")]
    res = run(args + ["--strict"])
    summary = json.loads((only_run_dir(tmp_path / "o") / "summary.json").read_text())
    assert summary["trust"]["doubtful"] is busy
    # the fake's repeats agree; under load every re-measurement is set aside, so after the last round
    # the figure is noisy
    assert summary["best"]["confirm_status"] == ("noisy" if busy else "confirmed")
    if busy:
        assert any("other work loaded the machine" in (e.get("reason") or "") for e in summary["top"])
        assert res.exit_code == 5, res.output
        assert "doubtful" in res.output and "load warning" in res.output
        assert summary["warnings"] and summary["warnings"][0]["kind"] == "cpu"
        # without --strict the same answer is exit 0, said to be doubtful
        res = run(args + ["--fresh"])
        assert res.exit_code == 0 and "doubtful answer" in res.output
        # a repeat answered from the store says so again, with the way to measure again, and --strict
        # still refuses it: a doubtful answer is never served as if it were confirmed
        again = run(args)
        assert again.exit_code == 0 and "doubtful answer" in again.output and "load warning" in again.output
        assert "from the stored run" in again.output and "--fresh" in again.output
        assert run(args + ["--strict"]).exit_code == 5
        as_json = json.loads(run(args + ["--json"]).stdout)
        assert as_json["from_cache"] is True and as_json["trust"]["doubtful"] is True
    else:
        assert res.exit_code == 0, res.output
        assert summary["warnings"] == []


# ------------------------------------------------------------------ a probe whose process died


class _DiesFirst(FakeExecutor):
    """The HF-default baseline's probes number ``at`` (0: its search probe, 1: its first confirmation, ...)
    die as the kernel's OOM killer leaves them: no result, an exit code (what the local and Ray executors
    record for a killed probe process)."""

    def __init__(self, at: tuple[int, ...], *, classified: bool = False) -> None:
        super().__init__()
        self.at, self.classified, self.seen, self.deaths = at, classified, 0, 0

    def result_for(self, request):  # type: ignore[no-untyped-def]
        from autotune.spec.baseline import hf_default_candidate
        from autotune.spec.result import ProbeResult

        if request.candidate == hf_default_candidate(16):
            self.seen += 1
            if self.seen - 1 in self.at:
                self.deaths += 1
                if self.classified:  # an error the probe itself caught and classified: not retried
                    return ProbeResult(status="crash", request=request.to_dict(), reason="RuntimeError: bad kernel")
                return ProbeResult(status="crash", request=request.to_dict(), metrics={"exit_code": -9, "wall_s": 1.0},
                                   reason="probe process killed by SIGKILL without a result (SIGKILL: possibly the "
                                          "kernel's out-of-memory killer)")
        return super().result_for(request)


@pytest.mark.parametrize("at,classified", [((0,), False), ((0, 1), False), ((0,), True), ((1,), False)],
                         ids=["died-once", "died-twice", "classified-crash", "died-in-confirmation"])
def test_a_probe_whose_process_died_is_probed_once_more_before_the_crash_counts(
        tmp_path: Path, at: tuple[int, ...], classified: bool) -> None:
    notes: list[str] = []
    ex = _DiesFirst(at, classified=classified)
    result = tune("tiny-llama", gpu_budget="20GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu",
                  max_trials=4, out=tmp_path, executor=ex, top_k=1,
                  progress=lambda event, data: notes.append(data.get("text", "")) if event == "note" else None)
    base = result.summary["baseline"]
    assert base is not None and base["label"].startswith("mb8x2")
    retried = [n for n in notes if "probing it once more before the crash counts" in n]
    if classified:  # a crash the probe classified is the configuration's own: counted at once
        assert ex.deaths == 1 and retried == [] and base["status"] == "crash"
    elif at == (0, 1):  # died twice: the crash counts (one retry, not more)
        assert ex.deaths == 2 and len(retried) == 1 and base["status"] == "crash"
    else:  # died once, in the search or in a confirmation round: probed again, and that figure counts
        assert ex.deaths == 1 and len(retried) == 1 and "out-of-memory killer" in retried[0]
        assert base["status"] == "ok" and result.summary["speedup_vs_baseline"] is not None
        assert base["confirmed"] is True


def test_each_landed_probe_says_probe_k_of_n_and_an_eta_from_the_probes_measured(tmp_path: Path) -> None:
    from _cli import cli

    proc = cli(tmp_path, "run", "--device", "cpu", "--model", "tiny-llama", "--gpu-budget", "64GB", "--space", "cpu",
               "--seq-len", "128", "--max-trials", "3", "--steps", "2", "--top-k", "1", "--confirm-rounds", "1",
               "--out", str(tmp_path / "res"), fake=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counted = re.findall(r" probe (\d+)/(\d+) · ETA (\S+)", proc.stderr)
    assert [int(k) for k, _, _ in counted] == sorted(int(k) for k, _, _ in counted) and counted, proc.stderr
    assert {int(n) for _, n, _ in counted} == {3} and counted[-1][0] == "3"


def test_run_help_groups_every_option_in_a_named_panel() -> None:
    import typer.main

    from autotune.cli.app import app

    click_cmd = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    panels = {p.name: getattr(p, "rich_help_panel", None) for p in click_cmd.params if p.name != "help"}
    assert all(panels.values()), [n for n, v in panels.items() if not v]
    assert {"What to tune", "Your training config", "Data", "The search", "Where it runs", "Runs and output"} == set(
        panels.values())


def test_the_same_command_again_continues_an_interrupted_run_and_fresh_starts_over(tmp_path: Path) -> None:
    """An interrupted run (no summary.json yet: Ctrl-C, a crash) is continued by the same command, without
    --resume: its finished probes are restored from the journal, not run again; --fresh starts a new run."""
    from _cli import cli

    args = ["run", "--device", "cpu", "--model", "tiny-llama", "--gpu-budget", "64GB", "--space", "cpu",
            "--seq-len", "128", "--max-trials", "3", "--steps", "2", "--top-k", "1", "--confirm-rounds", "1",
            "--out", str(tmp_path / "res"), "--json"]
    first = cli(tmp_path, *args, fake=True)
    assert first.returncode == 0, first.stderr[-2000:]
    run_dir = Path(json.loads(first.stdout)["run_dir"])
    (run_dir / "summary.json").unlink()  # as if interrupted before the answer was written
    log = tmp_path / "probes.log"
    again = cli(tmp_path, *args, fake=True, env={"FAKE_PROBE_LOG": str(log)})
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    assert summary["run_dir"] == str(run_dir) and summary["resumed"] is True
    assert "continuing the interrupted run" in again.stderr
    started = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    assert started and all(int(steps) > 2 for _, steps, _ in started)  # confirmation only: no search probe again
    fresh = cli(tmp_path, *args, "--fresh", fake=True)
    fresh_dir = Path(json.loads(fresh.stdout)["run_dir"])
    assert fresh_dir != run_dir
    # a --fresh run interrupted, then the resume command autotune prints: the fresh run goes on, the stored answer
    # of the same request is not served in its place
    (fresh_dir / "summary.json").unlink()
    resumed = cli(tmp_path, *args, "--resume", fake=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout)["run_dir"] == str(fresh_dir) and not json.loads(resumed.stdout).get("from_cache")
    nothing = cli(tmp_path, *args, "--resume", fake=True)  # both complete: nothing to resume
    assert nothing.returncode == 2 and "--resume: no unfinished run" in nothing.stderr


def test_a_stored_answer_is_served_from_where_it_is_and_whole(tmp_path: Path) -> None:
    """A results folder moved (a CI cache restored under another path) names the folder it is served from (and the
    study in it); one whose
    best/ was lost or emptied gets its files written again from best_result.json (it was served without them)."""
    from _cli import cli

    args = ["run", "--device", "cpu", "--model", "tiny-llama", "--gpu-budget", "64GB", "--space", "cpu",
            "--seq-len", "128", "--max-trials", "2", "--steps", "2", "--top-k", "1", "--confirm-rounds", "1", "--json"]
    first = cli(tmp_path, *args, "--out", str(tmp_path / "a"), fake=True)
    assert first.returncode == 0, first.stderr[-2000:]
    name = Path(json.loads(first.stdout)["run_dir"]).name
    (tmp_path / "a").rename(tmp_path / "b")
    moved = tmp_path / "b" / name
    (moved / "best" / "training_args.json").write_text("")
    (moved / "best" / "train.py").unlink()
    (moved / "best" / "model_kwargs.json").write_text('{"dty')  # a write cut off by a full disk
    again = cli(tmp_path, *args, "--out", str(tmp_path / "b"), fake=True)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    assert summary["from_cache"] is True and summary["run_dir"] == str(moved)
    assert summary["search"]["storage"] == f"sqlite:///{(moved / 'study.db').resolve()}"  # its study, where it is
    assert json.loads((moved / "best" / "training_args.json").read_text())["per_device_train_batch_size"] >= 1
    assert (moved / "best" / "train.py").stat().st_size > 0 and "written again" in again.stderr
    assert isinstance(json.loads((moved / "best" / "model_kwargs.json").read_text()), dict)


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    from typer.testing import CliRunner

    from autotune.cli.app import app

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"autotune {version('autotune')}"


def test_a_row_with_one_value_shows_no_spread_rather_than_zero() -> None:
    import io

    from rich.console import Console

    from autotune.cli.run import render_summary

    out = io.StringIO()
    top = [{"label": "mb8x2", "median_tokens_per_s": 5802.0, "measurements": [5802.0], "spread": 0.0,
            "peak_mem_bytes": 1 << 30, "status": "noisy"},
           {"label": "mb16x1", "median_tokens_per_s": 9000.0, "measurements": [8000.0, 9000.0, 10000.0],
            "spread": 0.222, "peak_mem_bytes": 2 << 30, "status": "confirmed"}]
    con = Console(file=out, width=200)
    render_summary({"top": top, "best": {"label": "mb16x1"}}, con)
    text = out.getvalue()
    assert "- (1 value)" in text and "22.2%" in text and "0.0%" not in text


def test_square_brackets_in_paths_and_values_are_text_not_styles(tmp_path, monkeypatch, capsys) -> None:  # noqa: ANN001
    """The console prints paths, model names and the user's values with Rich markup off: a model folder named
    ``exp[/old]`` or an allocator value ending in ``[/]`` is printed as it is (it used to crash the command with a
    markup error, after summary.json was written, or to vanish from the line)."""
    import shutil

    from autotune.cli.render import console
    from autotune.cli.run import render_summary
    from autotune.models import resolve_model

    monkeypatch.setenv("COLUMNS", "200")
    render_summary({"top": [], "best": {"label": "mb2x8 [bold]x"}, "cuda_alloc_conf": "expandable_segments:True[/]",
                    "run_dir": "results/exp[/old]", "quality_notes": ["[red]not a style"]}, console())
    out = capsys.readouterr().out
    for part in ("PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True[/]'", "mb2x8 [bold]x", "results/exp[/old]/best/",
                 "quality note: [red]not a style"):
        assert part in out, out
    for name in ("exp[/old]", "ckpt[v2]"):
        folder = tmp_path / name
        folder.mkdir(parents=True)
        shutil.copy(resolve_model("tiny-llama").config_path, folder / "config.json")
        res = CliRunner().invoke(app, ["plan", "--model", str(folder), "--gpu", "A10G"])
        assert res.exit_code == 0 and f"{folder}: " in res.output, res.output


def test_an_answer_without_the_hf_default_says_there_is_no_speed_up_to_report(capsys) -> None:
    """A --time-budget that ran out before the HF default was measured: the answer says so (it printed nothing)."""
    from autotune.cli.render import console
    from autotune.cli.run import render_summary

    render_summary({"top": [], "best": {"label": "mb2x8"}, "speedup_vs_baseline": None,
                    "speedup_note": "the HF default was not probed: the search ended"}, console())
    assert "no speed-up over the HF default to report" in capsys.readouterr().out


def test_the_answer_says_why_it_has_no_speed_up_over_the_hf_default(tmp_path: Path) -> None:
    """--max-trials 1 ends the search before the HF default is probed: said as that, not as "it did not run, or
    failed" (one that ran and did not fit says its status and reason)."""
    from _cli import cli

    args = ["run", "--device", "cpu", "--model", "tiny-llama", "--space", "cpu", "--seq-len", "64",
            "--effective-batch", "8", "--steps", "2", "--top-k", "1", "--confirm-rounds", "1", "--json"]
    one = cli(tmp_path, *args, "--gpu-budget", "64GB", "--max-trials", "1", "--out", str(tmp_path / "a"), fake=True)
    assert one.returncode == 0, one.stderr[-2000:]
    assert json.loads(one.stdout)["speedup_note"].startswith("the HF default was not probed: the search ended")
