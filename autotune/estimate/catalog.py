"""The GPU catalog: peak FLOP/s, memory, bf16 / FlashAttention-2 support and a dated price.  [pure]

The built-in table is ``gpus.yaml`` next to this module (package data, read once). Users extend or
override it with their own YAML in the same format: pass ``extra=`` to :func:`load_catalog`, or name
the file in ``AUTOTUNE_GPU_CATALOG`` and let the caller (the CLI) hand ``os.environ`` to
:func:`catalog_paths_from_env`. Nothing here reads the environment by itself.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.spec.budget import parse_size
from autotune.spec.files import load_yaml, yaml_float_spelling

__all__ = [
    "GPU",
    "CATALOG_ENV",
    "builtin_catalog",
    "catalog_paths_from_env",
    "alias_notes",
    "find_gpu",
    "find_gpus",
    "load_catalog",
    "parse_catalog",
]

CATALOG_ENV = "AUTOTUNE_GPU_CATALOG"

_REQUIRED = (
    "name",
    "memory",
    "fp16_tflops",
    "fp32_tflops",
    "bf16",
    "flash_attention_2",
    "price_per_hour_usd",
)
_OPTIONAL = (
    "aliases", "bf16_tflops", "tf32_tflops", "compute_capability", "vendor", "efficiency",
    "price_date", "price_source", "host_memory_per_gpu", "host_memory_source", "memory_bandwidth_gbs",
    "interconnect_gbs", "interconnect_source",
)  # fmt: skip
_KNOWN = set(_REQUIRED) | set(_OPTIONAL)


@dataclass(frozen=True)
class GPU:
    """One catalog entry. TFLOP/s figures are dense (no sparsity), per GPU."""

    name: str
    memory_bytes: int
    fp16_tflops: float
    fp32_tflops: float
    bf16: bool
    flash_attention_2: bool
    price_per_hour_usd: float | None
    bf16_tflops: float | None = None
    tf32_tflops: float | None = None
    compute_capability: str | None = None
    vendor: str = "nvidia"
    efficiency: float | None = None
    price_date: str | None = None
    price_source: str | None = None
    aliases: tuple[str, ...] = field(default=())
    host_memory_bytes_per_gpu: int | None = None  # host RAM of a typical node, per GPU (offload)
    host_memory_source: str | None = None
    memory_bandwidth_gbs: float | None = None  # device memory bandwidth, GB/s (decimal), from the data sheet
    # the bus bandwidth NCCL's collectives reach between a node's GPUs over PCIe, GB/s per GPU (None: NVLink-class,
    # whose communication the speed model's SCALING_FACTOR covers); the link it is derived from
    interconnect_gbs: float | None = None
    interconnect_source: str | None = None

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s for a training precision (``bf16``, ``fp16``, ``tf32``, ``fp32``)."""
        if precision == "bf16":
            if not self.bf16 or self.bf16_tflops is None:
                raise SpecError(f"{self.name} has no bf16; use fp16")
            return self.bf16_tflops * 1e12
        if precision == "fp16":
            return self.fp16_tflops * 1e12
        if precision == "tf32" and self.tf32_tflops is not None:
            return self.tf32_tflops * 1e12
        return self.fp32_tflops * 1e12

    @property
    def tf32(self) -> bool:
        """TF32 tensor cores: a TF32 rate in the catalog, or an NVIDIA GPU of compute capability 8.0 or later."""
        if self.tf32_tflops is not None:
            return True
        try:
            return self.vendor == "nvidia" and float(self.compute_capability or 0) >= 8.0
        except ValueError:
            return False

    @property
    def half_precision(self) -> str:
        """The 16-bit type to train in here: bf16 where supported, else fp16."""
        return "bf16" if self.bf16 else "fp16"

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        d["aliases"] = list(self.aliases)
        return d


@functools.lru_cache(maxsize=1024)
def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name).lower()


def _num(problems: list[str], where: str, key: str, value: Any, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        finite = "" if not isinstance(value, float) or math.isfinite(value) else " (not finite)"
        spelling = yaml_float_spelling(value) if isinstance(value, str) else None
        if spelling is not None:
            finite = f" (YAML reads an exponent without a dot or a sign as text: write {spelling})"
        problems.append(f"{where}: {key} must be a positive number, got {value!r}{finite}")
        return None
    return float(value)


def parse_catalog(data: Any, *, source: str = "<catalog>") -> list[GPU]:
    """Validate a parsed catalog (``{"defaults": {...}, "gpus": [...]}``) into GPUs.

    Every problem is collected and raised together as one SpecError.
    """
    problems: list[str] = []
    if not isinstance(data, Mapping) or not isinstance(data.get("gpus"), list):
        raise SpecError(f"{source}: a GPU catalog is a mapping with a 'gpus' list")
    unknown_top = sorted(set(data) - {"gpus", "defaults"})
    if unknown_top:
        problems.append(f"{source}: unknown top-level key(s) {', '.join(unknown_top)}; known: defaults, gpus")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        problems.append(f"{source}: defaults must be a mapping")
        defaults = {}
    gpus: list[GPU] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(data["gpus"]):
        where = f"{source}: gpus[{i}]"
        if not isinstance(raw, Mapping):
            problems.append(f"{where} must be a mapping, got {raw!r}")
            continue
        entry = {**defaults, **raw}
        if isinstance(entry.get("name"), str):
            where = f"{source}: {entry['name']}"
        gpu = _parse_gpu(entry, where, seen, problems)
        if gpu is not None:
            gpus.append(gpu)
    if problems:
        raise SpecError(problems)
    return gpus


def _parse_gpu(entry: Mapping[str, Any], where: str, seen: dict[str, str], problems: list[str]) -> GPU | None:
    """One entry (defaults applied; ``where`` names it in problems) as a GPU, or None with its problems
    appended to ``problems``.

    ``seen`` maps the normalised names and aliases read so far to their GPU's name (updated here).
    """
    unknown = sorted(set(entry) - _KNOWN)
    if unknown:
        problems.append(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        problems.append(f"{where}: missing field(s) {', '.join(missing)}")
        return None
    n_before = len(problems)
    name = entry["name"]
    if not isinstance(name, str) or not name.strip():
        problems.append(f"{where}: name must be a non-empty string, got {name!r}")
        name = "?"
    memory = _size(problems, where, "memory", entry["memory"]) or 0
    host_raw = entry.get("host_memory_per_gpu")
    host = None if host_raw is None else _size(problems, where, "host_memory_per_gpu", host_raw)
    fp16 = _num(problems, where, "fp16_tflops", entry["fp16_tflops"])
    fp32 = _num(problems, where, "fp32_tflops", entry["fp32_tflops"])
    bf16_t = _num(problems, where, "bf16_tflops", entry.get("bf16_tflops"), optional=True)
    tf32_t = _num(problems, where, "tf32_tflops", entry.get("tf32_tflops"), optional=True)
    bw = _num(problems, where, "memory_bandwidth_gbs", entry.get("memory_bandwidth_gbs"), optional=True)
    link = _num(problems, where, "interconnect_gbs", entry.get("interconnect_gbs"), optional=True)
    for flag in ("bf16", "flash_attention_2"):
        if not isinstance(entry[flag], bool):
            problems.append(f"{where}: {flag} must be true or false, got {entry[flag]!r}")
    if entry["bf16"] is True and bf16_t is None:
        problems.append(f"{where}: bf16 is true but bf16_tflops is not given")
    price, eff = _check_price_efficiency(problems, where, entry)
    aliases = entry.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        problems.append(f"{where}: aliases must be a list of strings, got {aliases!r}")
        aliases = []
    cc = entry.get("compute_capability")
    date = entry.get("price_date")
    if isinstance(date, (_dt.date, _dt.datetime)):
        date = date.isoformat()[:10]
    if _norm(name) in seen and seen[_norm(name)] == name and name != "?":  # the same name in an earlier entry
        problems.append(f"{where}: {name!r} is defined twice in this file; keep one entry")
    for key in dict.fromkeys((name, *aliases)):  # (an entry may list its own name among its aliases)
        k = _norm(key)
        if k in seen and seen[k] != name:
            problems.append(f"{where}: name or alias {key!r} is already used by {seen[k]}")
        seen[k] = name
    if len(problems) > n_before:
        return None
    assert fp16 is not None and fp32 is not None  # checked above
    return GPU(
        name=name, memory_bytes=memory, fp16_tflops=fp16, fp32_tflops=fp32, bf16=entry["bf16"],
        flash_attention_2=entry["flash_attention_2"],
        price_per_hour_usd=float(price) if price is not None else None, bf16_tflops=bf16_t,
        tf32_tflops=tf32_t, compute_capability=None if cc is None else str(cc),
        vendor=str(entry.get("vendor", "nvidia")), efficiency=None if eff is None else float(eff),
        price_date=None if date is None else str(date), price_source=entry.get("price_source"),
        aliases=tuple(aliases), host_memory_bytes_per_gpu=host,
        host_memory_source=entry.get("host_memory_source"), memory_bandwidth_gbs=bw, interconnect_gbs=link,
        interconnect_source=entry.get("interconnect_source"),
    )  # fmt: skip


# a catalog size under this many bytes is a number written without its unit (``memory: 24`` for 24 GB)
_MIN_CATALOG_BYTES = 2**30


def _size(problems: list[str], where: str, key: str, value: Any) -> int | None:
    """A byte count: an int as is, anything else read by ``parse_size`` (``80GB``); None on a problem (a size
    under ``_MIN_CATALOG_BYTES``, zero or negative included, is one: a number written without its unit)."""
    try:
        n = (
            int(value)
            if isinstance(value, int) and not isinstance(value, bool)
            else parse_size(str(value), what=f"{where}: {key}")
        )
    except SpecError as exc:
        problems.append(str(exc))
        return None
    if n < _MIN_CATALOG_BYTES:
        unitless = isinstance(value, int) or str(value).strip().replace(".", "", 1).isdigit()
        fix = "give it with its unit, e.g. 24GB" if unitless else "no GPU or host has that little; e.g. 24GB"
        problems.append(f"{where}: {key} {value!r} is {n} bytes, under 1 GiB: {fix}")
        return None
    return n


def _check_price_efficiency(problems: list[str], where: str, entry: Mapping[str, Any]) -> tuple[Any, Any]:
    """The entry's price per hour and efficiency as given, after appending their problems to ``problems``."""
    price = entry["price_per_hour_usd"]
    if price is not None and (
        isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price < 0
    ):
        problems.append(f"{where}: price_per_hour_usd must be a finite number >= 0 or null, got {price!r}")
    eff = entry.get("efficiency")
    if eff is not None and (
        isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0 < eff <= 1  # (NaN fails this too)
    ):
        problems.append(f"{where}: efficiency must be in (0, 1], got {eff!r}")
    return price, eff


def _read_yaml(path: Path | str) -> Any:
    from autotune.spec.files import read_text_file

    p = Path(path).expanduser()
    return load_yaml(read_text_file(p, what="GPU catalog"), what=f"GPU catalog {str(p)!r}", unique_keys=True)


@functools.lru_cache(maxsize=1)
def _builtin() -> tuple[GPU, ...]:
    text = resources.files("autotune.estimate").joinpath("gpus.yaml").read_text(encoding="utf-8")
    return tuple(parse_catalog(load_yaml(text, what="gpus.yaml (built-in)", unique_keys=True),
                               source="gpus.yaml (built-in)"))


def builtin_catalog() -> list[GPU]:
    return list(_builtin())


def load_catalog(extra: Path | str | Sequence[Path | str] | None = None) -> list[GPU]:
    """The built-in catalog, extended by the given user YAML file(s). A later entry replaces an earlier one of
    the same name, and takes from the earlier entries any alias that spells its own name or aliases (a user's
    ``A100`` of 40 GB is what ``--gpu A100`` finds, not the built-in A100-80GB that has ``A100`` as an alias)."""
    gpus = {_norm(g.name): g for g in _builtin()}
    if extra is None:
        paths: list[Path | str] = []
    elif isinstance(extra, (str, Path)):
        paths = [extra]
    else:
        paths = list(extra)
    for p in paths:
        for g in parse_catalog(_read_yaml(p), source=str(p)):
            taken = [a for a in g.aliases if _norm(a) in gpus and _norm(a) != _norm(g.name)]
            if taken:
                raise SpecError(f"{p}: {g.name}'s alias {taken[0]!r} is the name of another GPU; to replace that "
                                f"entry, give yours the name {gpus[_norm(taken[0])].name!r}")
            spelled = {_norm(n) for n in (g.name, *g.aliases)}
            for k, old in gpus.items():
                if any(_norm(a) in spelled for a in old.aliases):
                    gpus[k] = dataclasses.replace(old, aliases=tuple(a for a in old.aliases if _norm(a) not in spelled))
            gpus[_norm(g.name)] = g
    return list(gpus.values())


def catalog_paths_from_env(environ: Mapping[str, str]) -> list[str]:
    """User catalog files named by ``AUTOTUNE_GPU_CATALOG`` (``os.pathsep``-separated)."""
    import os

    raw = environ.get(CATALOG_ENV, "")
    return [p for p in raw.split(os.pathsep) if p.strip()]


def find_gpu(name: str, catalog: Iterable[GPU] | None = None) -> GPU:
    """The catalog entry whose name or alias matches ``name`` (ignoring case, ``-``, ``_``, spaces).

    Unknown names raise SpecError listing the known ones.
    """
    gpus = list(_builtin() if catalog is None else catalog)
    key = _norm(name or "")
    for g in gpus:  # a name before any alias
        if key == _norm(g.name):
            return g
    for g in gpus:
        if key in {_norm(a) for a in g.aliases}:
            return g
    known = ", ".join(g.name for g in gpus)
    raise SpecError(f"unknown GPU {name!r}; known: {known} (extend the catalog with ${CATALOG_ENV})")


def alias_notes(names: str | Iterable[str], catalog: Iterable[GPU] | None = None) -> list[str]:
    """A note for each name read through an alias that other catalog entries' names also begin with: ``A100`` is
    the 80 GB card here, and a user of the 40 GB one typing it would be planned on 80 GB without a word."""
    items = [n.strip() for n in names.split(",")] if isinstance(names, str) else [n.strip() for n in names]
    gpus = list(_builtin() if catalog is None else catalog)
    notes = []
    for n in (i for i in items if i):
        g, key = find_gpu(n, gpus), _norm(n)  # (the names were found already: find_gpus)
        others = [o.name for o in gpus if o is not g and _norm(o.name).startswith(key)]
        if key != _norm(g.name) and others:
            notes.append(f"--gpu {n} is read as {g.name}; the catalog also holds {', '.join(others)}: name the one you "
                         "mean")
    return notes


def find_gpus(names: str | Iterable[str], catalog: Iterable[GPU] | None = None) -> list[GPU]:
    """Several GPUs from a comma-separated string or a list; every unknown name is reported."""
    items = [n.strip() for n in names.split(",")] if isinstance(names, str) else [n.strip() for n in names]
    items = [n for n in items if n]
    if not items:
        raise SpecError("no GPU given; name one or more, e.g. A10G,L4,A100-80GB,H100-SXM")
    gpus = list(_builtin() if catalog is None else catalog)
    found: list[GPU] = []
    unknown: list[str] = []
    for n in items:
        try:
            g = find_gpu(n, gpus)
        except SpecError:
            unknown.append(n)
            continue
        if g not in found:
            found.append(g)
    if unknown:
        raise SpecError(
            f"unknown GPU(s) {', '.join(repr(u) for u in unknown)}; known: {', '.join(g.name for g in gpus)} "
            f"(extend the catalog with ${CATALOG_ENV})"
        )
    return found
