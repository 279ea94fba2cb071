"""The diagnosis section appended to ``report.md`` (per probe and for the chosen config).  [pure]"""

from __future__ import annotations

from autotune.diagnose import MFU_CONVENTION, Diagnosis, Finding
from autotune.report._model import ReportModel, candidate_of, cost_rows, short_label

__all__ = ["render_diagnosis_md", "fmt_mfu", "fmt_util"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def fmt_mfu(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def fmt_util(metrics: dict[str, object]) -> str:
    g = metrics.get("gpu_util_mean")
    if isinstance(g, (int, float)):
        return f"GPU {g:.0f}%"
    c = metrics.get("cpu_util_mean")
    if isinstance(c, (int, float)):
        return f"CPU {100 * c:.0f}%"
    return "n/a"


def _finding_md(f: Finding) -> str:
    return f"- **{f.bottleneck}** — {f.evidence}. Fix: {f.fix}."


def _diag_lines(d: Diagnosis) -> list[str]:
    if not d.findings:
        return ["- No bottleneck found in the evidence this probe recorded."]
    return [_finding_md(f) for f in d.findings]


def render_diagnosis_md(model: ReportModel) -> str:
    out: list[str] = ["", "## Diagnosis", ""]
    chosen = model.chosen()
    if chosen is not None and model.diagnosis.chosen is not None:
        c = candidate_of(chosen)
        out.append(f"### Chosen configuration: {short_label(c)}")
        out.append("")
        out.append(
            f"MFU {fmt_mfu(model.best_mfu if model.best is not None else model.diagnosis.chosen.mfu)}."
        )
        out.append("")
        out += _diag_lines(model.diagnosis.chosen)
        out.append("")
    if model.baseline_diagnosis is not None:
        out.append("### The HF default")
        out.append("")
        out += _diag_lines(model.baseline_diagnosis)
        out.append("")
    if model.diagnosis.findings:
        out.append("### The run as a whole")
        out.append("")
        out += [_finding_md(f) for f in model.diagnosis.findings]
        out.append("")
    rows, note = cost_rows(model)
    if rows:
        unit = "machine-hours" if model.cpu else "GPU-hours"
        out += ["### Cost per 1B tokens", "",
                f"| config | tok/s | figure | {unit} per 1B tokens | cost per 1B tokens |",
                "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for row in rows:
            cost = f"${row.cost_per_1b:,.0f}" if row.cost_per_1b is not None else "no price"
            out.append(f"| {_cell(row.label)} | {row.tokens_per_s:,.0f} | {_cell(row.figure)} | "
                       f"{row.hours_per_1b:,.1f} | {cost} |")
        out += ["", note, ""]
    out += ["### Per probe", "", f"{MFU_CONVENTION}", ""]
    out.append("| # | config | status | tok/s | MFU | data wait | utilisation | diagnosis |")
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, ((r, d), mfu) in enumerate(zip(model.diagnosis.probes, model.mfus, strict=True), 1):
        tps = f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "n/a"
        wait = r.metrics.get("data_wait_fraction")
        wait_s = f"{100 * wait:.0f}%" if isinstance(wait, (int, float)) else "n/a"
        diag = "; ".join(f"{f.bottleneck}: {f.fix}" for f in d.findings[:2]) or "none found"
        out.append(
            f"| {i} | {_cell(short_label(candidate_of(r)))} | {r.status} | {tps} | {fmt_mfu(mfu)} | {wait_s} | "
            f"{fmt_util(r.metrics)} | {_cell(diag)} |"
        )
    for n in model.notes:
        out += ["", f"Note: {n}"]
    return "\n".join(out) + "\n"
