"""Reading a dataset's rows: JSONL, parquet, a ``save_to_disk`` folder, a cached Hub dataset.  [worker side]

Each reader returns ``(column, rows)``: ``text``, ``input_ids``, ``messages`` or ``prompt_completion``
rows, checked one by one (a bad row is one DatasetError naming the file and the row). Chat rows
become text through the tokenizer's chat template (:func:`render_chat`). Tokenizing and caching the
result is :mod:`autotune.probe.tokenize_cache`.

What is read is bounded by what a probe can use, not by the rows: every file's size is checked with
``stat`` before it is opened (``autotune.spec.dataset_ref.check_dataset_files``), and given ``seq_len`` each
row is cut as it is read to what a sequence of ``seq_len`` tokens can hold (:func:`text_limit` characters of
text, ``seq_len + 1`` token ids), so memory and tokenizing time follow ``seq_len`` x rows, not the rows'
size. Parquet and Arrow rows are converted to Python in batches of about ``_BATCH_BYTES``, and the long C
calls (pyarrow decoding a row group, a tokenizer batch) run through :func:`interruptible`, so a SIGTERM
(the CLI's KeyboardInterrupt, which Python handles only between bytecodes of the main thread) is honoured
within a second, not when the call returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from autotune.errors import DatasetError
from autotune.spec.dataset_ref import (
    MAX_DATASET_FILE_BYTES,
    check_dataset_files,
    default_datasets_cache_dir,
    find_hub_dataset,
    hub_dataset_dir,
    missing_hub_dataset_message,
)

__all__ = ["DATASET_EXTENSIONS", "MAX_CHARS_PER_TOKEN", "MAX_DATASET_BYTES", "MAX_LINE_BYTES", "cut_record",
           "interruptible", "read_dataset", "read_hub_online", "render_chat", "text_limit"]

_T = TypeVar("_T")

DATASET_EXTENSIONS = (".jsonl", ".parquet")
# a probe measures a few hundred sequences: a file past these bounds is refused in one line (checked with
# stat before it is opened), not read until the machine runs out of memory
MAX_DATASET_BYTES = MAX_DATASET_FILE_BYTES
MAX_LINE_BYTES = 64 * 2**20
# A token of the LLM tokenizers autotune meets spans about 4 characters of English text on average (fewer
# for code and most other scripts). A row's text is cut to (seq_len + 1) x 32 characters before it is
# held or tokenized: 8 times that average, so the seq_len + 1 tokens a probe keeps (one past seq_len tells
# a cut row from an exact fit) lie well inside the cut, and memory and tokenizing time follow seq_len, not
# the row. A text whose first seq_len tokens average more than 32 characters each would come out shorter
# than it is whole: runs of hundreds of spaces, or a word-level tokenizer's unknown long words (one token
# each, however long; the tiny tokenizer shipped for tests is word-level).
MAX_CHARS_PER_TOKEN = 32
# rows converted from Arrow (parquet, save_to_disk, the datasets cache) to Python per batch, by their bytes
_BATCH_BYTES = 64 * 2**20
# pyarrow decodes a parquet row group's column whole (a dictionary page at once): the columns read, uncompressed,
# are held to the bound of a file, since a small compressed file can hold gigabytes of repeated text
_MAX_ROW_GROUP_BYTES = MAX_DATASET_FILE_BYTES
_MAX_BATCH_ROWS = 65536


def interruptible(fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)``, run in a daemon thread while the main thread waits in slices of 0.1 s, so a
    signal handler (the CLI turns SIGTERM into KeyboardInterrupt) runs at once even while ``fn`` is inside
    one long C call that releases the GIL (pyarrow decoding a row group, a fast tokenizer's batch): the
    KeyboardInterrupt is raised here and the abandoned call ends with the process. Off the main thread
    (no handler runs there) ``fn`` is simply called."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="autotune-read", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def text_limit(seq_len: int) -> int:
    """Characters of a row's text a sequence of ``seq_len`` tokens can use (``MAX_CHARS_PER_TOKEN``)."""
    return (seq_len + 1) * MAX_CHARS_PER_TOKEN


def _cut_messages(v: Any, budget: int) -> tuple[Any, int]:
    """Chat messages with their string contents cut to ``budget`` characters in all, in order (a chat
    template renders them in order); what is left of the budget."""
    if not isinstance(v, list):
        return v, budget
    out = []
    for m in v:
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            if len(m["content"]) > budget:
                m = {**m, "content": m["content"][:budget]}
            budget -= len(m["content"])
        out.append(m)
    return out, budget


def _cut(column: str, v: Any, seq_len: int | None) -> Any:
    """Row value ``v`` of ``column`` cut to what a sequence of ``seq_len`` tokens can use: text to
    ``text_limit(seq_len)`` characters (a chat's contents, or a prompt then its completion, together),
    token ids to ``seq_len + 1``; a value of another type as it is (the row check refuses it)."""
    if seq_len is None:
        return v
    limit = text_limit(seq_len)
    if column == "text":
        return v[:limit] if isinstance(v, str) else v
    if column == "input_ids":
        return v[: seq_len + 1] if isinstance(v, (list, tuple)) else v
    if column == "messages":
        return _cut_messages(v, limit)[0]
    if column == "prompt_completion" and isinstance(v, dict):
        out, budget = dict(v), limit
        for k in ("prompt", "completion"):
            x = v.get(k)
            if isinstance(x, str):
                out[k] = x = x[:budget]
                budget -= len(x)
            elif x is not None:
                out[k], budget = _cut_messages(x, budget)
        return out
    return v


def cut_record(rec: dict[str, Any], seq_len: int | None) -> dict[str, Any]:
    """A raw record (its columns by name, as a Hub sample row) with each column autotune reads cut as
    reading it would cut it (``seq_len`` None: as it is)."""
    out = dict(rec)
    for column in ("text", "input_ids", "messages"):
        if column in out:
            out[column] = _cut(column, out[column], seq_len)
    if "prompt" in out and "completion" in out:
        out.update(_cut("prompt_completion", {"prompt": out["prompt"], "completion": out["completion"]}, seq_len))
    return out


def _batch_rows(total_bytes: int, num_rows: int) -> int:
    """Rows per Arrow-to-Python batch: about ``_BATCH_BYTES`` of them (at least one)."""
    per_row = max(1, total_bytes // max(1, num_rows))
    return max(1, min(_MAX_BATCH_ROWS, _BATCH_BYTES // per_row))


def _check_size(path: Path) -> None:
    check_dataset_files(path)


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


def _read_jsonl(path: Path, seq_len: int | None = None) -> tuple[str, list[Any]]:
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
            if not line or line.isspace():  # (no stripped copy of a long line)
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
                v = {"prompt": rec["prompt"], "completion": rec["completion"]}
            elif column not in rec:
                raise DatasetError(f"{path}: line {lineno} has no {column!r} key (the first record has one)")
            else:
                v = rec[column]
            del rec, line, raw  # the whole line is not held while the next one is read: only its cut row is kept
            values.append(_check_row(column, _cut(column, v, seq_len), f"line {lineno}", path))
            del v
    if column is None:
        raise DatasetError(f"{path}: the dataset is empty (no JSON lines); it needs at least one record")
    return column, values


def _read_parquet(path: Path, seq_len: int | None = None) -> tuple[str, list[Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            f"reading {path} needs pyarrow: pip install 'autotune[data]' (or pip install pyarrow), "
            "or convert the dataset to .jsonl"
        ) from None
    _check_size(path)
    try:
        pf = pq.ParquetFile(path)
        names = list(pf.schema_arrow.names)
    except Exception as e:
        raise DatasetError(f"{path}: cannot read as parquet ({type(e).__name__}: {e})") from None
    # (no `with pf`: closing the file under a decode that a SIGTERM abandoned in interruptible's thread could
    # crash it; the file is closed when the last reference goes)
    column = _pick_column(names, str(path))  # the same columns as a .jsonl file, in the same order
    columns = ["prompt", "completion"] if column == "prompt_completion" else [column]
    values: list[Any] = []
    try:
        md = pf.metadata
        _check_row_groups(md, columns, path)
        size = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
        batches = pf.iter_batches(batch_size=_batch_rows(size, md.num_rows), columns=columns)
        while (batch := interruptible(next, batches, None)) is not None:  # (a row group is decoded whole)
            _take(column, batch.to_pydict(), values, seq_len, path)
    except DatasetError:
        raise
    except Exception as e:
        raise DatasetError(f"{path}: cannot read column(s) {', '.join(columns)} ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]})") from None
    if not values:
        raise DatasetError(f"{path}: the dataset is empty (no rows); it needs at least one record")
    return column, values


def _check_row_groups(md: Any, columns: list[str], path: Path) -> None:
    """DatasetError for a row group whose ``columns`` take more than ``_MAX_ROW_GROUP_BYTES`` uncompressed."""
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        size = sum(rg.column(j).total_uncompressed_size for j in range(rg.num_columns)
                   if rg.column(j).path_in_schema.split(".")[0] in columns)
        if size > _MAX_ROW_GROUP_BYTES:
            raise DatasetError(
                f"{path}: row group {i} holds {size:,} bytes of {', '.join(columns)} uncompressed, more than the "
                f"{_MAX_ROW_GROUP_BYTES:,} read at once here; write it with smaller row groups "
                "(pyarrow.parquet.write_table(table, path, row_group_size=1000)) or pass a part of it")


def _take(column: str, batch: dict[str, list[Any]], values: list[Any], seq_len: int | None, path: Path | str) -> None:
    """A batch's rows of ``column`` (a column name -> values mapping), cut and checked, appended to ``values``."""
    if column == "prompt_completion":
        rows: Any = ({"prompt": p, "completion": c} for p, c in zip(batch["prompt"], batch["completion"], strict=True))
    else:
        rows = batch[column]
    for v in rows:
        values.append(_check_row(column, _cut(column, v, seq_len), f"row {len(values)}", path))


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


def _read_saved(path: Path, split: str | None, seq_len: int | None = None) -> tuple[str, list[Any]]:
    """A directory written by ``datasets.Dataset.save_to_disk`` (or a DatasetDict's, with ``split``)."""
    check_dataset_files(path)
    datasets = _import_datasets(f"the saved dataset {str(path)!r}")
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DatasetError(
            f"{path}: not a dataset written by save_to_disk ({type(e).__name__}: {e}); pass a directory from "
            "Dataset.save_to_disk / DatasetDict.save_to_disk, or a .jsonl/.parquet file"
        ) from None
    return _rows_of(ds, split, path, datasets, seq_len)


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


def _read_hub(ref: str, split: str | None, seq_len: int | None = None) -> tuple[str, list[Any]]:
    """A Hub dataset id already prepared in the local datasets cache, loaded with the network off."""
    datasets = _import_datasets(f"the Hub dataset {ref!r}")
    root = default_datasets_cache_dir()
    folder = find_hub_dataset(ref, root)
    if folder is None:
        raise DatasetError(missing_hub_dataset_message(ref, root))
    check_dataset_files(folder)
    try:
        with _hub_offline():
            ds = datasets.load_dataset(ref, cache_dir=str(root))
    except Exception as e:
        raise DatasetError(
            f"dataset {ref!r}: the copy in the local cache {hub_dataset_dir(ref, root)} cannot be loaded offline "
            f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); load it once with datasets.load_dataset"
            f"('{ref}') while online, or pass a path"
        ) from None
    return _rows_of(ds, split, Path(ref), datasets, seq_len)


def read_hub_online(ref: str, split: str | None, seq_len: int | None = None) -> tuple[str, list[Any]]:
    """The whole split of Hub dataset ``ref``, downloaded by ``datasets`` as the user would (train.py)."""
    datasets = _import_datasets(f"the Hub dataset {ref!r}")
    try:
        ds = datasets.load_dataset(ref, split=split or "train")
    except Exception as e:
        raise DatasetError(f"dataset {ref!r} cannot be loaded from the Hub ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]}); check the id and --split, or pass a path") from None
    return _rows_of(ds, None, Path(ref), datasets, seq_len)


def _rows_of(ds: Any, split: str | None, path: Path, datasets: Any, seq_len: int | None = None) -> tuple[str, list[Any]]:
    """The chosen split's usable column, cut and checked row by row, converted in batches of about
    ``_BATCH_BYTES``."""
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
    part = ds.select_columns(["prompt", "completion"] if column == "prompt_completion" else [column])
    step = _batch_rows(part.data.nbytes, len(part))
    values: list[Any] = []
    for start in range(0, len(part), step):
        _take(column, part[start : start + step], values, seq_len, path)
    return column, values


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


def read_dataset(path: Path, split: str | None = None, hub_id: str | None = None, *,
                 seq_len: int | None = None) -> tuple[str, list[Any]]:
    """``(column, rows)`` of the dataset at ``path`` (or Hub id ``hub_id`` in the datasets cache); given
    ``seq_len``, each row cut to what a sequence of that many tokens can use (see the module doc)."""
    if hub_id is not None:
        return _read_hub(hub_id, split, seq_len)
    if path.is_dir():
        return _read_saved(path, split, seq_len)
    if path.suffix.lower() == ".jsonl":
        return _read_jsonl(path, seq_len)
    return _read_parquet(path, seq_len)
