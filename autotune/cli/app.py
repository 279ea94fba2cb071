"""The ``autotune`` command line: one module per subcommand, each ``parse -> library -> render``."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import typer

from autotune.errors import AutotuneError

app = typer.Typer(
    name="autotune",
    help="Find the fastest fine-tuning configuration that fits your GPU budget, by measuring it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# (subcommand, module): each module defines ``command``, a typer command function.
COMMANDS: list[tuple[str, str]] = [
    ("probe", "autotune.cli.probe"),
    ("run", "autotune.cli.run"),
    ("plan", "autotune.cli.plan"),
    ("check", "autotune.cli.check"),
    ("report", "autotune.cli.report"),
    ("schema", "autotune.cli.schema"),
    ("dashboard", "autotune.cli.dashboard"),
]

_DEBUG = False


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"autotune {version('autotune')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("autotune (not installed: version unknown)")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="Print autotune's version and exit."),
) -> None:
    global _DEBUG
    _DEBUG = debug or bool(os.environ.get("AUTOTUNE_DEBUG"))


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one line on stderr (secrets redacted) and return the Exit to raise."""
    from autotune.spec.redact import redact

    typer.echo(f"autotune: error: {redact(message)}", err=True)
    return typer.Exit(code)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn AutotuneError into one stderr line and its exit code (traceback only with --debug)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AutotuneError as exc:
            if _DEBUG:
                raise
            raise fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("autotune: interrupted", err=True)
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:  # not raised on purpose: still one line (the traceback with --debug)
            if _DEBUG:
                raise
            message, code = unexpected_error_line(exc)
            raise fail(message, code) from None

    return wrapper


def unexpected_error_line(exc: BaseException) -> tuple[str, int]:
    """One line and an exit code for an exception autotune did not raise on purpose.

    An ``OSError`` is the machine refusing something (disk full, permission denied, a file that
    vanished): exit 2, naming the file. A ``RecursionError`` or ``MemoryError`` comes from input too
    large or too deep for the parser: exit 2. Anything else is a bug: exit 1, with the hint to rerun
    with ``--debug`` for the traceback.
    """
    text = " ".join(str(exc).split())[:300]
    if isinstance(exc, OSError):
        what = exc.strerror or text or type(exc).__name__
        where = f": {exc.filename}" if exc.filename else ""
        return f"{what}{where} (OSError errno {exc.errno}); free the space or fix the permissions and retry", 2
    if isinstance(exc, (RecursionError, MemoryError)):
        return (f"input too deeply nested or too large to process ({type(exc).__name__}); "
                "use a smaller or flatter file"), 2
    return (f"unexpected {type(exc).__name__}: {text or '(no message)'}; this is a bug in autotune: "
            "rerun as `autotune --debug COMMAND ...` (or with AUTOTUNE_DEBUG=1) for the traceback and report it"), 1


for _name, _module in COMMANDS:
    app.command(_name)(guarded(importlib.import_module(_module).command))


def _click_exceptions() -> Any:
    """The click exceptions module typer uses (typer >= 0.29 vendors its own copy of click)."""
    try:
        from typer._click import exceptions
    except ImportError:  # older typer: plain click
        from click import exceptions
    return exceptions


def _interrupt_on_termination() -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C: probes are killed, the Ray pool shut down, the lock released.

    (Python's default for SIGTERM ends the process on the spot, leaving that cleanup to the
    parent-death signal and the reaper.)
    """
    import signal

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, interrupt)
        except (ValueError, OSError):  # not the main thread, or no such signal here
            pass


def main() -> None:
    """Entry point. Usage errors (unknown flag, ``--seq-len abc``) are one line too, exit 2."""
    exc_mod = _click_exceptions()
    _interrupt_on_termination()
    try:
        rv = app(prog_name="autotune", standalone_mode=False)
    except exc_mod.NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except exc_mod.UsageError as exc:
        hint = f"; see '{exc.ctx.command_path} --help'" if exc.ctx is not None else ""
        message = exc.format_message().rstrip()
        typer.echo(f"autotune: error: {message.rstrip('.') if hint else message}{hint}", err=True)
        sys.exit(2)
    except exc_mod.ClickException as exc:
        typer.echo(f"autotune: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("autotune: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # raised outside a command (while parsing, say): still one line
        if _DEBUG:
            raise
        message, code = unexpected_error_line(exc)
        from autotune.spec.redact import redact

        typer.echo(f"autotune: error: {redact(message)}", err=True)
        sys.exit(code)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
