"""What the host spends on a training step besides the model's arithmetic, measured on this machine's CPU.

    python benchmarks/host_overhead.py --out benchmarks/results/host_overhead-cpu.json

Two figures the speed model takes as measured rather than fitted:

1. **Seconds per dispatched operation.** A model so small that its kernels do almost nothing (hidden 64, 8 layers,
   8 tokens) runs forward and backward under bf16 autocast, one thread; the step's time divided by the
   operations it dispatches (``benchmarks/op_counts.py``'s count) is what the host pays per operation: Python,
   the dispatcher, autograd, and this CPU's own tiny kernels. On a GPU the host pays that and the kernel launch
   (a few microseconds more) and does not run the kernel itself; the speed model's ``PER_OP_S`` is fitted on
   published GPU runs and this figure is the check that it is of the right size.
2. **The Trainer's own time** (``MICROBATCH_OVERHEAD_S``, ``TRAINER_STEP_S``): the same model and optimizer
   (AdamW, clipping at 1.0) stepped by ``transformers.Trainer`` and by a plain loop over the same micro-batches;
   the difference, at accumulation 1 and 8, splits into a cost per micro-batch (the collator, moving the batch,
   the loss's scaling and the NaN check) and a cost per optimizer step (the scheduler, callbacks, zero_grad,
   fetching the accumulation window's batches). The Trainer's step is timed from one step's start to the next
   (so the next window's batch fetching is inside it); each side gets a fresh model; the loop's AdamW has the
   Trainer's weight decay (0). What a CPU cannot show: on a GPU the Trainer's NaN check on the loss
   synchronises the device every micro-batch, and the batch's copy to the device is a transfer of its own, so
   the GPU figures are these and more.

Timings on a shared 2-core machine are noisy: every figure is the median over steps with the spread over
``--repeats`` runs; run it alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SEQ = 8
LAYERS = 8


def _model(family: str, lora: list[str] | None) -> Any:
    import op_counts
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(op_counts.small_config(family, LAYERS, "sdpa"))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=lora, lora_dropout=0.0))
    return model


def per_op_seconds(family: str, lora: list[str] | None, steps: int = 40) -> dict[str, float]:
    """Median seconds of one forward+backward of the tiny model, its dispatched operations, seconds per operation."""
    import op_counts
    import torch

    model = _model(family, lora)
    fwd, bwd = op_counts.count_step(family, LAYERS, lora=lora)
    x = torch.randint(3, op_counts.VOCAB, (1, SEQ))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        times.append(time.perf_counter() - t)
    step = statistics.median(times[5:])
    return {"ops": fwd + bwd, "step_s": step, "per_op_s": step / (fwd + bwd)}


def _trainer_step(model: Any, accum: int, steps: int) -> float:
    """Median seconds of an optimizer step run by transformers.Trainer (the first 5 left out)."""
    from datasets import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.t0 = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            now = time.perf_counter()
            if self.t0:
                self.times.append(now - self.t0)  # from one step's start to the next: batch fetching included
            self.t0 = now

    rows = [[5] * SEQ] * (steps * accum + accum)
    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(out, per_device_train_batch_size=1, gradient_accumulation_steps=accum, max_steps=steps,
                                 bf16=True, use_cpu=True, report_to=[], save_strategy="no", logging_steps=10**6,
                                 optim="adamw_torch", max_grad_norm=1.0, disable_tqdm=True)  # fmt: skip
        Trainer(model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": rows, "labels": rows}),
                callbacks=[clock]).train()  # fmt: skip
    return statistics.median(clock.times[5:])


def _loop_step(model: Any, accum: int, steps: int) -> float:
    """Median seconds of the same optimizer step in a plain loop."""
    import torch

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], weight_decay=0.0)
    x = torch.full((1, SEQ), 5)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        for _ in range(accum):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t)
    return statistics.median(times[5:])


def trainer_overhead(steps: int = 60) -> dict[str, float]:
    """The Trainer's time beyond a plain loop, per micro-batch and per optimizer step (from accumulation 1 and 8)."""
    extra = {}
    for accum in (1, 8):
        loop = _loop_step(_model("llama", None), accum, steps)
        trainer = _trainer_step(_model("llama", None), accum, steps)
        extra[accum] = {"trainer_s": trainer, "loop_s": loop, "extra_s": trainer - loop}
    per_mb = (extra[8]["extra_s"] - extra[1]["extra_s"]) / 7
    return {"per_micro_batch_s": per_mb, "per_step_s": extra[1]["extra_s"] - per_mb,
            "accum_1": extra[1], "accum_8": extra[8]}  # fmt: skip


def _spread(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    vals = [r[key] for r in runs]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    import platform

    import torch
    import transformers

    torch.set_num_threads(1)
    cases = {"llama full": ("llama", None), "llama LoRA q,v": ("llama", ["q_proj", "v_proj"]),
             "qwen2 full": ("qwen2", None), "gpt2 full": ("gpt2", None)}  # fmt: skip
    doc: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "cpu": platform.processor() or platform.machine(), "threads": 1, "per_op": {}}  # fmt: skip
    for name, (fam, lora) in cases.items():
        runs = [per_op_seconds(fam, lora) for _ in range(args.repeats)]
        doc["per_op"][name] = {"ops": runs[0]["ops"], "per_op_s": _spread(runs, "per_op_s")}
        s = doc["per_op"][name]["per_op_s"]
        print(f"{name:16s} {runs[0]['ops']:5d} ops a step: {s['median'] * 1e6:.2f} us an operation "
              f"({s['min'] * 1e6:.2f}-{s['max'] * 1e6:.2f} over {args.repeats} runs)")  # fmt: skip
    runs = [trainer_overhead() for _ in range(args.repeats)]
    doc["trainer"] = {"per_micro_batch_s": _spread(runs, "per_micro_batch_s"), "per_step_s": _spread(runs, "per_step_s"),
                      "runs": runs}  # fmt: skip
    for key in ("per_micro_batch_s", "per_step_s"):
        s = doc["trainer"][key]
        print(f"Trainer beyond a plain loop, {key[4:-2].replace('_', ' ')}: {s['median'] * 1e3:.2f} ms "
              f"({s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f})")  # fmt: skip
    if args.out:
        from autotune.store import write_json_atomic

        write_json_atomic(args.out, doc, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
