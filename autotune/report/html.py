"""``report.html``: one self-contained page with plots (plotly.js inlined: it works offline).  [pure render]

Sections: the chosen configuration and its diagnosis; best vs the HF default; tokens/s against
micro-batch per family of the other choices; peak memory against the budget; the feasible /
infeasible map; parameter importance (method stated); GPU-hours and cost per 1B tokens; which
levers keep the training math identical; every probe with its diagnosis.
"""

from __future__ import annotations

import html as _html
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from autotune.diagnose import MFU_CONVENTION, Diagnosis, Finding
from autotune.report._model import (
    ReportModel,
    candidate_of,
    cost_rows,
    family_of,
    lever_rows,
    short_label,
)
from autotune.report.diagnosis import fmt_mfu, fmt_util
from autotune.report.markdown import (
    HF_DEFAULT_DESCRIPTION,
    baseline_not_run,
    effective_batch_text,
    levers,
    recorded_peak,
    step_counts_text,
    versus_figures,
)
from autotune.spec.baseline import hf_default_candidate
from autotune.spec.budget import format_bytes
from autotune.spec.result import ProbeResult

__all__ = ["render_html", "STATUS_COLORS"]

STATUS_COLORS = {
    "ok": "#2ca02c",
    "over_budget": "#ff7f0e",
    "oom": "#d62728",
    "unsupported": "#7f7f7f",
    "timeout": "#9467bd",
    "crash": "#8c564b",
}
GiB = float(2**30)
MAX_FAMILIES = 12

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;
padding:16px 24px;color:#222;background:#fff}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#666;font-size:.9em}.finding{margin:.3em 0}.sev-high{border-left:4px solid #d62728;padding-left:8px}
.sev-medium{border-left:4px solid #ff7f0e;padding-left:8px}.sev-info{border-left:4px solid #1f77b4;padding-left:8px}
.same{color:#2ca02c;font-weight:600}.changes{color:#d62728;font-weight:600}.diff{background:#fff7e0}
.st{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-size:.85em}
"""


def _e(text: Any) -> str:
    return _html.escape(str(text), quote=True)


def _tps(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def _status(s: str) -> str:
    return f'<span class="st" style="background:{STATUS_COLORS.get(s, "#444")}">{_e(s)}</span>'


def _table(
    head: Sequence[str], rows: Sequence[Sequence[str]], *, raw: bool = False, num: Sequence[int] = ()
) -> str:
    """An HTML table (no header row when ``head`` is empty); cells are escaped unless ``raw``."""
    out = ["<table>"]
    if head:
        out += ["<thead><tr>", *(f"<th>{_e(h)}</th>" for h in head), "</tr></thead>"]
    out.append("<tbody>")
    for row in rows:
        out.append("<tr>")
        for i, cell in enumerate(row):
            cls = ' class="num"' if i in num else ""
            out.append(f"<td{cls}>{cell if raw else _e(cell)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _finding_divs(findings: Sequence[Finding]) -> str:
    return "".join(
        f'<div class="finding sev-{_e(f.severity)}"><b>{_e(f.bottleneck)}</b>: {_e(f.evidence)}.<br>'
        f"<i>Fix:</i> {_e(f.fix)}.</div>"
        for f in findings
    )


def _findings_html(d: Diagnosis | None) -> str:
    if d is None:
        return "<p>No configuration was chosen.</p>"
    if not d.findings:
        return "<p>No bottleneck found in the evidence this probe recorded.</p>"
    return _finding_divs(d.findings)


# ------------------------------------------------------------------------------------ figures


def _fig_html(fig: Any, div_id: str, height: int = 460) -> str:
    fig.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 50, "b": 50}, height=height)
    return str(
        fig.to_html(
            full_html=False,
            include_plotlyjs=False,  # inlined once in <head>
            div_id=div_id,
            config={"displaylogo": False, "responsive": True},
        )
    )


def _fig_throughput(model: ReportModel) -> str | None:
    import plotly.graph_objects as go  # type: ignore[import-untyped]

    by_family: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in model.ok:
        c = candidate_of(r)
        if c is not None and r.tokens_per_s:
            by_family[family_of(c)][c.micro_batch].append(r.tokens_per_s)
    if not by_family:
        return None
    ranked = sorted(by_family.items(), key=lambda kv: -max(max(v) for v in kv[1].values()))
    fig = go.Figure()
    for fam, points in ranked[:MAX_FAMILIES]:
        xs = sorted(points)
        ys = [sorted(points[x])[len(points[x]) // 2] for x in xs]
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines+markers", name=fam, hovertemplate="mb %{x}: %{y:,.0f} tok/s")
        )
    title = "Tokens/s (real tokens) vs micro-batch, one line per family of the other choices"
    if len(ranked) > MAX_FAMILIES:
        title += f" (fastest {MAX_FAMILIES} of {len(ranked)} families)"
    fig.update_layout(title=title, xaxis_title="micro-batch (per device)", yaxis_title="tokens/s",
                      legend={"font": {"size": 10}})  # fmt: skip
    fig.update_xaxes(type="log", dtick=0.30103, tickformat="d")
    return _fig_html(fig, "fig-throughput")


def _fig_memory(model: ReportModel) -> str | None:
    import plotly.graph_objects as go

    pts: dict[str, tuple[list[int], list[float], list[str]]] = {}
    for r in model.results:
        c = candidate_of(r)
        if c is None or not r.peak_mem_bytes:
            continue
        xs, ys, ts = pts.setdefault(r.status, ([], [], []))
        xs.append(c.micro_batch)
        ys.append(r.peak_mem_bytes / GiB)
        ts.append(short_label(c))
    if not pts:
        return None
    fig = go.Figure()
    for status, (xs, ys, ts) in pts.items():
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="markers", name=status, text=ts,
                       marker={"color": STATUS_COLORS.get(status, "#444"), "size": 10, "opacity": 0.8},
                       hovertemplate="%{text}<br>peak %{y:.2f} GiB")
        )  # fmt: skip
    budget, usable = model.budget_bytes, model.usable_bytes
    if budget:
        fig.add_hline(y=budget / GiB, line={"color": "#d62728", "dash": "solid"},
                      annotation_text=f"budget {format_bytes(budget)}", annotation_position="top left")  # fmt: skip
    if usable and usable != budget:
        fig.add_hline(y=usable / GiB, line={"color": "#ff7f0e", "dash": "dash"},
                      annotation_text=f"usable {format_bytes(usable)}", annotation_position="bottom left")  # fmt: skip
    fig.update_layout(title="Peak memory per probe against the budget", xaxis_title="micro-batch (per device)",
                      yaxis_title="peak memory (GiB)")  # fmt: skip
    fig.update_xaxes(type="log", dtick=0.30103, tickformat="d")
    return _fig_html(fig, "fig-memory")


def _fig_feasibility(model: ReportModel) -> str | None:
    import plotly.graph_objects as go

    cells: dict[tuple[str, bool], tuple[list[str], list[str], list[str]]] = {}
    families: dict[str, float] = {}
    for r, inferred in [(r, False) for r in model.results] + [(r, True) for r in model.inferred]:
        c = candidate_of(r)
        if c is None:
            continue
        fam = family_of(c)
        families[fam] = max(families.get(fam, 0.0), r.tokens_per_s or 0.0)
        xs, ys, ts = cells.setdefault((r.status, inferred), ([], [], []))
        xs.append(str(c.micro_batch))
        ys.append(fam)
        ts.append(r.reason[:120] if r.reason else r.status)
    if not cells:
        return None
    fig = go.Figure()
    for (status, inferred), (xs, ys, ts) in sorted(cells.items()):
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="markers", name=status + (" (inferred)" if inferred else ""), text=ts,
                       marker={"symbol": "square-open" if inferred else "square", "size": 18,
                               "color": STATUS_COLORS.get(status, "#444"), "line": {"width": 2}},
                       hovertemplate="mb %{x} · %{y}<br>%{text}")
        )  # fmt: skip
    mbs = sorted({int(x) for xs, _, _ in cells.values() for x in xs})
    order = sorted(families, key=lambda f: families[f])
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=[str(m) for m in mbs],
                     title="micro-batch (per device)")  # fmt: skip
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=order, automargin=True,
                     tickfont={"size": 10})  # fmt: skip
    fig.update_layout(title="Feasible / infeasible map: status by configuration")
    return _fig_html(fig, "fig-feasibility", height=max(360, 120 + 28 * len(order)))


def _fig_importance(model: ReportModel) -> str | None:
    import plotly.graph_objects as go

    values = model.importance.values
    if not values:
        return None
    names = list(values)[::-1]
    fig = go.Figure(go.Bar(x=[values[n] for n in names], y=names, orientation="h", marker={"color": "#1f77b4"},
                           hovertemplate="%{y}: %{x:.2f}"))  # fmt: skip
    fig.update_layout(title="Parameter importance", xaxis_title="importance")
    fig.update_yaxes(automargin=True)
    return _fig_html(fig, "fig-importance", height=max(300, 100 + 30 * len(names)))


# ------------------------------------------------------------------------------------ sections


def _facts(model: ReportModel) -> str:
    s = model.summary
    facts = []
    for key, label in (("model", "model"), ("mode", "mode"), ("seq_len", "sequence length"),
                       ("effective_batch", "effective batch"), ("gpu_budget", "budget"), ("device", "device"),
                       ("cuda_alloc_conf", "PYTORCH_CUDA_ALLOC_CONF")):  # fmt: skip
        if s.get(key) not in (None, ""):
            facts.append(f"{label} <b>{_e(s[key])}</b>")
    if model.device_name:
        card = f" (catalog: {_e(model.gpu.name)})" if model.gpu else ""
        facts.append(f"ran on <b>{_e(model.device_name)}</b>{card}")
    if s.get("wall_s") is not None:
        facts.append(f"search wall time {float(s['wall_s']):.0f} s")
    facts.append(f"{len(model.results)} probes")
    return "<p>" + ", ".join(facts) + ".</p>"


def _chosen_section(model: ReportModel) -> str:
    chosen = model.chosen()
    if chosen is None:
        head = "<h2>Chosen configuration</h2><p><b>No configuration fits the budget.</b></p>"
        return head + _finding_divs(model.diagnosis.findings)
    c = candidate_of(chosen)
    tps = chosen.metrics.get("confirmed_tokens_per_s") or chosen.tokens_per_s
    peak, budget = chosen.peak_mem_bytes, model.budget_bytes
    mem = format_bytes(peak) if peak else "n/a"
    if peak and budget:
        mem += f" of {format_bytes(budget)} ({100 * peak / budget:.0f}%)"
    mfu = (
        model.best_mfu
        if model.best is not None
        else (model.diagnosis.chosen.mfu if model.diagnosis.chosen else None)
    )
    rows = [
        ["configuration", short_label(c)],
        ["effective batch (micro-batch × accumulation × GPUs)", effective_batch_text(c) if c else "n/a"],
        ["per optimizer step (measured: sequences, real tokens)", step_counts_text(chosen)],
        ["tokens/s (real tokens)", _tps(float(tps) if tps else None)],
        ["peak memory", mem],
        ["MFU", fmt_mfu(mfu)],
    ]
    out = ["<h2>Chosen configuration</h2>", _table([], rows), "<h3>Diagnosis</h3>",
           _findings_html(model.diagnosis.chosen)]  # fmt: skip
    if model.diagnosis.findings:
        out.append("<h3>The run as a whole</h3>")
        out.append(_finding_divs(model.diagnosis.findings))
    return "".join(out)


def _baseline_section(model: ReportModel) -> str:
    out = [
        "<h2>Best vs the HF default</h2>",
        f'<p class="muted">HF default: {_e(HF_DEFAULT_DESCRIPTION)}.</p>',
    ]
    best, base = model.chosen(), model.baseline
    if base is None:
        out.append("<p>The HF default was not measured in this run.</p>")
        return "".join(out)
    bc, hc = (candidate_of(best) if best else None), candidate_of(base)

    def mem(r: ProbeResult | None) -> str:
        if r is None or not r.peak_mem_bytes:
            return "n/a"
        b = model.budget_bytes
        return format_bytes(r.peak_mem_bytes) + (
            f" ({100 * r.peak_mem_bytes / b:.0f}% of budget)" if b else ""
        )

    # the same figures as the markdown report: both sides' re-measured medians, or both single measurements
    summary = model.summary
    base = recorded_peak(summary, "baseline", base)
    best = recorded_peak(summary, "best", best) if best else None
    best_fig, best_what, base_fig, base_what = versus_figures(summary, best, base)
    if best is None:
        best_fig = None
    remeasured = bool(base_what)
    base_tps = (_tps(base_fig) + (f" ({base_what})" if base_what else "")
                if base.fits else f"{base.status}: {base.reason or ''}")
    best_tps = _tps(float(best_fig) if best_fig else None) + (
        f" ({best_what})" if best_fig and best_what != "search measurement" else "")
    rows = [
        ["tokens/s", best_tps, base_tps],
        ["peak memory", mem(best), mem(base)],
        ["MFU", fmt_mfu(model.best_mfu), fmt_mfu(model.baseline_mfu)],
        [
            "effective batch",
            effective_batch_text(bc) if bc else "n/a",
            effective_batch_text(hc) if hc else "n/a",
        ],
        ["per optimizer step (measured)", step_counts_text(best), step_counts_text(base)],
        ["levers", levers(bc) if bc else "n/a", levers(hc) if hc else "n/a"],
    ]
    out.append(_table(["", "best", "HF default"], rows))
    ratio = summary.get("speedup_vs_baseline")
    if base.fits and isinstance(ratio, (int, float)):
        out.append(f"<p><b>{ratio:.2f}×</b> the HF default's throughput, from medians re-measured side by side.</p>")
    elif remeasured and base.fits and summary.get("speedup_note"):
        out.append(f"<p>No speed-up: {_e(str(summary['speedup_note'])[:300])}.</p>")
    elif best_fig and base.fits and base_fig:
        out.append(f"<p>{float(best_fig) / float(base_fig):.2f}× the HF default's throughput (single measurements, "
                   "not re-measured side by side: treat as indicative).</p>")
    elif not base.fits:
        out.append(f"<p>{_e(baseline_not_run(base))}</p>")
    out.append("<h3>Diagnosis of the HF default</h3>")
    out.append(_findings_html(model.baseline_diagnosis))
    return "".join(out)


def _cost_section(model: ReportModel) -> str:
    rows, note = cost_rows(model)
    unit = "machine-hours" if model.cpu else "GPU-hours"
    out = [f"<h2>{unit[0].upper() + unit[1:]} and cost per 1B tokens</h2>"]
    if not rows:
        return out[0] + "<p>No configuration fits, so there is nothing to price.</p>"
    table_rows = [
        [r.label, f"{r.tokens_per_s:,.0f}", r.figure, str(r.gpus), f"{r.hours_per_1b:,.1f}",
         f"${r.cost_per_1b:,.0f}" if r.cost_per_1b is not None else "no price"]
        for r in rows
    ]  # fmt: skip
    out.append(_table(["config", "tok/s", "figure", "GPUs", f"{unit} per 1B tokens", "cost per 1B tokens"],
                      table_rows, num=(1, 3, 4, 5)))  # fmt: skip
    out.append(f'<p class="muted">{_e(note)} Hours = GPUs × 10⁹ / (tokens/s) / 3600, real tokens only.</p>')
    return "".join(out)


def _levers_section(model: ReportModel) -> str:
    chosen = model.chosen()
    cc = candidate_of(chosen) if chosen else None
    if model.baseline is not None:
        dc = candidate_of(model.baseline)
    else:
        eb = model.summary.get("effective_batch") or (
            cc.micro_batch * cc.grad_accum * cc.world_size if cc else None
        )
        try:
            dc = hf_default_candidate(int(eb), world_size=cc.world_size if cc else 1) if eb else None
        except ValueError:
            dc = None
    rows = []
    for name, dv, cv, same, why in lever_rows(cc, dc):
        tag = (
            '<span class="same">identical math</span>'
            if same
            else '<span class="changes">changes numerics</span>'
        )
        cls = ' class="diff"' if dv != cv else ""
        rows.append(
            f"<tr{cls}><td>{_e(name)}</td><td>{_e(dv)}</td><td>{_e(cv)}</td><td>{tag}</td><td>{_e(why)}</td></tr>"
        )
    return (
        "<h2>Which levers keep the training math identical</h2>"
        '<p class="muted">Rows the chosen configuration changes from the HF default are highlighted. '
        "Levers marked “identical math” change speed and memory only (up to floating-point summation "
        "order); the others change the numbers training computes, so compare loss curves before "
        "adopting them.</p>"
        "<table><thead><tr><th>lever</th><th>HF default</th><th>chosen</th><th>effect</th><th>why</th></tr>"
        "</thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _importance_section(model: ReportModel) -> str:
    fig = _fig_importance(model)
    method = f'<p class="muted">Method: {_e(model.importance.method)}</p>'
    return "<h2>Parameter importance</h2>" + (fig or "<p>Not enough data to rank parameters.</p>") + method


def _probes_section(model: ReportModel) -> str:
    rows = []
    budget = model.budget_bytes
    for i, ((r, d), mfu) in enumerate(zip(model.diagnosis.probes, model.mfus, strict=True), 1):
        peak = r.peak_mem_bytes
        mem = format_bytes(peak) if peak else "n/a"
        if peak and budget:
            mem += f" ({100 * peak / budget:.0f}%)"
        wait = r.metrics.get("data_wait_fraction")
        diag = "<br>".join(
            f"<b>{_e(f.bottleneck)}</b>: {_e(f.evidence)}. <i>Fix:</i> {_e(f.fix)}" for f in d.findings
        )
        rows.append([
            str(i), _e(short_label(candidate_of(r))), _status(r.status), _tps(r.tokens_per_s), _e(mem),
            fmt_mfu(mfu), f"{100 * wait:.0f}%" if isinstance(wait, (int, float)) else "n/a",
            _e(fmt_util(r.metrics)), diag or "none found",
        ])  # fmt: skip
    return (
        "<h2>Every probe, with its diagnosis</h2>"
        f'<p class="muted">{_e(MFU_CONVENTION)}</p>'
        + _table(
            ["#", "config", "status", "tok/s", "peak memory", "MFU", "data wait", "utilisation", "diagnosis"],
            rows,
            raw=True,
            num=(0, 3, 5, 6),
        )  # fmt: skip
    )


def render_html(model: ReportModel) -> str:
    """The whole page for a :class:`ReportModel` (plotly.js inlined once in ``<head>``)."""
    from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]

    title = model.summary.get("run_id") or model.summary.get("model") or "run"
    figs = [
        ("Tokens/s vs micro-batch", _fig_throughput(model)),
        ("Peak memory vs the budget", _fig_memory(model)),
        ("Feasible / infeasible", _fig_feasibility(model)),
    ]
    body = [
        f"<h1>autotune report: {_e(title)}</h1>",
        _facts(model),
        _chosen_section(model),
        _baseline_section(model),
    ]
    for name, fig in figs:
        body.append(f"<h2>{_e(name)}</h2>")
        body.append(fig or "<p>No measurements to plot.</p>")
    body += [_importance_section(model), _cost_section(model), _levers_section(model), _probes_section(model)]
    for n in model.notes:
        body.append(f'<p class="muted">Note: {_e(n)}</p>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>autotune report: {_e(title)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
        + "\n".join(body)
        + "</body></html>\n"
    )

