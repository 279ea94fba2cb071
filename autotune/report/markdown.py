"""``report.md``: the top configurations side by side, the best vs the HF default, failures.  [pure]

Every value taken from the run (model name, reasons, statuses, candidate fields) is HTML-escaped
and kept on one line: Markdown renderers pass raw HTML through, as ``report.html`` would not.
"""

from __future__ import annotations

import dataclasses
import html
from collections import Counter
from typing import Any

from autotune.spec.baseline import HF_DEFAULT_MICRO_BATCH
from autotune.spec.budget import format_bytes
from autotune.spec.probe_request import STATUSES, Candidate
from autotune.spec.result import ProbeResult
from autotune.spec.trial import candidate_id

__all__ = ["HF_DEFAULT_DESCRIPTION", "render_report_md", "levers", "effective_batch_text", "step_counts_text",
           "baseline_not_run", "recorded_peak", "remeasured_figure", "versus_figures", "one_figure", "ranked_by_figure"]

HF_DEFAULT_DESCRIPTION = (
    f"per_device_train_batch_size {HF_DEFAULT_MICRO_BATCH} (or the largest micro-batch under it that divides the "
    "effective batch) with accumulation keeping the same effective batch, "
    "no activation checkpointing, sdpa attention, bf16 on a GPU whose search space has it (like with like) and "
    "fp32 otherwise, "
    "0 data-loader workers, no packing, fused AdamW (TrainingArguments' defaults; "
    "see autotune.spec.baseline.hf_default_candidate)"
)

_STATUS_MEANING = {
    "ok": "measured, fits",
    "oom": "out of memory",
    "over_budget": "ran, peak above the budget",
    "unsupported": "not possible here",
    "timeout": "probe timed out",
    "crash": "probe crashed",
}


def candidate_of(r: ProbeResult) -> Candidate | None:
    """The probe's candidate, or None for a malformed stored request."""
    try:
        return r.probe_request().candidate
    except Exception:  # a malformed stored request should not break the whole report
        return None


def effective_batch_text(c: Candidate) -> str:
    return (
        f"{c.micro_batch} × {c.grad_accum} × {c.world_size} = {c.micro_batch * c.grad_accum * c.world_size}"
    )


def step_counts_text(r: ProbeResult | None) -> str:
    """What the measured optimizer steps held: ``16 sequences (16–16), 1,234 real tokens`` (means)."""
    m = r.metrics if r is not None else {}
    mean = m.get("sequences_per_step_mean")
    if mean is None:
        return "n/a"
    lo, hi = m.get("sequences_per_step_min"), m.get("sequences_per_step_max")
    text = f"{mean:,.4g} sequences" + (f" ({lo}–{hi})" if lo != hi else "")
    tokens = m.get("tokens_per_step_mean")
    if tokens is not None:
        text += f", {tokens:,.0f} real tokens"
    return text


def levers(c: Candidate) -> str:
    """The choices besides the batch, in a short human form."""
    parts = [c.precision, c.attn, "ckpt" if c.grad_ckpt else "no ckpt", f"workers {c.workers}"]
    if not c.pin_memory:
        parts.append("no pin")
    if c.packing:
        parts.append("packing")
    parts.append(c.optim)
    if c.zero_stage:
        z = (
            f"ZeRO-{c.zero_stage}"
            if c.sharding == "deepspeed"
            else f"FSDP({'full' if c.zero_stage == 3 else 'grad+opt'})"
        )
        if c.offload != "none":
            z += f" offload {c.offload}"
        parts.append(z)
    if c.torch_compile:
        parts.append("compile")
    if c.liger:
        parts.append("liger")
    return ", ".join(parts)


def _tok_s(r: ProbeResult) -> str:
    v = r.tokens_per_s
    if v is None:
        return "n/a"
    spread = r.metrics.get("step_time_spread")
    if isinstance(spread, (int, float)):
        return f"{v:,.0f} ± {spread * 50:.0f}%"
    return f"{v:,.0f}"


SEARCH_PROBE = "search probe"


def _entry_key(e: dict[str, Any]) -> str | None:
    """The configuration id of an entry of ``summary["top"]``: from its candidate (summary.json's entries carry no
    key of their own; they were matched by one, so a report never found a re-measured median)."""
    if e.get("key"):
        return str(e["key"])
    cand = e.get("candidate")
    if not isinstance(cand, dict):
        return None
    try:
        return candidate_id(Candidate(**cand))
    except (TypeError, ValueError):
        return None


def one_figure(r: ProbeResult, summary: dict[str, Any]) -> tuple[float | None, str]:
    """The one tok/s figure every table of a report shows for a configuration, and where it comes from:
    its median re-measured in the confirmation rounds where the run has one (``summary["top"]``), else its
    single search probe's figure (``SEARCH_PROBE``)."""
    c = candidate_of(r)
    if c is not None:
        key = candidate_id(c)
        for e in summary.get("top") or []:
            if isinstance(e, dict) and _entry_key(e) == key and isinstance(e.get("median_tokens_per_s"), (int, float)):
                n = len(e.get("measurements") or [])
                status = str(e.get("status") or "confirmed")
                return float(e["median_tokens_per_s"]), f"{status}: median of {n} re-measurements" if n else status
    return r.tokens_per_s, SEARCH_PROBE


def ranked_by_figure(results: list[ProbeResult], summary: dict[str, Any]) -> list[tuple[ProbeResult, float, str]]:
    """The configurations that fit, each with its one figure: the re-measured ones first, in the confirmation's
    order (``summary["top"]``: the chosen one first, as the console and summary.json have them, also where a tie
    went to a configuration with a lower median), then the rest by their search figure (two kinds of figure are
    never ranked against each other)."""
    order = {k: i for i, e in enumerate(summary.get("top") or []) if isinstance(e, dict) and (k := _entry_key(e))}
    rows = []
    for r in results:
        if not r.fits or r.tokens_per_s is None:
            continue
        tps, source = one_figure(r, summary)
        if tps is not None:
            rows.append((r, float(tps), source))

    def rank(t: tuple[ProbeResult, float, str]) -> tuple[bool, float, float]:
        c = candidate_of(t[0])
        at = order.get(candidate_id(c)) if c is not None and t[2] != SEARCH_PROBE else None
        return (t[2] == SEARCH_PROBE, float(at) if at is not None else float("inf"), -t[1])

    return sorted(rows, key=rank)


_REMEASURED = {"confirmed": "confirmed median", "noisy": "median of re-measurements that disagree"}


def remeasured_figure(summary: dict[str, Any], key: str) -> tuple[float, str] | None:
    """The median tok/s of the re-measurements the run recorded for ``best`` or ``baseline`` and what it is
    (confirmed, or noisy: the values disagree), or None where that side was not re-measured. Both columns of
    the comparison use it, so they hold the same kind of figure as summary.json and the speed-up line."""
    entry = summary.get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("tokens_per_s"), (int, float)):
        return None
    status = entry.get("confirm_status")
    return (float(entry["tokens_per_s"]), _REMEASURED[status]) if status in _REMEASURED else None


def versus_figures(summary: dict[str, Any], best: ProbeResult | None,
                   baseline: ProbeResult) -> tuple[float | None, str, float | None, str]:
    """The best's and the HF default's tok/s beside each other, and what each is: their re-measured medians
    (labelled by status) where both sides were re-measured, or the best's where the default does not fit; else
    both single search measurements (the best's labelled so, the default's label empty). A re-measured median
    beside a single search value is no comparison."""
    best_re, base_re = remeasured_figure(summary, "best"), remeasured_figure(summary, "baseline")
    if best_re is not None and (base_re is not None or not baseline.fits):
        return best_re[0], best_re[1], *(base_re or (baseline.tokens_per_s, ""))
    searched = (summary.get("best") or {}).get("search_tokens_per_s") or (best.tokens_per_s if best else None)
    return searched, "search measurement", baseline.tokens_per_s, ""


def recorded_peak(summary: dict[str, Any], key: str, result: ProbeResult) -> ProbeResult:
    """``result`` with the peak summary.json records for ``best`` or ``baseline`` (the highest over the search
    and the re-measurements: one figure per configuration wherever it is shown)."""
    entry = summary.get(key)
    return _with_peak(result, entry.get("peak_mem_bytes") if isinstance(entry, dict) else None)


def _with_peak(result: ProbeResult, peak: Any) -> ProbeResult:
    if not isinstance(peak, int) or peak == result.peak_mem_bytes:
        return result
    return dataclasses.replace(result, metrics={**result.metrics, "peak_mem_bytes": peak})


def _budget(r: ProbeResult, summary: dict[str, Any]) -> int | None:
    b = r.metrics.get("budget_bytes") or summary.get("budget_bytes")
    return int(b) if b else None


def _mem(r: ProbeResult, summary: dict[str, Any]) -> str:
    peak = r.peak_mem_bytes
    budget = _budget(r, summary)
    if peak is None:
        return "n/a"
    if budget:
        return f"{format_bytes(peak)} / {format_bytes(budget)} ({100 * peak / budget:.0f}%)"
    return format_bytes(peak)


def baseline_not_run(result: ProbeResult) -> str:
    """Why the HF default has no figure, by its status (plain text): only a memory failure is "not within the
    budget"; a crash or a timeout says nothing about the budget."""
    why = " ".join((result.reason or "").split())[:200]
    if result.status in ("oom", "over_budget"):
        return f"The HF default does not run within the budget ({result.status})."
    if result.status == "timeout":
        return "The HF default did not finish within its probe's deadline (timeout), so there is no speedup to give."
    if result.status == "unsupported":
        return f"The HF default cannot run here ({why or 'unsupported'})."
    return (f"The HF default's probe {result.status}ed" if result.status == "crash" else
            f"The HF default's probe ended {result.status}") + (f" ({why})" if why else "") + \
        ", so there is no speedup to give; this is not a budget failure."


def _esc(text: Any) -> str:
    """Run data as Markdown text: HTML escaped (Markdown renderers pass raw HTML through), one line."""
    return html.escape(" ".join(str(text).split()), quote=False)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(_esc(c).replace("|", "\\|") for c in cells) + " |"


def render_report_md(
    summary: dict[str, Any],
    results: list[ProbeResult],
    *,
    baseline: ProbeResult | None,
    best: ProbeResult | None = None,
    top: int = 5,
) -> str:
    """Markdown for one run. ``summary``: the run's summary.json (keys read when present).

    ``best`` is the configuration the run chose (on confirmed medians); without it, the fastest
    single measurement among ``results``. The best-vs-default comparison uses the confirmed medians
    of ``summary["best"]``/``summary["baseline"]`` when the run recorded them.
    """
    out = _header_section(summary)
    ranked = ranked_by_figure(results, summary)
    if best is None or not best.fits:
        best = ranked[0][0] if ranked else None
    out += _top_section(summary, ranked, top)
    out += _lever_decisions_section(summary)
    out += _versus_default_section(summary, best, baseline)
    out += _confirmation_section(summary)
    out += _status_section(summary, results)
    return "\n".join(out) + "\n"


def _header_section(summary: dict[str, Any]) -> list[str]:
    """The title, the run's facts in one sentence, and its quality notes."""
    out: list[str] = []
    title = summary.get("run_id") or summary.get("model") or "run"
    out.append(f"# autotune report: {_esc(title)}")
    facts = []
    for key, label in (
        ("model", "model"),
        ("mode", "mode"),
        ("trainer", "trainer"),
        ("seq_len", "sequence length"),
        ("gpu_budget", "budget"),
        ("device", "device"),
        ("cuda_alloc_conf", "PYTORCH_CUDA_ALLOC_CONF"),
    ):
        if summary.get(key) not in (None, ""):
            facts.append(f"{label} {_esc(summary[key])}")
    if summary.get("wall_s") is not None:
        facts.append(f"search wall time {float(summary['wall_s']):.0f} s")
    if facts:
        out.append("")
        out.append(", ".join(facts) + ".")
    for note in summary.get("quality_notes") or []:  # e.g. TRL's packing (--trainer trl)
        out += ["", f"**Quality note:** {_esc(note)}"]
    return out


def _top_section(
    summary: dict[str, Any], ranked: list[tuple[ProbeResult, float, str]], top: int
) -> list[str]:
    """The ``top`` configurations that fit, by their one figure."""
    out = ["", "## Top configurations", ""]
    if not ranked:
        out.append("No configuration fits the budget.")
        return out
    out.append("tok/s counts real tokens only: the median of the confirmation's re-measurements where the "
               "run has them, else the single search probe's figure (± is half the p10–p90 spread of its "
               "step time); the re-measured configurations come first.")
    out.append("")
    out.append(
        _row(["#", "tok/s", "figure", "peak memory / budget", "effective batch (mb × accum × world)", "levers"])
    )
    out.append(_row(["---"] * 6))
    peaks = {_entry_key(e): e.get("peak_mem_bytes") for e in summary.get("top") or [] if isinstance(e, dict)}
    for i, (r, tps, source) in enumerate(ranked[:top], 1):
        c = candidate_of(r)
        if c is not None and source != SEARCH_PROBE:  # the highest over its measurements, as summary.json
            r = _with_peak(r, peaks.get(candidate_id(c)))
        out.append(
            _row(
                [
                    str(i),
                    _tok_s(r) if source == SEARCH_PROBE else f"{tps:,.0f}",
                    _esc(source),
                    _mem(r, summary),
                    effective_batch_text(c) if c else "n/a",
                    levers(c) if c else "n/a",
                ]
            )
        )
    return out


def _lever_decisions_section(summary: dict[str, Any]) -> list[str]:
    """``--strategy model``: each lever of the winner changed alone, and whether a probe or the model decided it."""
    rows = summary.get("lever_decisions") or []
    if not rows:
        return []
    out = ["", "## How each lever was decided", "",
           "The winner with one lever changed: measured by a probe, or predicted by the model fitted to the run's "
           "probes (its tok/s relative to the winner's, ± the prediction's deviation, and its chance to fit).", "",
           _row(["lever", "value", "decided by", "tok/s vs the winner", "fits"]), _row(["---"] * 5)]
    for d in rows:
        ratio = d.get("ratio")
        if d.get("decided_by") == "model":
            figure = f"{ratio:.2f}× ± {100 * (d.get('sd') or 0.0):.0f} %" if ratio is not None else "n/a"
            fits = f"{100 * (d.get('fit_chance') or 0.0):.0f} % chance"
        else:
            figure = f"{ratio:.2f}× (measured)" if ratio is not None else "n/a"
            fits = "yes" if d.get("status") == "ok" else _esc(str(d.get("status")))
        out.append(_row([_esc(str(d.get("lever"))), _esc(str(d.get("value"))), _esc(str(d.get("decided_by"))),
                         figure, fits]))
    return out


def _versus_default_section(
    summary: dict[str, Any], best: ProbeResult | None, baseline: ProbeResult | None
) -> list[str]:
    """The best configuration next to the HF default, and the speedup between them."""
    out = ["", "## Best vs the HF default", "", f"HF default: {HF_DEFAULT_DESCRIPTION}.", ""]
    if baseline is None:
        out.append("The HF default was not measured in this run.")
    elif best is None:
        out.append(
            f"HF default: {_esc(baseline.status)} "
            f"({_esc(baseline.reason or _STATUS_MEANING.get(baseline.status, ''))})."
        )
    else:
        out += _versus_default_table(summary, best, baseline)
    return out


def _versus_default_table(summary: dict[str, Any], best: ProbeResult, baseline: ProbeResult) -> list[str]:
    bc, hc = candidate_of(best), candidate_of(baseline)
    best, baseline = recorded_peak(summary, "best", best), recorded_peak(summary, "baseline", baseline)
    out = [_row(["", "best", "HF default"]), _row(["---"] * 3)]
    base_tok = (
        _tok_s(baseline)
        if baseline.fits
        else f"{baseline.status}: {baseline.reason or _STATUS_MEANING.get(baseline.status, '')}"
    )
    best_tps, best_what, base_tps, base_what = versus_figures(summary, best, baseline)
    if baseline.fits and base_what:
        base_tok = f"{base_tps:,.0f} ({base_what})"
    best_tok = f"{best_tps:,.0f} ({best_what})" if best_tps else "n/a"
    out.append(_row(["tok/s", best_tok, base_tok]))
    out.append(_row(["peak memory / budget", _mem(best, summary), _mem(baseline, summary)]))
    out.append(
        _row(
            [
                "effective batch",
                effective_batch_text(bc) if bc else "n/a",
                effective_batch_text(hc) if hc else "n/a",
            ]
        )
    )
    out.append(_row(["per optimizer step (measured)", step_counts_text(best), step_counts_text(baseline)]))
    out.append(_row(["levers", levers(bc) if bc else "n/a", levers(hc) if hc else "n/a"]))
    out.append("")
    speedup = _speedup_line(summary, baseline, best_tps, base_tps, remeasured=bool(base_what))
    if speedup is not None:
        out.append(speedup)
    return out


def _speedup_line(
    summary: dict[str, Any], baseline: ProbeResult, best_tps: float | None, base_tps: float | None,
    remeasured: bool = False,
) -> str | None:
    """The best's throughput as a multiple of the HF default's, or why there is none (``remeasured``: both
    figures are medians of re-measurements)."""
    ratio = summary.get("speedup_vs_baseline")
    if baseline.fits and isinstance(ratio, (int, float)):
        lo, hi = summary.get("speedup_range") or (None, None)
        rng = f" (measured range {lo:.2f}–{hi:.2f}×)" if lo is not None else ""
        return (f"**{ratio:.2f}×** the HF default's throughput{rng}, from medians re-measured side by side."
                + ("" if summary.get("speedup_distinguishable", True)
                   else " The ranges overlap: not distinguishable within the measured noise."))
    if baseline.fits and remeasured and summary.get("speedup_note"):  # medians measured under unlike load
        return "No speed-up: " + _esc(str(summary["speedup_note"])[:300]) + "."
    if baseline.fits and base_tps and best_tps:
        return (f"{best_tps / base_tps:.2f}× the HF default's throughput (single measurements, not "
                "re-measured side by side: treat as indicative).")
    if not baseline.fits:
        return _esc(baseline_not_run(baseline))
    return None


def _status_section(summary: dict[str, Any], results: list[ProbeResult]) -> list[str]:
    """How many probes ended in each status, and which proposer the probes (and the answer) came from."""
    counts = Counter(r.status for r in results)
    inferred = sum(1 for r in results if r.metrics.get("inferred"))
    out = ["", "## Probes by status", "", _row(["status", "count", "meaning"]), _row(["---"] * 3)]
    for s in STATUSES:
        if counts.get(s):
            out.append(_row([s, str(counts[s]), _STATUS_MEANING[s]]))
    out.append(_row(["total", str(len(results)), f"{inferred} inferred without running" if inferred else ""]))
    origins = summary.get("probes_by_origin") or {}
    if origins:
        found = (summary.get("best") or {}).get("origin")
        found = _esc(found) if found else found
        parts = ", ".join(f"{_esc(n)} {_esc(o)}" for o, n in sorted(origins.items(), key=lambda kv: -kv[1]))
        out += ["", f"Proposed by: {parts} (seed: expert defaults; boundary/neighbour/combination: the "
                    f"neighbourhood walk; tpe: Optuna's sampler)" + (f"; the answer came from: {found}." if found else ".")]
    return out


def _confirmation_section(summary: dict[str, Any]) -> list[str]:
    """How the figures were confirmed: rounds, every value, verdicts, ties, load warnings."""
    top = summary.get("top") or []
    policy = (summary.get("search") or {}).get("confirm") or {}
    warnings = summary.get("warnings") or []
    trust = summary.get("trust") or {}
    if not top and not warnings:
        return []
    out = ["", "## Confirmation", ""]
    if policy:
        out.append(
            f"The top configurations and the HF default were re-measured in interleaved rounds "
            f"({policy.get('min_rounds')} to {policy.get('max_rounds')}); a figure is the median of its "
            f"re-measurements only (the search measurement that selected it is left out) and is *confirmed* "
            f"when they agree within {100 * float(policy.get('tolerance') or 0):.0f}% (max − min over median)"
            + ("; a single re-measurement confirms when the search measurement agrees with it within that "
               "tolerance, and a configuration whose search measurement was at least the leader's (both "
               "agreeing with their re-measurements, the leader's lead within the tolerance) is "
               "indistinguishable from it." if policy.get("search_agrees") else ".")
        )
        out.append("")
    if top:
        out.append(_row(["config", "status", "median tok/s", "range", "values", "search value"]))
        out.append(_row(["---"] * 6))
        for e in top:
            rng = e.get("range")
            vals = ", ".join(f"{float(v):,.0f}" for v in e.get("measurements") or [])
            st = str(e.get("status", "")) + (" (tie)" if e.get("indistinguishable") else "")
            out.append(_row([
                str(e.get("label", "")), st,
                f"{float(e['median_tokens_per_s']):,.0f}" if e.get("median_tokens_per_s") else "n/a",
                f"{float(rng[0]):,.0f}–{float(rng[1]):,.0f}" if rng else "n/a", vals or "n/a",
                f"{float(e['search_tokens_per_s']):,.0f}" if e.get("search_tokens_per_s") else "n/a",
            ]))
    if summary.get("tie"):
        out += ["", f"Indistinguishable within the measured noise from the chosen one: {', '.join(summary['tie'])}; "
                    "the tie went to a configuration with a re-measurement free of other load, then to fewer "
                    "numerics-changing levers, then the smaller memory footprint."]
    if warnings:
        out += ["", f"**Load warnings** ({len(warnings)}): other work shared the machine while probes ran, so "
                    "these figures may be low or spread:", ""]
        for w in warnings[:20]:
            out.append(f"- {w.get('message', '')}" + (f" ({w['label']})" if w.get("label") else ""))
        if len(warnings) > 20:
            out.append(f"- ... and {len(warnings) - 20} more (summary.json)")
    if trust.get("doubtful"):
        out += ["", f"**Doubtful answer**: {'; '.join(trust.get('reasons') or [])}. `autotune run --strict` exits 5 "
                    "on such an answer."]
    return out
