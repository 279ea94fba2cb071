"""``autotune plan``: which GPU, which levers, how fast, how long, what cost — without a GPU.

``gather(PlanQuery(...), PlanSources(...)) -> PlanResult`` resolves the model (offline: presets, local
dirs, HF cache) and runs the estimator; ``render(result) -> str`` draws the table; ``--json`` prints
``result.to_dict()``.
Imports neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import typer

from autotune.cli._levers import lever_options
from autotune.cli.render import dumps_json
from autotune.errors import NothingFitsError, SpecError
from autotune.estimate.catalog import GPU, alias_notes, catalog_paths_from_env, find_gpus, load_catalog
from autotune.estimate.plan import (
    MAX_GPUS_PER_NODE,
    PIN_FIELDS,
    PlanLora,
    PlanResult,
    PlanWorkload,
    breakdown,
    parse_tokens,
    plan,
)
from autotune.spec.budget import format_bytes
from autotune.spec.probe_request import MODE_CHOICES, parse_lora_targets

__all__ = ["command", "gather", "PlanQuery", "PlanSources", "parse_lora_targets", "render", "DEFAULT_GPUS"]

DEFAULT_GPUS = "A10G,L4,A100-80GB,H100-SXM"
DEFAULT_SEQ_LEN = 2048


@dataclass(frozen=True)
class PlanQuery:
    """What ``autotune plan`` is asked, as given on the command line (``gather`` checks it).

    ``seq_len`` None: ``DEFAULT_SEQ_LEN``, or a learned-position model's limit if shorter. ``tokens``: a
    count (``1B``, ``500M``, ``2e9``) for time and cost. ``pin``: Candidate fields fixed from the command
    line (``PIN_FIELDS``; None values are ignored)."""

    model: str
    gpu: str = DEFAULT_GPUS
    gpus_per_node: int = 8
    seq_len: int | None = None
    effective_batch: int = 64
    mode: str = "full"
    tokens: str | int | None = None
    lora_r: int = 16
    lora_targets: str = "attn"
    pin: Mapping[str, Any] | None = None
    lengths: str = "fixed"
    trainer: str = "hf"


@dataclass(frozen=True)
class PlanSources:
    """Where ``gather`` reads from besides the model: GPU catalogs, a run's probes, the Hub.

    ``catalog``: extra catalog YAML files, before those of ``$AUTOTUNE_GPU_CATALOG`` in ``environ``
    (None: ``os.environ``). ``calibrate_from``: a run folder whose probes calibrate the speed model
    (:func:`calibration_from_run`). ``hub``: an ``autotune.models.HubAccess`` (None: offline): a model
    id missing from the HF cache has its config.json fetched from the Hub (nothing else)."""

    catalog: Sequence[str] | None = None
    environ: Mapping[str, str] | None = None
    calibrate_from: str | None = None
    hub: Any = None


def gather(query: PlanQuery, sources: PlanSources | None = None) -> PlanResult:
    """Validate the flags, resolve the model and plan. Raises SpecError with one line."""
    from autotune.estimate import arch_from_config
    from autotune.estimate.arch import lora_targets_problem
    from autotune.models import resolve_model

    sources = sources if sources is not None else PlanSources()
    targets, n_tokens, gpus, catalog = _checked(query, sources)
    efficiency: dict[str, float] | None = None
    calibration_notes: list[str] = []
    if sources.calibrate_from is not None:
        efficiency, calibration_notes = calibration_from_run(sources.calibrate_from, catalog)
    resolved = resolve_model(query.model, hub=sources.hub)
    arch = arch_from_config(resolved.config)
    unmatched = lora_targets_problem(arch, targets) if query.mode != "full" else None
    if unmatched:
        raise SpecError(unmatched)
    seq_len, default_note = query.seq_len, ""
    if seq_len is None:
        seq_len = DEFAULT_SEQ_LEN
        if arch.learned_positions and arch.max_positions and arch.max_positions < seq_len:
            seq_len = arch.max_positions
            default_note = (
                f"--seq-len not given: {seq_len}, the model's learned positions (default {DEFAULT_SEQ_LEN})"
            )
    pinned = {k: v for k, v in (query.pin or {}).items() if v is not None}
    result = plan(
        arch, gpus=gpus, gpus_per_node=query.gpus_per_node, seq_len=seq_len,
        effective_batch=query.effective_batch, mode=query.mode, tokens=n_tokens, model_name=resolved.name,
        lora=PlanLora(query.lora_r, tuple(targets)), pin=pinned, efficiency=efficiency,
        workload=PlanWorkload(query.lengths, query.trainer),
    )  # fmt: skip
    extra = [default_note] if default_note else []
    extra += alias_notes(query.gpu, catalog)
    extra += list(resolved.notes)
    extra += calibration_notes
    extra += [f"--calibrate: no probe of {sources.calibrate_from} ran on {g.name}; its speed uses the "
              "default efficiency" for g in gpus if efficiency is not None and g.name not in efficiency]
    if extra:
        result = dataclasses.replace(result, notes=(*result.notes, *extra))
    return result


def _checked(
    query: PlanQuery, sources: PlanSources
) -> tuple[tuple[str, ...], int | None, list[GPU], list[GPU]]:
    """The query's flags checked, every problem in one SpecError: (LoRA target modules, training tokens,
    the GPUs asked for, the catalog they were found in: the built-in one and the user's files, read once)."""
    problems: list[str] = []
    targets = parse_lora_targets(query.lora_targets)
    if not targets:
        problems.append("--lora-targets must be attn, all-linear or a comma-separated module list; "
                        f"got {query.lora_targets!r}")
    if query.mode not in MODE_CHOICES:
        problems.append(f"--mode must be one of {', '.join(MODE_CHOICES)}; got {query.mode!r}")
    if query.seq_len is not None and query.seq_len < 8:  # the least Workload takes
        problems.append(f"--seq-len must be an integer >= 8; got {query.seq_len}")
    for flag, v in (("--gpus-per-node", query.gpus_per_node), ("--effective-batch", query.effective_batch),
                    ("--lora-r", query.lora_r)):  # fmt: skip
        if v < 1:
            problems.append(f"{flag} must be a positive integer; got {v}")
    if query.gpus_per_node > MAX_GPUS_PER_NODE:
        flag = "--gpus-per-node" if (query.pin or {}).get("world_size") != query.gpus_per_node else "--world-size"
        problems.append(f"{flag} must be at most {MAX_GPUS_PER_NODE}: the plan is for one node (the largest hold 8-16 "
                        f"GPUs) and does not model the network between nodes; got {query.gpus_per_node}")
    n_tokens: int | None = None
    if query.tokens is not None:
        try:
            n_tokens = parse_tokens(query.tokens)
        except SpecError as exc:
            problems.append(f"--tokens: {exc}")
    environ = sources.environ if sources.environ is not None else os.environ
    paths = list(sources.catalog or []) + catalog_paths_from_env(environ)
    gpus: list[GPU] = []
    catalog: list[GPU] = []
    try:
        catalog = load_catalog(paths or None)
        gpus = find_gpus(query.gpu, catalog)
    except SpecError as exc:
        problems.append(str(exc))
    if problems:
        raise SpecError(problems)
    return targets, n_tokens, gpus, catalog


def calibration_from_run(run_dir: str, catalog: Any = None) -> tuple[dict[str, float], list[str]]:
    """Base efficiency per catalog GPU from a run folder's probes: the median of measured / predicted
    tokens/s per GPU (``estimate.calibrate``) over the search probes that ran ``ok`` on that GPU.

    Returns ({GPU name: efficiency}, one note per GPU). SpecError (one line) when the folder holds no
    such probe: probes on CPU, on a GPU the catalog does not list, or none that fit.
    """
    from autotune.diagnose import gpu_for_result
    from autotune.estimate import DEFAULT_EFFICIENCY, arch_from_config, calibrate, calibration_pairs
    from autotune.models import resolve_model
    from autotune.report.build import load_run

    run = load_run(run_dir)
    ok = [r for r in run.results if r.fits and r.tokens_per_s]
    by_gpu: dict[str, tuple[Any, list[Any]]] = {}
    devices = sorted({str((r.env or {}).get("device") or (r.env or {}).get("device_type") or "unknown") for r in ok})
    for r in ok:
        gpu = gpu_for_result(r, catalog)
        if gpu is not None:
            by_gpu.setdefault(gpu.name, (gpu, []))[1].append(r)
    if not by_gpu:
        where = ", ".join(devices) if devices else "no probe that fit"
        raise SpecError(f"--calibrate {run_dir}: no ok probe ran on a GPU of the catalog ({where}); "
                        "give the folder of a run measured on a GPU (or add the GPU with --catalog)")
    efficiency: dict[str, float] = {}
    notes: list[str] = []
    for name, (gpu, results) in sorted(by_gpu.items()):
        pairs: list[tuple[float, float]] = []
        for r in results:
            wl = r.probe_request().workload
            arch = arch_from_config(resolve_model(wl.model_path or wl.model).config)
            pairs += calibration_pairs([r], arch, gpu)
        eff = calibrate(pairs)
        if eff is None:
            continue
        efficiency[name] = eff
        notes.append(f"--calibrate: {name} speed from {len(pairs)} probe(s) of {run_dir}: base efficiency "
                     f"{eff:.2f} (default {gpu.efficiency or DEFAULT_EFFICIENCY:.2f})")
    return efficiency, notes


def _hub_access(offline: bool) -> Any:
    from autotune.models import HubAccess

    return HubAccess.from_env(offline=offline)


def _count(n: float) -> str:
    for unit, f in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= f:
            return f"{n / f:.3g}{unit}"
    return f"{n:.0f}"


def render(result: PlanResult, *, width: int = 160, color: bool = False) -> str:
    """The plan as a table plus the assumptions it rests on."""
    from rich.console import Console
    from rich.table import Table

    a = result.arch
    buf = io.StringIO()
    # markup off: the model (a path the user gives), the levers ("[fp16, sdpa]") are text, not styles
    con = Console(file=buf, width=width, no_color=not color, highlight=False, soft_wrap=False, markup=False)
    title = (
        f"{result.model}: {_count(a.params_total)} params, {result.mode}, seq {result.seq_len}"
        + (f" ({result.lengths})" if result.lengths != "fixed" else "")
        + (", TRL's SFTTrainer" if result.trainer == "trl" else "") + ", "
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
            least = row.smallest
            peak = f"{format_bytes(least.memory.total)} (smallest)" if least else "-"
            # judged against the usable share (5 % headroom kept): 14.98 GiB / 15.00 GiB read as if it fitted
            table.add_row(row.gpu.name, "no", row.note.split(": the smallest")[0], "-",
                          f"{peak} / {format_bytes(row.usable_bytes)} usable", "-", "-", "-", "-", "-")  # fmt: skip
            continue
        c = o.candidate
        fits = "yes" if row.fits else f"no -> {o.mode}"
        levers = ", ".join(o.levers) or "none"
        if c.precision != "bf16" or c.attn != "flash_attention_2":
            levers += f" [{c.precision}, {c.attn}]"
        table.add_row(
            row.gpu.name, fits, levers, f"{c.micro_batch} x {c.grad_accum} x {c.world_size}",
            f"{format_bytes(o.memory.total)} / {format_bytes(row.capacity_bytes)}",
            f"{o.speed.tokens_per_s:,.0f}", f"{o.speed.tokens_per_s_per_gpu:,.0f}",
            "-" if o.speed.mfu is None else f"{100 * o.speed.mfu:.0f}%",
            "-" if row.hours is None else f"{row.hours:,.1f}",
            "-" if row.cost_usd is None else f"{row.cost_usd:,.0f}" if row.cost_usd >= 10 else f"{row.cost_usd:.2f}",
        )  # fmt: skip
    con.print(table)
    dates = sorted({r.gpu.price_date for r in result.rows if r.gpu.price_date})
    lines = [
        "Estimates, not measurements: memory from the term-by-term model (5% headroom kept), step time = FLOPs "
        "(6N full, 4N LoRA, +2N with checkpointing, + causal attention) / (peak bf16/fp16 FLOP/s x efficiency) "
        "+ a time per operation the step dispatches and QLoRA's dequantization (fitted on published runs) + the optimizer "
        "update and gradient clipping at the GPU's memory bandwidth; MFU counts "
        "model FLOPs. Measure with `autotune run`.",
    ]
    if dates:
        lines.append(
            f"Prices per GPU-hour as of {', '.join(dates)} (edit gpus.yaml or $AUTOTUNE_GPU_CATALOG)."
        )
    for r in result.rows:
        if r.note and (r.option is not None or r.smallest is not None):
            lines.append(f"{r.gpu.name}: {r.note}.")
        lines.extend(f"{r.gpu.name}: {a}." for a in r.assumptions)
    if result.pinned:
        lines.append(
            "Pinned (not searched): " + ", ".join(f"{k}={v}" for k, v in result.pinned.items()) + "."
        )
    for r in result.rows:
        if r.shown is not None:
            lines.extend(_breakdown_lines(r))
    lines.extend(result.notes)
    for line in lines:
        con.print(line)
    return buf.getvalue()


def _breakdown_lines(row: Any) -> list[str]:
    """The chosen configuration's memory (or, when nothing fits, the closest one's), sorted by share of the
    peak, with the dominant term's lever."""
    o = row.shown
    b = breakdown(o)
    c = o.candidate
    shown = [t for t in b["terms"] if t["share"] >= 0.02][:7]
    rest = sum(t["bytes"] for t in b["terms"][len(shown) :])
    parts = [f"{t['term']} {format_bytes(t['bytes'])} ({100 * t['share']:.0f}%)" for t in shown]
    if rest:
        parts.append(f"other {format_bytes(rest)}")
    out = [
        f"{row.gpu.name} memory at the {b['phase'].replace('_', ' ')} peak ({format_bytes(b['total'])}, optimizer "
        f"{c.optim}{', micro-batch ' + str(c.micro_batch)}): " + ", ".join(parts) + ".",
        f"  dominant: {b['dominant']} -> {b['lever']}.",
    ]
    if o.memory.device == "cuda":
        out.insert(1, f"  as torch counts it: max_memory_allocated {format_bytes(o.memory.allocated)}, "
                      f"max_memory_reserved {format_bytes(o.memory.reserved)}; the rest is the CUDA context.")
        if not c.packing and o.memory.reserved_variable_lengths > o.memory.reserved:
            out.insert(2, f"  with real variable-length batches the reserved figure grows to about "
                          f"{format_bytes(o.memory.reserved_variable_lengths)} on a card with room (cached blocks a longer "
                          "batch cannot reuse); where that is more than the card, the allocator frees them and retries, "
                          "which slows steps but still fits. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True keeps "
                          "the reserve near the fixed-length figure; autotune run's GPU probes and the train.py it "
                          "writes set it.")
    if o.memory.host_bytes:
        host = row.gpu.host_memory_bytes_per_gpu
        avail = (
            f"; the catalog's node has {format_bytes(host * c.world_size)} for {c.world_size} GPU(s)"
            f" ({row.gpu.host_memory_source})"
            if host
            else "; host RAM of this GPU's nodes unknown (add host_memory_per_gpu to the catalog)"
        )
        out.append(f"  offload needs {format_bytes(o.memory.host_bytes)} of host RAM per node{avail}.")
    return out


@lever_options(PIN_FIELDS, pin=True)
def command(
    model: str = typer.Option(
        ..., "--model", "-m",
        help="Preset name, directory, or hub id ORG/NAME[@REVISION] (the HF cache, else config.json from the Hub when online).",
    ),
    gpu: str = typer.Option(DEFAULT_GPUS, "--gpu", help="Comma-separated GPU names from the catalog."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help="Most GPUs the plan may use, on one node. Default: --world-size when pinned, else 1 (one card's question; 8 for a node of eight)."),
    seq_len: int | None = typer.Option(
        None,
        "--seq-len",
        help="Training sequence length (default 2048, or a learned-position model's limit).",
    ),
    effective_batch: int = typer.Option(64, "--effective-batch", help="Sequences per optimizer step."),
    lengths: str = typer.Option(
        "fixed", "--lengths",
        help="Your sequences' lengths: fixed (every one --seq-len long) or a distribution up to --seq-len "
             "(lognormal:4.0,1.0, uniform:32-512, histogram:FILE.json): the speed counts the padding and packing is searched.",
    ),
    mode: str = typer.Option("full", "--mode", help="full | lora | qlora"),
    trainer: str = typer.Option("hf", "--trainer", help="hf | trl: transformers.Trainer's loss (the full logits), or TRL's SFTTrainer's fused LM head (tiles of the logits, never the whole)."),
    tokens: str | None = typer.Option(
        None, "--tokens", help="Training tokens for time and cost: 1B, 500M, 2e9."
    ),
    lora_r: int = typer.Option(16, "--lora-r", help="LoRA rank (modes lora and qlora)."),
    lora_targets: str = typer.Option(
        "attn", "--lora-targets", help="attn (q_proj, k_proj, v_proj, o_proj by name: a fused qkv_proj is not among them) | all-linear | comma-separated module names."
    ),
    catalog: list[str] | None = typer.Option(  # noqa: B008
        None, "--catalog", help="Extra GPU catalog YAML (repeatable); also $AUTOTUNE_GPU_CATALOG."
    ),
    calibrate: str | None = typer.Option(
        None, "--calibrate", help="A run folder (results/<run>): calibrate the speed model from its probes on a GPU."
    ),
    offline: bool = typer.Option(False, "--offline", help="Never contact the Hub (as HF_HUB_OFFLINE=1): models and datasets only from local folders, the HF caches and the presets."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON only."),
    levers: dict[str, Any] | None = None,  # the pins, one option per lever the planner prices (lever_options)
) -> None:
    """Plan capacity without a GPU: does it fit, with which levers, how fast, how long, what cost. Exit 3 when
    nothing fits on any GPU asked about, in any mode tried (as `autotune run`'s "nothing fits")."""
    pin = dict(levers or {})
    query = PlanQuery(
        model=model, gpu=gpu,
        gpus_per_node=gpus_per_node if gpus_per_node is not None else max(1, pin["world_size"] or 1),
        seq_len=seq_len, effective_batch=effective_batch,
        mode=mode.strip().lower(), tokens=tokens, lora_r=lora_r, lora_targets=lora_targets, pin=pin,
        lengths=lengths, trainer=trainer.strip().lower(),
    )  # fmt: skip
    result = gather(query, PlanSources(catalog=catalog, calibrate_from=calibrate, hub=_hub_access(offline)))
    if as_json:
        typer.echo(dumps_json(result.to_dict(), indent=2))
    else:
        typer.echo(render(result), nl=False)
    if not any(row.option is not None for row in result.rows):
        raise typer.Exit(NothingFitsError.exit_code)
