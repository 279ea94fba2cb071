"""The memory estimator against real CPU probes (issue 5, item 5), plus unit tests of its CPU terms.

The full comparison (26 configurations, 6 architectures) is ``benchmarks/estimator_accuracy.py``,
whose goal is median |error| <= 5% and no under-prediction worse than -10%; its figures are in
``benchmarks/README.md``.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest

from autotune.estimate import arch_from_config, estimate_memory
from autotune.estimate.arch import peft_lora_modules, peft_lora_param_count
from autotune.estimate.memory import (
    ACTIVATION_TERMS,
    CPU_HEAP_FIXED_BYTES,
    CPU_HEAP_RETAINED,
    CPU_HEAP_RETAINED_CKPT,
    CPU_LIBRARY_PAGES_BYTES,
    CPU_RUNTIME_MISC_BYTES,
    CPU_RUNTIME_OVERHEAD_BYTES,
    CPU_TRAINER_IMPORTS_BYTES,
    layer_activation_bytes_per_token,
)
from autotune.formats.model import lora_target_modules
from autotune.spec.probe_request import Candidate, Workload

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "autotune" / "models"
MiB = 2**20


def _cfg(name: str) -> dict:
    for sub in ("tiny", "presets"):
        p = MODELS / sub / name / "config.json"
        if p.is_file():
            return json.loads(p.read_text())
    raise FileNotFoundError(name)


def _bench():
    spec = importlib.util.spec_from_file_location(
        "estimator_accuracy", ROOT / "benchmarks" / "estimator_accuracy.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("estimator_accuracy", mod)
    spec.loader.exec_module(mod)
    return mod


TINY_LLAMA = arch_from_config(_cfg("tiny-llama"))
GPT2 = arch_from_config(_cfg("gpt2"))
PHI3 = arch_from_config(_cfg("phi-3-mini"))


# ---------------------------------------------------------------- fast: the CPU terms


def test_cpu_runtime_overhead_is_the_sum_of_its_parts_and_cpu_only() -> None:
    assert (
        CPU_RUNTIME_OVERHEAD_BYTES
        == CPU_LIBRARY_PAGES_BYTES + CPU_TRAINER_IMPORTS_BYTES + CPU_RUNTIME_MISC_BYTES
    )
    assert 30 * MiB < CPU_RUNTIME_OVERHEAD_BYTES < 64 * MiB  # measured 43-47 MiB over the fit split
    wl, c = Workload("m", seq_len=128), Candidate(precision="fp32")
    cpu = estimate_memory(TINY_LLAMA, wl, c, device="cpu")
    gpu = estimate_memory(TINY_LLAMA, wl, c, device="cuda")
    assert cpu.terms["runtime_overhead"] == CPU_RUNTIME_OVERHEAD_BYTES
    assert sum(cpu.terms.values()) == cpu.total
    assert "runtime_overhead" not in gpu.terms  # the GPU figure has its context and reserve instead


def test_cpu_retained_heap_follows_the_uncheckpointed_activations_and_is_cpu_only() -> None:
    wl = Workload("m", seq_len=256)
    for ckpt in (False, True):
        c = Candidate(precision="fp32", micro_batch=8, grad_ckpt=ckpt)
        cpu = estimate_memory(TINY_LLAMA, wl, c, device="cpu")
        plain = estimate_memory(TINY_LLAMA, wl, Candidate(precision="fp32", micro_batch=8), device="cpu")
        produced = sum(plain.phase_terms["backward_start"].get(k, 0) for k in ACTIVATION_TERMS)
        share = CPU_HEAP_RETAINED + (CPU_HEAP_RETAINED_CKPT if ckpt else 0.0)
        assert cpu.terms["heap_retained"] == pytest.approx(CPU_HEAP_FIXED_BYTES + share * produced, abs=1)
        assert cpu.live == cpu.total - cpu.terms["heap_retained"] and sum(cpu.terms.values()) == cpu.total
        gpu = estimate_memory(TINY_LLAMA, wl, c, device="cuda")
        assert "heap_retained" not in gpu.terms and gpu.live == gpu.total
    # more micro-batch, more retained heap; checkpointing keeps less live but retains a larger share
    small = estimate_memory(TINY_LLAMA, wl, Candidate(precision="fp32", micro_batch=2), device="cpu")
    big = estimate_memory(TINY_LLAMA, wl, Candidate(precision="fp32", micro_batch=16), device="cpu")
    assert big.terms["heap_retained"] > 4 * (small.terms["heap_retained"] - CPU_HEAP_FIXED_BYTES)


def test_cpu_heap_constants_are_the_fit_on_the_landscapes_and_hold_on_the_others() -> None:
    """The shipped constants are benchmarks/cpu_heap_fit.py's fit on F-L, rounded; on M-R, which the fit did not
    use, the estimate is within +-15 % of most recorded peaks where the live tensors alone are of almost none."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import cpu_heap_fit

    paths = [p for p in sorted((ROOT / "benchmarks" / "landscapes").glob("cpu-*.json"))
             if p.stem.split("-cpu-", 1)[1] not in cpu_heap_fit.LIVE_HEAP_LANDSCAPES]
    data = cpu_heap_fit.rows(paths)
    fitted = cpu_heap_fit.fit([r for r in data if r["landscape"] in cpu_heap_fit.DEFAULT_FIT])
    assert fitted["fixed_bytes"] == pytest.approx(CPU_HEAP_FIXED_BYTES, abs=MiB)
    assert fitted["retained"] == pytest.approx(CPU_HEAP_RETAINED, abs=0.01)
    assert fitted["retained_ckpt"] == pytest.approx(CPU_HEAP_RETAINED_CKPT, abs=0.01)
    rest = [r for r in data if r["landscape"] in set("mnopqr")]
    shipped = cpu_heap_fit.score([r["shipped"] / r["measured"] for r in rest])
    live = cpu_heap_fit.score([r["live"] / r["measured"] for r in rest])
    assert shipped["within_15"] >= 0.75 and 0.9 <= shipped["median"] <= 1.1
    assert live["within_15"] <= 0.1


def test_lora_dropout_saves_mask_and_input_per_adapted_linear() -> None:
    a = TINY_LLAMA
    kw = dict(trainable_base=False, adapted=frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}), wb=4, cb=4,
              attn="sdpa")  # fmt: skip
    plain = layer_activation_bytes_per_token(a, 512, device="cpu", **kw)
    dropped = layer_activation_bytes_per_token(a, 512, device="cpu", lora_dropout=0.05, **kw)
    # CPU fp32: q/k/v each save an fp32 noise tensor and their dropped input (instead of one shared
    # input); o_proj saves both on top of the attention output
    assert dropped - plain == 3 * (4 + 4) * a.hidden - 4 * a.hidden + 2 * 4 * a.q_width
    cuda = layer_activation_bytes_per_token(
        a, 512, device="cuda", lora_dropout=0.05, **{**kw, "wb": 2, "cb": 2}
    )
    cuda0 = layer_activation_bytes_per_token(a, 512, device="cuda", **{**kw, "wb": 2, "cb": 2})
    # CUDA under autocast: a bool mask and the 16-bit cast per adapted linear
    assert cuda - cuda0 == 3 * (1 + 2) * a.hidden - 3 * 2 * a.hidden + (1 + 2) * a.q_width - 2 * a.q_width


def test_packing_mask_and_eager_checkpoint_mask() -> None:
    a, s, b = TINY_LLAMA, 512, 8
    packed = estimate_memory(a, Workload("m", seq_len=s), Candidate(micro_batch=b, packing=True, precision="fp32"),
                             device="cpu")  # fmt: skip
    assert packed.terms["attention_mask"] == 4 * b * s * s  # the collator's fp32 (b, 1, s, s) mask
    flat = estimate_memory(a, Workload("m", seq_len=s), Candidate(micro_batch=b, packing=True,
                           attn="flash_attention_2"))  # fmt: skip
    assert "attention_mask" not in flat.terms  # flattened batches carry position ids only
    ckpt = estimate_memory(a, Workload("m", seq_len=s), Candidate(micro_batch=b, attn="eager", grad_ckpt=True,
                           precision="fp32"), device="cpu")  # fmt: skip
    assert ckpt.terms["attention_mask"] == 4 * b * s * s
    sdpa = estimate_memory(a, Workload("m", seq_len=s), Candidate(micro_batch=b, grad_ckpt=True, precision="fp32"),
                           device="cpu")  # fmt: skip
    assert "attention_mask" not in sdpa.terms  # sdpa without padding runs is_causal, no mask
    # with a mask transformers repeats k/v to every head for sdpa
    kw = dict(trainable_base=True, adapted=frozenset(), wb=4, cb=4, attn="sdpa", device="cpu")
    diff = layer_activation_bytes_per_token(a, s, masked=True, **kw) - layer_activation_bytes_per_token(
        a, s, **kw
    )
    assert diff == 4 * 2 * (a.q_width - a.kv_width)


def test_lora_targets_resolve_as_the_probe_resolves_them() -> None:
    default = ("q_proj", "k_proj", "v_proj", "o_proj")
    # GPT-2 has no q_proj...: the probe falls back to all-linear, c_proj of attention and MLP included
    assert peft_lora_modules(GPT2, default) == {n for n, _, _ in GPT2.linears}
    assert lora_target_modules({"c_attn", "c_proj", "c_fc"}, default) == "all-linear"
    # Phi-3 fuses q/k/v: of the default names only o_proj exists there
    assert peft_lora_modules(PHI3, default) == {"o_proj"}
    assert peft_lora_modules(TINY_LLAMA, default) == set(default)
    n = peft_lora_param_count(TINY_LLAMA, 16, default)
    assert (
        estimate_memory(TINY_LLAMA, Workload("m", mode="lora", lora_r=16), Candidate()).trainable_params == n
    )


def test_eager_softmax_gradient_bounds_the_recompute() -> None:
    a, s, b = TINY_LLAMA, 1024, 4
    c = Candidate(micro_batch=b, attn="eager", grad_ckpt=True, precision="fp32")
    m = estimate_memory(a, Workload("m", seq_len=s), c, device="cpu")
    kw = dict(trainable_base=True, adapted=frozenset(), wb=4, cb=4, attn="eager", device="cpu")
    layer = layer_activation_bytes_per_token(a, s, **kw) * s * b
    # one layer's recomputed activations plus the fp32 gradient of its s² probabilities
    assert m.terms["logits_loss"] + m.terms["recompute_working_set"] == pytest.approx(
        layer + 4 * a.heads * s * s * b, abs=4
    )


# ---------------------------------------------------------------- slow: real probes

# full and LoRA, sdpa and eager, checkpointing, three architectures; none of the benchmark's extremes (its
# lowest, gpt2t-s512-b4-lora-ckpt at -5.7 % quiet, went to -18 % once beside another test's probes)
SUBSET = (
    "llama-s512-b4-lora",
    "llama-s1024-b4-ckpt",
    "qwen2t-s1024-b2-eager",
    "gpt2t-s512-b4",
)


@pytest.mark.slow
def test_estimator_matches_cpu_probes_on_a_subset() -> None:
    """Four real CPU probes (3 architectures; full/LoRA, sdpa/eager, checkpointing), two at a time.

    Asserts median |error| <= 10% and no under-prediction worse than -15%: looser than the
    benchmark's goal (median <= 5%, under >= -10% over 26 configurations) because four configurations
    are a small sample and the machine is shared (the whole benchmark: benchmarks/estimator_accuracy.py).
    """
    bench = _bench()
    configs = [c for c in bench.CONFIGS if c.name in SUBSET]
    assert len(configs) == len(SUBSET)
    assert len({c.model for c in configs}) >= 3
    rows = bench.run(configs, "cpu", jobs=2)
    bad = [f"{r['name']}: {r['status']} {r['reason']}" for r in rows if r["status"] != "ok"]
    assert not bad, bad
    errors = {r["name"]: r["error"] for r in rows}
    table = ", ".join(f"{k} {v:+.1%}" for k, v in errors.items())
    assert statistics.median(abs(e) for e in errors.values()) <= 0.10, table
    assert min(errors.values()) >= -0.15, table
