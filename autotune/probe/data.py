"""The probe's training data: which sequences, from where, in what order.  [worker side]

``build_train_data`` returns the probe's ``TrainData``: a :class:`~autotune.probe.collate.SequenceDataset`
(one sequence per item, read in its sampler's order) and the collator for the candidate (padding,
or packing the micro-batch's sequences into rows). How a batch is assembled lives in
:mod:`autotune.probe.collate`, which the emitted ``train.py`` imports too, so both feed the Trainer
the same batches. ``micro_batch`` counts sequences, packed or not: every optimizer step sees
``micro_batch x grad_accum x world_size`` sequences.

* Synthetic data (no ``--dataset``): ``num_optimizer_steps x micro_batch x grad_accum x world_size``
  sequences whose lengths follow ``Workload.lengths`` (seeded), random token ids, read in order.
* Real datasets (``--dataset``): ``.jsonl`` or ``.parquet`` with a ``text`` column (tokenized with
  ``Workload.tokenizer`` or the model's own tokenizer files) or an ``input_ids`` column, truncated
  to ``seq_len``; read as seeded permutations, epoch by epoch. Token lists are cached by content
  (``.npz``, no pickle) under ``$AUTOTUNE_CACHE/datasets`` or ``~/.cache/autotune/datasets``.

``worst_case_first``: the first micro-batch of every rank holds the longest sequences (synthetic:
the distribution's maximum length; a dataset: its longest sequences, moved to the front of the
first epoch), so the measured peak memory is the worst case, packed or not.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autotune.errors import DatasetError
from autotune.probe.collate import (
    PackingCollator,
    PaddingCollator,
    SequenceDataset,
    StreamSampler,
    SyntheticSequences,
    TokenSequences,
    longest_first,
    make_collator,
    pack_first_fit,
    synthetic_lengths,
)
from autotune.spec.dataset_ref import (
    dataset_content_digest,
    default_datasets_cache_dir,
    find_hub_dataset,
    hub_dataset_dir,
    is_hub_dataset_id,
    missing_hub_dataset_message,
)
from autotune.spec.probe_request import Candidate, Workload

# the batch assembly (sequences, collators, counts) lives in autotune.probe.collate, its one home
__all__ = [
    "TrainData",
    "build_train_data",
    "default_cache_dir",
    "find_tokenizer",
    "load_token_sequences",
]

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


def _load_tokenizer(path: str, *, local_files_only: bool = True) -> Any:
    """Load a tokenizer from a local directory or the local HF cache (the network only when allowed)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as e:  # pragma: no cover - transformers is a hard dependency
        raise DatasetError(f"transformers is needed to tokenize a text dataset ({e})") from None
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=local_files_only)
    except Exception as e:
        raise DatasetError(
            f"cannot load a tokenizer from {path!r} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "pass --tokenizer DIR (a directory with tokenizer.json/tokenizer_config.json)"
        ) from None


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


def _check_row(column: str, v: Any, where: str, path: Path | str) -> Any:
    if column == "messages":
        ok = (
            isinstance(v, list)
            and v
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in v)
        )
        if not ok:
            raise DatasetError(
                f"{path}: {where}: 'messages' must be a non-empty list of {{role, content}} objects"
            )
    elif column == "prompt_completion":
        if not all(isinstance(v[k], (str, list)) for k in ("prompt", "completion")):
            raise DatasetError(f"{path}: {where}: 'prompt' and 'completion' must be strings or message lists")
    elif column == "text" and not isinstance(v, str):
        raise DatasetError(f"{path}: {where}: 'text' must be a string, got {type(v).__name__}")
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


def _render_chat(column: str, values: list[Any], tok: Any, path: Path) -> list[str]:
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


def _read_dataset(path: Path, split: str | None = None, hub_id: str | None = None) -> tuple[str, list[Any]]:
    if hub_id is not None:
        return _read_hub(hub_id, split)
    if path.is_dir():
        return _read_saved(path, split)
    if path.suffix.lower() == ".jsonl":
        return _read_jsonl(path)
    return _read_parquet(path)


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
    local_files_only: bool = True,
    split: str | None = None,
) -> LoadedDataset:
    """Read a ``.jsonl``/``.parquet`` dataset into token lists (tokenizing ``text`` once, cached).

    ``cache_dir`` defaults to ``default_cache_dir()``. ``local_files_only=False`` lets the tokenizer
    come from the Hub (``train.py`` on a new machine); the probe never touches the network.
    Raises DatasetError with the fix.
    """
    p = Path(path).expanduser()
    hub_id = str(path) if is_hub_dataset_id(str(path)) else None
    if hub_id is not None:
        located = find_hub_dataset(hub_id)
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

    cdir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cfile = _cache_file(cdir, p, tokenizer, seq_len, split) if use_cache else None
    source = hub_id or str(p)
    if cfile is not None:
        hit = _read_cache(cfile)
        if hit is not None:
            seqs, meta = hit
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

    column, values = _read_dataset(p, split, hub_id)
    if column != "input_ids":
        if tokenizer is None:
            raise DatasetError(
                f"dataset {source!r} has a {column!r} column but no tokenizer was found: pass --tokenizer DIR "
                "(or use a model directory that contains tokenizer files), or give an 'input_ids' column"
            )
        tok = _load_tokenizer(tokenizer, local_files_only=local_files_only)
        chat = column in ("messages", "prompt_completion")
        if chat:
            values = _render_chat(column, values, tok, Path(source))
        ids: list[list[int]] = []
        for start in range(0, len(values), 1000):
            chunk = values[start : start + 1000]
            # one token past seq_len tells a truncated record from an exact fit; a rendered chat
            # template already holds its special tokens
            enc = tok(chunk, add_special_tokens=not chat, truncation=True, max_length=seq_len + 1)
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


# ---------------------------------------------------------------------------------------------
# Building the probe's data
# ---------------------------------------------------------------------------------------------


@dataclass
class TrainData:
    """What the probe's Trainer gets: ``train_dataset=dataset``, ``data_collator=collator``.

    The dataset carries its sampler (``dataset.sampler``); the Trainer made by
    :func:`~autotune.probe.collate.measured_trainer_class` reads it in that order.
    ``mode`` is ``padding``, ``packing`` (4D mask) or ``packing_flat`` (FA2/flex, padding-free).
    ``num_items`` sequences are consumed by ``num_optimizer_steps`` steps (``items_per_step`` each);
    ``token_slots_per_step`` is the padded upper bound micro_batch x grad_accum x world_size x
    seq_len; ``real_tokens_total`` the real tokens of the consumed sequences.
    """

    dataset: SequenceDataset
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
    rank builds the same dataset and the sampler's batches are shared out among them.
    ``mask_dtype``: dtype of the 4D packing mask (the model's compute dtype; default fp32).
    ``worst_case_first``: the first micro-batch of every rank holds the longest sequences, packed
    or not (the Trainer must read in the sampler's order, which ``measured_trainer_class`` does).
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
    first_batch = mb * world_size if worst_case_first else 0
    info: dict[str, Any] = {"seq_len": seq_len, "seed": seed, "num_optimizer_steps": num_optimizer_steps}

    source: TokenSequences | SyntheticSequences
    if workload.dataset:
        loaded = load_token_sequences(
            workload.dataset,
            seq_len=seq_len,
            tokenizer=find_tokenizer(workload),
            cache_dir=cache_dir,
            split=workload.split,
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
        source = loaded.sequences
        sampler = StreamSampler(len(source), seed=seed, front=longest_first(source.lengths(), first_batch))
    else:
        lengths = synthetic_lengths(
            workload.lengths, seq_len=seq_len, seed=seed, count=n_items, worst_first=first_batch
        )
        info.update(source="synthetic", lengths=workload.lengths, vocab_size=vocab_size)
        source = SyntheticSequences(lengths, vocab_size, seed)
        sampler = StreamSampler(len(source), seed=seed, shuffle=False)
    dataset = SequenceDataset(source, sampler)
    collator = make_collator(
        packing=candidate.packing,
        seq_len=seq_len,
        pad_token_id=pad_token_id,
        attn=candidate.attn,
        mask_dtype=mask_dtype if mask_dtype is not None else torch.float32,
    )
    if not candidate.packing:
        mode = "padding"
    else:
        mode = "packing_flat" if isinstance(collator, PackingCollator) and collator.flatten else "packing"

    # what the consumed sequences make, micro-batch by micro-batch (the Trainer reads in this order)
    order = dataset.order(n_items)
    lens = [source.length(j) for j in order]
    real_total = sum(lens)
    slots = rows = 0
    for i in range(0, len(lens), mb):
        chunk = lens[i : i + mb]
        if mode == "padding":
            rows += len(chunk)
            slots += max(chunk) * len(chunk)
        elif mode == "packing":
            layout = pack_first_fit(chunk, seq_len=seq_len)
            rows += len(layout)
            slots += max(sum(chunk[j] for j in r) for r in layout) * len(layout)
        else:
            rows += 1
            slots += sum(chunk)
    n_batches = max(1, -(-len(lens) // mb))
    info.update(
        mode=mode,
        num_sequences=len(order),
        mean_seq_len=real_total / max(1, len(order)),
        rows_per_micro_batch=rows / n_batches,
        padded_slots=slots,
        fill=real_total / slots if slots else 0.0,
        worst_case_first=bool(worst_case_first),
    )
    return TrainData(
        dataset=dataset,
        collator=collator,
        mode=mode,
        num_items=n_items,
        items_per_step=per_step,
        token_slots_per_step=per_step * seq_len,
        real_tokens_total=real_total,
        info=info,
    )
