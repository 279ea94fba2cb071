"""What every format module shares: the request fields, the lever values of a candidate.  [pure]

A format module maps one config format to autotune and back, both directions in one place:

- ``detect(cfg) -> bool``: the file is this format (by its keys)
- ``to_request(cfg) -> dict``: the partial request (``REQUEST_FIELDS``; absent = not in the file)
- ``to_checklist(cfg) -> dict[kind, dict]``: the config in TrainingArguments vocabulary, split by
  kind (training_args, model_kwargs, lora, deepspeed) for the checklist in ``autotune.check``
- ``VOCAB``: TrainingArguments name -> this format's key (or a phrase where it has none)
- ``tuned_keys(candidate, cfg) -> dict``: the format's keys to change for a tuned candidate (only
  those whose value differs from what the file means now, so a write-back touches nothing else)

A training framework's module (``training_args``, ``trl``, ``axolotl``, ``llamafactory``) also holds
``LEVER_KEYS`` (lever -> the keys that carry it) and ``lever_values(candidate, at)``, the one table of
what each lever is written as; the emitted file (``autotune.emit``) and the write-back both take the
lever keys from it, so the file handed out and the file written back train the batch that was measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["REQUEST_FIELDS", "CARRIED_ELSEWHERE", "Measured", "changed", "local_dataset", "packed_batch", "packed_drift_note", "packed_rows",
           "packed_sequence_tokens", "unexpressed_notes"]

# model / mode / seq_len / effective_batch are held from the file; the rest describe its current levers.
REQUEST_FIELDS = (
    "model", "mode", "seq_len", "effective_batch", "micro_batch", "grad_accum", "dataset", "lora_r",
    "lora_alpha", "lora_targets", "precision", "attn", "workers", "packing", "grad_ckpt", "ckpt_every", "zero_stage",
    "offload",
)  # fmt: skip


# levers no training file carries: the launch does (accelerate_config.yaml's processes, deepspeed.json's or
# the FSDP settings' sharding), emitted beside every framework's file
CARRIED_ELSEWHERE = {"world_size": "accelerate_config.yaml (the processes it launches)",
                     "sharding": "accelerate_config.yaml and deepspeed.json (DeepSpeed ZeRO or FSDP)"}


def changed(cfg: Mapping[str, Any], wanted: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``wanted`` that differ from the file's value (or the default, when absent)."""
    out: dict[str, Any] = {}
    for key, value in wanted.items():
        current = cfg[key] if key in cfg else defaults.get(key, _MISSING)
        if current is _MISSING or current != value or type(current) is not type(value):
            out[key] = value
    return out


_MISSING: Any = object()


def local_dataset(path: Any) -> str | None:
    """A dataset reference that names a local jsonl/parquet file (the probe can read it), else None."""
    if isinstance(path, str) and path.endswith((".jsonl", ".json", ".parquet")) and not path.startswith("hf://"):
        return path
    return None


@dataclass(frozen=True)
class Measured:
    """Where a configuration was measured, besides its levers: what some lever keys depend on.

    ``device``: ``cpu`` or ``cuda`` (None: not known, a write-back keeps the file's device keys);
    ``mode``: full, lora or qlora (a write-back's is the file's);
    ``seq_len``: the measured sequence length; ``mean_seq_len``: the probe's mean real sequence length
    (None for an older result); ``fields``: the installed TrainingArguments' (or SFTConfig's) field names."""

    device: str | None = None
    mode: str | None = None
    seq_len: int | None = None
    mean_seq_len: float | None = None
    fields: frozenset[str] | None = None
    probe: bool = False  # a probe's own config: its Trainer runs the probe window's accumulation


def packed_sequence_tokens(metrics: Mapping[str, Any]) -> float | None:
    """The row tokens one sequence takes once a dataset is packed ahead of training: a probe's mean real length
    over the packer's fill of its rows (``pack_fill``, ``autotune.spec.lengths.packing_fill``; full rows for a
    result without it). What :func:`packed_rows` divides by, as ``Measured.mean_seq_len``."""
    mean, fill = metrics.get("mean_seq_len"), metrics.get("pack_fill")
    if not isinstance(mean, (int, float)) or mean <= 0:
        return None
    return float(mean) / float(fill) if isinstance(fill, (int, float)) and 0 < fill <= 1 else float(mean)


def packed_rows(micro_batch: int, at: Measured) -> int:
    """Full rows of ``seq_len`` that hold one measured micro-batch's real tokens (at least 1).

    autotune's micro-batch counts SEQUENCES; Axolotl's ``sample_packing``, LLaMA-Factory's ``packing`` and
    TRL's ``packing`` pack the dataset into rows of the sequence length ahead of training and their batch
    size counts ROWS. ``at.mean_seq_len`` is the row tokens one sequence takes (:func:`packed_sequence_tokens`:
    its mean length over the packer's fill), so the rows hold the micro-batch's sequences, not only its tokens.
    Without a mean length (an older result) the measured micro-batch is taken as full rows (the memory the
    probe's worst case held)."""
    mean, seq_len = at.mean_seq_len, at.seq_len
    if not mean or mean <= 0 or not seq_len:
        return micro_batch
    return max(1, min(micro_batch, round(micro_batch * mean / seq_len)))


def packed_batch(micro_batch: int, grad_accum: int, at: Measured) -> tuple[int, int]:
    """(rows per micro-batch, accumulation) for a packer that counts rows: :func:`packed_rows`, and the
    accumulation whose rows hold the optimizer step's sequences, ``micro_batch x grad_accum`` of them at
    ``at.mean_seq_len`` tokens each. A row count is whole, so rows x ``grad_accum`` alone drifts from the
    step's sequences by the rounding of the rows times the accumulation: a micro-batch of 2 sequences of
    657 row tokens at 4,096 is 0.32 of a row, written 1, and 16 such rows a step held 100 sequences for the
    32 asked; 5 rows hold 31. ``at.probe``: the accumulation stays (the probe's window runs its own)."""
    rows = packed_rows(micro_batch, at)
    mean, seq_len = at.mean_seq_len, at.seq_len
    if at.probe or not mean or mean <= 0 or not seq_len:
        return rows, grad_accum
    return rows, max(1, round(micro_batch * grad_accum * mean / seq_len / rows))


# how far the sequences a packed file's optimizer step holds may drift from the measured ones before its note says so
PACKED_DRIFT_NOTED = 0.10


def packed_drift_note(micro_batch: int, grad_accum: int, at: Measured) -> str | None:
    """A note when the whole rows :func:`packed_batch` writes hold an optimizer step of sequences more than
    ``PACKED_DRIFT_NOTED`` away from the measured ``micro_batch x grad_accum`` (per device): a packer's rows hold
    ``seq_len / at.mean_seq_len`` sequences each, so a step of few short sequences cannot be matched in whole rows
    (8 sequences of 24 row tokens at 128 are 1.5 rows: 1 row holds ~5, 2 rows ~11). None when it holds."""
    mean, seq_len = at.mean_seq_len, at.seq_len
    if at.probe or not mean or mean <= 0 or not seq_len:
        return None
    rows, accum = packed_batch(micro_batch, grad_accum, at)
    held, asked = rows * accum * seq_len / mean, micro_batch * grad_accum
    if abs(held / asked - 1) <= PACKED_DRIFT_NOTED:
        return None
    return (f"effective batch: rows are whole, so {rows} row(s) x {accum} hold ~{held:.0f} sequences an optimizer "
            f"step on each device, not the {asked} measured ({held / asked - 1:+.0%}; mean {mean:.0f} row tokens a "
            f"sequence at {seq_len}); best/train.py holds {asked}")


def unexpressed_notes(candidate: Any, unexpressed: Mapping[str, str], label: str) -> list[str]:
    """A note for each lever the candidate sets away from its default that ``label`` (a framework) has no
    key for (its module's ``UNEXPRESSED``: lever -> what the file does instead): the file then trains
    that lever as the note says, and ``train.py`` trains as measured."""
    from autotune.spec.levers import LEVERS

    out = []
    for lever, instead in unexpressed.items():
        value = getattr(candidate, lever)
        if value != LEVERS[lever].default:
            out.append(f"{lever}: measured at {value} ({LEVERS[lever].help}); {label} has no key for it, so this "
                       f"file {instead}; best/train.py trains as measured")
    return out
