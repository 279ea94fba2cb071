"""A model whose logits are one allocation the kernel refuses at once: a real out-of-memory on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# a 1M-token vocabulary makes the logits of 4 x 2048 tokens a single 32 GB allocation, which a
# 24 GiB machine refuses at once: a real allocator failure, nothing touched
HUGE_VOCAB_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 1_000_000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

needs_heuristic_overcommit = pytest.mark.skipif(
    Path("/proc/sys/vm/overcommit_memory").read_text().strip() != "0",
    reason="needs the kernel's heuristic overcommit, which refuses an allocation larger than RAM",
)


def write_huge_vocab_model(directory: Path) -> Path:
    (directory / "config.json").write_text(json.dumps(HUGE_VOCAB_CONFIG))
    return directory
