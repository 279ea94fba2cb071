"""The ``train.py`` written next to the emitted configs: a minimal script that uses them.  [pure: text]

It is kept as text (it imports torch and transformers, which this package may not) and is tested by
running it for two steps on a tiny model (tests/test_emit.py).
"""

from __future__ import annotations

__all__ = ["render_train_script"]

_TEMPLATE = '''\
#!/usr/bin/env python
"""Fine-tune with the configuration autotune measured as the fastest that fits.

Written by autotune next to training_args.json, model_kwargs.json[, lora_config.json].

    python train.py --model MODEL_ID_OR_PATH --dataset data.jsonl [--output-dir out]
    accelerate launch --config_file accelerate_config.yaml train.py --model ... --dataset ...

data.jsonl holds one JSON object per line, either {"text": "..."} or pre-tokenized
{"input_ids": [...]} (pre-tokenize once for large data: tokenizing is then not repeated per epoch).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorWithFlattening,
    Trainer,
    TrainingArguments,
)

HERE = Path(__file__).resolve().parent
SEQ_LEN = __SEQ_LEN__
# Packing was part of the measured configuration: __PACKING_NOTE__
PACKING = __PACKING__


class Rows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def load_rows(path, tokenizer, seq_len):
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if "input_ids" in rec:
                ids = list(rec["input_ids"])[:seq_len]
            elif "text" in rec:
                if tokenizer is None:
                    raise SystemExit(f"{path}:{n}: text rows need a tokenizer (--tokenizer or --model with one)")
                ids = tokenizer(rec["text"], truncation=True, max_length=seq_len)["input_ids"]
            else:
                raise SystemExit(f"{path}:{n}: each row needs 'text' or 'input_ids'")
            if ids:
                rows.append({"input_ids": ids})
    if not rows:
        raise SystemExit(f"{path}: no rows")
    return rows


def pack(rows, seq_len, eos_id):
    """Concatenate the rows (EOS between them) and cut full blocks of seq_len: no padding at all."""
    stream = []
    for r in rows:
        stream.extend(r["input_ids"])
        if eos_id is not None:
            stream.append(eos_id)
    blocks = [stream[i : i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]
    return [{"input_ids": b} for b in blocks] or rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model id or local directory (from_pretrained)")
    p.add_argument("--dataset", required=True, help="JSONL file: {'text': ...} or {'input_ids': [...]} rows")
    p.add_argument("--tokenizer", default=None, help="tokenizer id or directory (default: --model)")
    p.add_argument("--output-dir", default="out")
    p.add_argument("--config-dir", default=str(HERE), help="where the autotune JSON files are")
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--report-to", default=None, help="override report_to, e.g. tensorboard, wandb, none")
    p.add_argument("--use-cpu", action="store_true", help="train on the CPU (tests, debugging)")
    a = p.parse_args(argv)

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
    qc = mkw.pop("quantization_config", None)
    if qc is not None:
        from transformers import BitsAndBytesConfig

        qc = {k: v for k, v in qc.items() if k != "quant_method"}
        mkw["quantization_config"] = BitsAndBytesConfig(**qc)
    model = AutoModelForCausalLM.from_pretrained(a.model, **mkw)

    lora_path = cfg_dir / "lora_config.json"
    if lora_path.exists():
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if qc is not None:
            ckpt = bool(targs.get("activation_checkpointing", targs.get("gradient_checkpointing", False)))
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=ckpt)
        model = get_peft_model(model, LoraConfig(**json.loads(lora_path.read_text())))
        model.print_trainable_parameters()

    tokenizer = None
    try:
        tokenizer = AutoTokenizer.from_pretrained(a.tokenizer or a.model)
    except Exception as exc:  # pre-tokenized data needs none
        print(f"train.py: no tokenizer ({exc}); rows must be pre-tokenized")
    if tokenizer is not None and tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    rows = load_rows(a.dataset, tokenizer, a.seq_len)
    attn = mkw.get("attn_implementation")
    if PACKING and attn == "flash_attention_2":
        # flash-attention isolates the sequences of a flattened batch itself (position_ids restart)
        collator = DataCollatorWithFlattening(return_position_ids=True)
    elif PACKING:
        # sdpa/eager cannot isolate flattened sequences: concatenate into full blocks instead
        rows = pack(rows, a.seq_len, tokenizer.eos_token_id if tokenizer is not None else None)
        collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False) if tokenizer else None
    else:
        collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False) if tokenizer else None
    if collator is None:
        raise SystemExit("train.py: padding needs a tokenizer (--tokenizer)")

    trainer = Trainer(model=model, args=args, train_dataset=Rows(rows), data_collator=collator,
                      processing_class=tokenizer)
    trainer.train()
    trainer.save_model(a.output_dir)


if __name__ == "__main__":
    main()
'''


def render_train_script(*, seq_len: int, packing: bool) -> str:
    """The text of ``train.py`` for a configuration measured at ``seq_len`` with/without packing."""
    note = "rows are packed into full sequences (no padding)" if packing else "off; rows are padded per batch"
    return (
        _TEMPLATE.replace("__SEQ_LEN__", str(int(seq_len)))
        .replace("__PACKING__", "True" if packing else "False")
        .replace("__PACKING_NOTE__", note)
    )
