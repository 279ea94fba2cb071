"""Reading a file the user names, safely: bounded in size, depth and alias expansion, one-line errors.

Every user file input (``--space``, ``--catalog``, ``autotune check``, ``--lengths histogram:``)
goes through ``read_text_file`` and ``load_yaml``/``load_json``, so a FIFO (which would block),
``/dev/zero`` (which would never end), a binary file, a document nested 100,000 deep or a "billion
laughs" of YAML aliases is a ``SpecError`` naming the file, not a hang, a traceback or gigabytes of
memory. ``short_repr`` bounds what a message quotes from a value.
"""

from __future__ import annotations

import hashlib
import json
import os
import reprlib
import stat
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import SpecError

__all__ = ["MAX_FILE_BYTES", "MAX_YAML_NODES", "read_text_file", "load_yaml", "load_json", "short_repr", "file_sha256"]

MAX_FILE_BYTES = 8 * 2**20  # a search space, catalog, config or histogram is a few KB
MAX_YAML_NODES = 100_000  # nodes of the document with every alias expanded
MAX_DEPTH = 200

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlevel = 2
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 4


def short_repr(value: Any) -> str:
    """``repr`` bounded in length and in the work it does (aliased structures stay cheap)."""
    text = _repr.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def read_text_file(path: str | os.PathLike[str], *, what: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``; SpecError (naming ``what`` and the file) otherwise."""
    p = Path(path).expanduser()
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise SpecError(f"cannot read {what} {str(p)!r}: it does not exist") from None
    except OSError as exc:
        raise SpecError(f"cannot read {what} {str(p)!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a pipe or a device?)"
        raise SpecError(f"{what} {str(p)!r} is {kind}; give a regular file")
    if st.st_size > max_bytes:
        raise SpecError(f"{what} {str(p)!r} is {st.st_size:,} bytes, more than the {max_bytes:,} allowed")
    try:
        with open(p, "rb") as fh:
            data = fh.read(st.st_size + 1)  # (read(n) allocates n bytes up front: the size, not the cap)
    except OSError as exc:
        raise SpecError(f"cannot read {what} {str(p)!r}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise SpecError(f"{what} {str(p)!r} is more than the {max_bytes:,} bytes allowed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SpecError(f"{what} {str(p)!r} is not UTF-8 text (byte {data[exc.start]:#04x} on line {line}); "
                        "give a text file") from None


def _expanded_size(node: yaml.Node, memo: dict[int, int], depth: int = 0) -> int:
    """Nodes of ``node`` with aliases expanded (memoised: linear in the document, not in the expansion)."""
    if depth > MAX_DEPTH:
        raise SpecError(f"nested more than {MAX_DEPTH} levels deep")
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = MAX_YAML_NODES + 1  # a cycle counts as too large
    if isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_expanded_size(n, memo, depth + 1) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        total = 1 + sum(_expanded_size(k, memo, depth + 1) + _expanded_size(v, memo, depth + 1) for k, v in node.value)
    else:
        total = 1
    memo[key] = min(total, MAX_YAML_NODES + 1)
    return memo[key]


def _check_depth(text: str, what: str) -> None:
    """SpecError as soon as the event stream nests deeper than ``MAX_DEPTH`` (no recursion, stops early)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError(f"{what}: nested more than {MAX_DEPTH} levels deep; give a flatter document")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def load_yaml(text: str, *, what: str) -> Any:
    """``yaml.safe_load`` refusing documents that expand past ``MAX_YAML_NODES`` or nest past ``MAX_DEPTH``."""
    try:
        _check_depth(text, what)  # before composing: PyYAML's scanner slows down with depth, its composer recurses
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            return None
        try:
            size = _expanded_size(node, {})
        except SpecError as exc:
            raise SpecError(f"{what}: {exc}; give a flatter document") from None
        if size > MAX_YAML_NODES:
            raise SpecError(f"{what}: more than {MAX_YAML_NODES:,} values once its aliases (&anchor/*alias) are "
                            "expanded; write the values out instead")
        loader = yaml.SafeLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise SpecError(f"{what}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    except RecursionError:
        raise SpecError(f"{what}: nested too deeply to read; give a flatter document") from None


def load_json(text: str, *, what: str) -> Any:
    """``json.loads`` with one-line SpecErrors for bad JSON, deep nesting and giant numbers."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{what}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise SpecError(f"{what}: nested too deeply to read; give a flatter document") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise SpecError(f"{what}: {' '.join(str(exc).split())[:200]}") from None


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's content, read in 1 MiB chunks (datasets are keyed by content, not by path)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
