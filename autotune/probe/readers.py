"""Reading a dataset's rows: JSONL, parquet, a ``save_to_disk`` folder, a cached Hub dataset.  [worker side]

Each reader returns ``(column, rows)``: ``text``, ``input_ids``, ``messages`` or ``prompt_completion``
rows, checked one by one (a bad row is one DatasetError naming the file and the row). Chat rows
become text through the tokenizer's chat template (:func:`render_chat`). Tokenizing and caching the
result is :mod:`autotune.probe.tokenize_cache`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.errors import DatasetError
from autotune.spec.dataset_ref import (
    default_datasets_cache_dir,
    find_hub_dataset,
    hub_dataset_dir,
    missing_hub_dataset_message,
)

__all__ = ["DATASET_EXTENSIONS", "MAX_DATASET_BYTES", "MAX_LINE_BYTES", "read_dataset", "read_hub_online",
           "render_chat"]

DATASET_EXTENSIONS = (".jsonl", ".parquet")
# a probe measures a few hundred sequences: a file past these bounds is refused in one line (the rows
# are held in memory, several times their bytes), not read until the machine runs out of memory
MAX_DATASET_BYTES = 2 * 2**30
MAX_LINE_BYTES = 64 * 2**20


def _check_size(path: Path) -> None:
    size = path.stat().st_size
    if size > MAX_DATASET_BYTES:
        raise DatasetError(
            f"{path}: {size:,} bytes, more than the {MAX_DATASET_BYTES:,} a dataset file may hold here; probes "
            "need a sample: pass a part of it (e.g. head -n 20000 data.jsonl > sample.jsonl) or a save_to_disk folder"
        )


def _text_ok(v: str, where: str, path: Path | str, what: str) -> str:
    """``v``, refused when it cannot be UTF-8 encoded (a lone surrogate such as "\\ud800")."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DatasetError(f"{path}: {where}: {what} holds an unpaired surrogate ({v[e.start]!r} at character "
                           f"{e.start}), which is not text; fix or drop that row") from None
    return v


def _check_ids(value: Any, where: str, path: Path) -> list[int]:
    if not isinstance(value, (list, tuple)) or any(
        isinstance(t, bool) or not isinstance(t, int) or t < 0 or t > _MAX_TOKEN_ID for t in value
    ):
        raise DatasetError(f"{path}: {where}: 'input_ids' must be a list of non-negative integers (at most {_MAX_TOKEN_ID})")
    return list(value)


_MAX_TOKEN_ID = 2**31 - 1  # (a larger id overflows the tensor it goes into; no vocabulary is that large)


def _read_jsonl(path: Path) -> tuple[str, list[Any]]:
    column: str | None = None
    values: list[Any] = []
    _check_size(path)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise DatasetError(f"{path}: line {lineno} is longer than {MAX_LINE_BYTES:,} bytes; "
                                   "each line must be one JSON record of reasonable size")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(
                    f"{path}: line {lineno} is not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                    "the dataset must be UTF-8 JSON lines"
                ) from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise DatasetError(
                    f"{path}: line {lineno} is not valid JSON ({e}); each line must be one JSON object"
                ) from None
            except RecursionError:
                raise DatasetError(f"{path}: line {lineno} is nested too deeply to read; "
                                   "each line must be one flat JSON object") from None
            if not isinstance(rec, dict):
                raise DatasetError(
                    f"{path}: line {lineno} is a JSON {type(rec).__name__}, not an object with a "
                    "'text' or 'input_ids' key"
                )
            if column is None:
                column = _pick_column(list(rec), f"{path}: line {lineno}")
            if column == "prompt_completion":
                if "prompt" not in rec or "completion" not in rec:
                    raise DatasetError(
                        f"{path}: line {lineno} lacks 'prompt' or 'completion' (the first record has both)"
                    )
                values.append(
                    _check_row(
                        column,
                        {"prompt": rec["prompt"], "completion": rec["completion"]},
                        f"line {lineno}",
                        path,
                    )
                )
                continue
            if column not in rec:
                raise DatasetError(f"{path}: line {lineno} has no {column!r} key (the first record has one)")
            v = rec[column]
            if column == "messages":
                v = _check_row(column, v, f"line {lineno}", path)
            elif column == "text":
                v = _check_row(column, v, f"line {lineno}", path)
            else:
                v = _check_ids(v, f"line {lineno}", path)
            values.append(v)
    if column is None:
        raise DatasetError(f"{path}: the dataset is empty (no JSON lines); it needs at least one record")
    return column, values


def _read_parquet(path: Path) -> tuple[str, list[Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            f"reading {path} needs pyarrow: pip install 'autotune[data]' (or pip install pyarrow), "
            "or convert the dataset to .jsonl"
        ) from None
    _check_size(path)
    try:
        names = list(pq.read_schema(path).names)
    except Exception as e:
        raise DatasetError(f"{path}: cannot read as parquet ({type(e).__name__}: {e})") from None
    column = _pick_column(names, str(path))  # the same columns as a .jsonl file, in the same order
    columns = ["prompt", "completion"] if column == "prompt_completion" else [column]
    try:
        table = pq.read_table(path, columns=columns)
        if column == "prompt_completion":
            rows: list[Any] = [{"prompt": p, "completion": c} for p, c in
                               zip(table.column("prompt").to_pylist(), table.column("completion").to_pylist(),
                                   strict=True)]
        else:
            rows = table.column(column).to_pylist()
    except Exception as e:
        raise DatasetError(f"{path}: cannot read column(s) {', '.join(columns)} ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]})") from None
    if not rows:
        raise DatasetError(f"{path}: the dataset is empty (no rows); it needs at least one record")
    return column, [_check_row(column, v, f"row {i}", path) for i, v in enumerate(rows)]


_COLUMNS_HELP = (
    "rename a column to 'text' (raw text), 'messages' (chat: a list of {role, content}), "
    "'prompt' + 'completion', or 'input_ids' (token ids)"
)


def _pick_column(names: list[str], where: str) -> str:
    """Which column to read: token ids first, then chat, prompt/completion, raw text."""
    if "input_ids" in names:
        return "input_ids"
    if "messages" in names:
        return "messages"
    if "prompt" in names and "completion" in names:
        return "prompt_completion"
    if "text" in names:
        return "text"
    raise DatasetError(f"{where}: no usable column (columns: {sorted(names)}); {_COLUMNS_HELP}")


def _check_messages(v: Any, where: str, path: Path | str, what: str) -> list[Any]:
    """A non-empty list of {role: str, content: str | list} messages (null content refused)."""
    def good(m: Any) -> bool:
        return isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), (str, list))

    if not isinstance(v, list) or not v or not all(good(m) for m in v):
        bad = next((i for i, m in enumerate(v) if not good(m)), None) if isinstance(v, list) else None
        at = f" (message {bad}: {_describe(v[bad])})" if bad is not None else ""
        raise DatasetError(f"{path}: {where}: {what} must be a non-empty list of {{role, content}} objects with "
                           f"string role and content{at}")
    for i, m in enumerate(v):
        _text_ok(m["role"], where, path, f"message {i}'s role")
        if isinstance(m["content"], str):
            _text_ok(m["content"], where, path, f"message {i}'s content")
    return list(v)


def _describe(m: Any) -> str:
    if not isinstance(m, dict):
        return f"a {type(m).__name__}"
    for k in ("role", "content"):
        if k not in m:
            return f"no {k!r}"
        if not isinstance(m[k], (str, list)) or (k == "role" and not isinstance(m[k], str)):
            return f"{k} is {'null' if m[k] is None else type(m[k]).__name__}"
    return "not a message"


def _check_row(column: str, v: Any, where: str, path: Path | str) -> Any:
    if column == "messages":
        v = _check_messages(v, where, path, "'messages'")
    elif column == "prompt_completion":
        if not all(isinstance(v[k], (str, list)) for k in ("prompt", "completion")):
            got = ", ".join(f"{k} is {'null' if v[k] is None else type(v[k]).__name__}" for k in ("prompt", "completion")
                            if not isinstance(v[k], (str, list)))
            raise DatasetError(f"{path}: {where}: 'prompt' and 'completion' must be strings or message lists ({got})")
        for k in ("prompt", "completion"):
            if isinstance(v[k], str):
                _text_ok(v[k], where, path, f"'{k}'")
            else:
                _check_messages(v[k], where, path, f"'{k}'")
    elif column == "text":
        if not isinstance(v, str):
            got = "null" if v is None else type(v).__name__
            raise DatasetError(f"{path}: {where}: 'text' must be a string, got {got}")
        _text_ok(v, where, path, "'text'")
    elif column == "input_ids":
        v = _check_ids(v, where, path)
    return v


def _import_datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            f"reading {what} needs the datasets library: pip install 'autotune[trl]' "
            "(or pip install datasets), or export it to .jsonl"
        ) from None
    return datasets


def _read_saved(path: Path, split: str | None) -> tuple[str, list[Any]]:
    """A directory written by ``datasets.Dataset.save_to_disk`` (or a DatasetDict's, with ``split``)."""
    datasets = _import_datasets(f"the saved dataset {str(path)!r}")
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DatasetError(
            f"{path}: not a dataset written by save_to_disk ({type(e).__name__}: {e}); pass a directory from "
            "Dataset.save_to_disk / DatasetDict.save_to_disk, or a .jsonl/.parquet file"
        ) from None
    return _rows_of(ds, split, path, datasets)


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """The Hub's offline switch on, for a library already imported too (it reads the variables at import)."""
    import datasets
    import huggingface_hub.constants as hub_constants

    saved_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _read_hub(ref: str, split: str | None) -> tuple[str, list[Any]]:
    """A Hub dataset id already prepared in the local datasets cache, loaded with the network off."""
    datasets = _import_datasets(f"the Hub dataset {ref!r}")
    root = default_datasets_cache_dir()
    if find_hub_dataset(ref, root) is None:
        raise DatasetError(missing_hub_dataset_message(ref, root))
    try:
        with _hub_offline():
            ds = datasets.load_dataset(ref, cache_dir=str(root))
    except Exception as e:
        raise DatasetError(
            f"dataset {ref!r}: the copy in the local cache {hub_dataset_dir(ref, root)} cannot be loaded offline "
            f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); load it once with datasets.load_dataset"
            f"('{ref}') while online, or pass a path"
        ) from None
    return _rows_of(ds, split, Path(ref), datasets)


def read_hub_online(ref: str, split: str | None) -> tuple[str, list[Any]]:
    """The whole split of Hub dataset ``ref``, downloaded by ``datasets`` as the user would (train.py)."""
    datasets = _import_datasets(f"the Hub dataset {ref!r}")
    try:
        ds = datasets.load_dataset(ref, split=split or "train")
    except Exception as e:
        raise DatasetError(f"dataset {ref!r} cannot be loaded from the Hub ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]}); check the id and --split, or pass a path") from None
    return _rows_of(ds, None, Path(ref), datasets)


def _rows_of(ds: Any, split: str | None, path: Path, datasets: Any) -> tuple[str, list[Any]]:
    """The chosen split's usable column, checked row by row."""
    if isinstance(ds, datasets.DatasetDict):
        splits = sorted(ds)
        chosen = split if split is not None else ("train" if "train" in ds else None)
        if chosen is None or chosen not in ds:
            raise DatasetError(
                f"{path}: holds splits {', '.join(splits)}"
                + (f", not {split!r}" if split is not None else " and no 'train'")
                + f"; pass --split NAME (one of {', '.join(splits)})"
            )
        ds = ds[chosen]
    elif split is not None:
        raise DatasetError(
            f"{path}: is a single Dataset (no splits) but --split {split!r} was given; drop --split"
        )
    column = _pick_column(list(ds.column_names), str(path))
    if len(ds) == 0:
        raise DatasetError(f"{path}: the dataset is empty (no rows); it needs at least one record")
    if column == "prompt_completion":
        rows = [{"prompt": p, "completion": c} for p, c in zip(ds["prompt"], ds["completion"], strict=True)]
    else:
        rows = list(ds[column])
    return column, [_check_row(column, v, f"row {i}", path) for i, v in enumerate(rows)]


def render_chat(column: str, values: list[Any], tok: Any, path: Path) -> list[str]:
    """Chat rows -> the text the tokenizer's chat template renders (what a chat trainer trains on)."""
    if column == "prompt_completion" and all(isinstance(v["prompt"], str) for v in values):
        return [v["prompt"] + v["completion"] for v in values]
    if not getattr(tok, "chat_template", None):
        raise DatasetError(
            f"dataset {str(path)!r} holds chat messages but the tokenizer has no chat_template; pass "
            "--tokenizer DIR of a tokenizer with one (e.g. the instruct model's)"
        )
    out = []
    for v in values:
        msgs = v if column == "messages" else list(v["prompt"]) + list(v["completion"])
        out.append(tok.apply_chat_template(msgs, tokenize=False))
    return out


def read_dataset(path: Path, split: str | None = None, hub_id: str | None = None) -> tuple[str, list[Any]]:
    if hub_id is not None:
        return _read_hub(hub_id, split)
    if path.is_dir():
        return _read_saved(path, split)
    if path.suffix.lower() == ".jsonl":
        return _read_jsonl(path)
    return _read_parquet(path)
