"""Commands autotune suggests for the user to paste into a shell.  [pure]

Every argument is quoted with ``shlex.quote`` (a path or a model reference may hold ``$(...)``, backticks,
spaces or quotes), and a ``python -c`` program takes each value as a Python string literal, the whole
program then quoted as one argument: pasting the line runs exactly the command shown, nothing a name holds.

    command_line("hf", "download", repo, "config.json")
    python_c(f"import datasets; datasets.load_from_disk({py_str(folder)}).to_json({py_str(out)})")
"""

from __future__ import annotations

import shlex

__all__ = ["command_line", "py_str", "python_c"]


def command_line(*argv: str) -> str:
    """``argv`` as one shell line, each argument quoted where it needs it."""
    return shlex.join(str(a) for a in argv)


def py_str(value: str) -> str:
    """A Python string literal of ``value``: ``"value"`` when that reads back as ``value`` (no quote, no
    backslash, nothing unprintable), else ``repr(value)``."""
    if value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return repr(value)


def python_c(program: str) -> str:
    """``python -c PROGRAM`` with the program quoted as one shell argument."""
    return command_line("python", "-c", program)
