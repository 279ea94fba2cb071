"""Write tuned keys back into the user's own file, changing nothing else.  [pure: text in, text out]

YAML: ruamel.yaml's round-trip loader finds where each top-level key's value sits (line, column);
only that value's text is replaced, so every other byte (comments, quoting, ordering, indentation,
``1.0e-4`` spellings) is kept. A key the file lacks is appended at the end as ``key: value``.
JSON: the same, with a small scanner over the top-level object (the indentation of the existing
keys is reused for new ones).
The result is parsed again and must equal the input's data with the updates applied, else the
write-back refuses (AutotuneError) rather than hand out a file that says something else.

Constructs whose edit cannot be made in place are refused by name (SpecError, one line) by
:func:`uneditable`, which the CLI calls *before* the search: a flow mapping at the top, a ``...``
end marker or a second document, a ``<<`` merge key, a duplicate key, an anchor or alias on a key
that may be tuned. Both parses go through the bounded loader (an alias bomb is refused, and the
comparison of before and after is bounded by its node cap, not exponential in the aliases).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from typing import Any

import yaml

from autotune.errors import AutotuneError, SpecError
from autotune.spec.files import load_json, load_yaml

__all__ = ["write_back_text", "is_yaml_name", "uneditable"]

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "none", "~"}


def is_yaml_name(name: str) -> bool:
    return name.lower().endswith((".yaml", ".yml"))


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, str) and _PLAIN.match(value) and value.lower() not in _YAML_WORDS:
        return value
    return json.dumps(value)


def _yaml_structure(text: str) -> tuple[list[str], dict[str, str]]:
    """(problems of the whole document, top-level key -> "an anchor" / "an alias" on its value)."""
    problems: list[str] = []
    marked: dict[str, str] = {}
    docs = 0
    depth = 0
    expect_key = False
    key: str | None = None
    try:
        events = list(yaml.parse(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        return [f"it is not valid YAML ({' '.join(str(exc).split())[:200]})"], {}
    top_map = False
    for ev in events:
        if isinstance(ev, yaml.DocumentStartEvent):
            docs += 1
            depth, top_map = 0, False
            if docs == 2:
                problems.append("it holds more than one YAML document (---); keep one")
            continue
        if isinstance(ev, yaml.DocumentEndEvent) and ev.explicit:
            problems.append("it ends with a '...' document end marker, after which nothing can be added; delete it")
            continue
        if depth == 0 and isinstance(ev, yaml.MappingStartEvent):
            if ev.flow_style:
                problems.append("its settings are a flow mapping ({key: value, ...}); write one 'key: value' per line")
            depth, top_map, expect_key = 1, True, True
            continue
        if depth == 1 and top_map and isinstance(ev, (yaml.ScalarEvent, yaml.AliasEvent, yaml.MappingStartEvent,
                                                     yaml.SequenceStartEvent)):
            if expect_key:
                key = ev.value if isinstance(ev, yaml.ScalarEvent) else None
                if key == "<<" and isinstance(ev, yaml.ScalarEvent) and ev.implicit[0]:
                    problems.append("it uses a '<<' merge key, so a tuned key's value may come from elsewhere; "
                                    "write the merged keys out")
            elif key is not None:
                if isinstance(ev, yaml.AliasEvent):
                    marked.setdefault(key, f"the alias *{ev.anchor}")
                elif getattr(ev, "anchor", None):
                    marked.setdefault(key, f"the anchor &{ev.anchor}")
            expect_key = not expect_key
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return problems, marked


def uneditable(name: str, text: str, keys: set[str] | None = None) -> str | None:
    """Why the tuned keys ``keys`` (None: any) cannot be written into ``text`` in place, or None.

    Called before the search, so a file the write-back cannot edit is refused up front."""
    if not is_yaml_name(name):
        from autotune.spec.files import repeated_keys

        twice = repeated_keys(text, yaml_text=False)  # json.loads keeps the last; an edit would reach one of them
        return (f"cannot write the tuned keys back into {name}: the key {twice[0][0]!r} appears {twice[0][1]} times; "
                "keep one of each") if twice else None
    problems, marked = _yaml_structure(text)
    if not problems:
        try:
            from ruamel.yaml import YAML

            YAML(typ="rt").load(io.StringIO(text))
        except Exception as exc:  # ruamel's DuplicateKeyError and its kin
            first = " ".join(str(exc).split())
            dup = re.search(r'duplicate key "([^"]*)"', first)
            what = (f"the key {dup.group(1)!r} appears twice" if dup else "a key appears twice"
                    if "duplicate" in first.lower() else first[:200])
            problems.append(f"{what}; keep one of each")
    for key in sorted(marked if keys is None else set(marked) & set(keys)):
        problems.append(f"the tuned key {key!r} carries {marked[key]}, shared with other keys; write its value out")
    if problems:
        return f"cannot write the tuned keys back into {name}: {problems[0]}"
    return None


def _yaml_write(text: str, updates: Mapping[str, Any]) -> str:
    from ruamel.yaml import YAML

    doc = YAML(typ="rt").load(io.StringIO(text))
    if not hasattr(doc, "lc"):
        raise AutotuneError("cannot write back: the YAML file does not hold a mapping")
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str]] = []  # (line, start col, end col, new text)
    appended: list[str] = []
    for key, value in updates.items():
        if key in doc:
            if isinstance(doc[key], (dict, list)):
                raise AutotuneError(f"cannot write back {key!r}: the file holds a mapping or list there")
            line, col = doc.lc.value(key)
            key_line = doc.lc.key(key)[0]
            after = lines[line].rstrip("\r\n")[col:].lstrip()
            if doc[key] is None and (line != key_line or not after or after.startswith("#")):
                # `key:` with nothing after it (but a comment): the value goes after the colon
                row = lines[key_line].rstrip("\r\n")
                colon = row.index(":", doc.lc.key(key)[1])
                m = re.search(r"\s+#", row[colon + 1:])
                edits.append((key_line, colon + 1, colon + 1 + (m.start() if m else len(row) - colon - 1),
                              " " + _yaml_scalar(value)))
                continue
            row = lines[line].rstrip("\r\n")
            rest = row[col:]
            # a quoted value may hold " #": the comment starts after its closing quote
            quoted = re.match(r"'(?:[^']|'')*'|\"(?:[^\"\\]|\\.)*\"", rest)
            skip = quoted.end() if quoted else 0
            m = re.search(r"\s+#", rest[skip:])
            end = col + (skip + m.start() if m else len(rest.rstrip()))
            edits.append((line, col, end, _yaml_scalar(value)))
        else:
            appended.append(f"{key}: {_yaml_scalar(value)}")
    for line, start, end, new in sorted(edits, reverse=True):
        row = lines[line]
        lines[line] = row[:start] + new + row[end:]
    out = "".join(lines)
    if appended:
        eol = "\r\n" if "\r\n" in text else "\n"  # appended keys end their lines as the file's own do
        if out and not out.endswith("\n"):
            out += eol
        out += "".join(a + eol for a in appended)
    return out


def _json_top_level_values(text: str) -> tuple[dict[str, tuple[int, int]], int, str]:
    """Top-level key -> (start, end) of its value's text; the index of the closing brace; key indent."""
    dec = json.JSONDecoder()
    i = text.index("{") + 1
    spans: dict[str, tuple[int, int]] = {}
    indent = "  "
    first = True
    ws = re.compile(r"[ \t\r\n]*")
    while True:
        i = ws.match(text, i).end()
        if text[i] == "}":
            return spans, i, indent
        if text[i] == ",":
            i += 1
            continue
        key_start = i
        key, i = dec.raw_decode(text, i)
        if first:
            line_start = text.rfind("\n", 0, key_start) + 1
            indent = text[line_start:key_start] if text[line_start:key_start].strip() == "" else "  "
            first = False
        i = ws.match(text, i).end()
        i += 1  # the colon
        i = ws.match(text, i).end()
        _, end = dec.raw_decode(text, i)
        spans[key] = (i, end)
        i = end


def _json_write(text: str, updates: Mapping[str, Any]) -> str:
    spans, close, indent = _json_top_level_values(text)
    edits: list[tuple[int, int, str]] = []
    new_keys = [k for k in updates if k not in spans]
    for key, value in updates.items():
        if key in spans:
            edits.append((*spans[key], json.dumps(value)))
    out = text
    if new_keys:
        # after the last value, before the closing brace's own line
        last_end = max((e for _, e in spans.values()), default=None)
        added = "".join(f",\n{indent}{json.dumps(k)}: {json.dumps(updates[k])}" for k in new_keys)
        if last_end is None:
            out = out[:close] + "\n" + added[2:] + "\n" + out[close:]
        else:
            out = out[:last_end] + added + out[last_end:]
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    return out


def write_back_text(name: str, text: str, updates: Mapping[str, Any]) -> str:
    """``text`` (the file ``name``) with the top-level ``updates`` applied and nothing else changed.

    SpecError (one line, naming the construct) for a file that cannot be edited in place."""
    yaml_file = is_yaml_name(name)
    why = uneditable(name, text, set(updates))
    if why:
        raise SpecError(why)
    load = load_yaml if yaml_file else load_json
    before = load(text, what=name)
    if not isinstance(before, dict):
        raise SpecError(f"cannot write back into {name}: it does not hold a mapping of settings")
    try:
        out = _yaml_write(text, updates) if yaml_file else _json_write(text, updates)
    except AutotuneError:
        raise
    except Exception as exc:  # a layout the scanner does not follow: refuse, never a half-edited file
        raise SpecError(f"cannot write the tuned keys back into {name} ({type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:160]}); nothing written") from None
    try:
        after = load(out, what=name)
    except SpecError:
        after = None
    expected = {**before, **dict(updates)}
    # key by key: linear in the (bounded) document, never a deep comparison of aliased structures twice
    same = (isinstance(after, dict) and list(after) == list(expected)
            and all(after[k] == v and type(after[k]) is type(v) for k, v in updates.items())
            and all(after[k] == before[k] for k in before if k not in updates))
    if not same:
        raise AutotuneError(f"write-back of {name} did not reproduce the file with the tuned keys; nothing written")
    return out
