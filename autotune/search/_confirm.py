"""Confirmation: how re-measurements become a reported figure, a status and a winner.  [pure]

The search measures each configuration once, and the measurement that put a candidate on top is
the one most likely to be lucky (the winner's curse). So the reported figure never uses it: the
top candidates and the HF-default baseline are re-measured in interleaved rounds (A, B, base,
B, base, A, ...: drifting load then hits all of them alike), and each candidate's figure is the
median of its re-measurements alone, reported with its spread and every value.

A candidate is ``confirmed`` when at least ``min_rounds`` re-measurements agree within
``tolerance`` (relative spread, (max - min) / median). Until then more rounds run, up to
``max_rounds``; a candidate whose values still disagree is ``noisy``. Under ``search_agrees`` (the GPU
policy) one re-measurement confirms when it agrees with the candidate's search measurement within the
tolerance: the search value counts towards the agreement, never towards the figure (it is the one the
winner's curse inflates). Two or more contenders are ranked on at least ``contest_rounds`` paired rounds
whatever ``min_rounds`` says, since one round alone cannot tell a tie from a win: 2 on CPU; 1 on a GPU, where
the search measurements are the second ordering (a contender whose search measurement was at least the
leader's is indistinguishable from it) and a steady card does not need a second paired round. A
re-measurement that runs out of memory makes it ``failed_confirm`` (it does not really fit); one with no
value at all (crash, timeout) leaves it ``unconfirmed``.

Comparisons are paired: candidates re-measured in the same round saw the same load, so the leader
is the best median per-round ratio to the HF default (re-measured every round), and a candidate
that beat the leader in at least one round, with its median ratio to the leader and its figure within the
tolerance (or its range overlapping the leader's), is
*indistinguishable within the measured noise* from it (without rounds in common: overlapping ranges [min,
max]). A value measured while the load monitor saw other work is never paired with a clean one: the rounds
clean on both sides pair, or where there is none, the rounds loaded on both. The tie goes to a candidate with a re-measurement free of other load
over one whose every re-measurement ran under it, then to the fewer numerics-changing levers (the
configuration that trains most like what was asked), then the smaller memory footprint (more headroom),
then the higher median.

Default tolerances (``ConfirmPolicy.for_device``): 25 % on CPU, where the same configuration spans
17-36 % over repeats on a quiet 2-core machine (median repeat spread 14-16 % over the recorded
landscapes, benchmarks/README.md), and 10 % on a GPU, where repeated probes of one configuration are
steady to a few per cent unless the card is shared or throttling (to be re-set from the GPU pass's
measured spread, benchmarks/gpu_check.sh).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.search._logic import median, relative_spread

__all__ = [
    "ConfirmPolicy",
    "confirmation_probes",
    "NUMERICS_LEVERS",
    "confirmation_status",
    "interleaved_order",
    "measured_range",
    "numerics_levers",
    "only_loaded",
    "overlaps",
    "choose_winner",
    "speedup",
]

# Candidate fields whose change alters the numbers a training run computes (not just its speed or
# memory): precision, TF32 matmuls, the optimizer's arithmetic, fused kernels, compiled graphs and the
# attention kernel (mathematically equal, numerically not bit-identical).
NUMERICS_LEVERS = ("precision", "optim", "liger", "torch_compile", "attn")


@dataclass(frozen=True)
class ConfirmPolicy:
    """How candidates are re-measured before a figure is reported.

    ``include_search``: count the search measurement in the reported median too, and ``ties``
    False: the higher median wins whatever the ranges (what autotune did before; kept as a policy so
    ``benchmarks/noise.py`` can score it against the new one).
    """

    min_rounds: int = 2
    max_rounds: int = 4
    tolerance: float = 0.25
    include_search: bool = False
    ties: bool = True  # overlapping ranges are a tie (False: the higher median wins, as before)
    # one re-measurement agreeing with the search value confirms, and the search values order contenders
    # measured side by side in fewer than two rounds (never in a figure)
    search_agrees: bool = False
    contest_rounds: int = 2  # rounds that rank two or more contenders side by side, at least

    def __post_init__(self) -> None:
        if self.min_rounds < 0 or self.max_rounds < self.min_rounds:
            raise ValueError(f"confirmation rounds must satisfy 0 <= min <= max; got {self.min_rounds}, "
                             f"{self.max_rounds}")
        if not self.tolerance > 0:
            raise ValueError(f"confirmation tolerance must be > 0; got {self.tolerance!r}")
        if self.contest_rounds < 0:
            raise ValueError(f"confirmation contest_rounds must be >= 0; got {self.contest_rounds}")

    def rounds_for(self, contenders: int) -> int:
        """The rounds a confirmation of ``contenders`` candidates (the baseline aside) makes at least."""
        if contenders <= 0:
            return 0
        return self.min_rounds if contenders == 1 else min(self.max_rounds, max(self.min_rounds, self.contest_rounds))

    @classmethod
    def for_device(cls, device: str, **overrides: Any) -> ConfirmPolicy:
        base = (cls(tolerance=0.10, min_rounds=1, search_agrees=True, contest_rounds=1) if device == "cuda"
                else cls(tolerance=0.25))
        return dataclasses.replace(base, **overrides) if overrides else base

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def confirmation_probes(top_k: int, baseline: bool, rounds: int, *, search_probes: int | None = None) -> int:
    """Probes the confirmation makes at least: the top-k and the HF-default baseline, each once per round for
    ``rounds`` rounds (``ConfirmPolicy.rounds_for(top_k)``; none without a top-k). It re-measures configurations
    the search measured, so never more of them than ``search_probes`` (the baseline among them)."""
    if not top_k:
        return 0
    configurations = top_k + (1 if baseline else 0)
    if search_probes is not None:
        configurations = min(configurations, max(0, search_probes))
    return configurations * rounds


def measured_range(values: Sequence[float]) -> tuple[float, float] | None:
    vals = [float(v) for v in values]
    return (min(vals), max(vals)) if vals else None


def confirmation_status(values: Sequence[float], *, rounds_done: int, policy: ConfirmPolicy,
                        memory_failure: str = "", other_failure: str = "",
                        search_value: float | None = None) -> tuple[str, str]:
    """(status, reason) of a candidate after ``rounds_done`` rounds with these re-measured values.

    ``pending`` means another round would help (fewer than ``min_rounds`` values, or values that
    disagree while rounds are left). ``search_value``: the candidate's search measurement, which a lone
    re-measurement must agree with under ``policy.search_agrees``.
    """
    if memory_failure:
        return "failed_confirm", f"re-measurement was {memory_failure}"
    n = len(values)
    spread = relative_spread([float(v) for v in values])
    search_spread = (relative_spread([float(search_value), float(values[0])])
                     if n == 1 and search_value else None)
    if n == 1 and policy.search_agrees:
        # one re-measurement confirms when the search measurement agrees with it (a second one otherwise,
        # also when there is no search value to agree with)
        if n >= policy.min_rounds and search_spread is not None and search_spread <= policy.tolerance:
            return "confirmed", ""
    # one value confirms only under a one-round policy (n >= min_rounds): nothing to disagree with
    elif n >= max(1, policy.min_rounds) and (n == 1 or spread <= policy.tolerance):
        return "confirmed", ""
    if rounds_done < policy.max_rounds:
        return "pending", ""
    if n == 0:
        return "unconfirmed", (f"re-measurement was {other_failure}" if other_failure else "no re-measurement")
    if n == 1 and policy.search_agrees and search_spread is not None and search_spread > policy.tolerance \
            and not other_failure:
        return "noisy", (f"its one re-measurement and its search measurement disagree: spread "
                         f"{search_spread:.0%} > tolerance {policy.tolerance:.0%}")
    if n == 1:
        return "noisy", f"only one re-measurement succeeded ({other_failure or 'the others failed'})"
    return "noisy", (f"re-measurements disagree: spread {spread:.0%} > tolerance {policy.tolerance:.0%} "
                     f"after {rounds_done} rounds")


def interleaved_order(keys: Sequence[str], round_index: int) -> list[str]:
    """The order of one round: the list rotated by the round number (each candidate leads a round)."""
    if not keys:
        return []
    k = round_index % len(keys)
    return list(keys[k:]) + list(keys[:k])


def numerics_levers(candidate: dict[str, Any] | None, reference: dict[str, Any] | None) -> int:
    """How many numerics-changing levers differ from ``reference`` (the baseline)."""
    if not candidate:
        return 0
    ref = reference or {}
    return sum(1 for k in NUMERICS_LEVERS if k in ref and candidate.get(k) != ref.get(k))


def overlaps(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def _paired(a: dict[Any, float] | None, b: dict[Any, float] | None,
            a_loaded: Sequence[Any] = (), b_loaded: Sequence[Any] = ()) -> list[float]:
    """a/b in the rounds where both were measured alike. ``a_loaded``/``b_loaded``: the rounds in which the load
    monitor saw other work during that side's measurement. The rounds clean on both sides pair; where there
    is none, the rounds loaded on both (other work hit both); a spoiled value is never weighed against a clean
    one (a lone clean value of the winner over a baseline measured only under load had made an 11x
    "speed-up" of two configurations 4 % apart)."""
    if not a or not b:
        return []
    common = [r for r in a if r in b]
    a_bad, b_bad = set(a_loaded), set(b_loaded)
    rounds = [r for r in common if r not in a_bad and r not in b_bad]
    if not rounds:
        rounds = [r for r in common if r in a_bad and r in b_bad]
    return [a[r] / b[r] for r in rounds if b[r] > 0]


def _clean(by_round: dict[Any, float], loaded: Sequence[Any]) -> bool:
    """Whether any round was measured free of other load (then the entry's figure is from those alone)."""
    return bool(set(by_round) - set(loaded))


def _loads(e: dict[str, Any] | None) -> list[Any]:
    return list((e or {}).get("loaded_rounds") or ())


def only_loaded(e: dict[str, Any]) -> bool:
    """Every re-measurement of the entry ran while other work loaded the machine."""
    rounds = e.get("by_round") or {}
    return bool(rounds) and not _clean(rounds, _loads(e))


def choose_winner(entries: list[dict[str, Any]], reference: dict[str, Any] | None = None, *, ties: bool = True,
                  baseline_key: str | None = None, search_tolerance: float | None = None,
                  tolerance: float = 0.25) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The winner among ranked entries and the entries indistinguishable from the leader.

    An entry needs ``status`` in (confirmed, noisy), ``median_tokens_per_s``, ``range`` and
    ``peak_mem_bytes``; with ``by_round`` ({round: tok/s}) comparisons are *paired*: candidates
    measured in the same round saw the same load, so the leader is the best median of the per-round
    ratios to the baseline (``baseline_key``, re-measured every round), and another candidate ties
    with it when it beat the leader in at least one round, its median ratio to the leader is within
    ``tolerance`` (the policy's noise tolerance) and its figure is too (or their ranges overlap): one lucky round
    is not a tie (it had made a configuration re-measured at 0.07x the others the answer, on memory).
    Without rounds in common, ranges
    [min, max] that overlap are a tie. ``search_tolerance`` (a GPU's policy, ``ConfirmPolicy.search_agrees``:
    its tolerance; None: off): with fewer than two rounds in common the search measurements are a second
    ordering, and a candidate whose search measurement was at least the leader's ties with it too, when both
    search values agreed with their own re-measurements within that tolerance (a value the confirmation
    rejected orders nothing) and the leader's lead in the rounds in common is within it (beyond it the
    side-by-side round decides).
    The search values never enter a figure. Returns (winner, tie group incl. the winner; empty if no tie).
    """
    eligible = [e for e in entries if e.get("status") in ("confirmed", "noisy") and e.get("median_tokens_per_s")]
    if not eligible:
        return None, []
    base = next((e for e in entries if baseline_key is not None and e.get("key") == baseline_key), None)

    def strength(e: dict[str, Any]) -> float:
        ratios = _paired(e.get("by_round"), base.get("by_round") if base else None, _loads(e), _loads(base))
        return median(ratios) if ratios else float(e["median_tokens_per_s"]) / _base_median(base)

    leader = max(eligible, key=lambda e: (strength(e), e["median_tokens_per_s"]))
    if not ties:
        return leader, []

    def tied_with_leader(e: dict[str, Any]) -> bool:
        if e is leader:
            return True
        ratios = _paired(e.get("by_round"), leader.get("by_round"), _loads(e), _loads(leader))
        if (search_tolerance is not None and len(ratios) < 2 and _search_beats(e, leader, search_tolerance)
                and (not ratios or 1.0 / min(ratios) <= 1.0 + search_tolerance)):
            return True  # the search measurements ordered them the other way, within the noise
        ranges = overlaps(tuple(e["range"]) if e.get("range") else None,
                          tuple(leader["range"]) if leader.get("range") else None)
        if ratios:
            # paired evidence that does not exclude a tie, and figures that do not either (a round or two
            # measured alike can be an outlier's: a configuration whose every figure was far behind is no tie)
            close = ranges or float(e["median_tokens_per_s"]) * (1.0 + tolerance) >= float(leader["median_tokens_per_s"])
            return close and max(ratios) >= 1.0 and median(ratios) * (1.0 + tolerance) >= 1.0
        return ranges

    tied = [e for e in eligible if tied_with_leader(e)]
    if len(tied) == 1:
        return leader, []

    def key(e: dict[str, Any]) -> tuple[bool, int, float, float]:
        peak = e.get("peak_mem_bytes")
        return (only_loaded(e), numerics_levers(e.get("candidate"), reference),
                float(peak) if peak is not None else float("inf"), -strength(e))

    # (a tolerance on the memory step, peaks within 3 % as one footprint, was tried: the replays moved both ways,
    # the default walk's pick worse on landscape D: benchmarks/README.md)
    winner = min(tied, key=key)
    return winner, tied


def _search_beats(e: dict[str, Any], leader: dict[str, Any], tolerance: float) -> bool:
    """Whether ``e``'s search measurement was at least the leader's, both agreeing with their re-measurements."""
    mine, theirs = e.get("search_tokens_per_s"), leader.get("search_tokens_per_s")
    return (bool(mine and theirs) and float(mine) >= float(theirs)
            and _search_agreed(e, tolerance) and _search_agreed(leader, tolerance))


def _search_agreed(e: dict[str, Any], tolerance: float) -> bool:
    values = [float(v) for v in e.get("confirm_tokens_per_s") or e.get("measurements") or [] if v]
    search = e.get("search_tokens_per_s")
    return bool(values and search) and relative_spread([float(search), median(values)]) <= tolerance


def _base_median(base: dict[str, Any] | None) -> float:
    v = base.get("median_tokens_per_s") if base else None
    return float(v) if v else 1.0


def speedup(best_values: Sequence[float], base_values: Sequence[float], *,
            best_by_round: dict[Any, float] | None = None, base_by_round: dict[Any, float] | None = None,
            best_loaded: Sequence[Any] = (), base_loaded: Sequence[Any] = (),
            search_ratio: float | None = None) -> dict[str, Any] | None:
    """best / baseline, with the range the measurements allow.

    With values per round (measured side by side), the ratio is the median of the per-round ratios
    and the range their min..max (a round under other load on one side only does not pair: ``best_loaded``,
    ``base_loaded``); otherwise the ratio of the medians and min/max over max/min. A single paired round
    alone would call any ratio but exactly 1 distinguishable, so its range is widened by what else was
    measured: the unpaired min/max over max/min of the values (where load left other rounds unpaired) and
    ``search_ratio`` (a GPU's policy: the two search measurements' ratio, as a second round would). Neither
    enters the ratio.
    """
    ratios = _paired(best_by_round, base_by_round, best_loaded, base_loaded)
    b, r = [float(v) for v in best_values if v], [float(v) for v in base_values if v]
    if ratios:
        bounds = list(ratios)
        if len(ratios) < 2:
            bounds += [float(search_ratio)] if search_ratio else []
            bounds += [min(b) / max(r), max(b) / min(r)] if b and r else []
        return {"ratio": median(ratios), "range": [min(bounds), max(bounds)], "paired_rounds": len(ratios),
                "distinguishable": min(bounds) > 1.0 or max(bounds) < 1.0}
    if not b or not r:
        return None
    if best_by_round and base_by_round and _clean(best_by_round, best_loaded) != _clean(base_by_round, base_loaded):
        return None  # one side's figure is from clean rounds, the other's from loaded ones: no like for like
    ratio = median(b) / median(r)
    lo, hi = min(b) / max(r), max(b) / min(r)
    return {"ratio": ratio, "range": [lo, hi], "paired_rounds": 0, "distinguishable": lo > 1.0 or hi < 1.0}
