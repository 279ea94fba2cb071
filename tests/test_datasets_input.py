"""--dataset as people have it: save_to_disk directories (with --split), chat 'messages' rendered with
the tokenizer's chat template, prompt/completion pairs; the shipped tiny chat tokenizer makes it offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.errors import DatasetError
from autotune.probe.data import load_token_sequences

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

TOK = str(Path(__file__).resolve().parent.parent / "autotune" / "models" / "tokenizers" / "tiny-chat")

CHATS = [
    [{"role": "user", "content": "how fast is the model ?"}, {"role": "assistant", "content": "very fast ."}],
    [{"role": "system", "content": "be good ."}, {"role": "user", "content": "tell me a story"},
     {"role": "assistant", "content": "the sun and the moon were one . the end ."}],
    [{"role": "user", "content": "list three colors"}, {"role": "assistant", "content": "red , green , blue"}],
]  # fmt: skip


def _rendered(messages) -> list[int]:
    tok = transformers.AutoTokenizer.from_pretrained(TOK)
    text = tok.apply_chat_template(messages, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_shipped_tokenizer_has_a_chat_template_and_fits_tiny_vocab():
    tok = transformers.AutoTokenizer.from_pretrained(TOK)
    assert tok.chat_template and len(tok) < 2048
    ids = tok.apply_chat_template(CHATS[0], tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.unk_token_id not in ids and ids[0] == tok.bos_token_id


def test_save_to_disk_chat_dataset_is_rendered_with_the_chat_template(tmp_path):
    d = tmp_path / "chat"
    datasets.Dataset.from_dict({"messages": CHATS}).save_to_disk(str(d))
    loaded = load_token_sequences(d, seq_len=64, tokenizer=TOK, cache_dir=tmp_path / "c")
    assert loaded.column == "messages" and loaded.num_records == 3
    got = [
        loaded.sequences.tokens[a:b].tolist()
        for a, b in zip(loaded.sequences.offsets[:-1], loaded.sequences.offsets[1:], strict=True)
    ]
    assert got == [_rendered(m) for m in CHATS]
    again = load_token_sequences(d, seq_len=64, tokenizer=TOK, cache_dir=tmp_path / "c")
    assert again.cache_hit and again.sequences.lengths().tolist() == loaded.sequences.lengths().tolist()


def test_dataset_dict_needs_a_known_split(tmp_path):
    d = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"messages": CHATS}),
         "test": datasets.Dataset.from_dict({"messages": CHATS[:1]})}
    ).save_to_disk(str(d))  # fmt: skip
    assert load_token_sequences(d, seq_len=64, tokenizer=TOK, use_cache=False).num_records == 3
    assert load_token_sequences(d, seq_len=64, tokenizer=TOK, use_cache=False, split="test").num_records == 1
    with pytest.raises(DatasetError, match=r"splits test, train, not 'dev'; pass --split"):
        load_token_sequences(d, seq_len=64, tokenizer=TOK, use_cache=False, split="dev")


def test_prompt_completion_pairs_strings_and_conversational(tmp_path):
    tok = transformers.AutoTokenizer.from_pretrained(TOK)
    f = tmp_path / "pc.jsonl"
    f.write_text(
        "".join(
            json.dumps({"prompt": "what is a gpu ?", "completion": " a fast one ."}) + "\n" for _ in range(2)
        )
    )
    loaded = load_token_sequences(f, seq_len=64, tokenizer=TOK, use_cache=False)
    assert loaded.column == "prompt_completion"
    assert loaded.sequences.lengths().tolist()[0] == len(
        tok("what is a gpu ? a fast one .", add_special_tokens=False)["input_ids"]
    )
    d = tmp_path / "pcconv"
    datasets.Dataset.from_dict({"prompt": [CHATS[0][:1]], "completion": [CHATS[0][1:]]}).save_to_disk(str(d))
    loaded = load_token_sequences(d, seq_len=64, tokenizer=TOK, use_cache=False)
    assert loaded.sequences.tokens.tolist() == _rendered(CHATS[0])


def test_chat_rows_truncate_to_seq_len(tmp_path):
    d = tmp_path / "chat"
    datasets.Dataset.from_dict({"messages": CHATS}).save_to_disk(str(d))
    loaded = load_token_sequences(d, seq_len=8, tokenizer=TOK, use_cache=False)
    assert loaded.sequences.lengths().max() == 8 and loaded.num_truncated == 3


def test_chat_needs_a_tokenizer_with_a_template(tmp_path):
    d = tmp_path / "chat"
    datasets.Dataset.from_dict({"messages": CHATS}).save_to_disk(str(d))
    plain = tmp_path / "tok"
    tok = transformers.AutoTokenizer.from_pretrained(TOK)
    tok.chat_template = None
    tok.save_pretrained(plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(DatasetError, match="no chat_template; pass --tokenizer"):
        load_token_sequences(d, seq_len=64, tokenizer=str(plain), use_cache=False)


def test_bad_saved_directory_and_columns(tmp_path):
    (tmp_path / "junk").mkdir()
    with pytest.raises(DatasetError, match="not a dataset written by save_to_disk"):
        load_token_sequences(tmp_path / "junk", seq_len=64, tokenizer=TOK, use_cache=False)
    d = tmp_path / "cols"
    datasets.Dataset.from_dict({"question": ["a"], "answer": ["b"]}).save_to_disk(str(d))
    with pytest.raises(DatasetError, match=r"no usable column .*'messages'"):
        load_token_sequences(d, seq_len=64, tokenizer=TOK, use_cache=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": "hello"}) + "\n")
    with pytest.raises(DatasetError, match="'messages' must be a non-empty list"):
        load_token_sequences(bad, seq_len=64, tokenizer=TOK, use_cache=False)


@pytest.mark.slow
def test_probe_cli_on_a_save_to_disk_chat_dataset(tmp_path):
    d = tmp_path / "chat"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"messages": CHATS * 8})}).save_to_disk(str(d))
    cmd = [sys.executable, "-m", "autotune", "probe", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64",
           "--micro-batch", "2", "--precision", "fp32", "--dataset", str(d), "--split", "train", "--tokenizer", TOK,
           "--warmup-steps", "1", "--steps", "2", "--json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    assert res["status"] == "ok" and res["metrics"]["dataset_column"] == "messages"
    assert res["metrics"]["mean_seq_len"] == pytest.approx(
        sum(len(_rendered(m)) for m in CHATS) / 3, rel=0.35
    )
