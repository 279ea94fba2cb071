"""``autotune plan``: which GPU, which levers, how fast, how long, what cost — without a GPU.

``gather(...) -> PlanResult`` resolves the model (offline: presets, local dirs, HF cache) and runs
the estimator; ``render(result) -> str`` draws the table; ``--json`` prints ``result.to_dict()``.
Imports neither torch nor transformers.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping

import typer

from autotune.errors import SpecError
from autotune.estimate.catalog import catalog_paths_from_env, find_gpus, load_catalog
from autotune.estimate.plan import PlanResult, parse_tokens, plan
from autotune.spec.budget import format_bytes
from autotune.spec.probe_request import MODE_CHOICES

__all__ = ["command", "gather", "render", "DEFAULT_GPUS"]

DEFAULT_GPUS = "A10G,L4,A100-80GB,H100-SXM"


def gather(
    *,
    model: str,
    gpu: str = DEFAULT_GPUS,
    gpus_per_node: int = 8,
    seq_len: int = 2048,
    effective_batch: int = 64,
    mode: str = "full",
    tokens: str | int | None = None,
    lora_r: int = 16,
    catalog: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> PlanResult:
    """Validate the flags, resolve the model and plan. Raises SpecError with one line."""
    from autotune.models import resolve_model

    problems: list[str] = []
    if mode not in MODE_CHOICES:
        problems.append(f"--mode must be one of {', '.join(MODE_CHOICES)}; got {mode!r}")
    for flag, v in (("--gpus-per-node", gpus_per_node), ("--seq-len", seq_len), ("--effective-batch", effective_batch),
                    ("--lora-r", lora_r)):  # fmt: skip
        if v < 1:
            problems.append(f"{flag} must be a positive integer; got {v}")
    n_tokens: int | None = None
    if tokens is not None:
        try:
            n_tokens = parse_tokens(tokens)
        except SpecError as exc:
            problems.append(f"--tokens: {exc}")
    paths = list(catalog or []) + catalog_paths_from_env(environ if environ is not None else os.environ)
    gpus = None
    try:
        gpus = find_gpus(gpu, load_catalog(paths or None))
    except SpecError as exc:
        problems.append(str(exc))
    if problems:
        raise SpecError(problems)
    resolved = resolve_model(model)
    assert gpus is not None
    return plan(
        resolved.config, gpus=gpus, gpus_per_node=gpus_per_node, seq_len=seq_len,
        effective_batch=effective_batch, mode=mode, tokens=n_tokens, model_name=resolved.name, lora_r=lora_r,
    )  # fmt: skip


def _count(n: float) -> str:
    for unit, f in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= f:
            return f"{n / f:.3g}{unit}"
    return f"{n:.0f}"


def render(result: PlanResult, *, width: int = 160, color: bool = False) -> str:
    """The plan as a table plus the assumptions it rests on."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    a = result.arch
    buf = io.StringIO()
    con = Console(file=buf, width=width, no_color=not color, highlight=False, soft_wrap=False)
    title = (
        f"{result.model}: {_count(a.params_total)} params, {result.mode}, seq {result.seq_len}, "
        f"effective batch {result.effective_batch}, up to {result.gpus_per_node} "
        + ("GPU" if result.gpus_per_node == 1 else "GPUs")
        + (f", {_count(result.tokens)} tokens" if result.tokens else "")
    )
    table = Table(title=title, title_justify="left")
    for col, just in (("GPU", "left"), ("fits", "left"), ("levers", "left"), ("micro x accum x GPUs", "right"),
                      ("peak / capacity", "right"), ("tok/s", "right"), ("tok/s/GPU", "right"), ("MFU", "right"),
                      ("hours", "right"), ("cost $", "right")):  # fmt: skip
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for row in result.rows:
        o = row.option
        if o is None:
            table.add_row(row.gpu.name, "no", row.note, "-", f"- / {format_bytes(row.capacity_bytes)}",
                          "-", "-", "-", "-", "-")  # fmt: skip
            continue
        c = o.candidate
        fits = "yes" if row.fits else f"no -> {o.mode}"
        levers = ", ".join(o.levers) or "none"
        if c.precision != "bf16" or c.attn != "flash_attention_2":
            levers += escape(f" [{c.precision}, {c.attn}]")
        table.add_row(
            row.gpu.name, fits, levers, f"{c.micro_batch} x {c.grad_accum} x {c.world_size}",
            f"{format_bytes(o.memory.total)} / {format_bytes(row.capacity_bytes)}",
            f"{o.speed.tokens_per_s:,.0f}", f"{o.speed.tokens_per_s_per_gpu:,.0f}",
            "-" if o.speed.mfu is None else f"{100 * o.speed.mfu:.0f}%",
            "-" if row.hours is None else f"{row.hours:,.1f}",
            "-" if row.cost_usd is None else f"{row.cost_usd:,.0f}",
        )  # fmt: skip
    con.print(table)
    dates = sorted({r.gpu.price_date for r in result.rows if r.gpu.price_date})
    lines = [
        "Estimates, not measurements: memory from the term-by-term model (5% headroom kept), speed = peak "
        "bf16/fp16 FLOP/s x assumed efficiency / FLOPs per token (6N full, 4N LoRA, +2N with checkpointing, "
        "+ PaLM attention term); MFU counts model FLOPs. Measure with `autotune run`.",
    ]
    if dates:
        lines.append(
            f"Prices per GPU-hour as of {', '.join(dates)} (edit gpus.yaml or $AUTOTUNE_GPU_CATALOG)."
        )
    for r in result.rows:
        if r.note and r.option is not None:
            lines.append(f"{r.gpu.name}: {r.note}.")
    lines.extend(result.notes)
    for line in lines:
        con.print(line)
    return buf.getvalue()


def command(
    model: str = typer.Option(
        ..., "--model", "-m", help="Preset name, hub id (in the HF cache) or directory."
    ),
    gpu: str = typer.Option(DEFAULT_GPUS, "--gpu", help="Comma-separated GPU names from the catalog."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="Most GPUs the plan may use (one node)."),
    seq_len: int = typer.Option(2048, "--seq-len", help="Training sequence length."),
    effective_batch: int = typer.Option(64, "--effective-batch", help="Sequences per optimizer step."),
    mode: str = typer.Option("full", "--mode", help="full | lora | qlora"),
    tokens: str | None = typer.Option(
        None, "--tokens", help="Training tokens for time and cost: 1B, 500M, 2e9."
    ),
    lora_r: int = typer.Option(16, "--lora-r", help="LoRA rank (modes lora and qlora)."),
    catalog: list[str] | None = typer.Option(  # noqa: B008
        None, "--catalog", help="Extra GPU catalog YAML (repeatable); also $AUTOTUNE_GPU_CATALOG."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON only."),
) -> None:
    """Plan capacity without a GPU: does it fit, with which levers, how fast, how long, what cost."""
    result = gather(
        model=model, gpu=gpu, gpus_per_node=gpus_per_node, seq_len=seq_len, effective_batch=effective_batch,
        mode=mode, tokens=tokens, lora_r=lora_r, catalog=catalog,
    )  # fmt: skip
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(render(result), nl=False)
