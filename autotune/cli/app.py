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
]

_DEBUG = False


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    global _DEBUG
    _DEBUG = debug or bool(os.environ.get("AUTOTUNE_DEBUG"))


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one line on stderr and return the Exit to raise."""
    typer.echo(f"autotune: error: {message}", err=True)
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

    return wrapper


for _name, _module in COMMANDS:
    app.command(_name)(guarded(importlib.import_module(_module).command))


def _click_exceptions() -> Any:
    """The click exceptions module typer uses (typer >= 0.29 vendors its own copy of click)."""
    try:
        from typer._click import exceptions
    except ImportError:  # older typer: plain click
        from click import exceptions
    return exceptions


def main() -> None:
    """Entry point. Usage errors (unknown flag, ``--seq-len abc``) are one line too, exit 2."""
    exc_mod = _click_exceptions()
    try:
        rv = app(prog_name="autotune", standalone_mode=False)
    except exc_mod.NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except exc_mod.UsageError as exc:
        hint = f"; see '{exc.ctx.command_path} --help'" if exc.ctx is not None else ""
        typer.echo(f"autotune: error: {exc.format_message()}{hint}", err=True)
        sys.exit(2)
    except exc_mod.ClickException as exc:
        typer.echo(f"autotune: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except (exc_mod.Abort, KeyboardInterrupt):
        typer.echo("autotune: interrupted", err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
