"""FLOPs per token, predicted tokens/s and MFU.  [pure]

FLOP convention (stated, because conventions differ by 10–20% at long sequences):

* ``N`` = ``Arch.params_matmul``: every parameter that takes part in a matmul per token: all
  weights except the input-embedding look-up, with the output projection counted even when tied,
  and only the active experts of an MoE (as torchtitan counts it).
* Model FLOPs per token (what MFU divides by): ``6N + 12·L·H·Q·T`` for full fine-tuning (2N
  forward + 4N backward; attention term of PaLM, non-causal, T = sequence length, H·Q = heads x
  head_dim); LoRA/QLoRA ``4N + 12·L·H·Q·T`` (no weight gradients for the frozen base; the
  adapters' FLOPs are negligible). FlashAttention's own recompute is not counted.
* Hardware FLOPs add the recomputed forward with gradient checkpointing: ``+2N + 4·L·H·Q·T``
  (full fine-tuning: 8N). The step time counts hardware FLOPs, the attention term at the causal
  share a fused kernel computes (``ATTN_CAUSAL_SHARE``);
  ``mfu()`` reports model FLOPs (pass ``hardware=True`` for HFU).

Predicted step time (``predict_speed(...).step_time_s``, or :func:`predict_step_time`) = the compute
part (FLOPs / (peak FLOP/s x efficiency), efficiency = base (calibrated from probes on that GPU when
given, else the catalog's figure for the GPU, else ``DEFAULT_EFFICIENCY``) x the lever factors) plus
the host's dispatch of every operation the step runs (counted per layer and per adapted linear), the
Trainer's own time, the optimizer update and gradient clipping, and QLoRA's dequantization (streams at
the GPU's memory bandwidth); multi-GPU runs lose a stated share to communication. Tokens/s = real tokens per step /
step time. With variable lengths (``Workload.lengths``) the compute counts every token slot the probe's layout
holds (padding to a micro-batch's longest sequence, or packed rows padded to the longest row, or one flat row
with FlashAttention/flex) with attention at its row's width (:func:`batch_layout_of`), so packing against
padding and the micro-batch's padding are predicted; fixed lengths are ``seq_len`` tokens per sequence.
The constants are fitted on published runs (below).
"""

from __future__ import annotations

import functools
import json
import random
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from autotune.errors import SpecError
from autotune.estimate.arch import Arch
from autotune.estimate.catalog import GPU, find_gpu
from autotune.spec.lengths import batch_layout, sample_lengths
from autotune.spec.probe_request import FLATTEN_ATTN, Candidate, Workload

__all__ = [
    "LAYOUT_SAMPLES",
    "BatchLayout",
    "batch_layout_of",
    "flops_per_real_token",
    "ATTN_CAUSAL_SHARE",
    "ATTN_FACTOR",
    "COMM_OVERLAP",
    "COMPILE_FACTOR",
    "DEFAULT_EFFICIENCY",
    "DEFAULT_QUANT",
    "DEQUANT_BYTES_PER_PARAM",
    "OPS_PER_STEP",
    "PER_OP_S",
    "MODE_FACTOR",
    "BANDWIDTH_SHARE",
    "CLIP_BYTES_PER_PARAM",
    "MICROBATCH_OVERHEAD_S",
    "OPTIMIZER_BYTES_PER_PARAM",
    "OPTIMIZER_BYTES_PER_S",
    "PER_TENSOR_S",
    "SATURATION_TOKENS",
    "SCALING_FACTOR",
    "communication_time_s",
    "TRAINER_STEP_S",
    "step_update_time",
    "stream_rate",
    "SpeedEstimate",
    "attention_flops_per_token",
    "calibrate",
    "calibration_pairs",
    "compute_only_tokens_per_s",
    "hardware_flops_per_token",
    "checkpointed_layers",
    "recomputed",
    "ideal_tokens_per_s",
    "mfu",
    "model_flops_per_token",
    "ops_per_micro_batch",
    "predict_speed",
    "predict_step_time",
]

# --- the step-time model -------------------------------------------------------------------------
# One optimizer step = grad_accum micro-batches, each taking
#     compute / (peak x efficiency x T / (T + SATURATION_TOKENS))        (GEMM efficiency at T tokens)
#   + passes x quantized weights x DEQUANT_BYTES_PER_PARAM[backend] / bandwidth   (QLoRA: dequantize every pass)
#   + operations dispatched x PER_OP_S           (the host's dispatch and launch of each operation: OPS_PER_STEP)
#   + MICROBATCH_OVERHEAD_S                                              (the Trainer around one micro-batch)
# The dispatch is added, not overlapped with the arithmetic: the fit prefers it to the longer of the two and to a
# partial overlap (the forms compared in docs/plan.md), as a step of many small kernels waits on each one's
# launch whether or not the host runs ahead.
# plus, once per optimizer step, what scales with the trainable parameters and nothing else:
#   trainable params x (CLIP_BYTES_PER_PARAM + OPTIMIZER_BYTES_PER_PARAM[optim]) / memory bandwidth
#   + trainable tensors x PER_TENSOR_S + TRAINER_STEP_S
# (gradient clipping and the optimizer's update are memory-bound streams over the trainable parameters; the
# bandwidth is the GPU's data-sheet figure x BANDWIDTH_SHARE, OPTIMIZER_BYTES_PER_S where the catalog has none).
# T = micro_batch x seq_len tokens; passes = 2 (forward, backward) or 3 with checkpointing. ``compute`` counts
# the matmul FLOPs of ``hardware_flops_per_token`` and the attention term scaled by the share a causal kernel
# computes (ATTN_CAUSAL_SHARE). The constants marked [fitted] were fitted on the fit half of the published runs
# in benchmarks/published_runs.json and scored on the other half (``python benchmarks/estimator_vs_published.py
# --fit`` refits them; the tests pin them). A step of a small LoRA run is tens of milliseconds, so no constant
# here may stand for what a long step spends: each is per layer, per micro-batch or per trainable parameter.
# Refitted 2026-12-06 on the 27 + 17 fit runs of both sets with the dispatch term and dequantization priced by
# the bandwidth (held out: 24 runs, median 0.95; short steps 16 runs, median 1.05; docs/plan.md).
# Share of peak 16-bit FLOP/s reached by large GEMMs in an HF Trainer fine-tune [fitted: 0.537].
DEFAULT_EFFICIENCY = 0.54
# Tokens per micro-batch at which GEMM efficiency is half of DEFAULT_EFFICIENCY's [fitted: 52.4]: a few hundred
# tokens make matrices too thin to fill the GPU.
SATURATION_TOKENS = 52
# Operations one training step dispatches (``op_counts.json`` next to this module, written by
# ``python benchmarks/op_counts.py --write``, which counts them with torch's dispatcher and checks this table): by
# table ("sdpa" or "eager", and " fp32" for a step without autocast) and family, per decoder layer its forward, its
# backward with every weight's gradient (full) or with the base frozen (LoRA), per LoRA-adapted linear its
# forward and backward, and the rest of a step (embedding, final norm, head, loss) for full fine-tuning ("fixed")
# and with the base frozen ("fixed_frozen"). autocast's casts and views count: each costs the host a dispatch.
# FlashAttention-2 and flex count as sdpa; a family not listed counts as llama; a torch.compile step is counted as
# eager (compile's effect is not modelled: COMPILE_FACTOR).
OPS_PER_STEP: dict[str, dict[str, dict[str, int]]] = json.loads(
    resources.files("autotune.estimate").joinpath("op_counts.json").read_text(encoding="utf-8"))["counts"]
# Seconds per dispatched operation (Python, the dispatcher, autograd, the launch) [fitted: 6.32e-6; this
# project's CPU pays 6.9-9.8 us an operation for the same models with kernels that do almost nothing:
# ``python benchmarks/host_overhead.py``].
PER_OP_S = 6.3e-6
# Bytes moved per quantized weight per pass to dequantize it for the matmul, at the GPU's memory bandwidth x
# BANDWIDTH_SHARE, by backend [fitted: 20.5 and 13.4]: "nf4" bitsandbytes / torchao NF4, "gptq" auto-gptq's CUDA
# kernels (exllama off, as Qwen's recipe runs). Reading 4 bits and writing a 16-bit copy is about 2.6 B; the fitted
# figures are several times that, so they carry what else a 4-bit layer costs a pass in the published stacks
# (the casts around it, kernels below the bandwidth). A stream, so a slower memory pays more: until 2026-12-06 this
# was seconds per weight (3.4e-11 nf4, 8.3e-12 GPTQ), the same on every GPU.
DEQUANT_BYTES_PER_PARAM = {"nf4": 20.5, "gptq": 13.4}
DEFAULT_QUANT = "nf4"
# The Trainer's own time around one micro-batch (the collator, moving the batch, the loss's scaling, the NaN check),
# beyond the model's operations, and around one optimizer step (scheduler, callbacks, zero_grad, fetching the
# accumulation window) [measured: ``python benchmarks/host_overhead.py --repeats 5``, a Trainer against a plain
# loop over the same micro-batches on this project's 2-core CPU, 2026-12-06: medians 0.19 ms (-0.53-3.74 over 5
# runs) and 1.02 ms (-1.93-3.34): a few milliseconds at most, under what the method resolves]. On a GPU the NaN
# check also waits for the device every micro-batch; that is not measured here. The constant 0.099 s per
# micro-batch these replace was fitted when the model had no dispatch term, and took the host's dispatch of a
# 1-14B model's operations for the Trainer's own time.
MICROBATCH_OVERHEAD_S = 0.0002
TRAINER_STEP_S = 0.001
# Gradient clipping (the Trainer's max_grad_norm, 1.0 by default): a norm reads every trainable fp32 gradient
# once, the scale reads and writes it: 12 bytes per trainable parameter [stated].
CLIP_BYTES_PER_PARAM = 12
# The optimizer's update, bytes moved per trainable parameter, by optimizer [stated, from the kernels]:
# fused AdamW reads the fp32 parameter, gradient, m and v and writes parameter, m and v (28 B); torch's foreach
# AdamW runs its update as five passes over those tensors (lerp of m, v's scale and addcmul, the denominator's
# sqrt and add, the addcdiv into the parameter, the decoupled weight decay: about 72 B); bitsandbytes' 8-bit
# AdamW keeps m and v in one byte each (16 B); Adafactor's factored second moment (about 16 B); SGD without
# momentum reads the gradient and updates the parameter (12 B).
OPTIMIZER_BYTES_PER_PARAM = {"adamw_torch_fused": 28, "adamw_torch": 72, "paged_adamw_32bit": 28,
                             "adamw_8bit": 16, "paged_adamw_8bit": 16, "adafactor": 16, "sgd": 12}  # fmt: skip
# Share of the data-sheet memory bandwidth that these streaming kernels reach [stated: large elementwise kernels
# reach 80-90 % of it on current GPUs]; the rate where the catalog has no bandwidth.
BANDWIDTH_SHARE = 0.8
OPTIMIZER_BYTES_PER_S = 1.0e12
# Seconds per trainable tensor per step for the foreach/fused kernels' grouping and launches in clipping and
# the update [stated: a few microseconds of Python and a launch per tensor group].
PER_TENSOR_S = 5e-6
# torch.compile's speed-up of the compute part: 1.0, no published HF Trainer run isolates it (torchtune's
# compiled runs are 2.2x this model, but that is torchtune's loop as much as compile: the benchmark
# keeps it as a per-stack factor, not here).
COMPILE_FACTOR = 1.0
# Share of the PaLM (non-causal) attention FLOPs a causal kernel computes: FlashAttention-2 and sdpa's
# fused kernels skip the masked half; eager attention computes the full s x s products.
ATTN_CAUSAL_SHARE = {"flash_attention_2": 0.5, "sdpa": 0.5, "flex_attention": 0.5, "eager": 1.0}
# Relative efficiency by mode (kept for callers; the fitted model puts LoRA's and QLoRA's extra cost in
# the per-module and dequantization terms instead): 1.0 for all modes.
MODE_FACTOR = {"full": 1.0, "lora": 1.0, "qlora": 1.0}
# Attention implementation: eager attention's s x s scores, softmax and their casts run at memory speed
# (LLaMA-Factory: FA2 +19-23% over eager at 1k tokens); the fused kernels' efficiency is the GEMMs'.
ATTN_FACTOR = {"flash_attention_2": 1.0, "sdpa": 1.0, "flex_attention": 0.95, "eager": 0.8}
# Data-parallel efficiency inside one node (NVLink-class), by ZeRO stage (0 = DDP).
SCALING_FACTOR = {0: 0.95, 1: 0.95, 2: 0.93, 3: 0.88}
# Over PCIe (a catalog GPU with ``interconnect_gbs``) the collectives are priced too (``communication_time_s``): what
# they do not hide beyond what the factor already charges. The share of a micro-batch's time a collective can hide
# behind (DDP's bucketed all-reduce, DeepSpeed's overlap_comm and ZeRO-3's prefetch); an assumption, not measured
COMM_OVERLAP = 0.5
# ZeRO-Offload: host<->device traffic and CPU Adam speed (node-wide, shared by all ranks).
PCIE_BYTES_PER_S = 16e9
CPU_ADAM_PARAMS_PER_S = 1.5e9


def attention_flops_per_token(arch: Arch, seq_len: float) -> float:
    """PaLM's non-causal attention term, forward + backward: 12·L·(heads·head_dim)·T."""
    return 12.0 * arch.layers * arch.q_width * seq_len


def model_flops_per_token(arch: Arch, seq_len: float, mode: str = "full") -> float:
    """Model FLOPs per trained token: ``6N`` (full) or ``4N`` (LoRA/QLoRA) + attention."""
    factor = 6.0 if mode == "full" else 4.0
    return factor * arch.params_matmul + attention_flops_per_token(arch, seq_len)


def hardware_flops_per_token(arch: Arch, seq_len: float, mode: str = "full", grad_ckpt: bool | float = False) -> float:
    """Model FLOPs plus the recomputed forward under checkpointing (``2N`` + a third of attention), for the
    share of layers recomputed (``grad_ckpt``: True or 1.0 every layer, 0.5 one in two: :func:`recomputed`)."""
    return model_flops_per_token(arch, seq_len, mode) + float(grad_ckpt) * (
        2.0 * arch.params_matmul + attention_flops_per_token(arch, seq_len) / 3.0)


def checkpointed_layers(arch: Arch, c: Candidate) -> int:
    """Decoder layers checkpointed: transformers checkpoints those whose index is a multiple of ``ckpt_every``
    (every one at 1), so ceil(layers / k); none without checkpointing. The memory model keeps only their
    input; the speed model runs their forward again."""
    return -(-arch.layers // c.ckpt_every) if c.grad_ckpt else 0


def recomputed(arch: Arch, c: Candidate) -> float:
    """The share of decoder layers whose forward the backward pass runs again: 0 without checkpointing,
    1 with every layer checkpointed, about 1/k with one layer in k (``ckpt_every``)."""
    return checkpointed_layers(arch, c) / arch.layers if arch.layers else 0.0


# Micro-batches drawn from a variable length distribution to average its layout (padding, packing): the token
# slots per real token of lognormal:4.0,1.0 at micro-batch 8 move by under 1 % between 256 and 4,096. Fewer above
# micro-batch 16 (at most 4,096 sequences, at least 16 micro-batches), and a micro-batch above
# LAYOUT_MAX_MICRO_BATCH is laid out as one of that size (slots per token and widths are per token; first-fit
# packing is quadratic in the rows, so a pinned micro-batch of thousands would take minutes).
LAYOUT_SAMPLES = 256
LAYOUT_SEQUENCES = 4096
LAYOUT_MAX_MICRO_BATCH = 256


@dataclass(frozen=True)
class BatchLayout:
    """How the probe lays out a configuration's micro-batches, averaged over the workload's length distribution
    (``autotune.spec.lengths.batch_layout``, the collators' own rule): token slots the model computes per
    real token (1 without padding), the slot-weighted attention width (the mean of ``width`` over slots; for
    ``packing_flat`` each sequence's own length), and real tokens per micro-batch."""

    slots_per_token: float
    attention_width: float
    tokens_per_micro_batch: float


@functools.lru_cache(maxsize=512)
def _layout(lengths: str, seq_len: int, micro_batch: int, mode: str, samples: int,
            sample: tuple[int, ...] = ()) -> BatchLayout:
    if sample:  # a dataset's own lengths, drawn in a seeded shuffle (cyclically when the sample is short)
        pool = list(sample)
        random.Random(0).shuffle(pool)
        lens = [max(1, min(seq_len, pool[i % len(pool)])) for i in range(samples * micro_batch)]
    elif lengths == "fixed":
        return BatchLayout(1.0, float(seq_len), float(micro_batch * seq_len))
    else:
        lens = sample_lengths(lengths, samples * micro_batch, seq_len, 0)
    real = sum(lens)
    if mode == "packing_flat":  # one padding-free row; attention stays within each sequence
        return BatchLayout(1.0, sum(n * n for n in lens) / real, real / samples)
    rows = batch_layout(lens, micro_batch=micro_batch, mode=mode, seq_len=seq_len)
    slots = sum(r * w for r, w in rows)
    return BatchLayout(slots / real, sum(r * w * w for r, w in rows) / slots, real / samples)


def batch_layout_of(workload: Workload, c: Candidate, *, flat: bool = False,
                    sample: tuple[int, ...] = ()) -> BatchLayout:
    """The configuration's micro-batch layout under the workload's ``lengths`` (deterministic: seed 0), or drawn
    from ``sample`` (a dataset's token lengths) when given; ``flat``: as one padding-free row whatever the
    configuration (attention over each sequence's own length: what the model's FLOPs count)."""
    mode = "packing_flat" if flat or (c.packing and c.attn in FLATTEN_ATTN) else "packing" if c.packing else "padding"
    mb = int(c.micro_batch)
    at = min(mb, LAYOUT_MAX_MICRO_BATCH)
    samples = min(LAYOUT_SAMPLES, max(16, LAYOUT_SEQUENCES // at))
    lay = _layout(str(workload.lengths), int(workload.seq_len), at, mode, samples, tuple(sample))
    return lay if at == mb else BatchLayout(lay.slots_per_token, lay.attention_width, lay.tokens_per_micro_batch * mb / at)


def flops_per_real_token(arch: Arch, workload: Workload, c: Candidate, *, sample: tuple[int, ...] = ()) -> float:
    """Hardware FLOPs per real (non-padding) token as the probe computes them: every token slot of the layout
    (padding included) at :func:`hardware_flops_per_token` of its row's width. ``hardware_flops_per_token`` is
    linear in the width, so this is ``slots per token x hardware_flops_per_token(attention width)``; with fixed
    lengths it is ``hardware_flops_per_token(seq_len)``."""
    lay = batch_layout_of(workload, c, sample=sample)
    return lay.slots_per_token * hardware_flops_per_token(arch, lay.attention_width, workload.mode, recomputed(arch, c))


def _resolve_gpu(gpu: GPU | str | None) -> GPU | None:
    if gpu is None or isinstance(gpu, GPU):
        return gpu
    try:
        return find_gpu(gpu)
    except SpecError:
        return None


def mfu(
    tokens_per_s: float,
    arch: Arch,
    seq_len: float,
    gpu: GPU | str | None,
    mode: str = "full",
    grad_ckpt: bool | float = False,
    *,
    precision: str | None = None,
    hardware: bool = False,
) -> float | None:
    """Model FLOPs utilisation of one GPU running at ``tokens_per_s`` (real tokens per second).

    Divides model FLOPs (recompute not counted; ``hardware=True`` counts it, giving HFU) by the
    GPU's dense peak for ``precision`` (default: bf16 where the GPU has it, else fp16). An unknown
    GPU (None, or a name not in the catalog) gives None, never a wrong figure.
    """
    g = _resolve_gpu(gpu)
    if g is None or tokens_per_s is None or tokens_per_s < 0:
        return None
    prec = precision or g.half_precision
    try:
        peak = g.peak_flops(prec)
    except SpecError:
        return None
    flops = (
        hardware_flops_per_token(arch, seq_len, mode, grad_ckpt)
        if hardware
        else model_flops_per_token(arch, seq_len, mode)
    )
    return tokens_per_s * flops / peak


@dataclass(frozen=True)
class SpeedEstimate:
    """Predicted throughput of a configuration (real tokens: with variable lengths, the padding its layout computes
    is counted in the time, not in the tokens)."""

    tokens_per_s: float  # all GPUs together
    tokens_per_s_per_gpu: float
    efficiency: float  # share of peak over the whole step (overheads, lever factors and scaling included)
    base_efficiency: float
    mfu: float | None
    hardware_flops_per_token: float
    step_time_s: float  # one optimizer step (micro_batch x grad_accum x world_size sequences)
    offload_time_s: float = 0.0
    compute_time_s: float = 0.0  # the GEMM/attention part of step_time_s (what ``efficiency`` scales)
    overhead_time_s: float = 0.0  # dispatch, the Trainer's own time, clipping and the optimizer's update
    dequant_time_s: float = 0.0  # QLoRA: dequantizing the base weights, every pass
    dispatch_time_s: float = 0.0  # the part of overhead_time_s that dispatches the operations (PER_OP_S)
    comm_time_s: float = 0.0  # the collectives over PCIe (``communication_time_s``), not hidden behind compute

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _lever_factor(workload: Workload, candidate: Candidate, tokens: float) -> float:
    """GEMM efficiency multiplier of a micro-batch: attention implementation x T/(T + T0) x scaling (``tokens``:
    the token slots a micro-batch computes, padding included)."""
    c = candidate
    f = MODE_FACTOR.get(workload.mode, 1.0) * ATTN_FACTOR.get(c.attn, 0.95)
    f *= tokens / (tokens + SATURATION_TOKENS)
    if c.torch_compile:
        f *= COMPILE_FACTOR
    if c.world_size > 1:
        f *= SCALING_FACTOR[c.zero_stage]
    return f


def communication_time_s(arch: Arch, workload: Workload, candidate: Candidate, gpu: GPU, micro_batch_s: float) -> float:
    """Seconds per optimizer step the collectives add over PCIe (``gpu.interconnect_gbs``; 0 on one GPU or where
    the catalog states none). Bytes per GPU, ring collectives moving ``r = (n - 1) / n`` of a message (twice for an
    all-reduce), T trainable and P total parameters:

        DDP (stage 0)  the gradients' all-reduce once per step, 2r T x 4 (fp32 under AMP)
        ZeRO-1         2r T x 2, and the updated parameters' all-gather r T x 2
        ZeRO-2         per micro-batch the gradients' reduce-scatter r T x 2; the all-gather r T x 2 per step
        ZeRO-3 / FSDP  per micro-batch two all-gathers of the parameters r P x 2 and the reduce-scatter r T x 2

    A per-micro-batch collective hides behind ``COMM_OVERLAP`` of that micro-batch's time (``micro_batch_s``: its
    compute, dispatch and per-micro-batch overhead; the collectives run on their own stream), the DDP/ZeRO-1
    gradient reduction behind that share of the last micro-batch's; the all-gather after the update hides
    behind nothing."""
    c = candidate
    if c.world_size < 2 or not gpu.interconnect_gbs:
        return 0.0
    rate = gpu.interconnect_gbs * 1e9
    r = (c.world_size - 1) / c.world_size
    t, p = float(_trainable(arch, workload)), float(arch.params_total)
    hidden = COMM_OVERLAP * micro_batch_s
    if c.zero_stage == 0:
        return max(0.0, 2 * r * t * 4 / rate - hidden)
    if c.zero_stage == 1:
        return max(0.0, 2 * r * t * 2 / rate - hidden) + r * t * 2 / rate
    if c.zero_stage == 2:
        return c.grad_accum * max(0.0, r * t * 2 / rate - hidden) + r * t * 2 / rate
    return c.grad_accum * max(0.0, r * (2 * p + t) * 2 / rate - hidden)


def _compute_flops_per_token(arch: Arch, seq_len: float, mode: str, grad_ckpt: float, attn: str) -> float:
    """Hardware FLOPs per token with the attention term at the share a causal kernel computes
    (``grad_ckpt``: the share of layers recomputed)."""
    attn_full = attention_flops_per_token(arch, seq_len) * (1.0 + grad_ckpt / 3.0)
    matmul = hardware_flops_per_token(arch, seq_len, mode, grad_ckpt) - attn_full
    return matmul + attn_full * ATTN_CAUSAL_SHARE.get(attn, 0.5)


def _trainable(arch: Arch, workload: Workload) -> int:
    from autotune.estimate.arch import lora_param_count

    if workload.mode == "full":
        return arch.params_total
    return lora_param_count(arch, workload.lora_r, workload.lora_targets)


def _trainable_tensors(arch: Arch, workload: Workload) -> int:
    """Trainable tensors: LoRA's A and B per adapted linear; for full fine-tuning every linear, norm and bias
    of a layer (about 11 in a Llama-style block) and the embeddings, final norm and head."""
    if workload.mode == "full":
        return arch.layers * 11 + 3
    return 2 * _adapted_linears(arch, workload)


def step_update_time(arch: Arch, workload: Workload, candidate: Candidate, gpu: GPU) -> float:
    """Seconds per optimizer step that scale with the trainable parameters: gradient clipping and the optimizer's
    update as streams over them at the GPU's memory bandwidth, the per-tensor launches, and ``TRAINER_STEP_S``
    (ZeRO shards the update over the ranks)."""
    c = candidate
    shard = max(c.world_size, 1) if c.zero_stage > 0 else 1
    params = _trainable(arch, workload) / shard
    per_param = CLIP_BYTES_PER_PARAM + OPTIMIZER_BYTES_PER_PARAM.get(c.optim, OPTIMIZER_BYTES_PER_PARAM["adamw_torch"])
    return params * per_param / stream_rate(gpu) + _trainable_tensors(arch, workload) / shard * PER_TENSOR_S + TRAINER_STEP_S


def stream_rate(gpu: GPU) -> float:
    """Bytes/s a memory-bound stream reaches: the data-sheet bandwidth x BANDWIDTH_SHARE, OPTIMIZER_BYTES_PER_S
    where the catalog has none."""
    return gpu.memory_bandwidth_gbs * 1e9 * BANDWIDTH_SHARE if gpu.memory_bandwidth_gbs else OPTIMIZER_BYTES_PER_S


def _adapted_linears(arch: Arch, workload: Workload) -> int:
    if workload.mode == "full":
        return 0
    from autotune.estimate.arch import peft_lora_modules

    return len(peft_lora_modules(arch, workload.lora_targets)) * arch.layers


def predict_speed(
    arch: Arch,
    workload: Workload,
    candidate: Candidate,
    gpu: GPU,
    *,
    efficiency: float | None = None,
    quant: str | None = None,
) -> SpeedEstimate:
    """Tokens/s and step time for ``candidate`` on ``candidate.world_size`` x ``gpu`` (the module's
    step-time model). This is the one function to call for a step-time prediction
    (``.step_time_s``; :func:`predict_step_time` returns it alone).

    ``efficiency`` is the base share of peak (from :func:`calibrate`); default the GPU's catalog
    figure, else DEFAULT_EFFICIENCY. ``quant``: QLoRA's 4-bit backend (``DEQUANT_BYTES_PER_PARAM``;
    default ``DEFAULT_QUANT``).
    """
    c, w = candidate, workload
    base = efficiency if efficiency is not None else (gpu.efficiency or DEFAULT_EFFICIENCY)
    prec = c.precision if c.precision in ("bf16", "fp16", "tf32", "fp32") else gpu.half_precision
    peak = gpu.peak_flops(prec)
    lay = batch_layout_of(w, c)  # real tokens per micro-batch, and the padded slots the model computes for them
    eff = base * _lever_factor(w, c, lay.tokens_per_micro_batch * lay.slots_per_token)
    share = recomputed(arch, c)
    real_width = batch_layout_of(w, c, flat=True).attention_width  # each sequence's own length (seq_len when fixed)
    hw = hardware_flops_per_token(arch, real_width, w.mode, share)
    tokens_mb = lay.tokens_per_micro_batch
    tokens_step = tokens_mb * c.grad_accum * c.world_size
    compute_mb = (tokens_mb * lay.slots_per_token * _compute_flops_per_token(arch, lay.attention_width, w.mode, share, c.attn)
                  / (peak * eff))
    if w.trainer == "trl":  # TRL's fused LM head computes its logit tiles again in its backward (real tokens only)
        compute_mb += tokens_mb * 2.0 * arch.vocab * arch.hidden / (peak * eff)
    passes = 2 + share  # forward, backward, and the recomputed share of the forward
    dispatch_mb = ops_per_micro_batch(arch, w, c) * PER_OP_S
    dequant_mb = 0.0
    if w.mode == "qlora":
        backend = quant or DEFAULT_QUANT
        if backend not in DEQUANT_BYTES_PER_PARAM:
            raise SpecError(f"quant must be one of {', '.join(DEQUANT_BYTES_PER_PARAM)}; got {backend!r}")
        dequant_mb = passes * arch.params_linear_total * DEQUANT_BYTES_PER_PARAM[backend] / stream_rate(gpu)
    # ZeRO-Offload steps the optimizer on the host (``offload_s`` below); the Trainer's own step stays here
    optimizer_s = TRAINER_STEP_S if c.offload != "none" else step_update_time(arch, w, c, gpu)
    compute_s = c.grad_accum * compute_mb
    overhead_s = c.grad_accum * (dispatch_mb + MICROBATCH_OVERHEAD_S) + optimizer_s
    dequant_s = c.grad_accum * dequant_mb
    offload_s = 0.0
    if c.offload != "none":
        trainable = _trainable(arch, w)
        n = max(c.world_size, 1)
        # fp32 grads down, 16-bit params up, per rank (ranks share the host link and CPU Adam)
        offload_s = trainable * 6 / PCIE_BYTES_PER_S + trainable / CPU_ADAM_PARAMS_PER_S
        if c.offload == "params":
            offload_s += arch.params_total * 2 * 3 / n / PCIE_BYTES_PER_S * c.grad_accum
    # the factor already charges NVLink's losses: a PCIe link adds what its collectives expose beyond them
    charged = compute_s * (1.0 / SCALING_FACTOR[c.zero_stage] - 1.0) if c.world_size > 1 else 0.0
    comm_s = max(0.0, communication_time_s(arch, w, c, gpu, compute_mb + dispatch_mb + MICROBATCH_OVERHEAD_S
                                           + dequant_mb) - charged)
    step_s = compute_s + overhead_s + dequant_s + offload_s + comm_s
    total = tokens_step / step_s
    per = total / c.world_size
    return SpeedEstimate(
        tokens_per_s=total,
        tokens_per_s_per_gpu=per,
        efficiency=eff * compute_s / step_s,
        base_efficiency=base,
        mfu=mfu(per, arch, real_width, gpu, w.mode, share, precision=prec),
        hardware_flops_per_token=hw,
        step_time_s=step_s,
        offload_time_s=offload_s,
        compute_time_s=compute_s,
        overhead_time_s=overhead_s,
        dequant_time_s=dequant_s,
        dispatch_time_s=c.grad_accum * dispatch_mb,
        comm_time_s=comm_s,
    )


def ops_per_micro_batch(arch: Arch, workload: Workload, candidate: Candidate) -> float:
    """Operations the host dispatches for one micro-batch (``OPS_PER_STEP``, the fp32 table for an fp32 candidate):
    per layer its forward, the recomputed share of it, and its backward (every weight's gradient for full
    fine-tuning, the frozen base's otherwise), per LoRA-adapted linear the same, and the embedding, head and loss
    once."""
    key = ("eager" if candidate.attn == "eager" else "sdpa") + (" fp32" if candidate.precision == "fp32" else "")
    ops = OPS_PER_STEP[key].get(arch.model_type, OPS_PER_STEP[key]["llama"])
    forwards = 1.0 + recomputed(arch, candidate)
    full = workload.mode == "full"
    layer = ops["layer_forward"] * forwards + ops["layer_backward_full" if full else "layer_backward_frozen"]
    module = ops["lora_module_forward"] * forwards + ops["lora_module_backward"]
    return arch.layers * layer + _adapted_linears(arch, workload) * module + ops["fixed" if full else "fixed_frozen"]


def predict_step_time(
    arch: Arch,
    workload: Workload,
    candidate: Candidate,
    gpu: GPU,
    *,
    efficiency: float | None = None,
    quant: str | None = None,
) -> float:
    """Seconds of one optimizer step (``predict_speed(...).step_time_s``): what probe deadlines and
    the predicted time to answer are built on."""
    return predict_speed(arch, workload, candidate, gpu, efficiency=efficiency, quant=quant).step_time_s


def ideal_tokens_per_s(arch: Arch, workload: Workload, candidate: Candidate, gpu: GPU) -> float:
    """Tokens/s per GPU of the compute part alone at base efficiency 1.0 (lever factors included,
    fixed overheads left out): the denominator :func:`calibrate` divides by."""
    sp = predict_speed(arch, workload, candidate, gpu, efficiency=1.0)
    tokens = candidate.micro_batch * candidate.grad_accum * workload.seq_len
    return tokens / sp.compute_time_s


def compute_only_tokens_per_s(
    measured_tokens_per_s_per_gpu: float, arch: Arch, workload: Workload, candidate: Candidate, gpu: GPU
) -> float | None:
    """A measured tokens/s per GPU with the model's fixed overheads (the dispatch, the Trainer's own time,
    optimizer, dequantization, offload) taken out of its step time: what :func:`calibrate` compares
    with :func:`ideal_tokens_per_s`. None when the measured step is no longer than those overheads."""
    if not measured_tokens_per_s_per_gpu or measured_tokens_per_s_per_gpu <= 0:
        return None
    sp = predict_speed(arch, workload, candidate, gpu, efficiency=1.0)
    tokens = candidate.micro_batch * candidate.grad_accum * workload.seq_len
    measured_step = tokens / measured_tokens_per_s_per_gpu
    rest = measured_step - (sp.step_time_s - sp.compute_time_s)
    if rest <= 0:
        return None
    return tokens / rest


def calibrate(records: Iterable[tuple[float, float]]) -> float | None:
    """Base efficiency from measured probes: the median of measured / ideal tokens/s per GPU.

    ``records`` are ``(measured_tokens_per_s_per_gpu, ideal_tokens_per_s)`` pairs, the first with
    the fixed overheads taken out (:func:`compute_only_tokens_per_s`), the second from
    :func:`ideal_tokens_per_s` (:func:`calibration_pairs` builds both for stored probe results).
    Pairs with a non-positive figure are skipped; no usable pair gives None (use the default then).
    """
    ratios = [float(m) / float(i) for m, i in records if m and i and m > 0 and i > 0]
    if not ratios:
        return None
    return min(1.0, statistics.median(ratios))


def calibration_pairs(
    results: Iterable[Mapping[str, Any] | Any], arch: Arch, gpu: GPU
) -> list[tuple[float, float]]:
    """(measured, ideal) pairs from probe results (``ProbeResult`` or its ``to_dict()``) that ran
    on ``gpu`` with status ok, the measured figure's fixed overheads taken out. The request is read
    back with ``ProbeRequest.from_dict``."""
    from autotune.spec.probe_request import ProbeRequest

    pairs: list[tuple[float, float]] = []
    for r in results:
        d = r.to_dict() if hasattr(r, "to_dict") else dict(r)
        if d.get("status") != "ok":
            continue
        tps = (d.get("metrics") or {}).get("tokens_per_s")
        if not tps:
            continue
        req = ProbeRequest.from_dict(d["request"])
        world = max(req.candidate.world_size, 1)
        measured = compute_only_tokens_per_s(float(tps) / world, arch, req.workload, req.candidate, gpu)
        if measured is None:
            continue
        pairs.append((measured, ideal_tokens_per_s(arch, req.workload, req.candidate, gpu)))
    return pairs
