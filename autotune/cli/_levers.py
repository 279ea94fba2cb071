"""One command-line option per lever, from its declaration (``autotune.spec.levers``): its flags, type, help
and allowed values. ``probe`` takes every lever it can set (a new lever gets its option there by being
declared), ``plan`` every lever the planner prices, as a pin (None: not pinned, the plan chooses)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import typer

from autotune.errors import SpecError
from autotune.spec.levers import LEVERS, choices_help, value_problem

__all__ = ["lever_options"]

F = TypeVar("F", bound=Callable[..., Any])
_TYPES = {"int": int, "bool": bool, "str": str}


def lever_options(names: Iterable[str], *, pin: bool, defaults: Mapping[str, Any] | None = None,
                  panel: str | None = None) -> Callable[[F], F]:
    """Give a typer command one option per lever in ``names`` (after its own options); the values reach it
    together as its ``levers`` keyword (lever -> value). ``pin``: each option defaults to None (not pinned);
    otherwise to ``defaults`` over the lever's own default."""
    names = tuple(names)
    defaults = dict(defaults or {})

    def decorate(command: F) -> F:
        sig = inspect.signature(command)
        own = [p for p in sig.parameters.values() if p.name != "levers"]
        added, hints = [], {}
        for name in names:
            lv = LEVERS[name]
            kind = _TYPES[lv.kind]
            hints[name] = kind | None if pin else kind
            option = typer.Option(None if pin else defaults.get(name, lv.default), *lv.cli_flags(),
                                  help=choices_help(name, pin=pin), rich_help_panel=panel)
            added.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                           annotation=hints[name]))

        @functools.wraps(command)
        def with_levers(*args: Any, **kwargs: Any) -> Any:
            levers = {name: kwargs.pop(name) for name in names}
            problems = [_as_flag(name, m) for name, v in levers.items()
                        if v is not None and (m := value_problem(name, v))]
            if problems:
                raise SpecError(problems)
            return command(*args, levers=levers, **kwargs)

        with_levers.__signature__ = sig.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        with_levers.__annotations__ = {k: v for k, v in command.__annotations__.items() if k != "levers"} | hints
        return with_levers  # type: ignore[return-value]

    return decorate


def _as_flag(name: str, message: str) -> str:
    """``ckpt_every must be ...`` as the command line says it: ``--ckpt-every must be ...``."""
    flag = LEVERS[name].cli_flags()[0].split("/")[0]
    return flag + message[len(name):] if message.startswith(name) else message
