"""Parsers of the run's command-line values: a time budget and a list of GPU indices.  [pure]

(The GPU memory budget is :func:`autotune.spec.budget.parse_budget`, sequence lengths
:func:`autotune.spec.lengths.parse_lengths`.)
"""

from __future__ import annotations

import math
import re
from typing import Any

from autotune.errors import SpecError

__all__ = ["duration_text", "parse_duration", "parse_gpus"]

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|h|m|s)?", re.IGNORECASE)
_UNIT_ORDER = ("h", "m", "s", "ms")  # 1h30m5s: each unit once, largest first


def parse_duration(value: str | float | int | None) -> float | None:
    """Seconds from ``20m``, ``1h30m``, ``90s``, ``1.5h`` or a bare number of seconds; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise SpecError(f"time budget must be a duration like 20m; got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise SpecError(f"time budget must be a positive, finite number of seconds; got {value!r}")
        return float(value)
    text = str(value).strip().lower().replace(" ", "")
    pos, total, last = 0, 0.0, -1
    factors = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, None: 1.0}
    while pos < len(text):
        m = _DURATION_RE.match(text, pos)
        unit = m.group(2) if m else None
        # a bare number is seconds only on its own ("1h30" is not read as 1 h 30 s); units once, largest first
        if not m or m.end() == pos or (unit is None and (pos or m.end() < len(text))) \
                or (unit is not None and _UNIT_ORDER.index(unit) <= last):
            raise SpecError(f"time budget {value!r} is not a duration; use e.g. 20m, 1h30m, 90s or 300")
        last = _UNIT_ORDER.index(unit) if unit is not None else last
        total += float(m.group(1)) * factors[unit]
        pos = m.end()
    if not text or total <= 0:
        raise SpecError(f"time budget must be positive; got {value!r}")
    if not math.isfinite(total):
        raise SpecError(f"time budget {str(value)[:40]!r} is too large to read; use e.g. 20m, 1h30m, 90s or 300")
    return total


def parse_gpus(value: str | list[int] | tuple[int, ...] | None) -> list[int] | None:
    """GPU indices from ``"0,1,2"`` or a list; None means all that are visible."""
    if value is None:
        return None
    items: list[Any] = list(value) if isinstance(value, (list, tuple)) else [s for s in str(value).split(",")]
    out: list[int] = []
    for item in items:
        try:
            idx = int(str(item).strip())
        except ValueError:
            raise SpecError(f"--gpus must be comma-separated GPU indices like 0,1,2; got {value!r}") from None
        if idx < 0:
            raise SpecError(f"--gpus indices must be >= 0; got {value!r}")
        out.append(idx)
    if not out or len(set(out)) != len(out):
        raise SpecError(f"--gpus must list distinct GPU indices like 0,1,2; got {value!r}")
    return out


def duration_text(seconds: float) -> str:
    """Seconds as a person reads them: ``90 s``, ``12 min``, ``10.6 h``."""
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
