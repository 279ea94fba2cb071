"""How many operations a training step dispatches, per decoder layer and per LoRA-adapted linear, by family.

    python benchmarks/op_counts.py                 # prints the table and checks it against the speed model's
    python benchmarks/op_counts.py --json OUT      # and writes it

A small step is not limited by the GPU's arithmetic: the host dispatches every operation (Python, the
dispatcher, autograd, the kernel launch) and the GPU waits for it. The speed model charges ``PER_OP_S`` per
dispatched operation, so it needs the count, which depends on the family's modeling code, not on its size.
This script counts it: for each family the model is built from a small config (hidden 64, 4 heads, 2 kv heads,
vocabulary 256) with 2 and 4 layers, one forward with labels runs under bf16 autocast (as the Trainer runs a
16-bit step: its casts are operations too) and its backward after it, each inside a ``TorchDispatchMode`` that
counts every aten operation that reaches the dispatcher (views included: they cost the host the same dispatch).
The difference between 4 and 2 layers, halved, is the per-layer count; what is left is the embedding, the
final norm, the head and the loss. Full fine-tuning (every weight's gradient) and LoRA (frozen base) are
counted apart; LoRA on one and on two modules per layer gives the cost of one adapted linear. Counts are the same
on a GPU (the same aten operations run; FlashAttention-2 is counted as sdpa, one fused call either way).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB = 256
# (family, its two LoRA target sets of one and two linears per layer)
FAMILY_TARGETS = {
    "llama": (["q_proj"], ["q_proj", "v_proj"]),
    "mistral": (["q_proj"], ["q_proj", "v_proj"]),
    "qwen2": (["q_proj"], ["q_proj", "v_proj"]),
    "qwen3": (["q_proj"], ["q_proj", "v_proj"]),
    "gemma": (["q_proj"], ["q_proj", "v_proj"]),
    "gemma2": (["q_proj"], ["q_proj", "v_proj"]),
    "gemma3_text": (["q_proj"], ["q_proj", "v_proj"]),
    "phi3": (["qkv_proj"], ["qkv_proj", "o_proj"]),
    "granite": (["q_proj"], ["q_proj", "v_proj"]),
    "olmo2": (["q_proj"], ["q_proj", "v_proj"]),
    "gpt2": (["c_attn"], ["c_attn", "c_fc"]),
}


def small_config(family: str, layers: int, attn: str) -> Any:
    from transformers import AutoConfig

    if family == "gpt2":
        small = {"n_embd": 64, "n_layer": layers, "n_head": 4, "n_inner": 128, "vocab_size": VOCAB,
                 "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
    else:
        small = {"hidden_size": 64, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "head_dim": 16, "intermediate_size": 128, "vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1,
                 "eos_token_id": 2}  # fmt: skip
        if family == "gemma3_text":
            small["layer_types"] = ["full_attention"] * layers
    cfg = AutoConfig.for_model(family, **small)
    cfg._attn_implementation = attn
    return cfg


class _Count:
    """A TorchDispatchMode counting the aten operations it sees (built lazily: torch is imported in main)."""

    def __new__(cls) -> Any:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Count(TorchDispatchMode):
            def __init__(self) -> None:
                super().__init__()
                self.ops: collections.Counter[str] = collections.Counter()

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                self.ops[func.overloadpacket.__name__] += 1
                return func(*args, **(kwargs or {}))

        return Count()


def count_step(family: str, layers: int, *, attn: str = "sdpa", lora: list[str] | None = None) -> tuple[int, int]:
    """(forward ops, backward ops) of one training step of a ``layers``-layer ``family`` model."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(small_config(family, layers, attn))
    except ValueError:  # a family without sdpa (Gemma-2's soft-capping) runs eager attention
        model = AutoModelForCausalLM.from_config(small_config(family, layers, "eager"))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=lora, lora_dropout=0.0))
    model.train()
    x = torch.randint(3, VOCAB, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=x, labels=x)  # a first step outside the count: lazy initialisation is not per step
    fwd, bwd = _Count(), _Count()
    with torch.autocast("cpu", dtype=torch.bfloat16), fwd:
        loss = model(input_ids=x, labels=x).loss
    with bwd:
        loss.backward()
    return sum(fwd.ops.values()), sum(bwd.ops.values())


def family_counts(family: str, attn: str = "sdpa") -> dict[str, int]:
    """Per-layer and fixed operation counts of one step, full and LoRA, for ``family``."""
    one, two = FAMILY_TARGETS[family]
    full2, full4 = count_step(family, 2, attn=attn), count_step(family, 4, attn=attn)
    l1_2, l1_4 = count_step(family, 2, attn=attn, lora=one), count_step(family, 4, attn=attn, lora=one)
    l2_4 = count_step(family, 4, attn=attn, lora=two)
    per_layer_fwd = (full4[0] - full2[0]) // 2
    per_layer_bwd_full = (full4[1] - full2[1]) // 2
    module_fwd = (l2_4[0] - l1_4[0]) // 4  # one more adapted linear in each of 4 layers
    module_bwd = (l2_4[1] - l1_4[1]) // 4
    per_layer_bwd_frozen = (l1_4[1] - l1_2[1]) // 2 - module_bwd  # LoRA's backward less its one module
    return {
        "layer_forward": per_layer_fwd,
        "layer_backward_full": per_layer_bwd_full,
        "layer_backward_frozen": per_layer_bwd_frozen,
        "lora_module_forward": module_fwd,
        "lora_module_backward": module_bwd,
        "fixed": full2[0] - 2 * per_layer_fwd + full2[1] - 2 * per_layer_bwd_full,
    }


def table(attns: tuple[str, ...] = ("sdpa", "eager")) -> dict[str, dict[str, dict[str, int]]]:
    return {attn: {f: family_counts(f, attn) for f in FAMILY_TARGETS} for attn in attns}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the table here")
    args = ap.parse_args(argv)
    import torch
    import transformers

    from autotune.estimate.speed import OPS_PER_STEP

    got = table()
    diffs = 0
    for attn, fams in got.items():
        for fam, c in fams.items():
            print(f"{attn:6s} {fam:12s} " + " ".join(f"{k}={v}" for k, v in c.items()))
            shipped = OPS_PER_STEP.get(attn, {}).get(fam)
            if shipped != c:
                diffs += 1
                print(f"       the speed model has {shipped}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{'the speed model matches' if not diffs else f'{diffs} families differ from the speed model'}")  # fmt: skip
    if args.json:
        doc = {"torch": torch.__version__, "transformers": transformers.__version__, "counts": got}
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
