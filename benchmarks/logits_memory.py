"""What the logits and the loss hold at the peak of a training step, per logit (token x vocabulary entry),
measured by PyTorch's own allocator events on the CPU, against the estimator's logits/loss term.

    python benchmarks/logits_memory.py --out benchmarks/results/logits_memory-cpu.json

A one-layer Llama-style model (hidden 64) is built from its config with random weights for each vocabulary
(32k to 256k) and each precision (fp32; bf16 under autocast, as the Trainer runs it); one forward with
labels, the loss transformers computes, and the backward run under ``torch.profiler`` with memory profiling.
The peak of live tensor bytes over the step (``MemoryProfileTimeline``: every allocation and free the
allocator reports, in order) is taken per configuration. At a fixed number of tokens, the peak's growth
with the vocabulary, less the parameters and gradients that grow with it (the embedding and the LM head:
``hidden x vocab``, their gradients and autocast's 16-bit copy of the head), divided by tokens x the added
vocabulary, is the logits/loss working set in bytes per logit. It is what ``estimate_memory``'s
``logits_loss`` term assumes (``LOGITS_BYTES_PER_ELEMENT``, plus ``LOGITS_16BIT_BYTES`` in 16-bit): the
script prints both. The same aten operations run on a GPU; what the CPU cannot show is the CUDA caching
allocator's reserve on top (``ALLOCATOR_RESERVE``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN = 64


FAMILIES = ("llama", "gemma2")


def _model(vocab: int, family: str = "llama") -> Any:
    """One decoder layer of ``family`` with untied embeddings (Gemma-2: its final logit soft-capping at 30)."""
    import transformers

    common = dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=False)
    if family == "gemma2":  # transformers runs Gemma-2 with eager attention only (its attention soft-capping)
        cfg = transformers.Gemma2Config(**common, head_dim=32, final_logit_softcapping=30.0,
                                        attn_implementation="eager")
        return transformers.Gemma2ForCausalLM(cfg)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, attn_implementation="sdpa"))


def peak_step_bytes(vocab: int, tokens: int, precision: str, seed: int = 0, family: str = "llama") -> int:
    """Peak live bytes allocated during one forward + loss + backward (weights excluded: they exist before)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    torch.manual_seed(seed)
    model = _model(vocab, family)
    model.train()
    ids = torch.randint(0, vocab, (1, tokens))
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        with amp:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    timeline = MemoryProfileTimeline(prof._memory_profile())
    _, sizes = timeline._coalesce_timeline("cpu")
    return max(sum(s) for s in sizes)


def vocab_growth_bytes(vocab_from: int, vocab_to: int, precision: str) -> int:
    """Bytes that grow with the vocabulary but not with the tokens: the embedding's and the head's gradients
    (fp32), and under autocast the head's 16-bit weight copy."""
    dv = vocab_to - vocab_from
    grads = 2 * HIDDEN * dv * 4
    cast = HIDDEN * dv * 2 if precision == "bf16" else 0
    return grads + cast


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocabs", default="32000,64000,128256,151936,256000")
    ap.add_argument("--tokens", default="512,1024")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--families", default="llama", help=f"comma-separated: {', '.join(FAMILIES)}")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch
    import transformers

    from autotune.estimate import arch_from_config
    from autotune.estimate.memory import logits_bytes

    torch.set_num_threads(1)
    vocabs = [int(v) for v in args.vocabs.split(",")]
    rows: list[dict[str, Any]] = []
    for family, precision in ((f, p) for f in args.families.split(",") for p in args.precisions.split(",")):
        arch = arch_from_config(_model(1000, family).config.to_dict())
        assumed = logits_bytes(arch, 1, False, 4 if precision == "fp32" else 2) / arch.vocab  # the estimator's
        for tokens in (int(t) for t in args.tokens.split(",")):
            peaks = {v: [peak_step_bytes(v, tokens, precision, seed=r, family=family) for r in range(args.repeats)]
                     for v in vocabs}
            base = vocabs[0]
            for v in vocabs[1:]:
                grown = statistics.median(peaks[v]) - statistics.median(peaks[base])
                per_logit = (grown - vocab_growth_bytes(base, v, precision)) / (tokens * (v - base))
                spread = [max(peaks[v]) - min(peaks[v]), max(peaks[base]) - min(peaks[base])]
                rows.append({"family": family, "precision": precision, "tokens": tokens, "vocab_from": base, "vocab_to": v,
                             "peak_from_bytes": peaks[base], "peak_to_bytes": peaks[v],
                             "bytes_per_logit": round(per_logit, 3), "assumed_bytes_per_logit": assumed,
                             "repeat_spread_bytes": spread})
                print(f"{family:6s} {precision:5s} tokens {tokens:5d} vocab {base:>7,} -> {v:>7,}: {per_logit:6.2f} B per logit "
                      f"(estimator assumes {assumed}); peaks {statistics.median(peaks[base]) / 2**20:,.0f} -> "
                      f"{statistics.median(peaks[v]) / 2**20:,.0f} MiB, repeat spread {max(spread)} B", flush=True)
    if args.out:
        doc = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "transformers": transformers.__version__,
               "hidden": HIDDEN, "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
