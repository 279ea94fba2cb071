"""Stage 2 of a run: the plan. The device and its search space, the probe settings and workload, every
default resolved once, the pre-flight checks, the forecast of the time to answer, and the cache key
(which describes the run that runs, because everything downstream reads the plan). Nothing is written.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import SpecError
from autotune.run._request import Request, _confirm_policy, _lora_targets
from autotune.spec.budget import resolve_budget
from autotune.spec.probe_request import (
    Candidate,
    ProbeSettings,
    Workload,
    cuda_alloc_conf,
)
from autotune.spec.space import SearchSpace, load_space

__all__ = ["SearchPlan", "plan_search", "predict_run", "baseline_candidate"]

@dataclass(frozen=True)
class SearchPlan:
    """Stage 2's output, the run's resolved plan: what will be searched, where, under which budget, with
    every default resolved once (the cache key, the pre-flight, the forecast, the searcher and
    summary.json read it from here, so the key describes the run that runs)."""

    device: str  # cpu | cuda
    gpu_infos: list[dict[str, Any]]  # the GPUs in use (--gpus, default all visible)
    space: SearchSpace
    dropped: list[Any]
    notes: list[str]
    confirm_policy: Any  # search.ConfirmPolicy
    settings: ProbeSettings  # budget_bytes (spec.budget.resolve_budget) and the run-level timeout_s
    workload: Workload
    baseline: Candidate | None  # the HF default measured beside the search (None: --no-baseline)
    capabilities: dict[str, Any]
    max_world: int | None  # most GPUs one probe may use before the executor reports (spec.max_world)
    confirm_steps: int  # timed steps of a confirmation probe (spec.confirm_steps)
    prune: bool  # the memory model's pruner runs (spec.prune_default; a custom pruner replaces it)
    load_monitor: bool  # other load is watched (spec.load_monitor_default)
    rule: Any  # search.DeadlineRule: --probe-timeout's
    hardware: dict[str, Any] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)
    key: str = ""  # the cache key, from this plan (_cache_key)
    deadlines: Any = None  # search.Deadlines: each probe's deadline from its prediction (predict_run)
    forecast: dict[str, Any] = field(default_factory=dict)  # the predicted time to answer (_forecast.forecast)

    @property
    def budget_bytes(self) -> int:
        return int(self.settings.budget_bytes or 0)

    @property
    def usable(self) -> int | None:
        return self.settings.usable_bytes()


def plan_search(r: Request) -> SearchPlan:
    """Stage 2: the device and its space, the probe settings and workload, every default resolved, the
    preflight, then the cache key from the plan."""
    from autotune.spec.run_defaults import confirm_steps, load_monitor_default, max_world, prune_default

    a = r.args
    dev, gpu_infos = _detect_device(a.device, r.gpu_list, a.ray_address)
    workload = _workload(r)
    space_obj, dropped, caps, notes = _space_for_device(r.space, dev, gpu_infos, a.device, a.ray_address, a.mode,
                                                        a.source, workload.variable_lengths,
                                                        model_type=str(r.resolved.config.get("model_type") or ""))
    if a.gpus_per_trial is not None:
        space_obj = dataclasses.replace(space_obj, gpus_per_trial=(a.gpus_per_trial,))
    notes += _per_process_batch_note(a, dev, space_obj)
    settings, rule = _probe_settings(r, dev, gpu_infos)
    problems = workload.problems() + settings.problems() + _lora_target_problems(r, workload)
    if not problems:
        from autotune.probe.trl_probe import trainer_problems

        problems = trainer_problems(workload)
    if problems:
        raise SpecError(problems)
    plan = SearchPlan(
        device=dev, gpu_infos=gpu_infos, space=space_obj, dropped=dropped, notes=notes,
        confirm_policy=_confirm_policy(dev, a.confirm_rounds, a.confirm_tolerance), settings=settings,
        workload=workload, baseline=baseline_candidate(space_obj, a.effective_batch, dev) if a.baseline else None,
        capabilities=caps, max_world=max_world(dev, len(gpu_infos), cluster=a.ray_address is not None),
        confirm_steps=confirm_steps(a.steps), prune=prune_default(a.prune, dev),
        load_monitor=load_monitor_default(a.load_monitor, own_executor=a.executor is None,
                                          cluster=a.ray_address is not None),
        rule=rule,
    )  # fmt: skip
    if dev == "cpu":  # the --device auto refusal reads the prediction (a CPU space is small: milliseconds)
        deadlines, fc = _predict(r, plan)
        plan = dataclasses.replace(plan, deadlines=deadlines, forecast=fc)
    plan = dataclasses.replace(plan, notes=[*notes, *_preflight(r, plan)])
    hardware, software, key = _cache_key(r, plan)
    return dataclasses.replace(plan, hardware=hardware, software=software, key=key)


def _detect_device(device: str, gpus: list[int] | None, ray_address: str | None) -> tuple[str, list[dict[str, Any]]]:
    """(``cpu``|``cuda``, the NVML records of the GPUs in use). Reads NVML only; no torch."""
    from autotune.env import nvml_device_info

    if device == "cpu":
        if gpus:
            raise SpecError("--gpus was given with --device cpu; drop one of them")
        return "cpu", []
    infos = nvml_device_info()
    if gpus is not None and infos:
        by_index = {int(g["index"]): g for g in infos}
        missing = [g for g in gpus if g not in by_index]
        if missing:
            raise SpecError(f"--gpus {','.join(map(str, gpus))}: no GPU with index {missing[0]}; "
                            f"visible: {','.join(map(str, sorted(by_index))) or 'none'}")
        infos = [by_index[g] for g in gpus]
    if device == "cuda":
        if not infos and ray_address is None:
            raise SpecError("device cuda requested but no NVIDIA GPU is visible (NVML found none); use --device cpu")
        return "cuda", infos
    if infos or (ray_address is not None and gpus is not None):
        return "cuda", infos
    if gpus is not None and ray_address is None:
        raise SpecError(f"--gpus {','.join(map(str, gpus))} given but no NVIDIA GPU is visible here")
    return "cpu", []


def _ram_bytes() -> int:
    """The system memory: what a percentage budget is a share of on cpu (``spec.budget.PERCENT_RULE``)."""
    import psutil

    return int(psutil.virtual_memory().total)


def _probe_settings(r: Request, dev: str, gpu_infos: list[dict[str, Any]]) -> tuple[ProbeSettings, Any]:
    """(the probes' settings, the deadline rule): the budget in bytes and the run-level timeout."""
    from autotune.estimate import DeadlineRule

    a = r.args
    budget_bytes = resolve_budget(r.budget, device=dev, gpu_infos=gpu_infos, ram_bytes=_ram_bytes)
    rule = DeadlineRule.for_device(dev, r.probe_timeout_s)
    # the run-level timeout: the fixed one, else what an unpredictable probe gets (each probe's own
    # deadline is set when it is submitted: search.Deadlines)
    # a GPU run's probes, and the scripts it emits, run with expandable segments unless the user set their own
    settings = ProbeSettings(device=dev, budget_bytes=budget_bytes, budget_text=r.budget.text,
                             warmup_steps=a.warmup_steps, steps=a.steps,
                             timeout_s=rule.fixed_s if rule.fixed_s is not None else rule.unpredicted_s,
                             cuda_alloc_conf=cuda_alloc_conf(dev, os.environ))
    return settings, rule


def _lora_target_problems(r: Request, workload: Workload) -> list[str]:
    """LoRA target names the user listed that match no linear of the model (an architecture the estimator
    cannot read is not checked here: the probe reports it)."""
    if workload.mode == "full":
        return []
    from autotune.estimate.arch import arch_from_config, lora_targets_problem

    try:
        arch = arch_from_config(r.resolved.config)
    except Exception:  # noqa: BLE001 - an architecture the estimator does not know
        return []
    src = r.args.source
    from_file = src is not None and tuple(src.request.get("lora_targets") or ()) == tuple(workload.lora_targets)
    # the file's names are said as the file's, not as the option the user never typed
    problem = lora_targets_problem(arch, workload.lora_targets,
                                   named=f"--from {src.name}: its LoRA targets" if from_file else "--lora-targets")
    return [problem] if problem else []


def _workload(r: Request) -> Workload:
    a = r.args
    if a.dataset is not None and a.lengths != "fixed":
        raise SpecError("--lengths describes synthetic sequences and --dataset brings real ones: give one of them")
    return Workload(model=r.resolved.name, model_path=r.resolved.path, seq_len=a.seq_len, mode=a.mode,
                    dataset=a.dataset, trust_remote_code=a.trust_remote_code, seed=a.seed, lengths=a.lengths,
                    split=a.split, tokenizer=a.tokenizer, trainer=a.trainer, lora_r=a.lora_r,
                    lora_alpha=2 * a.lora_r if a.lora_alpha is None else a.lora_alpha,
                    lora_targets=_lora_targets(a.lora_targets))


def predict_run(r: Request, plan: SearchPlan) -> SearchPlan:
    """Stage 3b (a search will run, nothing is written yet): each probe's deadline rule and the predicted
    time to answer, printed with the run's notes; SpecError (exit 2) when ``--time-budget`` cannot hold
    the baseline and one candidate."""
    from autotune.run._forecast import check_time_budget, forecast_line

    a = r.args
    deadlines, fc = plan.deadlines, plan.forecast
    if deadlines is None:
        deadlines, fc = _predict(r, plan)
    check_time_budget(fc, time_budget_s=r.time_budget_s, time_budget_text=a.time_budget, steps=a.steps,
                      model_ref=a.model, max_trials=a.max_trials, probe_timeout_s=r.probe_timeout_s)
    return dataclasses.replace(plan, deadlines=deadlines, forecast=fc, notes=[*plan.notes, forecast_line(fc)])


def _slots(r: Request, plan: SearchPlan) -> int:
    """Probes that will run at once (before the executor exists: its rule, read from the request)."""
    if r.args.executor is not None:
        return max(1, int(r.args.executor.slots))
    if plan.device == "cuda" and plan.gpu_infos and r.args.ray_address is None:
        return max(1, len(plan.gpu_infos) // max(1, min(plan.space.gpus_per_trial)))
    return 1  # a CPU probe takes every core; a cluster's GPUs are not visible from here (at least 1)


def _predict(r: Request, plan: SearchPlan) -> tuple[Any, dict]:
    """(the run's Deadlines, the forecast of its time to answer)."""
    from autotune.estimate import Deadlines, make_predictor
    from autotune.run._forecast import ProbeCount, forecast
    from autotune.run._preflight import mean_sequence_tokens
    from autotune.search import distinct_candidates, usable_micro_batches, usable_worlds

    a, dev, space, workload, settings, rule = r.args, plan.device, plan.space, plan.workload, plan.settings, plan.rule
    from autotune.spec.run_defaults import pool_for

    # the run's own local pool forks its CPU probes from the warm server (_search._default_executor)
    warm = a.executor is None and pool_for(a.pool, device=dev, ray_address=a.ray_address) == "local"
    predictor = make_predictor(r.resolved.config, workload, device=dev, gpu_infos=plan.gpu_infos,
                               mean_tokens=mean_sequence_tokens(workload) if dev == "cpu" else None, warm=warm)

    def fits(c: Candidate) -> bool:
        from autotune.estimate import fits as fits_budget

        try:
            return fits_budget(workload, c, r.resolved.config, settings.budget_bytes, device=dev)
        except Exception:  # an architecture the memory model does not know: count it
            return True

    worlds, _ = usable_worlds(space, plan.max_world)
    mbs, _ = usable_micro_batches(space, a.effective_batch, worlds)
    distinct = distinct_candidates(space, effective_batch=a.effective_batch, micro_batches=mbs, worlds=worlds) \
        if worlds and mbs else None
    count = ProbeCount(max_trials=a.max_trials, top_k=a.top_k, confirm_rounds=plan.confirm_policy.rounds_for(a.top_k),
                       confirm_steps=plan.confirm_steps, baseline=plan.baseline, slots=_slots(r, plan),
                       distinct=distinct)
    fc = forecast(predictor, space=space, settings=settings, effective_batch=a.effective_batch,
                  max_world=plan.max_world, count=count, fits=fits)
    fc["deadline_text"] = rule.text() if fc.get("time_to_answer_s") is not None or rule.fixed_s is not None \
        else f"{rule.unpredicted_s:g} s"
    # the model strategy, and the walk with --stop-when-converged, end their search when more probes cannot
    # change the answer: --max-trials is then a bound, not the count
    fc["stops_early"] = a.strategy == "model" or bool(a.stop_when_converged)
    return Deadlines(rule=rule, predictor=predictor), fc


# bf16 matmuls on a CPU run through oneDNN, which keeps buffers per batch width: with variable-length batches a
# long run's peak grows with every width it meets (``python benchmarks/cpu_bf16_shapes.py``: flat in fp32 and with
# fixed widths, growing with each new width in bf16), while a short probe meets a few dozen
CPU_BF16_WIDTHS_NOTE = (
    "bf16 on a CPU with variable-length batches: oneDNN keeps buffers for every batch width it meets, so a long "
    "run's peak memory keeps growing past what a short probe measures; a bf16 answer's peak here is a lower "
    "bound (fp32, or batches of one fixed width, keep it flat)")


def _preflight(r: Request, plan: SearchPlan) -> list[str]:
    """Before anything is written: the CPU probe time, the batch, the weights, --ray-address, the dataset.

    Raises SpecError for what cannot run; returns notes for what can but the user should know."""
    from autotune.run._preflight import AUTO_CPU_PROBE_LIMIT_S, check_cpu_probe_time, preflight

    a, rule, notes = r.args, plan.rule, []
    if plan.device == "cpu":
        limit = rule.fixed_s if rule.fixed_s is not None else AUTO_CPU_PROBE_LIMIT_S
        limit_text = (f"{limit:g} s probe timeout (--probe-timeout)" if rule.fixed_s is not None
                      else f"{limit:g} s one probe may take on a CPU that --device auto fell back to")
        cpu_s = check_cpu_probe_time(plan.forecast.get("min_probe_s"), workload=plan.workload,
                                     effective_batch=a.effective_batch, limit_s=limit, limit_text=limit_text,
                                     requested_device=a.device, model_ref=a.model)  # fmt: skip
        if cpu_s is not None and rule.fixed_s is not None and cpu_s > rule.fixed_s:
            notes.append(f"one probe is predicted to take at least {cpu_s:,.0f} s on this CPU, past the "
                         f"{rule.fixed_s:g} s probe timeout (--probe-timeout)")
        if "bf16" in plan.space.precision and plan.workload.variable_lengths:
            notes.append(CPU_BF16_WIDTHS_NOTE)
    preflight(config=r.resolved.config, name=r.resolved.name, workload=plan.workload, space=plan.space,
              effective_batch=a.effective_batch, device=plan.device, budget_text=r.budget.text,
              budget_bytes=plan.budget_bytes, max_world=plan.max_world, ray_address=a.ray_address)  # fmt: skip
    return notes


def _cache_key(r: Request, plan: SearchPlan) -> tuple[dict, dict, str]:
    """(hardware, software, key) of ``plan``: everything that changes the answer
    (autotune/store/cache_key.py lists it)."""
    from autotune.store import (
        KeyedRequest,
        cache_key,
        dataset_identity,
        hardware_fingerprint,
        probe_fields,
        software_versions,
        workload_fields,
    )

    a = r.args
    probe = probe_fields(plan.settings)
    if plan.rule is not None and plan.rule.fixed_s is None:
        # each probe's deadline comes from its prediction: the key holds the rule, not the seconds
        probe["timeout_s"] = plan.rule.describe()
    hardware = hardware_fingerprint(plan.device, plan.gpu_infos)
    if a.ray_address is not None:
        hardware["ray_address"] = a.ray_address
    software = software_versions()
    if a.trainer == "trl":  # the probes measure TRL's code too
        from autotune.env import versions_of

        software.update(versions_of("trl", "datasets"))
    key = cache_key(KeyedRequest(
        model_config=r.resolved.config, space=plan.space.to_dict(), budget_bytes=plan.budget_bytes, seq_len=a.seq_len,
        effective_batch=a.effective_batch, mode=a.mode, hardware=hardware, software=software,
        dataset=dataset_identity(a.dataset, a.split) if a.hub is not None else dataset_identity(a.dataset),
        search=_search_settings(r, plan), model_revision=r.resolved.revision,
        workload=workload_fields(plan.workload), probe=probe, capabilities=plan.capabilities))  # fmt: skip
    return hardware, software, key


def _prune_setting(r: Request, plan: SearchPlan) -> bool | str:
    """Whether the memory model's pruner runs (the plan's), or ``custom:NAME`` for a pruner of yours."""
    pruner = r.args.pruner
    return f"custom:{getattr(pruner, '__qualname__', type(pruner).__name__)}" if pruner is not None else plan.prune


def _search_settings(r: Request, plan: SearchPlan) -> dict[str, Any]:
    """The search's part of the cache key, from the plan's resolved defaults."""
    a = r.args
    return {"max_trials": a.max_trials, "seed": a.seed, "top_k": a.top_k, "confirm_steps": plan.confirm_steps,
            "time_budget_s": r.time_budget_s, "gpus": r.gpu_list, "baseline": a.baseline,
            "prune": _prune_setting(r, plan),
            "verify_loss": a.verify_loss, "verify_loss_tolerance": a.verify_loss_tolerance,
            "confirm": plan.confirm_policy.to_dict(),
            **({"strategy": a.strategy} if a.strategy != "walk" else {}),  # (walk: keys as before)
            **({"stop_when_converged": True} if a.stop_when_converged else {}),
            "load_monitor": plan.load_monitor}  # fmt: skip


def _space_for_device(
    space: SearchSpace | None, dev: str, gpu_infos: list[dict[str, Any]], requested: str, ray_address: str | None,
    mode: str, source: Any = None, variable_lengths: bool = True, model_type: str = "",
) -> tuple[SearchSpace, list[Any], dict[str, Any], list[str]]:
    """(the space to search, the dropped choices, the capabilities, progress notes for the run).

    No space given: the situation's own (``default_space_for``), less what cannot repay its probes in this
    request (``situation_space``: torch.compile; packing when the data is fixed-length). Then the choices this
    device or installation cannot run are dropped (SpecError when a knob is left with none), and those a
    ``--from`` file's tuned copy could not carry (held at their default).
    """
    from autotune.run._preflight import default_space_for, detect_capabilities, situation_space
    from autotune.spec.capabilities import dropped_line, filter_space

    notes: list[str] = []
    situation = space is None
    if space is None:
        space = load_space(default_space_for(dev, mode, len(gpu_infos)))
        if requested == "auto" and dev == "cpu":
            notes.append("--device auto found no GPU: searching on cpu with the `cpu` search space "
                         "(--space names another, --device cuda insists on a GPU)")
        elif dev != "cpu":
            notes.append(f"searching the `{space.name}` space, this request's situation ({mode}, "
                         f"{max(1, len(gpu_infos))} GPU(s)); --space names another")
    if source is not None:
        space, note = _hold_distributed(space, source, dev, mode)
        notes += [note] if note else []
    caps = detect_capabilities(dev, gpu_infos, ray_address, model_type)
    space, dropped = filter_space(space, caps, mode=mode)
    if situation:
        space, dear = situation_space(space, variable_lengths=variable_lengths)
        dropped += dear
    if source is not None:
        space, held = _hold_unexpressed(space, source)
        dropped += held
    if dropped:
        notes.append(dropped_line(dropped, dev))
    return space, dropped, caps, notes


def _per_process_batch_note(a: Any, dev: str, space: SearchSpace) -> list[str]:
    """A ``--from`` file's batch keys count sequences per process: where the search may use several GPUs, say that
    the effective batch read from them is the whole step's (a file launched on several GPUs trained more)."""
    src = a.source
    if src is None or dev != "cuda" or max(space.gpus_per_trial) < 2 or a.effective_batch != src.request.get(
            "effective_batch"):
        return []
    return [f"{src.name}'s micro-batch x accumulation ({a.effective_batch}) counts the sequences of one process: the "
            f"search holds {a.effective_batch} a step across however many GPUs a configuration uses, and writes the "
            "tuned file's keys per process for the GPUs it names; if you launched the file on several GPUs, pass "
            "--effective-batch (its micro-batch x accumulation x GPUs) to hold the batch it trained with"]


def _hold_distributed(space: SearchSpace, source: Any, dev: str, mode: str) -> tuple[SearchSpace, str | None]:
    """The space with the ZeRO stage, offload and sharding held at the ``--from`` file's own (its write-back keeps
    its ``deepspeed`` / ``fsdp`` keys, so the tuned file trains with them: the probes measure them), and a note
    for the run. On a CPU, which runs no ZeRO or FSDP, the space is left as it is and the note says so."""
    from autotune.formats import setup_words

    setup, where = source.distributed, source.distributed_from
    if dev == "cpu":
        if not where:
            return space, None
        if setup is None:
            return space, (f"{where}: the probes measure without ZeRO or FSDP (a CPU probe runs neither), and the "
                           "tuned file keeps the reference")
        return space, (f"{source.name} trains with {setup_words(setup)} ({where}), which a CPU probe cannot run: "
                       "the probes measure without it, and the tuned file keeps it")
    if setup is None:
        raise SpecError(f"--from: {where}; give the path from the working directory (or beside the file), or "
                        "remove the deepspeed key to search without it")
    if mode == "qlora" and setup["zero_stage"]:
        raise SpecError(f"--from {source.name} trains QLoRA with {setup_words(setup)} ({where}), which autotune's "
                        "QLoRA probe cannot run (its 4-bit base is not sharded): remove its "
                        f"{'deepspeed' if setup['sharding'] == 'deepspeed' else 'fsdp'} key to measure without it")
    held = dataclasses.replace(space, zero_stage=(setup["zero_stage"],), offload=(setup["offload"],),
                               sharding=(setup["sharding"],))
    if held == space:
        return space, None
    return held, (f"the probes measure {setup_words(setup)}, "
                  + (f"as {where} sets it" if where else f"as {source.name} names no DeepSpeed or FSDP set-up")
                  + f", which the tuned {source.name} keeps (autotune chooses ZeRO, FSDP and offload only "
                  "without --from)")


def _hold_unexpressed(space: SearchSpace, source: Any) -> tuple[SearchSpace, list[Any]]:
    """The space with the levers the ``--from`` file's tuned copy could not carry held at their default
    (``formats.unexpressed_levers``), and those choices as dropped."""
    from autotune.formats import unexpressed_levers
    from autotune.spec.capabilities import DroppedChoice
    from autotune.spec.levers import LEVERS

    held: dict[str, tuple[Any, ...]] = {}
    dropped = []
    for lever, why in unexpressed_levers(source).items():
        default = LEVERS[lever].default
        for value in [v for v in space.choices(lever) if v != default]:
            dropped.append(DroppedChoice(lever, value, f"the tuned {source.name} could not carry it: {why}"))
            held[lever] = (default,)
    return (dataclasses.replace(space, **held) if held else space), dropped


def baseline_candidate(space: SearchSpace, effective_batch: int, device: str = "cpu") -> Candidate | None:
    """The "HF default" (what a user would type) for this effective batch, on the fewest GPUs.

    Compared like with like: on a GPU at bf16 when the space searches bf16 (everyone fine-tunes in
    bf16 there; an fp32 default would fold bf16-vs-fp32 into the speedup and often not fit), else fp32.
    """
    from autotune.spec.baseline import hf_default_candidate

    world = 1 if 1 in space.gpus_per_trial else min(space.gpus_per_trial)
    precision = "bf16" if device == "cuda" and "bf16" in space.precision else "fp32"
    try:
        cand = hf_default_candidate(effective_batch, world_size=world, precision=precision)
    except ValueError:
        return None
    if len(space.zero_stage) == len(space.offload) == len(space.sharding) == 1:
        # a distributed set-up held (a --from file's): the default is compared under it
        cand = dataclasses.replace(cand, zero_stage=space.zero_stage[0], offload=space.offload[0],
                                   sharding=space.sharding[0])
    if cand.micro_batch * cand.grad_accum * cand.world_size != effective_batch:
        return None  # it cannot hold this effective batch: no honest comparison
    return cand
