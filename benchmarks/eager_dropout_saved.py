"""What GPT-2's eager attention saves for backward, with and without attention dropout.

Counts the bytes of every distinct tensor autograd saves during one GPT2Attention forward
(``torch.autograd.graph.saved_tensors_hooks``), on CPU, in fp32 and under bf16 autocast, and
divides the s²-sized part by a·s·(b·s) to get bytes per score element; compares with the estimator's
``layer_activation_bytes_per_token`` attention-core term. Seconds on a CPU:

    python benchmarks/eager_dropout_saved.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def saved_bytes(p_drop: float, autocast: bool, s: int = 256, b: int = 2, h: int = 64, a: int = 4) -> int:
    import torch
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    cfg = GPT2Config(
        n_embd=h, n_head=a, n_layer=1, n_positions=max(1024, s), attn_pdrop=p_drop, resid_pdrop=0.0
    )
    cfg._attn_implementation = "eager"
    attn = GPT2Attention(cfg, layer_idx=0).train()
    x = torch.randn(b, s, h, requires_grad=True)
    seen: dict[int, int] = {}

    def pack(t):  # noqa: ANN001, ANN202
        key = t.untyped_storage().data_ptr()
        seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t

    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
        out = attn(x)[0]
    out.float().sum().backward()
    return sum(seen.values())


def main() -> int:
    a, s, b = 4, 256, 2
    for autocast in (False, True):
        base = {}
        for p in (0.0, 0.1):
            base[p] = saved_bytes(p, autocast, s=s, b=b, a=a)
        # s² part: the difference between two sequence lengths removes the O(s) tensors
        per = {}
        for p in (0.0, 0.1):
            s1, s2 = 128, 256
            d = saved_bytes(p, autocast, s=s2, b=b, a=a) - 2 * saved_bytes(p, autocast, s=s1, b=b, a=a)
            # the O(s) part doubles exactly; what is left is a·b·(s2² - 2·s1²)·bytes
            per[p] = d / (a * b * (s2 * s2 - 2 * s1 * s1))
        label = "bf16 autocast" if autocast else "fp32"
        print(f"{label}: bytes per score element saved: no dropout {per[0.0]:.2f}, dropout {per[0.1]:.2f} "
              f"(difference {per[0.1] - per[0.0]:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
