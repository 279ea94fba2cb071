"""The probe's training data: which sequences, from where, in what order.  [worker side]

``build_train_data`` returns the probe's ``TrainData``: a :class:`~autotune.probe.collate.SequenceDataset`
(one sequence per item, read in its sampler's order) and the collator for the candidate (padding,
or packing the micro-batch's sequences into rows). How a batch is assembled lives in
:mod:`autotune.probe.collate`, which the emitted ``train.py`` imports too, so both feed the Trainer
the same batches. ``micro_batch`` counts sequences, packed or not: every optimizer step sees
``micro_batch x grad_accum x world_size`` sequences.

* Synthetic data (no ``--dataset``): ``num_optimizer_steps x micro_batch x grad_accum x world_size``
  sequences whose lengths follow ``Workload.lengths`` (seeded), random token ids, read in order.
* Real datasets (``--dataset``): ``.jsonl`` or ``.parquet`` with a ``text`` column (tokenized with
  ``Workload.tokenizer`` or the model's own tokenizer files) or an ``input_ids`` column, truncated
  to ``seq_len``; read as seeded permutations, epoch by epoch. Token lists are cached by content
  (``.npz``, no pickle) under ``$AUTOTUNE_CACHE/datasets`` or ``~/.cache/autotune/datasets``.
  Reading is :mod:`autotune.probe.readers`, tokenizing and the cache :mod:`autotune.probe.tokenize_cache`.

``worst_case_first``: the first micro-batch of every rank holds the longest sequences (synthetic:
the distribution's maximum length; a dataset: its longest sequences, moved to the front of the
first epoch), so the measured peak memory is the worst case, packed or not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from autotune.errors import DatasetError
from autotune.probe.collate import (
    PackingCollator,
    PaddingCollator,
    SequenceDataset,
    StreamSampler,
    SyntheticSequences,
    TokenSequences,
    longest_first,
    make_collator,
    synthetic_lengths,
)
from autotune.probe.tokenize_cache import (
    LoadedDataset,
    default_cache_dir,
    find_tokenizer,
    load_token_sequences,
)
from autotune.spec.lengths import batch_layout, packing_fill
from autotune.spec.probe_request import Candidate, Workload

# the batch assembly (sequences, collators, counts) lives in autotune.probe.collate; reading a dataset in
# autotune.probe.readers, tokenizing and caching it in autotune.probe.tokenize_cache (load_token_sequences
# stays importable from here: emitted train.py scripts import it from autotune.probe.data)
__all__ = [
    "LoadedDataset",
    "TrainData",
    "build_train_data",
    "data_shape",
    "default_cache_dir",
    "find_tokenizer",
    "load_token_sequences",
]


# ---------------------------------------------------------------------------------------------
# Building the probe's data
# ---------------------------------------------------------------------------------------------


@dataclass
class TrainData:
    """What the probe's Trainer gets: ``train_dataset=dataset``, ``data_collator=collator``.

    The dataset carries its sampler (``dataset.sampler``); the Trainer made by
    :func:`~autotune.probe.collate.measured_trainer_class` reads it in that order.
    ``mode`` is ``padding``, ``packing`` (4D mask) or ``packing_flat`` (FA2/flex, padding-free).
    ``num_items`` sequences are consumed by ``num_optimizer_steps`` steps (``items_per_step`` each);
    ``token_slots_per_step`` is the padded upper bound micro_batch x grad_accum x world_size x
    seq_len; ``real_tokens_total`` the real tokens of the consumed sequences.
    """

    dataset: SequenceDataset
    collator: PaddingCollator | PackingCollator
    mode: str
    num_items: int
    items_per_step: int
    token_slots_per_step: int
    real_tokens_total: int
    info: dict[str, Any] = field(default_factory=dict)


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def build_train_data(
    workload: Workload,
    candidate: Candidate,
    *,
    num_optimizer_steps: int,
    vocab_size: int,
    pad_token_id: int | None,
    world_size: int | None = None,
    mask_dtype: torch.dtype | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    worst_case_first: bool = True,
) -> TrainData:
    """The probe's dataset and collator for this workload and candidate (see the module doc).

    ``world_size``: data-parallel ranks sharing the dataset (default ``candidate.world_size``); every
    rank builds the same dataset and the sampler's batches are shared out among them.
    ``mask_dtype``: dtype of the 4D packing mask (the model's compute dtype; default fp32).
    ``worst_case_first``: the first micro-batch of every rank holds the longest sequences, packed
    or not (the Trainer must read in the sampler's order, which ``measured_trainer_class`` does).
    """
    _positive_int("num_optimizer_steps", num_optimizer_steps)
    _positive_int("vocab_size", vocab_size, 2)
    world_size = candidate.world_size if world_size is None else world_size
    _positive_int("world_size", world_size)
    seq_len = workload.seq_len
    seed = workload.seed
    mb = candidate.micro_batch
    per_step = mb * candidate.grad_accum * world_size
    n_items = num_optimizer_steps * per_step
    first_batch = mb * world_size if worst_case_first else 0
    info: dict[str, Any] = {"seq_len": seq_len, "seed": seed, "num_optimizer_steps": num_optimizer_steps}

    source: TokenSequences | SyntheticSequences
    if workload.dataset:
        source, sampler = _dataset_source(workload, vocab_size, cache_dir, first_batch, info)
    else:
        lengths = synthetic_lengths(
            workload.lengths, seq_len=seq_len, seed=seed, count=n_items, worst_first=first_batch
        )
        info.update(source="synthetic", lengths=workload.lengths, vocab_size=vocab_size)
        source = SyntheticSequences(lengths, vocab_size, seed)
        sampler = StreamSampler(len(source), seed=seed, shuffle=False)
    dataset = SequenceDataset(source, sampler)
    collator = make_collator(
        packing=candidate.packing,
        seq_len=seq_len,
        pad_token_id=pad_token_id,
        attn=candidate.attn,
        mask_dtype=mask_dtype if mask_dtype is not None else torch.float32,
    )
    flat = isinstance(collator, PackingCollator) and collator.flatten
    mode = "padding" if not candidate.packing else "packing_flat" if flat else "packing"

    # what the consumed sequences make, micro-batch by micro-batch (the Trainer reads in this order)
    order = dataset.order(n_items)
    lens = [source.length(j) for j in order]
    real_total = sum(lens)
    rows, slots = _rows_and_slots(lens, mb, mode, seq_len)
    n_batches = max(1, -(-len(lens) // mb))
    info.update(mode=mode, num_sequences=len(order), consumed_mean_seq_len=real_total / max(1, len(order)),
                rows_per_micro_batch=rows / n_batches, padded_slots=slots, fill=real_total / slots if slots else 0.0,
                worst_case_first=bool(worst_case_first))
    # the data's own shape, not the consumed sequences' (the longest first lean long): what a packer makes of it
    whole = source.lengths() if workload.dataset else synthetic_lengths(
        workload.lengths, seq_len=seq_len, seed=seed, count=max(n_items, DATA_SAMPLE))
    info.update(data_shape(whole, seq_len=seq_len))
    return TrainData(
        dataset=dataset,
        collator=collator,
        mode=mode,
        num_items=n_items,
        items_per_step=per_step,
        token_slots_per_step=per_step * seq_len,
        real_tokens_total=real_total,
        info=info,
    )


# sequences drawn from a length distribution to measure its mean and packing's fill (as packing_fill samples)
DATA_SAMPLE = 2048


def data_shape(lengths: Any, *, seq_len: int) -> dict[str, float | None]:
    """What row-counting packers (TRL, Axolotl, LLaMA-Factory) make of a dataset of these sequence ``lengths``
    (already cut to ``seq_len``): ``mean_seq_len``, its mean real length, and ``pack_fill``, the share of a row its
    packer fills (``autotune.spec.lengths.packing_fill``). Both describe the whole data: the probe's consumed
    sequences start with the longest (its worst case first), and a mean over them overstated the rows a packed
    micro-batch takes (lognormal(6, 1) lengths at 4,096 tokens: 854 against the data's 654, 1.7 rows for 1.3)."""
    lens = lengths.tolist() if hasattr(lengths, "tolist") else [int(n) for n in lengths]  # a dataset's: one C pass
    return {"mean_seq_len": sum(lens) / len(lens) if lens else None, "pack_fill": packing_fill(lens, seq_len=seq_len)}


def _dataset_source(
    workload: Workload, vocab_size: int, cache_dir: str | os.PathLike[str] | None, first_batch: int,
    info: dict[str, Any],
) -> tuple[TokenSequences, StreamSampler]:
    """A real dataset's token sequences (checked against the vocabulary) and its seeded sampler, the
    longest ``first_batch`` sequences first; what was read is recorded in ``info``."""
    loaded = load_token_sequences(
        workload.dataset,
        seq_len=workload.seq_len,
        tokenizer=find_tokenizer(workload),
        cache_dir=cache_dir,
        split=workload.split,
        trust_remote_code=workload.trust_remote_code,
    )
    top = loaded.sequences.max_token()
    if top >= vocab_size:
        raise DatasetError(
            f"dataset {workload.dataset!r} holds token id {top} but the model's vocabulary has "
            f"{vocab_size} entries; tokenize it with the model's tokenizer (--tokenizer DIR)"
        )
    info.update(
        source=loaded.path,
        column=loaded.column,
        cache_hit=loaded.cache_hit,
        cache_file=loaded.cache_file,
        dataset_records=loaded.num_records,
        dataset_truncated=loaded.num_truncated,
        dataset_sequences=len(loaded.sequences),
    )
    if workload.lengths != "fixed":
        info["lengths_ignored"] = workload.lengths
    source = loaded.sequences
    return source, StreamSampler(len(source), seed=workload.seed, front=longest_first(source.lengths(), first_batch))


def _rows_and_slots(lens: list[int], mb: int, mode: str, seq_len: int) -> tuple[int, int]:
    """Rows and padded token slots the consumed sequences make, micro-batch by micro-batch."""
    layout = batch_layout(lens, micro_batch=mb, mode=mode, seq_len=seq_len)
    return sum(r for r, _ in layout), sum(r * w for r, w in layout)
