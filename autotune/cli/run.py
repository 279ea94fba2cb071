"""``autotune run``: search for the fastest configuration that fits, and write it out ready to use.

parse flags -> ``autotune.tune()`` (the library does the work) -> render. Live progress goes to
stderr (one line per probe as it lands; a status line with the best so far and the time left on
a terminal); the final table and one-line answer go to stdout, or with ``--json`` only
``summary.json``. No colours when the stream is not a terminal.
"""

from __future__ import annotations

import shlex
import sys
import time
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from autotune.cli.render import STATUS_STYLE, console, dumps_json, flagged
from autotune.errors import NothingFitsError, SpecError
from autotune.spec.budget import format_bytes

__all__ = ["command", "ProgressPrinter", "render_summary", "answer_line", "COMMAND_ONLY", "RENAMED"]


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    m, s = divmod(int(seconds + 0.5), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def _tps(v: Any) -> str:
    return f"{float(v):,.0f}" if isinstance(v, (int, float)) else "-"


class ProgressPrinter:
    """Receives ``tune``'s progress events and prints them to a stderr console."""

    def __init__(self, con: Console) -> None:
        self.con = con
        self.status: Any = None
        self.t0 = time.monotonic()
        self.best_line = "none yet"
        self.time_left: float | None = None
        self.in_flight = 0
        self.eta_s: float | None = None  # to the answer: search probes left and the confirmation
        self.run_dir: str | None = None  # the run folder, once the run has claimed one

    def _refresh(self) -> None:
        if self.status is not None:
            left = f" · time left {_fmt_s(self.time_left)}" if self.time_left is not None else ""
            eta = f" · ~{_fmt_s(self.eta_s)} to the answer" if self.eta_s is not None else ""
            self.status.update(f"{self.in_flight} probe(s) running · best so far: {self.best_line}{eta}{left}")

    def _count(self, data: dict[str, Any]) -> str:
        """`` probe 7/40 · ETA 12m05s`` from a record event (the ETA from the probes measured so far)."""
        if data.get("probes") is None or not data.get("probe_budget"):
            return ""
        self.eta_s = data.get("eta_s")
        eta = f" · ETA {_fmt_s(self.eta_s)}" if self.eta_s is not None else ""
        return f" probe {data['probes']}/{data['probe_budget']}{eta}"

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        con = self.con
        if event == "run_dir":
            self.run_dir = str(data["run_dir"])
            what = f"resuming ({data['restored']} records from the journal)" if data.get("resumed") else "run"
            con.print(f"{what}: {data['run_dir']}", style="dim")
        elif event == "cached":
            con.print(f"answered from the stored run {data['run_dir']} (use --fresh to search again)", style="dim")
        elif event == "source":
            con.print(f"from {data['name']} ({data['label']}): model {data['model']}, mode {data['mode']}, "
                      f"seq-len {data['seq_len']}, effective batch {data['effective_batch']}", style="dim")
        elif event == "write_back":
            con.print(f"wrote {data['path']} ({data['label']}): {data['changed']} key(s) changed; train with it: "
                      "it keeps your learning rate, seed, LoRA dropout and every key the search does not tune (the "
                      "other files in best/ carry autotune's stock values for those)", style="dim")
            if data.get("diff"):
                con.print(data["diff"], end="")
        elif event == "note":
            con.print(flagged("note", data["text"]))
        elif event == "start":
            n = data.get("distinct")
            con.print(f"searching up to {data['max_trials']} probes, {data['slots']} at a time"
                      + (f", over {n} distinct configurations" if n else ""), style="dim")
            for reason in data.get("skipped_choices") or []:
                con.print(f"  {reason}", style="dim")
            if con.is_terminal and self.status is None:
                self.status = con.status("starting probes ...")
                self.status.start()
        elif event == "submit":
            self.in_flight = data.get("in_flight", self.in_flight)
            self.time_left = data.get("time_left", self.time_left)
            self._refresh()
        elif event == "confirm":
            con.print(f"confirmation round {data.get('round', 1)} (of at most {data.get('max_rounds', 1)}): "
                      f"re-measuring {data['count']} configuration(s) side by side, {data['steps']} timed steps "
                      "each ...", style="dim")
        elif event == "warning":
            con.print(flagged("warning", str(data.get("message"))))
        elif event == "record":
            rec = data["record"]
            self.in_flight = max(0, self.in_flight - (0 if rec.inferred or rec.status == "skipped" else 1))
            style = STATUS_STYLE.get(rec.status, "dim")
            tag = rec.status + (" (inferred)" if rec.inferred else "")
            phase = f"{rec.phase} " if rec.phase in ("confirm", "baseline") else ""
            mem = f" peak {format_bytes(rec.peak_mem_bytes)}" if rec.peak_mem_bytes else ""
            tps = f" {_tps(rec.tokens_per_s)} tok/s" if rec.status == "ok" else ""
            reason = ""
            if rec.status != "ok" and rec.reason:
                reason = " · " + " ".join(str(rec.reason).split())[:140]
            elapsed = _fmt_s(time.monotonic() - self.t0)
            label = rec.label or rec.key
            count = self._count(data)
            con.print(Text.assemble((f"{elapsed:>6}{count}", "dim"), f" {phase}", (f"{tag:<12}", style),
                                    f" {label}{tps}{mem}{reason}"))
            best = data.get("best")
            if best is not None:
                self.best_line = f"{best.label} {_tps(best.tokens_per_s)} tok/s"
            self.time_left = data.get("time_left", self.time_left)
            self._refresh()
        elif event == "tick":
            self.time_left = data.get("time_left", self.time_left)
            self._refresh()
        elif event == "done":
            self.close()
            counts = data.get("counts", {})
            con.print(
                f"search and confirmation done in {_fmt_s(data.get('wall_s'))}: {counts.get('probed', 0)} probed, "
                f"{counts.get('inferred', 0)} inferred, {counts.get('skipped', 0)} skipped, "
                f"{counts.get('failed', 0)} failed; {data.get('stop_reason') or 'finished'}", style="dim"
            )

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def answer_line(summary: dict[str, Any]) -> str:
    """One line: config, tok/s, peak vs budget, effective batch = mb × accum × world."""
    best = summary.get("best") or {}
    eb = best.get("effective_batch") or {}
    peak = best.get("peak_mem_bytes")
    budget = summary.get("budget_bytes")
    pct = f" ({100 * peak / budget:.0f}%)" if peak and budget else ""
    spread = best.get("spread")
    spread_txt = f" ±{100 * spread / 2:.0f}%" if isinstance(spread, (int, float)) and spread else ""
    return (
        f"best: {best.get('label', '?')} · {_tps(best.get('tokens_per_s'))} tok/s{spread_txt} · "
        f"peak {format_bytes(peak)} of {summary.get('gpu_budget')}{pct} · "
        f"effective batch {eb.get('value')} = {eb.get('text')} (micro-batch × accumulation × GPUs) · "
        f"{summary.get('run_dir')}/best/"
    )


def _spread_text(e: dict[str, Any]) -> str:
    """The spread of a row's figures; "-" for one figure (a single value has no spread to show, not 0 %)."""
    values = e.get("measurements") or []
    return f"{100 * (e.get('spread') or 0):.1f}%" if len(values) >= 2 else "- (1 value)"


def render_summary(summary: dict[str, Any], con: Console) -> None:
    top = summary.get("top") or []
    if top:
        table = Table(title="top configurations (re-measured; each row's status says whether its figure held)",
                      title_justify="left")
        for col in ("#", "config", "tok/s (median)", "spread", "peak memory", "status"):
            table.add_column(col, justify="right" if col in ("#", "tok/s (median)", "spread", "peak memory") else "left")
        for i, e in enumerate(top, 1):
            table.add_row(
                str(i), e.get("label", ""), _tps(e.get("median_tokens_per_s")),
                _spread_text(e), format_bytes(e.get("peak_mem_bytes")), e.get("status", ""),
            )
        con.print(table)
    base = summary.get("baseline")
    if base and summary.get("speedup_vs_baseline"):
        lo, hi = summary.get("speedup_range") or (None, None)
        rng = f" (measured range {lo:.2f}–{hi:.2f}×)" if lo is not None else ""
        verdict = "" if summary.get("speedup_distinguishable", True) else "; not distinguishable within the noise"
        con.print(f"vs the HF default ({base['label']}): {summary['speedup_vs_baseline']:.2f}× the tokens/s"
                  f"{rng}{verdict}")
    elif base:
        con.print(f"HF default ({base['label']}): {base['status']}")
    if summary.get("best") and summary.get("speedup_vs_baseline") is None and summary.get("speedup_note"):
        con.print(flagged("note", f"no speed-up over the HF default to report: {summary['speedup_note']}"))
    if summary.get("tie"):
        con.print(f"indistinguishable within the measured noise: {', '.join(summary['tie'])} (the tie went to "
                  "a re-measurement free of other load, then fewer numerics-changing levers, then less memory)")
    trust = summary.get("trust") or {}
    if trust.get("doubtful"):
        con.print(flagged("doubtful answer", "; ".join(trust.get("reasons") or [])))
    if summary.get("from_cache"):
        con.print(f"(from the stored run {summary.get('run_dir')}; --fresh searches again)")
    for note in summary.get("quality_notes") or []:
        con.print(flagged("quality note", note))
    vl = summary.get("verify_loss")
    if vl:
        con.print(f"verify-loss: {vl.get('verdict')}", highlight=False)
    conf = summary.get("cuda_alloc_conf")
    if conf and summary.get("best"):
        con.print(f"measured with PYTORCH_CUDA_ALLOC_CONF={shlex.quote(conf)}: train.py and train_sft.py set it; launch "
                  "your own script, Axolotl or LLaMA-Factory with it too")
    con.print(answer_line(summary), highlight=False)


# How `run`'s options reach tune(): by the same name, except these (the command's own options, and
# the ones converted on the way); tune()'s arguments without an option are ``_tune.API_ONLY``.
COMMAND_ONLY = ("fmt", "strict", "as_json", "verify_loss_steps")
RENAMED = {"probe_timeout": "probe_timeout_s", "offline": "hub", "from_file": "source"}  # option -> RunRequest field


def command(
    model: str | None = typer.Option(None, "--model", "-m", help="Local dir with config.json, hub id (ORG/NAME[@REVISION]: the HF cache, else its config.json fetched from the Hub when online) or preset (required unless --from names one).", rich_help_panel="What to tune"),
    gpu_budget: str = typer.Option(..., "--gpu-budget", help="Memory budget per GPU: 24GB, 24GiB, 24g or 80% (of the smallest GPU in use).", rich_help_panel="What to tune"),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Sequence length (tokens). Default: --from's, else 2048.", rich_help_panel="What to tune"),
    effective_batch: int | None = typer.Option(None, "--effective-batch", help="Sequences per optimizer step, held fixed (micro-batch × accumulation × GPUs). Default: --from's, else 64.", rich_help_panel="What to tune"),
    mode: str | None = typer.Option(None, "--mode", help="full | lora | qlora. Default: --from's, else full.", rich_help_panel="What to tune"),
    lora_r: int | None = typer.Option(None, "--lora-r", help="LoRA rank (modes lora and qlora). Default: --from's, else 16.", rich_help_panel="What to tune"),
    lora_alpha: int | None = typer.Option(None, "--lora-alpha", help="LoRA alpha. Default: --from's, else 2 x the rank.", rich_help_panel="What to tune"),
    lora_targets: str | None = typer.Option(None, "--lora-targets", help="Modules LoRA adapts: attn (q_proj, k_proj, v_proj, o_proj by name: a fused qkv_proj is not among them) | all-linear | comma-separated names. Default: --from's, else attn.", rich_help_panel="What to tune"),
    from_file: str | None = typer.Option(None, "--from", help="Your training config (TrainingArguments/TRL JSON or YAML, Axolotl or LLaMA-Factory YAML): the request is read from it (flags override) and the tuned config is written back in its format.", rich_help_panel="Your training config"),
    write_back: str | None = typer.Option(None, "--write-back", help="With --from: write your file with the tuned keys changed (nothing else) here. Default: best/<its name> in the run directory.", rich_help_panel="Your training config"),
    fmt: str | None = typer.Option(None, "--format", help="With --from: the file's format (default: detected from its keys).", rich_help_panel="Your training config"),
    space: str | None = typer.Option(None, "--space", help="Search space: a name in search_spaces/ (default, lora, cpu, multi-gpu) or a YAML path. Default: cpu on a CPU, default on a GPU.", rich_help_panel="The search"),
    dataset: str | None = typer.Option(None, "--dataset", help="Data to probe with (default: synthetic tokens): a .jsonl/.parquet file, a save_to_disk folder, or a Hub id (ORG/NAME): the local HF datasets cache, else a streamed sample when online.", rich_help_panel="Data"),
    split: str | None = typer.Option(None, "--split", help="Split of a DatasetDict folder or a Hub dataset (default: train).", rich_help_panel="Data"),
    config_name: str | None = typer.Option(None, "--config-name", help="Configuration (subset) of a Hub dataset read as a streamed sample.", rich_help_panel="Data"),
    sample_rows: int | None = typer.Option(None, "--sample-rows", help="Rows of a Hub dataset's streamed sample (default 1000: the first N rows of the split).", rich_help_panel="Data"),
    offline: bool = typer.Option(False, "--offline", help="Never contact the Hub (as HF_HUB_OFFLINE=1): models and datasets only from local folders, the HF caches and the presets.", rich_help_panel="Data"),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="Local tokenizer dir for text/chat data (chat needs a chat_template). Default: the model dir's own; --trainer trl takes its pad token from it.", rich_help_panel="Data"),
    lengths: str = typer.Option("fixed", "--lengths", help="Synthetic sequence lengths when there is no --dataset: fixed | lognormal:MU,SIGMA | uniform:LO-HI | histogram:FILE.json.", rich_help_panel="Data"),
    max_trials: int = typer.Option(40, "--max-trials", help="Most probes the search runs (inferred and skipped ones are free).", rich_help_panel="The search"),
    time_budget: str | None = typer.Option(None, "--time-budget", help="Wall-clock budget of the search: 20m, 1h30m, 90s.", rich_help_panel="The search"),
    gpus: str | None = typer.Option(None, "--gpus", help="GPU indices to use, e.g. 0,1,2,3 (default: all visible).", rich_help_panel="Where it runs"),
    gpus_per_trial: int | None = typer.Option(None, "--gpus-per-trial", "--world-size", help="GPUs one training run (and so each probe) uses, plan's --world-size (overrides the space's gpus_per_trial).", rich_help_panel="Where it runs"),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster (ray://head:10001); default: embedded Ray.", rich_help_panel="Where it runs"),
    pool: str = typer.Option("auto", "--pool", help="auto | ray | local: what runs the probes. auto: on a CPU without --ray-address, local (one at a time, each forked from a process that has imported torch and transformers once: no Ray runtime to start); otherwise Ray.", rich_help_panel="Where it runs"),
    device: str = typer.Option("auto", "--device", help="auto | cuda | cpu. auto: a GPU if NVML sees one, else cpu (with the cpu space, and refused if one probe is predicted past 300 s).", rich_help_panel="Where it runs"),
    storage: str | None = typer.Option(None, "--storage", help="Optuna storage URL (default: sqlite in the run directory).", rich_help_panel="Runs and output"),
    out: str = typer.Option("results", "--out", help="Folder for run directories.", rich_help_panel="Runs and output"),
    seed: int = typer.Option(42, "--seed", help="Seed of the sampler, weights and data.", rich_help_panel="The search"),
    resume: bool = typer.Option(False, "--resume", help="Continue the interrupted run of the same request without re-running finished probes.", rich_help_panel="Runs and output"),
    fresh: bool = typer.Option(False, "--fresh", help="Search again even if a stored run answers this request.", rich_help_panel="Runs and output"),
    top_k: int = typer.Option(3, "--top-k", help="Configurations re-measured with a longer window before choosing.", rich_help_panel="The search"),
    steps: int = typer.Option(5, "--steps", help="Timed optimizer steps per probe at most: a probe stops after 3 once its figure is stable, and times accumulation 2 whatever the effective batch (the confirmation allows twice as many).", rich_help_panel="The search"),
    probe_timeout: str = typer.Option("predicted", "--probe-timeout", help="Deadline of each probe: predicted (its predicted time x 3, corrected by the run's finished probes, at least 120 s on a GPU, 300 s on a CPU) or fixed seconds for every probe (300, 10m).", rich_help_panel="The search"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow model code from the model dir.", rich_help_panel="What to tune"),
    verify_loss: bool = typer.Option(False, "--verify-loss", help="After the search, train the chosen config and the HF-default reference from the same seed and data and compare their losses (verify_loss.json).", rich_help_panel="The search"),
    verify_loss_steps: int = typer.Option(20, "--verify-loss-steps", help="Optimizer steps of each --verify-loss run.", rich_help_panel="The search"),
    confirm_rounds: str | None = typer.Option(None, "--confirm-rounds", help="Confirmation rounds MIN:MAX (default 2:4 on CPU; 1:4 on a GPU, where one re-measurement that agrees with the search measurement confirms): more rounds run while the repeats disagree.", rich_help_panel="The search"),
    confirm_tolerance: float | None = typer.Option(None, "--confirm-tolerance", help="Relative spread at which repeats agree (default 0.25 on CPU, 0.10 on a GPU).", rich_help_panel="The search"),
    strategy: str = typer.Option("walk", "--strategy", help="What proposes the probes: walk (expert seeds, memory-boundary step-downs, a neighbourhood walk, then TPE) | model (a model fitted to the run's probes ranks every configuration and stops the search when none can beat the best) | tpe | random | grid | largest-fits | deepspeed.", rich_help_panel="The search"),
    stop_when_converged: bool = typer.Option(False, "--stop-when-converged", help="End the search once the walk has settled (its best beat by none of its one-lever neighbours) instead of spending the rest of --max-trials: fewer probes, at a small risk of a local optimum (docs/search.md).", rich_help_panel="The search"),
    strict: bool = typer.Option(False, "--strict", help="Exit 5 when the answer is doubtful: the winner's repeats are noisy, or other load was seen.", rich_help_panel="Runs and output"),
    trainer: str = typer.Option("hf", "--trainer", help="hf | trl: measure through transformers.Trainer (train.py) or TRL's SFTTrainer (train_sft.py, sft_config.json).", rich_help_panel="The search"),
    as_json: bool = typer.Option(False, "--json", help="Print only summary.json to stdout.", rich_help_panel="Runs and output"),
) -> None:
    """Search for the fastest fine-tuning configuration that fits the budget, by measuring it."""
    from autotune.run import RunRequest, tune

    err = console(stderr=True)
    printer = ProgressPrinter(err)
    given = dict(
        model=model, gpu_budget=gpu_budget, seq_len=seq_len, effective_batch=effective_batch,
        mode=mode.strip().lower() if mode is not None else None,
        space=space, dataset=dataset, split=split, tokenizer=tokenizer, lengths=lengths, max_trials=max_trials,
        time_budget=time_budget, gpus=gpus, ray_address=ray_address, pool=pool, device=device, storage=storage, out=out,
        seed=seed, resume=resume, fresh=fresh, progress=printer, gpus_per_trial=gpus_per_trial, top_k=top_k,
        steps=steps, probe_timeout_s=_probe_timeout(probe_timeout), trust_remote_code=trust_remote_code,
        verify_loss=verify_loss_steps if verify_loss else 0, confirm_rounds=_rounds(confirm_rounds),
        confirm_tolerance=confirm_tolerance, strategy=strategy, stop_when_converged=stop_when_converged,
        trainer=trainer.strip().lower() if isinstance(trainer, str) else trainer, hub=_hub_access(offline),
        config_name=config_name, sample_rows=sample_rows, lora_r=lora_r, lora_alpha=lora_alpha,
        lora_targets=lora_targets, write_back=write_back,
    )  # fmt: skip
    if verify_loss and verify_loss_steps < 1:  # (0 skipped the check without a word)
        raise SpecError(f"--verify-loss-steps must be at least 1 with --verify-loss; got {verify_loss_steps}")
    if from_file:
        request = RunRequest.from_file(from_file, fmt=fmt, **given)
    elif fmt is not None:  # (it was ignored, and a whole search ran on the flags)
        raise SpecError("--format needs --from FILE (it names that file's format)")
    else:
        request = RunRequest.with_defaults(**given)
    try:
        result = tune(request)
    except NothingFitsError as exc:
        if as_json and exc.summary is not None:  # --json prints summary.json whatever the outcome (exit 3 follows)
            sys.stdout.write(dumps_json(exc.summary, indent=2, default=str) + "\n")
        raise
    except KeyboardInterrupt:
        printer.close()
        if printer.run_dir is None:
            raise
        err.print(f"autotune: interrupted; the finished probes are kept in {printer.run_dir}; resume with: "
                  f"{resume_command(sys.argv[1:])}", highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    finally:
        printer.close()
    if as_json:
        sys.stdout.write(dumps_json(result.summary, indent=2, default=str) + "\n")
    else:
        render_summary(result.summary, console())
    trust = result.summary.get("trust") or {}
    if strict and trust.get("doubtful"):
        err.print(f"--strict: the answer is doubtful ({'; '.join(trust.get('reasons') or [])}); exit 5",
                  highlight=False)
        raise typer.Exit(5)


def resume_command(argv: list[str]) -> str:
    """The command that continues this run: the same arguments, ``--fresh`` dropped, ``--resume`` added
    (quoted for a POSIX shell)."""
    import shlex

    args = [a for a in argv if a != "--fresh"]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["autotune", *args])


def _hub_access(offline: bool) -> Any:
    """How to reach the Hub (HF_ENDPOINT, HF_TOKEN), or None when offline (--offline, HF_HUB_OFFLINE)."""
    from autotune.models import HubAccess

    return HubAccess.from_env(offline=offline)


def _probe_timeout(text: str) -> float | str:
    """``--probe-timeout``: ``predicted``, or fixed seconds (``300``, ``10m``) for every probe."""
    from autotune.run import PREDICTED, parse_probe_timeout

    seconds = parse_probe_timeout(text)
    return PREDICTED if seconds is None else seconds


def _rounds(text: str | None) -> tuple[int, int] | None:
    """``--confirm-rounds``: ``MIN:MAX`` or ``N`` (MIN = MAX = N)."""
    if text is None:
        return None
    from autotune.errors import SpecError

    lo, _, hi = text.partition(":")
    try:
        a = int(lo)
        b = int(hi) if hi else a
    except ValueError:
        raise SpecError(f"--confirm-rounds must be MIN:MAX or N (integers), e.g. 2:4; got {text!r}") from None
    return a, b






