"""Reading a file the user names, safely: bounded in size, depth and alias expansion, one-line errors.

Every user file input (``--space``, ``--catalog``, ``autotune check``, ``--lengths histogram:``)
goes through ``read_text_file`` and ``load_yaml``/``load_json``, so a FIFO (which would block),
``/dev/zero`` (which would never end), a binary file, a document nested 100,000 deep or a "billion
laughs" of YAML aliases is a ``SpecError`` naming the file, not a hang, a traceback or gigabytes of
memory. Numbers go through one bounded reading for JSON and YAML alike: a literal of more than
``MAX_NUMBER_CHARS`` characters (Python would refuse to convert it, or spend quadratic time on it) or
a float that overflows is a ``SpecError`` naming the file, the key and the line, never a crash.
``short_repr`` bounds what a message quotes from a value.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import reprlib
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import SpecError

__all__ = ["MAX_FILE_BYTES", "MAX_NUMBER_CHARS", "MAX_YAML_NODES", "read_text_file", "read_json_file", "load_yaml",
           "load_json", "short_repr", "file_sha256", "repeated_keys", "YAML_TEXT_NUMBER", "yaml_float_spelling"]

MAX_FILE_BYTES = 8 * 2**20  # a search space, catalog, config or histogram is a few KB
MAX_YAML_NODES = 100_000  # nodes of the document with every alias expanded
MAX_DEPTH = 200
# characters of one number literal: the longest a real config holds is tokenizers' model_max_length
# sentinel int(1e30), 31 digits; Python refuses to convert an int of over 4,300 digits (ValueError)
MAX_NUMBER_CHARS = 100

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


@dataclass(frozen=True)
class _OutOfRange:
    """A number literal left unconverted (too long, or a float that overflows), named once parsing is done."""

    text: str
    line: int | None = None  # 1-based, where the parser knows it (YAML)


def _number_problem(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        return f"{len(text):,} characters long, more than the {MAX_NUMBER_CHARS} a number may have here"
    return "beyond the largest float (about 1.8e308)"


def _refuse_out_of_range(data: Any, first: _OutOfRange, text: str, what: str) -> None:
    """SpecError naming the key path (``a.b[2]``) and line of the first out-of-range number."""
    where = "the document"
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:  # iterative: a document nested deep must not recurse here
        path, node = stack.pop()
        if node is first:
            where = path or "the document"
            break
        if isinstance(node, dict):
            for k, v in reversed(list(node.items())):
                if k is first:
                    where, stack = f"a key of {path or 'the top level'}", []
                    break
                stack.append((f"{path}.{k}" if path else str(k), v))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(node))))
    line = first.line
    if line is None:
        m = re.search(r"(?<![\w.+-])" + re.escape(first.text) + r"(?![\w.])", text)
        line = text.count("\n", 0, m.start()) + 1 if m else None
    quoted = first.text if len(first.text) <= 24 else first.text[:12] + "..." + first.text[-6:]
    raise SpecError(f"{what}: the number at {where}" + (f" (line {line})" if line else "") + f", {quoted}, is "
                    f"out of range: {_number_problem(first.text)}; write the value the setting should have")


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader whose int and float constructors leave an out-of-range literal unconverted."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.out_of_range: list[_OutOfRange] = []

    def _out(self, text: str, node: yaml.Node) -> _OutOfRange:
        found = _OutOfRange(text, node.start_mark.line + 1)
        self.out_of_range.append(found)
        return found

    def construct_bounded_int(self, node: yaml.ScalarNode) -> Any:
        text = str(self.construct_scalar(node))
        if len(text) > MAX_NUMBER_CHARS:
            return self._out(text, node)
        return self.construct_yaml_int(node)

    def construct_bounded_float(self, node: yaml.ScalarNode) -> Any:
        text = str(self.construct_scalar(node))
        if len(text) > MAX_NUMBER_CHARS:
            return self._out(text, node)
        value = self.construct_yaml_float(node)
        if math.isinf(value) and text.replace("_", "").lower().lstrip("+-") != ".inf":
            return self._out(text, node)
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_bounded_int)
_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _BoundedLoader.construct_bounded_float)


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


def _refuse_repeated_keys(root: yaml.Node, what: str) -> None:
    """SpecError naming the first key a mapping of ``root`` sets twice, and its lines (the document was bounded
    by ``_expanded_size`` already; an aliased node is looked at once)."""
    todo, done = [root], set()
    while todo:
        node = todo.pop()
        if id(node) in done or not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            continue
        done.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
            continue
        todo.extend(value for _, value in node.value)
        for key, n, at in _key_repeats(node):
            raise SpecError(f"{what}: key {key!r} is set {n} times (lines {', '.join(map(str, at))}); keep one")


def _key_repeats(node: yaml.MappingNode) -> list[tuple[str, int, list[int]]]:
    """The keys one mapping sets more than once: (key, how many times, the lines it is set on, 1-based)."""
    lines: dict[str, list[int]] = {}
    for key, _ in node.value:
        if isinstance(key, yaml.ScalarNode):
            lines.setdefault(str(key.value), []).append(key.start_mark.line + 1)
    return [(k, len(v), v) for k, v in lines.items() if len(v) > 1]


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


def load_yaml(text: str, *, what: str, unique_keys: bool = False) -> Any:
    """``yaml.safe_load`` refusing documents that expand past ``MAX_YAML_NODES`` or nest past ``MAX_DEPTH``.
    ``unique_keys``: refuse a mapping, at any depth, that sets a key twice (PyYAML keeps the last without a
    word): for autotune's own formats; a training tool's file is read as that tool reads it."""
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
        if unique_keys:
            _refuse_repeated_keys(node, what)
        loader = _BoundedLoader(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
        if loader.out_of_range:
            _refuse_out_of_range(data, loader.out_of_range[0], text, what)
        return data
    except yaml.YAMLError as exc:
        raise SpecError(f"{what}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    except RecursionError:
        raise SpecError(f"{what}: nested too deeply to read; give a flatter document") from None


def load_json(text: str, *, what: str) -> Any:
    """``json.loads`` with one-line SpecErrors for bad JSON, deep nesting and out-of-range numbers."""
    found: list[_OutOfRange] = []

    def parse_int(literal: str) -> Any:
        if len(literal) > MAX_NUMBER_CHARS:
            found.append(_OutOfRange(literal))
            return found[-1]
        return int(literal)

    def parse_float(literal: str) -> Any:
        value = float(literal) if len(literal) <= MAX_NUMBER_CHARS else math.inf
        if math.isinf(value):  # (JSON's own Infinity goes through parse_constant, not here)
            found.append(_OutOfRange(literal))
            return found[-1]
        return value

    try:  # a byte-order mark (editors on Windows write one) is not content
        data = json.loads(text.removeprefix("\ufeff"), parse_int=parse_int, parse_float=parse_float)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{what}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise SpecError(f"{what}: nested too deeply to read; give a flatter document") from None
    except ValueError as exc:  # anything else json refuses
        raise SpecError(f"{what}: {' '.join(str(exc).split())[:200]}") from None
    if found:
        _refuse_out_of_range(data, found[0], text, what)
    return data


def read_json_file(path: str | os.PathLike[str], *, what: str, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The parsed JSON of the regular file ``path`` (size checked before it is read), through :func:`load_json`;
    a problem is a SpecError naming the file."""
    return load_json(read_text_file(path, what=what, max_bytes=max_bytes), what=str(Path(path).expanduser()))


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's content, read in 1 MiB chunks (datasets are keyed by content, not by path)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# a number YAML 1.1 (PyYAML) leaves as text: an exponent without a dot before it or without a sign (2e-5, 1.0e2);
# float() reads it, and so do the parsers of TRL and LLaMA-Factory
YAML_TEXT_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def yaml_float_spelling(text: str) -> str | None:
    """How to write ``text`` (a number YAML 1.1 left as text) so that YAML reads a float: a dot in the mantissa and a
    sign on the exponent (``1e2`` -> ``1.0e+2``); None for any other string."""
    t = text.strip()
    if not YAML_TEXT_NUMBER.match(t):
        return None
    mant, _, exp = t.lower().partition("e")
    return f"{mant if '.' in mant else mant + '.0'}e{exp if exp[0] in '+-' else '+' + exp}"


def repeated_keys(text: str, *, yaml_text: bool) -> list[tuple[str, int, list[int]]]:
    """The top-level keys a document sets more than once: (key, how many times, the lines it is set on, 1-based;
    JSON: the lines where ``"key":`` is written, empty where the key is also written inside a nested object).
    Every reader the training tools use (``yaml.safe_load``, ``json.loads``) keeps the last value without a word. Call it on a document that ``load_yaml``/``load_json``
    read (it is not bounded again); nested mappings are not looked at."""
    if yaml_text:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        return _key_repeats(node) if isinstance(node, yaml.MappingNode) else []
    seen: list[list[tuple[str, Any]]] = []
    # as load_json reads it (a byte-order mark is not content)
    value = json.loads(text.removeprefix("\ufeff"), object_pairs_hook=lambda pairs: seen.append(pairs) or dict(pairs))
    if not isinstance(value, dict) or not seen:
        return []
    counts: dict[str, int] = {}
    for key, _ in seen[-1]:  # the top-level object's pairs come last
        counts[key] = counts.get(key, 0) + 1
    out = []
    for key, n in counts.items():
        if n > 1:
            at = [text.count("\n", 0, m.start()) + 1 for m in re.finditer(re.escape(json.dumps(key)) + r"\s*:", text)]
            out.append((key, n, at if len(at) == n else []))
    return out
