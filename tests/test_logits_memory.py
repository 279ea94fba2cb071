"""The estimator's logits/loss term against what the loss path allocates, by PyTorch's own allocator events
on the CPU (the same aten operations run on a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]



@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_the_logits_term_covers_what_the_loss_path_allocates(family: str) -> None:
    """The logits/loss term against the allocator's own events for one forward + loss + backward in bf16 under
    autocast (benchmarks/logits_memory.py): at least what transformers allocates per logit, at most 2 B over
    (LOGITS_16BIT_BYTES, kept for stacks that hold the 16-bit logits into backward)."""
    import importlib.util

    from autotune.estimate import arch_from_config
    from autotune.estimate.memory import logits_bytes

    spec = importlib.util.spec_from_file_location("logits_memory", ROOT / "benchmarks" / "logits_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tokens, small, large = 256, 8000, 32000
    grown = (bench.peak_step_bytes(large, tokens, "bf16", family=family)
             - bench.peak_step_bytes(small, tokens, "bf16", family=family))
    measured = (grown - bench.vocab_growth_bytes(small, large, "bf16")) / (tokens * (large - small))
    arch = arch_from_config(bench._model(1000, family).config.to_dict())
    assumed = logits_bytes(arch, 1, False, 2) / arch.vocab
    assert measured <= assumed <= measured + 2, (family, measured, assumed)
