"""Whether code from an input folder may run: the one rule every tokenizer/config load goes through.

A tokenizer or model folder can ship its own Python (``tokenizer_config.json`` / ``config.json``
``"auto_map": {"AutoTokenizer": [null, "evil.EvilTok"]}`` beside ``evil.py``). transformers runs that
code when ``trust_remote_code=True``; left unset it *asks on stdout and reads stdin* (a hang under
``--json``, or a "y" piped in by accident). So every ``from_pretrained`` autotune calls passes
``trust_remote_code=`` explicitly, from the user's ``--trust-remote-code`` (False by default), via
:func:`trust_kwargs`, which first refuses a folder asking for its own code without the flag (one
line, exit 2), before transformers looks at it.

    tok = AutoTokenizer.from_pretrained(path, **trust_kwargs(path, trust_remote_code=flag))

Pure apart from reading the two small JSON files of a local folder (bounded, like every user file: one
over the cap is refused by name, never skipped, since its ``auto_map`` could not be checked).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.spec.files import MAX_FILE_BYTES, read_json_file

__all__ = ["REMOTE_CODE_FILES", "remote_code_request", "require_trusted", "trust_kwargs"]

# the files transformers reads an ``auto_map`` from when it loads a tokenizer or a config
REMOTE_CODE_FILES = ("tokenizer_config.json", "config.json")
_AUTO_CLASSES = {"tokenizer": ("AutoTokenizer",), "config": ("AutoConfig",)}


def _auto_map(file: Path) -> dict[str, Any] | None:
    """The ``auto_map`` of a JSON file (None when absent, unreadable or not JSON: the loader reports those).
    Read through the bounded reader (numbers bounded); a file over the size cap is a SpecError: what it asks
    to run could not be checked."""
    try:
        if not file.is_file():
            return None
        size = file.stat().st_size
    except OSError:
        return None
    if size > MAX_FILE_BYTES:
        raise SpecError(f"{file} is {size:,} bytes, more than the {MAX_FILE_BYTES:,} bytes autotune reads to check "
                        "whether it asks to run code of its own (auto_map); use a folder whose file is smaller, "
                        "or pass --trust-remote-code if you trust that folder's code")
    try:
        data = read_json_file(file, what="model file")
    except SpecError:
        return None
    amap = data.get("auto_map") if isinstance(data, dict) else None
    return amap if isinstance(amap, dict) and amap else None


def _refs(value: Any) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [str(v) for v in items if isinstance(v, str) and v]


def remote_code_request(path: str | os.PathLike[str], *, kind: str = "tokenizer") -> str | None:
    """What code the local folder ``path`` asks transformers to run for a ``kind`` ("tokenizer" or
    "config") load, e.g. ``"AutoTokenizer -> evil.EvilTok (tokenizer_config.json)"``; None when none
    (or ``path`` is not a local folder)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return None
    wanted = _AUTO_CLASSES.get(kind, ())
    for name in REMOTE_CODE_FILES:
        amap = _auto_map(folder / name)
        if amap is None:
            continue
        for cls in wanted:
            refs = _refs(amap.get(cls))
            if refs:
                return f"{cls} -> {', '.join(refs)} ({name})"
    return None


def require_trusted(path: str | os.PathLike[str], *, trust_remote_code: bool, what: str = "tokenizer",
                    kind: str = "tokenizer") -> None:
    """SpecError (exit 2, one line) when ``path`` asks for its own code and ``trust_remote_code`` is off."""
    if trust_remote_code:
        return
    request = remote_code_request(path, kind=kind)
    if request is None:
        return
    raise SpecError(
        f"{what} {str(path)!r} ships its own code (auto_map {request}), which autotune does not run "
        "without --trust-remote-code; pass --trust-remote-code if you trust that folder's code, or use a "
        "folder without auto_map"
    )


def trust_kwargs(path: str | os.PathLike[str], *, trust_remote_code: bool, what: str = "tokenizer",
                 kind: str = "tokenizer") -> dict[str, bool]:
    """``{"trust_remote_code": flag}`` for ``from_pretrained`` (never left unset: unset, transformers
    prompts on stdin), after :func:`require_trusted`."""
    require_trusted(path, trust_remote_code=trust_remote_code, what=what, kind=kind)
    return {"trust_remote_code": bool(trust_remote_code)}
