"""The ``train_sft.py`` written next to ``sft_config.json``: TRL's SFTTrainer on the measured config.  [pure: text]

Kept as text (it imports trl, datasets and transformers, which this package may not). It needs only
those libraries (and peft for LoRA), not autotune. ``autotune probe --trainer trl`` executes this
same text (``load_data``/``load_model``/``build_trainer``) to build the trainer it times, so the
measured path is the one the script runs.
"""

from __future__ import annotations

import json
from typing import Any

from autotune.emit._train_script import ALLOC_CONF_BLOCK

__all__ = ["render_train_sft_script"]

_TEMPLATE = '''\
#!/usr/bin/env python
"""Fine-tune with TRL's SFTTrainer and the configuration autotune measured as the fastest that fits.

Written by autotune next to sft_config.json, model_kwargs.json[, lora_config.json].

    python train_sft.py --model MODEL_ID_OR_PATH --dataset DATA [--split train] [--output-dir out]
    accelerate launch --config_file accelerate_config.yaml train_sft.py --model ... --dataset ...

DATA is a directory written by datasets' save_to_disk (a DatasetDict takes --split), a .jsonl/.json
or .parquet file, or a Hub dataset id. Rows hold "messages" (chat, rendered with the tokenizer's chat
template), "prompt"/"completion" pairs, "text", or pre-tokenized "input_ids": TRL's SFTTrainer reads
them all. Needs trl, datasets, transformers (and peft for LoRA); not autotune.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# What autotune measured on (defaults for the command line)
MEASURED = json.loads(__MEASURED__)

__ALLOC_CONF__

def load_data(path, split="train"):
    """A datasets.Dataset from a save_to_disk directory, a .jsonl/.json/.parquet file or a Hub id."""
    from datasets import DatasetDict, load_dataset, load_from_disk

    p = Path(path).expanduser()
    if p.is_dir():
        ds = load_from_disk(str(p))
        if isinstance(ds, DatasetDict):
            if split not in ds:
                raise SystemExit(f"train_sft.py: {path} has splits {sorted(ds)}, not {split!r}: pass --split")
            ds = ds[split]
        return ds
    suffix = p.suffix.lower()
    if p.is_file() and suffix in (".jsonl", ".json"):
        return load_dataset("json", data_files=str(p), split="train")
    if p.is_file() and suffix == ".parquet":
        return load_dataset("parquet", data_files=str(p), split="train")
    return load_dataset(str(path), split=split)


def load_model(name, config_dir=HERE):
    from transformers import AutoModelForCausalLM

    mkw = json.loads((Path(config_dir) / "model_kwargs.json").read_text())
    qc = mkw.pop("quantization_config", None)
    if qc is not None:
        from transformers import BitsAndBytesConfig

        mkw["quantization_config"] = BitsAndBytesConfig(**{k: v for k, v in qc.items() if k != "quant_method"})
    return AutoModelForCausalLM.from_pretrained(name, **mkw)


def build_trainer(*, model, tokenizer, dataset, output_dir, config_dir=HERE, overrides=None, callbacks=None,
                  trainer_class=None):
    """SFTTrainer with sft_config.json (plus ``overrides``) and lora_config.json if present."""
    from trl import SFTConfig, SFTTrainer

    cfg = json.loads((Path(config_dir) / "sft_config.json").read_text())
    cfg.update(overrides or {})
    args = SFTConfig(output_dir=output_dir, **cfg)
    peft_config = None
    lora_path = Path(config_dir) / "lora_config.json"
    if lora_path.exists():
        from peft import LoraConfig

        peft_config = LoraConfig(**json.loads(lora_path.read_text()))
    cls = trainer_class or SFTTrainer
    return cls(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
               peft_config=peft_config, callbacks=callbacks)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=MEASURED.get("model"), help="model id or local directory (from_pretrained)")
    p.add_argument("--dataset", default=MEASURED.get("dataset"), help="save_to_disk dir, .jsonl/.parquet or Hub id")
    p.add_argument("--split", default=MEASURED.get("split") or "train", help="split of a DatasetDict / Hub dataset")
    p.add_argument("--tokenizer", default=MEASURED.get("tokenizer"), help="tokenizer id or directory (default: --model)")
    p.add_argument("--output-dir", default="out")
    p.add_argument("--config-dir", default=str(HERE), help="where sft_config.json and model_kwargs.json are")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--report-to", default=None, help="override report_to, e.g. tensorboard, wandb, none")
    p.add_argument("--use-cpu", action="store_true", help="train on the CPU (tests, debugging)")
    p.add_argument("--log-speed", default=None, metavar="FILE",
                   help="write JSON with the real (non-padding) tokens and seconds of each optimizer step")
    a = p.parse_args(argv)
    if not a.model or not a.dataset:
        p.error("--model and --dataset are required")

    from transformers import AutoTokenizer, TrainerCallback

    overrides = {}
    if a.max_steps is not None:
        overrides["max_steps"] = a.max_steps
    if a.report_to is not None:
        overrides["report_to"] = a.report_to
    if a.use_cpu:
        overrides["use_cpu"] = True
        overrides["tf32"] = None
    if a.log_speed:
        overrides.update(logging_strategy="no", save_strategy="no", disable_tqdm=True)
    tokenizer = AutoTokenizer.from_pretrained(a.tokenizer or a.model)
    model = load_model(a.model, a.config_dir)
    dataset = load_data(a.dataset, a.split)

    # --log-speed: each optimizer step's seconds (end of the previous step to the end of this one, so
    # waiting for data counts, as autotune's probe times it) and real tokens (the attention mask's, or
    # every position of a padding-free row), counted in this process whatever the data-loader workers
    ends, counts = [], []
    trainer_class = None

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

    if a.log_speed:
        from trl import SFTTrainer

        class CountingSFTTrainer(SFTTrainer):
            def training_step(self, model, inputs, *args, **kwargs):
                mask = inputs.get("attention_mask")
                counts.append(int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel()))
                return super().training_step(model, inputs, *args, **kwargs)

        trainer_class = CountingSFTTrainer
    trainer = build_trainer(model=model, tokenizer=tokenizer, dataset=dataset, output_dir=a.output_dir,
                            config_dir=a.config_dir, overrides=overrides,
                            callbacks=[Clock()] if a.log_speed else None, trainer_class=trainer_class)
    trainer.train()
    if a.log_speed:
        accum = trainer.args.gradient_accumulation_steps
        durations = [b - e for e, b in zip(ends, ends[1:])]
        per_step = [sum(counts[i * accum:(i + 1) * accum]) for i in range(len(durations))]
        Path(a.log_speed).write_text(json.dumps({"real_tokens": per_step, "seconds": durations}) + "\\n")
    trainer.save_model(a.output_dir)


if __name__ == "__main__":
    main()
'''


def render_train_sft_script(*, measured: dict[str, Any] | None = None) -> str:
    """The text of ``train_sft.py``. ``measured``: model, dataset, split, tokenizer the probe used, and
    ``cuda_alloc_conf``, the PYTORCH_CUDA_ALLOC_CONF it ran with (None: none set)."""
    m = {"model": None, "dataset": None, "split": None, "tokenizer": None, "cuda_alloc_conf": None, **(measured or {})}
    return (_TEMPLATE.replace("__MEASURED__", repr(json.dumps(m, sort_keys=True)))
            .replace("__ALLOC_CONF__", ALLOC_CONF_BLOCK))
