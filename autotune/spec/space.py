"""Search spaces: YAML -> a validated, typed ``SearchSpace``.  [pure, apart from reading the file]

A search space lists, per knob of :class:`~autotune.spec.probe_request.Candidate`, the choices the
search may try. Every knob is optional in the YAML; an omitted knob has one choice, the
Candidate's default. A scalar is read as a one-choice list. Unknown keys, wrong types, empty
lists, duplicates and contradictions (offload without any ZeRO stage, ...) are all collected and
raised as one :class:`~autotune.errors.SpecError`.

Where the YAML files live
-------------------------
``search_spaces/*.yaml`` at the repository root, the one copy (``autotune/search_spaces`` is a symbolic
link to it, which a wheel build follows, copying the files into the package). ``load_space("cpu")`` looks
for ``<name>.yaml`` in, in order: the repository's ``search_spaces/`` next to the ``autotune`` package (a
source checkout or ``pip install -e .``), then ``autotune/search_spaces/`` inside the package (a wheel).
A value that names an existing file (or ends in ``.yaml``/``.yml``) is read as a path. No environment variables are consulted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import field, make_dataclass
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.spec.files import short_repr
from autotune.spec.levers import LEVERS, or_list, space_problems
from autotune.spec.probe_request import KIND_TYPES

__all__ = [
    "DIMENSIONS",
    "SearchSpace",
    "parse_space",
    "load_space",
    "space_dirs",
    "available_spaces",
]

# the space's name for a lever where it differs (a search space chooses GPUs per trial, the Candidate holds
# them as world_size); the accumulation is derived from the effective batch, never chosen
_DIMENSION_NAME = {"world_size": "gpus_per_trial"}
_NOT_SEARCHED = ("grad_accum",)
# the dimensions, in the order the search suggests them: space name -> lever (autotune.spec.levers, which
# declares each one's kind, values and default)
DIMENSIONS: dict[str, str] = {
    _DIMENSION_NAME.get(name, name): name
    for name in [n for n in LEVERS if n not in _NOT_SEARCHED and n != "world_size"] + ["world_size"]
}
_META_KEYS = ("description",)


def _default(dim: str) -> tuple[Any, ...]:
    return (LEVERS[DIMENSIONS[dim]].default,)


class _SpaceMethods:
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


# The choices per knob: one field per dimension (a lever of ``autotune.spec.levers``, each a non-empty tuple
# without duplicates, by default the lever's default alone), then the space's name, description and source.
SearchSpace = make_dataclass(
    "SearchSpace",
    [(dim, tuple[KIND_TYPES[LEVERS[lever].kind], ...], field(default=_default(dim)))
     for dim, lever in DIMENSIONS.items()]
    + [("name", str, field(default="custom")), ("description", str, field(default="")),
       ("source", str, field(default=""))],
    bases=(_SpaceMethods,),
    frozen=True,
    namespace={"__doc__": "The choices per knob. Each field is a non-empty tuple without duplicates."},
)
SearchSpace.__module__ = __name__


MAX_CHOICES = 64  # choices of one knob: a search space is a few dozen configurations per knob at most


def _check_dimension(dim: str, raw: Any, problems: list[str]) -> tuple[Any, ...] | None:
    lever = LEVERS[DIMENSIONS[dim]]
    kind = lever.kind
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
            elif lever.values and v not in lever.values:
                problems.append(f"{dim}: choices must be {or_list(lever.values)}; got {short_repr(v)}")
                ok = False
            elif lever.minimum is not None and v < lever.minimum:
                problems.append(f"{dim}: choices must be >= {lever.minimum}; got {short_repr(v)}")
                ok = False
        elif kind == "bool":
            if not isinstance(v, bool):
                problems.append(f"{dim}: choices must be true/false; got {short_repr(v)}")
                ok = False
        else:
            if not isinstance(v, str) or v not in lever.values:
                problems.append(f"{dim}: choices must be among {', '.join(lever.values)}; got {short_repr(v)}")
                ok = False
        out.append(v)
    if ok:
        dups = sorted({short_repr(v) for v in out if out.count(v) > 1})
        if dups:
            problems.append(f"{dim}: duplicate choice(s) {', '.join(dups)}")
            ok = False
    return tuple(out) if ok else None


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
    problems += space_problems({DIMENSIONS[d]: v for d, v in dims.items()})
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

    data = load_yaml(read_text_file(path, what="search space"), what=f"search space {path}", unique_keys=True)
    return parse_space(data, name=name, source=str(path))
