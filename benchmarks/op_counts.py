"""How many operations a training step dispatches, per decoder layer and per LoRA-adapted linear, by family.

    python benchmarks/op_counts.py            # prints the table and checks it against the speed model's (a minute)
    python benchmarks/op_counts.py --write    # writes it to autotune/estimate/op_counts.json, the speed model's table

A small step is not limited by the GPU's arithmetic: the host dispatches every operation (Python, the
dispatcher, autograd, the kernel launch) and the GPU waits for it. The speed model charges ``PER_OP_S`` per
dispatched operation, so it needs the count, which depends on the family's modeling code, not on its size.
This script counts it: for each family the model is built from a small config (hidden 64, 4 heads, 2 kv heads,
vocabulary 256) with 2 and 4 layers, one forward with labels runs under bf16 autocast (as the Trainer runs a
16-bit step: its casts are operations too) and its backward after it, each inside a ``TorchDispatchMode`` that
counts every aten operation that reaches the dispatcher (views included: they cost the host the same dispatch).
The difference between 4 and 2 layers, halved, is the per-layer count; what is left is the embedding, the
final norm, the head and the loss. Full fine-tuning (every weight's gradient) and LoRA (frozen base: no gradient
for the embedding or the head) are counted apart; LoRA on one and on two modules per layer gives the cost of one
adapted linear. An fp32 step (no autocast: none of its casts) is counted apart too.

The same aten operations run on a GPU, with two known differences the count works around or states: attention
dropout is set to 0 (GPT-2's 0.1 would send the CPU's sdpa down its unfused math path, where a GPU's fused
kernels take dropout in one call; eager attention keeps its dropout, as on a GPU), and CPU and CUDA autocast cast slightly different lists of operations. Gemma-2
has no sdpa in transformers 5, so its sdpa entry is its eager count. FlashAttention-2 and flex are counted as
sdpa (one fused call). The counts have not been repeated on a GPU.
"""

from __future__ import annotations

import argparse
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
        if attn == "sdpa":  # a GPU's fused sdpa takes attention dropout in one call; the CPU's falls back to math
            small["attn_pdrop"] = 0.0
    else:
        small = {"hidden_size": 64, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "head_dim": 16, "intermediate_size": 128, "vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1,
                 "eos_token_id": 2}  # fmt: skip
        if family == "gemma3_text":
            small["layer_types"] = ["full_attention"] * layers
    cfg = AutoConfig.for_model(family, **small)
    cfg._attn_implementation = attn
    return cfg


def _counting_mode() -> Any:
    """A TorchDispatchMode counting the aten operations that reach the dispatcher while it is active (torch is
    imported here, not at the module's import)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.n += 1
            return func(*args, **(kwargs or {}))

    return Count()


def count_step(family: str, layers: int, *, attn: str = "sdpa", lora: list[str] | None = None,
               autocast: bool = True) -> tuple[int, int]:  # fmt: skip
    """(forward ops, backward ops) of one training step of a ``layers``-layer ``family`` model (``autocast``: under
    bf16 autocast, as a 16-bit Trainer step runs; otherwise in fp32)."""
    from contextlib import nullcontext

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

    def cast() -> Any:
        return torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()

    with cast():
        model(input_ids=x, labels=x)  # a first step outside the count: lazy initialisation is not per step
    fwd, bwd = _counting_mode(), _counting_mode()
    with cast(), fwd:
        loss = model(input_ids=x, labels=x).loss
    with bwd:
        loss.backward()
    return fwd.n, bwd.n


def family_counts(family: str, attn: str = "sdpa", *, autocast: bool = True) -> dict[str, int]:
    """Per-layer and fixed operation counts of one step, full and LoRA, for ``family``."""
    one, two = FAMILY_TARGETS[family]
    kw = {"attn": attn, "autocast": autocast}
    full2, full4 = count_step(family, 2, **kw), count_step(family, 4, **kw)
    l1_2, l1_4 = count_step(family, 2, lora=one, **kw), count_step(family, 4, lora=one, **kw)
    l2_4 = count_step(family, 4, lora=two, **kw)
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
        "fixed_frozen": sum(l1_2) - 2 * (per_layer_fwd + per_layer_bwd_frozen + module_fwd + module_bwd),
    }


# the table's keys: attention implementation, and " fp32" for a step without autocast
TABLES = {"sdpa": ("sdpa", True), "eager": ("eager", True), "sdpa fp32": ("sdpa", False), "eager fp32": ("eager", False)}


def table() -> dict[str, dict[str, dict[str, int]]]:
    return {key: {f: family_counts(f, attn, autocast=ac) for f in FAMILY_TARGETS} for key, (attn, ac) in TABLES.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the table to autotune/estimate/op_counts.json")
    args = ap.parse_args(argv)
    import torch
    import transformers

    from autotune.estimate.speed import OPS_PER_STEP

    got = table()
    diffs = 0
    for key, fams in got.items():
        for fam, c in fams.items():
            print(f"{key:10s} {fam:12s} " + " ".join(f"{k}={v}" for k, v in c.items()))
            shipped = OPS_PER_STEP.get(key, {}).get(fam)
            if shipped != c:
                diffs += 1
                print(f"           the speed model has {shipped}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{'the speed model matches' if not diffs else f'{diffs} entries differ from the speed model'}")  # fmt: skip
    if args.write:
        doc = {"command": "python benchmarks/op_counts.py --write", "torch": torch.__version__,
               "transformers": transformers.__version__, "fields": list(next(iter(got["sdpa"].values()))),
               "notes": {"gemma2": "no sdpa in transformers 5: its sdpa entries are its eager counts",
                         "gpt2": "sdpa counted with attention dropout 0 (a GPU's fused sdpa takes dropout in one call)",
                         "fixed_frozen": "the rest of a step with the base frozen: the head and the loss, less what the "
                                         "first layer's backward does not run (no input gradient for a frozen embedding)"},
               "counts": got}  # fmt: skip
        from autotune.store import write_json_atomic

        out = write_json_atomic(ROOT / "autotune" / "estimate" / "op_counts.json", doc, indent=1)
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
