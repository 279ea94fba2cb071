"""``--trainer trl``: the probe measures TRL's ``SFTTrainer``, as ``best/train_sft.py`` runs it.  [worker side]

The path is the emitted script's own: this module executes the text of ``train_sft.py``
(:func:`autotune.emit._train_sft_script.render_train_sft_script`) and calls its ``load_data`` and
``build_trainer``, with a ``sft_config.json`` written by :func:`autotune.formats.trl.sft_config` (the
function that writes ``best/sft_config.json``) plus only the run-only keys set to the probe's values
(:func:`autotune.formats.trl.sft_probe_overrides`: steps, schedule, logging). So SFTTrainer prepares
the data itself (chat template, truncation, TRL's packing ``bfd`` and padding-free rows), with its own
collator and sampler. The model is the probe's (random weights from config.json, seeded); LoRA is
applied by SFTTrainer from ``lora_config.json``, as in ``train_sft.py``.

What autotune adds is measurement only: the trainer class is the probe's timing subclass of
``SFTTrainer`` (step clock, data wait, real tokens per step: the 2D attention mask, or the positions
of a padding-free row), and a probe held to a budget reads the longest prepared rows first, so its
peak memory is the worst case (then the rest, shuffled by SFTTrainer's sampler under the Trainer's
seed; a probe without a budget, e.g. ``--verify-loss``'s, reads in SFTTrainer's own order).

Data without ``--dataset`` is synthetic token ids (lengths from ``Workload.lengths``), handed to
SFTTrainer as a pre-tokenized ``input_ids`` dataset (SFTTrainer then skips tokenization); a
tokenizer is still needed, for the pad token.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from autotune.spec.probe_request import Candidate, ProbeRequest, Workload

__all__ = [
    "script_namespace",
    "trl_available",
    "trainer_problems",
    "trl_unsupported_reason",
    "build_sft_trainer",
    "FrontSampler",
]

TOKENIZER_HINT = "pass --tokenizer DIR (e.g. autotune/models/tokenizers/tiny-chat, or your model's tokenizer)"


def trl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("trl") is not None and importlib.util.find_spec("datasets") is not None


def trainer_problems(workload: Workload, candidate: Candidate | None = None) -> list[str]:
    """What makes a request for ``workload.trainer`` unrunnable here, each with its fix (checked before
    any probe; nothing is imported for ``hf``)."""
    if workload.trainer != "trl":
        return []
    problems = []
    if not trl_available():
        problems.append("--trainer trl needs trl and datasets: pip install 'autotune[trl]'")
    from autotune.probe.data import find_tokenizer

    if find_tokenizer(workload) is None:
        problems.append(f"--trainer trl needs a tokenizer (SFTTrainer takes its pad token from it): {TOKENIZER_HINT}")
    if candidate is not None and (candidate.world_size > 1 or candidate.zero_stage > 0):
        problems.append("--trainer trl probes one device (world size 1, ZeRO stage 0) in this version; "
                        "use --trainer hf for a distributed probe")
    return problems


def trl_unsupported_reason(req: ProbeRequest) -> str | None:
    """Why this probe cannot run through TRL here (None: it can)."""
    c = req.candidate
    if not trl_available():
        return "--trainer trl needs trl and datasets: pip install 'autotune[trl]'"
    if c.world_size > 1 or c.zero_stage > 0:
        return ("--trainer trl probes run on one device in this version (world_size 1, zero_stage 0); "
                "use --trainer hf for distributed candidates")
    return None


_NAMESPACE: dict[str, Any] | None = None


def script_namespace() -> dict[str, Any]:
    """The globals of ``train_sft.py``, imported once in this process (not as ``__main__``).

    The text is the one autotune writes to ``best/train_sft.py``: it is written to a private
    temporary folder and imported from there as a module, so the probe runs that file's own
    ``load_data``/``build_trainer``, exactly as the user's ``python best/train_sft.py`` will.
    """
    global _NAMESPACE
    if _NAMESPACE is None:
        import importlib.util
        import shutil
        import tempfile

        from autotune.emit import render_train_sft_script

        folder = Path(tempfile.mkdtemp(prefix="autotune-train-sft-"))
        try:
            path = folder / "train_sft.py"
            path.write_text(render_train_sft_script(), encoding="utf-8")
            spec = importlib.util.spec_from_file_location("autotune_train_sft", path)
            if spec is None or spec.loader is None:  # pragma: no cover - a .py path always has a loader
                raise ImportError(f"cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        _NAMESPACE = vars(module)
    return _NAMESPACE


class FrontSampler:
    """First epoch: ``front`` indices, then ``base``'s order without them; later epochs: ``base``'s."""

    def __init__(self, base: Any, front: list[int]) -> None:
        self.base = base
        self.front = list(front)
        self._epochs = 0

    def __len__(self) -> int:
        return len(self.base)

    def __iter__(self) -> Any:
        first = self._epochs == 0
        self._epochs += 1
        if not first:
            yield from self.base
            return
        yield from self.front
        skip = set(self.front)
        yield from (i for i in self.base if i not in skip)


def _dataset(req: ProbeRequest, *, n_sequences: int, vocab_size: int) -> tuple[Any, dict[str, Any]]:
    """The dataset SFTTrainer gets, and what the probe records about it (column, mean length, packing's fill)."""
    from autotune.probe.data import data_shape

    w = req.workload
    if w.dataset:
        from autotune.probe.data import find_tokenizer, load_token_sequences

        # the mean rendered length (autotune's cached tokenization), which decides the rows of a packed
        # micro-batch here and in best/sft_config.json alike
        loaded = load_token_sequences(w.dataset, seq_len=w.seq_len, tokenizer=find_tokenizer(w), split=w.split,
                                      trust_remote_code=w.trust_remote_code)
        lengths = loaded.sequences.lengths()
        info = {"column": loaded.column, "dataset_sequences": int(len(lengths)),
                **data_shape(lengths, seq_len=w.seq_len)}
        return script_namespace()["load_data"](w.dataset, w.split or "train"), info
    import datasets

    from autotune.probe.collate import SyntheticSequences, synthetic_lengths

    lengths = synthetic_lengths(w.lengths, seq_len=w.seq_len, seed=w.seed, count=n_sequences)
    src = SyntheticSequences(lengths, vocab_size, w.seed)
    ds = datasets.Dataset.from_dict({"input_ids": [src.get(i).tolist() for i in range(len(src))]})
    return ds, {"column": "input_ids", "source": "synthetic", **data_shape(lengths, seq_len=w.seq_len)}


def _tokenizer(req: ProbeRequest) -> Any:
    from autotune.errors import DatasetError
    from autotune.probe.tokenize_cache import find_tokenizer, load_tokenizer

    path = find_tokenizer(req.workload)
    if path is None:
        raise DatasetError(f"--trainer trl needs a tokenizer (SFTTrainer takes its pad token from it): {TOKENIZER_HINT}")
    return load_tokenizer(path, trust_remote_code=req.workload.trust_remote_code)


def build_sft_trainer(
    req: ProbeRequest,
    model: Any,
    *,
    trainer_base: Any,
    out_dir: str,
    device: str,
    callbacks: list[Any],
    num_optimizer_steps: int,
    worst_case_first: bool,
    metrics: dict[str, Any],
    lora: dict[str, Any] | None,
) -> Any:
    """SFTTrainer (``trainer_base``'s timing subclass of it) built by ``train_sft.py``'s ``build_trainer``.

    Records in ``metrics``: ``trainer_config`` (the SFTConfig keys it ran: sft_config.json's, with
    the probe's run-only keys), ``mean_seq_len``, ``dataset_column``, ``trl_rows`` (rows of the
    prepared dataset) and, with packing, ``quality_notes``. ``lora``: the adapter's lora_config.json
    (``autotune.formats.model.lora_config`` with this model's targets; None for full fine-tuning).
    """
    from trl import SFTConfig

    from autotune.formats import packed_sequence_tokens
    from autotune.formats.trl import TRL_PACKING_QUALITY_NOTE, sft_config, sft_probe_overrides

    c = req.candidate
    tok = _tokenizer(req)
    per_step = c.micro_batch * c.grad_accum
    # synthetic sequences: twice what the steps consume unpacked (packing rounds rows up)
    dataset, info = _dataset(req, n_sequences=2 * num_optimizer_steps * per_step, vocab_size=int(model.config.vocab_size))
    fields = {f for f in SFTConfig.__dataclass_fields__}
    metrics["mean_seq_len"] = info.get("mean_seq_len")
    metrics["pack_fill"] = info.get("pack_fill")
    # with packing, the rows that hold the micro-batch's sequences at the fill TRL's packer reaches on this data
    cfg = sft_config(req, fields=fields, device=device, mean_seq_len=packed_sequence_tokens(metrics), probe=True)
    overrides = sft_probe_overrides(req, fields=fields, device=device)
    metrics["dataset_column"] = info.get("column")
    metrics["trainer"] = "trl"
    metrics["trainer_config"] = {**cfg, **overrides}
    config_dir = Path(out_dir) / "sft"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "sft_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    if lora is not None:
        metrics["lora_target_modules"] = lora["target_modules"]
        (config_dir / "lora_config.json").write_text(json.dumps(lora, indent=2) + "\n", encoding="utf-8")

    class TrlProbeTrainer(trainer_base):  # type: ignore[misc, valid-type]
        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            base = super()._get_train_sampler(train_dataset)
            ds = self.train_dataset if train_dataset is None else train_dataset
            if not worst_case_first or base is None or "input_ids" not in getattr(ds, "column_names", ()):
                return base
            lengths = [len(x) for x in ds["input_ids"]]
            k = min(len(lengths), self.args.per_device_train_batch_size)
            front = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))[:k]
            return FrontSampler(base, front)

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the probe never touches the network
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    trainer = script_namespace()["build_trainer"](
        model=model, tokenizer=tok, dataset=dataset, output_dir=str(Path(out_dir) / "out"),
        config_dir=str(config_dir), overrides=overrides, callbacks=callbacks, trainer_class=TrlProbeTrainer,
    )
    rows = trainer.train_dataset
    metrics["trl_rows"] = len(rows) if hasattr(rows, "__len__") else None
    metrics["trl_padding_free"] = bool(getattr(trainer, "padding_free", False))
    if c.packing:
        metrics.setdefault("quality_notes", []).append(TRL_PACKING_QUALITY_NOTE)
    return trainer
