"""Property-based tests (hypothesis) of the budget parser and the search-space loader (issue 8, item 5)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.errors import SpecError
from autotune.spec.budget import _UNITS, Budget, format_bytes, parse_budget, parse_size
from autotune.spec.space import DIMENSIONS, SearchSpace, load_space, parse_space

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------ budgets


def _valid(b: Budget) -> bool:
    if b.bytes is not None:
        return b.fraction is None and isinstance(b.bytes, int) and b.bytes >= 1
    return b.fraction is not None and 0.0 < b.fraction <= 1.0


@FAST
@given(st.one_of(st.text(), st.text(alphabet="0123456789.eE+-%kKmMgGtTiIbB ")))
def test_any_text_is_a_positive_budget_or_a_spec_error(text: str) -> None:
    try:
        b = parse_budget(text)
    except SpecError as exc:
        assert "gpu budget" in str(exc)
        return
    assert _valid(b)


@FAST
@given(st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.integers(), st.lists(st.integers()),
                 st.dictionaries(st.text(), st.integers())))
def test_any_value_is_a_positive_budget_or_a_spec_error(value: Any) -> None:
    try:
        b = parse_budget(value)
    except SpecError:
        return
    assert _valid(b)


@FAST
@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(sorted(u for u in _UNITS if u)),
       st.sampled_from(["", " "]), st.booleans())
def test_sizes_round_trip_exactly(n: int, unit: str, space: str, upper: bool) -> None:
    text = f"{n}{space}{unit.upper() if upper else unit}"
    b = parse_budget(text)
    assert b.bytes == n * _UNITS[unit] and b.text == text.strip()
    assert parse_budget(b) is b


def test_a_bare_number_under_a_gib_is_refused_as_a_missing_unit() -> None:
    with pytest.raises(SpecError, match=r"'4' has no unit, so it would be 4 bytes; .* e\.g\. 4GB"):
        parse_budget("4")
    assert parse_budget("4000000000").bytes == 4 * 10**9 and parse_budget("4B").bytes == 4


@FAST
@given(st.integers(min_value=1, max_value=2**50))
def test_format_bytes_parses_back_within_rounding(n: int) -> None:
    shown = format_bytes(n)  # "1.50 GiB": 3 significant decimals
    back = parse_size(shown)
    assert abs(back - n) <= max(1, n * 0.005 + 2**10 * 0.005), (n, shown, back)


@FAST
@given(st.floats(min_value=0.01, max_value=100.0))
def test_percentages_resolve_to_a_share_of_the_device(pct: float) -> None:
    b = parse_budget(f"{pct}%")
    assert b.fraction is not None and abs(b.fraction - pct / 100) < 1e-9
    assert 0 <= b.resolve(80 * 2**30) <= 80 * 2**30


# ------------------------------------------------------------------------------ search spaces

_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-5, max_value=70), st.floats(),
                     st.text(max_size=12), st.sampled_from(["sdpa", "eager", "fp32", "bf16", "none", "fsdp",
                                                            "deepspeed", "optimizer", "params", "adamw_torch"]))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                         st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                       max_leaves=8)
_keys = st.one_of(st.sampled_from([*DIMENSIONS, "description"]), st.text(max_size=10), st.integers(), st.none())


@FAST
@given(st.one_of(st.dictionaries(_keys, _values, max_size=8), _values))
def test_any_document_is_a_search_space_or_one_spec_error_listing_its_problems(doc: Any) -> None:
    try:
        space = parse_space(doc)
    except SpecError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        assert str(exc) == "; ".join(exc.problems)
        return
    assert isinstance(space, SearchSpace)
    for d in DIMENSIONS:
        choices = space.choices(d)
        assert choices and len(set(map(repr, choices))) == len(choices)


@FAST
@given(st.dictionaries(st.sampled_from(list(DIMENSIONS)), _values, min_size=2, max_size=6))
def test_every_bad_dimension_is_reported_not_only_the_first(doc: dict[str, Any]) -> None:
    bad = []
    for d, v in doc.items():
        try:
            parse_space({d: v})
        except SpecError:
            bad.append(d)
    try:
        parse_space(doc)
    except SpecError as exc:
        for d in bad:
            assert d in str(exc), (d, str(exc))
    else:
        assert not bad


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_any_yaml_file_is_a_search_space_or_a_spec_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "space.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            assert isinstance(load_space(path), SearchSpace)
        except SpecError:
            pass


@pytest.mark.parametrize("text", ["micro_batch: !!python/object/apply:os.getcwd []\n",
                                  "a: &x [*x]\n", "micro_batch: [1, 2]\n" * 3])
def test_hostile_yaml_never_raises_anything_but_a_spec_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    try:
        load_space(path)
    except SpecError:
        return
