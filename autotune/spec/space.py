"""Search spaces: YAML -> a validated, typed ``SearchSpace``.  [pure, apart from reading the file]

A search space lists, per knob of :class:`~autotune.spec.probe_request.Candidate`, the choices the
search may try. Every knob is optional in the YAML; an omitted knob has one choice, the
Candidate's default. A scalar is read as a one-choice list. Unknown keys, wrong types, empty
lists, duplicates and contradictions (offload without any ZeRO stage, ...) are all collected and
raised as one :class:`~autotune.errors.SpecError`.

Where the YAML files live
-------------------------
``search_spaces/*.yaml`` at the repository root (the issue's layout). ``load_space("cpu")`` looks
for ``<name>.yaml`` in, in order: the repository's ``search_spaces/`` next to the ``autotune``
package (a source checkout or ``pip install -e .``), then ``autotune/search_spaces/`` inside the
package (where a wheel build would copy them). A value that names an existing file (or ends in
``.yaml``/``.yml``) is read as a path. No environment variables are consulted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.spec.files import short_repr
from autotune.spec.probe_request import (
    ATTN_CHOICES,
    OFFLOAD_CHOICES,
    OPTIM_CHOICES,
    PRECISION_CHOICES,
    SHARDING_CHOICES,
    Candidate,
)

__all__ = [
    "DIMENSIONS",
    "SearchSpace",
    "parse_space",
    "load_space",
    "space_dirs",
    "available_spaces",
]

# name -> (kind, allowed choices or minimum). Kind is "int", "bool" or "str".
DIMENSIONS: dict[str, tuple[str, Any]] = {
    "micro_batch": ("int", 1),
    "grad_ckpt": ("bool", None),
    "attn": ("str", ATTN_CHOICES),
    "workers": ("int", 0),
    "pin_memory": ("bool", None),
    "precision": ("str", PRECISION_CHOICES),
    "packing": ("bool", None),
    "optim": ("str", OPTIM_CHOICES),
    "torch_compile": ("bool", None),
    "liger": ("bool", None),
    "zero_stage": ("int", 0),
    "offload": ("str", OFFLOAD_CHOICES),
    "sharding": ("str", SHARDING_CHOICES),
    "gpus_per_trial": ("int", 1),
}
_META_KEYS = ("description",)
_CANDIDATE_DEFAULTS = Candidate()


def _default(dim: str) -> tuple[Any, ...]:
    if dim == "gpus_per_trial":
        return (1,)
    return (getattr(_CANDIDATE_DEFAULTS, dim),)


@dataclass(frozen=True)
class SearchSpace:
    """The choices per knob. Each field is a non-empty tuple without duplicates."""

    micro_batch: tuple[int, ...] = _default("micro_batch")
    grad_ckpt: tuple[bool, ...] = _default("grad_ckpt")
    attn: tuple[str, ...] = _default("attn")
    workers: tuple[int, ...] = _default("workers")
    pin_memory: tuple[bool, ...] = _default("pin_memory")
    precision: tuple[str, ...] = _default("precision")
    packing: tuple[bool, ...] = _default("packing")
    optim: tuple[str, ...] = _default("optim")
    torch_compile: tuple[bool, ...] = _default("torch_compile")
    liger: tuple[bool, ...] = _default("liger")
    zero_stage: tuple[int, ...] = _default("zero_stage")
    offload: tuple[str, ...] = _default("offload")
    sharding: tuple[str, ...] = _default("sharding")
    gpus_per_trial: tuple[int, ...] = (1,)
    name: str = "custom"
    description: str = ""
    source: str = ""

    def choices(self, dim: str) -> tuple[Any, ...]:
        if dim not in DIMENSIONS:
            raise KeyError(dim)
        return tuple(getattr(self, dim))

    def size(self) -> int:
        """Number of raw combinations (before contradictions and effective-batch filtering)."""
        n = 1
        for d in DIMENSIONS:
            n *= len(self.choices(d))
        return n

    def to_dict(self) -> dict[str, Any]:
        """The dimensions as plain lists (what the cache key hashes; name and source excluded)."""
        return {d: list(self.choices(d)) for d in DIMENSIONS}

    def fingerprint(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


MAX_CHOICES = 64  # choices of one knob: a search space is a few dozen configurations per knob at most


def _check_dimension(dim: str, raw: Any, problems: list[str]) -> tuple[Any, ...] | None:
    kind, rule = DIMENSIONS[dim]
    values = raw if isinstance(raw, list) else [raw]
    if raw is None or (isinstance(raw, list) and not raw):
        problems.append(f"{dim}: needs at least one choice; got {short_repr(raw)}")
        return None
    if len(values) > MAX_CHOICES:
        problems.append(f"{dim}: at most {MAX_CHOICES} choices; got {len(values):,}")
        return None
    out: list[Any] = []
    ok = True
    first = len(problems)
    for v in values:
        if len(problems) - first >= 3:  # three examples say it; the rest would only bury them
            problems.append(f"{dim}: (and more choices like these)")
            break
        if kind == "int":
            if isinstance(v, bool) or not isinstance(v, int):
                problems.append(f"{dim}: choices must be integers; got {short_repr(v)}")
                ok = False
            elif v < rule:
                problems.append(f"{dim}: choices must be >= {rule}; got {short_repr(v)}")
                ok = False
            elif dim == "zero_stage" and v > 3:
                problems.append(f"zero_stage: choices must be 0, 1, 2 or 3; got {short_repr(v)}")
                ok = False
        elif kind == "bool":
            if not isinstance(v, bool):
                problems.append(f"{dim}: choices must be true/false; got {short_repr(v)}")
                ok = False
        else:
            if not isinstance(v, str) or v not in rule:
                problems.append(f"{dim}: choices must be among {', '.join(rule)}; got {short_repr(v)}")
                ok = False
        out.append(v)
    if ok:
        dups = sorted({short_repr(v) for v in out if out.count(v) > 1})
        if dups:
            problems.append(f"{dim}: duplicate choice(s) {', '.join(dups)}")
            ok = False
    return tuple(out) if ok else None


def _contradictions(dims: dict[str, tuple[Any, ...]]) -> list[str]:
    p: list[str] = []
    zero = dims.get("zero_stage", _default("zero_stage"))
    offload = dims.get("offload", _default("offload"))
    sharding = dims.get("sharding", _default("sharding"))
    if any(o != "none" for o in offload) and not any(z > 0 for z in zero):
        p.append(
            f"offload {list(offload)} needs a zero_stage > 0 among the choices; zero_stage is {list(zero)}"
        )
    if "params" in offload and 3 not in zero:
        p.append(f"offload 'params' needs zero_stage 3 among the choices; zero_stage is {list(zero)}")
    if "fsdp" in sharding and not any(z > 0 for z in zero):
        p.append(f"sharding 'fsdp' needs a zero_stage > 0 among the choices; zero_stage is {list(zero)}")
    if "fsdp" in sharding and "deepspeed" not in sharding and zero and set(zero) == {1}:
        p.append("sharding 'fsdp' has no stage 1 (it shards gradients+optimizer or everything); use 2 or 3")
    return p


def parse_space(data: Any, *, name: str = "custom", source: str = "") -> SearchSpace:
    """Validate a loaded YAML document and build the SearchSpace (all problems in one SpecError)."""
    where = f"search space {source or name}"
    if not isinstance(data, dict):
        raise SpecError(f"{where}: must be a mapping of knob -> list of choices; got {type(data).__name__}")
    problems: list[str] = []
    unknown = sorted(k[:60] if isinstance(k, str) else short_repr(k) for k in data
                     if k not in DIMENSIONS and k not in _META_KEYS)
    if unknown:
        problems.append(
            f"unknown key(s) {', '.join(unknown)}; known: {', '.join(list(DIMENSIONS) + list(_META_KEYS))}"
        )
    description = data.get("description", "")
    if not isinstance(description, str):
        problems.append(f"description must be text; got {short_repr(description)}")
        description = ""
    dims: dict[str, tuple[Any, ...]] = {}
    for dim in DIMENSIONS:
        if dim in data:
            checked = _check_dimension(dim, data[dim], problems)
            if checked is not None:
                dims[dim] = checked
    problems += _contradictions(dims)
    if problems:
        raise SpecError([f"{where}: {p}" for p in problems])
    kwargs: dict[str, Any] = dict(dims)
    return SearchSpace(**kwargs, name=name, description=description.strip(), source=source)


def space_dirs() -> list[Path]:
    """Folders searched for ``<name>.yaml``, in order (see the module docstring)."""
    pkg = Path(__file__).resolve().parent.parent  # .../autotune
    return [pkg.parent / "search_spaces", pkg / "search_spaces"]


def available_spaces() -> list[str]:
    names: set[str] = set()
    for d in space_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def load_space(name_or_path: str | Path) -> SearchSpace:
    """Load a search space by name (``default``, ``cpu``, ...) or by path to a YAML file."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    looks_like_path = path.suffix in (".yaml", ".yml") or "/" in text or path.is_file()
    if looks_like_path:
        if not path.exists():
            raise SpecError(f"search space file {text!r} does not exist")
        name = path.stem
    else:
        found = [d / f"{text}.yaml" for d in space_dirs() if (d / f"{text}.yaml").is_file()]
        if not found:
            known = ", ".join(available_spaces()) or "none found"
            raise SpecError(f"unknown search space {text!r}; known: {known} (or give a path to a YAML file)")
        path, name = found[0], text
    from autotune.spec.files import load_yaml, read_text_file

    data = load_yaml(read_text_file(path, what="search space"), what=f"search space {path}")
    return parse_space(data, name=name, source=str(path))


def _fields_match() -> None:  # pragma: no cover - guards against drift with Candidate
    names = {f.name for f in dataclasses.fields(Candidate)}
    missing = [d for d in DIMENSIONS if d != "gpus_per_trial" and d not in names]
    if missing:
        raise RuntimeError(f"search dimensions not on Candidate: {missing}")


_fields_match()
