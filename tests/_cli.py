"""The ``autotune`` CLI, called in this process or in a real one, with the same result type.

``cli(tmp, *args)`` runs ``autotune.cli.app.main()`` in-process: the same entry point as the console
script (usage errors, the one-line error handler, exit codes), without the several-second interpreter
start and torch/transformers import a subprocess pays. What a process would isolate is isolated here
by hand and restored afterwards: ``sys.argv``, the environment, the working folder, ``sys.stdin``,
the SIGTERM/SIGHUP/SIGINT handlers ``main()`` installs, and ``--debug``'s module flag.

``cli(tmp, *args, process=True)`` runs the real console entry point in a real process instead. Use it
only for what a process alone shows: the exit code through ``python -m autotune``, signals, orphans,
a pure stdout stream, a hard memory or time bound.

``fake=True``: the probe executor is the fake one (``tests/_fake_cli.py``'s ``SlowFake``: each probe
takes ``FAKE_PROBE_S`` seconds), everything else real.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FAKE_CLI = TESTS / "_fake_cli.py"

__all__ = ["FAKE_CLI", "cli", "one_line", "process_env"]


def process_env(tmp: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every CLI call gets: its own cache under ``tmp``, offline, no debug."""
    env = {**os.environ, "AUTOTUNE_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1", "FAKE_PROBE_S": "0.01"}
    env.pop("AUTOTUNE_DEBUG", None)
    env.update(extra or {})
    return env


@contextlib.contextmanager
def _isolated(env: Mapping[str, str], cwd: Path, argv: list[str], stdin: str | None) -> Iterator[None]:
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_argv = sys.argv
    saved_stdin = sys.stdin
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    from autotune.cli import app as app_mod

    saved_debug = app_mod._DEBUG
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = argv
    sys.stdin = io.StringIO(stdin or "")
    app_mod._DEBUG = False
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        sys.stdin = saved_stdin
        app_mod._DEBUG = saved_debug
        for sig, handler in saved_signals.items():
            if handler is not None:
                signal.signal(sig, handler)


class _Text(io.StringIO):
    """A text stream that says it is not a terminal (as a pipe would)."""

    def isatty(self) -> bool:
        return False


def _in_process(args: list[str], *, cwd: Path, env: Mapping[str, str], stdin: str | None,
                fake: bool) -> subprocess.CompletedProcess[str]:
    import autotune.run._search as tune_mod
    from autotune.cli import app as app_mod

    out, err = _Text(), _Text()
    saved_factory = tune_mod._default_executor
    if fake:
        sys.path.insert(0, str(TESTS))
        from _fake_cli import _factory

        tune_mod._default_executor = _factory  # type: ignore[assignment]
    code: int | None = 0
    try:
        with _isolated(env, cwd, ["autotune", *args], stdin), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                app_mod.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if not isinstance(exc.code, int | None):
                    err.write(f"{exc.code}\n")
            except Exception:  # what the interpreter does with an exception main() lets out (--debug)
                traceback.print_exc(file=err)
                code = 1
    finally:
        tune_mod._default_executor = saved_factory
    return subprocess.CompletedProcess(["autotune", *args], int(code or 0), out.getvalue(), err.getvalue())


def cli(tmp: Path, *args: str, process: bool = False, fake: bool = False, stdin: str | None = None,
        env: Mapping[str, str] | None = None, timeout: float = 120,
        offline: bool = True) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` in the working folder ``tmp``: in-process unless ``process``.

    ``offline`` (the default): its own cache under ``tmp``, no Hub. ``offline=False``: the environment as the
    test set it (a stand-in Hub's ``HF_ENDPOINT`` and caches), plus ``env``.
    """
    full_env = process_env(tmp, env) if offline else {**os.environ, **(env or {})}
    if not process:
        return _in_process(list(args), cwd=tmp, env=full_env, stdin=stdin, fake=fake)
    head = [sys.executable, str(FAKE_CLI)] if fake else [sys.executable, "-m", "autotune"]
    return subprocess.run([*head, *args], capture_output=True, text=True, timeout=timeout, cwd=tmp, env=full_env,
                          input=stdin)


def one_line(p: subprocess.CompletedProcess[str], *needles: str, code: int = 2) -> str:
    """Exit ``code``, exactly one stderr line with every needle, no traceback."""
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("autotune: error: ") and "Traceback" not in p.stderr, p.stderr
    for needle in needles:
        assert needle.lower() in lines[0].lower(), (needle, lines[0])
    return lines[0]
