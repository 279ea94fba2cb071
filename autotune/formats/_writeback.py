"""Write tuned keys back into the user's own file, changing nothing else.  [pure: text in, text out]

YAML: ruamel.yaml's round-trip loader finds where each top-level key's value sits (line, column);
only that value's text is replaced, so every other byte (comments, quoting, ordering, indentation,
``1.0e-4`` spellings) is kept. A key the file lacks is appended at the end as ``key: value``.
JSON: the same, with a small scanner over the top-level object (the indentation of the existing
keys is reused for new ones).
The result is parsed again and must equal the input's data with the updates applied, else the
write-back refuses (AutotuneError) rather than hand out a file that says something else.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from typing import Any

import yaml

from autotune.errors import AutotuneError

__all__ = ["write_back_text", "is_yaml_name"]

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
            row = lines[line].rstrip("\r\n")
            rest = row[col:]
            m = re.search(r"\s+#", rest)
            end = col + (m.start() if m else len(rest.rstrip()))
            edits.append((line, col, end, _yaml_scalar(value)))
        else:
            appended.append(f"{key}: {_yaml_scalar(value)}\n")
    for line, start, end, new in sorted(edits, reverse=True):
        row = lines[line]
        lines[line] = row[:start] + new + row[end:]
    out = "".join(lines)
    if appended:
        if out and not out.endswith("\n"):
            out += "\n"
        out += "".join(appended)
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
    """``text`` (the file ``name``) with the top-level ``updates`` applied and nothing else changed."""
    yaml_file = is_yaml_name(name)
    out = _yaml_write(text, updates) if yaml_file else _json_write(text, updates)
    before = yaml.safe_load(text) if yaml_file else json.loads(text)
    after = yaml.safe_load(out) if yaml_file else json.loads(out)
    expected = {**before, **dict(updates)}
    if after != expected or list(after) != list(expected):
        raise AutotuneError(f"write-back of {name} did not reproduce the file with the tuned keys; nothing written")
    return out
