"""The ``train.py`` written next to the emitted configs: runs the configuration that was measured.  [pure: text]

It is kept as text (it imports torch and transformers, which this package may not). The script
imports its data assembly from the installed autotune (:mod:`autotune.probe.collate`, the module
the probe itself uses), so it feeds the Trainer the batches the probe timed: the same sequences in
the same seeded order, the same padding or packing collator, the same micro-batch and accumulation.
Tested by running it as a subprocess against the probe (tests/test_train_script.py) and for a few
steps on a tiny model (tests/test_emit.py).
"""

from __future__ import annotations

import json
from typing import Any

from autotune.spec.probe_request import ALLOC_CONF_VARS

__all__ = ["render_train_script", "ALLOC_CONF_BLOCK"]

# train.py's and train_sft.py's first statements after MEASURED: autotune.spec.probe_request.alloc_conf_env's rule
# (a script cannot import autotune before this runs: autotune's imports would bring torch in first)
ALLOC_CONF_BLOCK = f"""\
# The CUDA caching allocator's setting the probes measured with, set before torch is imported: expandable
# segments keep the reserve of a long run with variable-length batches where the probe measured it, instead of
# growing with cached blocks a longer batch cannot reuse. A value of your own in the variable torch reads first
# ({", ".join(ALLOC_CONF_VARS)}, in torch's order) wins; an empty one is set over.
_ALLOC_CONF_VARS = {ALLOC_CONF_VARS!r}
_FIRST = next((v for v in _ALLOC_CONF_VARS if v in os.environ), None)
if MEASURED.get("cuda_alloc_conf") and not (_FIRST and os.environ[_FIRST]):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = MEASURED["cuda_alloc_conf"]
"""

_TEMPLATE = '''\
#!/usr/bin/env python
"""Fine-tune with the configuration autotune measured as the fastest that fits.

Written by autotune next to training_args.json, model_kwargs.json[, lora_config.json].

    python train.py --model MODEL_ID_OR_PATH --dataset data.jsonl [--output-dir out]
    accelerate launch --config_file accelerate_config.yaml train.py --model ... --dataset ...
    python train.py --model MODEL --synthetic --max-steps 20    # the probe's own synthetic data

The dataset is a .jsonl (one JSON object per line) or .parquet file with a "text" column (tokenized
with --tokenizer, or the model's tokenizer) or pre-tokenized "input_ids" rows (no tokenizer needed;
the pad id comes from the model config). Pre-tokenize once for large data.

The batches are assembled by the installed autotune (autotune.probe.collate), the same code the
probe ran: sequences truncated to SEQ_LEN tokens, read in seeded permutations (the longest first
when the probe measured the worst case first), micro-batch x accumulation sequences per optimizer
step, padded per micro-batch or, with packing, packed whole into rows with per-sequence attention.
--log-batches FILE writes what each optimizer step held (real tokens, sequences) and when it
started (time.perf_counter) as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEQ_LEN = __SEQ_LEN__
# Packing was part of the measured configuration: __PACKING_NOTE__
PACKING = __PACKING__
# How the probe built its data (seed, synthetic lengths, dataset, worst case first, precision)
MEASURED = json.loads(__MEASURED__)

__ALLOC_CONF__

def _imports():
    try:
        from autotune.probe import collate
        from autotune.probe.data import load_token_sequences
    except ImportError as exc:
        raise SystemExit(
            f"train.py: needs the autotune package that wrote it ({exc}); pip install autotune "
            "in this environment: it assembles the batches exactly as the probe did"
        ) from None
    return collate, load_token_sequences


def _has_tokenizer_files(path):
    p = Path(path)
    return p.is_dir() and any((p / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json",
                                                          "tokenizer.model", "vocab.json"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model id or local directory (from_pretrained)")
    p.add_argument("--dataset", default=MEASURED.get("dataset"),
                   help=".jsonl/.parquet with 'text' or 'input_ids' (default: the dataset the probe measured)")
    p.add_argument("--split", default=MEASURED.get("split"),
                   help="split of a DatasetDict save_to_disk folder or a cached Hub dataset (default: the probe's)")
    p.add_argument("--synthetic", action="store_true",
                   help="train on the probe's synthetic sequences (its length distribution and seed); needs --max-steps")
    p.add_argument("--tokenizer", default=None, help="tokenizer id or directory for 'text' data (default: --model)")
    p.add_argument("--output-dir", default="out")
    p.add_argument("--config-dir", default=str(HERE), help="where the autotune JSON files are")
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--report-to", default=None, help="override report_to, e.g. tensorboard, wandb, none")
    p.add_argument("--use-cpu", action="store_true", help="train on the CPU (tests, debugging)")
    p.add_argument("--log-batches", default=None, metavar="FILE",
                   help="write each optimizer step's real tokens and sequences (JSON lines)")
    a = p.parse_args(argv)
    if a.synthetic and a.max_steps is None:
        p.error("--synthetic needs --max-steps N (the probe's data is generated for N optimizer steps)")
    if not a.synthetic and not a.dataset:
        p.error("--dataset PATH is required (or --synthetic --max-steps N for the probe's synthetic data)")

    collate, load_token_sequences = _imports()
    from transformers import AutoModelForCausalLM, TrainingArguments

    cfg_dir = Path(a.config_dir)
    targs = json.loads((cfg_dir / "training_args.json").read_text())
    if a.max_steps is not None:
        targs["max_steps"] = a.max_steps
    if a.report_to is not None:
        targs["report_to"] = a.report_to
    if a.use_cpu:
        targs["use_cpu"] = True
        targs.pop("tf32", None)
    args = TrainingArguments(output_dir=a.output_dir, **targs)

    mkw = json.loads((cfg_dir / "model_kwargs.json").read_text())
    model_dtype = mkw.get("dtype", "float32")
    qc = mkw.pop("quantization_config", None)
    if qc is not None:
        from transformers import BitsAndBytesConfig

        qc = {k: v for k, v in qc.items() if k != "quant_method"}
        mkw["quantization_config"] = BitsAndBytesConfig(**qc)
    model = AutoModelForCausalLM.from_pretrained(a.model, **mkw)
    pad_id = collate.pad_token_id_of(model.config)  # as the probe: pad, else eos, else 0
    vocab = int(model.config.vocab_size)

    lora_path = cfg_dir / "lora_config.json"
    if lora_path.exists():
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if qc is not None:
            ckpt = bool(targs.get("activation_checkpointing", targs.get("gradient_checkpointing", False)))
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=ckpt)
        model = get_peft_model(model, LoraConfig(**json.loads(lora_path.read_text())))
        model.print_trainable_parameters()

    seed = int(MEASURED["seed"])
    per_rank_first = args.per_device_train_batch_size * max(1, args.world_size)
    first = per_rank_first if MEASURED.get("worst_case_first") else 0
    tokenizer = None
    if a.synthetic:
        count = a.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        lengths = collate.synthetic_lengths(MEASURED["lengths"], seq_len=a.seq_len, seed=seed, count=count,
                                            worst_first=first)
        source = collate.SyntheticSequences(lengths, vocab, seed)
        sampler = collate.StreamSampler(len(source), seed=seed, shuffle=False)
    else:
        tok_src = a.tokenizer or MEASURED.get("tokenizer")
        if tok_src is None:
            tok_src = a.model if _has_tokenizer_files(a.model) or not Path(a.model).exists() else None
        loaded = load_token_sequences(a.dataset, seq_len=a.seq_len, tokenizer=tok_src, local_files_only=False,
                                      split=a.split)
        if loaded.column == "text":
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tok_src)  # saved with the model
        top = loaded.sequences.max_token()
        if top >= vocab:
            raise SystemExit(f"train.py: {a.dataset} holds token id {top} but the model's vocabulary has {vocab}")
        source = loaded.sequences
        sampler = collate.StreamSampler(len(source), seed=seed, front=collate.longest_first(source.lengths(), first))
    dataset = collate.SequenceDataset(source, sampler)
    collator = collate.make_collator(
        packing=PACKING, seq_len=a.seq_len, pad_token_id=pad_id, attn=mkw.get("attn_implementation", "sdpa"),
        mask_dtype=collate.packing_mask_dtype(MEASURED.get("precision", "fp32"), model_dtype),
    )

    trainer_cls = collate.measured_trainer_class()
    trainer = trainer_cls(model=model, args=args, train_dataset=dataset, data_collator=collator,
                          processing_class=tokenizer)
    trainer.record_losses = bool(a.log_batches)
    trainer.train()
    if a.log_batches:
        trainer.flush_loss()
        log = Path(a.log_batches if args.world_size <= 1 else f"{a.log_batches}.rank{args.process_index}")
        losses = trainer.step_losses + [None] * (len(trainer.step_counts) - len(trainer.step_losses))
        started = list(getattr(trainer, "step_started", []))
        started += [None] * (len(trainer.step_counts) - len(started))
        with log.open("w", encoding="utf-8") as fh:
            for step, ((tokens, seqs, rows, slots), loss, t0) in enumerate(
                    zip(trainer.step_counts, losses, started), 1):
                fh.write(json.dumps({"step": step, "real_tokens": tokens, "sequences": seqs,
                                     "rows": rows, "token_slots": slots, "loss": loss, "started": t0}) + "\\n")
    trainer.save_model(a.output_dir)


if __name__ == "__main__":
    main()
'''


def render_train_script(*, seq_len: int, packing: bool, measured: dict[str, Any] | None = None) -> str:
    """The text of ``train.py`` for a configuration measured at ``seq_len`` with/without packing.

    ``measured``: how the probe built its data -- ``seed``, ``lengths`` (the synthetic length
    spec), ``dataset``, ``split`` and ``tokenizer`` (paths or None), ``worst_case_first``, ``precision`` --
    and ``cuda_alloc_conf``, the PYTORCH_CUDA_ALLOC_CONF it ran with (None: none set).
    """
    note = (
        "each micro-batch's sequences are packed whole into rows (per-sequence attention, no cross-talk)"
        if packing
        else "off; each micro-batch is padded to its longest sequence"
    )
    m = {"seed": 42, "lengths": "fixed", "dataset": None, "split": None, "tokenizer": None, "worst_case_first": True,
         "precision": "fp32", "cuda_alloc_conf": None, **(measured or {})}  # fmt: skip
    return (
        _TEMPLATE.replace("__SEQ_LEN__", str(int(seq_len)))
        .replace("__PACKING__", "True" if packing else "False")
        .replace("__PACKING_NOTE__", note)
        .replace("__MEASURED__", repr(json.dumps(m, sort_keys=True)))
        .replace("__ALLOC_CONF__", ALLOC_CONF_BLOCK)
    )
