"""A dataset's token sequences: tokenized once, cached by content.  [worker side]

:func:`load_token_sequences` reads a dataset (:mod:`autotune.probe.readers`), tokenizes text with
``Workload.tokenizer`` or the model's own tokenizer files (:func:`find_tokenizer`), truncates to
``seq_len`` and caches the token lists (``.npz``, no pickle) under ``$AUTOTUNE_CACHE/datasets`` or
``~/.cache/autotune/datasets``, keyed by the data's content, the split, the tokenizer files and
``seq_len``.

Rows arrive cut to what ``seq_len`` tokens can use (:func:`autotune.probe.readers.text_limit`; a rendered
chat is cut again) and are tokenized in calls of at most ``_TOKENIZE_BATCH_CHARS`` characters, so one call
stays short and small, and runs through :func:`autotune.probe.readers.interruptible`: a SIGTERM (the CLI's
KeyboardInterrupt, which Python would handle only once the tokenizer's C call returns) is honoured at once.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.errors import DatasetError
from autotune.models import TOKENIZER_FILES
from autotune.probe.collate import (
    TokenSequences,
)
from autotune.probe.readers import (
    DATASET_EXTENSIONS,
    interruptible,
    read_dataset,
    read_hub_online,
    render_chat,
    text_limit,
)
from autotune.spec.dataset_ref import (
    check_dataset_files,
    dataset_content_digest,
    find_hub_dataset,
    find_hub_sample,
    is_hub_dataset_id,
    missing_hub_dataset_message,
)
from autotune.spec.probe_request import Workload

__all__ = ["CACHE_FORMAT", "TOKENIZER_FILES", "LoadedDataset", "default_cache_dir", "find_tokenizer", "load_tokenizer",
           "load_token_sequences"]

CACHE_FORMAT = 1
# text per tokenizer call: about a second of a fast tokenizer on one core, so the call's encodings stay a few
# hundred MB at most and a signal waits for no more than that
_TOKENIZE_BATCH_CHARS = 2**20
_TOKENIZE_BATCH_ROWS = 1000



def default_cache_dir() -> Path:
    """``$AUTOTUNE_CACHE/datasets`` when set, else ``~/.cache/autotune/datasets``."""
    root = os.environ.get("AUTOTUNE_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "autotune"
    return base / "datasets"


def _has_tokenizer_files(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in TOKENIZER_FILES)


def find_tokenizer(workload: Workload) -> str | None:
    """``workload.tokenizer``, else the model directory if it holds tokenizer files, else None."""
    if workload.tokenizer:
        return workload.tokenizer
    if workload.model_path and _has_tokenizer_files(Path(workload.model_path)):
        return workload.model_path
    return None


def _tokenizer_identity(tokenizer: str) -> str:
    p = Path(tokenizer)
    if not p.is_dir():
        return f"name:{tokenizer}"
    h = hashlib.sha256()
    for f in sorted(p.iterdir()):
        if f.is_file() and (f.name in TOKENIZER_FILES or f.name.startswith("tokenizer")):
            h.update(f.name.encode() + b"\0")
            h.update(f.read_bytes())
            h.update(b"\0")
    return f"files:{h.hexdigest()}"


def load_tokenizer(path: str, *, trust_remote_code: bool = False, local_files_only: bool = True) -> Any:
    """Load a tokenizer from a local directory or the local HF cache (the network only when allowed).

    A folder asking for its own code (``auto_map``) is refused unless ``trust_remote_code``
    (:func:`autotune.models.trust.trust_kwargs`); the flag is always passed, so transformers never
    prompts on stdin.
    """
    from autotune.models.trust import trust_kwargs

    trust = trust_kwargs(path, trust_remote_code=trust_remote_code, what="tokenizer")
    try:
        from transformers import AutoTokenizer
    except ImportError as e:  # pragma: no cover - transformers is a hard dependency
        raise DatasetError(f"transformers is needed to tokenize a text dataset ({e})") from None
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=local_files_only, **trust)
    except Exception as e:
        raise DatasetError(
            f"cannot load a tokenizer from {path!r} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "pass --tokenizer DIR (a directory with tokenizer.json/tokenizer_config.json)"
        ) from None


def _cache_file(
    cache_dir: Path, path: Path, tokenizer: str | None, seq_len: int, split: str | None = None
) -> Path:
    """``path``: the file, the save_to_disk folder or a Hub dataset's folder in the datasets cache."""
    key = hashlib.sha256(
        "\n".join(
            [
                f"format:{CACHE_FORMAT}",
                f"data:{dataset_content_digest(path)}",
                *([f"split:{split}"] if split is not None else []),
                f"tokenizer:{_tokenizer_identity(tokenizer) if tokenizer else '-'}",
                f"seq_len:{seq_len}",
            ]
        ).encode()
    ).hexdigest()
    return cache_dir / f"{key[:32]}.npz"


_META_INTS = ("num_records", "num_truncated", "num_empty", "seq_len")
_MAX_CACHE_BYTES = 4 * 2**30


def _valid_entry(tokens: Any, offsets: Any, meta: Any, seq_len: int | None) -> bool:
    """The cache entry is what this request would compute: its meta complete and typed, its sequences
    non-empty, within ``seq_len`` and laid out consistently, its token ids non-negative integers."""
    if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT:
        return False
    if not isinstance(meta.get("column"), str) or not all(
            isinstance(meta.get(k), int) and not isinstance(meta.get(k), bool) and meta[k] >= 0 for k in _META_INTS):
        return False
    if seq_len is not None and meta["seq_len"] != seq_len:
        return False
    if not (isinstance(tokens, np.ndarray) and isinstance(offsets, np.ndarray) and tokens.ndim == 1
            and offsets.ndim == 1 and np.issubdtype(tokens.dtype, np.integer) and np.issubdtype(offsets.dtype, np.integer)
            and len(offsets) >= 2 and offsets[0] == 0 and offsets[-1] == len(tokens)):
        return False
    lengths = np.diff(offsets)
    if (lengths < 1).any() or (seq_len is not None and (lengths > seq_len).any()):
        return False
    if len(lengths) != meta["num_records"] - meta["num_empty"]:
        return False
    return not (tokens.size and int(tokens.min()) < 0)


def _read_cache(file: Path, seq_len: int | None = None) -> tuple[TokenSequences, dict[str, Any]] | None:
    """The cached entry, or None (recompute) when it is missing, truncated, foreign or inconsistent
    with the request (a tampered or corrupted entry is re-tokenized, never served)."""
    try:
        if file.stat().st_size > _MAX_CACHE_BYTES:
            return None
        with np.load(file, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            tokens, offsets = z["tokens"], z["offsets"]
        if not _valid_entry(tokens, offsets, meta, seq_len):
            return None
        return TokenSequences(tokens, offsets), meta
    except Exception:  # missing, truncated or foreign: recompute
        return None


def _write_cache(file: Path, seqs: TokenSequences, meta: dict[str, Any]) -> bool:
    """Atomic write (tmp + os.replace). The cache is an optimisation: failures are ignored."""
    tmp = None
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.savez(buf, tokens=seqs.tokens, offsets=seqs.offsets, meta=np.array(json.dumps(meta)))
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, file)
        return True
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


@dataclass
class LoadedDataset:
    """Token sequences of a dataset file (truncated to ``seq_len``) and where they came from."""

    sequences: TokenSequences
    column: str
    path: str
    cache_file: str | None
    cache_hit: bool
    num_records: int
    num_truncated: int
    num_empty: int


def load_token_sequences(
    path: str | os.PathLike[str],
    *,
    seq_len: int,
    tokenizer: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    use_cache: bool = True,
    local_files_only: bool = True,
    split: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedDataset:
    """Read a ``.jsonl``/``.parquet`` dataset into token lists (tokenizing ``text`` once, cached).

    ``cache_dir`` defaults to ``default_cache_dir()``. ``trust_remote_code``: the user's flag (a
    tokenizer folder with its own code is refused without it). ``local_files_only=False`` lets the tokenizer
    come from the Hub (``train.py`` on a new machine); the probe never touches the network.
    Raises DatasetError with the fix.
    """
    p = Path(path).expanduser()
    hub_id = str(path) if is_hub_dataset_id(str(path)) else None
    reader_hub_id = hub_id
    if hub_id is not None:
        located = find_hub_dataset(hub_id)
        if located is None and not local_files_only:
            # train.py: the full dataset, by id, as the user would load it (never the probes' sample)
            return _tokenize(hub_id, *read_hub_online(hub_id, split, seq_len=seq_len), tokenizer=tokenizer,
                             seq_len=seq_len,
                             local_files_only=local_files_only, cfile=None, trust_remote_code=trust_remote_code)
        if located is None:
            # the probes: the bounded sample streamed when online (autotune.probe.hub_sample), JSON lines
            located = find_hub_sample(hub_id, split)
            reader_hub_id = None
        if located is None:
            raise DatasetError(missing_hub_dataset_message(hub_id))
        p = located
    elif not p.exists():
        raise DatasetError(
            f"dataset {str(p)!r} does not exist; pass --dataset PATH to a .jsonl or .parquet file, a save_to_disk "
            "folder, or a Hub id (org/name) in the local datasets cache"
        )
    if not p.is_file() and not p.is_dir():
        raise DatasetError(
            f"dataset {str(p)!r} is not a file; pass --dataset PATH to a .jsonl or .parquet file"
        )
    if p.is_file() and p.suffix.lower() not in DATASET_EXTENSIONS:
        raise DatasetError(
            f"dataset {str(p)!r} has unknown extension {p.suffix or '(none)'!r}; "
            "use a .jsonl file (one JSON object per line) or a .parquet file, with a 'text' or 'input_ids' column"
        )
    if p.is_file() and p.stat().st_size == 0:
        raise DatasetError(f"dataset {str(p)!r} is empty (0 bytes); it needs at least one record")
    check_dataset_files(p)  # every file's size, before the cache key hashes them or a reader opens one

    cdir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cfile = _cache_file(cdir, p, tokenizer, seq_len, split) if use_cache else None
    source = hub_id or str(p)
    if cfile is not None:
        hit = _read_cache(cfile, seq_len)
        if hit is not None:
            seqs, meta = hit
            if tokenizer is not None and meta["column"] != "input_ids":
                from autotune.models.trust import require_trusted

                require_trusted(tokenizer, trust_remote_code=trust_remote_code, what="tokenizer")
            return LoadedDataset(
                sequences=seqs,
                column=meta["column"],
                path=source,
                cache_file=str(cfile),
                cache_hit=True,
                num_records=meta["num_records"],
                num_truncated=meta["num_truncated"],
                num_empty=meta["num_empty"],
            )

    column, values = read_dataset(p, split, reader_hub_id, seq_len=seq_len) if reader_hub_id or not hub_id \
        else read_dataset(p, seq_len=seq_len)
    return _tokenize(source, column, values, tokenizer=tokenizer, seq_len=seq_len, local_files_only=local_files_only,
                     cfile=cfile, trust_remote_code=trust_remote_code)


def _text_batches(values: list[str]) -> Iterator[list[str]]:
    """``values`` in order, in batches of at most ``_TOKENIZE_BATCH_ROWS`` texts and ``_TOKENIZE_BATCH_CHARS``
    characters (a longer text alone)."""
    batch: list[str] = []
    chars = 0
    for v in values:
        if batch and (chars + len(v) > _TOKENIZE_BATCH_CHARS or len(batch) >= _TOKENIZE_BATCH_ROWS):
            yield batch
            batch, chars = [], 0
        batch.append(v)
        chars += len(v)
    if batch:
        yield batch


def _tokenize(source: str, column: str, values: list[Any], *, tokenizer: str | None, seq_len: int,
              local_files_only: bool, cfile: Path | None, trust_remote_code: bool = False) -> LoadedDataset:
    if column != "input_ids":
        if tokenizer is None:
            raise DatasetError(
                f"dataset {source!r} has a {column!r} column but no tokenizer was found: pass --tokenizer DIR "
                "(or use a model directory that contains tokenizer files), or give an 'input_ids' column"
            )
        tok = load_tokenizer(tokenizer, trust_remote_code=trust_remote_code, local_files_only=local_files_only)
        chat = column in ("messages", "prompt_completion")
        if chat:
            values = render_chat(column, values, tok, Path(source))
        limit = text_limit(seq_len)
        values = [t[:limit] for t in values]  # (the reader cut the rows; a chat template's own text is cut here)
        ids: list[list[int]] = []
        for chunk in _text_batches(values):
            # one token past seq_len tells a truncated record from an exact fit; a rendered chat
            # template already holds its special tokens
            enc = interruptible(tok, chunk, add_special_tokens=not chat, truncation=True, max_length=seq_len + 1)
            ids.extend(list(x) for x in enc["input_ids"])
    else:
        ids = values
    truncated = sum(1 for x in ids if len(x) > seq_len)
    ids = [x[:seq_len] for x in ids]
    kept = [x for x in ids if len(x) > 0]
    num_empty = len(ids) - len(kept)
    if not kept:
        raise DatasetError(f"dataset {source!r} is empty: all {len(ids)} records have no tokens")
    seqs = TokenSequences.from_lists(kept)
    meta = {
        "format": CACHE_FORMAT,
        "column": column,
        "source": source,
        "tokenizer": tokenizer,
        "seq_len": seq_len,
        "num_records": len(ids),
        "num_truncated": truncated,
        "num_empty": num_empty,
    }
    written = _write_cache(cfile, seqs, meta) if cfile is not None else False
    return LoadedDataset(
        sequences=seqs,
        column=column,
        path=source,
        cache_file=str(cfile) if written else None,
        cache_hit=False,
        num_records=len(ids),
        num_truncated=truncated,
        num_empty=num_empty,
    )
