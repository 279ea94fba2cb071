"""Data assembly shared by the probe and the emitted ``train.py``: sequences, order, collators.  [worker side]

One implementation, imported by both (``from autotune.probe.collate import ...``), so the script a
user runs feeds the Trainer exactly the batches the probe measured.

* **A dataset item is one sequence, always.** ``micro_batch`` (``per_device_train_batch_size``)
  counts sequences, packed or not, so every optimizer step sees ``micro_batch x grad_accum x
  world_size`` sequences: the effective batch the user asked for.
* **Order.** :class:`StreamSampler` yields a dataset's sequences epoch by epoch: epoch ``e`` is the
  ``e``-th permutation drawn from ``random.Random(seed)`` (:func:`epoch_order`); with
  ``front`` (the probe's worst case first) the longest sequences are moved to the start of epoch 0,
  so the first micro-batch of every rank holds them and the measured peak memory is the worst
  case. Synthetic sequences are generated in order (:func:`synthetic_lengths`).
* **Padding** (:class:`PaddingCollator`): the micro-batch's sequences right-padded to the longest.
* **Packing** (:class:`PackingCollator`): the micro-batch's sequences, whole (never split), packed
  first-fit decreasing into as few rows of at most ``seq_len`` tokens as they need
  (:func:`autotune.spec.lengths.pack_first_fit`); rows are padded to the longest row (not to ``seq_len``).
  ``position_ids`` restart at 0 for each sequence and ``labels`` are -100 on the first token of
  every sequence (no cross-sequence prediction) and on padding. With ``sdpa`` and ``eager`` the
  rows carry an explicit 4D block-causal float mask ``(rows, 1, W, W)`` (0 attended, dtype-min
  elsewhere). With ``flash_attention_2`` and ``flex_attention`` the sequences are flattened into one
  ``(1, T)`` padding-free row with ``position_ids`` only, plus ``use_cache=False``: transformers
  finds the boundaries from ``position_ids`` (FA2 varlen; a document BlockMask for flex) but skips
  that detection when a KV cache exists, which a model with ``config.use_cache=True`` creates even
  in training. (Measured on 5.24 CPU: position_ids alone isolate sequences with use_cache=False and
  leak with use_cache=True; a 4D float tensor mask with flex_attention corrupted the heap on CPU.)
  Packing therefore changes only how the same sequences are laid out: the loss terms are the same
  (the Trainer counts ``labels[..., 1:] != -100``: ``n - 1`` per sequence either way).

Every batch carries ``autotune_real_tokens`` (real, non-padding tokens) and ``autotune_sequences``
(sequences in it), 0-dim int64 tensors; :class:`MeasuredTrainer` (from
:func:`measured_trainer_class`) pops them before the model sees the batch and records them per
optimizer step. Collators and datasets are module-level classes with plain attributes: they pickle
into DataLoader workers.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from autotune.spec.lengths import iter_lengths, pack_first_fit, parse_lengths
from autotune.spec.probe_request import FLATTEN_ATTN

__all__ = [
    "REAL_TOKENS_KEY",
    "SEQUENCES_KEY",
    "IGNORE_INDEX",
    "TokenSequences",
    "SyntheticSequences",
    "SequenceDataset",
    "StreamSampler",
    "PaddingCollator",
    "PackingCollator",
    "BatchCounts",
    "epoch_order",
    "stream_order",
    "longest_first",
    "synthetic_lengths",
    "make_collator",
    "pop_counts",
    "pad_token_id_of",
    "packing_mask_dtype",
    "measured_trainer_class",
]

REAL_TOKENS_KEY = "autotune_real_tokens"
SEQUENCES_KEY = "autotune_sequences"
IGNORE_INDEX = -100


# ---------------------------------------------------------------------------------------------
# Sequence sources (picklable, plain attributes)
# ---------------------------------------------------------------------------------------------


class TokenSequences:
    """Token lists stored flat: sequence ``i`` is ``tokens[offsets[i]:offsets[i+1]]``."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray) -> None:
        self.tokens = tokens
        self.offsets = offsets

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]]) -> TokenSequences:
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=int(offsets[-1]))
        dtype = np.int32 if flat.size == 0 or int(flat.max()) < 2**31 else np.int64
        return cls(flat.astype(dtype), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def length(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def get(self, i: int) -> torch.Tensor:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return torch.from_numpy(self.tokens[a:b].astype(np.int64))

    def max_token(self) -> int:
        return int(self.tokens.max()) if self.tokens.size else -1

    def to_lists(self) -> list[list[int]]:
        return [self.tokens[self.offsets[i] : self.offsets[i + 1]].tolist() for i in range(len(self))]


class SyntheticSequences:
    """Random token ids in ``[0, vocab_size)``, generated on demand, deterministic by (seed, index)."""

    def __init__(self, lengths: Sequence[int], vocab_size: int, seed: int) -> None:
        self.lengths_ = [int(x) for x in lengths]
        self.vocab_size = int(vocab_size)
        self.seed = int(seed)

    def __len__(self) -> int:
        return len(self.lengths_)

    def lengths(self) -> np.ndarray:
        return np.asarray(self.lengths_, dtype=np.int64)

    def length(self, i: int) -> int:
        return self.lengths_[i]

    def get(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + i) % (2**63))
        return torch.randint(0, self.vocab_size, (self.lengths_[i],), generator=g, dtype=torch.int64)


def synthetic_lengths(lengths: str, *, seq_len: int, seed: int, count: int, worst_first: int = 0) -> list[int]:
    """``count`` lengths drawn from the spec ``lengths``; the first ``worst_first`` set to its maximum.

    The draw is a prefix of one stream: a larger ``count`` extends it without changing the start.
    """
    dist = parse_lengths(lengths)
    it = iter_lengths(dist, seq_len, seed)
    out = [next(it) for _ in range(count)]
    if worst_first:
        worst = dist.max_length(seq_len)
        out[: min(worst_first, count)] = [worst] * min(worst_first, count)
    return out


# ---------------------------------------------------------------------------------------------
# Order: which sequence the Trainer reads when
# ---------------------------------------------------------------------------------------------


def longest_first(lengths: Sequence[int] | np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` longest sequences, longest first (ties: lower index first)."""
    lens = [int(x) for x in lengths]
    return sorted(range(len(lens)), key=lambda j: (-lens[j], j))[: max(0, k)]


def epoch_order(n: int, *, seed: int, epoch: int, front: Sequence[int] = ()) -> list[int]:
    """Epoch ``epoch``'s order of ``n`` sequences: the ``epoch``-th permutation of ``random.Random(seed)``.

    In epoch 0 the indices in ``front`` are moved, in that order, to the start (each sequence still
    appears once per epoch).
    """
    rng = random.Random(seed)
    perm: list[int] = []
    for _ in range(epoch + 1):
        perm = list(range(n))
        rng.shuffle(perm)
    if epoch == 0 and front:
        first = [j for j in dict.fromkeys(int(x) for x in front) if 0 <= j < n]
        chosen = set(first)
        perm = first + [j for j in perm if j not in chosen]
    return perm


def stream_order(n: int, *, seed: int, count: int, front: Sequence[int] = (), shuffle: bool = True) -> list[int]:
    """The first ``count`` indices :class:`StreamSampler` yields over successive epochs."""
    out: list[int] = []
    epoch = 0
    while len(out) < count and n > 0:
        out += epoch_order(n, seed=seed, epoch=epoch, front=front) if shuffle else list(range(n))
        epoch += 1
    return out[:count]


class StreamSampler(Sampler[int]):
    """Yields :func:`epoch_order` (``shuffle``) or ``range(n)``, one epoch per ``__iter__``.

    The Trainer calls ``set_epoch`` before each epoch where it can reach the sampler; where it
    cannot (a wrapped batch sampler), each ``__iter__`` moves on to the next epoch.
    """

    def __init__(self, n: int, *, seed: int, front: Sequence[int] = (), shuffle: bool = True) -> None:
        self.n = int(n)
        self.seed = int(seed)
        self.front = [int(x) for x in front]
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        if not self.shuffle:
            return iter(range(self.n))
        return iter(epoch_order(self.n, seed=self.seed, epoch=epoch, front=self.front))


class SequenceDataset(Dataset):  # type: ignore[type-arg]
    """One sequence per item (``{"input_ids": LongTensor(n)}``), read in the order of ``sampler``."""

    def __init__(self, source: TokenSequences | SyntheticSequences, sampler: StreamSampler) -> None:
        self.source = source
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.source.get(int(idx))}

    def order(self, count: int) -> list[int]:
        """The first ``count`` sequence indices the Trainer reads (across epochs)."""
        s = self.sampler
        return stream_order(s.n, seed=s.seed, count=count, front=s.front, shuffle=s.shuffle)


# ---------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Collators
# ---------------------------------------------------------------------------------------------


def _as_long(x: Any) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.int64).reshape(-1)


def _counts(real: int, sequences: int) -> dict[str, torch.Tensor]:
    return {
        REAL_TOKENS_KEY: torch.tensor(real, dtype=torch.int64),
        SEQUENCES_KEY: torch.tensor(sequences, dtype=torch.int64),
    }


class PaddingCollator:
    """Right-pads the micro-batch's sequences to the longest (rounded up to ``pad_to_multiple_of``).

    Returns ``input_ids``, ``attention_mask`` (2D), ``labels`` (input ids, -100 on padding) and the
    two counts.
    """

    def __init__(self, pad_token_id: int | None = 0, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = 0 if pad_token_id is None else int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        seqs = [_as_long(f["input_ids"]) for f in features]
        width = max(len(s) for s in seqs)
        m = self.pad_to_multiple_of
        if m:
            width = -(-width // m) * m
        b = len(seqs)
        input_ids = torch.full((b, width), self.pad_token_id, dtype=torch.int64)
        attention_mask = torch.zeros((b, width), dtype=torch.int64)
        labels = torch.full((b, width), IGNORE_INDEX, dtype=torch.int64)
        for i, s in enumerate(seqs):
            n = len(s)
            input_ids[i, :n] = s
            attention_mask[i, :n] = 1
            labels[i, :n] = s
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            **_counts(sum(len(s) for s in seqs), b),
        }


class PackingCollator:
    """Packs the micro-batch's sequences into rows (see the module doc).

    ``attn`` in ``FLATTEN_ATTN``: one ``(1, T)`` padding-free row with ``position_ids`` and
    ``use_cache=False``. Other attention implementations: rows from :func:`pack_first_fit`,
    right-padded to the longest row, with a 4D block-causal ``attention_mask`` ``(rows, 1, W, W)`` in
    ``mask_dtype`` (0 where attended, ``finfo(mask_dtype).min`` elsewhere; a padding token attends
    only to itself, so no row of the mask is fully masked). A feature may already hold several
    sequences (``position_ids`` restarting at 0); it is then kept as one unit.
    """

    def __init__(
        self,
        *,
        seq_len: int,
        pad_token_id: int | None = 0,
        attn: str = "sdpa",
        mask_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.seq_len = int(seq_len)
        self.pad_token_id = 0 if pad_token_id is None else int(pad_token_id)
        self.attn = attn
        self.mask_dtype = mask_dtype

    @property
    def flatten(self) -> bool:
        return self.attn in FLATTEN_ATTN

    @staticmethod
    def _unit(f: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = _as_long(f["input_ids"])
        if "position_ids" in f and f["position_ids"] is not None:
            pos = _as_long(f["position_ids"])
        else:  # a plain sequence: one segment
            pos = torch.arange(len(ids), dtype=torch.int64)
        if len(pos) != len(ids):
            raise ValueError(f"position_ids ({len(pos)}) and input_ids ({len(ids)}) differ in length")
        return ids, pos

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        units = [self._unit(f) for f in features]
        real = sum(len(ids) for ids, _ in units)
        sequences = sum(max(1, int((pos == 0).sum())) for _, pos in units)
        if self.flatten:
            ids = torch.cat([u[0] for u in units]).unsqueeze(0)
            pos = torch.cat([u[1] for u in units]).unsqueeze(0)
            labels = ids.clone()
            labels[pos == 0] = IGNORE_INDEX
            return {
                "input_ids": ids,
                "position_ids": pos,
                "labels": labels,
                "use_cache": False,
                **_counts(real, sequences),
            }
        layout = pack_first_fit([len(ids) for ids, _ in units], seq_len=max(self.seq_len, *(len(u[0]) for u in units)))
        rows = [
            (torch.cat([units[j][0] for j in members]), torch.cat([units[j][1] for j in members]))
            for members in layout
        ]
        width = max(len(ids) for ids, _ in rows)
        b = len(rows)
        input_ids = torch.full((b, width), self.pad_token_id, dtype=torch.int64)
        labels = torch.full((b, width), IGNORE_INDEX, dtype=torch.int64)
        position_ids = torch.zeros((b, width), dtype=torch.int64)
        minv = torch.finfo(self.mask_dtype).min
        mask = torch.full((b, 1, width, width), minv, dtype=self.mask_dtype)
        causal = torch.full((width, width), minv, dtype=self.mask_dtype).triu_(1)  # 0 on/below diagonal
        for i, (ids, pos) in enumerate(rows):
            n = len(ids)
            input_ids[i, :n] = ids
            position_ids[i, :n] = pos
            position_ids[i, n:] = torch.arange(width - n, dtype=torch.int64)
            lab = ids.clone()
            lab[pos == 0] = IGNORE_INDEX
            labels[i, :n] = lab
            starts = (pos == 0).nonzero().reshape(-1).tolist()
            if not starts or starts[0] != 0:
                starts = [0, *starts]
            for s, e in zip(starts, [*starts[1:], n], strict=True):
                mask[i, 0, s:e, s:e] = causal[: e - s, : e - s]  # a causal block per sequence
            tail = torch.arange(n, width)
            mask[i, 0, tail, tail] = 0  # a padding token attends to itself only
        return {
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": position_ids,
            "labels": labels,
            **_counts(real, sequences),
        }


def make_collator(
    *, packing: bool, seq_len: int, pad_token_id: int | None, attn: str, mask_dtype: torch.dtype = torch.float32
) -> PaddingCollator | PackingCollator:
    """The collator the probe uses for a candidate (and ``train.py`` for the emitted configuration)."""
    if packing:
        return PackingCollator(seq_len=seq_len, pad_token_id=pad_token_id, attn=attn, mask_dtype=mask_dtype)
    return PaddingCollator(pad_token_id)


def packing_mask_dtype(precision: str, model_dtype: str) -> torch.dtype:
    """dtype of the 4D packing mask: the compute dtype (bf16/fp16 under mixed precision, else the weights')."""
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[model_dtype]


def pad_token_id_of(config: Any) -> int:
    """The model config's ``pad_token_id``, else its (first) ``eos_token_id``, else 0."""
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        pad = getattr(config, "eos_token_id", None)
    if isinstance(pad, (list, tuple)):
        pad = pad[0] if pad else None
    return int(pad or 0)


# ---------------------------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchCounts:
    """What one collated micro-batch held: real tokens, sequences, rows and token slots (padded)."""

    real_tokens: int
    sequences: int
    rows: int
    slots: int


def _int(v: Any) -> int:
    return int(v.sum().item()) if hasattr(v, "sum") else int(v)


def pop_counts(batch: dict[str, Any]) -> BatchCounts:
    """Counts of a collated batch; removes the collator's count keys so the model never sees them.

    Without the keys (a batch from another collator, e.g. TRL's): real tokens from a 2D attention
    mask, else every input position; one sequence per row, except in a padding-free row (no
    attention mask; ``position_ids`` restarting at 0 for each sequence, as TRL's collator writes it),
    which holds as many sequences as its positions hold zeros.
    """
    real = batch.pop(REAL_TOKENS_KEY, None)
    seqs = batch.pop(SEQUENCES_KEY, None)
    ids = batch.get("input_ids")
    rows = int(ids.shape[0]) if ids is not None else 0
    slots = int(ids.numel()) if ids is not None else 0
    if real is not None:
        tokens = _int(real)
    elif ids is not None:
        mask = batch.get("attention_mask")
        tokens = int(mask.sum().item()) if mask is not None and mask.dim() == 2 else slots
    else:
        tokens = 0
    if seqs is None and ids is not None and batch.get("attention_mask") is None:
        pos = batch.get("position_ids")
        if pos is not None and hasattr(pos, "shape") and tuple(pos.shape) == tuple(ids.shape):
            seqs = (pos == 0).sum()
    return BatchCounts(tokens, _int(seqs) if seqs is not None else rows, rows, slots)


# ---------------------------------------------------------------------------------------------
# The Trainer, fed as the probe is fed
# ---------------------------------------------------------------------------------------------


def measured_trainer_class(base: Any = None) -> Any:
    """A ``transformers.Trainer`` subclass (of ``base``, default ``Trainer``) that reads a
    :class:`SequenceDataset` in its sampler's order and pops the collator's counts per optimizer step.

    ``trainer.step_counts`` holds, per optimizer step of this process, ``(real tokens, sequences,
    rows, slots)`` summed over its micro-batches; ``step_started`` the ``time.perf_counter()`` at which
    each step began fetching its data (so step k took ``step_started[k+1] - step_started[k]``); with ``record_losses = True``, ``step_losses`` the
    step's summed micro-batch losses (call ``flush_loss()`` after ``train()`` for the last one).
    """
    if base is None:
        from transformers import Trainer as base

    class MeasuredTrainer(base):  # type: ignore[misc, valid-type]
        step_counts: list[tuple[int, int, int, int]]
        step_losses: list[float]
        record_losses = False  # set True to keep each optimizer step's loss (one host sync per step)
        _loss_acc: Any = None

        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            ds = self.train_dataset if train_dataset is None else train_dataset
            if isinstance(ds, SequenceDataset):
                return ds.sampler
            return super()._get_train_sampler(train_dataset)

        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            self.flush_loss()
            if not hasattr(self, "step_started"):
                self.step_started = []
            self.step_started.append(time.perf_counter())  # an optimizer step starts by fetching its data
            batches, n_items = super().get_batch_samples(epoch_iterator, num_batches, device)
            tokens = seqs = rows = slots = 0
            for b in batches:
                c = pop_counts(b)
                tokens, seqs, rows, slots = tokens + c.real_tokens, seqs + c.sequences, rows + c.rows, slots + c.slots
            if not hasattr(self, "step_counts"):
                self.step_counts = []
            if batches:
                self.step_counts.append((tokens, seqs, rows, slots))
            return batches, n_items

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            loss = super().training_step(model, inputs, num_items_in_batch)
            if self.record_losses:
                d = loss.detach()
                self._loss_acc = d if self._loss_acc is None else self._loss_acc + d
            return loss

        def flush_loss(self) -> None:
            """Close the current optimizer step's loss (called before the next step; once after train)."""
            if not hasattr(self, "step_losses"):
                self.step_losses = []
            if self._loss_acc is not None:
                self.step_losses.append(float(self._loss_acc.float().item()))
                self._loss_acc = None

    return MeasuredTrainer
