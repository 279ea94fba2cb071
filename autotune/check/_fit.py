"""``check --gpu``: does the file's configuration fit that GPU, and is its micro-batch the one to use there.

The file's levers (micro-batch, accumulation, checkpointing, precision, attention, Liger, optimizer, ZeRO,
offload, PEFT) are priced by the planner's own memory and speed models for the model the file (or ``--model``)
names, at the file's sequence length. The micro-batch advice asks the planner for the fastest micro-batch that
fits with everything else as the file has it and the effective batch kept: an 8B model at 4k tokens is told
micro-batch 1 is right where 2 does not fit, a small model at 512 tokens is told which larger one does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from autotune.errors import SpecError
from autotune.estimate import (
    GPU,
    HEADROOM,
    Arch,
    PlanLora,
    PlanWorkload,
    estimate_memory,
    plan,
    predict_speed,
)
from autotune.spec.levers import LEVERS
from autotune.spec.probe_request import CUDA_ALLOC_CONF_DEFAULT, Candidate, Workload, parse_lora_targets

__all__ = ["DEFAULT_FIT_SEQ_LEN", "FitTarget", "FileLevers", "fit_items", "GAIN_WORTH_SAYING", "OPTIM_ALIASES"]

# the sequence length assumed where neither the file nor --seq-len states one (the planner's default)
DEFAULT_FIT_SEQ_LEN = 2048
TRL_DEFAULT_MAX_LENGTH = 1024  # SFTConfig's max_length default (trl 1.16; tests/test_check_fit.py reads it from TRL)
# a larger micro-batch is advised when the speed model predicts at least this gain (its own error is larger
# than a few percent: smaller gains are not worth a config change)
GAIN_WORTH_SAYING = 0.10
_GIB = 2**30
# TrainingArguments' other names for optimizers the memory model prices (transformers' OptimizerNames)
OPTIM_ALIASES = {"adamw_bnb_8bit": "adamw_8bit", "adamw_torch_8bit": "adamw_8bit"}


@dataclass(frozen=True)
class FitTarget:
    """What memory and speed are judged against: the model (its architecture) on one catalog GPU.
    ``seq_len``/``mode``: given on the command line, over what the file states."""

    model: str
    arch: Arch
    gpu: GPU
    seq_len: int | None = None
    mode: str | None = None


@dataclass(frozen=True)
class FileLevers:
    """The training configuration a file states, as the planner prices it (read by the checklist's context)."""

    candidate: Candidate
    mode: str
    seq_len: int | None
    lora_r: int
    lora_targets: tuple[str, ...]
    assumed: tuple[str, ...] = ()  # what the file leaves unsaid and was assumed (said in the item)
    trainer: str = "hf"  # "trl": an SFTConfig, trained by TRL's SFTTrainer (its fused LM head)


def _gib(n: float) -> str:
    return f"{n / _GIB:,.1f} GiB"


def _workload(target: FitTarget, f: FileLevers) -> tuple[Workload, list[str]]:
    assumed = list(f.assumed)
    seq = target.seq_len or f.seq_len
    if seq is None and f.trainer == "trl":  # SFTConfig truncates to its own default when the file states none
        seq = TRL_DEFAULT_MAX_LENGTH
        assumed.append(f"{seq:,} tokens per sequence, TRL's default max_length (--seq-len)")
    if seq is None:
        seq = DEFAULT_FIT_SEQ_LEN
        assumed.append(f"{seq:,} tokens per sequence, the file states none (--seq-len)")
    mode = target.mode or f.mode
    return Workload(model=target.model, seq_len=seq, mode=mode, lora_r=f.lora_r, lora_targets=f.lora_targets,
                    trainer=f.trainer), assumed


def _pins(c: Candidate) -> dict[str, Any]:
    """Every lever the file states, for the planner (micro-batch left out: that is what is asked)."""
    return {"grad_ckpt": c.grad_ckpt, "ckpt_every": c.ckpt_every, "zero_stage": c.zero_stage, "world_size": c.world_size,
            "offload": c.offload, "optim": c.optim, "precision": c.precision, "attn": c.attn, "liger": c.liger}


Item = tuple[str, str, str, str, str, dict[str, Any]]  # (id, title, status, message, fix, figures)


def fit_items(target: FitTarget, f: FileLevers) -> list[Item]:
    """The items: the file's predicted peak on the GPU, and the micro-batch (with the figures behind each)."""
    wl, assumed = _workload(target, f)
    cand, gpu = f.candidate, target.gpu
    arch = target.arch
    if arch.learned_positions and arch.max_positions and wl.seq_len > arch.max_positions:
        # what plan refuses: the first row longer than the position table ends the run with an index error
        return [("fit", "sequence length", "fail",
                 f"{target.model} has learned positions up to {arch.max_positions:,} tokens "
                 f"(max_position_embeddings); rows of {wl.seq_len:,} tokens index past them and the first such batch "
                 "ends the run", f"a maximum length of {arch.max_positions:,} or less",
                 {"model": target.model, "gpu": gpu.name, "seq_len": wl.seq_len, "max_positions": arch.max_positions})]
    if cand.precision == "bf16" and not gpu.bf16:  # the mixed-precision item FAILs it; priced as its fix runs
        cand = replace(cand, precision="fp16")
        f = replace(f, candidate=cand)
        assumed.append(f"fp16, as {gpu.name} has no bf16 (see mixed precision)")
    usable = int(gpu.memory_bytes * (1 - HEADROOM))
    mem = estimate_memory(target.arch, wl, cand, device="cuda", gpu=gpu)
    own = predict_speed(target.arch, wl, cand, gpu)
    what = (f"{target.model}, {wl.mode}, micro-batch {cand.micro_batch} of {wl.seq_len:,} tokens"
            + (f" on each of {cand.world_size} GPUs" if cand.world_size > 1 else ""))
    said = f" (assumed: {'; '.join(assumed)})" if assumed else ""
    title = f"memory on {gpu.name}"
    best = _fastest(target, f, wl)
    figures = {"model": target.model, "gpu": gpu.name, "mode": wl.mode, "seq_len": wl.seq_len,
               "micro_batch": cand.micro_batch, "grad_accum": cand.grad_accum, "predicted_peak_bytes": mem.total,
               "capacity_bytes": gpu.memory_bytes, "usable_bytes": usable,
               "predicted_tokens_per_s": round(own.tokens_per_s, 1), "assumed": assumed}
    if mem.total > usable:
        # over the whole card: out of memory; inside the headroom the planner keeps: too tight to trust
        status = "fail" if mem.total > gpu.memory_bytes else "warn"
        top = max(mem.terms.items(), key=lambda kv: kv[1])[0] if mem.terms else ""
        room = (f"over the {_gib(gpu.memory_bytes)} of one {gpu.name}" if status == "fail" else
                f"inside the {HEADROOM:.0%} headroom kept on one {gpu.name} ({_gib(usable)} usable)")
        fix = _fix_over(target, wl, cand, best)
        if status == "warn" and not (best is not None and best.candidate.micro_batch < cand.micro_batch):
            fix = ("the headroom is what fragmentation and a long run's longest batches use: "
                   + fix.split(": ", 1)[1] if ": " in fix else fix)
        return [("fit", title, status, f"{what}: predicted peak {_gib(mem.total)}, {room}; largest term: {top}{said}",
                 fix, {**figures, **_advised(best, cand)})]
    items: list[Item] = [("fit", title, "pass", f"{what}: predicted peak {_gib(mem.total)} of {_gib(usable)} usable, "
                          f"~{own.tokens_per_s:,.0f} tok/s{said}", "", figures)]
    items += _allocator_item(mem, cand, gpu, usable)
    items.append(_batch_item(target, wl, cand, own.tokens_per_s, best))
    return items


def _allocator_item(mem: Any, cand: Candidate, gpu: GPU, usable: int) -> list[Item]:
    """Where variable-length batches would grow the default allocator's reserve (with the CUDA context, the peak the
    fit item states) past the card: the setting that keeps it at the fixed-length figure (the file cannot say how the run is launched, nor how long its data's
    sequences are, so this informs rather than fails)."""
    context = mem.terms.get("cuda_context", 0)
    grown = mem.reserved_variable_lengths + context
    if cand.packing or grown <= usable:
        return []
    return [("allocator", "CUDA allocator with variable lengths", "info",
             f"if your sequences vary in length, the default caching allocator grows the peak to about {_gib(grown)} "
             f"(cached blocks a longer batch cannot reuse; the CUDA context included, as in the predicted peak), past "
             f"the {_gib(usable)} usable on {gpu.name}: it then frees "
             f"and retries, stalling steps; launch with PYTORCH_CUDA_ALLOC_CONF={CUDA_ALLOC_CONF_DEFAULT}, which keeps "
             f"it near the predicted {_gib(mem.total)}",
             "", {"reserved_variable_lengths_bytes": grown, "usable_bytes": usable})]


def _fastest(target: FitTarget, f: FileLevers, wl: Workload) -> Any:
    """The planner's fastest option on the GPU with every lever but the micro-batch as the file has it
    (the effective batch kept), or None where no micro-batch fits in the file's mode."""
    c = f.candidate
    try:
        result = plan(target.arch, gpus=[target.gpu], gpus_per_node=c.world_size, seq_len=wl.seq_len,
                      effective_batch=c.micro_batch * c.grad_accum * c.world_size, mode=wl.mode,
                      model_name=target.model, lora=PlanLora(f.lora_r, tuple(f.lora_targets)), pin=_pins(c),
                      workload=PlanWorkload(trainer=f.trainer))
    except SpecError:
        return None
    option = result.rows[0].option
    return option if option is not None and option.mode == wl.mode else None


def _fix_over(target: FitTarget, wl: Workload, c: Candidate, best: Any) -> str:
    if best is not None and best.candidate.micro_batch < c.micro_batch:
        b = best.candidate
        return (f"micro-batch {b.micro_batch} x accumulation {b.grad_accum} keeps the effective batch and is predicted "
                f"at {_gib(best.memory.total)} (~{best.speed.tokens_per_s:,.0f} tok/s)")
    eb = c.micro_batch * c.grad_accum * c.world_size
    trl = wl.trainer == "trl"  # TRL's own fused LM head: Liger's fused loss is off under it, nothing to offer
    unused = [name for name, used in (("checkpointing", c.grad_ckpt and c.ckpt_every == 1), ("Liger", c.liger or trl),
                                      ("LoRA", wl.mode != "full"), ("QLoRA", wl.mode == "qlora"),
                                      ("ZeRO-3", c.zero_stage == 3)) if not used]
    return (f"no micro-batch fits with these levers: `autotune plan --model {target.model} --gpu {target.gpu.name} "
            f"--mode {wl.mode} --seq-len {wl.seq_len} --effective-batch {eb}{' --trainer trl' if trl else ''}` names "
            "the levers that do" + (f" ({', '.join(unused)} not in use here)" if unused else ""))


def _advised(best: Any, c: Candidate) -> dict[str, Any]:
    """The micro-batch the planner would use here (the file's own where none fits better), for --json."""
    if best is None:
        return {"advised_micro_batch": None, "advised_grad_accum": None}
    b = best.candidate
    return {"advised_micro_batch": b.micro_batch, "advised_grad_accum": b.grad_accum,
            "advised_peak_bytes": best.memory.total, "advised_tokens_per_s": round(best.speed.tokens_per_s, 1)}


def _batch_item(target: FitTarget, wl: Workload, c: Candidate, own_tps: float, best: Any) -> Item:
    title, gpu = "micro-batch / accumulation", target.gpu
    figures = {"micro_batch": c.micro_batch, "grad_accum": c.grad_accum, "predicted_tokens_per_s": round(own_tps, 1),
               **_advised(best, c)}
    here = f"micro-batch {c.micro_batch} x accumulation {c.grad_accum}"
    if best is None or best.candidate.micro_batch == c.micro_batch:
        bigger = _next_micro_batch(target, wl, c)
        return ("batch", title, "pass", f"{here}: the fastest micro-batch predicted to fit on {gpu.name} with these "
                f"levers{bigger}", "", figures)
    b, gain = best.candidate, best.speed.tokens_per_s / own_tps - 1
    if gain < GAIN_WORTH_SAYING:
        return ("batch", title, "pass", f"{here}: within {GAIN_WORTH_SAYING:.0%} of the fastest predicted on "
                f"{gpu.name} (micro-batch {b.micro_batch} also fits: {gain:+.0%})", "", figures)
    return ("batch", title, "warn", f"{here}: micro-batch {b.micro_batch} x accumulation {b.grad_accum} keeps the "
            f"effective batch, is predicted to fit on {gpu.name} ({_gib(best.memory.total)}) and to run "
            f"~{best.speed.tokens_per_s:,.0f} tok/s against ~{own_tps:,.0f} ({gain:+.0%})",
            f"set the micro-batch to {b.micro_batch} and accumulation to {b.grad_accum} (autotune run measures it)",
            figures)


def _next_micro_batch(target: FitTarget, wl: Workload, c: Candidate) -> str:
    """`` (micro-batch 2: 25.4 GiB)``: why the next micro-batch that keeps the effective batch is not it."""
    eb = c.micro_batch * c.grad_accum
    nxt = next((m for m in range(c.micro_batch + 1, eb + 1) if eb % m == 0), None)
    if nxt is None:
        return " (no accumulation left to trade)"
    mem = estimate_memory(target.arch, wl, replace(c, micro_batch=nxt, grad_accum=eb // nxt), device="cuda",
                          gpu=target.gpu)
    return f" (micro-batch {nxt}: {_gib(mem.total)})"


def file_levers(req: Mapping[str, Any], ta: Mapping[str, Any], *, mode: str, world: int, precision: str | None,
                offload: str, trainer: str = "hf") -> FileLevers:
    """The file's configuration from its request fields (``formats.<fmt>.to_request``) and its
    TrainingArguments view; what it leaves unsaid takes the HF stack's default, as training would."""
    assumed: list[str] = []
    optim = req.get("optim") or ta.get("optim") or LEVERS["optim"].hf_default
    optim = OPTIM_ALIASES.get(optim, optim)
    if optim not in LEVERS["optim"].values:
        assumed.append(f"optimizer {optim} priced as {LEVERS['optim'].hf_default}")
        optim = LEVERS["optim"].hf_default
    attn = req.get("attn") if req.get("attn") in LEVERS["attn"].values else LEVERS["attn"].hf_default
    targets = req.get("lora_targets", "attn")
    cand = Candidate(
        micro_batch=int(req.get("micro_batch", 8)), grad_accum=int(req.get("grad_accum", 1)),
        grad_ckpt=bool(req.get("grad_ckpt", False)), ckpt_every=int(req.get("ckpt_every", 1)), attn=attn,
        precision=precision or LEVERS["precision"].hf_default, liger=bool(req.get("liger", ta.get("use_liger_kernel"))),
        world_size=world, zero_stage=int(req.get("zero_stage", 0) or 0), offload=offload, optim=optim,
    )  # fmt: skip
    return FileLevers(candidate=cand, mode=mode, seq_len=req.get("seq_len"), lora_r=int(req.get("lora_r", 16)),
                      lora_targets=parse_lora_targets(targets) if isinstance(targets, str) else tuple(targets),
                      assumed=tuple(assumed), trainer=trainer)
