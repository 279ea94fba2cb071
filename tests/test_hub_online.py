"""Models and datasets from the Hub when online, against a stand-in Hub on 127.0.0.1 (``HF_ENDPOINT``).

The real Hub is never contacted: every test points ``HF_ENDPOINT`` at :mod:`_hub_stand_in` (or at a
closed port, for the network failure) and keeps the caches in a temporary folder. Each path goes
through the real CLI: ``autotune plan`` and ``autotune probe`` as subprocesses, ``autotune run``
in-process (typer's runner) with a fake executor. After each test, the stand-in's record must hold
nothing but the small files: no weights (``*.safetensors``, ``*.bin``) and no data shard past the
first (the sample is streamed from the first shard by byte range).
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import _cli
import pytest
from _fakes import FakeExecutor
from _hub_stand_in import Repo, online_against, parquet_bytes, serve
from typer.testing import CliRunner

import autotune.run._search as tune_mod
from autotune.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
CONFIG = (ROOT / "autotune" / "models" / "tiny" / "tiny-llama" / "config.json").read_bytes()
TOK_DIR = ROOT / "autotune" / "models" / "tokenizers" / "tiny-chat"
TOKENIZER = {n: (TOK_DIR / n).read_bytes() for n in ("tokenizer.json", "tokenizer_config.json")}
WEIGHTS = {"model.safetensors": b"\0" * 4096, "pytorch_model.bin": b"\0" * 4096}
MODEL = "standin/tiny-model"
DATA = "standin/tiny-data"
SHARDS = [f"data/train-0000{k}-of-00003.parquet" for k in range(3)]


def _model_repo(config: bytes = CONFIG) -> Repo:
    return Repo(MODEL, "model", {"config.json": config, **TOKENIZER, **WEIGHTS, "README.md": b"# tiny\n"})


def _data_repo() -> Repo:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    files: dict[str, bytes] = {"README.md": b"---\nlicense: mit\n---\n# tiny data\n"}
    for k, name in enumerate(SHARDS):
        rows = [{"text": f"shard {k} row {i} " + "words " * (i % 40)} for i in range(2000)]
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buf, row_group_size=100)  # realistic: several row groups
        files[name] = buf.getvalue()
    return Repo(DATA, "dataset", files)


def _repos() -> list[Repo]:
    remote = json.loads(CONFIG)
    remote.update(model_type="acme_custom", auto_map={"AutoConfig": "configuration_acme.AcmeConfig"})
    return [
        _model_repo(),
        Repo("standin/gated-model", "model", {"config.json": CONFIG, **WEIGHTS}, gated=True),
        Repo("standin/remote-code", "model", {"config.json": json.dumps(remote).encode(),
                                              "configuration_acme.py": b"raise SystemExit('remote code ran')\n"}),
        _data_repo(),
        Repo("standin/gated-data", "dataset", {"data/train.parquet": parquet_bytes([{"text": "x"}])}, gated=True),
    ]


def assert_only_small_files(hub) -> None:
    fetched = hub.files_fetched()
    assert not [p for p in fetched if p.endswith((".safetensors", ".bin", ".py"))], fetched
    touched = " ".join(hub.paths())
    assert SHARDS[1] not in touched and SHARDS[2] not in touched, "only the first shard is read for the sample"
    allowed = {"config.json", *TOKENIZER, "README.md", SHARDS[0]}
    assert set(fetched) <= allowed, sorted(set(fetched) - allowed)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with serve(*_repos()) as h:
        online_against(monkeypatch, h, tmp_path)
        yield h
        assert_only_small_files(h)


def cli(*args: str, env_extra: dict[str, str] | None = None, timeout: float = 300,
        process: bool = False) -> subprocess.CompletedProcess:
    """The real CLI, in-process unless ``process`` (tests/_cli.py), in the environment the fixtures set."""
    return _cli.cli(Path.cwd(), *args, env={"PYTHONPATH": str(ROOT), **(env_extra or {})}, timeout=timeout,
                    process=process, offline=False)


def one_line(res: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr)
    return lines[0]


def _snapshot(tmp_path: Path, repo: Repo) -> Path:
    return tmp_path / "hf" / "hub" / f"models--{repo.repo_id.replace('/', '--')}" / "snapshots" / repo.commit


# ------------------------------------------------------------------------------------------- models


def test_plan_fetches_only_the_config_into_the_hf_cache_then_answers_from_it(hub, tmp_path: Path) -> None:
    res = cli("plan", "--model", MODEL, "--gpu", "L4", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["model"] == MODEL
    repo = hub.repos[("model", MODEL)]
    snap = _snapshot(tmp_path, repo)
    assert (snap / "config.json").read_bytes() == CONFIG
    assert sorted(p.name for p in snap.iterdir()) == ["config.json"], "config.json only: no tokenizer, no weights"
    assert hub.files_fetched() == ["config.json"]
    assert ("HEAD", f"/{MODEL}/resolve/main/config.json") in hub.requests, "asked with HEAD, then GET"
    before = len(hub.requests)
    again = cli("plan", "--model", MODEL, "--gpu", "L4", "--json")
    assert again.returncode == 0 and json.loads(again.stdout) == json.loads(res.stdout)
    assert [p for p in hub.paths()[before:] if "resolve" in p or "/api/models" in p] == [], \
        "a model in the cache is answered from it"


def test_offline_is_todays_behaviour_and_sends_nothing(hub, tmp_path: Path) -> None:
    from autotune.errors import ModelNotFoundError
    from autotune.models import resolve_model

    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(MODEL)  # the library without a HubAccess: today's offline resolution
    today = f"autotune: error: {info.value}"
    by_env = cli("plan", "--model", MODEL, "--gpu", "L4", env_extra={"HF_HUB_OFFLINE": "1"})
    by_flag = cli("plan", "--model", MODEL, "--gpu", "L4", "--offline")
    assert one_line(by_env) == one_line(by_flag) == today and "never downloads" in today
    assert [p for p in hub.paths() if "tiny-model" in p] == [], "offline: no request at all"
    online = cli("plan", "--model", "tiny-llama", "--gpu", "L4", "--json")
    offline = cli("plan", "--model", "tiny-llama", "--gpu", "L4", "--json", env_extra={"HF_HUB_OFFLINE": "1"})
    assert online.returncode == offline.returncode == 0 and online.stdout == offline.stdout
    assert online.stderr == offline.stderr


def test_gated_private_and_missing_repositories_are_one_line(hub) -> None:
    gated = one_line(cli("plan", "--model", "standin/gated-model", "--gpu", "L4"))
    assert f"{hub.url}/standin/gated-model" in gated and "HF_TOKEN" in gated and "401" in gated
    with_token = one_line(cli("plan", "--model", "standin/gated-model", "--gpu", "L4",
                              env_extra={"HF_TOKEN": "hf_test_token_without_access"}))
    assert "403" in with_token and "has no access" in with_token and "HF_TOKEN" in with_token
    missing = one_line(cli("plan", "--model", "standin/no-such-model", "--gpu", "L4"))
    assert "does not exist on the Hub" in missing and "404" in missing
    bad_rev = one_line(cli("plan", "--model", f"{MODEL}@no-such-branch", "--gpu", "L4"))
    assert "revision 'no-such-branch' does not exist" in bad_rev


def test_a_config_that_needs_remote_code_is_refused_and_its_code_never_fetched(hub) -> None:
    line = one_line(cli("plan", "--model", "standin/remote-code", "--gpu", "L4"))
    assert "--trust-remote-code" in line and "auto_map" in line
    assert not [p for p in hub.paths() if p.endswith(".py")], "the code is never fetched without the flag"
    # with it, the code the config's auto_map names comes along (a probe imports it from the snapshot, offline)
    from autotune.models import HubAccess, resolve_model

    resolved = resolve_model("standin/remote-code", trust_remote_code=True, hub=HubAccess.from_env())
    assert resolved.source == "hf-cache"  # (the refused request left its config.json in the cache)
    assert (Path(resolved.path) / "configuration_acme.py").is_file()
    hub.requests[:] = [r for r in hub.requests if not r[1].endswith(".py")]  # (allowed here; the teardown checks)


def test_revisions_and_a_network_failure_fall_back_to_the_cache(hub, tmp_path: Path) -> None:
    repo = hub.repos[("model", MODEL)]
    pinned = cli("plan", "--model", f"{MODEL}@{repo.commit}", "--gpu", "L4", "--json")
    assert pinned.returncode == 0, pinned.stderr
    # the Hub is gone: nothing cached is one line; the cached snapshot of @main is used, saying so
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connections are refused
        gone = one_line(cli("plan", "--model", "standin/never-cached", "--gpu", "L4", env_extra={"HF_ENDPOINT": dead}))
        assert "cannot be reached" in gone and "not in the local Hugging Face cache" in gone
        assert "a preset (llama-3.1-8b, llama-3.1-70b," in gone  # the presets are named online too
        # only the pinned commit is cached, not what main points to: one line
        main = one_line(cli("plan", "--model", f"{MODEL}@main", "--gpu", "L4", env_extra={"HF_ENDPOINT": dead}))
        assert "cannot be reached" in main
        # a cached commit needs no network at all
        assert cli("plan", "--model", f"{MODEL}@{repo.commit}", "--gpu", "L4",
                   env_extra={"HF_ENDPOINT": dead}).returncode == 0
        assert cli("plan", "--model", f"{MODEL}@main", "--gpu", "L4").returncode == 0  # online: refs/main cached
        fallback = cli("plan", "--model", f"{MODEL}@main", "--gpu", "L4", env_extra={"HF_ENDPOINT": dead})
    assert fallback.returncode == 0, fallback.stderr
    said = " ".join(fallback.stdout.split())  # (the plan's notes wrap)
    assert "cannot be reached" in said and f"using the cached snapshot {repo.commit[:12]} of main" in said


# ------------------------------------------------------------------------------------------- run


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[FakeExecutor]:
    made: list[FakeExecutor] = []

    def factory(**kwargs):
        made.append(FakeExecutor())
        return made[-1]

    monkeypatch.setattr(tune_mod, "_default_executor", factory)
    return made


RUN = ["run", "--device", "cpu", "--seq-len", "64", "--effective-batch", "4", "--space", "cpu", "--max-trials", "3",
       "--gpu-budget", "10GiB", "--json"]


def _run(*args: str):
    return CliRunner().invoke(app, [*RUN, *args], catch_exceptions=False)


def test_run_with_a_hub_model_and_a_streamed_hub_dataset(hub, fake, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = _run("--model", MODEL, "--dataset", DATA, "--sample-rows", "50", "--out", str(out))
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    repo = hub.repos[("model", MODEL)]
    snap = _snapshot(tmp_path, repo)
    # the model: config.json and, for the text dataset, the tokenizer; never the weights
    assert sorted(p.name for p in snap.iterdir()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    reqs = fake[-1].requests
    assert {r.workload.model_path for r in reqs} == {str(snap)} and {r.workload.dataset for r in reqs} == {DATA}
    run_json = json.loads((Path(summary["run_dir"]) / "run.json").read_text())
    assert run_json["model_revision"] == repo.commit
    # the data: the first 50 rows of the first shard, stated in a note
    assert "read the first 50 rows of split train" in res.stderr and "--sample-rows" in res.stderr
    sample = tmp_path / "autotune-cache" / "hub-samples" / "standin___tiny-data" / "train" / "sample.jsonl"
    rows = [json.loads(ln) for ln in sample.read_text().splitlines()]
    assert len(rows) == 50 and rows[0]["text"].startswith("shard 0 row 0")
    # the emitted scripts load the full dataset by id
    train_py = (Path(summary["run_dir"]) / "best" / "train.py").read_text()
    line = next(ln for ln in train_py.splitlines() if ln.startswith("MEASURED = json.loads("))
    assert json.loads(ast.literal_eval(line[len("MEASURED = json.loads("):-1]))["dataset"] == DATA
    assert f'"dataset": "{DATA}"' in (Path(summary["run_dir"]) / "best" / "train_sft.py").read_text()
    # the same request again: answered from the stored run (the sample's content is the same)
    again = json.loads(_run("--model", MODEL, "--dataset", DATA, "--sample-rows", "50", "--out", str(out)).stdout)
    assert again["from_cache"] is True and again["cache_key"] == summary["cache_key"]
    # a changed config upstream (a new commit), asked for with @main: a new answer
    changed = json.loads(CONFIG)
    changed["num_hidden_layers"] = 3
    new = hub.add(_model_repo(json.dumps(changed).encode()))
    res3 = _run("--model", f"{MODEL}@main", "--dataset", DATA, "--sample-rows", "50", "--out", str(out))
    assert res3.exit_code == 0, res3.output
    third = json.loads(res3.stdout)
    assert third["from_cache"] is False and third["cache_key"] != summary["cache_key"]
    assert json.loads((Path(third["run_dir"]) / "run.json").read_text())["model_revision"] == new.commit


def test_run_dataset_failures_are_one_line(hub, fake, tmp_path: Path) -> None:
    for ref, want in (("standin/gated-data", "gated or private"), ("standin/no-data", "does not exist on the Hub")):
        res = _run("--model", "tiny-llama", "--dataset", ref, "--tokenizer", str(TOK_DIR), "--out", str(tmp_path / "o"))
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and want in lines[0], res.stderr
        assert not (tmp_path / "o").exists()
    off = _run("--model", "tiny-llama", "--dataset", DATA, "--tokenizer", str(TOK_DIR), "--offline",
               "--out", str(tmp_path / "o"))
    assert off.exit_code == 2 and "not in the local Hugging Face datasets cache" in off.stderr
    assert not [p for p in hub.paths() if "tiny-data" in p], "offline: the dataset is not asked for"


@pytest.mark.slow
def test_a_real_probe_of_a_hub_model_on_a_streamed_hub_dataset(hub, tmp_path: Path) -> None:
    res = cli("probe", "--model", MODEL, "--dataset", DATA, "--sample-rows", "40", "--device", "cpu", "--seq-len",
              "64", "--micro-batch", "2", "--precision", "fp32", "--warmup-steps", "1", "--steps", "2", "--json",
              timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(res.stdout)
    assert result["status"] == "ok" and result["metrics"]["dataset_column"] == "text"
    assert "read the first 40 rows" in res.stderr


@pytest.mark.slow
def test_train_py_loads_the_full_dataset_by_id_not_the_sample(hub, tmp_path: Path) -> None:
    sample = tmp_path / "autotune-cache" / "hub-samples" / "standin___tiny-data" / "train" / "sample.jsonl"
    sample.parent.mkdir(parents=True)
    sample.write_text(json.dumps({"text": "the probes' sample"}) + "\n")
    code = ("from autotune.probe.data import load_token_sequences as L; "
            f"d = L({DATA!r}, seq_len=64, tokenizer={str(TOK_DIR)!r}, local_files_only=False); print(d.num_records)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-1] == str(3 * 2000), "train.py (local_files_only=False) reads every shard"
    assert all(any(s in p for p in hub.paths()) for s in SHARDS)
    hub.requests[:] = [r for r in hub.requests if "tiny-data" not in r[1]]  # the full download is the point here


def test_model_references_and_the_offline_switch() -> None:
    from autotune.errors import SpecError
    from autotune.models import HubAccess
    from autotune.models.hub import split_revision

    assert split_revision("org/name@main") == ("org/name", "main")
    assert split_revision("org/name@v1.0") == ("org/name", "v1.0")
    assert split_revision("org/name") == ("org/name", None)
    for bad in ("org/name@", "@main", "org/name@a b", "org/name@../x"):
        with pytest.raises(SpecError, match="ORG/NAME@REVISION"):
            split_revision(bad)
    assert HubAccess.from_env({"HF_HUB_OFFLINE": "1"}) is None
    assert HubAccess.from_env({"TRANSFORMERS_OFFLINE": "true"}) is None
    assert HubAccess.from_env({}, offline=True) is None
    assert HubAccess.from_env({"HF_HUB_OFFLINE": "0"}) == HubAccess()
    got = HubAccess.from_env({"HF_ENDPOINT": "http://127.0.0.1:9/", "HF_TOKEN": "t"})
    assert got is not None and got.endpoint == "http://127.0.0.1:9" and got.token == "t"


@pytest.mark.timeout(900)  # a real end-to-end run: minutes on 2 cores
@pytest.mark.slow
def test_a_real_run_with_a_hub_model_and_a_hub_dataset(hub, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = cli("run", "--model", MODEL, "--dataset", DATA, "--sample-rows", "32", "--device", "cpu", "--seq-len", "64",
              "--effective-batch", "4", "--gpu-budget", "8GiB", "--max-trials", "1", "--top-k", "1", "--steps", "1",
              "--confirm-rounds", "1:1", "--out", str(out), "--json", timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    assert summary["status"] == "complete" and summary["model_name"] == MODEL
    run_json = json.loads((Path(summary["run_dir"]) / "run.json").read_text())
    assert run_json["model_revision"] == hub.repos[("model", MODEL)].commit
    assert "read the first 32 rows" in res.stderr
    # the suite's one real `autotune run` through the embedded Ray pool and real probes: what real figures
    # make of the summary, the emitted arguments and the cache
    from transformers import TrainingArguments

    from autotune.spec.summary import RunSummary

    RunSummary.model_validate(summary)  # real probes' figures fit the published schema (docs/summary.schema.json)
    assert summary["device"] == "cpu" and summary["best"]["tokens_per_s"] > 0
    assert 0 < summary["best"]["peak_mem_bytes"] <= summary["usable_bytes"]
    targs = json.loads((Path(summary["run_dir"]) / "best" / "training_args.json").read_text())
    ta = TrainingArguments(output_dir=str(tmp_path / "o"), **targs)
    assert ta.per_device_train_batch_size * ta.gradient_accumulation_steps == 4
    again = cli("run", "--model", MODEL, "--dataset", DATA, "--sample-rows", "32", "--device", "cpu", "--seq-len",
                "64", "--effective-batch", "4", "--gpu-budget", "8GiB", "--max-trials", "1", "--top-k", "1",
                "--steps", "1", "--confirm-rounds", "1:1", "--out", str(out), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["from_cache"] is True, again.stderr[-2000:]
