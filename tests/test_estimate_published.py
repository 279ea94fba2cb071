"""The estimator against references autotune did not write (issue 14).

* DeepSpeed's own model-state estimators (``estimate_zero2_model_states_mem_needs_all_cold``,
  ``estimate_zero3_model_states_mem_needs_all_cold``), run in place when deepspeed is installed:
  ZeRO-2/3 with and without offload, Llama-3.1-8B, Mistral-7B, Qwen2.5-7B, 1/2/4/8 GPUs, within 15%.
* Published out-of-memory measurements: no plan may say "fits" for a setup that ran out of memory
  there (the cases are ``benchmarks/estimator_vs_published.py``'s ``PUBLISHED_OOM``).
* The published-figures benchmark itself (it must run in CI's time).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import json
import re
import sys
from pathlib import Path

import pytest

from autotune.estimate import arch_from_config, estimate_memory
from autotune.spec.probe_request import Candidate, Workload

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "autotune" / "models" / "presets"
MODELS = ("llama-3.1-8b", "mistral-7b", "qwen2.5-7b")
TOLERANCE = 0.15


def _arch(name: str):  # noqa: ANN202
    return arch_from_config(json.loads((PRESETS / name / "config.json").read_text()))


def _bench():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(
        "estimator_vs_published", ROOT / "benchmarks" / "estimator_vs_published.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("estimator_vs_published", mod)
    spec.loader.exec_module(mod)
    return mod


_ROW = re.compile(r"^\s*([0-9.]+)GB \|\s*([0-9.]+)GB \| (.+)$")


def _deepspeed_table(fn, **kwargs) -> dict[str, tuple[float, float]]:  # noqa: ANN001
    """Run one of DeepSpeed's ``*_all_cold`` estimators (they print a table) and parse it:
    options text -> (host GiB per node, GPU GiB per GPU)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn(**kwargs)
    rows: dict[str, tuple[float, float]] = {}
    for line in buf.getvalue().splitlines():
        m = _ROW.match(line)
        if m:
            # the device prints as "cpu" or "OffloadDeviceEnum.cpu" depending on the Python version
            option = re.sub(r"\s+", "", m.group(3)).replace("OffloadDeviceEnum.", "")
            rows[option] = (float(m.group(1)), float(m.group(2)))
    assert rows, buf.getvalue()
    return rows


def test_deepspeed_estimators_exist_with_the_expected_signatures() -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold as z3
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold as z2

    assert list(inspect.signature(z2).parameters) == [
        "total_params", "num_gpus_per_node", "num_nodes", "additional_buffer_factor",
    ]  # fmt: skip
    assert list(inspect.signature(z3).parameters) == [
        "total_params", "largest_layer_params", "num_gpus_per_node", "num_nodes", "additional_buffer_factor",
    ]  # fmt: skip


@pytest.mark.parametrize("model", MODELS)
def test_largest_module_is_what_deepspeed_would_count(model: str) -> None:
    """DeepSpeed's ``model_to_params`` takes the largest module's own parameters; the estimator's
    ``Arch.largest_param`` must be that figure (checked on a meta-device build)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    conf = json.loads((PRESETS / model / "config.json").read_text())
    hf_cfg = transformers.AutoConfig.for_model(conf.pop("model_type"), **conf)
    with torch.device("meta"):
        m = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    largest = max(sum(p.numel() for p in mod.parameters(recurse=False)) for mod in m.modules())
    assert _arch(model).largest_param == largest


# (ZeRO stage, autotune offload, DeepSpeed's option string)
SETUPS = (
    (2, "none", "offload_optimizer=none"),
    (2, "optimizer", "offload_optimizer=cpu"),
    (3, "none", "offload_param=none,offload_optimizer=none,zero_init=1"),
    (3, "optimizer", "offload_param=none,offload_optimizer=cpu,zero_init=1"),
    (3, "params", "offload_param=cpu,offload_optimizer=cpu,zero_init=1"),
)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_zero_model_states_within_15_percent_of_deepspeed(model: str, gpus: int) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold as z3
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold as z2

    arch = _arch(model)
    tables = {
        2: _deepspeed_table(z2, total_params=arch.params_total, num_gpus_per_node=gpus),
        3: _deepspeed_table(
            z3,
            total_params=arch.params_total,
            largest_layer_params=arch.largest_param,
            num_gpus_per_node=gpus,
        ),
    }
    report = []
    for stage, offload, option in SETUPS:
        ds_host, ds_gpu = tables[stage][option.replace(" ", "")]
        c = Candidate(world_size=gpus, zero_stage=stage, offload=offload, optim="adamw_torch_fused")
        br = estimate_memory(arch, Workload("m", seq_len=2048), c)
        ours = br.model_states / 2**30
        ratio = ours / ds_gpu
        report.append(
            f"ZeRO-{stage} {offload}: DeepSpeed {ds_gpu:.2f} GiB, autotune {ours:.2f} ({ratio:.3f})"
        )
        assert abs(ratio - 1) <= TOLERANCE, "; ".join(report)
        if offload != "none":
            # DeepSpeed prints per-node CPU memory (its 1.5x buffer included) for offload
            host = br.host_bytes / 2**30
            assert abs(host / ds_host - 1) <= TOLERANCE, (option, host, ds_host)
        else:
            assert br.host_bytes == 0


def test_offload_moves_gradients_and_weights_off_the_gpu() -> None:
    a = _arch("llama-3.1-8b")
    n = a.params_total
    wl = Workload("m")
    z2 = estimate_memory(a, wl, Candidate(zero_stage=2, offload="optimizer", optim="adamw_torch_fused"))
    assert z2.model_states == 2 * n  # only the 16-bit weights stay (DeepSpeed: 2Ψ)
    assert "gradients" not in z2.phase_terms["optimizer_step"]
    z3p = estimate_memory(a, wl, Candidate(zero_stage=3, offload="params", optim="adamw_torch_fused"))
    assert z3p.model_states == 2 * 2 * a.largest_param  # the gathered module and the prefetched one
    assert z3p.host_bytes == pytest.approx(1.5 * 18 * n, rel=1e-6)  # DeepSpeed: 18Ψ x 1.5 with zero.Init


# ---------------------------------------------------------------- published OOM cases


def test_no_plan_fits_where_a_published_measurement_ran_out_of_memory() -> None:
    bench = _bench()
    assert len(bench.PUBLISHED_OOM) >= 5
    for case in bench.PUBLISHED_OOM:
        verdict = bench.plan_verdict(case)
        assert not verdict.fits, f"{case.label}: plan says fits ({verdict.detail}); published: {case.source}"


def test_published_benchmark_runs_and_reports_ratios() -> None:
    bench = _bench()
    rows = bench.rows()
    assert len(rows) >= 15
    sources = {r.source for r in rows}
    assert all(s.strip() for s in sources)
    ratios = [r.ratio for r in rows if r.ratio is not None]
    assert ratios and all(r > 0 for r in ratios)
    summary = bench.summary(rows)
    assert summary["n"] == len(ratios)
    assert summary["median"] == pytest.approx(sorted(ratios)[len(ratios) // 2], rel=0.5)
    table = bench.markdown(rows)
    assert table.count("\n") >= len(rows) + 1 and "| source |" in table.splitlines()[0].replace("  ", " ")


# ---------------------------------------------------------------- published runs: speed halves, memory


def test_published_runs_file_sources_configurations_and_split_rule() -> None:
    bench = _bench()
    doc = bench.load_runs()
    runs = doc["runs"]
    assert len(runs) >= 12 and len({r["source"] for r in runs}) >= 4
    for r in runs:
        assert r["cite"].strip() and r["model"] in doc["models"]
        for key in ("gpu", "method", "seq_len", "micro_batch", "grad_accum", "grad_ckpt", "attn", "precision"):
            assert key in r, (r["id"], key)
        assert ("published_s_per_step" in r) or ("published_tokens_per_s_per_gpu" in r)
    # the split written before the fit: alternate within each source, starting with fit
    seen: dict[str, int] = {}
    for r in runs:
        k = seen.get(r["source"], 0)
        assert r["split"] == ("fit" if k % 2 == 0 else "heldout"), r["id"]
        seen[r["source"]] = k + 1


def test_speed_model_on_the_held_out_half() -> None:
    """Fitted on the fit halves only (with the short-step set's); the held-out half scores it (goal: median
    0.85-1.15, every row in 0.6-1.6). Recorded 2026-12-04: fit 27 rows median 0.99 (0.72-1.29); held out 24 rows
    median 0.98 (0.66-1.32), none outside (before the per-step terms: 1.01, 0.53-1.31, torchtune's LoRA on an RTX
    A6000 outside, whose published rate is 150% of the A6000's dense peak in the FLOPs of its configuration)."""
    bench = _bench()
    rows = bench.speed_rows()
    fit = bench.split_summary([r for r in rows if r.group == "speed (fit)"])
    held = bench.split_summary([r for r in rows if r.group == "speed (held out)"])
    assert (fit["n"], held["n"]) == (27, 24)
    assert 0.95 <= fit["median"] <= 1.05 and fit["outside_0.6_1.6"] == 0
    assert 0.85 <= held["median"] <= 1.15
    assert held["outside_0.6_1.6"] <= 1 and held["min"] > 0.5 and held["max"] < 1.35
    outside = [r.what for r in rows if r.group == "speed (held out)" and not 0.6 <= r.ratio <= 1.6]
    assert all("torchtune" in w for w in outside), outside


def test_short_steps_set_and_the_per_step_terms() -> None:
    """Short steps from other projects (benchmarks/published_short_steps.json, split by the same rule). Before the
    per-step terms, PEFT's 3B LoRA steps on an L40S (0.117 s each) were predicted at 0.16-0.18 of their speed: a
    fixed 0.66 s per optimizer step fitted on long steps. With a fixed 0.099 s per micro-batch (2026-12-04): PEFT's
    five rows 0.63-0.86, the held-out half 16 rows, median 0.87 (0.52-1.92), 4 outside 0.6-1.6. With the dispatch
    term (an operation count per layer and per adapted linear x PER_OP_S, 2026-12-06): PEFT's rows 0.69-1.13, the
    held-out half median 1.03 (0.57-2.01), 3 outside; with dequantisation a stream at the GPU's bandwidth (the same
    day): median 1.06 (0.67-1.98), 2 outside (litgpt's Phi-3 and Gemma-2 LoRA, whose tokens/s were derived from a
    runtime that includes validation and a token count read off a histogram, +-20 %): 14 of 16 within."""
    bench = _bench()
    doc = bench.load_short_steps()
    assert {r["source"] for r in doc["runs"]} == {"peft", "litgpt"}
    seen: dict[str, int] = {}
    for r in doc["runs"]:
        assert r["cite"].strip() and r["model"] in doc["models"] and r["seq_len"] * r["micro_batch"] <= 1000
        k = seen.get(r["source"], 0)
        assert r["split"] == ("fit" if k % 2 == 0 else "heldout"), r["id"]
        seen[r["source"]] = k + 1
    rows = bench.speed_rows(doc, "short")
    peft = [r.ratio for r in rows if r.what.startswith("peft-")]
    assert len(peft) == 5 and all(0.6 <= x <= 1.2 for x in peft), peft
    held = bench.split_summary([r for r in rows if r.group == "short (held out)"])
    assert held["n"] == 16 and 0.95 <= held["median"] <= 1.1 and held["outside_0.6_1.6"] <= 2, held


def test_reserved_with_variable_lengths_against_ms_swifts_table() -> None:
    """ms-swift's max_memory_reserved (one A100 80GB, real samples of variable length, vocabularies 64k-152k,
    512-8,192 tokens; benchmarks/published_large_vocab.json, split before the fit). The fixed-length reserved figure
    was 0.82 of it on the held-out half (39 % of rows within 15 %); the variable-length figure, its one constant
    fitted on the fit half, is 1.00 (70 % within 15 %). Recorded 2026-12-04; goal 80 % within 15 %: missed (the two
    rows without checkpointing are 1.40 and 2.01: the growth is fitted on checkpointed runs). 2026-12-06: the growth
    applied to the transient tensors only, not to the saved activations (the allocator replay without checkpointing
    grows about as much as with it), refitted 1.85: median 0.99 (0.75-1.30), 78 % within 15 % (18 of 23), the two
    rows without checkpointing 0.97 and 1.05; still short of 80 % by one row."""
    from autotune.estimate import memory

    bench = _bench()
    doc = bench.load_large_vocab()
    assert len(doc["runs"]) == 47 and all(r["memory_reports"] == "reserved" for r in doc["runs"])
    assert all(r["split"] == ("fit" if i % 2 == 0 else "heldout") for i, r in enumerate(doc["runs"]))
    assert memory.VARLEN_RESERVE_GROWTH == 1.85
    held = [r for r in bench.varlen_memory_rows(doc) if r.group.endswith("(held out)")]
    before = [r for r in bench.varlen_memory_rows(doc, fixed=True) if r.group.endswith("(held out)")]
    q, b = bench.split_summary(held), bench.split_summary(before)
    assert q["n"] == 23 and 0.95 <= q["median"] <= 1.05 and bench.within(held) >= 0.78 and q["max"] < 1.35, q
    assert b["median"] < 0.85 and bench.within(before) < 0.45, b


def test_reserved_with_fixed_lengths_at_large_vocabularies_against_universal_llm_trainers_table() -> None:
    """universal-llm-trainer's reserved memory of LoRA and QLoRA at 8,192 fully filled tokens x micro-batch 2 at
    vocabularies of 128k-256k (benchmarks/published_fixed_length.json: 18 rows, 8 configurations on 3 GPUs, all held
    out, scored once after the model was fixed, 2026-12-05). The published figures read as GB (their 'Model Mem.'
    column is the bf16 weights in GB): the plan's reserved figure is 1.11-1.22 of them (median 1.17, 7 of 18 within
    15 %: the goal of 80 % is missed, on the safe side), its allocated figure 0.99-1.10: the allocator overhead
    the plan adds (ALLOCATOR_RESERVE) is what over-states these runs. Both published out-of-memory runs (Gemma-2-9B
    QLoRA on 80 GB cards) are predicted not to fit."""
    bench = _bench()
    doc = bench.load_fixed_length()
    runs = doc["runs"]
    assert len(runs) == 20 and all(r["split"] == "held out" and r["seq_len"] * r["micro_batch"] == 16384 for r in runs)
    assert all(doc["models"][r["model"]].get("config", {}).get("vocab_size", 128256) >= 128256 for r in runs)
    reserved = bench.fixed_length_memory_rows(doc)
    allocated = bench.fixed_length_memory_rows(doc, allocated=True)
    q, a = bench.split_summary(reserved), bench.split_summary(allocated)
    assert q["n"] == 18 and 1.10 <= q["median"] <= 1.25 and q["min"] > 1.0 and 0.35 <= bench.within(reserved) < 0.5, q
    assert 1.0 <= a["median"] <= 1.10 and bench.within(allocated) == 1.0, a
    oom = bench.fixed_length_oom(doc)
    assert set(oom) == {"ult-10", "ult-12"} and all(v > 80 for v in oom.values()), oom


def test_published_rates_above_the_gpus_peak_are_the_only_held_out_misses() -> None:
    """A published rate that implies more than the GPU's dense peak in the hardware FLOPs of its
    stated configuration cannot be what that configuration produced; those runs are shown but not
    scored. Exactly torchtune's two RTX A6000 runs are (107% and 150%; the three RTX 4090 runs of
    the same table imply 64-92%), and without them every held-out run is inside 0.6-1.6."""
    bench = _bench()
    doc = bench.load_runs()
    over = bench.above_peak(doc)
    assert set(over) == {"torchtune-01", "torchtune-03"}, over
    assert 1.0 < over["torchtune-01"] < 1.15 and 1.4 < over["torchtune-03"] < 1.6
    assert all(bench.implied_hfu(doc, r) <= 0.95 for r in doc["runs"] if r["id"] not in over)
    held = [r for r in bench.speed_rows(doc) if r.group == "speed (held out)" and r.what.split()[0] not in over]
    q = bench.split_summary(held)
    assert q["n"] == 22 and q["outside_0.6_1.6"] == 0 and 0.85 <= q["median"] <= 1.15, q


def test_qlora_memory_of_published_runs_at_2k_to_8k() -> None:
    """Qwen's published Q-LoRA (GPTQ, DeepSpeed fp16 with 2e8-element buckets) at 2,048-8,192 tokens:
    1.48-1.75x before the 16-bit terms, 0.98-1.15x after (goal: within 15%)."""
    bench = _bench()
    mem = [r for r in bench.memory_rows() if " qlora " in r.what and r.what.startswith("qwen")]
    long = [r for r in mem if any(f"seq {s}," in r.what for s in (2048, 4096, 8192))]
    assert len(long) == 9
    assert all(0.95 <= r.ratio <= 1.15 for r in long), [(r.what, round(r.ratio, 2)) for r in long]


# ---------------------------------------------------------------- eager attention with dropout (item 7)


def test_eager_dropout_term_matches_what_autograd_saves_on_cpu() -> None:
    """GPT-2's eager attention, fp32 on CPU: the s² part of what autograd saves is 4 B per score
    element without dropout (the softmax output) and 12 B with it (+ fp32 noise mask + dropped
    probabilities); the estimator's term must say the same. On CUDA under autocast the reading is
    4 (fp32 softmax out) + 1 (bool mask) + 2 (16-bit dropped probabilities) = 7, not 11."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location(
        "eager_dropout_saved", ROOT / "benchmarks" / "eager_dropout_saved.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a, b, s1, s2 = 4, 2, 128, 256

    def per_element(p: float) -> float:
        d = mod.saved_bytes(p, False, s=s2, b=b, a=a) - 2 * mod.saved_bytes(p, False, s=s1, b=b, a=a)
        return d / (a * b * (s2 * s2 - 2 * s1 * s1))

    measured_drop, measured_plain = per_element(0.1), per_element(0.0)
    from autotune.estimate.memory import layer_activation_bytes_per_token

    g2 = dict(json.loads((PRESETS / "gpt2" / "config.json").read_text()), n_layer=1)
    arch = arch_from_config(g2)
    kw = dict(trainable_base=True, adapted=frozenset(), wb=4, cb=4, attn="eager", device="cpu")

    def s2_term(arch_, s: int, **k) -> float:  # noqa: ANN001, ANN003
        # the part of the per-token bytes that grows with s, per head and score element
        return (
            layer_activation_bytes_per_token(arch_, 2 * s, **k)
            - layer_activation_bytes_per_token(arch_, s, **k)
        ) / (arch_.heads * s)

    import dataclasses

    no_drop = dataclasses.replace(arch, attn_dropout=0.0)
    assert s2_term(arch, 512, **kw) == pytest.approx(measured_drop, abs=0.5)
    assert s2_term(no_drop, 512, **kw) == pytest.approx(measured_plain, abs=0.5)
    cuda = dict(kw, cb=2, wb=4, device="cuda")
    assert s2_term(arch, 512, **cuda) == 4 + 1 + 2
    assert s2_term(no_drop, 512, **cuda) == 4 + 2


def test_fresh_set_from_projects_not_used_before_scored_once() -> None:
    """benchmarks/published_fresh.json, gathered 2026-12-06 from fms-acceleration's published benchmark files and a
    transformers issue's timed runs, every row held out and scored once. Recorded then: Llama-3-8B at 4,096 tokens on
    one A100-80GB, max_memory_allocated: 17 rows, median 1.43; the 7 with Liger's fused loss on a 16-bit residual
    path (LoRA; LoRA on a GPTQ base) 1.00-1.02, the bitsandbytes QLoRA rows 1.52-1.76 (that stack does not upcast
    the norms to fp32 as peft's prepare_model_for_kbit_training does), the rows with FOAK's Triton loss 1.33-1.76:
    never under the published peak. Speed, long steps (the same runs, and Mistral-7B on orca-math at 1,157 tokens per
    micro-batch): 22 rows, median 0.87 (0.58-0.91), under published rates that Triton kernels helped. Short steps
    (GPT-2 124M-774M full fine-tuning at 512-1,024 tokens on an RTX 3090, 2021): 11 rows, median 0.71 (0.35-0.95),
    5 outside 0.6-1.6: the fixed cost per micro-batch fitted on 1.8-9B models over-states a 124M model's step.
    Scored again 2026-12-06 after the dispatch term replaced that cost (a change this miss prompted, so no longer a
    blind score): short steps median 0.90 (0.80-1.10), none outside 0.6-1.6; long steps median 0.89 (0.55-0.96); with
    dequantisation a stream at the GPU's bandwidth, short 0.92 (0.82-1.17), long 0.85 (0.79-0.96), none outside."""
    bench = _bench()
    doc = bench.load_fresh()
    assert {r["source"] for r in doc["runs"]} == {"fms-acceleration", "transformers-issue-9371"}
    assert all(r["split"] == "held out" and r["cite"].strip() and r["model"] in doc["models"] for r in doc["runs"])
    rows = bench.fresh_rows(doc)
    by_id = {r["id"]: r for r in doc["runs"]}
    mem = [r for r in rows if r.group.startswith("memory")]
    assert len(mem) == 17
    for r in mem:
        run = by_id[r.what.split()[0]]
        assert doc["models"][run["model"]]["config"]["vocab_size"] >= 100_000 and run["seq_len"] >= 4096
        assert run["memory_reports"] == "allocated" and r.ratio >= 0.99, r.what
        if run.get("liger") and (run["method"] == "lora" or run.get("quant") == "gptq"):
            assert 0.97 <= r.ratio <= 1.05, r.what
        elif run["method"] == "qlora" and not run.get("quant"):
            assert r.ratio > 1.45, r.what
    long = bench.split_summary([r for r in rows if r.group == "speed, long steps, fresh (held out)"])
    assert long["n"] == 22 and 0.8 <= long["median"] <= 0.95 and long["min"] > 0.75 and long["max"] < 1.0, long
    short_rows = [r for r in rows if r.group == "speed, short steps, fresh (held out)"]
    short = bench.split_summary(short_rows)
    assert short["n"] == 11 and 0.85 <= short["median"] <= 1.0 and short["outside_0.6_1.6"] == 0, short
    assert all(by_id[r.what.split()[0]]["seq_len"] * by_id[r.what.split()[0]]["micro_batch"] <= 1024 for r in short_rows)
    gpt2_small = [r.ratio for r in short_rows if r.what.split()[1] == "gpt2" and ", seq 128, " in r.what]
    assert len(gpt2_small) == 2 and min(gpt2_small) > 0.8, gpt2_small  # 0.35 and 0.49 with the per-micro-batch cost


def test_blind_short_steps_scored_once() -> None:
    """benchmarks/published_short_blind.json: 32 rows gathered after the dispatch term was final, from a project no
    other set uses (huggingface/optimum-benchmark's training-llamas results: Llama-2-7B/13B, 256-token rows x
    micro-batch 1-4, a plain HF Trainer in pure fp16 without autocast, one A100-80GB or RTX 4090), every row held
    out. Scored once with the model of fb146d5 (2026-12-06): median 0.63 (0.17-1.04), 14 outside 0.6-1.6. Then
    dequantisation became a stream at the GPU's bandwidth (chosen on the fit halves; no longer a blind score):
    0.66 (0.20-1.03), 14 outside. LoRA and GPTQ on the A100 are 0.69-1.03; the misses are this stack's pure-fp16
    full fine-tuning (0.59-0.63: fp16 optimizer states where the plan assumes fp32 ones), its bitsandbytes 4-bit
    rows (0.20-0.69: FP4 in fp16 without peft's k-bit preparation, which the plan's fitted dequantisation cost
    comes from) and GPTQ on the RTX 4090 (0.46-0.49; 0.62 before the bandwidth change)."""
    bench = _bench()
    doc = bench.load_blind_short()
    assert {r["source"] for r in doc["runs"]} == {"optimum-benchmark"} and len(doc["runs"]) == 32
    assert all(r["split"] == "held out" and r["seq_len"] * r["micro_batch"] <= 1024 for r in doc["runs"])
    rows = bench.speed_rows(doc, "blind")
    q = bench.split_summary(rows)
    assert 0.6 <= q["median"] <= 0.72 and q["outside_0.6_1.6"] == 14, q
    by_id = {r["id"]: r for r in doc["runs"]}
    for r in rows:
        run = by_id[r.what.split()[0]]
        if run["gpu"] == "A100-80GB" and (run["method"] == "lora" or run.get("quant") == "gptq"):
            assert 0.65 <= r.ratio <= 1.1, r.what
        elif run.get("quant") == "nf4":
            assert r.ratio < 0.7, r.what


def test_blind_variable_length_memory_scored_once() -> None:
    """benchmarks/published_memory_blind.json: huggingface/peft's method comparison (Llama-3.2-3B LoRA, vocabulary
    128,256, MetaMathQA up to 768 tokens x micro-batch 4, no checkpointing, one L40S, torch 2.13 / transformers 5.13),
    whose memory figures no other set uses, every row held out. Scored once with the estimator of cdd892b
    (2026-12-07): against ``reserved_variable_lengths`` (the figure for max_memory_reserved with variable-length
    batches) 1.37-1.42, none within 15 %: on the safe side, and PEFT's loop empties the CUDA cache every 10 steps,
    which holds back the growth that figure is for (said in the file's ambiguity before the score). The fixed-length
    ``reserved`` figure is 1.06 on all four, ``allocated`` 0.95-0.96."""
    bench = _bench()
    doc = bench.load_blind_memory()
    assert {r["source"] for r in doc["runs"]} == {"peft"} and len(doc["runs"]) == 4
    assert all(r["split"] == "held out" and r["memory_reports"] == "reserved" and r["length_distribution"] == "variable"
               and "empty_cache" in r["ambiguity"] for r in doc["runs"])
    grown = [r.ratio for r in bench.blind_memory_rows(doc)]
    assert all(1.3 <= x <= 1.5 for x in grown), grown
    assert all(1.0 <= r.ratio <= 1.1 for r in bench.blind_memory_rows(doc, figure="reserved"))
    assert all(0.9 <= r.ratio <= 1.0 for r in bench.blind_memory_rows(doc, figure="allocated"))


def test_the_shipped_step_time_form_is_what_the_fit_halves_choose() -> None:
    """`estimator_vs_published.py --forms` (docs/plan.md's table of forms): the shipped form (the dispatch added to
    the GPU's work, the Trainer's times as measured, dequantization a stream at the bandwidth), refitted on both
    sets' fit halves, gives the constants autotune/estimate/speed.py ships, and fits the fit halves better than the
    dispatch overlapped with the GPU's work; fitted freely, the dispatch goes to nothing and a constant per
    micro-batch of about 0.1 s takes its place, which is why the Trainer's times are held at their measurements."""
    from autotune.estimate import speed

    bench = _bench()
    forms = {f[0]: f for f in bench.FORMS}
    shipped = bench.fit_form(*forms["the same, dequantization a stream at the bandwidth (shipped)"])
    k = shipped["constants"]
    assert round(k["DEFAULT_EFFICIENCY"], 2) == speed.DEFAULT_EFFICIENCY and round(k["PER_OP_S"], 7) == speed.PER_OP_S
    assert round(k["SATURATION_TOKENS"]) == speed.SATURATION_TOKENS
    assert {q: round(k[q], 1) for q in ("nf4", "gptq")} == speed.DEQUANT_BYTES_PER_PARAM
    assert speed.DEFAULT_EFFICIENCY == bench.speed_model.DEFAULT_EFFICIENCY  # the fit leaves the shipped constants
    overlapped = bench.fit_form(*next(f for f in bench.FORMS if f[0].startswith("dispatch overlapped")))
    assert shipped["fit"] < overlapped["fit"] - 0.5
    free = bench.fit_form(*next(f for f in bench.FORMS if f[0].startswith("dispatch added, every constant")))
    assert free["constants"]["PER_OP_S"] < 1e-6 and 0.05 < free["constants"]["MICROBATCH_OVERHEAD_S"] < 0.15
