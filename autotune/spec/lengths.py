"""Sequence-length distributions for synthetic probe data.  [pure: stdlib only]

A workload's ``lengths`` string says how long the probe's training sequences are:

* ``fixed`` -- every sequence is ``seq_len`` tokens;
* ``lognormal:MU,SIGMA`` -- ``round(exp(N(MU, SIGMA)))`` clipped to ``[16, seq_len]``, a long tail
  like chat/instruction data (``lognormal:3.5,1.0`` has median ~33 and a tail to ``seq_len``);
* ``uniform:LO-HI`` -- an integer uniform on ``[LO, HI]`` (inclusive), clipped to ``seq_len``;
* ``histogram:PATH.json`` -- a JSON file ``{"bins": [edges...], "counts": [...]}`` (bin ``i`` covers
  ``[bins[i], bins[i+1])``, the last bin includes its upper edge) or ``{"lengths": [...]}`` (an
  empirical sample, drawn from uniformly). Lengths are clipped to ``[1, seq_len]``.

How the probe's collators lay a micro-batch of such sequences out (padded rows, packed rows, one flat row) is
here too (:func:`pack_first_fit`, :func:`batch_layout`): the probe's collators and the cost model read the
same layout.

Sampling is deterministic for a given seed (one ``random.Random`` per call, no global state).
``parse_lengths`` reads the histogram file of a ``histogram:`` spec (the only I/O here); use
``histogram_from_mapping`` to build the same object from data already in memory.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.errors import SpecError

__all__ = [
    "length_bounds",
    "ACCEPTED_LENGTHS",
    "LOGNORMAL_MIN",
    "LengthDistribution",
    "parse_lengths",
    "histogram_from_mapping",
    "histogram_from_lengths",
    "iter_lengths",
    "sample_lengths",
    "pack_first_fit",
    "batch_layout",
]

ACCEPTED_LENGTHS = (
    "fixed, lognormal:MU,SIGMA (e.g. lognormal:3.5,1.0), uniform:LO-HI (e.g. uniform:32-512) "
    'or histogram:PATH.json (a JSON file {"bins": [...], "counts": [...]} or {"lengths": [...]})'
)
LOGNORMAL_MIN = 16


@dataclass(frozen=True)
class LengthDistribution:
    """A parsed length spec. ``kind`` is fixed | lognormal | uniform | histogram | empirical."""

    kind: str
    mu: float = 0.0
    sigma: float = 0.0
    lo: int = 0
    hi: int = 0
    bins: tuple[int, ...] = ()
    counts: tuple[float, ...] = ()
    lengths: tuple[int, ...] = ()  # kind == "empirical"
    source: str = ""  # the spec text it came from

    def min_length(self, seq_len: int) -> int:
        """The shortest length this distribution can produce, given ``seq_len`` (every longer one is cut to it)."""
        if self.kind == "fixed":
            return seq_len
        if self.kind == "lognormal":
            return 1
        if self.kind == "uniform":
            return min(self.lo, seq_len)
        if self.kind == "histogram":
            first = min(i for i, c in enumerate(self.counts) if c > 0)
            return max(1, min(self.bins[first], seq_len))
        return max(1, min(min(self.lengths), seq_len))

    def max_length(self, seq_len: int) -> int:
        """The longest length this distribution can produce, given ``seq_len`` (the worst case)."""
        if self.kind in ("fixed", "lognormal"):
            return seq_len
        if self.kind == "uniform":
            return min(self.hi, seq_len)
        if self.kind == "histogram":
            last = max(i for i, c in enumerate(self.counts) if c > 0)
            return max(1, min(self.bins[last + 1], seq_len))
        return max(1, min(max(self.lengths), seq_len))


@functools.lru_cache(maxsize=64)
def length_bounds(text: str, seq_len: int) -> tuple[int, int]:
    """The shortest and the longest row a ``Workload.lengths`` spec makes under ``seq_len``, parsed once per spec (a
    histogram's file is read once, not per candidate of a plan); SpecError for a bad spec."""
    dist = parse_lengths(text)
    return dist.min_length(seq_len), dist.max_length(seq_len)


def _bad(text: str, why: str) -> SpecError:
    return SpecError(f"lengths {text!r}: {why}; accepted: {ACCEPTED_LENGTHS}")


def _float(text: str, value: str, name: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise _bad(text, f"{name} must be a number, got {value.strip()!r}") from None
    if not math.isfinite(v):
        raise _bad(text, f"{name} must be finite, got {value.strip()!r}")
    return v


def _int(text: str, value: str, name: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise _bad(text, f"{name} must be an integer, got {value.strip()!r}") from None


def parse_lengths(text: str | LengthDistribution) -> LengthDistribution:
    """Parse a ``Workload.lengths`` string; raises SpecError listing the accepted forms."""
    if isinstance(text, LengthDistribution):
        return text
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"lengths must be a non-empty string, got {text!r}; accepted: {ACCEPTED_LENGTHS}")
    raw = text.strip()
    kind, sep, arg = raw.partition(":")
    kind = kind.strip().lower()
    if kind == "fixed":
        if sep:
            raise _bad(raw, "fixed takes no argument (every sequence is seq_len tokens)")
        return LengthDistribution(kind="fixed", source=raw)
    if kind == "lognormal":
        parts = arg.split(",")
        if len(parts) != 2:
            raise _bad(raw, "lognormal needs two numbers MU,SIGMA")
        mu = _float(raw, parts[0], "MU")
        sigma = _float(raw, parts[1], "SIGMA")
        if sigma < 0:
            raise _bad(raw, f"SIGMA must be >= 0, got {sigma}")
        return LengthDistribution(kind="lognormal", mu=mu, sigma=sigma, source=raw)
    if kind == "uniform":
        parts = arg.split("-")
        if len(parts) != 2:
            raise _bad(raw, "uniform needs an integer range LO-HI")
        lo, hi = _int(raw, parts[0], "LO"), _int(raw, parts[1], "HI")
        if lo < 1 or hi < lo:
            raise _bad(raw, f"uniform needs 1 <= LO <= HI, got LO={lo}, HI={hi}")
        return LengthDistribution(kind="uniform", lo=lo, hi=hi, source=raw)
    if kind == "histogram":
        path = arg.strip()
        if not path:
            raise _bad(raw, "histogram needs a path to a JSON file")
        from autotune.spec.files import load_json, read_text_file

        try:  # a regular file of bounded size: a FIFO would block, /dev/zero would never end
            data = load_json(read_text_file(path, what="histogram file"), what=f"cannot read histogram file {path!r}")
        except SpecError as e:
            raise _bad(raw, str(e)) from None
        return histogram_from_mapping(data, source=raw)
    raise _bad(raw, f"unknown kind {kind!r}")


def histogram_from_mapping(data: Any, *, source: str = "histogram") -> LengthDistribution:
    """Validate ``{"bins": [...], "counts": [...]}`` or ``{"lengths": [...]}`` into a distribution."""

    def bad(why: str) -> SpecError:
        return SpecError(
            f"length histogram {source!r}: {why}; expected "
            '{"bins": [e0, e1, ...], "counts": [c0, ...]} (len(counts) == len(bins) - 1) '
            'or {"lengths": [l0, l1, ...]}'
        )

    if not isinstance(data, Mapping):
        raise bad(f"top level must be a JSON object, got {type(data).__name__}")
    if "lengths" in data:
        lengths = data["lengths"]
        if not isinstance(lengths, Sequence) or isinstance(lengths, str) or not lengths:
            raise bad("'lengths' must be a non-empty list of positive integers")
        if any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in lengths):
            raise bad("'lengths' must hold positive integers only")
        return LengthDistribution(kind="empirical", lengths=tuple(int(x) for x in lengths), source=source)
    if "bins" not in data or "counts" not in data:
        raise bad(f"missing 'bins'/'counts' (keys present: {sorted(map(str, data))})")
    bins, counts = data["bins"], data["counts"]
    if not isinstance(bins, Sequence) or not isinstance(counts, Sequence):
        raise bad("'bins' and 'counts' must be lists")
    if len(bins) < 2 or len(counts) != len(bins) - 1:
        raise bad(f"need len(counts) == len(bins) - 1 >= 1, got {len(bins)} bins and {len(counts)} counts")
    if any(
        isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b != int(b)
        for b in bins
    ):
        raise bad("bin edges must be integers")
    edges = tuple(int(b) for b in bins)
    if edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise bad(f"bin edges must be >= 1 and strictly increasing, got {list(edges)}")
    if any(isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < math.inf for c in counts):
        raise bad("counts must be numbers >= 0")
    if not sum(counts) > 0:
        raise bad("counts are all zero")
    return LengthDistribution(
        kind="histogram", bins=edges, counts=tuple(float(c) for c in counts), source=source
    )


def histogram_from_lengths(lengths: Sequence[int], *, num_bins: int = 32) -> dict[str, list[int]]:
    """A ``{"bins": [...], "counts": [...]}`` histogram of observed lengths (JSON-ready).

    Edges are integers, spaced geometrically when the range is wide (a long tail keeps resolution
    at the short end) and linearly otherwise; the last edge is ``max(lengths)`` (included).
    """
    values = [int(x) for x in lengths if int(x) >= 1]
    if not values:
        raise SpecError("cannot build a length histogram from no (positive) lengths")
    if num_bins < 1:
        raise SpecError(f"num_bins must be >= 1, got {num_bins}")
    lo, hi = min(values), max(values)
    if lo == hi:
        return {"bins": [lo, lo + 1], "counts": [len(values)]}
    if hi / lo > 8:
        raw = [lo * (hi / lo) ** (i / num_bins) for i in range(num_bins + 1)]
    else:
        raw = [lo + (hi - lo) * i / num_bins for i in range(num_bins + 1)]
    edges = sorted({round(x) for x in raw} | {lo, hi})
    counts = [0] * (len(edges) - 1)
    for v in values:
        # bin i covers [edges[i], edges[i+1]); the last bin includes hi
        lo_i, hi_i = 0, len(edges) - 2
        while lo_i < hi_i:
            mid = (lo_i + hi_i + 1) // 2
            if edges[mid] <= v:
                lo_i = mid
            else:
                hi_i = mid - 1
        counts[lo_i] += 1
    return {"bins": edges, "counts": counts}


def iter_lengths(spec: str | LengthDistribution, seq_len: int, seed: int) -> Iterator[int]:
    """An endless, deterministic stream of lengths in ``[1, seq_len]`` (validates eagerly)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise SpecError(f"seq_len must be a positive integer, got {seq_len!r}")
    return _stream(parse_lengths(spec), seq_len, random.Random(seed))


def _stream(dist: LengthDistribution, seq_len: int, rng: random.Random) -> Iterator[int]:
    if dist.kind == "fixed":
        while True:
            yield seq_len
    elif dist.kind == "lognormal":
        floor = min(LOGNORMAL_MIN, seq_len)
        while True:
            try:
                x = rng.lognormvariate(dist.mu, dist.sigma)
            except OverflowError:  # a draw past a float's range is past seq_len: clipped like any other
                x = math.inf
            yield seq_len if x >= seq_len else max(floor, round(x))
    elif dist.kind == "uniform":
        while True:
            yield min(seq_len, rng.randint(dist.lo, dist.hi))
    elif dist.kind == "histogram":
        cum: list[float] = []
        total = 0.0
        for c in dist.counts:
            total += c
            cum.append(total)
        last = len(dist.counts) - 1
        while True:
            (i,) = rng.choices(range(len(dist.counts)), cum_weights=cum, k=1)
            a, b = dist.bins[i], dist.bins[i + 1]
            x = rng.randint(a, b) if i == last else rng.randint(a, b - 1)
            yield max(1, min(seq_len, x))
    else:
        while True:
            yield max(1, min(seq_len, rng.choice(dist.lengths)))


def sample_lengths(spec: str | LengthDistribution, n: int, seq_len: int, seed: int) -> list[int]:
    """``n`` lengths from ``spec`` in ``[1, seq_len]``, the same list for the same seed."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise SpecError(f"n must be a non-negative integer, got {n!r}")
    it = iter_lengths(spec, seq_len, seed)
    return [next(it) for _ in range(n)]


def pack_first_fit(lengths: Sequence[int], *, seq_len: int) -> list[list[int]]:
    """Pack sequences (whole, never split) into as few rows of at most ``seq_len`` tokens as first-fit
    decreasing finds: longest first, each into the first row with room, else a new row.

    Returns, per row (in the order rows were opened), the positions in ``lengths`` it holds.
    """
    rows: list[list[int]] = []
    used: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-int(lengths[j]), j)):
        n = int(lengths[i])
        if n > seq_len:
            raise ValueError(f"sequence {i} has {n} tokens > seq_len {seq_len}")
        for k, u in enumerate(used):
            if u + n <= seq_len:
                rows[k].append(i)
                used[k] = u + n
                break
        else:
            rows.append([i])
            used.append(n)
    return rows


def packing_fill(lengths: Sequence[int], *, seq_len: int, sample: int = 2048) -> float | None:
    """The share of a row's ``seq_len`` tokens that packing a dataset of these sequence ``lengths`` ahead of
    training fills (TRL's bfd, Axolotl's and LLaMA-Factory's packers: whole sequences, longer ones cut to
    ``seq_len``), by :func:`pack_first_fit` on at most ``sample`` of them taken evenly (first-fit is quadratic in
    the rows); None without lengths. Rows are never full: a batch of rows holds fewer sequences than the same
    tokens at full rows would (a tiny chat set's rows were 86 % full: 4 rows held 6.7 sequences, not 8)."""
    cut = [min(int(n), seq_len) for n in lengths if int(n) > 0]
    if not cut:
        return None
    step = max(1, len(cut) // sample)
    taken = cut[::step][:sample]
    rows = pack_first_fit(taken, seq_len=seq_len)
    return sum(taken) / (len(rows) * seq_len)


LAYOUT_MODES = ("padding", "packing", "packing_flat")


def batch_layout(lengths: Sequence[int], *, micro_batch: int, mode: str, seq_len: int) -> list[tuple[int, int]]:
    """``(rows, width)`` of each micro-batch the probe's collators make of ``lengths``, taken in order
    ``micro_batch`` at a time: ``padding`` one row per sequence, padded to the longest; ``packing`` the rows
    :func:`pack_first_fit` makes, padded to the longest row; ``packing_flat`` one padding-free row of every
    token (packing with flash_attention_2 or flex_attention). ``rows x width`` summed is the token slots the
    model computes (the probe's padding figures and the cost model's compute per real token both read it)."""
    if mode not in LAYOUT_MODES:
        raise ValueError(f"layout mode {mode!r}: expected one of {', '.join(LAYOUT_MODES)}")
    out: list[tuple[int, int]] = []
    for i in range(0, len(lengths), max(1, micro_batch)):
        chunk = [int(n) for n in lengths[i : i + max(1, micro_batch)]]
        if mode == "padding":
            out.append((len(chunk), max(chunk)))
        elif mode == "packing":
            rows = pack_first_fit(chunk, seq_len=seq_len)
            out.append((len(rows), max(sum(chunk[j] for j in r) for r in rows)))
        else:
            out.append((1, sum(chunk)))
    return out
