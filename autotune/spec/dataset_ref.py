"""``--dataset`` references: a local path, or a Hub dataset id found in the local Hugging Face cache.

A reference that is an existing path is a path (a ``.jsonl``/``.parquet`` file or a ``save_to_disk``
directory). Otherwise a reference shaped like a Hub id (``org/name``) names a dataset that
``datasets.load_dataset("org/name")`` has already prepared on this machine: its Arrow files live in
the datasets cache as ``{org}___{snake_name}/{config}/{version}/{hash}/{snake_name}-{split}.arrow``
(the layout ``datasets``' offline loader reads). The cache directory is ``$HF_DATASETS_CACHE``, else
``$HF_HOME/datasets``, else ``$XDG_CACHE_HOME/huggingface/datasets``, else
``~/.cache/huggingface/datasets``, as ``datasets`` decides it. autotune never downloads: the reading
side (:mod:`autotune.probe.data`) loads it with the network forced off.

This module imports no ``datasets``: locating and keying a cached dataset must stay cheap (the
cache key is computed before anything heavy is imported).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from autotune.errors import DatasetError
from autotune.spec.files import file_sha256
from autotune.spec.shell import py_str, python_c

__all__ = [
    "DATA_FILE_SUFFIXES",
    "MAX_DATASET_FILE_BYTES",
    "check_dataset_files",
    "default_datasets_cache_dir",
    "is_hub_dataset_id",
    "hub_dataset_dir",
    "find_hub_dataset",
    "missing_hub_dataset_message",
    "dataset_content_digest",
    "hub_sample_file",
    "find_hub_sample",
]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# datasets.naming.camelcase_to_snakecase, the name part of the cache folder (a test holds the two equal)
_UPPER_UPPER = re.compile(r"([A-Z]+)([A-Z][a-z])")
_LOWER_UPPER = re.compile(r"([a-z\d])([A-Z])")
_SKIPPED_SUFFIXES = (".lock",)
# a probe measures a few hundred sequences: a dataset file past this is refused in one line, checked with
# stat before a byte of it is read (hashing it for the cache key alone would take minutes, holding its rows
# several times its size in memory)
MAX_DATASET_FILE_BYTES = 2 * 2**30


def default_datasets_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The ``datasets`` cache directory, decided as ``datasets.config`` decides it."""
    env = os.environ if environ is None else environ
    if env.get("HF_DATASETS_CACHE"):
        return Path(env["HF_DATASETS_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "datasets"
    xdg = env.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "datasets"


# what a local data file's name ends with: a reference ending so is a path, present or not (``data/train.parquet``
# missing is a missing file, not a Hub dataset called so); a config's dataset path read as a local file
DATA_FILE_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".arrow", ".txt")


def is_hub_dataset_id(ref: str) -> bool:
    """``org/name`` that is not an existing path (a path always wins) nor named like a data file."""
    return (bool(_HUB_ID.match(ref)) and not ref.lower().endswith(DATA_FILE_SUFFIXES)
            and not Path(ref).expanduser().exists())


def _snake(name: str) -> str:
    return _LOWER_UPPER.sub(r"\1_\2", _UPPER_UPPER.sub(r"\1_\2", name)).lower()


def hub_dataset_dir(ref: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where ``datasets`` keeps the prepared Arrow files of Hub dataset ``ref`` (present or not)."""
    org, _, name = ref.partition("/")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_datasets_cache_dir()
    return root / f"{org}___{_snake(name)}"


def find_hub_dataset(ref: str, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The cache folder of ``ref`` when it holds at least one prepared version (Arrow files under
    ``{config}/{version}/{hash}/``), else None."""
    d = hub_dataset_dir(ref, cache_dir)
    if not d.is_dir():
        return None
    return d if any(p.is_file() for p in d.glob("*/*/*/*.arrow")) else None


def hub_sample_file(ref: str, split: str | None = None, root: str | os.PathLike[str] | None = None,
                    environ: Mapping[str, str] | None = None) -> Path:
    """Where the streamed sample of Hub dataset ``ref`` (split ``split``, default train) is kept:
    ``$AUTOTUNE_CACHE/hub-samples/{org}___{name}/{split}/sample.jsonl`` (``~/.cache/autotune`` without it)."""
    env = os.environ if environ is None else environ
    if root is None:
        base = Path(env["AUTOTUNE_CACHE"]).expanduser() if env.get("AUTOTUNE_CACHE") else (
            Path("~/.cache/autotune").expanduser())
        root = base / "hub-samples"
    org, _, name = ref.partition("/")
    return Path(root) / f"{org}___{name}" / (split or "train") / "sample.jsonl"


def find_hub_sample(ref: str, split: str | None = None, root: str | os.PathLike[str] | None = None) -> Path | None:
    """The streamed sample of ``ref``'s split when one was taken (``autotune.probe.hub_sample``), else None."""
    f = hub_sample_file(ref, split, root)
    return f if f.is_file() and f.stat().st_size > 0 else None


def missing_hub_dataset_message(ref: str, cache_dir: str | os.PathLike[str] | None = None) -> str:
    """One line: where it was looked for and the fixes."""
    return (
        f"dataset {ref!r} is not a path and not in the local Hugging Face datasets cache at "
        f"{hub_dataset_dir(ref, cache_dir)} (autotune never downloads); download it once with "
        f"`{python_c(f'import datasets; datasets.load_dataset({py_str(ref)})')}` (set HF_DATASETS_CACHE or HF_HOME "
        "if your cache lives elsewhere), or pass a path to a .jsonl/.parquet file or a save_to_disk folder"
    )


def _check_one(f: Path, folder: Path | None) -> bool:
    """Whether ``f`` is a regular file (False: a folder, or an entry that is gone); DatasetError for a pipe, a
    device or a file past ``MAX_DATASET_FILE_BYTES``. Only ``stat``: nothing is opened."""
    try:
        st = os.stat(f)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise DatasetError(f"dataset file {str(f)!r} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        return False
    if not stat.S_ISREG(st.st_mode):
        raise DatasetError(f"dataset {str(f)!r} is not a regular file (a pipe or a device?); pass a .jsonl or "
                           ".parquet file or a save_to_disk folder")
    if st.st_size > MAX_DATASET_FILE_BYTES:
        fix = ("pass a part of it (e.g. head -n 20000 data.jsonl > sample.jsonl) or a save_to_disk folder"
               if folder is None else "save it in smaller shards (save_to_disk(..., max_shard_size='500MB')) or pass "
               "a part of it")
        raise DatasetError(f"{f}: {st.st_size:,} bytes, more than the {MAX_DATASET_FILE_BYTES:,} a dataset file may "
                           f"hold here; probes need a sample: {fix}")
    return True


def check_dataset_files(path: str | os.PathLike[str]) -> list[Path]:
    """The regular files of dataset ``path`` (the file itself, or a folder's files, sorted), each checked with
    ``stat`` before anything reads it: at most ``MAX_DATASET_FILE_BYTES``, no pipe or device (which would
    block or never end). DatasetError naming the file, the limit and the fix otherwise."""
    p = Path(path)
    if not p.is_dir():
        return [p] if _check_one(p, None) else []
    return [f for f in sorted(p.rglob("*")) if _check_one(f, p)]


def dataset_content_digest(path: str | os.PathLike[str]) -> str:
    """sha256 over a folder's files (relative path and content; lock files skipped), or a file's sha256;
    every file's size is checked (:func:`check_dataset_files`) before the first is read."""
    p = Path(path)
    files = check_dataset_files(p)
    if not p.is_dir():
        return file_sha256(p)
    h = hashlib.sha256()
    for f in (q for q in files if not q.name.endswith(_SKIPPED_SUFFIXES)):
        h.update(f"{f.relative_to(p).as_posix()}:{file_sha256(f)}\n".encode())
    return h.hexdigest()
