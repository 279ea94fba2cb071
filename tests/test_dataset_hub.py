"""``autotune run --split`` and Hub dataset ids read from the local Hugging Face cache, without the network.

The cached Hub dataset is built in the test by ``datasets``' own JSON builder and laid out as its
offline loader reads a Hub dataset (``{org}___{name}/{config}/{version}/{hash}/{name}-{split}.arrow``);
every load runs with sockets refused, so a network attempt fails the test.
"""

from __future__ import annotations

import ast
import json
import os
import socket
from pathlib import Path

import pytest
from _fakes import FakeExecutor
from typer.testing import CliRunner

import autotune.run._search as tune_mod
from autotune.cli.app import app
from autotune.errors import DatasetError
from autotune.probe.data import load_token_sequences
from autotune.spec.dataset_ref import (
    default_datasets_cache_dir,
    find_hub_dataset,
    hub_dataset_dir,
    is_hub_dataset_id,
)
from autotune.store import dataset_identity

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

TOK = str(Path(__file__).resolve().parent.parent / "autotune" / "models" / "tokenizers" / "tiny-chat")
HUB_ID = "autotune-test/TinyChat"
TRAIN = [
    [{"role": "user", "content": f"question {i} ?"}, {"role": "assistant", "content": "answer " * (i + 1)}]
    for i in range(6)
]
TEST = [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]] * 2
RUN = [
    "run",
    "--model",
    "tiny-llama",
    "--device",
    "cpu",
    "--seq-len",
    "64",
    "--effective-batch",
    "4",
    "--space",
    "cpu",
    "--max-trials",
    "3",
    "--gpu-budget",
    "10GiB",
    "--json",
]


def _rows(loaded) -> list[list[int]]:
    s = loaded.sequences
    return [s.tokens[a:b].tolist() for a, b in zip(s.offsets[:-1], s.offsets[1:], strict=True)]


def _rendered(chats) -> list[list[int]]:
    tok = transformers.AutoTokenizer.from_pretrained(TOK)
    return [
        tok(tok.apply_chat_template(m, tokenize=False), add_special_tokens=False)["input_ids"] for m in chats
    ]


def _write_jsonl(path: Path, chats) -> Path:
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    return path


def build_hub_cache(root: Path, ref: str = HUB_ID) -> Path:
    """Prepare ``ref`` in the datasets cache ``root`` as ``load_dataset(ref)`` would have done online."""
    from datasets.packaged_modules.json.json import Json

    org, _, name = ref.partition("/")
    snake = datasets.naming.camelcase_to_snakecase(name)
    src = root.parent / "src"
    src.mkdir(exist_ok=True)
    files = {
        "train": str(_write_jsonl(src / "train.jsonl", TRAIN)),
        "test": str(_write_jsonl(src / "test.jsonl", TEST)),
    }
    b = Json(cache_dir=str(root.parent / "stage"), dataset_name=snake, hash="0123abcd", data_files=files)
    b.download_and_prepare()
    # the builder wrote stage/{snake}/{config-with-data-files-hash}/0.0.0/0123abcd; a Hub dataset's
    # folder is {org}___{snake}/default/0.0.0/<hash>
    target = root / f"{org}___{snake}" / "default"
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(Path(b.cache_dir).parent.parent, target)
    return target.parent


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch):
    """Sockets refused and every attempt recorded (the loader swallows the error and falls back to
    its cache, so the test checks the record, not an exception)."""
    attempts: list[str] = []

    def refuse(*args, **kwargs):
        attempts.append(repr(args)[:200])
        raise OSError("network access refused by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    yield attempts
    assert attempts == [], f"the network was tried: {attempts}"


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hf" / "datasets"
    root.mkdir(parents=True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(root))
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "autotune-cache"))
    return root


# ------------------------------------------------------------------------------ locating


def test_cache_dir_and_folder_name_follow_datasets(tmp_path: Path) -> None:
    assert default_datasets_cache_dir({"HF_DATASETS_CACHE": "/a"}) == Path("/a")
    assert default_datasets_cache_dir({"HF_HOME": "/h"}) == Path("/h/datasets")
    assert default_datasets_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/datasets")
    assert default_datasets_cache_dir({}) == Path("~/.cache/huggingface/datasets").expanduser()
    for name in ("TinyChat", "ultrachat_200k", "OpenHermes-2.5", "SlimOrca", "MMLUPro", "alpaca"):
        assert (
            hub_dataset_dir(f"org/{name}", tmp_path).name
            == f"org___{datasets.naming.camelcase_to_snakecase(name)}"
        )
    assert is_hub_dataset_id("org/name") and not is_hub_dataset_id("data.jsonl")
    assert not is_hub_dataset_id("/abs/x") and not is_hub_dataset_id("a/b/c")
    assert not is_hub_dataset_id("d/nosuch.jsonl") and not is_hub_dataset_id("data/train.parquet")  # missing files
    existing = tmp_path / "org" / "name"
    existing.mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert not is_hub_dataset_id("org/name"), "an existing path is a path, not a Hub id"
    finally:
        os.chdir(cwd)


def test_a_cached_hub_dataset_loads_offline_with_its_split(
    hf_cache: Path, no_network, tmp_path: Path
) -> None:
    folder = build_hub_cache(hf_cache)
    assert find_hub_dataset(HUB_ID) == folder
    loaded = load_token_sequences(HUB_ID, seq_len=64, tokenizer=TOK)
    assert loaded.column == "messages" and loaded.num_records == len(TRAIN) and loaded.path == HUB_ID
    assert _rows(loaded) == _rendered(TRAIN)
    test = load_token_sequences(HUB_ID, seq_len=64, tokenizer=TOK, split="test")
    assert _rows(test) == _rendered(TEST)
    assert test.cache_file != loaded.cache_file, "the split is part of the tokenized cache's key"
    again = load_token_sequences(HUB_ID, seq_len=64, tokenizer=TOK)
    assert again.cache_hit and _rows(again) == _rows(loaded)
    with pytest.raises(DatasetError, match=r"splits test, train, not 'dev'; pass --split"):
        load_token_sequences(HUB_ID, seq_len=64, tokenizer=TOK, split="dev", use_cache=False)
    # the offline switch is put back as it was
    assert "HF_HUB_OFFLINE" not in os.environ and not datasets.config.HF_HUB_OFFLINE


def test_a_missing_hub_id_is_one_line_naming_the_cache_and_the_fix(hf_cache: Path, no_network) -> None:
    with pytest.raises(DatasetError) as info:
        load_token_sequences("someone/absent", seq_len=64, tokenizer=TOK)
    msg = str(info.value)
    assert "\n" not in msg and str(hf_cache / "someone___absent") in msg
    assert """python -c 'import datasets; datasets.load_dataset("someone/absent")'""" in msg and "or pass a path" in msg


def test_cache_key_identity_of_hub_ids_folders_and_splits(hf_cache: Path, tmp_path: Path) -> None:
    assert dataset_identity("someone/absent") == {"hub": "someone/absent"}
    folder = build_hub_cache(hf_cache)
    ident = dataset_identity(HUB_ID)
    assert ident["hub"] == HUB_ID and len(ident["digest"]) == 64
    assert dataset_identity(HUB_ID, split="test") == {**ident, "split": "test"}
    (next(folder.rglob("*-train.arrow"))).write_bytes(b"changed")
    assert dataset_identity(HUB_ID)["digest"] != ident["digest"], "the cached files' content is the key"
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"messages": TRAIN}).save_to_disk(str(saved))
    d1 = dataset_identity(saved)
    assert set(d1) == {"digest"}
    moved = tmp_path / "moved"
    os.rename(saved, moved)
    assert dataset_identity(moved) == d1, "a moved folder is the same data"


# ------------------------------------------------------------------------------ the CLI


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[FakeExecutor]:
    made: list[FakeExecutor] = []

    def factory(**kwargs):
        made.append(FakeExecutor())
        return made[-1]

    monkeypatch.setattr(tune_mod, "_default_executor", factory)
    return made


def run(args: list[str]):
    return CliRunner().invoke(app, args, catch_exceptions=False)


def test_run_split_reaches_the_probes_the_cache_key_and_train_py(tmp_path: Path, fake, monkeypatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "autotune-cache"))
    d = tmp_path / "dd"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"messages": TRAIN}),
            "test": datasets.Dataset.from_dict({"messages": TEST}),
        }
    ).save_to_disk(str(d))
    out = tmp_path / "out"
    base = RUN + ["--dataset", str(d), "--tokenizer", TOK, "--out", str(out)]
    res = run(base + ["--split", "test"])
    assert res.exit_code == 0, res.output
    first = json.loads(res.stdout)
    assert {(r.workload.split, r.workload.tokenizer) for r in fake[-1].requests} == {("test", TOK)}
    train_py = (Path(first["run_dir"]) / "best" / "train.py").read_text()
    line = next(ln for ln in train_py.splitlines() if ln.startswith("MEASURED = json.loads("))
    assert json.loads(ast.literal_eval(line[len("MEASURED = json.loads(") : -1]))["split"] == "test"
    # another split is another request (not answered from the first one's cache); the same one is
    res2 = json.loads(run(base).stdout)
    assert res2["from_cache"] is False and res2["cache_key"] != first["cache_key"]
    assert {r.workload.split for r in fake[-1].requests} == {None}
    assert json.loads(run(base + ["--split", "test"]).stdout)["from_cache"] is True
    # a split the folder does not hold: exit 2, one line, nothing written
    bad = run(
        RUN + ["--dataset", str(d), "--tokenizer", TOK, "--out", str(tmp_path / "bad"), "--split", "dev"]
    )
    assert bad.exit_code == 2 and "not 'dev'; pass --split" in bad.stderr and not (tmp_path / "bad").exists()
    alone = run(RUN + ["--out", str(tmp_path / "alone"), "--split", "test"])
    assert alone.exit_code == 2 and "--split names a split of --dataset" in alone.stderr
    alone = run(RUN + ["--out", str(tmp_path / "alone"), "--sample-rows", "-1"])
    assert alone.exit_code == 2 and "--sample-rows samples a Hub --dataset" in alone.stderr


def test_run_on_a_cached_hub_id_and_a_missing_one(hf_cache: Path, no_network, tmp_path: Path, fake) -> None:
    build_hub_cache(hf_cache)
    res = run(
        RUN + ["--dataset", HUB_ID, "--split", "train", "--tokenizer", TOK, "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 0, res.output
    assert {r.workload.dataset for r in fake[-1].requests} == {HUB_ID}
    # (online, a missing id would be streamed from the Hub: tests/test_hub_online.py; offline it is one line)
    missing = run(RUN + ["--dataset", "someone/absent", "--tokenizer", TOK, "--out", str(tmp_path / "m"), "--offline"])
    assert missing.exit_code == 2 and not (tmp_path / "m").exists()
    lines = [ln for ln in missing.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not in the local Hugging Face datasets cache at" in lines[0], missing.stderr


@pytest.mark.slow
def test_a_real_probe_reads_a_cached_hub_dataset_in_its_own_process(hf_cache: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    build_hub_cache(hf_cache)
    env = {**os.environ, "HF_DATASETS_CACHE": str(hf_cache), "AUTOTUNE_CACHE": str(tmp_path / "ac")}
    env.pop("HF_HUB_OFFLINE", None)
    cmd = [sys.executable, "-m", "autotune", "probe", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64",
           "--micro-batch", "2", "--precision", "fp32", "--dataset", HUB_ID, "--split", "train", "--tokenizer", TOK,
           "--warmup-steps", "1", "--steps", "2", "--json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    assert res["status"] == "ok" and res["metrics"]["dataset_column"] == "messages"
    lens = [len(x) for x in _rendered(TRAIN)]
    assert res["metrics"]["mean_seq_len"] == pytest.approx(sum(lens) / len(lens), rel=0.5)


def test_split_on_a_single_data_file_is_refused(tmp_path: Path, fake) -> None:
    """A .jsonl file has one split: --split was used silently, and made the same data another cached request."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello there"}\n{"text": "general kenobi"}\n')
    res = run(RUN + ["--dataset", str(data), "--tokenizer", TOK, "--out", str(tmp_path / "o"), "--split", "test"])
    assert res.exit_code == 2 and "is one file (one split); drop --split" in res.stderr
    assert not (tmp_path / "o").exists()
