"""benchmarks/allocator_replay.py: the caching-allocator model (pure arithmetic) and the meta-device trace it replays.

The allocator tests pin the rules the replay's findings rest on (rounding, pools, best fit and splitting, merging
inside a segment only, release-and-retry at the device's limit, expandable segments); the trace test checks that
two traces give every length's exactly (what makes a 1,000-step replay cheap) and that a LoRA step keeps its
gradients for the optimizer.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("allocator_replay", ROOT / "benchmarks" / "allocator_replay.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["allocator_replay"] = mod
    spec.loader.exec_module(mod)
    return mod


ar = _bench()


def test_rounding_pools_and_segment_sizes() -> None:
    a = ar.CachingAllocator()
    assert a.round_size(1) == 512 and a.round_size(513) == 1024
    b = a.malloc(100)  # small pool: a 2 MiB segment, split
    assert b.small and b.size == 512 and a.reserved == 2 * MiB and a.allocated == 512
    c = a.malloc(3 * MiB)  # large, under 10 MiB: a 20 MiB segment, split (the rest is over 1 MiB)
    assert not c.small and c.size == 3 * MiB and a.reserved == 22 * MiB
    d = a.malloc(17 * MiB + 1)  # more than the 17 MiB left: its own segment, rounded up to 2 MiB, and not split
    assert a.reserved == 22 * MiB + 18 * MiB and d.seg != c.seg  # (under 1 MiB would be left): the block is all 18
    assert d.size == 18 * MiB and a.allocated == 512 + 3 * MiB + 18 * MiB
    e = a.malloc(16 * MiB)  # best fit: the 17 MiB left in the 20 MiB segment, not a new segment
    assert e.seg == c.seg and a.reserved == 40 * MiB


def test_free_merges_inside_a_segment_only_and_blocks_of_other_segments_stay_apart() -> None:
    a = ar.CachingAllocator()
    x, y = a.malloc(12 * MiB), a.malloc(12 * MiB)  # two segments of 12 MiB
    a.free(x)
    a.free(y)
    assert a.allocated == 0 and a.reserved == 24 * MiB
    big = a.malloc(20 * MiB)  # 24 MiB free in all, but no segment holds 20: a new one
    assert a.reserved == 44 * MiB and big.seg not in (x.seg, y.seg)
    # inside a segment, neighbours merge: 3 x 4 MiB from one 20 MiB segment, freed, serve one 19 MiB request
    b = ar.CachingAllocator()
    parts = [b.malloc(4 * MiB) for _ in range(3)]
    for p in parts:
        b.free(p)
    whole = b.malloc(19 * MiB)
    assert b.reserved == 20 * MiB and whole.seg == parts[0].seg


def test_growing_lengths_fragment_the_default_allocator_but_not_expandable_segments() -> None:
    """A transient that grows a little each step leaves the previous one's segment cached (reserved ~ the sum),
    while expandable segments extend the free tail in place (reserved ~ the largest)."""
    default, expandable = ar.CachingAllocator(), ar.CachingAllocator(expandable=True)
    for al in (default, expandable):
        for step in range(10):
            al.free(al.malloc((100 + 10 * step) * MiB))
    assert default.peak_reserved >= 10 * 100 * MiB
    assert expandable.peak_reserved <= 192 * MiB
    assert default.peak_allocated == expandable.peak_allocated == 190 * MiB


def test_at_its_limit_the_allocator_frees_whole_cached_segments_and_retries() -> None:
    a = ar.CachingAllocator(capacity=300 * MiB)
    for step in range(10):
        a.free(a.malloc((100 + 10 * step) * MiB))
    assert a.retries >= 1 and a.peak_reserved <= 300 * MiB
    b = ar.CachingAllocator(capacity=150 * MiB)
    keep = b.malloc(100 * MiB)
    with pytest.raises(MemoryError):
        b.malloc(60 * MiB)  # nothing cached to give back: out of memory
    assert keep.size == 100 * MiB


def test_length_draws() -> None:
    assert ar.draw_lengths("fixed", 512, 2, 3, 0) == [512, 512, 512]
    u = ar.draw_lengths("uniform", 1024, 1, 200, 0)
    assert min(u) >= 128 and max(u) <= 1024 and len(set(u)) > 50
    d = ar.draw_lengths("lognormal:3234:2547", 2048, 1, 200, 0)  # over-long rows dropped, as ms-swift deletes them
    assert max(d) <= 2048 and min(d) >= 1
    with pytest.raises(SystemExit, match="--lengths must be"):
        ar.draw_lengths("zipf", 512, 1, 1, 0)
    with pytest.raises(SystemExit) as exc:  # the command line: exit 2 before any tracing
        ar.main(["--lengths", "fixed,zipf"])
    assert exc.value.code == 2


def test_two_traces_give_every_length_exactly_and_a_lora_step_keeps_its_gradients() -> None:
    pytest.importorskip("peft")
    cfg = json.loads((ROOT / "autotune" / "models" / "tiny" / "tiny-llama" / "config.json").read_text())
    fam = ar.trace_family(cfg, 2, 256, lora_r=8)
    real = ar.trace_step(cfg, 2, 200, lora_r=8)
    assert fam.at(200).events == real.events
    # LoRA r8 on all linears of 4 layers: 7 modules x 2 matrices x 4 layers, Adam's two fp32 states each
    assert len(real.states) == 2 * 7 * 2 * 4
    assert len(real.kept) >= 7 * 2 * 4  # the adapters' gradients, freed after the optimizer step
    r = ar.replay([fam.at(n) for n in (128, 256, 200)], expandable=False)
    assert r["peak_reserved"] >= r["peak_allocated"] > sum(real.static)


@pytest.mark.parametrize(
    ("model", "mode", "why"),
    [
        ("qwen2.5-0.5b", "lora", "LoRA's dropout on each adapted linear: a bool mask, as CUDA's fused kernel saves"),
        ("llama-3.2-1b", "full", "fp32 weights under autocast: each linear's 16-bit weight copy"),
        ("phi-3-mini", "lora", "a fused qkv_proj with rotary embeddings: its output stays live beside rotated q, k"),
        ("gpt2", "full", "GPT-2's Conv1D (addmm) under autocast"),
        ("gpt2", "lora", "LayerNorm on autocast's fp32 list: a 16-bit residual stream's fp32 copy is saved"),
    ],
)
def test_one_layers_saved_activations_match_the_estimator(model: str, mode: str, why: str) -> None:
    """What one layer keeps for its backward without checkpointing, traced as a GPU runs it (bool dropout masks,
    autocast's casts), is what the estimator's per-layer terms say, within 2 %."""
    pytest.importorskip("peft")
    r = ar.saved_per_layer(model, 1, 256, mode=mode, grad_ckpt=False)
    assert 0.98 <= r["estimator_ratio"] <= 1.02, (why, r)


@pytest.mark.parametrize(
    ("model", "mode", "precision", "length"),
    [("qwen2.5-0.5b", "lora", "bf16", 1024), ("qwen2.5-0.5b", "lora", "fp32", 512),
     ("qwen2.5-0.5b", "full", "bf16", 1024), ("gemma-2-2b", "lora", "bf16", 1024)],  # fmt: skip
)
def test_trls_fused_head_peak_matches_the_estimator(model: str, mode: str, precision: str, length: int) -> None:
    """TRL's SFTTrainer scores tokens through its own fused LM head (tiles of the logits, never the whole): one
    step's peak beyond the model states, traced on the path a CPU takes, is the estimator's within 2 % (Gemma-2:
    its final soft-capping keeps one more temporary per tile element)."""
    pytest.importorskip("trl")
    if mode == "lora":
        pytest.importorskip("peft")
    r = ar.step_peak(model, 1, length, trainer="trl", mode=mode, precision=precision)
    assert 0.98 <= r["estimator_ratio"] <= 1.02, r


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--model", "/nonexistent"], "no readable config.json"), (["--micro-batch", "0"], "whole numbers above 0"),
     (["--max-len", "abc"], "whole numbers above 0"), (["--max-len", "4"], "8 or more"),
     (["--per-layer", "--step-peak"], "give one"), (["--trainer", "trl"], "use --step-peak")],  # fmt: skip
)
def test_bad_input_is_refused_before_any_tracing(args: list[str], says: str, capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit) as exc:
        ar.main(args)
    assert exc.value.code == 2 and says in capsys.readouterr().err
