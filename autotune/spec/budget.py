"""Memory budgets: ``"24GB"``, ``"24GiB"``, ``"24g"``, ``"80%"``.  [pure]

Units follow the convention of ``accelerate`` and the SI: ``KB/MB/GB/TB`` are powers of 10,
``KiB/MiB/GiB/TiB`` powers of 2. A single letter (``k``, ``m``, ``g``, ``t``, as docker and
``ulimit`` write it) means the binary unit. A bare number is bytes. A percentage is a share of
the device's memory and is resolved once the device is known, by :func:`resolve_budget` (``run``
and ``probe`` both): see ``PERCENT_RULE``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.errors import SpecError

__all__ = ["Budget", "parse_budget", "format_bytes", "parse_size", "PERCENT_RULE", "budget_reference_bytes",
           "resolve_budget"]

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
_PCT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")

SIZES = "e.g. 24GB, 24GiB, 24g or 24000MB"
ACCEPTED = f"{SIZES} or 80% (of the device's memory)"  # a budget may be a share; a plain size may not


@dataclass(frozen=True)
class Budget:
    """A memory budget: an absolute number of bytes, or a share of the device's memory."""

    text: str
    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, device_total_bytes: int | None) -> int:
        """Bytes this budget allows on a device with ``device_total_bytes`` of memory."""
        if self.bytes is not None:
            return self.bytes
        assert self.fraction is not None  # construction guarantees one of the two
        if not device_total_bytes:
            raise SpecError(
                f"gpu budget {self.text!r} is a share of the device's memory, but the device's "
                f"memory is unknown; give an absolute size ({ACCEPTED})"
            )
        return int(device_total_bytes * self.fraction)

    def __str__(self) -> str:
        return self.text


def parse_size(text: str, *, what: str = "size", accepted: str = SIZES) -> int:
    """Parse an absolute size (``"24GB"``) to bytes; raise SpecError naming ``what`` and the ``accepted`` forms."""
    if not isinstance(text, str):
        raise SpecError(f"{what} must be a string like 24GB, got {text!r}")
    m = _SIZE_RE.match(text)
    if not m:
        raise SpecError(f"{what} {text!r} is not a size; use {accepted}")
    number, unit = m.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise SpecError(f"{what} {text!r} has an unknown unit {unit!r}; use {accepted}")
    value = float(number) * factor
    if not math.isfinite(value) or value < 1:
        raise SpecError(f"{what} must be positive, got {text!r}")
    return int(value)


def parse_budget(text: str | int | Budget) -> Budget:
    """Parse a GPU memory budget. Raises SpecError with the accepted forms."""
    if isinstance(text, Budget):
        return text
    if isinstance(text, bool):
        raise SpecError(f"gpu budget must be a size like 24GB, got {text!r}")
    if isinstance(text, int):
        if text <= 0:
            raise SpecError(f"gpu budget must be positive, got {text!r}")
        return Budget(text=str(text), bytes=text)
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"gpu budget must be a size, {ACCEPTED}; got {text!r}")
    stripped = text.strip()
    if stripped.startswith("-"):
        raise SpecError(f"gpu budget must be positive, got {text!r}")
    pct = _PCT_RE.match(stripped)
    if pct:
        share = float(pct.group(1)) / 100.0
        if not 0.0 < share <= 1.0:
            raise SpecError(f"gpu budget percentage must be in (0%, 100%], got {text!r}")
        return Budget(text=stripped, fraction=share)
    size = parse_size(stripped, what="gpu budget", accepted=ACCEPTED)
    m = _SIZE_RE.match(stripped)
    if m is not None and not m.group(2) and size < 2**30:  # (4 was a budget of 4 bytes: a GPU's is never under 1 GiB)
        raise SpecError(f"gpu budget {text!r} has no unit, so it would be {size} bytes; write it with its unit, "
                        f"e.g. {m.group(1)}GB")
    return Budget(text=stripped, bytes=size)


# The one rule for what a percentage budget is a share of. The budget is per GPU and every GPU a
# probe may land on must hold it, so the smallest of them sets the bytes: on a machine with an
# 80 GB and a 24 GB GPU, "50%" is 12 GB whether it is given to `run` or to `probe`.
PERCENT_RULE = (
    "a percentage budget is a share of the smallest GPU the command may use (run: the --gpus list, "
    "default every visible GPU; probe: every visible GPU); on cpu, of the system memory"
)


def budget_reference_bytes(
    device: str, gpu_infos: Sequence[Mapping[str, Any]], ram_bytes: int | Callable[[], int | None] | None = None,
) -> int | None:
    """The memory a percentage budget is a share of (``PERCENT_RULE``); None when unknown.

    ``device`` is ``cuda`` or ``cpu``; ``gpu_infos`` the NVML records of the GPUs the command may use
    (``memory_total_bytes``); ``ram_bytes`` the system memory, or a function giving it (read only on cpu).
    """
    if device == "cuda":
        totals = [int(g["memory_total_bytes"]) for g in gpu_infos if g.get("memory_total_bytes")]
        return min(totals) if totals else None
    return ram_bytes() if callable(ram_bytes) else ram_bytes


def resolve_budget(
    budget: str | int | Budget, *, device: str, gpu_infos: Sequence[Mapping[str, Any]] = (),
    ram_bytes: int | Callable[[], int | None] | None = None,
) -> int:
    """Bytes ``budget`` allows on ``device`` (``PERCENT_RULE``); SpecError when a share of unknown memory.

    The device's memory is only looked at for a percentage."""
    parsed = parse_budget(budget)
    if parsed.fraction is None:
        return parsed.resolve(None)
    return parsed.resolve(budget_reference_bytes(device, gpu_infos, ram_bytes))


def format_bytes(n: float | int | None) -> str:
    """Human form with binary units, as nvidia-smi and torch report memory: ``1.50 GiB``."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor:
            return f"{sign}{n / factor:.2f} {unit}"
    return f"{sign}{int(n)} B"
