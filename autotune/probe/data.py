"""The probe's training data: synthetic or real sequences, padded or packed.  [worker side]

``build_train_data`` returns a map-style torch ``Dataset`` holding exactly the items the Trainer
will consume (``num_optimizer_steps x grad_accum x micro_batch x world_size``), deterministic by
the workload's seed, and the matching collator:

* **padding** (``candidate.packing=False``): one sequence per item; the batch is right-padded to
  its longest sequence (``input_ids``, 2D ``attention_mask``, ``labels`` with -100 on padding).
* **packing** (``candidate.packing=True``): whole sequences are packed greedily into rows of at
  most ``seq_len`` tokens (never split); ``position_ids`` restart at 0 for each sequence and
  ``labels`` are -100 on the first token of every sequence (no cross-sequence prediction) and on
  padding. With ``sdpa`` and ``eager`` rows are padded to ``seq_len`` and carry an explicit 4D
  block-causal float mask ``(b, 1, L, L)`` (0 attended, dtype-min elsewhere) plus the restarted
  ``position_ids``. With ``flash_attention_2`` and ``flex_attention`` the rows are flattened into
  one ``(1, T)`` padding-free sequence with ``position_ids`` only, and the batch carries
  ``use_cache=False``: transformers finds the boundaries from ``position_ids`` (FA2 varlen; a
  document BlockMask for flex) but skips that detection when a KV cache exists, which a model
  with ``config.use_cache=True`` creates even in training. (Measured on 5.24 CPU: position_ids
  alone isolate sequences with use_cache=False and leak with use_cache=True; a 4D float tensor
  mask with flex_attention corrupted the heap on CPU, and flex has no CPU backward anyway.)

Every batch also carries ``autotune_real_tokens`` (a 0-dim int64 tensor, the number of real,
non-padding tokens in it). The probe pops it before the forward pass (``count_real_tokens``).

Dataset items only use keys that are arguments of a causal LM's ``forward`` (``input_ids``, and
``position_ids`` when packing), so Trainer's ``remove_unused_columns`` keeps them. Collators and
datasets are module-level classes with plain attributes: they pickle into DataLoader workers.

Real datasets (``--dataset``): ``.jsonl`` or ``.parquet`` with a ``text`` column (tokenized with
``Workload.tokenizer`` or the model's own tokenizer files) or an ``input_ids`` column. Token lists
are cached by content (``.npz``, no pickle) under ``$AUTOTUNE_CACHE/datasets`` or
``~/.cache/autotune/datasets``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from autotune.errors import DatasetError
from autotune.spec.lengths import histogram_from_lengths, iter_lengths, parse_lengths
from autotune.spec.probe_request import Candidate, Workload

__all__ = [
    "REAL_TOKENS_KEY",
    "IGNORE_INDEX",
    "FLATTEN_ATTN",
    "TokenSequences",
    "SyntheticSequences",
    "ProbeDataset",
    "PaddingCollator",
    "PackingCollator",
    "TrainData",
    "build_train_data",
    "count_real_tokens",
    "default_cache_dir",
    "find_tokenizer",
    "load_token_sequences",
    "length_histogram_from_dataset",
    "pack_greedy",
]

REAL_TOKENS_KEY = "autotune_real_tokens"
IGNORE_INDEX = -100
# attention implementations that take packed rows flattened, padding-free, with position_ids only
FLATTEN_ATTN = ("flash_attention_2", "flex_attention")
CACHE_FORMAT = 1
DATASET_EXTENSIONS = (".jsonl", ".parquet")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
)
# how many packing rows stay open for first-fit before the oldest is emitted
OPEN_ROWS = 8


# ---------------------------------------------------------------------------------------------
# Sequence sources (picklable, plain attributes)
# ---------------------------------------------------------------------------------------------


class TokenSequences:
    """Token lists stored flat: sequence ``i`` is ``tokens[offsets[i]:offsets[i+1]]``."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray) -> None:
        self.tokens = tokens
        self.offsets = offsets

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]]) -> TokenSequences:
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=int(offsets[-1]))
        dtype = np.int32 if flat.size == 0 or int(flat.max()) < 2**31 else np.int64
        return cls(flat.astype(dtype), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def length(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def get(self, i: int) -> torch.Tensor:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return torch.from_numpy(self.tokens[a:b].astype(np.int64))

    def max_token(self) -> int:
        return int(self.tokens.max()) if self.tokens.size else -1

    def to_lists(self) -> list[list[int]]:
        return [self.tokens[self.offsets[i] : self.offsets[i + 1]].tolist() for i in range(len(self))]


class SyntheticSequences:
    """Random token ids in ``[0, vocab_size)``, generated on demand, deterministic by (seed, index)."""

    def __init__(self, lengths: Sequence[int], vocab_size: int, seed: int) -> None:
        self.lengths_ = [int(x) for x in lengths]
        self.vocab_size = int(vocab_size)
        self.seed = int(seed)

    def __len__(self) -> int:
        return len(self.lengths_)

    def lengths(self) -> np.ndarray:
        return np.asarray(self.lengths_, dtype=np.int64)

    def length(self, i: int) -> int:
        return self.lengths_[i]

    def get(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + i) % (2**63))
        return torch.randint(0, self.vocab_size, (self.lengths_[i],), generator=g, dtype=torch.int64)


class ProbeDataset(Dataset):  # type: ignore[type-arg]
    """Items the probe trains on: each item is one sequence, or (packing) several whole ones.

    An item is ``{"input_ids": LongTensor(n)}``; a packed item adds ``position_ids`` restarting
    at 0 for each sequence (which is also how the collator finds the boundaries).
    """

    def __init__(
        self, rows: Sequence[Sequence[int]], source: TokenSequences | SyntheticSequences, *, packed: bool
    ):
        self.rows = [tuple(int(j) for j in r) for r in rows]
        self.source = source
        self.packed = packed

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        refs = self.rows[idx]
        if not self.packed:
            return {"input_ids": self.source.get(refs[0])}
        parts = [self.source.get(j) for j in refs]
        return {
            "input_ids": torch.cat(parts),
            "position_ids": torch.cat([torch.arange(len(p), dtype=torch.int64) for p in parts]),
        }

    def item_lengths(self, idx: int) -> list[int]:
        """Lengths of the sequences in item ``idx`` (without building it)."""
        return [self.source.length(j) for j in self.rows[idx]]

    def real_tokens(self, idx: int) -> int:
        return sum(self.item_lengths(idx))


# ---------------------------------------------------------------------------------------------
# Collators
# ---------------------------------------------------------------------------------------------


def _as_long(x: Any) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.int64).reshape(-1)


class PaddingCollator:
    """Right-pads a batch to its longest sequence (rounded up to ``pad_to_multiple_of``).

    Returns ``input_ids``, ``attention_mask`` (2D), ``labels`` (input ids, -100 on padding) and
    ``autotune_real_tokens``.
    """

    def __init__(self, pad_token_id: int | None = 0, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = 0 if pad_token_id is None else int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        seqs = [_as_long(f["input_ids"]) for f in features]
        width = max(len(s) for s in seqs)
        m = self.pad_to_multiple_of
        if m:
            width = -(-width // m) * m
        b = len(seqs)
        input_ids = torch.full((b, width), self.pad_token_id, dtype=torch.int64)
        attention_mask = torch.zeros((b, width), dtype=torch.int64)
        labels = torch.full((b, width), IGNORE_INDEX, dtype=torch.int64)
        for i, s in enumerate(seqs):
            n = len(s)
            input_ids[i, :n] = s
            attention_mask[i, :n] = 1
            labels[i, :n] = s
        real = sum(len(s) for s in seqs)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            REAL_TOKENS_KEY: torch.tensor(real, dtype=torch.int64),
        }


class PackingCollator:
    """Collates packed rows (items with ``input_ids`` + restarting ``position_ids``).

    ``attn`` in ``FLATTEN_ATTN`` (flash_attention_2, flex_attention): rows are concatenated into one
    ``(1, T)`` padding-free batch with ``position_ids`` only, plus ``use_cache=False`` (a Python
    bool; without it transformers skips packed-sequence detection when the model's config has
    use_cache=True). Other attention implementations: rows are right-padded to ``seq_len``
    and get a 4D block-causal ``attention_mask`` ``(b, 1, seq_len, seq_len)`` in ``mask_dtype``
    (0 where attended, ``finfo(mask_dtype).min`` elsewhere; a padding token attends only to itself,
    so no row of the mask is fully masked). ``mask_dtype`` should be the dtype of the model's
    hidden states (its parameter dtype; fp32 when mixed precision runs under autocast).
    """

    def __init__(
        self,
        *,
        seq_len: int,
        pad_token_id: int | None = 0,
        attn: str = "sdpa",
        mask_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.seq_len = int(seq_len)
        self.pad_token_id = 0 if pad_token_id is None else int(pad_token_id)
        self.attn = attn
        self.mask_dtype = mask_dtype

    @property
    def flatten(self) -> bool:
        return self.attn in FLATTEN_ATTN

    def _row(self, f: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = _as_long(f["input_ids"])
        if "position_ids" in f and f["position_ids"] is not None:
            pos = _as_long(f["position_ids"])
        else:  # a plain sequence: one segment
            pos = torch.arange(len(ids), dtype=torch.int64)
        if len(pos) != len(ids):
            raise ValueError(f"position_ids ({len(pos)}) and input_ids ({len(ids)}) differ in length")
        return ids, pos

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        rows = [self._row(f) for f in features]
        real = sum(len(ids) for ids, _ in rows)
        if self.flatten:
            ids = torch.cat([r[0] for r in rows]).unsqueeze(0)
            pos = torch.cat([r[1] for r in rows]).unsqueeze(0)
            labels = ids.clone()
            labels[pos == 0] = IGNORE_INDEX
            return {
                "input_ids": ids,
                "position_ids": pos,
                "labels": labels,
                "use_cache": False,
                REAL_TOKENS_KEY: torch.tensor(real, dtype=torch.int64),
            }
        width = max(self.seq_len, max(len(ids) for ids, _ in rows))
        b = len(rows)
        input_ids = torch.full((b, width), self.pad_token_id, dtype=torch.int64)
        labels = torch.full((b, width), IGNORE_INDEX, dtype=torch.int64)
        position_ids = torch.zeros((b, width), dtype=torch.int64)
        minv = torch.finfo(self.mask_dtype).min
        mask = torch.full((b, 1, width, width), minv, dtype=self.mask_dtype)
        causal = torch.full((width, width), minv, dtype=self.mask_dtype).triu_(1)  # 0 on/below diagonal
        for i, (ids, pos) in enumerate(rows):
            n = len(ids)
            input_ids[i, :n] = ids
            position_ids[i, :n] = pos
            position_ids[i, n:] = torch.arange(width - n, dtype=torch.int64)
            lab = ids.clone()
            lab[pos == 0] = IGNORE_INDEX
            labels[i, :n] = lab
            starts = (pos == 0).nonzero().reshape(-1).tolist()
            if not starts or starts[0] != 0:
                starts = [0, *starts]
            for s, e in zip(starts, [*starts[1:], n], strict=True):
                mask[i, 0, s:e, s:e] = causal[: e - s, : e - s]  # a causal block per sequence
            tail = torch.arange(n, width)
            mask[i, 0, tail, tail] = 0  # a padding token attends to itself only
        return {
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": position_ids,
            "labels": labels,
            REAL_TOKENS_KEY: torch.tensor(real, dtype=torch.int64),
        }


def count_real_tokens(batch: dict[str, Any], *, pop: bool = True) -> int:
    """Real (non-padding) tokens of a collated batch; removes ``autotune_real_tokens`` by default.

    Falls back, for batches not made by these collators, to the 2D attention mask, then to the
    labels (``!= -100``), then to the number of input ids.
    """
    if REAL_TOKENS_KEY in batch:
        v = batch.pop(REAL_TOKENS_KEY) if pop else batch[REAL_TOKENS_KEY]
        return int(v.sum()) if hasattr(v, "sum") else int(v)
    am = batch.get("attention_mask")
    if am is not None and getattr(am, "ndim", 0) == 2:
        return int(am.sum())
    labels = batch.get("labels")
    if labels is not None:
        return int((labels != IGNORE_INDEX).sum())
    ids = batch.get("input_ids")
    return int(ids.numel()) if ids is not None else 0


# ---------------------------------------------------------------------------------------------
# Real datasets: read, tokenize once, cache by content
# ---------------------------------------------------------------------------------------------


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


def _load_tokenizer(path: str) -> Any:
    """Load a tokenizer from a local directory (or the local HF cache), never the network."""
    try:
        from transformers import AutoTokenizer
    except ImportError as e:  # pragma: no cover - transformers is a hard dependency
        raise DatasetError(f"transformers is needed to tokenize a text dataset ({e})") from None
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:
        raise DatasetError(
            f"cannot load a tokenizer from {path!r} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "pass --tokenizer DIR (a directory with tokenizer.json/tokenizer_config.json)"
        ) from None


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
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
                if "input_ids" in rec:
                    column = "input_ids"
                elif "text" in rec:
                    column = "text"
                else:
                    raise DatasetError(
                        f"{path}: no 'text' or 'input_ids' column (line {lineno} has keys "
                        f"{sorted(rec)}); rename the column to 'text' (raw text) or 'input_ids' (token ids)"
                    )
            if column not in rec:
                raise DatasetError(f"{path}: line {lineno} has no {column!r} key (the first record has one)")
            v = rec[column]
            if column == "text":
                if not isinstance(v, str):
                    raise DatasetError(
                        f"{path}: line {lineno}: 'text' must be a string, got {type(v).__name__}"
                    )
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
    try:
        names = list(pq.read_schema(path).names)
    except Exception as e:
        raise DatasetError(f"{path}: cannot read as parquet ({type(e).__name__}: {e})") from None
    if "input_ids" in names:
        column = "input_ids"
    elif "text" in names:
        column = "text"
    else:
        raise DatasetError(
            f"{path}: no 'text' or 'input_ids' column (columns: {names}); rename the column to "
            "'text' (raw text) or 'input_ids' (token ids)"
        )
    try:
        values = pq.read_table(path, columns=[column]).column(column).to_pylist()
    except Exception as e:
        raise DatasetError(f"{path}: cannot read column {column!r} ({type(e).__name__}: {e})") from None
    if not values:
        raise DatasetError(f"{path}: the dataset is empty (no rows); it needs at least one record")
    for i, v in enumerate(values):
        if column == "text" and not isinstance(v, str):
            raise DatasetError(f"{path}: row {i}: 'text' must be a string, got {type(v).__name__}")
        if column == "input_ids":
            values[i] = _check_ids(v, f"row {i}", path)
    return column, values


def _read_dataset(path: Path) -> tuple[str, list[Any]]:
    if path.suffix.lower() == ".jsonl":
        return _read_jsonl(path)
    return _read_parquet(path)


def _cache_file(cache_dir: Path, path: Path, tokenizer: str | None, seq_len: int) -> Path:
    key = hashlib.sha256(
        "\n".join(
            [
                f"format:{CACHE_FORMAT}",
                f"data:{_file_sha256(path)}",
                f"tokenizer:{_tokenizer_identity(tokenizer) if tokenizer else '-'}",
                f"seq_len:{seq_len}",
            ]
        ).encode()
    ).hexdigest()
    return cache_dir / f"{key[:32]}.npz"


def _read_cache(file: Path) -> tuple[TokenSequences, dict[str, Any]] | None:
    try:
        with np.load(file, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != CACHE_FORMAT:
                return None
            return TokenSequences(z["tokens"], z["offsets"]), meta
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
) -> LoadedDataset:
    """Read a ``.jsonl``/``.parquet`` dataset into token lists (tokenizing ``text`` once, cached).

    ``cache_dir`` defaults to ``default_cache_dir()``. Raises DatasetError with the fix.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise DatasetError(
            f"dataset {str(p)!r} does not exist; pass --dataset PATH to a .jsonl or .parquet file"
        )
    if not p.is_file():
        raise DatasetError(
            f"dataset {str(p)!r} is not a file; pass --dataset PATH to a .jsonl or .parquet file"
        )
    if p.suffix.lower() not in DATASET_EXTENSIONS:
        raise DatasetError(
            f"dataset {str(p)!r} has unknown extension {p.suffix or '(none)'!r}; "
            "use a .jsonl file (one JSON object per line) or a .parquet file, with a 'text' or 'input_ids' column"
        )
    if p.stat().st_size == 0:
        raise DatasetError(f"dataset {str(p)!r} is empty (0 bytes); it needs at least one record")

    cdir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cfile = _cache_file(cdir, p, tokenizer, seq_len) if use_cache else None
    if cfile is not None:
        hit = _read_cache(cfile)
        if hit is not None:
            seqs, meta = hit
            return LoadedDataset(
                sequences=seqs,
                column=meta["column"],
                path=str(p),
                cache_file=str(cfile),
                cache_hit=True,
                num_records=meta["num_records"],
                num_truncated=meta["num_truncated"],
                num_empty=meta["num_empty"],
            )

    column, values = _read_dataset(p)
    if column == "text":
        if tokenizer is None:
            raise DatasetError(
                f"dataset {str(p)!r} has a 'text' column but no tokenizer was found: pass --tokenizer DIR "
                "(or use a model directory that contains tokenizer files), or give an 'input_ids' column"
            )
        tok = _load_tokenizer(tokenizer)
        ids: list[list[int]] = []
        for start in range(0, len(values), 1000):
            chunk = values[start : start + 1000]
            # one token past seq_len tells a truncated record from an exact fit
            enc = tok(chunk, add_special_tokens=True, truncation=True, max_length=seq_len + 1)
            ids.extend(list(x) for x in enc["input_ids"])
    else:
        ids = values
    truncated = sum(1 for x in ids if len(x) > seq_len)
    ids = [x[:seq_len] for x in ids]
    kept = [x for x in ids if len(x) > 0]
    num_empty = len(ids) - len(kept)
    if not kept:
        raise DatasetError(f"dataset {str(p)!r} is empty: all {len(ids)} records have no tokens")
    seqs = TokenSequences.from_lists(kept)
    meta = {
        "format": CACHE_FORMAT,
        "column": column,
        "source": str(p),
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
        path=str(p),
        cache_file=str(cfile) if written else None,
        cache_hit=False,
        num_records=len(ids),
        num_truncated=truncated,
        num_empty=num_empty,
    )


def length_histogram_from_dataset(
    path: str | os.PathLike[str],
    *,
    seq_len: int,
    tokenizer: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    num_bins: int = 32,
    out: str | os.PathLike[str] | None = None,
) -> dict[str, list[int]]:
    """The token-length histogram ``{"bins", "counts"}`` of a dataset (lengths capped at seq_len).

    With ``out``, also writes it as JSON (atomically) so a synthetic run can use
    ``lengths="histogram:OUT.json"``.
    """
    loaded = load_token_sequences(path, seq_len=seq_len, tokenizer=tokenizer, cache_dir=cache_dir)
    hist = histogram_from_lengths(loaded.sequences.lengths().tolist(), num_bins=num_bins)
    if out is not None:
        o = Path(out)
        o.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=o.parent, prefix=f".{o.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(hist, f)
        os.replace(tmp, o)
    return hist


# ---------------------------------------------------------------------------------------------
# Building the probe's data
# ---------------------------------------------------------------------------------------------


def pack_greedy(
    lengths: Iterator[int], *, seq_len: int, num_rows: int, open_rows: int = OPEN_ROWS
) -> list[list[int]]:
    """Pack a stream of sequence lengths into ``num_rows`` rows of at most ``seq_len`` tokens.

    First fit over the ``open_rows`` most recent rows (a sequence goes into the first open row with
    room, else opens a new one; the oldest open row is emitted when too many are open, a full row
    at once). Sequences are never split. Returns, per row, the indices (in stream order) of the
    sequences it holds.
    """
    rows: list[list[int]] = []
    open_: list[tuple[list[int], int]] = []  # (sequence indices, used tokens)
    for idx, n in enumerate(lengths):
        if len(rows) >= num_rows:
            break
        if n > seq_len:
            raise ValueError(f"sequence {idx} has {n} tokens > seq_len {seq_len}")
        for k, (members, used) in enumerate(open_):
            if used + n <= seq_len:
                members.append(idx)
                open_[k] = (members, used + n)
                if used + n == seq_len:
                    rows.append(open_.pop(k)[0])
                break
        else:
            if n == seq_len:
                rows.append([idx])
            else:
                open_.append(([idx], n))
                if len(open_) > open_rows:
                    rows.append(open_.pop(0)[0])
    return rows[:num_rows]


def _shuffled_forever(n: int, seed: int) -> Iterator[int]:
    rng = random.Random(seed)
    while True:
        perm = list(range(n))
        rng.shuffle(perm)
        yield from perm


@dataclass
class TrainData:
    """What the probe's Trainer gets: ``train_dataset=dataset``, ``data_collator=collator``.

    ``mode`` is ``padding``, ``packing`` (4D mask) or ``packing_flat`` (FA2/flex, padding-free).
    ``token_slots_per_step`` is the padded upper bound micro_batch x grad_accum x world_size x
    seq_len; ``real_tokens_total`` the real tokens over all items (the per-batch figure rides in
    each batch as ``autotune_real_tokens``).
    """

    dataset: ProbeDataset
    collator: PaddingCollator | PackingCollator
    mode: str
    num_items: int
    items_per_step: int
    token_slots_per_step: int
    real_tokens_total: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def mean_real_tokens_per_step(self) -> float:
        steps = self.num_items // self.items_per_step if self.items_per_step else 0
        return self.real_tokens_total / steps if steps else 0.0


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def build_train_data(
    workload: Workload,
    candidate: Candidate,
    *,
    num_optimizer_steps: int,
    vocab_size: int,
    pad_token_id: int | None,
    world_size: int | None = None,
    mask_dtype: torch.dtype | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    worst_case_first: bool = True,
) -> TrainData:
    """The probe's dataset and collator for this workload and candidate (see the module doc).

    ``world_size``: data-parallel ranks sharing the dataset (default ``candidate.world_size``); every
    rank builds the same dataset and the distributed sampler hands each its share.
    ``mask_dtype``: dtype of the 4D packing mask (the model's hidden-state dtype; default fp32).
    ``worst_case_first``: in padding mode the first micro-batch of every rank holds the longest
    sequences the workload can produce, so peak memory covers the worst case (this holds when the
    Trainer reads items in order: ``train_sampling_strategy="sequential"``).
    """
    _positive_int("num_optimizer_steps", num_optimizer_steps)
    _positive_int("vocab_size", vocab_size, 2)
    world_size = candidate.world_size if world_size is None else world_size
    _positive_int("world_size", world_size)
    seq_len = workload.seq_len
    seed = workload.seed
    mb = candidate.micro_batch
    per_step = mb * candidate.grad_accum * world_size
    n_items = num_optimizer_steps * per_step
    first_batch = mb * world_size
    info: dict[str, Any] = {"seq_len": seq_len, "seed": seed, "num_optimizer_steps": num_optimizer_steps}

    loaded: LoadedDataset | None = None
    if workload.dataset:
        loaded = load_token_sequences(
            workload.dataset, seq_len=seq_len, tokenizer=find_tokenizer(workload), cache_dir=cache_dir
        )
        top = loaded.sequences.max_token()
        if top >= vocab_size:
            raise DatasetError(
                f"dataset {workload.dataset!r} holds token id {top} but the model's vocabulary has "
                f"{vocab_size} entries; tokenize it with the model's tokenizer (--tokenizer DIR)"
            )
        info.update(
            source=loaded.path,
            column=loaded.column,
            cache_hit=loaded.cache_hit,
            cache_file=loaded.cache_file,
            dataset_records=loaded.num_records,
            dataset_truncated=loaded.num_truncated,
            dataset_sequences=len(loaded.sequences),
        )
        if workload.lengths != "fixed":
            info["lengths_ignored"] = workload.lengths
    else:
        dist = parse_lengths(workload.lengths)
        info.update(source="synthetic", lengths=workload.lengths, vocab_size=vocab_size)

    source: TokenSequences | SyntheticSequences
    rows: list[list[int]]
    if not candidate.packing:
        if loaded is not None:
            source = loaded.sequences
            order_it = _shuffled_forever(len(source), seed)
            order = [next(order_it) for _ in range(n_items)]
            if worst_case_first:
                lens = source.lengths()
                longest = sorted(range(len(source)), key=lambda j: (-int(lens[j]), j))[:first_batch]
                longest = (longest * first_batch)[:first_batch]
                order[:first_batch] = longest
            rows = [[j] for j in order]
        else:
            lengths = _take(iter_lengths(dist, seq_len, seed), n_items)
            if worst_case_first:
                worst = dist.max_length(seq_len)
                lengths[:first_batch] = [worst] * min(first_batch, n_items)
            source = SyntheticSequences(lengths, vocab_size, seed)
            rows = [[j] for j in range(n_items)]
        dataset = ProbeDataset(rows, source, packed=False)
        collator: PaddingCollator | PackingCollator = PaddingCollator(pad_token_id)
        mode = "padding"
        # padded slots if the Trainer reads items in order (sequential sampling)
        item_lens = [dataset.real_tokens(i) for i in range(n_items)]
        info["padded_slots_sequential"] = sum(
            max(item_lens[i : i + mb]) * len(item_lens[i : i + mb]) for i in range(0, n_items, mb)
        )
    else:
        if loaded is not None:
            seqs = loaded.sequences
            lens_all = seqs.lengths()
            stream_ids: list[int] = []

            def ds_lengths() -> Iterator[int]:
                for j in _shuffled_forever(len(seqs), seed):
                    stream_ids.append(j)
                    yield int(lens_all[j])

            packed = pack_greedy(ds_lengths(), seq_len=seq_len, num_rows=n_items)
            source = seqs
            rows = [[stream_ids[k] for k in r] for r in packed]
        else:
            consumed: list[int] = []

            def syn_lengths() -> Iterator[int]:
                for n in iter_lengths(dist, seq_len, seed):
                    consumed.append(n)
                    yield n

            rows = pack_greedy(syn_lengths(), seq_len=seq_len, num_rows=n_items)
            source = SyntheticSequences(consumed, vocab_size, seed)
        dataset = ProbeDataset(rows, source, packed=True)
        collator = PackingCollator(
            seq_len=seq_len,
            pad_token_id=pad_token_id,
            attn=candidate.attn,
            mask_dtype=mask_dtype if mask_dtype is not None else torch.float32,
        )
        mode = "packing_flat" if collator.flatten else "packing"
        info["sequences_per_row"] = sum(len(r) for r in rows) / max(1, len(rows))

    real_total = sum(dataset.real_tokens(i) for i in range(len(dataset)))
    slots = per_step * seq_len
    info.update(
        mode=mode,
        num_sequences=sum(len(r) for r in dataset.rows),
        mean_seq_len=real_total / max(1, sum(len(r) for r in dataset.rows)),
        fill=real_total / (n_items * seq_len),
        worst_case_first=bool(worst_case_first and not candidate.packing),
    )
    return TrainData(
        dataset=dataset,
        collator=collator,
        mode=mode,
        num_items=len(dataset),
        items_per_step=per_step,
        token_slots_per_step=slots,
        real_tokens_total=real_total,
        info=info,
    )


def _take(it: Iterator[int], n: int) -> list[int]:
    return [next(it) for _ in range(n)]
