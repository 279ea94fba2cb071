"""What the CUDA caching allocator reserves when batch lengths vary, from a real training step's allocations,
at the model's real size and without a GPU.

    python benchmarks/allocator_replay.py --model qwen2.5-7b --mode lora --micro-batch 2 --max-len 4096 \
        --lengths uniform --steps 40 --out benchmarks/results/allocator_replay.json

**Trace.** The model is built from its config on PyTorch's ``meta`` device (shapes and dtypes, no storage, no
arithmetic), set up as the probe sets it up (the dtype ``autotune.formats.model_dtype`` picks, the emitted LoRA
configuration, non-reentrant gradient checkpointing), and one forward, loss and backward run through a dispatch
mode that records, in order, every storage an aten operation allocates and the moment it is freed (its weak
reference expires). Three things a meta run would do otherwise than a GPU are set as the GPU does them: autocast
(``torch.autocast`` is CUDA-only: ``F.linear``, GPT-2's ``torch.addmm`` and attention get their inputs cast to the
16-bit type where they are not already, once per use: each cast is what the op saves for its backward; and
``F.layer_norm``, on autocast's fp32 list, gets them cast to fp32), attention (the flash-attention op with its output,
laid out (batch, length, heads, dim) as the kernels write it, and log-sum-exp, where a meta run would take the math
path and materialise the s x s scores) and dropout (CUDA's fused kernel saves a bool mask, where a meta or CPU run saves a noise tensor
of the input's dtype: LoRA's dropout on every adapted linear's fp32 input would count 4 B for 1).
A trace takes a second or two for an 8B model at 4,096 tokens.

``--per-layer`` traces the step at one and two layers instead and reports what one layer keeps for its backward
(the bytes live at the end of the forward), beside the estimator's ``activations`` and ``weight_copies`` for one
layer::

    python benchmarks/allocator_replay.py --per-layer --model qwen2.5-7b --micro-batch 1 --max-len 2048 --no-grad-ckpt

**Replay.** A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): requests rounded up
to 512 B; requests up to 1 MiB served from a small pool of 2 MiB segments, larger ones from a large pool whose
new segments are 20 MiB below 10 MiB and the request rounded up to 2 MiB above; the smallest cached free block
that fits is taken (best fit) and split when what is left is over 1 MiB (large pool) or at least 512 B (small
pool); a freed block merges with free neighbours in its segment; nothing goes back to the device unless a
``cudaMalloc`` fails (never, here: the card is taken to be as large as needed, as on the 80 GB cards published
``max_memory_reserved`` figures come from). With ``expandable_segments:True`` each pool is one segment whose
mapped pages grow at its end (a request that no free block fits extends a free tail block, or maps new pages),
so memory freed by a short batch serves a longer one. Steps run with batch lengths drawn from a distribution
(``--lengths``: ``fixed`` every step at the maximum, ``uniform`` between an eighth of it and it, ``skewed``
lognormal like chat data, clipped; each batch padded to its longest row); the weights are allocated first and
the optimizer's states after the first backward, the gradients freed after each step (``zero_grad`` sets them
to None). It reports the peak allocated bytes, the peak reserved bytes with and without expandable segments,
and what ``estimate_memory`` predicts for the same configuration at the maximum length.

What it leaves out: cuBLAS workspaces and the CUDA context (constant, in the estimator's context term), the
optimizer step's own temporaries (none for fused AdamW), and kernels whose memory a GPU run would differ in
beyond attention (none that the traced models use).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MiB = 2**20
GiB = 2**30
PRESETS = ROOT / "autotune" / "models" / "presets"

# --- the caching allocator ---------------------------------------------------------------------------
MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of it
SMALL_SIZE = 1 * MiB  # kSmallSize: requests up to it go to the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: a small-pool segment
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: a large-pool segment for requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge: larger segments are the request rounded up to it
PAGE = 2 * MiB  # expandable segments map memory in pages of this size


@dataclass(eq=False)
class _Block:
    small: bool
    seg: int
    offset: int
    size: int
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.seg, self.offset)


@dataclass
class _Pool:
    small: bool
    free: list[tuple[int, int, int]] = field(default_factory=list)  # sorted keys of the free blocks
    blocks: dict[tuple[int, int, int], _Block] = field(default_factory=dict)
    tail: _Block | None = None  # expandable segments: the last block of the pool's one segment

    def add(self, b: _Block) -> None:
        k = b.key()
        bisect.insort(self.free, k)
        self.blocks[k] = b

    def remove(self, b: _Block) -> None:
        k = b.key()
        i = bisect.bisect_left(self.free, k)
        assert i < len(self.free) and self.free[i] == k, "free-list out of step"
        del self.free[i]
        del self.blocks[k]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.free, (size, -1, -1))
        return self.blocks[self.free[i]] if i < len(self.free) else None


class CachingAllocator:
    """PyTorch's CUDA caching allocator as far as its allocated and reserved bytes go (module docstring)."""

    def __init__(self, expandable: bool = False, capacity: int | None = None) -> None:
        self.expandable = expandable
        self.capacity = capacity  # device bytes; None: as large as needed
        self.pools = {True: _Pool(True), False: _Pool(False)}
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self._segments = 0
        self.retries = 0

    def _fits(self, grow: int) -> bool:
        return self.capacity is None or self.reserved + grow <= self.capacity

    def _release_cached(self) -> None:
        """What the allocator does when cudaMalloc fails, before it gives up: return every cached segment that
        is wholly free to the device (expandable segments: unmap the free pages at each pool's end)."""
        self.retries += 1
        for pool in self.pools.values():
            if self.expandable:
                t = pool.tail
                if t is not None and t.free:
                    pool.remove(t)
                    self.reserved -= t.size
                    pool.tail = t.prev
                    if t.prev is not None:
                        t.prev.next = None
                continue
            for k in [k for k, b in pool.blocks.items() if b.prev is None and b.next is None]:
                b = pool.blocks[k]
                pool.remove(b)
                self.reserved -= b.size

    @staticmethod
    def round_size(n: int) -> int:
        return MIN_BLOCK if n < MIN_BLOCK else MIN_BLOCK * math.ceil(n / MIN_BLOCK)

    @staticmethod
    def segment_size(size: int) -> int:
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return ROUND_LARGE * math.ceil(size / ROUND_LARGE)

    def _new_memory(self, pool: _Pool, size: int) -> _Block:
        """A free block (not in the free list) of at least ``size`` bytes, from new device memory."""
        if not self.expandable:
            seg = self.segment_size(size)
            if not self._fits(seg):
                self._release_cached()
                if not self._fits(seg):
                    raise MemoryError(f"out of memory: {seg} more bytes with {self.reserved} reserved")
            self._segments += 1
            self.reserved += seg
            return _Block(pool.small, self._segments, 0, seg)
        tail = pool.tail
        need = PAGE * math.ceil((size - (tail.size if tail is not None and tail.free else 0)) / PAGE)
        if not self._fits(need):
            raise MemoryError(f"out of memory: {need} more bytes with {self.reserved} reserved")
        if tail is not None and tail.free:  # map pages behind the free block at the segment's end
            pool.remove(tail)
            grow = PAGE * math.ceil((size - tail.size) / PAGE)
            tail.size += grow
            self.reserved += grow
            return tail
        grow = PAGE * math.ceil(size / PAGE)
        b = _Block(pool.small, 0, (tail.offset + tail.size) if tail else 0, grow, prev=tail)
        if tail is not None:
            tail.next = b
        pool.tail = b
        self.reserved += grow
        return b

    @staticmethod
    def _merge(pool: _Pool, first: _Block, second: _Block) -> None:
        """``second``, the block just after ``first`` in its segment, joins ``first`` (neither is in the free list:
        the caller takes the cached one out first and puts the merged block back)."""
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        if pool.tail is second:
            pool.tail = first

    def malloc(self, nbytes: int) -> _Block:
        size = self.round_size(nbytes)
        pool = self.pools[size <= SMALL_SIZE]
        b = pool.best_fit(size)
        if b is not None:
            pool.remove(b)
        else:
            b = self._new_memory(pool, size)
        rest = b.size - size
        if (pool.small and rest >= MIN_BLOCK) or (not pool.small and rest > SMALL_SIZE):
            r = _Block(pool.small, b.seg, b.offset + size, rest, prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = r
            b.next, b.size = r, size
            if pool.tail is b:
                pool.tail = r
            pool.add(r)
        b.free = False
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return b

    def free(self, b: _Block) -> None:
        pool = self.pools[b.small]
        self.allocated -= b.size
        b.free = True
        n, p = b.next, b.prev
        if n is not None and n.free:  # absorb the next block
            pool.remove(n)
            self._merge(pool, b, n)
        if p is not None and p.free:  # and be absorbed by the previous one
            pool.remove(p)
            self._merge(pool, p, b)
            b = p
        pool.add(b)


# --- the trace ----------------------------------------------------------------------------------------
@dataclass
class Trace:
    """One training step's storage allocations in order: ``events`` holds (+id, bytes) for an allocation and
    (-id, 0) for a free; ``static`` the weights' and buffers' storages, allocated before the first step;
    ``states`` the optimizer's (two fp32 tensors per trainable parameter); ``kept`` the ids still live after the
    backward (the gradients, freed after the optimizer step); ``forward_end`` the number of events up to the end of
    the forward and loss (what is live there is what the backward will read: ``saved_bytes``)."""

    static: list[int]
    states: list[int]
    events: list[tuple[int, int]]
    kept: list[int]
    forward_end: int = 0

    def live_bytes(self, until: int | None = None) -> list[int]:
        """The bytes the step holds (allocated, not yet freed) after each of its first ``until`` events."""
        sizes: dict[int, int] = {}
        cur, out = 0, []
        for i, n in self.events[:until]:
            if i > 0:
                sizes[i] = n
                cur += n
            else:
                cur -= sizes.pop(-i, 0)
            out.append(cur)
        return out

    def saved_bytes(self) -> int:
        """The bytes the step has allocated and not freed at the end of the forward and loss."""
        return (self.live_bytes(self.forward_end) or [0])[-1]


def _config(model: str) -> dict[str, Any]:
    p = Path(model)
    path = p / "config.json" if p.is_dir() else p if p.suffix == ".json" else PRESETS / model / "config.json"
    return json.loads(path.read_text())


def trace_step(config: dict[str, Any], batch: int, length: int, *, mode: str = "lora", lora_r: int = 16,
               lora_targets: tuple[str, ...] = ("all-linear",), grad_ckpt: bool = True,
               precision: str = "bf16", trainer: str = "hf") -> Trace:  # fmt: skip
    """The allocations of one step of ``batch`` rows of ``length`` tokens (module docstring). ``trainer="trl"``: the
    loss as TRL's SFTTrainer computes it, through its fused LM head (tiled log-probabilities, no full logits)."""
    import torch
    import transformers
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map_only

    from autotune.formats.model import lora_config, model_dtype
    from autotune.spec.probe_request import Candidate, Workload

    wl = Workload("m", seq_len=length, mode=mode, lora_r=lora_r, lora_targets=lora_targets)
    cand = Candidate(micro_batch=batch, grad_ckpt=grad_ckpt, precision=precision, attn="sdpa")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[model_dtype(cand, wl)]
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    cfg = transformers.AutoConfig.for_model(**config)
    cfg.use_cache = False
    def to_half(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype == half:
            return x
        return x.to(half)

    def to_fp32(x: Any) -> Any:
        return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    class Flash(torch.autograd.Function):
        """FlashAttention-2's memory, as its kernels allocate it: the forward writes the output and the log-sum-exp
        per row and head (fp32) and saves q, k, v, both; the backward allocates dq, dk, dv, an fp32 dq accumulator
        and the per-row softmax term (fp32). Grouped-query k and v are read in place (their gradients are the
        grouped size)."""

        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any) -> Any:
            # the kernels write (batch, length, heads, dim): the (batch, length, hidden) view the output projection
            # reads needs no copy
            b, h, n, d = q.shape
            out = torch.empty((b, n, h, d), dtype=q.dtype, device=q.device).transpose(1, 2)
            lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            q, k, v, out, lse = ctx.saved_tensors
            acc = torch.empty(q.shape, dtype=torch.float32, device=q.device)
            d = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            del acc, d
            return dq, dk, dv

    def attention(module: Any, q: Any, k: Any, v: Any, mask: Any, dropout: float = 0.0, scaling: Any = None,
                  **kw: Any) -> tuple[Any, None]:  # fmt: skip
        """transformers' attention interface: (batch, heads, length, dim) in, (batch, length, heads, dim) out."""
        if half is not None:
            q, k, v = to_half(q), to_half(k), to_half(v)
        return Flash.apply(q, k, v).transpose(1, 2), None

    transformers.AttentionInterface.register("autotune_trace", attention)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="autotune_trace")
    if trainer == "trl":  # as SFTTrainer patches it (the outputs its metrics read)
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    if mode != "full":
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(**lora_config(wl)))
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if mode != "full":
            model.enable_input_require_grads()
    model.train()
    static = [t.untyped_storage().nbytes() for t in list(model.parameters()) + list(model.buffers())]
    trainable = [p for p in model.parameters() if p.requires_grad]
    states = [4 * p.numel() for p in trainable for _ in range(2)]

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple[int, int]] = []
            self.live: dict[int, tuple[int, Any]] = {}
            self.known: set[int] = set()  # storages made before the step (weights, buffers, the batch): views of them
            self.n = 0
            self.forward_end = 0

        def _track(self, t: Any) -> None:
            st = t.untyped_storage()
            if st._cdata in self.live or st._cdata in self.known:
                return
            self.n += 1
            self.live[st._cdata] = (self.n, StorageWeakRef(st))
            self.events.append((self.n, st.nbytes()))

        def sweep(self) -> None:
            for key, (i, ref) in list(self.live.items()):
                if ref.expired():
                    self.events.append((-i, 0))
                    del self.live[key]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            # an op's outputs that alias an input (views, in-place ops) share its storage: tracked once
            tree_map_only(torch.Tensor, self._track, out)
            self.sweep()
            return out

    import transformers.masking_utils as mu

    ids = torch.zeros(batch, length, dtype=torch.long, device="meta")
    rec = Recorder()
    rec.known = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers(), ids]}
    # transformers looks at position ids for packed rows (.item() on them: not on meta); the rows here are not packed.
    # Autocast runs F.linear in the 16-bit type: patched for the trace (in every thread: checkpointing's recompute
    # runs in the backward's)
    # Dropout on a meta (or CPU) tensor multiplies by a noise tensor of the input's dtype and saves it; CUDA's fused
    # kernel saves a bool mask: the trace takes CUDA's op (LoRA's dropout on each adapted linear's input)
    F = torch.nn.functional
    packed, linear, dropout, addmm, layer_norm = (mu.find_packed_sequence_indices, F.linear, F.dropout, torch.addmm,
                                                  F.layer_norm)  # fmt: skip
    # TRL's kernel asks autocast for its compute dtype; the meta device has no autocast: answer as CUDA's would
    autocast_on, autocast_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype
    torch.is_autocast_enabled = lambda *a: half is not None if a and str(a[0]) == "meta" else autocast_on(*a)
    torch.get_autocast_dtype = lambda *a: half if a and str(a[0]) == "meta" and half else autocast_dtype(*a)
    mu.find_packed_sequence_indices = lambda *a, **k: None
    F.dropout = lambda x, p=0.5, training=True, inplace=False: (
        torch.native_dropout(x, p, True)[0] if training and p > 0 else x)  # fmt: skip
    if half is not None:
        F.linear = lambda x, w, b=None: linear(to_half(x), to_half(w), to_half(b))
        torch.addmm = lambda b, x, w, **kw: addmm(to_half(b), to_half(x), to_half(w), **kw)  # GPT-2's Conv1D
        # autocast runs layer_norm in fp32 (its fp32 list): a 16-bit input is cast up, and the fp32 copy is saved
        F.layer_norm = lambda x, shape, w=None, b=None, eps=1e-5: layer_norm(
            to_fp32(x), shape, to_fp32(w), to_fp32(b), eps)  # fmt: skip
    try:
        _run(model, ids, rec, trainer)
    finally:
        mu.find_packed_sequence_indices, F.linear, F.dropout, torch.addmm, F.layer_norm = (
            packed, linear, dropout, addmm, layer_norm)  # fmt: skip
        torch.is_autocast_enabled, torch.get_autocast_dtype = autocast_on, autocast_dtype
    import gc

    gc.collect()
    rec.sweep()
    return Trace(static=static, states=states, events=rec.events, kept=[i for i, _ in rec.live.values()],
                 forward_end=rec.forward_end)  # fmt: skip


def _run(model: Any, ids: Any, rec: Any, trainer: str = "hf") -> None:
    with rec:
        if trainer == "trl":  # SFTTrainer's loss: the mean negative log-probability of the labelled tokens
            out = model(input_ids=ids, labels=ids, fused_lm_head=True)
            loss = -out.log_probs.sum() / out.label_mask.sum()
            del out
        else:
            loss = model(input_ids=ids, labels=ids).loss
        rec.sweep()
        rec.forward_end = len(rec.events)
        loss.backward()
        del loss
        rec.sweep()


@dataclass
class TraceFamily:
    """Traces of one configuration at every length, from two: the step's operations do not depend on the length,
    and every allocation's size is affine in it (activations, logits, attention's row statistics), so two traces
    give the rest (``at``). ``check`` compares a third length's real trace with the interpolated one."""

    a: Trace
    b: Trace
    len_a: int
    len_b: int

    def __post_init__(self) -> None:
        ea, eb = self.a.events, self.b.events
        if len(ea) != len(eb) or any((x > 0) != (y > 0) for (x, _), (y, _) in zip(ea, eb, strict=True)):
            raise ValueError("the two traces are not the same sequence of operations")

    def at(self, length: int) -> Trace:
        f = (length - self.len_a) / (self.len_b - self.len_a)
        events = [(i, max(0, round(sa + (sb - sa) * f)) if i > 0 else 0)
                  for (i, sa), (_, sb) in zip(self.a.events, self.b.events, strict=True)]  # fmt: skip
        return Trace(static=self.a.static, states=self.a.states, events=events, kept=self.a.kept,
                     forward_end=self.a.forward_end)  # fmt: skip


def trace_family(config: dict[str, Any], batch: int, max_len: int, **kw: Any) -> TraceFamily:
    """Two traces (at half the maximum and at it) that give every length's (``TraceFamily.at``)."""
    lo = max(16, max_len // 2)
    return TraceFamily(trace_step(config, batch, lo, **kw), trace_step(config, batch, max_len, **kw), lo, max_len)


# --- the replay ---------------------------------------------------------------------------------------
def replay(traces: list[Trace], *, expandable: bool, capacity: int | None = None) -> dict[str, int]:
    """Peak allocated and reserved bytes over the steps whose traces are given, in order (``capacity``: the
    device's bytes; MemoryError when the run does not fit in them)."""
    a = CachingAllocator(expandable=expandable, capacity=capacity)
    for n in traces[0].static:
        a.malloc(n)
    states_done = False
    for t in traces:
        live: dict[int, _Block] = {}
        for i, n in t.events:
            if i > 0:
                live[i] = a.malloc(n)
            elif -i in live:
                a.free(live.pop(-i))
        if not states_done:  # the optimizer's states, made at the first step
            for n in t.states:
                a.malloc(n)
            states_done = True
        for b in live.values():  # zero_grad(set_to_none=True) and whatever else the step kept
            a.free(b)
    return {"peak_allocated": a.peak_allocated, "peak_reserved": a.peak_reserved, "retries": a.retries}


def needed_capacity(traces: list[Trace], *, expandable: bool, resolution: int = 64 * MiB) -> int:
    """The least device memory the run completes in, the allocator freeing its cached segments when it runs out
    (bisection between the peak allocated and the peak reserved of an unbounded card, to ``resolution``)."""
    free_run = replay(traces, expandable=expandable)
    lo, hi = free_run["peak_allocated"], free_run["peak_reserved"]
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        try:
            replay(traces, expandable=expandable, capacity=mid)
            hi = mid
        except MemoryError:
            lo = mid
    return hi


def draw_lengths(kind: str, max_len: int, batch: int, steps: int, seed: int) -> list[int]:
    """Each step's padded length: the longest of ``batch`` rows drawn from the distribution ``kind``:
    ``fixed`` (every row at the maximum), ``uniform`` (between an eighth of it and it), ``skewed`` (lognormal around a
    third of it, as chat and instruction data are, clipped), or ``lognormal:MEAN:SD`` (a dataset's token statistics;
    rows longer than the maximum are dropped, as a trainer that deletes over-long samples does)."""
    rng = random.Random(seed)
    lo = max(1, max_len // 8)
    if kind.startswith("lognormal:"):
        mean, sd = (float(x) for x in kind.split(":")[1:3])
        sigma = math.sqrt(math.log(1 + (sd / mean) ** 2))
        mu = math.log(mean) - sigma**2 / 2

    def row() -> int:
        if kind == "fixed":
            return max_len
        if kind == "uniform":
            return rng.randint(lo, max_len)
        if kind == "skewed":  # lognormal around a third of the maximum, as chat and instruction data are
            return min(max_len, max(lo, int(rng.lognormvariate(math.log(max_len / 3), 0.6))))
        if kind.startswith("lognormal:"):
            for _ in range(10_000):
                n = int(rng.lognormvariate(mu, sigma))
                if 1 <= n <= max_len:
                    return n
            raise SystemExit(f"--lengths {kind}: almost no row is at most {max_len} tokens")
        raise SystemExit(f"--lengths must be fixed, uniform, skewed or lognormal:MEAN:SD; got {kind!r}")

    return [max(row() for _ in range(batch)) for _ in range(steps)]


def _with_layers(config: dict[str, Any], n: int) -> dict[str, Any]:
    key = "n_layer" if "n_layer" in config else "num_hidden_layers"
    return {**config, key: n, **({"layer_types": config["layer_types"][:n]} if "layer_types" in config else {})}


def saved_per_layer(model: str, batch: int, length: int, *, mode: str = "lora", grad_ckpt: bool = False,
                    precision: str = "bf16", lora_r: int = 16,
                    lora_targets: tuple[str, ...] = ("all-linear",)) -> dict[str, Any]:  # fmt: skip
    """What one more layer adds to the bytes live at the end of the forward (what its backward reads), traced at one
    and two layers, beside the same difference in the estimator's ``activations`` and ``weight_copies`` terms."""
    from autotune.estimate import arch_from_config, estimate_memory
    from autotune.spec.probe_request import Candidate, Workload

    config = _config(model)
    kw = {"mode": mode, "lora_r": lora_r, "lora_targets": lora_targets, "grad_ckpt": grad_ckpt, "precision": precision}
    traced = [trace_step(_with_layers(config, n), batch, length, **kw).saved_bytes() for n in (1, 2)]
    wl = Workload("m", seq_len=length, mode=mode, lora_r=lora_r, lora_targets=lora_targets)
    cand = Candidate(micro_batch=batch, grad_ckpt=grad_ckpt, precision=precision, attn="sdpa", optim="adamw_torch_fused")
    # what a layer keeps for its backward: its saved activations and (fp32 weights under autocast) its 16-bit weight copies
    per_layer = ("activations", "weight_copies")
    est = [sum(estimate_memory(arch_from_config(_with_layers(config, n)), wl, cand).phase_terms["backward_start"].get(k, 0)
               for k in per_layer) for n in (1, 2)]  # fmt: skip
    tokens = batch * length
    out = {"model": model, "mode": mode, "micro_batch": batch, "length": length, "grad_ckpt": grad_ckpt,
           "precision": precision, "lora_r": lora_r, "lora_targets": list(lora_targets),
           "traced_bytes_per_token": (traced[1] - traced[0]) / tokens,
           "estimator_bytes_per_token": (est[1] - est[0]) / tokens}  # fmt: skip
    out["traced_gib_per_layer"] = (traced[1] - traced[0]) / GiB
    out["estimator_ratio"] = out["estimator_bytes_per_token"] / out["traced_bytes_per_token"]
    return out


def step_peak(model: str, batch: int, length: int, *, trainer: str = "trl", mode: str = "lora", grad_ckpt: bool = True,
              precision: str = "bf16", lora_r: int = 16, lora_targets: tuple[str, ...] = ("all-linear",)) -> dict[str, Any]:  # fmt: skip
    """The peak of what one step of a one-layer model allocates beyond its weights and optimizer states (activations,
    the loss path, weight copies), traced, beside the estimator's same terms for the path the trace takes: a meta
    run takes TRL's torch-op kernels, as a CPU does (not CUDA's Triton ones), so the estimator is asked for a CPU.
    The estimator's terms are those at the start of the backward, where the loss path peaks; full fine-tuning of a
    short sequence peaks later, when every gradient is live (the trace counts them, the comparison does not)."""
    from autotune.estimate import arch_from_config, estimate_memory
    from autotune.spec.probe_request import Candidate, Workload

    config = _with_layers(_config(model), 1)
    t = trace_step(config, batch, length, mode=mode, lora_r=lora_r, lora_targets=lora_targets, grad_ckpt=grad_ckpt,
                   precision=precision, trainer=trainer)  # fmt: skip
    peak = max(t.live_bytes(), default=0)
    wl = Workload("m", seq_len=length, mode=mode, lora_r=lora_r, lora_targets=lora_targets, trainer=trainer)
    cand = Candidate(micro_batch=batch, grad_ckpt=grad_ckpt, precision=precision, attn="sdpa", optim="adamw_torch_fused")
    terms = estimate_memory(arch_from_config(config), wl, cand, device="cpu").phase_terms["backward_start"]
    est = sum(terms.get(k, 0) for k in ("activations", "logits_loss", "recompute_working_set", "weight_copies"))
    return {"model": model, "trainer": trainer, "mode": mode, "precision": precision, "micro_batch": batch,
            "grad_ckpt": grad_ckpt, "length": length, "traced_mib": peak / MiB, "estimator_mib": est / MiB, "estimator_ratio": est / peak}


def run_case(model: str, mode: str, batch: int, max_len: int, lengths: str, steps: int, seed: int,
             grad_ckpt: bool = True, precision: str = "bf16", lora_r: int = 16, lora_targets: tuple[str, ...] = ("all-linear",),
             needed: bool = True, trainer: str = "hf") -> dict[str, Any]:  # fmt: skip
    """Trace the distinct lengths, replay the steps both ways, and set the estimator's figures beside them."""
    from autotune.estimate import arch_from_config, estimate_memory
    from autotune.spec.probe_request import Candidate, Workload

    config = _config(model)
    seq = draw_lengths(lengths, max_len, batch, steps, seed)
    t0 = time.perf_counter()
    fam = trace_family(config, batch, max_len, mode=mode, lora_r=lora_r, lora_targets=lora_targets, grad_ckpt=grad_ckpt,
                       precision=precision, trainer=trainer)  # fmt: skip
    traced_s = time.perf_counter() - t0
    cache = {n: fam.at(n) for n in set(seq)}  # one interpolated trace per distinct length
    traces = [cache[n] for n in seq]
    default = replay(traces, expandable=False)
    expandable = replay(traces, expandable=True)
    need = needed_capacity(traces, expandable=False) if needed else None
    tight = replay(traces, expandable=False, capacity=need) if need else {"retries": None}
    arch = arch_from_config(config)
    wl = Workload("m", seq_len=max_len, mode=mode, lora_r=lora_r, lora_targets=lora_targets, trainer=trainer)
    br = estimate_memory(arch, wl, Candidate(micro_batch=batch, grad_ckpt=grad_ckpt, precision=precision,
                                             attn="sdpa", optim="adamw_torch_fused"))  # fmt: skip
    out = {"model": model, "mode": mode, "micro_batch": batch, "max_len": max_len, "lengths": lengths,
           "steps": steps, "seed": seed, "distinct_lengths": len(cache), "mean_len": statistics.mean(seq),
           "longest_first_at": seq.index(max(seq)),
           "grad_ckpt": grad_ckpt, "precision": precision, "trainer": trainer, "vocab": arch.vocab,
           "peak_allocated_gib": default["peak_allocated"] / GiB,
           "peak_reserved_gib": default["peak_reserved"] / GiB,
           "peak_reserved_expandable_gib": expandable["peak_reserved"] / GiB,
           "needed_gib": need / GiB if need else None, "retries_at_needed": tight["retries"],
           "dynamic_peak_gib": (default["peak_allocated"] - sum(traces[0].static) - sum(traces[0].states)) / GiB,
           "estimator_allocated_gib": br.allocated / GiB, "estimator_reserved_gib": br.reserved / GiB,
           "trace_s": round(traced_s, 1)}  # fmt: skip
    out["reserved_over_allocated"] = out["peak_reserved_gib"] / out["peak_allocated_gib"]
    out["estimator_allocated_ratio"] = out["estimator_allocated_gib"] / out["peak_allocated_gib"]
    return out


def expandable_table(paths: list[Path]) -> list[dict[str, Any]]:
    """Recorded replays (``--out`` files) read back: per row, the reserve with and without expandable segments
    over the allocated peak, and the estimator's ``reserved`` over the reserve with them (what a GPU probe,
    run with ``expandable_segments:True``, holds). Prints one line a row and the range per mode."""
    rows = []
    for path in paths:
        for r in json.loads(path.read_text())["rows"]:
            if r.get("peak_reserved_expandable_gib") is None:
                continue
            a, res, exp = r["peak_allocated_gib"], r["peak_reserved_gib"], r["peak_reserved_expandable_gib"]
            row = {"file": path.name, "model": r["model"], "mode": r["mode"], "micro_batch": r["micro_batch"],
                   "max_len": r["max_len"], "lengths": r["lengths"], "reserved_over_allocated": res / a,
                   "expandable_over_allocated": exp / a, "estimator_over_expandable": r["estimator_reserved_gib"] / exp}
            rows.append(row)
            print(f"{r['model']:>12s} {r['mode']:4s} mb {r['micro_batch']} max {r['max_len']:5d} {r['lengths']:20.20s}: "
                  f"reserved {row['reserved_over_allocated']:.2f}x allocated, with expandable segments "
                  f"{row['expandable_over_allocated']:.2f}x; estimator reserved / expandable "
                  f"{row['estimator_over_expandable']:.2f}")  # fmt: skip
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        print(f"{mode}: {len(mine)} rows; expandable / allocated "
              f"{min(r['expandable_over_allocated'] for r in mine):.2f}-{max(r['expandable_over_allocated'] for r in mine):.2f}; "
              f"estimator reserved / expandable {min(r['estimator_over_expandable'] for r in mine):.2f}-"
              f"{max(r['estimator_over_expandable'] for r in mine):.2f}")  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-7b", help="a preset name, a folder with config.json, or the file")
    ap.add_argument("--mode", default="lora", choices=("full", "lora"))
    ap.add_argument("--micro-batch", default="1,2,4", help="comma-separated")
    ap.add_argument("--max-len", default="2048,4096", help="comma-separated")
    ap.add_argument("--lengths", default="fixed,uniform,skewed", help="comma-separated: fixed, uniform, skewed")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-grad-ckpt", action="store_true")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-targets", default="all-linear", help="comma-separated module names, or all-linear")
    ap.add_argument("--no-needed", action="store_true", help="skip the search for the least memory the run fits in")
    ap.add_argument("--trainer", default="hf", choices=("hf", "trl"), help="the loss path: transformers' or TRL's")
    ap.add_argument("--step-peak", action="store_true",
                    help="instead of replaying: one step's peak beyond the model states, one layer, traced and estimated")
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--per-layer", action="store_true",
                    help="instead of replaying: the activations one layer saves, traced and estimated")  # fmt: skip
    ap.add_argument("--out", type=Path)
    ap.add_argument("--expandable", nargs="+", type=Path, metavar="RESULTS.json",
                    help="instead of replaying: read recorded replays and set the estimator's reserved beside the "
                         "reserve with expandable segments")
    a = ap.parse_args(argv)
    if a.expandable:
        unreadable = [str(p) for p in a.expandable if not p.is_file()]
        if unreadable:
            ap.error(f"--expandable: no such file {', '.join(unreadable)}")
        expandable_table(a.expandable)
        return 0
    if a.per_layer and a.step_peak:
        ap.error("--per-layer and --step-peak are two different measurements: give one")
    if a.trainer == "trl" and not (a.per_layer or a.step_peak):
        ap.error("--trainer trl replays TRL's torch-op kernels (a CPU's), not the Triton ones a GPU runs in place: "
                 "no GPU's allocator would see them; use --step-peak (which compares the CPU form)")
    try:  # a model that cannot be read, or sizes that are not positive whole numbers, are refused before any tracing
        _config(a.model)
    except (OSError, ValueError) as exc:
        ap.error(f"--model {a.model}: no readable config.json there ({type(exc).__name__}); give a preset name, a "
                 "folder with config.json, or the file")
    for flag, text in (("--micro-batch", a.micro_batch), ("--max-len", a.max_len)):
        if not all(x.strip().isdigit() and int(x) > 0 for x in text.split(",")):
            ap.error(f"{flag} takes comma-separated whole numbers above 0; got {text!r}")
    if min(int(x) for x in a.max_len.split(",")) < 8:
        ap.error("--max-len must be 8 or more (the estimator's shortest sequence)")
    for kind in a.lengths.split(","):  # a bad distribution is refused before any tracing
        try:
            draw_lengths(kind, 1024, 1, 1, 0)
        except SystemExit as exc:
            ap.error(str(exc))
    rows = []
    for b in (int(x) for x in a.micro_batch.split(",")):
        for m in (int(x) for x in a.max_len.split(",")):
            if a.step_peak:
                r = step_peak(a.model, b, m, trainer=a.trainer, mode=a.mode, grad_ckpt=not a.no_grad_ckpt,
                              precision=a.precision, lora_r=a.lora_r, lora_targets=tuple(a.lora_targets.split(",")))  # fmt: skip
                rows.append(r)
                print(f"{a.model} {a.mode} {a.trainer} {a.precision} mb {b} len {m:5d}: step peak {r['traced_mib']:9.1f} "
                      f"MiB traced, estimator {r['estimator_mib']:9.1f} ({r['estimator_ratio']:.3f}x)", flush=True)  # fmt: skip
                continue
            if a.per_layer:
                r = saved_per_layer(a.model, b, m, mode=a.mode, grad_ckpt=not a.no_grad_ckpt, precision=a.precision,
                                    lora_r=a.lora_r, lora_targets=tuple(a.lora_targets.split(",")))  # fmt: skip
                rows.append(r)
                print(f"{a.model} {a.mode} mb {b} len {m:5d}: one layer saves {r['traced_bytes_per_token']:9.0f} B a "
                      f"token ({r['traced_gib_per_layer']:.3f} GiB), estimator {r['estimator_bytes_per_token']:9.0f} "
                      f"({r['estimator_ratio']:.3f}x)", flush=True)  # fmt: skip
                continue
            for kind in a.lengths.split(","):
                r = run_case(a.model, a.mode, b, m, kind, a.steps if kind != "fixed" else 2, a.seed,
                             grad_ckpt=not a.no_grad_ckpt, precision=a.precision, lora_r=a.lora_r,
                             lora_targets=tuple(a.lora_targets.split(",")), needed=not a.no_needed,
                             trainer=a.trainer)  # fmt: skip
                rows.append(r)
                print(f"{a.model} {a.mode} mb {b} max {m:5d} {kind:8s}: allocated {r['peak_allocated_gib']:6.2f} GiB, "
                      f"reserved {r['peak_reserved_gib']:6.2f} ({r['reserved_over_allocated']:.2f}x), expandable "
                      f"{r['peak_reserved_expandable_gib']:6.2f}; fits in {r['needed_gib'] or 0:6.2f} "
                      f"({r['retries_at_needed']} retries); estimator allocated {r['estimator_allocated_gib']:6.2f} "
                      f"({r['estimator_allocated_ratio']:.2f}x), reserved {r['estimator_reserved_gib']:6.2f}  "
                      f"[{r['distinct_lengths']} lengths, traced in {r['trace_s']} s]", flush=True)  # fmt: skip
    if a.out:
        import torch
        import transformers

        doc = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "transformers": transformers.__version__,
               "command": "python benchmarks/allocator_replay.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "rows": rows}  # fmt: skip
        from autotune.store import write_json_atomic

        write_json_atomic(a.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
