"""Capacity planning: for each GPU, does the workload fit, with which levers, how fast, at what cost.  [pure]

:func:`plan` searches a small lever space per GPU (micro-batch 1..64 in powers of two dividing the
effective batch, checkpointing off/on, Liger's fused loss off/on, data parallel / ZeRO 0..3 over
1..gpus_per_node GPUs, ZeRO-Offload) with the memory model, keeps what fits under the GPU's memory
less ``HEADROOM``, and picks the fastest by the speed model (ties: fewer levers, fewer GPUs). When
the requested mode fits nowhere it tries LoRA, then QLoRA, and says so.

:func:`predict_peak_bytes` / :func:`should_prune` are what ``autotune run`` uses to skip candidates
that cannot fit: a candidate is pruned only when its predicted peak exceeds the budget by
``PRUNE_FACTOR`` (25%), so near the boundary the probe, not the model, decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import SpecError
from autotune.estimate.arch import Arch, arch_from_config
from autotune.estimate.catalog import GPU
from autotune.estimate.memory import DEFAULT_OPTIM, MemoryBreakdown, estimate_memory
from autotune.estimate.speed import SpeedEstimate, predict_speed
from autotune.spec.budget import format_bytes
from autotune.spec.capabilities import liger_problem
from autotune.spec.lengths import parse_lengths
from autotune.spec.levers import LEVERS, ZERO_STAGES, or_list, rule_problems, value_problem
from autotune.spec.probe_request import (
    MODE_CHOICES,
    OFFLOAD_CHOICES,
    TRAINER_CHOICES,
    Candidate,
    Workload,
)

__all__ = [
    "HEADROOM",
    "LEVER_FOR_TERM",
    "MAX_GPUS_PER_NODE",
    "MICRO_BATCHES",
    "PIN_FIELDS",
    "PRUNE_FACTOR",
    "GPUPlan",
    "PlanOption",
    "PlanLora",
    "PlanWorkload",
    "PlanResult",
    "breakdown",
    "fits",
    "parse_tokens",
    "plan",
    "predict_peak_bytes",
    "should_prune",
]

# Prune a candidate only when predicted peak > budget x PRUNE_FACTOR (the probe decides near the edge).
PRUNE_FACTOR = 1.25
# A plan must leave this share of the GPU's memory free.
HEADROOM = 0.05
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
# the plan prices one node's link (the catalog's interconnect): the largest nodes sold hold 8 GPUs (HGX, MI300X
# platforms) and a few 16 (HGX-2); more ranks than that cross nodes, whose network the plan does not model
MAX_GPUS_PER_NODE = 16
_FALLBACK = {"full": ("lora", "qlora"), "lora": ("qlora",), "qlora": ()}
# Optimizers the plan may choose for full fine-tuning (LoRA's states are small: the default only;
# ZeRO-Offload runs DeepSpeed's CPU Adam). The first is transformers 5.x's default.
OPTIM_LEVERS = (DEFAULT_OPTIM, "adamw_8bit", "paged_adamw_8bit", "adafactor")
_OPTIM_TEXT = {
    "adamw_torch": "foreach AdamW (adamw_torch)", "adamw_8bit": "8-bit AdamW",
    "paged_adamw_8bit": "paged 8-bit AdamW", "paged_adamw_32bit": "paged AdamW", "adafactor": "Adafactor",
    "sgd": "SGD",
}  # fmt: skip
# An optimizer that changes the update (8-bit, paged, Adafactor) is chosen only when it makes the plan
# this much faster than the best with transformers' default (or the default does not fit).
OPTIM_SWITCH_MARGIN = 1.05
# ZeRO/FSDP where plain data parallelism fits too: its gather and reduce-scatter hooks per parameter and its
# extra kernel launches are not in the speed model, so a predicted gain under this margin is no reason to add
# DeepSpeed (a 135M LoRA on 8 GPUs had been planned with ZeRO-3 for a predicted 0.6 %)
ZERO_SWITCH_MARGIN = 1.05
# Candidate fields ``plan(pin=...)`` accepts (the levers the planner prices): what is pinned is not searched.
PIN_FIELDS = tuple(name for name, lv in LEVERS.items() if lv.planned)
# What shrinks each memory term (the text output names it for the dominant term).
LEVER_FOR_TERM = {
    "weights": "ZeRO-3 sharding, LoRA, or QLoRA's 4-bit base",
    "gradients": "ZeRO-2 (sharded gradients) or ZeRO-Offload",
    "gradients_fp32": "ZeRO sharding over more GPUs, or ZeRO-Offload",
    "master_weights": "ZeRO sharding over more GPUs, or ZeRO-Offload",
    "optimizer_states": "an 8-bit or paged optimizer, ZeRO sharding, or ZeRO-Offload",
    "optimizer_temp": "fused AdamW (adamw_torch_fused) has no foreach temporary",
    "tied_embedding_grad": "ZeRO-2 (sharded gradients), or LoRA (the embedding frozen)",
    "activations": "gradient checkpointing or a smaller micro-batch",
    "logits_loss": "Liger's fused linear+cross-entropy, or a smaller micro-batch / sequence",
    "recompute_working_set": "a smaller micro-batch",
    "weight_copies": "gradient checkpointing (autocast's 16-bit copies are remade in the recompute)",
    "attention_mask": "flash_attention_2 (packed batches need no 4D mask)",
    "zero_buffers": "smaller DeepSpeed buckets (reduce_bucket_size / allgather_bucket_size)",
    "gathered_params": "parameter offload does not shrink it; a smaller stage3_max_live_parameters does",
    "ddp_buckets": "ZeRO-1/2 instead of DDP",
    "lora_adapters": "a lower LoRA rank or fewer target modules",
    "qlora_dequant": "none (one layer's dequantized weight)",
    "allocator_reserve": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "cuda_context": "none (fixed per process)",
}


def _arch(arch_or_config: Arch | Mapping[str, Any]) -> Arch:
    return arch_or_config if isinstance(arch_or_config, Arch) else arch_from_config(arch_or_config)


def predict_peak_bytes(
    workload: Workload,
    candidate: Candidate,
    config: Mapping[str, Any] | Arch,
    device: str = "cuda",
    gpu: GPU | None = None,
) -> int:
    """Predicted peak bytes of one device for a probe of ``candidate`` (config: the model's
    ``config.json`` as a dict, or an Arch). ``device="cpu"`` predicts a CPU probe's RSS growth."""
    return estimate_memory(_arch(config), workload, candidate, device=device, gpu=gpu).total


def should_prune(predicted_bytes: int, budget_bytes: int, factor: float = PRUNE_FACTOR) -> bool:
    """True when a candidate is predicted far above budget (> budget x factor): skip probing it."""
    return predicted_bytes > budget_bytes * factor


def fits(
    workload: Workload,
    candidate: Candidate,
    config: Mapping[str, Any] | Arch,
    budget_bytes: int,
    *,
    device: str = "cuda",
    gpu: GPU | None = None,
    headroom: float = HEADROOM,
) -> bool:
    """Whether the predicted peak stays under ``budget_bytes`` less ``headroom``."""
    return predict_peak_bytes(workload, candidate, config, device, gpu) <= budget_bytes * (1 - headroom)


@dataclass(frozen=True)
class PlanOption:
    """One configuration that fits, with its predicted memory and speed."""

    mode: str
    candidate: Candidate
    memory: MemoryBreakdown
    speed: SpeedEstimate
    levers: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "mode": self.mode,
            "candidate": asdict(self.candidate),
            "levers": list(self.levers),
            "memory": self.memory.to_dict(),
            "speed": self.speed.to_dict(),
        }


@dataclass(frozen=True)
class GPUPlan:
    """The answer for one GPU. ``fits`` is about the requested mode; ``option`` may be a fallback
    mode (``option.mode``) when the requested one fits nowhere."""

    gpu: GPU
    capacity_bytes: int
    usable_bytes: int
    fits: bool
    option: PlanOption | None
    min_gpus: int | None  # fewest GPUs with which option.mode fits at all
    hours: float | None
    cost_usd: float | None
    note: str = ""
    smallest: PlanOption | None = None  # when nothing fits: the configuration that came closest
    assumptions: tuple[str, ...] = ()  # what the answer depends on that the user did not choose (Liger installed)

    @property
    def shown(self) -> PlanOption | None:
        """The option whose memory the answer breaks down: the chosen one, or the closest when nothing fits."""
        return self.option or self.smallest

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu.name,
            "capacity_bytes": self.capacity_bytes,
            "usable_bytes": self.usable_bytes,
            "fits": self.fits,
            "mode": self.option.mode if self.option else None,
            "option": self.option.to_dict() if self.option else None,
            "min_gpus": self.min_gpus,
            "hours": self.hours,
            "cost_usd": self.cost_usd,
            "price_per_hour_usd": self.gpu.price_per_hour_usd,
            "price_date": self.gpu.price_date,
            "note": self.note,
            "breakdown": breakdown(self.shown) if self.shown else None,
            "smallest": self.smallest.to_dict() if self.smallest else None,
            "assumptions": list(self.assumptions),
            "host_bytes": self.option.memory.host_bytes if self.option else None,
            "host_memory_per_gpu_bytes": self.gpu.host_memory_bytes_per_gpu,
        }


@dataclass(frozen=True)
class PlanResult:
    model: str
    arch: Arch
    mode: str
    seq_len: int
    effective_batch: int
    gpus_per_node: int
    tokens: int | None
    rows: tuple[GPUPlan, ...]
    notes: tuple[str, ...] = field(default=())
    pinned: dict[str, Any] = field(default_factory=dict)
    lengths: str = "fixed"
    trainer: str = "hf"

    def to_dict(self) -> dict[str, Any]:
        a = self.arch
        return {
            "model": self.model,
            "params": a.params_total,
            "architecture": {
                "model_type": a.model_type, "hidden": a.hidden, "layers": a.layers, "heads": a.heads,
                "kv_heads": a.kv_heads, "head_dim": a.head_dim, "intermediate": a.intermediate,
                "vocab": a.vocab, "tied": a.tied,
            },
            "mode": self.mode,
            "seq_len": self.seq_len,
            "lengths": self.lengths,
            "trainer": self.trainer,
            "effective_batch": self.effective_batch,
            "gpus_per_node": self.gpus_per_node,
            "tokens": self.tokens,
            "gpus": [r.to_dict() for r in self.rows],
            "notes": list(self.notes),
            "pinned": dict(self.pinned),
        }  # fmt: skip


def breakdown(option: PlanOption) -> dict[str, Any]:
    """The chosen configuration's memory terms sorted by share of the peak, the dominant term and
    the lever that shrinks it."""
    mem = option.memory
    total = max(mem.total, 1)
    terms = sorted(mem.terms.items(), key=lambda kv: -kv[1])
    top = terms[0][0] if terms else ""
    return {
        "phase": mem.phase,
        "total": mem.total,
        "terms": [{"term": k, "bytes": v, "share": v / total} for k, v in terms],
        "dominant": top,
        "lever": _lever_for(top, option),
        "optimizer": option.candidate.optim,
    }


def _lever_for(term: str, option: PlanOption) -> str:
    """What shrinks ``term`` (``LEVER_FOR_TERM``), less what the option already uses."""
    c = option.candidate
    if term == "weights" and option.mode == "qlora":
        return "already 4-bit: a GPU with more memory (autotune's QLoRA probe does not shard the base)"
    if term == "weights" and option.mode == "lora":
        return "ZeRO-3 sharding over more GPUs, or QLoRA's 4-bit base" if c.zero_stage < 3 else "more GPUs, or QLoRA"
    if term == "activations" and c.grad_ckpt and c.ckpt_every == 1:
        return ("a shorter sequence (every layer is checkpointed already, micro-batch 1)" if c.micro_batch == 1 else
                "a smaller micro-batch or sequence (every layer is checkpointed already)")
    lever = LEVER_FOR_TERM.get(term, "")
    if c.micro_batch == 1:  # no smaller one
        lever = {"activations": "gradient checkpointing (micro-batch 1 already)",
                 "logits_loss": "Liger's fused linear+cross-entropy, or a shorter sequence (micro-batch 1 already)",
                 "recompute_working_set": "a shorter sequence (micro-batch 1 already)"}.get(term, lever)
    return lever


def _gpus_text(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _checkpointing(pin: dict[str, Any]) -> list[tuple[bool, int]]:
    """The (grad_ckpt, ckpt_every) pairs a plan tries: off, then one layer in k for each k the lever offers
    (``autotune.spec.levers``), every layer last; what is pinned, as pinned."""

    ckpts = (pin["grad_ckpt"],) if "grad_ckpt" in pin else (False, True)
    everies = (pin["ckpt_every"],) if "ckpt_every" in pin else tuple(sorted(LEVERS["ckpt_every"].values, reverse=True))
    return [(ckpt, every) for ckpt in ckpts for every in (everies if ckpt else (1,))]


def _levers(c: Candidate, mode: str, workload: Workload) -> tuple[str, ...]:
    out: list[str] = []
    if mode == "lora":
        out.append(f"LoRA r={workload.lora_r}")
    elif mode == "qlora":
        out.append(f"QLoRA r={workload.lora_r}")
    if c.grad_ckpt:
        out.append("checkpointing" + (f" (1 layer in {c.ckpt_every})" if c.ckpt_every > 1 else ""))
    if c.packing:
        out.append("packing")
    if c.liger and workload.trainer != "trl":  # (TRL turns Liger's loss off: its own fused head; a note says so)
        out.append("Liger fused loss")
    if c.zero_stage:
        out.append(f"ZeRO-{c.zero_stage}, {_gpus_text(c.world_size)}")
    elif c.world_size > 1:
        out.append(f"DDP, {_gpus_text(c.world_size)}")
    if c.offload == "optimizer":
        out.append("optimizer offload")
    elif c.offload == "params":
        out.append("param+optimizer offload")
    if c.optim != DEFAULT_OPTIM and c.offload == "none":
        out.append(_OPTIM_TEXT.get(c.optim, c.optim))
    return tuple(out)


def _world_sizes(gpus_per_node: int, effective_batch: int | None = None) -> list[int]:
    """The GPU counts a plan tries: the powers of two up to the node and the node itself, and (given the effective
    batch) every count of the node that divides it (12 sequences on a node of 8 run on 6, not only on 4)."""
    sizes = {w for w in (1, 2, 4, 8, 16) if w <= gpus_per_node} | {gpus_per_node}
    if effective_batch:
        sizes |= {w for w in range(1, gpus_per_node + 1) if effective_batch % w == 0}
    return sorted(sizes)


def _sharding(mode: str, world: int, pin: Mapping[str, Any]) -> list[tuple[int, str]]:
    if mode != "qlora" and ("zero_stage" in pin or "offload" in pin):
        opts = [(z, o) for z in ZERO_STAGES for o in OFFLOAD_CHOICES
                if not rule_problems({"zero_stage": z, "offload": o})]
        return [(z, o) for z, o in opts if pin.get("zero_stage", z) == z and pin.get("offload", o) == o]
    if mode == "qlora":  # the QLoRA probe does not shard its 4-bit base (a pin elsewhere: no QLoRA option)
        return [(0, "none")] if pin.get("zero_stage", 0) == 0 and pin.get("offload", "none") == "none" else []
    if mode == "lora":
        # the frozen base is what fills the GPU: ZeRO-3 shards it (ZeRO-1/2 shard only the adapters' small
        # gradients and optimizer states, which DDP holds whole at little cost)
        return [(0, "none")] if world == 1 else [(0, "none"), (3, "none")]
    opts = [(0, "none")] if world == 1 else [(0, "none"), (1, "none"), (2, "none"), (3, "none")]
    opts += [(2, "optimizer"), (3, "optimizer"), (3, "params")]
    return opts


def _optims(mode: str, offload: str, pin: Mapping[str, Any]) -> tuple[str, ...]:
    if "optim" in pin:
        return (pin["optim"],)
    if mode != "full" or offload != "none":
        return (DEFAULT_OPTIM,)
    return OPTIM_LEVERS


def _search(
    arch: Arch,
    workload: Workload,
    gpu: GPU,
    *,
    usable: int,
    gpus_per_node: int,
    effective_batch: int,
    efficiency: float | None,
    pin: Mapping[str, Any],
) -> tuple[PlanOption | None, int | None, str, PlanOption | None]:
    """Fastest fitting option for one GPU and mode, the fewest GPUs that fit at all, why the host's RAM
    ruled offload out (empty when it did not), and the configuration with the smallest GPU footprint (what
    "nothing fits" is measured against)."""
    precision = pin.get("precision", gpu.half_precision)
    # FlashAttention-2 takes fp16/bf16 only: a pinned fp32 or tf32 plan runs sdpa
    fa2 = gpu.flash_attention_2 and precision in ("bf16", "fp16")
    attn = pin.get("attn", "flash_attention_2" if fa2 else "sdpa")
    host_per_gpu = gpu.host_memory_bytes_per_gpu
    best: tuple[tuple[float, int, int], PlanOption] | None = None
    smallest: tuple[Candidate, MemoryBreakdown] | None = None
    min_gpus: int | None = None
    host_note = ""
    worlds = [pin["world_size"]] if "world_size" in pin else _world_sizes(gpus_per_node, effective_batch)
    ligers = liger_problem(arch.model_type) is None
    # packing changes nothing with fixed lengths (one full row per sequence): searched only when lengths vary
    packings = (pin["packing"],) if "packing" in pin else (False, True) if workload.lengths != "fixed" else (False,)
    for world, packing in ((w, p) for w in worlds for p in packings):
        for zero, offload in _sharding(workload.mode, world, pin):
            for optim in _optims(workload.mode, offload, pin):
                for ckpt, every in _checkpointing(pin):
                    for liger in (pin["liger"],) if "liger" in pin else (False, True) if ligers else (False,):
                        for mb in (pin["micro_batch"],) if "micro_batch" in pin else MICRO_BATCHES:
                            if effective_batch % (mb * world):
                                continue
                            cand = Candidate(
                                micro_batch=mb, grad_accum=effective_batch // (mb * world), grad_ckpt=ckpt,
                                ckpt_every=every, attn=attn, precision=precision, liger=liger, world_size=world, zero_stage=zero,
                                offload=offload, optim=optim, packing=packing,
                            )  # fmt: skip
                            mem = estimate_memory(arch, workload, cand, device="cuda", gpu=gpu)
                            if smallest is None or mem.total < smallest[1].total:
                                smallest = (cand, mem)
                            if mem.total > usable:
                                break  # larger micro-batches need more memory still
                            if (
                                offload != "none"
                                and host_per_gpu is not None
                                and mem.host_bytes > host_per_gpu * world
                            ):
                                host_note = (
                                    f"offload needs {mem.host_bytes / 2**30:.0f} GiB of host RAM, more than "
                                    f"{world} x {host_per_gpu / 2**30:.0f} GiB ({gpu.host_memory_source or 'catalog'})"
                                )
                                break
                            min_gpus = world if min_gpus is None else min(min_gpus, world)
                            speed = predict_speed(arch, workload, cand, gpu, efficiency=efficiency)
                            levers = _levers(cand, workload.mode, workload)
                            score = speed.tokens_per_s
                            if optim not in ("adamw_torch", "adamw_torch_fused") and "optim" not in pin:
                                score /= OPTIM_SWITCH_MARGIN  # it changes the numerics: worth it only when clearly faster
                            if zero and "zero_stage" not in pin:
                                score /= ZERO_SWITCH_MARGIN
                            key = (round(score, 6), -len(levers), -world)
                            if best is None or key > best[0]:
                                best = (key, PlanOption(workload.mode, cand, mem, speed, levers))
    least = None
    if smallest is not None:
        cand, mem = smallest
        least = PlanOption(workload.mode, cand, mem, predict_speed(arch, workload, cand, gpu, efficiency=efficiency),
                           _levers(cand, workload.mode, workload))
    return (best[1] if best else None), min_gpus, host_note, least


def _check_pins(pin: Mapping[str, Any], gpus_per_node: int, effective_batch: int) -> list[str]:
    problems: list[str] = []
    unknown = sorted(set(pin) - set(PIN_FIELDS))
    if unknown:
        problems.append(f"cannot pin {', '.join(unknown)}; pinnable: {', '.join(PIN_FIELDS)}")
    problems += [m for name, v in pin.items() if name in PIN_FIELDS and (m := value_problem(name, v))]
    if problems:
        return problems
    problems += rule_problems(pin, given_only=True)
    for name, value in pin.items():  # a lever pinned to act where the pin of the lever it acts under stops it
        under = LEVERS[name].acts_under
        said = any(p.startswith(f"{name}=") for p in problems)  # a rule of its own already says why
        if under and not said and under[0] in pin and pin[under[0]] not in under[1] and value != LEVERS[name].default:
            problems.append(f"{name} {value} acts only with {under[0]} {or_list(under[1])}; "
                            f"{under[0]} is pinned to {pin[under[0]]}")
    w = pin.get("world_size")
    if w is not None and w > gpus_per_node:
        problems.append(f"world_size {w} exceeds gpus_per_node {gpus_per_node}")
    if w is not None and "micro_batch" not in pin and effective_batch % w:
        problems.append(f"effective_batch {effective_batch} is not a multiple of world_size {w}: each GPU takes a "
                        f"whole number of sequences per step; give an effective batch that {w} divides")
    mb = pin.get("micro_batch")
    if mb is not None and effective_batch % (mb * (w or 1)):
        problems.append(
            f"effective_batch {effective_batch} is not a multiple of micro_batch {mb} x world_size {w or 1}"
        )
    return problems


@dataclass(frozen=True)
class PlanLora:
    """The adapters a LoRA/QLoRA plan prices: rank and target modules (``autotune.estimate.arch`` names them)."""

    r: int = 16
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class PlanWorkload:
    """What the run trains on and with, beyond the model and the sequence length: the sequences' length distribution
    (``autotune.spec.lengths``: ``fixed`` is ``seq_len`` each; ``lognormal:MU,SIGMA``, ...) and the trainer (``hf``:
    transformers' Trainer; ``trl``: TRL's SFTTrainer, whose fused LM head never materialises the logits)."""

    lengths: str = "fixed"
    trainer: str = "hf"


def plan(
    arch_or_config: Arch | Mapping[str, Any],
    *,
    gpus: Sequence[GPU],
    gpus_per_node: int = 8,
    seq_len: int = 2048,
    effective_batch: int = 64,
    mode: str = "full",
    tokens: int | None = None,
    model_name: str = "",
    lora: PlanLora | None = None,
    efficiency: Mapping[str, float] | None = None,
    pin: Mapping[str, Any] | None = None,
    workload: PlanWorkload | None = None,
) -> PlanResult:
    """Plan ``mode`` fine-tuning of a model (Arch or config.json dict) on each of ``gpus``.

    ``lora``: the adapters' rank and target modules for modes lora and qlora (default r 16 on q/k/v/o).
    ``efficiency`` maps GPU names to a calibrated base efficiency (from :func:`speed.calibrate`);
    others use the catalog default. ``tokens`` (training tokens) gives hours and cost. ``pin`` fixes
    Candidate fields (``PIN_FIELDS``: micro_batch, grad_ckpt, zero_stage, world_size, offload, optim,
    precision, attn, packing); what is pinned is not searched. ``workload``: the lengths (with variable lengths
    the speed counts the padding each configuration computes and packing is searched) and the trainer. A
    sequence longer than a learned-position model's ``max_position_embeddings`` (GPT-2) is refused; RoPE
    models get a note.
    """
    pin = dict(pin or {})
    lora = lora if lora is not None else PlanLora()
    workload = workload if workload is not None else PlanWorkload()
    problems = _plan_problems(mode, gpus, gpus_per_node, seq_len, effective_batch, lora.r, tokens, pin)
    lengths = workload.lengths
    try:
        lengths = "fixed" if parse_lengths(lengths).kind == "fixed" else lengths.strip()
    except SpecError as e:
        problems.append(str(e))
    if workload.trainer not in TRAINER_CHOICES:
        problems.append(f"trainer must be one of {', '.join(TRAINER_CHOICES)}; got {workload.trainer!r}")
    if problems:
        raise SpecError(problems)
    arch = _arch(arch_or_config)
    if pin.get("liger") and (why := liger_problem(arch.model_type)):
        raise SpecError(f"liger: {why}; drop --liger")
    model = model_name or arch.model_type
    notes = _position_notes(arch, seq_len, model)
    skipped = [w for w in _world_sizes(gpus_per_node) if effective_batch % w] if "world_size" not in pin else []
    if skipped:
        notes.append(f"effective batch {effective_batch} does not split over {', '.join(map(str, skipped))} GPUs "
                     "(each takes a whole number of sequences a step), so those were not considered; an effective "
                     "batch they divide would let them be")
    if mode != "full" and (why := _fused_attention_note(arch, tuple(lora.targets))):
        notes.append(why)
    if workload.trainer == "trl" and pin.get("liger"):
        notes.append("TRL's SFTTrainer turns Liger's fused cross-entropy off: its own fused LM head computes the loss")
    if tokens is not None and tokens < effective_batch * seq_len:
        notes.append(f"{tokens:,} training tokens are less than one optimizer step of the effective batch "
                     f"({effective_batch} x {seq_len:,} = {effective_batch * seq_len:,} token slots): the run is one "
                     "partial step that never reaches that batch; hours and cost are for those tokens")
    req = _Request(
        mode=mode, model=model, seq_len=seq_len, effective_batch=effective_batch, gpus_per_node=gpus_per_node,
        lora_r=lora.r, lora_targets=tuple(lora.targets), tokens=tokens, efficiency=efficiency, pin=pin,
        lengths=lengths, trainer=workload.trainer,
    )  # fmt: skip
    rows = [_plan_gpu(arch, gpu, req) for gpu in gpus]
    if any(r.option is not None and (r.option.speed.mfu or 0.0) > 1.0 for r in rows):
        notes.append("MFU counts attention at its full (non-causal) size, PaLM's convention, while a causal kernel "
                     "computes about half of it: at long sequences, where attention dominates, MFU can pass 100%")
    return PlanResult(
        model=model, arch=arch, mode=mode, seq_len=seq_len,
        effective_batch=effective_batch, gpus_per_node=gpus_per_node, tokens=tokens, rows=tuple(rows),
        notes=tuple(notes), pinned=pin, lengths=lengths, trainer=workload.trainer,
    )  # fmt: skip


def _plan_problems(
    mode: str,
    gpus: Sequence[GPU],
    gpus_per_node: int,
    seq_len: int,
    effective_batch: int,
    lora_r: int,
    tokens: int | None,
    pin: Mapping[str, Any],
) -> list[str]:
    """What is wrong with :func:`plan`'s arguments (the pins are checked only when the rest is right)."""
    problems: list[str] = []
    if mode not in MODE_CHOICES:
        problems.append(f"mode must be one of {', '.join(MODE_CHOICES)}; got {mode!r}")
    for name, v in (
        ("gpus_per_node", gpus_per_node),
        ("seq_len", seq_len),
        ("effective_batch", effective_batch),
        ("lora_r", lora_r),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            problems.append(f"{name} must be a positive integer; got {v!r}")
    if isinstance(gpus_per_node, int) and gpus_per_node > MAX_GPUS_PER_NODE:
        problems.append(f"gpus_per_node must be at most {MAX_GPUS_PER_NODE}, one node (the plan does not model the "
                        f"network between nodes); got {gpus_per_node}")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        problems.append(f"tokens must be a positive integer; got {tokens!r}")
    if not gpus:
        problems.append("at least one GPU is needed")
    if not problems:
        problems += _check_pins(pin, gpus_per_node, effective_batch)
    if not problems and mode == "qlora" and (pin.get("zero_stage") or pin.get("offload", "none") != "none"):
        problems.append("mode qlora with ZeRO/FSDP or offload: autotune's QLoRA probe does not shard its 4-bit base, so "
                        "it could not measure this plan; drop the zero_stage / offload pin")
    return problems


def _fused_attention_note(arch: Arch, targets: tuple[str, ...]) -> str:
    """The default ``attn`` targets on a model that fuses q, k and v into one linear (Phi-3's ``qkv_proj``): peft
    matches module names, so only the output projection is adapted, as the probe adapts it; say so ("" if not)."""
    from autotune.estimate.arch import lora_modules, peft_lora_modules
    from autotune.spec.probe_request import ATTN_TARGETS

    if targets != ATTN_TARGETS:
        return ""
    meant, adapted = lora_modules(arch, targets), peft_lora_modules(arch, targets)  # the family's map, peft's match
    missing, kept = sorted(meant - adapted), sorted(meant & adapted)
    if not missing:
        return ""
    return (f"--lora-targets attn adapts {', '.join(kept) or 'none of them'} here: q, k and v are one fused "
            f"{missing[0]}, which the names q_proj, k_proj, v_proj do not match (the probe adapts what peft matches); "
            f"name {','.join([*missing, *kept])} to adapt them")


def _position_notes(arch: Arch, seq_len: int, model: str) -> list[str]:
    """The model's notes, and one when ``seq_len`` passes RoPE's trained length; SpecError when it passes
    learned positions."""
    notes: list[str] = list(arch.notes)
    if arch.max_positions and seq_len > arch.max_positions:
        if arch.learned_positions:
            raise SpecError(
                f"seq_len {seq_len} exceeds {model}'s learned positions "
                f"(max_position_embeddings {arch.max_positions}); use --seq-len {arch.max_positions} or less"
            )
        notes.append(
            f"seq_len {seq_len} exceeds the model's max_position_embeddings {arch.max_positions}: RoPE extends, "
            "but quality past the trained length needs rope_scaling and long-context data"
        )
    return notes


@dataclass(frozen=True)
class _Request:
    """What :func:`plan` was asked (validated), as each GPU's row reads it."""

    mode: str
    model: str  # the workload's model name
    seq_len: int
    effective_batch: int
    gpus_per_node: int
    lora_r: int
    lora_targets: tuple[str, ...]
    tokens: int | None
    efficiency: Mapping[str, float] | None
    pin: dict[str, Any]
    lengths: str = "fixed"
    trainer: str = "hf"


@dataclass(frozen=True)
class _Fit:
    """One GPU's search over the requested mode, then its fallbacks, up to the first that fits."""

    option: PlanOption | None  # the fastest option of the mode that fits (None: none does)
    min_gpus: int | None  # fewest GPUs with which the last mode tried fits at all
    workload: Workload | None  # the workload of the last mode tried
    smallest: PlanOption | None  # the smallest footprint over the modes tried
    host_notes: tuple[str, ...]  # why the host's RAM ruled offload out, per mode


def _plan_gpu(arch: Arch, gpu: GPU, req: _Request) -> GPUPlan:
    """The answer for one GPU: the fastest fitting option (or a fallback mode), hours, cost and notes."""
    usable = int(gpu.memory_bytes * (1 - HEADROOM))
    eff = (req.efficiency or {}).get(gpu.name)
    unsupported = _unsupported(gpu, req.pin)
    modes = (req.mode, *_FALLBACK[req.mode]) if not unsupported else ()
    fit = _first_fit(arch, gpu, req, modes, usable, eff)
    option = fit.option
    note = _gpu_note(gpu, req, fit, usable, unsupported)
    assumptions = _liger_assumptions(arch, gpu, req, fit, usable, eff)
    hours = cost = None
    if option is not None and req.tokens:
        hours = req.tokens / option.speed.tokens_per_s / 3600.0
        if gpu.price_per_hour_usd is not None:
            cost = hours * option.candidate.world_size * gpu.price_per_hour_usd
    return GPUPlan(
        gpu=gpu, capacity_bytes=gpu.memory_bytes, usable_bytes=usable,
        fits=option is not None and option.mode == req.mode, option=option, min_gpus=fit.min_gpus,
        hours=hours, cost_usd=cost, note=note, smallest=fit.smallest if option is None else None,
        assumptions=assumptions,
    )  # fmt: skip


def _first_fit(
    arch: Arch, gpu: GPU, req: _Request, modes: tuple[str, ...], usable: int, eff: float | None
) -> _Fit:
    """Search ``modes`` in turn on one GPU, stopping at the first that fits."""
    option: PlanOption | None = None
    min_gpus: int | None = None
    wl: Workload | None = None
    smallest: PlanOption | None = None
    host_notes: list[str] = []
    for m in modes:
        wl = Workload(model=req.model, seq_len=req.seq_len, mode=m, lora_r=req.lora_r,
                      lora_targets=req.lora_targets, lengths=req.lengths, trainer=req.trainer)  # fmt: skip
        option, min_gpus, host_note, least = _search(
            arch, wl, gpu, usable=usable, gpus_per_node=req.gpus_per_node, effective_batch=req.effective_batch,
            efficiency=eff, pin=req.pin,
        )  # fmt: skip
        if host_note:
            host_notes.append(f"{m}: {host_note}")
        if least is not None and (smallest is None or least.memory.total < smallest.memory.total):
            smallest = least
        if option is not None:
            break
    return _Fit(option, min_gpus, wl, smallest, tuple(host_notes))


def _gpu_note(gpu: GPU, req: _Request, fit: _Fit, usable: int, unsupported: str) -> str:
    """Why the requested mode does not fit (or cannot run) on this GPU; "" when it fits."""
    mode, option, smallest = req.mode, fit.option, fit.smallest
    n_text = req.pin.get("world_size", req.gpus_per_node)
    note = ""
    if unsupported:
        note = unsupported
    elif option is None:
        note = f"nothing fits on {n_text}x {gpu.name} (tried {', '.join((mode, *_FALLBACK[mode]))})"
        if smallest is not None:
            c = smallest.candidate
            note += (f": the smallest footprint is {format_bytes(int(smallest.memory.total))} of "
                     f"{format_bytes(usable)} usable ({smallest.mode}, {', '.join(smallest.levers) or 'no levers'}, micro-batch "
                     f"{c.micro_batch} x {c.world_size} GPU(s))")  # fmt: skip
    elif option.mode != mode:
        note = f"{mode} does not fit on {n_text}x {gpu.name}; {option.mode} does"
    if fit.host_notes and (option is None or option.mode != mode):
        note += " (" + "; ".join(fit.host_notes) + ")"
    return note


def _liger_assumptions(
    arch: Arch, gpu: GPU, req: _Request, fit: _Fit, usable: int, eff: float | None
) -> tuple[str, ...]:
    """When the option relies on Liger's fused loss the user did not pin: what it gives without it."""
    option = fit.option
    if option is None or not option.candidate.liger or "liger" in req.pin:
        return ()
    assert fit.workload is not None  # the workload of the mode the search stopped at, option's
    plain, _, _, _ = _search(arch, fit.workload, gpu, usable=usable, gpus_per_node=req.gpus_per_node,
                             effective_batch=req.effective_batch, efficiency=eff, pin={**req.pin, "liger": False})
    without = (f"{option.mode} does not fit" if plain is None else
               f"micro-batch {plain.candidate.micro_batch}, {plain.speed.tokens_per_s:,.0f} tok/s")
    return (f"assumes Liger's fused linear+cross-entropy (pip install 'autotune[gpu]'); without "
            f"it (--no-liger): {without}",)  # fmt: skip


def _unsupported(gpu: GPU, pin: Mapping[str, Any]) -> str:
    """Why a pinned setting cannot run on this GPU at all ("" when it can)."""
    if pin.get("precision") == "bf16" and not gpu.bf16:
        return f"{gpu.name} has no bf16 (pinned precision); use fp16"
    if pin.get("precision") == "tf32" and not gpu.tf32:  # (its rate had been the fp32 one, labelled tf32)
        return f"{gpu.name} has no TF32 (pinned precision); use fp16, or fp32"
    if pin.get("attn") == "flash_attention_2" and not gpu.flash_attention_2:
        return f"{gpu.name} cannot run FlashAttention-2 (pinned attn); use sdpa"
    if pin.get("attn") == "flash_attention_2" and pin.get("precision") in ("fp32", "tf32"):
        return f"FlashAttention-2 runs in fp16 or bf16 only, not {pin['precision']} (pinned); use sdpa"
    return ""


_TOKEN_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_tokens(text: str | int) -> int:
    """A token count: ``1B``, ``500M``, ``2e9``, ``1.5B``, ``250k``, ``1_000_000``. SpecError otherwise."""
    import math
    import re

    if isinstance(text, bool):
        raise SpecError(f"tokens must be a count like 1B, 500M or 2e9; got {text!r}")
    if isinstance(text, int):
        value: float = text
    else:
        m = re.fullmatch(r"\s*([0-9][0-9_]*\.?[0-9_]*(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]?)\s*", str(text))
        suffix = m.group(2).upper() if m else ""
        if not m or suffix not in _TOKEN_SUFFIX:
            raise SpecError(
                f"tokens must be a count like 1B, 500M or 2e9 (suffixes K, M, B, T); got {text!r}"
            )
        value = float(m.group(1).replace("_", "")) * _TOKEN_SUFFIX[suffix]
    if not math.isfinite(value):
        raise SpecError(f"tokens must be a finite count like 1B, 500M or 2e9; got {text!r}")
    if value < 1:
        raise SpecError(f"tokens must be at least 1; got {text!r}")
    if abs(value - round(value)) > 1e-6 * value:  # (1.9 was read as 2 tokens: a missing suffix, most likely)
        raise SpecError(f"tokens must be a whole count; got {text!r}, {value:g} tokens (a suffix missing? 1.9B)")
    return int(round(value))
