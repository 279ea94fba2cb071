"""Shared rendering helpers for the CLI (rich; plain text when not on a terminal)."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autotune.spec.budget import format_bytes
from autotune.spec.result import ProbeResult

__all__ = ["console", "dumps_json", "finite", "flagged", "render_probe_result", "probe_table_rows", "STATUS_STYLE"]


def finite(obj: Any) -> Any:
    """``obj`` with every NaN/Infinity float replaced by None (JSON has no such numbers)."""
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps_json(obj: Any, **kw: Any) -> str:
    """``json.dumps`` that never writes NaN or Infinity (invalid JSON for every other parser)."""
    import json

    return json.dumps(finite(obj), allow_nan=False, **kw)

STATUS_STYLE = {
    "ok": "green",
    "over_budget": "yellow",
    "oom": "red",
    "unsupported": "magenta",
    "timeout": "red",
    "crash": "red",
}


def console(*, stderr: bool = False) -> Console:
    """A console that writes no colour codes when the stream is not a terminal (pipelines)."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(
        file=stream,
        no_color=bool(os.environ.get("NO_COLOR")) or not tty,
        highlight=False,
        markup=False,  # text holds paths, model names and the user's values: "[...]" in them is text, not a style
        width=None if tty else 200,  # logs and pipes: no wrapping at 80 columns
    )


def flagged(label: str, text: str) -> Text:
    """``label`` in yellow, then ``text`` as it is (no markup read in either): "note: ...", "warning: ..."."""
    return Text.assemble((f"{label}:", "yellow"), f" {text}")


def _fmt(v: Any, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    return format(v, spec)


def probe_table_rows(result: ProbeResult) -> list[tuple[str, str]]:
    """(label, value) pairs describing a probe: the same data for the table and plain text."""
    m = result.metrics
    req = result.probe_request()
    c, w, s = req.candidate, req.workload, req.settings
    rows: list[tuple[str, str]] = [
        ("status", result.status + (f" ({result.reason})" if result.reason else "")),
        ("model", f"{w.model}  [{w.mode}]" + ("  through TRL SFTTrainer" if w.trainer == "trl" else "")),
        (
            "config",
            f"micro-batch {c.micro_batch} × accum {c.grad_accum} × world {c.world_size}, seq {w.seq_len}, "
            f"{c.precision}, attn {c.attn}, ckpt {'on' if c.grad_ckpt else 'off'}, "
            f"packing {'on' if c.packing else 'off'}, workers {c.workers}, optim {c.optim}",
        ),
        ("device", str(result.env.get("device", result.env.get("device_type", "?")))),
    ]
    if m.get("tokens_per_s") is not None:
        rows += [
            ("tokens/s (real tokens)", f"{m['tokens_per_s']:,.1f}"),
            ("samples/s", _fmt(m.get("samples_per_s"), ",.2f")),
        ]
        if m.get("sequences_per_step_mean") is not None:
            from autotune.report.markdown import step_counts_text

            rows.append(("per optimizer step", step_counts_text(result)))
        rows += [
            (
                "step time",
                f"median {m['step_time_median_s'] * 1000:.1f} ms "
                f"(p10 {m['step_time_p10_s'] * 1000:.1f} – p90 {m['step_time_p90_s'] * 1000:.1f} ms, "
                f"spread {m['step_time_spread']:.1%}) over {m['timed_steps']} steps",
            ),
            ("padding", f"{m.get('padding_fraction', 0.0):.1%} of token slots"),
        ]
        comp = m.get("composition")
        if m.get("composed") and comp:
            ms, bd = comp["micro_step"], comp["boundary"]
            rows.append((
                "composed",
                f"for accumulation {comp['grad_accum']} from {comp['timed_micro_batches']} timed micro-batches at "
                f"accumulation {comp['probe_grad_accum']}: micro-step {ms['median_s'] * 1000:.1f} ms "
                f"(spread {ms['spread'] or 0:.0%}), boundary {bd['median_s'] * 1000:.1f} ms "
                f"(spread {bd['spread'] or 0:.0%})",
            ))
        if m.get("rel_std_error") is not None:
            rows.append(("standard error", f"{m['rel_std_error']:.1%} of tokens/s"
                         + (" (window stopped early: stable)" if m.get("stopped_early") else "")))
        if m.get("data_wait_fraction") is not None:
            rows.append(("waiting for data", f"{m['data_wait_fraction']:.1%} of step time"))
    if m.get("loss_first") is not None:
        rows.append(("loss", f"{m['loss_first']:.4f} → {m['loss_last']:.4f}"))
    if m.get("peak_mem_bytes") is not None:
        mem = format_bytes(m["peak_mem_bytes"])
        if s.budget_bytes:
            mem += f" of {format_bytes(s.budget_bytes)} budget (usable {format_bytes(s.usable_bytes())})"
        rows.append(("peak memory", mem + f"  [{m.get('memory_source', '')}]"))
    if m.get("overhead_s") is not None:
        rows.append(
            (
                "fixed overhead",
                f"{m['overhead_s']:.1f} s (launch → first timed step) of {m.get('wall_s', 0):.1f} s",
            )
        )
    if m.get("num_params"):
        rows.append(("parameters", f"{m['num_params']:,} ({m.get('trainable_params', 0):,} trainable)"))
    if w.trainer == "trl" and (m.get("trainer_config") or {}).get("per_device_train_batch_size") is not None:
        tc = m["trainer_config"]
        rows.append(("SFTConfig", f"per_device_train_batch_size {tc['per_device_train_batch_size']}"
                                  + (f" (rows of {tc.get('max_length')}, {tc.get('packing_strategy')})"
                                     if tc.get("packing") else "") + f", {m.get('trl_rows')} prepared rows"))
    for note in m.get("quality_notes") or []:
        rows.append(("quality note", note))
    for warning in m.get("warnings") or []:
        rows.append(("warning", str(warning)))
    return rows


def render_probe_result(result: ProbeResult, con: Console) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for label, value in probe_table_rows(result):
        style = STATUS_STYLE.get(result.status, "") if label == "status" else ""
        table.add_row(label, Text(value, style=style) if style else value)
    con.print(table)
