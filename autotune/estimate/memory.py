"""Peak training memory of one device, term by term.  [pure]

``estimate_memory(arch, workload, candidate, device=..., gpu=...)`` returns a MemoryBreakdown whose
``terms`` add up to ``total`` (the predicted peak). The peak is the larger of two phases of a
training step (from the second step on, once optimizer states exist):

* ``backward_start``: the loss has been computed and backward begins. Weights, optimizer states,
  every saved activation and the logits/loss working set are live; gradients are live only when
  they persist across micro-batches (``grad_accum > 1``, DDP buckets, ZeRO partitions), because the
  HF Trainer frees them (``zero_grad(set_to_none=True)``) after each optimizer step.
* ``optimizer_step``: weights, all gradients, optimizer states and the optimizer's temporaries
  (torch's foreach AdamW on CUDA allocates one fp32 copy of the parameters for ``sqrt(v)``; the
  single-tensor CPU path only per tensor; fused AdamW none). Full fine-tuning with tied embeddings
  reaches the same bytes plus the embedding's gradient at the end of the backward (it is computed last,
  beside every other gradient, then added into the lm_head's): ``tied_embedding_grad``, where it is
  larger than the optimizer's temporaries.

Conventions (autotune's, see ``autotune/formats/model.py::model_dtype``):

* Full fine-tuning builds the model in fp32 and trains with AMP autocast (``bf16=True``): fp32
  weights (4 B) + fp32 grads (4 B) + two fp32 AdamW states (8 B) = 16 B/param, plus the 16-bit copies
  autocast makes of every matmul weight (2 B/param, saved for backward; only the ``lm_head`` one
  with checkpointing). HF's own docs count 18 B/param for AMP AdamW.
* DeepSpeed ZeRO casts the module to 16-bit and keeps fp32 master weights in the optimizer; model
  states follow the ZeRO paper (arXiv:1910.02054 §3): stage 1 ``4Ψ + 12Ψ/N``, stage 2
  ``2Ψ + 14Ψ/N``, stage 3 ``16Ψ/N`` plus gathered-layer buffers, plus communication buckets (HF
  docs: with ``overlap_comm`` buckets take 4.5x their size; DeepSpeed's default bucket is 5e8
  elements for stages 1/2; HF's ``auto`` for stage 3 is ``hidden²``). FSDP keeps fp32 shards.
* LoRA/QLoRA hold the frozen base in the 16-bit type (2 B/param) or NF4 (QLoRA ≈ 0.516 B/param for
  the blocks' linears; embeddings, ``lm_head`` and norms are cast to fp32 by peft's
  ``prepare_model_for_kbit_training``, so the residual stream is fp32 too); adapters are fp32 with fp32 grads and
  states (16 B per adapter param), and autocast saves a 16-bit copy of each adapter for its backward
  (2 B per adapter param, in ``weight_copies``, in the layers not checkpointed). A GPTQ base (``quant="gptq"``: peft skips the fp32 cast) and DeepSpeed
  with 16-bit precision (its engine casts the module) keep those parameters and the residual stream 16-bit.
* Activations are counted tensor by tensor for HF's Llama-style blocks (RMSNorm computed in fp32,
  autocast casts per consuming linear, fused attention keeping q, k, v, output and the fp32
  log-sum-exp; eager attention adds the s² scores: fp32 softmax plus its 16-bit cast; a fused
  ``qkv_proj`` with rotary embeddings keeps its whole output live beside the rotated q and k; LoRA's
  dropout keeps a bool mask per adapted linear on CUDA). A meta-device trace of one training step checks
  what one layer keeps against these terms: ``python benchmarks/allocator_replay.py --per-layer``. This refines
  Korthikanti et al. (arXiv:2205.05198), whose ``s·b·h·(34 + 5·a·s/h)`` assumes 16-bit everything.
  Checkpointing keeps each layer's input (``s·b·h`` in the residual dtype) plus one layer's full
  activations during its recompute.
* Logits/loss: transformers upcasts the logits to fp32 and runs log_softmax + nll; at the start of
  backward the saved log-probabilities, the nll gradient and the log_softmax gradient are live:
  ``LOGITS_BYTES_PER_ELEMENT`` (12) x s·b·V. A fused linear+cross-entropy (Liger) keeps O(s·b·h). A model's
  own loss in its 16-bit dtype without autocast (``loss_dtype="model"``) keeps ``LOGITS_MODEL_DTYPE_BYTES`` (8).
  TRL's SFTTrainer (``Workload.trainer == "trl"``) scores through its own fused LM head, a tile of the logits at
  a time (``trl_head_bytes``).
* ZeRO-Offload (DeepSpeed's own estimators, checked in tests/test_estimate_published.py): the fp32
  master weights, optimizer states and (stage 2/3) gradient partitions go to the host; ``host_bytes``
  is the host RAM per node. ``MemoryBreakdown.model_states`` is what those estimators count.
* Optimizers (``OPTIMIZERS``): fused, foreach, 8-bit, paged (states counted at the step only),
  Adafactor, SGD.
* GPU only: ``CUDA_CONTEXT_BYTES`` for the context and ``ALLOCATOR_RESERVE`` of the dynamic part of
  the peak (not the weights and states allocated once) for the caching allocator's reserve. ``device="cpu"`` leaves both out: the CPU
  figure is what a CPU probe measures as peak RSS growth (model built after the baseline, fp32),
  so it adds ``CPU_RUNTIME_OVERHEAD_BYTES`` (library pages, the Trainer's lazy imports, thread
  state; calibrated by ``benchmarks/estimator_accuracy.py``, figures in ``benchmarks/README.md``) and
  ``heap_retained``, the freed heap glibc's default malloc keeps mapped (``CPU_HEAP_RETAINED``;
  ``MemoryBreakdown.live`` leaves it out).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from autotune.errors import SpecError
from autotune.estimate.arch import Arch, peft_lora_modules, peft_lora_param_count
from autotune.estimate.catalog import GPU
from autotune.estimate.speed import checkpointed_layers, recomputed
from autotune.formats.model import LORA_DROPOUT
from autotune.spec.probe_request import FLATTEN_ATTN, Candidate, Workload

__all__ = [
    "ACTIVATION_TERMS",
    "ALLOCATOR_RESERVE",
    "VARLEN_RESERVE_GROWTH",
    "SAVED_FOR_BACKWARD_TERMS",
    "CPU_HEAP_FIXED_BYTES",
    "CPU_HEAP_RETAINED",
    "CPU_HEAP_RETAINED_CKPT",
    "CPU_LIBRARY_PAGES_BYTES",
    "CPU_OVERHEAD_TERMS",
    "CPU_RUNTIME_MISC_BYTES",
    "CPU_RUNTIME_OVERHEAD_BYTES",
    "CPU_TRAINER_IMPORTS_BYTES",
    "CUDA_CONTEXT_BYTES",
    "DEEPSPEED_BUCKET_ELEMENTS",
    "DEEPSPEED_SUB_GROUP_ELEMENTS",
    "DEFAULT_OPTIM",
    "HOST_BUFFER_FACTOR",
    "MODEL_STATE_TERMS",
    "OPTIMIZERS",
    "STATIC_TERMS",
    "LOGITS_16BIT_BYTES",
    "LOGITS_BYTES_PER_ELEMENT",
    "LOGITS_MODEL_DTYPE_BYTES",
    "GPTQ_BYTES_PER_PARAM",
    "QUANT_BACKENDS",
    "OVERLAP_COMM_FACTOR",
    "QLORA_BYTES_PER_PARAM",
    "TRL_PER_TOKEN_BYTES",
    "TRL_SOFTCAP_TEMP_BYTES",
    "TRL_TILE_TEMP_BYTES",
    "TRL_TOKEN_CHUNK",
    "TRL_VOCAB_CHUNK",
    "MemoryBreakdown",
    "estimate_memory",
    "logits_bytes",
    "trl_head_bytes",
    "optimizer_state_bytes_per_param",
]

# CUDA context + cuBLAS/cuDNN workspaces, outside torch's allocator: transformers'
# model_memory_anatomy measured 1,343 MB after one tiny op; 300 MiB–2 GiB reported elsewhere.
CUDA_CONTEXT_BYTES = 1 << 30
# Caching-allocator reserve (max_memory_reserved / max_memory_allocated - 1) on the part of the peak
# allocated and freed within each step (activations, logits, gradients, temporaries; not the weights
# and optimizer states allocated once, STATIC_TERMS): fragmentation grows with the size of the blocks
# freed and re-requested, the largest of which scale with the sequence. No published allocator figure;
# 15% reproduces the slope (bytes per extra token) of the HF + FA2 context lengths Unsloth published
# for Llama-3.1-8B QLoRA at 12-80 GB together with the terms below (2.65 MB/token measured, 2.69
# modelled). Recalibrate with GPU probes (benchmarks/estimator_accuracy.py --device cuda).
ALLOCATOR_RESERVE = 0.15
# Variable-length batches (padding to each batch's longest row, as real data has it) on the default caching
# allocator: blocks freed by one batch stay cached in segments of their size, a longer batch cannot use them and
# gets new ones, so max_memory_reserved on a card with room keeps growing past the fixed-length figure
# (benchmarks/allocator_replay.py replays a traced step's allocations through a model of the allocator: a 7B LoRA
# reaches 1.5-4.2x its allocated peak over 300 steps). Before it runs out, the allocator returns the wholly
# free cached segments to the device and retries, so the run still fits in about the fixed-length reserved figure
# (the replay: 0.93-1.01x it), more slowly; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (what autotune run's GPU
# probes and emitted scripts set) keeps the reserve at 1.01-1.18x allocated (allocator_replay.py --expandable). The growth follows the transient tensors (the logits and the loss's copies, the recomputed
# layer), not what the forward saves for the backward: the replay of Qwen2.5-7B LoRA at 2,048 tokens grows the
# reserve by 18.2 GiB over 300 uniform-length steps with checkpointing (4.0 GiB of dynamic tensors) and by 19.3 GiB
# without (18.6 GiB: 15 more of saved activations; benchmarks/results/allocator_replay-qwen2.5-7b-nockpt.json).
# VARLEN_RESERVE_GROWTH x the dynamic part less what is saved for the backward (allocated less STATIC_TERMS and
# SAVED_FOR_BACKWARD_TERMS) on top of allocated is what a roomy card reports: fitted on the fit half of ms-swift's published
# max_memory_reserved table (benchmarks/published_large_vocab.json; `python benchmarks/estimator_vs_published.py
# --fit` refits it): 1.85 (1.65 when the saved activations grew too).
VARLEN_RESERVE_GROWTH = 1.85
# What the forward saves for the backward, allocated and freed in the same order every step: the growth leaves it out
SAVED_FOR_BACKWARD_TERMS = ("activations", "weight_copies")
# What a CPU probe's RSS growth holds besides tensors (fp32, torch 2.13 / transformers 5.24, 2 threads,
# MALLOC_MMAP_THRESHOLD_=65536), measured 2026-11-30 by reading /proc/self/status around each stage of
# the probe (tiny-llama, smollm2-135m, gpt2) and fitted on the ``fit`` split of
# ``python benchmarks/estimator_accuracy.py --split fit`` (its "implied overhead" column):
# * pages of torch's shared libraries first touched by the build, forward, backward and optimizer
#   (RssFile growth: 21.6-21.8 MiB whatever the model);
CPU_LIBRARY_PAGES_BYTES = 22 * 2**20
# * Python modules the Trainer imports on construction, after the probe's baseline (RssAnon growth
#   across ``Trainer(...)``: 17.6 MiB, ~500 modules, 425 of them deepspeed's when it is installed);
CPU_TRAINER_IMPORTS_BYTES = int(17.6 * 2**20)
# * the rest, fitted: autograd engine and OpenMP thread state, glibc arenas, small tensors. The fit
#   split's median implied overhead (all three parts) was 45.5 MiB with 2 threads per probe (--jobs 1)
#   and 43.3 MiB with 1 (--jobs 2): 5 MiB puts the total between them.
CPU_RUNTIME_MISC_BYTES = 5 * 2**20
CPU_RUNTIME_OVERHEAD_BYTES = CPU_LIBRARY_PAGES_BYTES + CPU_TRAINER_IMPORTS_BYTES + CPU_RUNTIME_MISC_BYTES
# the terms of a CPU estimate that are process overhead rather than tensors
CPU_OVERHEAD_TERMS = ("runtime_overhead",)
# What a CPU probe's RSS holds beyond the live tensors under glibc's default malloc (as the probe and the user's
# training run: a tensor under the dynamic mmap threshold, up to 32 MiB, is carved from the heap, and a freed one
# stays mapped): the step's transient tensors leave the heap's high-water mark above the live peak, by a share of
# what the step's forward produces. ``heap_retained`` = CPU_HEAP_FIXED_BYTES + CPU_HEAP_RETAINED x the
# activation terms of the same configuration without checkpointing (+ CPU_HEAP_RETAINED_CKPT x them with
# checkpointing, whose forward computes every layer's activations anyway, frees them at once and recomputes them
# in backward). Fitted (relative least squares, outliers down-weighted) on the peaks of the CPU landscapes F-L
# (benchmarks/landscapes, recorded under the defaults) and scored on M-R, which the fit did not use:
# ``python benchmarks/cpu_heap_fit.py`` (figures in benchmarks/README.md). The live-tensor model alone is 0.66x
# those peaks at the median, 6 % of them within +-15 %.
CPU_HEAP_FIXED_BYTES = 15 * 2**20
CPU_HEAP_RETAINED = 0.40
CPU_HEAP_RETAINED_CKPT = 0.09
# NF4 4 bits + double-quantized block constants (~0.127 bit) per quantized weight (arXiv:2305.14314).
QLORA_BYTES_PER_PARAM = 0.5 + 0.127 / 8
# GPTQ int4 (auto-gptq's layout, group size 128): 4 bits + an fp16 scale and a packed 4-bit zero point
# per group of 128 weights (the int32 g_idx per input feature adds under 0.001 B per weight).
GPTQ_BYTES_PER_PARAM = 0.5 + 2.5 / 128
# QLoRA's 4-bit backends: "nf4" (bitsandbytes; peft's prepare_model_for_kbit_training casts every other
# parameter to fp32) and "gptq" (peft leaves a GPTQ model in its 16-bit dtype: no fp32 cast).
QUANT_BACKENDS = ("nf4", "gptq")
# fp32 log-probs saved by log_softmax + nll grad + log_softmax grad at the start of backward.
LOGITS_BYTES_PER_ELEMENT = 12
# A loss computed in the model's 16-bit dtype (``loss_dtype="model"``: a model's own loss code that does not
# upcast, run without autocast, e.g. DeepSpeed fp16): the 16-bit logits the model returns, the 16-bit
# log-probs log_softmax saves, and in backward the nll gradient and log_softmax's input gradient, 2 B each.
LOGITS_MODEL_DTYPE_BYTES = 8
# 16-bit training: the 16-bit logits the model computed, counted live beside the fp32 working set.
# transformers 5.x frees them before backward (its peak is 12 B at the start of backward), but
# versions before 4.48 also held a shifted fp32 copy; with these 2 B the plan's longest context for
# Llama-3.1-8B QLoRA stays at or under the HF + FA2 lengths Unsloth measured (conservative where the
# stack is not known; benchmarks/estimator_vs_published.py).
LOGITS_16BIT_BYTES = 2
# Gemma-2's final logit soft-capping (logits / cap, tanh, x cap) before the loss keeps one more logits tensor
# in the compute dtype at the peak: 4 B per logit in fp32, 2 B in bf16 (transformers 5.24, torch 2.13, by the
# allocator's own events: benchmarks/logits_memory.py --families gemma2; it was 8 B, unmeasured, before).
def _softcap_bytes(cb: int) -> int:
    return cb
# TRL's SFTTrainer (``Workload.trainer == "trl"``, trl >= 1.16) scores the tokens through its own fused LM head
# (trl/kernels/chunked_logprob.py): log-probabilities from TRL_TOKEN_CHUNK x TRL_VOCAB_CHUNK tiles of the logits in
# the compute dtype, never the whole logits (it turns Liger's fused cross-entropy off). At its peak, in its backward:
# the tile, an fp32 gradient of the hidden states beside the hidden states it saved, fp32 statistics per token
# (TRL_PER_TOKEN_BYTES), a 16-bit copy of each vocabulary chunk of a head kept in fp32, and, when the head is
# trained, its fp32 gradient. With Triton (CUDA) the tile becomes the logits' gradient in place; elsewhere torch ops
# make TRL_TILE_TEMP_BYTES of fp32 and bool temporaries per tile element (the meta trace of a TRL step, which takes
# the same path as a CPU: `python benchmarks/allocator_replay.py --step-peak --trainer trl ...`).
TRL_TOKEN_CHUNK = 4096
TRL_VOCAB_CHUNK = 32768
TRL_TILE_TEMP_BYTES = 33
TRL_SOFTCAP_TEMP_BYTES = 4  # Gemma-2's final soft-capping (tanh of the tile) keeps one more fp32 temporary
TRL_PER_TOKEN_BYTES = 40


def trl_head_bytes(arch: Arch, tokens: int, *, wb: int, cb: int, head_trained: bool, device: str) -> int:
    """TRL's fused LM head at its peak for ``tokens`` tokens (``wb``: the hidden states' and the head's dtype
    bytes, ``cb``: the compute dtype's; above)."""
    rows, cols = min(tokens, TRL_TOKEN_CHUNK), min(arch.vocab, TRL_VOCAB_CHUNK)
    temporaries = TRL_TILE_TEMP_BYTES + (TRL_SOFTCAP_TEMP_BYTES if arch.logit_softcap else 0)
    tile = rows * cols * (cb + (0 if device == "cuda" else temporaries))
    chunk_cast = cols * arch.hidden * cb if wb != cb else 0
    head_grad = 4 * arch.vocab * arch.hidden if head_trained else 0
    return int(tile + chunk_cast + head_grad + tokens * (arch.hidden * (wb + 4) + TRL_PER_TOKEN_BYTES))


# Host RAM per offloaded byte: DeepSpeed's estimators' ``additional_buffer_factor`` (pinned buffers).
HOST_BUFFER_FACTOR = 1.5
# The terms of the step's forward and backward working set (live at the start of backward only).
ACTIVATION_TERMS = ("activations", "logits_loss", "recompute_working_set", "weight_copies", "qlora_dequant",
                    "attention_mask")  # fmt: skip
# Terms allocated once and kept for the whole run; the allocator reserve applies to the others.
STATIC_TERMS = ("weights", "master_weights", "optimizer_states", "lora_adapters", "zero_buffers", "ddp_buckets",
                "runtime_overhead")  # fmt: skip
# Terms DeepSpeed's model-state estimators count (parameters, gradients, optimizer states, ZeRO-3's
# gathered layers).
MODEL_STATE_TERMS = ("weights", "gradients", "gradients_fp32", "master_weights", "optimizer_states",
                     "gathered_params", "lora_adapters")  # fmt: skip
# DeepSpeed's default reduce/allgather bucket (elements) and the overlap_comm multiplier (HF docs).
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000
# ZeRO-3's optimizer sub-group (``sub_group_size``, DeepSpeed's default): the step walks them in turn.
DEEPSPEED_SUB_GROUP_ELEMENTS = 1_000_000_000
OVERLAP_COMM_FACTOR = 4.5


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted peak memory of one device.

    ``terms`` are the bytes live at the peak ``phase`` and add up to ``total``; ``phases`` gives the
    total of each phase considered. ``offloaded_bytes`` is what ZeRO-Offload keeps in host memory
    (not part of ``total``).
    """

    total: int
    terms: dict[str, int]
    phase: str
    phases: dict[str, int]
    device: str
    trainable_params: int
    offloaded_bytes: int = 0
    notes: tuple[str, ...] = field(default=())
    phase_terms: dict[str, dict[str, int]] = field(default_factory=dict)  # allocated terms of each phase
    host_bytes: int = 0  # host RAM one node needs for what is offloaded (0: nothing offloaded)

    @property
    def reserved(self) -> int:
        """What ``torch.cuda.max_memory_reserved`` would show at the peak: the total less the CUDA context (outside
        torch's allocator). The fit test uses the total: an out-of-memory error is about the card, context included."""
        return self.total - self.terms.get("cuda_context", 0)

    @property
    def live(self) -> int:
        """The peak without a CPU's retained heap (``heap_retained``): what a process whose malloc returns freed
        blocks to the system at once shows (a CPU probe under ``MALLOC_MMAP_THRESHOLD_=65536``); on a GPU the total."""
        return self.total - self.terms.get("heap_retained", 0)

    @property
    def allocated(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` would show: the reserved bytes less the caching allocator's
        reserve (``ALLOCATOR_RESERVE``)."""
        return self.reserved - self.terms.get("allocator_reserve", 0)

    @property
    def reserved_variable_lengths(self) -> int:
        """What ``torch.cuda.max_memory_reserved`` grows to on a card with room when the batches' lengths vary and
        the allocator is the default one (``VARLEN_RESERVE_GROWTH`` x the transient tensors: the dynamic part less
        what the forward saves for the backward, ``SAVED_FOR_BACKWARD_TERMS``). Not what the run needs: it still fits in ``reserved``, the allocator freeing cached
        segments and retrying when it runs out."""
        kept = sum(self.terms.get(k, 0) for k in (*STATIC_TERMS, *SAVED_FOR_BACKWARD_TERMS))
        grown = self.allocated + int(VARLEN_RESERVE_GROWTH * max(0, self.allocated - kept))
        return max(grown, self.reserved)  # never under the fixed-length figure: the longest batch alone reaches it

    @property
    def model_states(self) -> int:
        """Model-state bytes at the optimizer step (``MODEL_STATE_TERMS``): what DeepSpeed's
        ``estimate_zero*_model_states_mem_needs`` count per GPU, activations and buffers excluded."""
        opt = self.phase_terms.get("optimizer_step", self.terms)
        return sum(opt.get(k, 0) for k in MODEL_STATE_TERMS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "terms": dict(self.terms),
            "phase": self.phase,
            "phases": dict(self.phases),
            "device": self.device,
            "trainable_params": self.trainable_params,
            "offloaded_bytes": self.offloaded_bytes,
            "notes": list(self.notes),
            "phase_terms": {k: dict(v) for k, v in self.phase_terms.items()},
            "host_bytes": self.host_bytes,
            "model_states": self.model_states,
            "reserved": self.reserved,
            "allocated": self.allocated,
            "reserved_variable_lengths": self.reserved_variable_lengths,
        }


# The optimizers the Trainer can be given (``TrainingArguments.optim``), as the estimator models them:
# name -> (state bytes per trainable parameter, step temporaries, paged).
# * adamw_torch: torch.optim.AdamW with foreach=None, which picks the multi-tensor (foreach) path on
#   CUDA: ``_foreach_sqrt(exp_avg_sq)`` materialises one fp32 copy of every state tensor (4 B/param);
#   on CPU the single-tensor path, temporaries of one tensor at a time.
# * adamw_torch_fused: one fused kernel per tensor group, no temporaries. transformers 5.x's default
#   (``TrainingArguments.optim`` is ``adamw_torch_fused`` with torch >= 2.8).
# * adamw_8bit / paged_adamw_8bit: bitsandbytes block-wise 8-bit m and v (2 B/param), updated in place.
# * paged_adamw_32bit: fp32 m and v (8 B/param) in CUDA unified memory.
# * paged_*: the states live in unified memory that the driver evicts to host RAM under pressure
#   (QLoRA, arXiv:2305.14314 §3): they are counted at the optimizer step, not during forward/backward.
# * adafactor: factored second moment (rows + columns per matrix), no first moment by default.
# * sgd: the Trainer's plain SGD (no momentum): no state.
OPTIMIZERS: dict[str, tuple[float, str, bool]] = {
    "adamw_torch": (8.0, "foreach", False),
    "adamw_torch_fused": (8.0, "none", False),
    "adamw_8bit": (2.0, "none", False),
    "paged_adamw_8bit": (2.0, "none", True),
    "paged_adamw_32bit": (8.0, "none", True),
    "adafactor": (0.0, "per_tensor", False),
    "sgd": (0.0, "none", False),
}
# transformers 5.x's default optimizer (TrainingArguments.optim with torch >= 2.8)
DEFAULT_OPTIM = "adamw_torch_fused"


def optimizer_state_bytes_per_param(optim: str) -> float:
    """Optimizer state bytes per trainable parameter (AdamW: m and v in fp32; 8-bit: 2 B)."""
    if optim not in OPTIMIZERS:
        raise SpecError(f"optim must be one of {', '.join(OPTIMIZERS)}; got {optim!r}")
    return OPTIMIZERS[optim][0]


def _adafactor_bytes(arch: Arch) -> int:
    """Adafactor's factored second moment: rows + cols fp32 per matrix, full size for vectors."""
    per_layer = sum(4 * (i + o) for _, i, o in arch.linears)
    vectors = arch.params_per_layer - arch.params_layer_linear
    emb = 4 * (arch.vocab + arch.hidden) * (1 if arch.tied else 2)
    return arch.layers * (per_layer + 4 * vectors) + emb


def _sites(arch: Arch) -> tuple[tuple[str, int, tuple[str, ...]], ...]:
    """(site, width, consuming linears) for the four places a block feeds linears."""
    names = [n for n, _, _ in arch.linears]
    if arch.model_type == "gpt2":
        return (("attn_in", arch.hidden, ("c_attn",)), ("o_in", arch.q_width, ("attn.c_proj",)),
                ("mlp_in", arch.hidden, ("c_fc",)), ("down_in", arch.intermediate, ("mlp.c_proj",)))  # fmt: skip
    attn = tuple(n for n in names if n in ("q_proj", "k_proj", "v_proj", "qkv_proj"))
    mlp = tuple(n for n in names if n in ("gate_proj", "up_proj", "gate_up_proj")) or ("gate_proj", "up_proj")
    return (("attn_in", arch.hidden, attn), ("o_in", arch.q_width, ("o_proj",)),
            ("mlp_in", arch.hidden, mlp), ("down_in", arch.intermediate, ("down_proj",)))  # fmt: skip


def layer_activation_bytes_per_token(
    arch: Arch,
    seq_len: int,
    *,
    trainable_base: bool,
    adapted: frozenset[str],
    wb: int,
    cb: int,
    attn: str,
    device: str,
    lora_dropout: float = 0.0,
    masked: bool = False,
) -> float:
    """Bytes one transformer block saves for backward, per token (multiply by s·b).

    ``wb``: bytes of the weights' dtype (= the residual stream's); ``cb``: bytes of the compute
    dtype (2 under autocast or a 16-bit model, 4 in fp32). ``adapted``: LoRA-adapted linears.
    ``lora_dropout`` > 0: each adapted linear drops out its own copy of the input and saves it plus
    the dropout mask (a bool mask from CUDA's fused kernel; on CPU torch multiplies by an fp32 noise
    tensor and saves that). ``masked``: attention gets an explicit mask (packing
    without a flattening kernel), so transformers' sdpa path repeats k/v to every head (no GQA).
    """
    h, f = arch.hidden, arch.intermediate
    total = 0.0
    # norms: fp32 input (or its fp32 upcast) saved; a trainable weight also saves the normalized x
    per_norm = 4 * h + (wb * h if trainable_base and arch.model_type != "gpt2" else 0)
    total += arch.norms_per_layer * per_norm
    total += _linear_inputs_bytes(arch, trainable_base, adapted, wb, cb, device, lora_dropout)
    total += _attention_saved_bytes(arch, seq_len, cb, attn, device, masked)
    # MLP
    k = arch.experts_per_token
    if arch.gated_mlp:
        total += (arch.act_saved + 2) * cb * f * k  # act input, up, act output
    else:
        total += arch.act_saved * cb * f
    if arch.resid_dropout > 0:
        total += 2 * h  # two bool masks
    return total


def _linear_inputs_bytes(
    arch: Arch,
    trainable_base: bool,
    adapted: frozenset[str],
    wb: int,
    cb: int,
    device: str,
    lora_dropout: float,
) -> float:
    """Per token: the inputs the block's linears save for their weight gradients (and LoRA's dropout)."""
    autocast = cb < wb or bool(adapted) and cb < 4
    total = 0.0
    # linear inputs: each consuming linear that needs its input for a weight gradient saves it
    for site, width, consumers in _sites(arch):
        saving_base = len(consumers) if trainable_base else 0
        saving_lora = sum(1 for c in consumers if c in adapted)
        if saving_lora and lora_dropout > 0:
            # every adapted linear drops out its own copy of the input (peft casts it to the fp32
            # adapter dtype first): the mask (CUDA: bool; CPU: fp32 noise) and lora_A's input (its
            # 16-bit cast under autocast) are saved
            mask = 1 if device == "cuda" else 4
            total += saving_lora * width * (mask + (cb if autocast else 4))
            saving_lora = 0
        if site == "o_in":
            # the attention output is already saved by the attention op; only casts add copies
            if saving_lora and autocast:
                total += cb * width * saving_lora
            continue
        if site == "down_in":
            mult = arch.experts_per_token
            if saving_base:
                total += cb * width * mult
            if saving_lora:
                total += cb * width * (saving_lora if autocast else (0 if saving_base else 1))
            continue
        in_dtype_is_compute = wb == cb
        if saving_base:
            total += cb * width * (1 if in_dtype_is_compute else saving_base)
        if saving_lora:
            total += cb * width * (saving_lora if autocast else (0 if saving_base else 1))
    return total


def _attention_saved_bytes(arch: Arch, s: int, cb: int, attn: str, device: str, masked: bool) -> float:
    """Per token: what the attention core saves (fused kernel, or eager's s² scores)."""
    qw, kvw, a = arch.q_width, arch.kv_width, arch.heads
    # one fused q/k/v projection with rotary embeddings (Phi-3's qkv_proj): v, a view of the projection's output, is
    # saved, so the whole output stays live beside the rotated q and k (measured by the meta trace,
    # `python benchmarks/allocator_replay.py --per-layer --model phi-3-mini`)
    fused_qkv = cb * (qw + kvw) if any(n == "qkv_proj" for n, _, _ in arch.linears) else 0
    fused = attn in ("sdpa", "flash_attention_2", "flex_attention")
    if fused and not (device == "cpu" and arch.attn_dropout > 0):
        kv_saved = qw if masked else kvw  # repeat_kv: transformers uses sdpa's GQA only without a mask
        return cb * (qw + 2 * kv_saved) + cb * qw + 4 * a + fused_qkv
    # eager (or the math fallback): repeat_kv copies, s² scores, fp32 softmax and its cast
    total = cb * 3 * qw + cb * qw + fused_qkv
    if arch.attn_dropout > 0:
        # softmax saves its fp32 output; dropout saves its mask and the matmul with v the dropped
        # probabilities (16-bit under autocast: the cast feeds dropout and is not saved itself).
        # CUDA's fused dropout keeps a bool mask; CPU multiplies by a noise tensor of the input's
        # dtype. Measured by benchmarks/eager_dropout_saved.py (CPU fp32: 12 B per score element)
        mask = 1 if device == "cuda" else 4
        total += a * s * (4 + mask + cb)
    else:
        total += a * s * (4 + (cb if cb < 4 else 0))
    return total


def logits_bytes(arch: Arch, tokens: int, liger: bool, cb: int = 4, loss_dtype: str = "fp32") -> int:
    """The logits/loss working set at the start of backward for ``tokens`` tokens (``cb``: compute bytes, 4 for
    fp32, 2 for bf16/fp16); Liger's fused linear+cross-entropy keeps O(tokens x hidden) instead."""
    if liger:
        return int(8 * tokens * arch.hidden)
    if loss_dtype == "model" and cb < 4:
        return int((LOGITS_MODEL_DTYPE_BYTES + (_softcap_bytes(cb) if arch.logit_softcap else 0)) * tokens * arch.vocab)
    per = (LOGITS_BYTES_PER_ELEMENT + (_softcap_bytes(cb) if arch.logit_softcap else 0)
           + (LOGITS_16BIT_BYTES if cb < 4 else 0))
    return int(per * tokens * arch.vocab)


@dataclass(frozen=True)
class _Setup:
    """What a candidate's levers mean for the memory model, derived once."""

    n: int  # ranks ZeRO partitions over (1 without ZeRO)
    psi: int  # all parameters
    full: bool  # full fine-tuning (else LoRA/QLoRA)
    half: bool  # 16-bit compute (bf16/fp16)
    cb: int  # bytes per element of the compute dtype
    opt_bpp: float  # optimizer state bytes per trainable parameter
    ds: bool  # DeepSpeed ZeRO
    fsdp: bool  # FSDP
    off_opt: bool  # optimizer states offloaded (offload optimizer or params)
    off_par: bool  # parameters offloaded
    grads_off: bool  # gradient partitions offloaded
    fused_head: bool = False  # TRL's fused LM head scores the tokens: the head is never run as an autocast linear


@dataclass(frozen=True)
class _ModelStates:
    """One device's model states (weights, gradients, optimizer states, adapters, buffers) and what
    they imply for the rest of the model."""

    terms: dict[str, float]
    trainable: int
    wb: int  # bytes of the weights' dtype (= the residual stream's)
    offloaded: float  # bytes ZeRO-Offload keeps on the host
    persistent_grads: bool  # gradients live at the start of backward
    adapted: frozenset[str] = frozenset()  # LoRA-adapted linears
    notes: tuple[str, ...] = ()


def _checked_options(
    w: Workload, c: Candidate, device: str, gpu: GPU | None, quant: str | None, loss_dtype: str | None
) -> tuple[str, str]:
    """QLoRA's backend and the loss dtype, defaults applied; SpecError for anything that cannot be estimated."""
    if device not in ("cuda", "cpu"):
        raise SpecError(f"device must be 'cuda' or 'cpu', got {device!r}")
    problems = c.problems() + w.problems()
    if problems:
        raise SpecError(problems)
    if gpu is not None and c.precision == "bf16" and not gpu.bf16:
        raise SpecError(f"{gpu.name} has no bf16; use precision fp16")
    if w.mode == "qlora" and device == "cpu":
        raise SpecError("QLoRA (bitsandbytes 4-bit) needs a GPU; the CPU has no 4-bit kernels")
    backend = quant or "nf4"
    if backend not in QUANT_BACKENDS:
        raise SpecError(f"quant must be one of {', '.join(QUANT_BACKENDS)}; got {quant!r}")
    loss = loss_dtype or "fp32"
    if loss not in ("fp32", "model"):
        raise SpecError(f"loss_dtype must be fp32 or model; got {loss_dtype!r}")
    return backend, loss


def _setup(arch: Arch, w: Workload, c: Candidate) -> _Setup:
    """The flags and sizes every term below reads, from the workload and candidate."""
    half = c.precision in ("bf16", "fp16")
    off_opt = c.offload in ("optimizer", "params")
    return _Setup(
        n=c.world_size if c.zero_stage > 0 else 1,
        psi=arch.params_total,
        full=w.mode == "full",
        half=half,
        cb=2 if half else 4,
        opt_bpp=optimizer_state_bytes_per_param(c.optim),
        ds=c.zero_stage > 0 and c.sharding == "deepspeed",
        fsdp=c.zero_stage > 0 and c.sharding == "fsdp",
        off_opt=off_opt,
        off_par=c.offload == "params",
        # ZeRO-Offload of stage 2/3 also moves the gradient partitions to the host: the 16-bit gradients
        # are reduced bucket by bucket and copied out (DeepSpeed's own estimators count 2Ψ on the GPU
        # for ZeRO-2 and 2Ψ/N for ZeRO-3 with the optimizer offloaded). ZeRO-1 keeps whole gradients.
        grads_off=off_opt and c.zero_stage >= 2,
        fused_head=w.trainer == "trl",
    )


def _full_states(arch: Arch, c: Candidate, k: _Setup) -> _ModelStates:
    """Full fine-tuning's model states: AMP fp32, DeepSpeed's 16-bit module, or ZeRO/FSDP's fp32 shards."""
    psi, n = k.psi, k.n
    states = _adafactor_bytes(arch) if c.optim == "adafactor" else k.opt_bpp * psi
    t: dict[str, float] = {}
    offloaded = 0.0
    persistent_grads = True
    if k.ds and k.half:
        wb = 2  # DeepSpeed casts the module to 16-bit; fp32 master weights live in the optimizer
        t["weights"] = 2 * psi / (n if c.zero_stage == 3 else 1)
        t["gradients"] = 2 * psi / (n if c.zero_stage >= 2 else 1)
        master, st = 4 * psi / n, states / n
        if k.off_opt:
            # fp32 master weights, optimizer states and the fp32 gradient partition on the host
            offloaded += master + st + 4 * psi / n
            master = st = 0
        if k.grads_off:
            t["gradients"] = 0
        t["master_weights"], t["optimizer_states"] = master, st
    elif k.ds or k.fsdp:
        wb = 4
        t["weights"] = 4 * psi / (n if c.zero_stage == 3 else 1)
        t["gradients"] = 4 * psi / (n if c.zero_stage >= 2 else 1)
        st = states / n
        if k.off_opt:
            offloaded += st
            st = 0
        if k.grads_off or k.fsdp and k.off_par:
            offloaded += t["gradients"]
            t["gradients"] = 0
        t["optimizer_states"] = st
        if k.fsdp and k.half:
            t["weight_copies"] = 2 * 2 * arch.params_per_layer  # bf16 gathered units in flight
    else:
        wb = 4
        t["weights"] = 4 * psi
        t["gradients"] = 4 * psi
        t["optimizer_states"] = states
        if k.half:
            # autocast's 16-bit weight copies, saved for backward (recomputed with checkpointing); TRL's fused
            # head casts the head a vocabulary chunk at a time instead (in its logits term), never whole
            head = 0 if k.fused_head else arch.vocab * arch.hidden
            body = arch.params_matmul - arch.vocab * arch.hidden
            t["weight_copies"] = 2 * (head if c.grad_ckpt else body + head)
        if c.world_size > 1:
            t["ddp_buckets"] = 4 * psi
        persistent_grads = c.grad_accum > 1
    return _ModelStates(t, psi, wb, offloaded, persistent_grads)


def _qlora_base(arch: Arch, k: _Setup, backend: str, base_div: int) -> tuple[dict[str, float], int]:
    """QLoRA's frozen base: its terms and the bytes of the parameters it leaves unquantized."""
    # peft's prepare_model_for_kbit_training (the probe and the HF recipe call it) casts every
    # parameter bitsandbytes did not quantize (embeddings, lm_head, norms) to fp32, so the
    # residual stream is fp32 too, and autocast keeps a 16-bit copy of the fp32 lm_head. Two
    # setups keep them 16-bit: a GPTQ model (peft skips the cast) and DeepSpeed with 16-bit
    # precision (its engine casts the whole module to fp16/bf16 after peft's preparation).
    t: dict[str, float] = {}
    linear = arch.params_linear_total
    rest = 2 if k.half and (backend == "gptq" or k.ds) else 4
    bpp = GPTQ_BYTES_PER_PARAM if backend == "gptq" else QLORA_BYTES_PER_PARAM
    t["weights"] = (bpp * linear + rest * (k.psi - linear)) / base_div
    largest_linear = max((i * o for _, i, o in arch.linears), default=0)
    t["qlora_dequant"] = 2 * 2 * largest_linear
    if k.half and rest == 4 and not k.fused_head:
        t["weight_copies"] = 2 * arch.vocab * arch.hidden
    return t, rest


def _lora_states(arch: Arch, w: Workload, c: Candidate, k: _Setup, backend: str) -> _ModelStates:
    """LoRA/QLoRA's model states: the frozen base, fp32 adapters with their gradients and optimizer states."""
    n = k.n
    # what the probe's peft config adapts (GPT-2's Llama-style default falls back to all-linear)
    trainable = peft_lora_param_count(arch, w.lora_r, w.lora_targets)
    adapted = peft_lora_modules(arch, w.lora_targets)
    notes: tuple[str, ...] = ()
    if trainable == 0:
        notes = (f"lora_targets {', '.join(w.lora_targets)} match no linear of {arch.model_type}",)
    base_div = n if c.zero_stage == 3 else 1
    if w.mode == "qlora":
        t, wb = _qlora_base(arch, k, backend, base_div)
    else:
        wb = 2 if k.half else 4
        t = {"weights": wb * k.psi / base_div}
    offloaded = 0.0
    t["lora_adapters"] = 4 * trainable
    t["gradients"] = 4 * trainable / (n if c.zero_stage >= 2 else 1)
    st = (k.opt_bpp if c.optim != "adafactor" else 1.0) * trainable / n
    if k.off_opt:
        offloaded += st
        st = 0
    if k.grads_off:
        offloaded += t["gradients"]
        t["gradients"] = 0
    t["optimizer_states"] = st
    if k.half and not k.ds:
        # autocast's 16-bit copies of the fp32 adapters, saved by their matmuls in every layer not checkpointed
        # (DeepSpeed casts the adapters to 16-bit itself)
        t["weight_copies"] = t.get("weight_copies", 0.0) + 2 * trainable * (1 - recomputed(arch, c))
    if c.world_size > 1 and c.zero_stage == 0:
        t["ddp_buckets"] = 4 * trainable
    persistent_grads = c.grad_accum > 1 or c.zero_stage > 0 or c.world_size > 1
    return _ModelStates(t, trainable, wb, offloaded, persistent_grads, adapted, notes)


def _with_zero_buffers(
    arch: Arch, c: Candidate, k: _Setup, ms: _ModelStates, bucket_elements: int | None
) -> _ModelStates:
    """Adds DeepSpeed ZeRO's communication buffers, and ZeRO-3's gathered parameters (and parameter offload)."""
    t = dict(ms.terms)
    offloaded = ms.offloaded
    gb = 2 if k.half else 4  # bytes per element of a gathered (ZeRO-3) or autocast copy of a weight
    ov = OVERLAP_COMM_FACTOR
    if c.zero_stage in (1, 2):
        bucket = min(bucket_elements or DEEPSPEED_BUCKET_ELEMENTS, ms.trainable)
        t["zero_buffers"] = 2 * 2 * bucket * ov
    else:
        h2 = arch.hidden**2
        t["zero_buffers"] = 2 * h2 * ov + 2 * 0.9 * h2
        # the module being computed and the one prefetched, gathered in 16-bit: DeepSpeed's
        # estimator counts 4 B x the largest module's parameters (the embedding, for LLMs)
        t["gathered_params"] = 2 * gb * arch.largest_param
        if k.off_par:
            offloaded += t["weights"]
            t["weights"] = 0
    return replace(ms, terms=t, offloaded=offloaded)


def _optimizer_step_terms(
    arch: Arch, w: Workload, c: Candidate, k: _Setup, device: str, trainable: int
) -> dict[str, float]:
    """Terms live at the optimizer step only: the optimizer's temporaries, DeepSpeed's fp32 gradients."""
    step: dict[str, float] = {}
    tr_shard = trainable / k.n
    largest = (
        arch.largest_param if k.full else w.lora_r * max((max(i, o) for _, i, o in arch.linears), default=0)
    )
    kind = OPTIMIZERS[c.optim][1]
    if k.off_opt:
        temp = 0.0
    elif kind == "foreach":
        # foreach (CUDA; DeepSpeed's flat partition): one fp32 copy; single-tensor (CPU): per tensor
        temp = 4 * tr_shard if device == "cuda" or k.ds else 2 * 4 * largest
    elif kind == "per_tensor":
        temp = 2 * 4 * largest
    else:
        temp = 0.0
    step["optimizer_temp"] = temp
    if k.full and arch.tied and not (k.ds or k.fsdp):
        # tied input and output embeddings: the embedding's gradient arrives last, beside every other gradient, and
        # is then added into the lm_head's (the meta trace of Llama-3.2-1B's full step: 0.90x the estimate without
        # it, 1.00x untied). It and the optimizer's temporaries are not live together: the larger counts
        step["tied_embedding_grad"] = max(0.0, 4 * arch.vocab * arch.hidden - temp)
    if k.ds and k.half and not k.off_opt:
        # the fp32 gradient partition built for the step; ZeRO-3 builds it one optimizer sub-group
        # at a time (DeepSpeed's estimator leaves it out for ZeRO-3: a stated difference)
        sub = tr_shard if c.zero_stage < 3 else min(tr_shard, DEEPSPEED_SUB_GROUP_ELEMENTS)
        step["gradients_fp32"] = 4 * sub
    return step


def _host_bytes(c: Candidate, k: _Setup, ms: _ModelStates) -> float:
    """Host RAM one node needs for what ZeRO-Offload moves there (0 when nothing is offloaded)."""
    if not ms.offloaded:
        return 0.0
    # host RAM per node (all ranks of one node), as DeepSpeed's estimators count it: the offloaded
    # partitions of every rank, or (ZeRO-1/2) each rank's fp32 copy while it builds the model,
    # whichever is larger, x HOST_BUFFER_FACTOR for pinned buffers
    ranks = c.world_size
    load = 0.0 if c.zero_stage == 3 else (4 if k.full else ms.wb) * k.psi * ranks
    return HOST_BUFFER_FACTOR * max(ms.offloaded * ranks, load)


def _backward_transients(
    arch: Arch, attn: str, device: str, cb: int, s: int, tokens: int
) -> tuple[float, float]:
    """The working set of backward through one layer: saved (no checkpointing) and recomputed."""
    f_k = arch.intermediate * arch.experts_per_token
    transient = (3 * cb * f_k + 8 * arch.hidden) * tokens
    # backward through a recomputed layer frees its saved tensors as their gradients are made: one
    # f-sized gradient (CPU probes: 0.6-0.7x the 3-gradient figure was live, tiny-llama/qwen2/gpt2)
    recompute_transient = (cb * f_k + 8 * arch.hidden) * tokens
    if device == "cuda" and attn in ("sdpa", "flash_attention_2", "flex_attention"):
        # backward through a fused attention kernel: the output gradient, dq/dk/dv, FlashAttention's
        # fp32 dq accumulator and softmax statistics, and (GQA) dk/dv expanded to every head
        qw, kvw = arch.q_width, arch.kv_width
        expanded = 2 * cb * qw if kvw < qw else 0
        attn_ws = (cb * qw + cb * (qw + 2 * kvw) + 4 * qw + 4 * arch.heads + expanded) * tokens
        transient = max(transient, attn_ws)
        recompute_transient = max(recompute_transient, attn_ws)
    if attn == "eager" or device == "cpu" and arch.attn_dropout > 0:
        # backward through an eager softmax: the fp32 gradient of the s² probabilities
        s2_grad = 4 * arch.heads * s * tokens
        transient = max(transient, s2_grad)
        recompute_transient = max(recompute_transient, s2_grad)
    return transient, recompute_transient


def _activation_terms(
    arch: Arch, w: Workload, c: Candidate, k: _Setup, ms: _ModelStates, device: str, loss: str
) -> dict[str, float]:
    """The attention mask, the activations saved for backward and the logits/loss (or recompute) working set."""
    s, b = w.seq_len, c.micro_batch
    tokens = s * b
    wb, cb, full = ms.wb, k.cb, k.full
    t: dict[str, float] = {}
    # packing without a flattening kernel: the collator's 4D block-causal mask (rows, 1, W, W) in the
    # hidden states' dtype, live for the whole step. micro_batch counts sequences, packed or not, and
    # the probe's first micro-batch holds the longest ones (autotune.probe.collate): at worst b
    # sequences of s tokens, one per row, so b x s tokens and a (b, 1, s, s) mask, as for padding.
    # Shorter sequences pack into fewer, narrower rows: the same terms bound them.
    masked = c.packing and c.attn not in FLATTEN_ATTN
    layer = layer_activation_bytes_per_token(
        arch, s, trainable_base=full, adapted=ms.adapted, wb=wb, cb=cb, attn=c.attn, device=device,
        lora_dropout=LORA_DROPOUT if not full else 0.0, masked=masked,
    )  # fmt: skip
    final = 4 * arch.hidden + (wb * arch.hidden if full else 0) + (cb * arch.hidden if full else 0)
    transient, recompute_transient = _backward_transients(arch, c.attn, device, cb, s, tokens)
    if masked:
        t["attention_mask"] = wb * b * s * s
    elif c.attn == "eager" and c.grad_ckpt:
        # transformers materialises the causal mask for eager attention; checkpointed layers keep it
        t["attention_mask"] = wb * b * s * s
    if w.trainer == "trl":
        logits = trl_head_bytes(arch, tokens, wb=wb, cb=cb, head_trained=full, device=device)
    else:
        logits = logits_bytes(arch, tokens, c.liger, cb, loss)
    saved: float
    working: float
    if c.grad_ckpt:
        # the checkpointed layers keep their input only, the others everything their backward reads
        checkpointed = checkpointed_layers(arch, c)
        saved = (checkpointed * wb * arch.hidden + (arch.layers - checkpointed) * layer + final) * tokens
        working = max(logits, layer * tokens + recompute_transient)
    else:
        saved = (arch.layers * layer + final) * tokens
        working = max(logits, transient)
    t["activations"] = saved
    if logits >= (layer * tokens + recompute_transient if c.grad_ckpt else transient):
        t["logits_loss"] = working
    else:
        t["logits_loss"] = logits
        t["recompute_working_set"] = working - logits
    return t


def _overhead(ts: dict[str, float], device: str) -> dict[str, float]:
    """The allocator's reserve on the part allocated and freed within a step, and the context."""
    if device != "cuda":
        return {}
    dynamic = sum(v for k, v in ts.items() if k not in STATIC_TERMS)
    return {"allocator_reserve": dynamic * ALLOCATOR_RESERVE, "cuda_context": CUDA_CONTEXT_BYTES}


def _heap_retained(arch: Arch, w: Workload, c: Candidate, k: _Setup, ms: _ModelStates, loss: str) -> float:
    """glibc's freed-but-mapped heap at a CPU step's peak (``CPU_HEAP_RETAINED``, above)."""
    plain = c if not c.grad_ckpt else replace(c, grad_ckpt=False)
    produced = sum(_activation_terms(arch, w, plain, k, ms, "cpu", loss).values())
    share = CPU_HEAP_RETAINED + (CPU_HEAP_RETAINED_CKPT if c.grad_ckpt else 0.0)
    return CPU_HEAP_FIXED_BYTES + share * produced


def _breakdown(
    arch: Arch, t: dict[str, float], step: dict[str, float], ms: _ModelStates, device: str, host: float
) -> MemoryBreakdown:
    """The two phases' terms, the peak phase and its terms, rounded to bytes."""
    act_keys = ACTIVATION_TERMS + ("heap_retained",)
    static = {k: v for k, v in t.items() if k not in act_keys}
    bwd = dict(t)
    if not ms.persistent_grads:
        bwd.pop("gradients", None)
    opt = {**static, **step}
    phases = {"backward_start": bwd, "optimizer_step": opt}
    totals = {k: sum(v.values()) + sum(_overhead(v, device).values()) for k, v in phases.items()}
    phase = max(totals, key=lambda k: totals[k])
    terms = {k: int(round(v)) for k, v in {**phases[phase], **_overhead(phases[phase], device)}.items() if v}
    return MemoryBreakdown(
        total=sum(terms.values()),
        terms=terms,
        phase=phase,
        phases={k: int(round(v)) for k, v in totals.items()},
        device=device,
        trainable_params=int(ms.trainable),
        offloaded_bytes=int(ms.offloaded),
        notes=tuple(list(ms.notes) + list(arch.notes)),
        phase_terms={p: {k: int(round(v)) for k, v in ts.items() if v} for p, ts in phases.items()},
        host_bytes=int(host),
    )


def _longest_batch(w: Workload, c: Candidate) -> Workload:
    """The workload at the longest row its batches can have: unpacked rows are padded to the longest sequence of
    their batch, so lengths that never reach ``seq_len`` (``uniform:32-512`` or a histogram, under a 2,048-token
    limit) never make a ``seq_len`` row, as the probe's worst-case batch does not (``autotune.probe.collate``);
    packed rows fill ``seq_len``. It had sized every such plan at ``seq_len``: checkpointing and half the
    micro-batch, 45 % slower, for data of 100-token rows."""
    if c.packing or w.lengths == "fixed":
        return w
    from autotune.spec.lengths import length_bounds

    try:
        longest = length_bounds(str(w.lengths), int(w.seq_len))[1]
    except SpecError:  # (the callers check the spec; a bad one is theirs to report)
        return w
    return w if longest >= w.seq_len else replace(w, seq_len=max(8, longest))


def estimate_memory(
    arch: Arch,
    workload: Workload,
    candidate: Candidate,
    *,
    device: str = "cuda",
    gpu: GPU | None = None,
    quant: str | None = None,
    loss_dtype: str | None = None,
    bucket_elements: int | None = None,
) -> MemoryBreakdown:
    """Predicted peak bytes on one device for this workload and candidate (see module docstring).

    ``device="cpu"``: fp32 CPU training as the CPU probe runs it, no CUDA context or reserve.
    ``gpu`` is only used to check bf16 support; its capacity is the caller's business.
    ``quant``: QLoRA's 4-bit backend (``QUANT_BACKENDS``; default "nf4", bitsandbytes as the probe runs it).
    ``loss_dtype``: "fp32" (default: transformers upcasts the logits, and autocast runs log_softmax in
    fp32) or "model" (a loss in the model's 16-bit dtype, without autocast; ``LOGITS_MODEL_DTYPE_BYTES``).
    ``bucket_elements``: DeepSpeed ZeRO-1/2's reduce/allgather bucket size when the config sets one
    (default ``DEEPSPEED_BUCKET_ELEMENTS``, DeepSpeed's own default).
    """
    c, w = candidate, _longest_batch(workload, candidate)
    backend, loss = _checked_options(w, c, device, gpu, quant, loss_dtype)
    k = _setup(arch, w, c)
    ms = _full_states(arch, c, k) if k.full else _lora_states(arch, w, c, k, backend)
    if k.ds:
        # communication buffers of DeepSpeed ZeRO, and ZeRO-3's gathered parameters
        ms = _with_zero_buffers(arch, c, k, ms, bucket_elements)
    t = dict(ms.terms)
    step = _optimizer_step_terms(arch, w, c, k, device, ms.trainable)
    if OPTIMIZERS[c.optim][2] and "optimizer_states" in t:
        # paged: evicted to host RAM under pressure during forward/backward, paged in for the step
        step["optimizer_states"] = t.pop("optimizer_states")
    host = _host_bytes(c, k, ms)
    t.update(_activation_terms(arch, w, c, k, ms, device, loss))
    if device == "cpu":
        t["runtime_overhead"] = CPU_RUNTIME_OVERHEAD_BYTES
        t["heap_retained"] = _heap_retained(arch, w, c, k, ms, loss)
    return _breakdown(arch, t, step, ms, device, host)
