"""``autotune probe``: measure one configuration, through the HF Trainer (or TRL's SFTTrainer), in a fresh process."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import typer

from autotune.cli._levers import lever_options
from autotune.cli.render import console, dumps_json, flagged, render_probe_result
from autotune.errors import SpecError
from autotune.spec.budget import parse_budget, resolve_budget
from autotune.spec.levers import LEVERS
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload, cuda_alloc_conf
from autotune.spec.result import ProbeResult

__all__ = ["command", "build_probe_request", "PROBE_EXIT_CODES"]

# 0: measured and fits; 3: does not fit (oom / over budget); 1: could not be measured
PROBE_EXIT_CODES = {"ok": 0, "oom": 3, "over_budget": 3, "unsupported": 1, "timeout": 1, "crash": 1}


def build_probe_request(
    workload: Workload,
    candidate: Candidate | None = None,
    settings: ProbeSettings | None = None,
    *,
    hub: Any = None,
    config_name: str | None = None,
    sample_rows: int | None = None,
    notes: list[str] | None = None,
) -> ProbeRequest:
    """Resolve the model and validate everything; raise SpecError on bad input.

    The parts as ``autotune probe`` is given them: ``workload.model`` is the model as typed (resolved here
    into its name and ``model_path``), ``candidate.precision`` may be ``auto`` (fp32 on cpu, else bf16;
    no ``candidate``: the levers' defaults) and ``settings.budget_text`` is the ``--gpu-budget`` text
    (resolved here into ``budget_bytes``). ``hub`` (an ``autotune.models.HubAccess``; None: offline) lets
    a model or dataset missing from the local caches come from the Hub (config.json and tokenizer files;
    a streamed sample of the data: ``config_name``, ``sample_rows``); what the user should know about it
    is appended to ``notes``."""
    from autotune.models import check_seq_len, resolve_model
    from autotune.run import check_model_config
    from autotune.spec.lengths import parse_lengths

    candidate = candidate if candidate is not None else Candidate()
    settings = settings if settings is not None else ProbeSettings()
    resolved = resolve_model(workload.model, trust_remote_code=workload.trust_remote_code, hub=hub,
                             tokenizer=workload.dataset is not None and workload.tokenizer is None)
    if notes is not None:
        notes.extend(resolved.notes)
    check_model_config(resolved.config, resolved.config_path)  # as `run` does: exit 2, not a crashed probe
    if candidate.precision == "auto":
        precision = "fp32" if _probe_device(settings.device) == "cpu" else "bf16"
        candidate = dataclasses.replace(candidate, precision=precision)
    check_seq_len(resolved, workload.seq_len)
    parse_lengths(workload.lengths)  # validated here, sampled in the worker
    req = ProbeRequest(
        workload=dataclasses.replace(workload, model=resolved.name, model_path=resolved.path),
        candidate=candidate,
        settings=_with_budget_bytes(settings),
    )
    req.validate()
    from autotune.probe.trl_probe import trainer_problems

    problems = trainer_problems(req.workload, req.candidate)
    if problems:
        raise SpecError(problems)
    if req.workload.dataset is not None:
        _prepare_dataset(req.workload, resolved.config, hub=hub, config_name=config_name,
                         sample_rows=sample_rows, notes=notes)
    return req


def _with_budget_bytes(settings: ProbeSettings) -> ProbeSettings:
    """``settings`` with its budget text parsed and resolved to bytes (unchanged without one)."""
    if settings.budget_text is None:
        return settings
    budget = parse_budget(settings.budget_text)
    # the device's memory is read only for a percentage
    where = _budget_device(settings.device) if budget.fraction is not None else {"device": settings.device}
    budget_bytes = resolve_budget(budget, **where)
    return dataclasses.replace(settings, budget_bytes=budget_bytes, budget_text=str(budget))


def _prepare_dataset(
    workload: Workload, config: Any, *, hub: Any, config_name: str | None, sample_rows: int | None,
    notes: list[str] | None,
) -> None:
    """Make ``workload.dataset`` local (a Hub dataset's streamed sample) and tokenize it once here: bad files
    and token ids outside the vocabulary fail now, with exit 2; every probe then hits the cache."""
    from autotune.probe.hub_sample import prepare_hub_dataset
    from autotune.run import check_dataset

    assert workload.dataset is not None
    note = prepare_hub_dataset(workload.dataset, split=workload.split, config_name=config_name,
                               rows=sample_rows, hub=hub, seq_len=workload.seq_len)
    if note and notes is not None:
        notes.append(note)
    check_dataset(workload.dataset, workload, config)


def _probe_device(device: str) -> str:
    """``cpu`` or ``cuda``: where a probe with ``--device device`` will run (NVML, no torch import)."""
    if device != "auto":
        return device
    from autotune.env import nvml_device_info

    return "cuda" if nvml_device_info() else "cpu"


def _budget_device(device: str) -> dict[str, Any]:
    """What a percentage budget is a share of (``spec.budget.PERCENT_RULE``): every visible GPU, the
    smallest one counting, else the system memory. ``resolve_budget``'s keyword arguments."""
    if device in ("auto", "cuda"):
        from autotune.env import nvml_device_info

        gpus = nvml_device_info()
        if gpus:
            return {"device": "cuda", "gpu_infos": gpus}
        if device == "cuda":
            raise SpecError("device cuda requested but no NVIDIA GPU is visible (NVML found none)")
    return {"device": "cpu", "ram_bytes": _ram_bytes}


def _ram_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


@lever_options((name for name in LEVERS if name != "precision"), pin=False, defaults={"micro_batch": 4})
def command(
    model: str = typer.Option(..., "--model", "-m", help="Local dir with config.json, hub id (ORG/NAME[@REVISION]: the HF cache, else config.json and tokenizer fetched from the Hub when online) or preset (llama-3.1-8b)."),
    seq_len: int = typer.Option(512, "--seq-len", help="Sequence length (tokens)."),
    precision: str = typer.Option("auto", "--precision", help="auto | fp32 | tf32 | bf16 | fp16 (auto: bf16 on a GPU, fp32 on cpu)."),
    mode: str = typer.Option("full", "--mode", help="full | lora | qlora."),
    lengths: str = typer.Option("fixed", "--lengths", help="Synthetic length distribution: fixed | lognormal:MU,SIGMA | uniform:LO-HI | histogram:FILE.json."),
    dataset: str | None = typer.Option(None, "--dataset", help="jsonl/parquet file, save_to_disk dir, or Hub id (ORG/NAME: the local HF datasets cache, else a streamed sample when online), with a text, messages (chat), prompt+completion or input_ids column."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="Local tokenizer dir (for text/chat data; chat needs a chat_template)."),
    split: str | None = typer.Option(None, "--split", help="Split of a DatasetDict save_to_disk dir or a Hub dataset (default: train)."),
    config_name: str | None = typer.Option(None, "--config-name", help="Configuration (subset) of a Hub dataset read as a streamed sample."),
    sample_rows: int | None = typer.Option(None, "--sample-rows", help="Rows of a Hub dataset's streamed sample (default 1000: the first N rows of the split)."),
    offline: bool = typer.Option(False, "--offline", help="Never contact the Hub (as HF_HUB_OFFLINE=1): models and datasets only from local folders, the HF caches and the presets."),
    lora_r: int = typer.Option(16, "--lora-r", help="LoRA rank (alpha = 2r)."),
    gpu_budget: str | None = typer.Option(None, "--gpu-budget", help="Memory budget: 24GB, 24GiB, 24g or 80% (of the smallest visible GPU). On CPU it caps RSS growth."),
    headroom: float = typer.Option(0.05, "--headroom", help="Share of the budget kept free (default 5%)."),
    device: str = typer.Option("auto", "--device", help="auto | cuda | cpu."),
    warmup_steps: int = typer.Option(2, "--warmup-steps", help="Optimizer steps before the timed window."),
    steps: int = typer.Option(5, "--steps", help="Timed optimizer steps at most (the window stops earlier once the figure is stable; exactly this many with --window whole)."),
    window: str = typer.Option("adaptive", "--window", help="adaptive: time a non-boundary micro-step and the boundary at accumulation 2 and compose the step at --grad-accum (cost independent of the accumulation); whole: time whole optimizer steps at --grad-accum (a direct measurement)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Hard timeout of the probe process (s)."),
    seed: int = typer.Option(42, "--seed", help="Seed for weights and synthetic data."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow model code from the model dir (off by default)."),
    trainer: str = typer.Option("hf", "--trainer", help="hf | trl: time transformers.Trainer, or TRL's SFTTrainer with this candidate's sft_config.json (TRL's packing and collator)."),
    as_json: bool = typer.Option(False, "--json", help="Print only the result as JSON."),
    levers: dict[str, Any] | None = None,  # the candidate's levers, one option each (lever_options)
) -> None:
    """Measure one training configuration (tokens/s of real tokens, peak memory, status)."""
    from autotune.executors.local import run_probe_process
    from autotune.models import HubAccess

    notes: list[str] = []
    workload = Workload(
        model=model, seq_len=seq_len, mode=mode, lengths=lengths, dataset=dataset, tokenizer=tokenizer,
        split=split, lora_r=lora_r, lora_alpha=2 * lora_r, trust_remote_code=trust_remote_code, seed=seed,
        trainer=trainer,
    )  # fmt: skip
    candidate = Candidate(**(levers or {}), precision=precision)
    settings = ProbeSettings(device=device, budget_text=gpu_budget, headroom=headroom,
                             warmup_steps=warmup_steps, steps=steps, timeout_s=timeout, window=window,
                             cuda_alloc_conf=cuda_alloc_conf(_probe_device(device), os.environ))
    req = build_probe_request(workload, candidate, settings, hub=HubAccess.from_env(offline=offline),
                              config_name=config_name, sample_rows=sample_rows, notes=notes)
    for note in notes:
        console(stderr=True).print(flagged("note", note))
    if not as_json:
        console(stderr=True).print(f"probing {req.workload.model} ({req.workload.model_path}) ...", style="dim")
    result: ProbeResult = run_probe_process(req)
    if as_json:
        sys.stdout.write(dumps_json(result.to_dict(), indent=2) + "\n")
    else:
        render_probe_result(result, console())
    raise typer.Exit(PROBE_EXIT_CODES[result.status])
