"""What reading a dataset may cost: memory and time follow --seq-len, not the rows; sizes are checked
before anything is read; a SIGTERM is honoured while the data is read and tokenized.

Rows of a few MB stand for the rows of tens of MB seen in the wild (a Hub dataset of 20 rows of 30 MB
text wrote a 629 MB sample and passed 8 GB resident; the same rows in a local JSONL, 8 GB).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _hub_stand_in import Repo, online_against, parquet_bytes, serve
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.errors import DatasetError
from autotune.probe import readers, tokenize_cache
from autotune.probe.hub_sample import DEFAULT_SAMPLE_BYTES, sample_hub_dataset
from autotune.probe.readers import MAX_CHARS_PER_TOKEN, text_limit
from autotune.spec.dataset_ref import MAX_DATASET_FILE_BYTES

ROOT = Path(__file__).resolve().parent.parent
TOK = str(ROOT / "autotune" / "models" / "tokenizers" / "tiny-chat")
WORDS = "the model is very fast and the answer is good . "  # the tiny tokenizer's words: no <unk>
MB = 2**20
SEQ = 64


def _big_text(mb: float, tag: str = "") -> str:
    return tag + WORDS * int(mb * MB // len(WORDS))


@pytest.fixture
def tokenizer_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every text handed to the tokenizer, recorded by a wrapper around the real one."""
    calls: list[int] = []
    real = tokenize_cache.load_tokenizer

    class Recording:
        def __init__(self, tok):
            self._tok = tok

        def __getattr__(self, name):
            return getattr(self._tok, name)

        def __call__(self, texts, **kw):
            calls.extend(len(t) for t in texts)
            assert max(len(t) for t in texts) <= text_limit(SEQ), "a text past what --seq-len can use was tokenized"
            return self._tok(texts, **kw)

    monkeypatch.setattr(tokenize_cache, "load_tokenizer", lambda *a, **k: Recording(real(*a, **k)))
    return calls


# ------------------------------------------------------------------------------------- row bounds


def test_rows_of_several_mb_are_cut_to_what_seq_len_can_use_before_tokenizing(tmp_path: Path,
                                                                               tokenizer_calls: list[int]) -> None:
    path = tmp_path / "big.jsonl"
    texts = [_big_text(3, f"row {i} ") for i in range(3)] + ["a short row ."]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    loaded = tokenize_cache.load_token_sequences(path, seq_len=SEQ, tokenizer=TOK, use_cache=False)
    assert loaded.num_records == 4 and loaded.num_truncated == 3
    # what the tokenizer saw: each big row cut to (seq_len + 1) x MAX_CHARS_PER_TOKEN characters
    assert sorted(tokenizer_calls) == [len("a short row ."), *[(SEQ + 1) * MAX_CHARS_PER_TOKEN] * 3]
    # and the sequences are what the whole rows make (their first seq_len tokens)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOK)
    want = [tok(t[:4096], truncation=True, max_length=SEQ + 1)["input_ids"][:SEQ] for t in texts]
    s = loaded.sequences
    assert [s.tokens[a:b].tolist() for a, b in zip(s.offsets[:-1], s.offsets[1:], strict=True)] == want


def test_every_reader_cuts_text_chat_and_token_ids_rows(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    limit = text_limit(SEQ)
    big = _big_text(1)
    chat = [{"role": "user", "content": big}, {"role": "assistant", "content": big}]
    rows = {
        "text": big,
        "messages": chat,
        "input_ids": list(range(10_000)),
    }
    for column, value in rows.items():
        jl = tmp_path / f"{column}.jsonl"
        jl.write_text(json.dumps({column: value}) + "\n")
        pq_file = tmp_path / f"{column}.parquet"
        pq_file.write_bytes(parquet_bytes([{column: value}]))
        saved = tmp_path / f"{column}-saved"
        datasets.Dataset.from_dict({column: [value]}).save_to_disk(str(saved))
        for source in (jl, pq_file, saved):
            got_column, (got,) = readers.read_dataset(source, seq_len=SEQ)
            assert got_column == column, source
            if column == "text":
                assert got == big[:limit], source
            elif column == "input_ids":
                assert got == list(range(SEQ + 1)), source
            else:  # the chat's contents cut together, in order: the first keeps `limit`, the second nothing
                assert [m["content"] for m in got] == [big[:limit], ""], source
                assert [m["role"] for m in got] == ["user", "assistant"], source
    pc = tmp_path / "pc.jsonl"
    pc.write_text(json.dumps({"prompt": "q " * 100, "completion": big}) + "\n")
    _, (got,) = readers.read_dataset(pc, seq_len=SEQ)
    assert got["prompt"] == "q " * 100 and got["completion"] == big[: limit - 200]
    # without seq_len (a caller that wants the rows whole) nothing is cut
    assert readers.read_dataset(tmp_path / "text.jsonl")[1] == [big]


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A stand-in Hub serving one dataset of big, compressible rows (one parquet file)."""
    pytest.importorskip("datasets")
    rows = [{"text": _big_text(2, f"row {i} ")} for i in range(6)]
    repo = Repo("standin/big-rows", "dataset", {"data/train.parquet": parquet_bytes(rows)})
    with serve(repo) as hub:
        online_against(monkeypatch, hub, tmp_path)
        yield hub, rows


def test_a_hub_sample_of_big_rows_is_cut_by_seq_len_and_capped_in_bytes(hub_env, tmp_path: Path,
                                                                         tokenizer_calls: list[int]) -> None:
    hub, rows = hub_env
    assert DEFAULT_SAMPLE_BYTES == 64 * MB
    # rows cut to what --seq-len can use: 6 rows of 2 MB make a sample of a few KB a row
    file, meta = sample_hub_dataset("standin/big-rows", split=None, config_name=None, rows=1000, endpoint=hub.url,
                                    token=None, seq_len=SEQ)
    lines = file.read_text(encoding="utf-8").splitlines()
    assert meta["rows"] == len(lines) == 6 and meta["complete"] and not meta["stopped_at_max_bytes"]
    assert [json.loads(ln)["text"] for ln in lines] == [r["text"][: text_limit(SEQ)] for r in rows]
    assert file.stat().st_size < 6 * (text_limit(SEQ) + 100)
    # the probes read that sample: nothing past what seq_len can use reaches the tokenizer
    loaded = tokenize_cache.load_token_sequences("standin/big-rows", seq_len=SEQ, tokenizer=TOK, use_cache=False)
    assert loaded.num_records == 6 and loaded.num_truncated == 6 and tokenizer_calls
    # the rows read are capped in bytes too: the sample stops before the row that would pass the cap
    file, meta = sample_hub_dataset("standin/big-rows", split=None, config_name=None, rows=1000, endpoint=hub.url,
                                    token=None, seq_len=SEQ, max_bytes=5 * MB)
    assert meta["rows"] == 2 and meta["bytes_read"] == sum(len(json.dumps(r)) + 1 for r in rows[:2]) <= 5 * MB
    assert meta["stopped_at_max_bytes"] and not meta["complete"]
    # a first row past the cap alone is taken (cut), and the sample ends there
    file, meta = sample_hub_dataset("standin/big-rows", split=None, config_name=None, rows=10, endpoint=hub.url,
                                    token=None, seq_len=SEQ, max_bytes=MB)
    assert meta["rows"] == 1 and meta["stopped_at_max_bytes"] and file.stat().st_size < text_limit(SEQ) + 100


# ------------------------------------------------------------------------------------- SIGTERM

_CHILD = """
import os, sys, time
from autotune.cli.app import _interrupt_on_termination
from autotune.probe.tokenize_cache import load_token_sequences, load_tokenizer
_interrupt_on_termination()
load_tokenizer(sys.argv[2])  # transformers imported before the clock starts
print("reading", flush=True)
try:
    load_token_sequences(sys.argv[1], seq_len=64, tokenizer=sys.argv[2], use_cache=False)
    print("read", flush=True)
    time.sleep(120)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    os._exit(130)  # (the interpreter's teardown, seconds with torch imported, is not what is measured)
"""


def test_sigterm_is_honoured_within_seconds_while_big_rows_are_read_and_tokenized(tmp_path: Path) -> None:
    """Whatever it is doing when the signal comes (reading, tokenizing or done), the CLI's SIGTERM handler
    runs within seconds: no C call (json.loads, the tokenizer, pyarrow) holds it for long."""
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        for i in range(3):
            f.write(json.dumps({"text": _big_text(4, f"row {i} ")}) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), TOK], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "reading", proc.stderr
        time.sleep(1.0)  # (the rows are read by now; unbounded, the tokenizer would be busy for tens of seconds)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        lines = []
        while (line := proc.stdout.readline().strip()) and line != "interrupted":
            lines.append(line)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    assert line == "interrupted", (lines, proc.stderr.read() if proc.stderr else "")
    assert took < 3.0, f"the SIGTERM handler waited {took:.1f} s"


def test_interruptible_lets_the_signal_handler_run_during_a_long_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mechanism: a call that releases the GIL (a stand-in for pyarrow decoding a row group) does not hold
    the main thread's signal handler until it returns."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(signum)

    old = signal.signal(signal.SIGTERM, interrupt)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            readers.interruptible(time.sleep, 10)
        assert time.monotonic() - t0 < 2.0
    finally:
        timer.cancel()  # (a failure before it fires must not leave a SIGTERM for the default handler)
        timer.join()
        signal.signal(signal.SIGTERM, old)
    assert readers.interruptible(sum, [1, 2, 3]) == 6
    with pytest.raises(ZeroDivisionError):
        readers.interruptible(lambda: 1 / 0)


# ------------------------------------------------------------------------------------- sizes first


@pytest.fixture
def no_read_of(monkeypatch: pytest.MonkeyPatch):
    """``no_read_of(path)``: opening ``path`` (or a file under it) fails the test."""
    guarded: list[str] = []
    real_open = builtins.open

    def guarded_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and any(os.fspath(file).startswith(g) for g in guarded):
            raise AssertionError(f"{file} was opened before its size was checked")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    return lambda p: guarded.append(os.fspath(p))


def _sparse(path: Path, size: int = 3 * 2**30) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # no disk used
    return path


def test_a_dataset_file_past_the_bound_is_refused_by_its_size_before_it_is_read(tmp_path: Path, no_read_of) -> None:
    big = _sparse(tmp_path / "big.jsonl")
    no_read_of(big)
    bound = f"more than the {MAX_DATASET_FILE_BYTES:,} a dataset file may hold"
    with pytest.raises(DatasetError, match=f"3,221,225,472 bytes, {bound}.*head -n 20000"):
        tokenize_cache.load_token_sequences(big, seq_len=SEQ, tokenizer=TOK)
    # a save_to_disk folder holding such a file: the file is named, and smaller shards are the fix
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    shard = _sparse(folder / "data-00000-of-00001.arrow")
    no_read_of(folder)
    with pytest.raises(DatasetError, match=f"{shard}: 3,221,225,472 bytes, {bound}.*max_shard_size"):
        tokenize_cache.load_token_sequences(folder, seq_len=SEQ, tokenizer=TOK)


@pytest.mark.parametrize("kind", ["sparse", "fifo", "/dev/zero"])
def test_run_refuses_a_huge_or_special_dataset_file_in_one_line_without_reading_it(tmp_path: Path, no_read_of,
                                                                                   kind: str) -> None:
    if kind == "sparse":
        f = _sparse(tmp_path / "big.jsonl")
    elif kind == "fifo":
        f = tmp_path / "pipe.jsonl"
        os.mkfifo(f)
    else:
        f = Path(kind)
    no_read_of(f)
    res = CliRunner().invoke(app, ["run", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64",
                                   "--effective-batch", "4", "--space", "cpu", "--max-trials", "2", "--gpu-budget",
                                   "3GB", "--dataset", str(f), "--out", str(tmp_path / "out")], catch_exceptions=False)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.stderr
    # (a pipe or a device was refused before as well: kept here to hold that nothing opens one first)
    assert ("more than the" in lines[0] and "sample" in lines[0]) if kind == "sparse" else "is not a" in lines[0], \
        lines[0]
    assert not (tmp_path / "out").exists()


def test_a_parquet_row_group_past_the_bound_uncompressed_is_refused_before_it_is_decoded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small compressed file can hold gigabytes of repeated text, and pyarrow decodes a row group whole."""
    path = tmp_path / "dense.parquet"
    path.write_bytes(parquet_bytes([{"text": _big_text(1, f"row {i} ")} for i in range(3)]))
    assert path.stat().st_size < MB
    monkeypatch.setattr(readers, "_MAX_ROW_GROUP_BYTES", 2 * MB)  # (the bound is 2 GiB: 3 MB stand for it)
    with pytest.raises(DatasetError, match=r"row group 0 holds .* bytes of text uncompressed, more than the "
                                           r"2,097,152 read at once here; write it with smaller row groups"):
        readers.read_dataset(path, seq_len=SEQ)
