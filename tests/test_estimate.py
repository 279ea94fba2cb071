"""The estimator: architecture summary, memory terms, FLOPs/MFU, catalog, plan.  (pure, fast)

One test builds models on the meta device with transformers to check exact parameter counts.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from autotune.errors import SpecError
from autotune.estimate import (
    DEFAULT_EFFICIENCY,
    PRUNE_FACTOR,
    arch_from_config,
    calibrate,
    calibration_pairs,
    estimate_memory,
    find_gpu,
    find_gpus,
    fits,
    load_catalog,
    lora_param_count,
    mfu,
    model_flops_per_token,
    plan,
    predict_peak_bytes,
    predict_speed,
    predict_step_time,
    should_prune,
    speed,
)
from autotune.estimate.catalog import builtin_catalog, catalog_paths_from_env, parse_catalog
from autotune.estimate.memory import (
    CUDA_CONTEXT_BYTES,
    GPTQ_BYTES_PER_PARAM,
    LOGITS_16BIT_BYTES,
    LOGITS_BYTES_PER_ELEMENT,
    LOGITS_MODEL_DTYPE_BYTES,
    QLORA_BYTES_PER_PARAM,
    layer_activation_bytes_per_token,
)
from autotune.estimate.plan import HEADROOM, parse_tokens
from autotune.estimate.speed import hardware_flops_per_token, ideal_tokens_per_s
from autotune.spec.probe_request import Candidate, ProbeRequest, Workload

MODELS = Path(__file__).resolve().parents[1] / "autotune" / "models"
PRESET_CONFIGS = sorted(MODELS.glob("presets/*/config.json")) + sorted(MODELS.glob("tiny/*/config.json"))


def cfg(short: str) -> dict:
    return json.loads((MODELS / "presets" / short / "config.json").read_text())


# small configs of families with no preset, to check the counting rules
EXTRA_CONFIGS = {
    "qwen3": {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 160, "vocab_size": 500,
              "tie_word_embeddings": True},
    "gemma3_text": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128,
                    "vocab_size": 500},
    "mixtral": {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 500, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "llama-bias": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "intermediate_size": 96, "vocab_size": 500, "attention_bias": True, "mlp_bias": True},
    "gpt2-untied": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128,
                    "vocab_size": 500, "tie_word_embeddings": False},
}  # fmt: skip


# ---------------------------------------------------------------- architecture


def test_known_exact_counts() -> None:
    assert arch_from_config(cfg("llama-3.1-8b")).params_total == 8_030_261_248
    assert arch_from_config(cfg("gpt2")).params_total == 124_439_808
    assert arch_from_config(cfg("qwen2.5-7b")).params_total == 7_615_616_512


def test_arch_fields() -> None:
    a = arch_from_config(cfg("llama-3.1-8b"))
    assert (a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim, a.intermediate, a.vocab) == (
        4096, 32, 32, 8, 128, 14336, 128256)  # fmt: skip
    assert not a.tied and a.params_lm_head == a.params_embedding == 128256 * 4096
    g = arch_from_config(cfg("gemma-2-2b"))
    assert g.head_dim == 256 and g.q_width == 2048 != g.hidden and g.tied and g.norms_per_layer == 4
    gpt = arch_from_config(cfg("gpt2"))
    assert (gpt.hidden, gpt.layers, gpt.heads, gpt.max_positions, gpt.intermediate) == (
        768,
        12,
        12,
        1024,
        3072,
    )
    assert gpt.tied and gpt.params_embedding == 50257 * 768 + 1024 * 768
    # params_matmul counts the output projection even when tied, and not the embedding look-up
    assert gpt.params_matmul == gpt.params_total - gpt.params_embedding + 50257 * 768


def test_arch_errors_list_every_missing_field() -> None:
    with pytest.raises(SpecError, match="hidden_size.*num_hidden_layers|num_hidden_layers.*hidden_size") as e:
        arch_from_config(
            {"model_type": "llama", "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 9}
        )
    assert len(e.value.problems) == 2
    with pytest.raises(SpecError, match="mapping"):
        arch_from_config([1, 2])  # type: ignore[arg-type]


def test_unknown_family_is_llama_like_with_a_note() -> None:
    c = dict(EXTRA_CONFIGS["llama-bias"], model_type="somethingnew")
    assert any("Llama-like" in n for n in arch_from_config(c).notes)


@pytest.mark.parametrize(
    "config",
    [pytest.param(json.loads(p.read_text()), id=p.parent.name) for p in PRESET_CONFIGS]
    + [pytest.param(c, id=k) for k, c in EXTRA_CONFIGS.items()],
)
def test_param_count_matches_transformers_meta_build(config: dict) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    conf = dict(config)
    model_type = conf.pop("model_type")
    hf_cfg = transformers.AutoConfig.for_model(model_type, **conf)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    expected = sum(p.numel() for p in model.parameters())
    got = arch_from_config(config).params_total
    assert abs(got - expected) <= 0.005 * expected, (got, expected)
    assert got == expected  # exact for every supported family


def test_lora_param_count_by_hand_and_peft() -> None:
    a = arch_from_config(cfg("llama-3.1-8b"))
    per_layer = 16 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096))
    assert lora_param_count(a, 16, ("q_proj", "k_proj", "v_proj", "o_proj")) == 32 * per_layer == 13_631_488
    assert lora_param_count(a, 8, ("q_proj", "v_proj")) == 32 * 8 * ((4096 + 4096) + (4096 + 1024))
    assert lora_param_count(a, 8, ("nonexistent",)) == 0
    phi = arch_from_config(cfg("phi-3-mini"))  # fused qkv_proj adapted once
    assert lora_param_count(phi, 8, ("q_proj", "v_proj")) == 32 * 8 * (3072 + 3 * 3072)

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    small = json.loads((MODELS / "tiny" / "tiny-llama" / "config.json").read_text())
    conf = dict(small)
    hf_cfg = transformers.AutoConfig.for_model(conf.pop("model_type"), **conf)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]
    pm = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets))
    trainable = sum(p.numel() for p in pm.parameters() if p.requires_grad)
    assert lora_param_count(arch_from_config(small), 4, tuple(targets)) == trainable


# ---------------------------------------------------------------- memory

LLAMA8 = arch_from_config(cfg("llama-3.1-8b"))
LLAMA1B = arch_from_config(cfg("llama-3.2-1b"))
N8 = LLAMA8.params_total


def test_full_amp_adamw_model_states_are_16_bytes_per_param() -> None:
    m = estimate_memory(LLAMA8, Workload("m", seq_len=2048), Candidate(precision="bf16"), device="cuda")
    # autotune's convention: fp32 weights + fp32 grads + 2 fp32 AdamW states = 16 B/param
    wl, c = Workload("m", seq_len=2048), Candidate(precision="bf16")
    br = estimate_memory(LLAMA8, wl, c, device="cpu")
    assert m.phase == "optimizer_step"  # the foreach AdamW temporary beats activations here
    t = m.terms
    assert t["weights"] + t["gradients"] + t["optimizer_states"] == 16 * N8
    assert t["optimizer_temp"] == 4 * N8  # foreach sqrt(v): one fp32 copy
    assert t["cuda_context"] == CUDA_CONTEXT_BYTES and sum(t.values()) == m.total
    assert "cuda_context" not in br.terms and "allocator_reserve" not in br.terms
    assert sum(br.terms.values()) == br.total
    # the CPU AdamW is single-tensor: temporaries of the largest tensor only
    assert br.phase_terms["optimizer_step"]["optimizer_temp"] == 2 * 4 * LLAMA8.vocab * LLAMA8.hidden
    fused = estimate_memory(LLAMA8, wl, Candidate(optim="adamw_torch_fused"), device="cuda")
    assert fused.phase == "backward_start" and "optimizer_temp" not in fused.terms
    assert fused.terms["weight_copies"] == 2 * LLAMA8.params_matmul  # autocast's bf16 copies
    assert "gradients" not in fused.terms  # freed by zero_grad(set_to_none) before the forward
    accum = estimate_memory(LLAMA8, wl, Candidate(optim="adamw_torch_fused", grad_accum=4))
    assert accum.terms["gradients"] == 4 * N8  # they persist across micro-batches
    eight = estimate_memory(LLAMA8, wl, Candidate(optim="adamw_8bit"))
    assert eight.terms["optimizer_states"] == 2 * N8


@pytest.mark.parametrize(
    ("stage", "expected"), [(1, 4 * N8 + 12 * N8 / 8), (2, 2 * N8 + 14 * N8 / 8), (3, 16 * N8 / 8)]
)
def test_zero_model_states_follow_the_paper(stage: int, expected: float) -> None:
    c = Candidate(world_size=8, zero_stage=stage)
    m = estimate_memory(LLAMA8, Workload("m"), c)
    states = sum(m.terms.get(k, 0) for k in ("weights", "gradients", "master_weights", "optimizer_states"))
    assert states == pytest.approx(expected, abs=8)
    assert m.terms["zero_buffers"] > 0


def test_zero_offload_moves_optimizer_to_host() -> None:
    c = Candidate(world_size=8, zero_stage=3, offload="optimizer")
    m = estimate_memory(LLAMA8, Workload("m"), c)
    assert "optimizer_states" not in m.terms and "master_weights" not in m.terms
    assert m.offloaded_bytes == pytest.approx(16 * N8 / 8, abs=8)


def test_ddp_adds_gradient_buckets() -> None:
    m = estimate_memory(LLAMA8, Workload("m"), Candidate(world_size=2, optim="adamw_torch_fused"))
    assert m.terms["ddp_buckets"] == 4 * N8


def test_lora_and_qlora_weights() -> None:
    wl = Workload("m", seq_len=1024, mode="lora", lora_r=16)
    m = estimate_memory(LLAMA8, wl, Candidate())
    n_lora = 13_631_488
    assert m.terms["weights"] == 2 * N8  # frozen base in bf16
    assert m.terms["lora_adapters"] == 4 * n_lora and m.terms["optimizer_states"] == 8 * n_lora
    assert m.trainable_params == n_lora
    q = estimate_memory(LLAMA8, Workload("m", seq_len=1024, mode="qlora"), Candidate())
    linear = LLAMA8.params_linear_total
    # peft's prepare_model_for_kbit_training casts what bitsandbytes left unquantized to fp32
    assert q.terms["weights"] == round(QLORA_BYTES_PER_PARAM * linear + 4 * (N8 - linear))
    # autocast's bf16 copies of the fp32 lm_head and (without checkpointing) of the fp32 adapters
    assert q.terms["weight_copies"] == 2 * LLAMA8.vocab * LLAMA8.hidden + 2 * q.trainable_params
    assert m.terms["weight_copies"] == 2 * n_lora
    assert "weight_copies" not in estimate_memory(LLAMA8, wl, Candidate(grad_ckpt=True)).terms
    assert 0.51 < QLORA_BYTES_PER_PARAM < 0.53
    with pytest.raises(SpecError, match="QLoRA.*GPU"):
        estimate_memory(LLAMA8, Workload("m", mode="qlora"), Candidate(precision="fp32"), device="cpu")


def test_qlora_without_fp32_casts_gptq_deepspeed_and_16bit_loss() -> None:
    """The QLoRA terms that over-counted Qwen's published Q-LoRA (GPTQ, DeepSpeed fp16, the model's own
    16-bit loss) by 1.3-1.75x at 256-8192 tokens: peft leaves a GPTQ model 16-bit (no fp32 embeddings,
    lm_head or residual stream, no autocast copy of the lm_head), and a loss computed in fp16 without
    autocast keeps 8 B per logit, not transformers' fp32 working set."""
    wl = Workload("m", seq_len=8192, mode="qlora", lora_r=64, lora_targets=("all-linear",))
    c = Candidate(grad_ckpt=True, precision="fp16", attn="flash_attention_2")
    nf4 = estimate_memory(LLAMA8, wl, c)
    gptq = estimate_memory(LLAMA8, wl, c, quant="gptq")
    linear = LLAMA8.params_linear_total
    assert gptq.terms["weights"] == round(GPTQ_BYTES_PER_PARAM * linear + 2 * (N8 - linear))
    assert "weight_copies" not in gptq.terms and nf4.terms["weight_copies"] > 0
    assert gptq.phase_terms["backward_start"]["activations"] < nf4.phase_terms["backward_start"]["activations"]
    ds = estimate_memory(LLAMA8, wl, Candidate(grad_ckpt=True, precision="fp16", zero_stage=2, optim="adamw_torch_fused"))
    assert ds.terms["weights"] == round(QLORA_BYTES_PER_PARAM * linear + 2 * (N8 - linear))  # the engine's .half()
    own = estimate_memory(LLAMA8, wl, c, quant="gptq", loss_dtype="model")
    assert own.terms["logits_loss"] == LOGITS_MODEL_DTYPE_BYTES * 8192 * LLAMA8.vocab == 8 * 8192 * LLAMA8.vocab
    assert gptq.terms["logits_loss"] == (LOGITS_BYTES_PER_ELEMENT + LOGITS_16BIT_BYTES) * 8192 * LLAMA8.vocab
    small = estimate_memory(LLAMA8, wl, Candidate(grad_ckpt=True, precision="fp16", zero_stage=2,
                                                  optim="adamw_torch_fused"), bucket_elements=10**7)  # fmt: skip
    assert small.terms["zero_buffers"] == round(2 * 2 * 10**7 * 4.5) < ds.terms["zero_buffers"]
    with pytest.raises(SpecError, match="quant must be one of nf4, gptq"):
        estimate_memory(LLAMA8, wl, c, quant="awq")
    with pytest.raises(SpecError, match="loss_dtype must be fp32 or model"):
        estimate_memory(LLAMA8, wl, c, loss_dtype="bf16")


def test_activation_count_by_hand_for_llama_amp() -> None:
    a = LLAMA8
    h, kv, f, heads = a.hidden, a.kv_width, a.intermediate, a.heads
    got = layer_activation_bytes_per_token(
        a, 2048, trainable_base=True, adapted=frozenset(), wb=4, cb=2, attn="sdpa", device="cuda"
    )
    # 2 fp32 RMSNorms (input + normalized), 3+2 per-linear bf16 casts, q/k/v/out + fp32 lse, SwiGLU
    assert got == 2 * 8 * h + 3 * 2 * h + 2 * 2 * h + 2 * (h + 2 * kv) + 2 * h + 4 * heads + 2 * f + 3 * 2 * f


def test_fused_attention_removes_s_squared_and_checkpointing_keeps_inputs() -> None:
    def act(seq: int, attn: str, ckpt: bool = False) -> int:
        m = estimate_memory(
            LLAMA8, Workload("m", seq_len=seq), Candidate(attn=attn, grad_ckpt=ckpt, liger=True)
        )
        return m.phase_terms["backward_start"]["activations"]

    assert act(4096, "sdpa") == 2 * act(2048, "sdpa")  # linear in s
    assert act(4096, "eager") > 2 * act(2048, "eager")  # s² scores
    ck = act(2048, "sdpa", True)
    assert ck < act(2048, "sdpa") / 10
    a = LLAMA8
    final = 4 * a.hidden + 4 * a.hidden + 2 * a.hidden
    assert ck == (a.layers * 4 * a.hidden + final) * 2048  # fp32 residual inputs (AMP, fp32 model)


def test_logits_peak() -> None:
    wl = Workload("m", seq_len=8192, mode="lora")
    m = estimate_memory(LLAMA8, wl, Candidate(grad_ckpt=True))
    # fp32 working set + the bf16 logits (counted live: conservative for transformers 5.x)
    assert m.terms["logits_loss"] == (LOGITS_BYTES_PER_ELEMENT + LOGITS_16BIT_BYTES) * 8192 * 128256
    fp32 = estimate_memory(LLAMA8, wl, Candidate(grad_ckpt=True, precision="fp32"))
    assert fp32.terms["logits_loss"] == LOGITS_BYTES_PER_ELEMENT * 8192 * 128256
    liger = estimate_memory(LLAMA8, wl, Candidate(grad_ckpt=True, liger=True))
    assert liger.total < m.total - 10 * 2**30


def test_memory_rejects_bad_input() -> None:
    with pytest.raises(SpecError, match="micro_batch"):
        estimate_memory(LLAMA8, Workload("m"), Candidate(micro_batch=0))
    with pytest.raises(SpecError, match="device"):
        estimate_memory(LLAMA8, Workload("m"), Candidate(), device="tpu")
    with pytest.raises(SpecError, match="T4 has no bf16"):
        estimate_memory(LLAMA8, Workload("m"), Candidate(precision="bf16"), gpu=find_gpu("T4"))


def test_tf32_is_what_the_gpu_has_and_a_pinned_tf32_without_it_is_unsupported() -> None:
    # (a T4 plan pinned to tf32 was priced at the fp32 rate and labelled tf32)
    assert not find_gpu("T4").tf32 and find_gpu("A10G").tf32 and find_gpu("MI300X").tf32
    rows = plan(cfg("llama-3.2-1b"), gpus=find_gpus("T4,A10G"), pin={"precision": "tf32"}).rows
    assert [r.option is None for r in rows] == [True, False]
    assert "T4 has no TF32 (pinned precision)" in rows[0].note


def test_predict_peak_and_prune_rule() -> None:
    c = cfg("llama-3.1-8b")
    wl, cand = Workload("m", seq_len=512, mode="lora"), Candidate()
    peak = predict_peak_bytes(wl, cand, c, "cuda", None)
    assert peak == estimate_memory(LLAMA8, wl, cand).total
    assert PRUNE_FACTOR == 1.25
    assert not should_prune(peak, int(peak / 1.2))  # near the boundary: the probe decides
    assert should_prune(peak, int(peak / 1.3))
    assert fits(wl, cand, c, int(peak / (1 - HEADROOM)) + 1)
    assert not fits(wl, cand, c, peak)
    assert predict_peak_bytes(wl, Candidate(precision="fp32"), c, "cpu") > 0


# ---------------------------------------------------------------- speed / MFU


def test_flops_convention() -> None:
    a, s = LLAMA8, 2048
    n = a.params_matmul
    assert n == a.params_total - a.params_embedding  # untied: lm_head counted, look-up not
    attn = 12 * a.layers * a.q_width * s
    assert model_flops_per_token(a, s, "full") == 6 * n + attn
    assert model_flops_per_token(a, s, "lora") == 4 * n + attn
    assert hardware_flops_per_token(a, s, "full", grad_ckpt=True) == 8 * n + attn + attn / 3


def test_mfu() -> None:
    h100 = find_gpu("h100")
    got = mfu(5762, LLAMA8, 8192, h100, "full")
    assert got == pytest.approx(5762 * model_flops_per_token(LLAMA8, 8192) / 989e12)
    assert 0.3 < got < 0.45  # torchtitan's Llama-3.1-8B on H100: 33–39% (their N differs slightly)
    assert mfu(5762, LLAMA8, 8192, "H100-SXM") == got
    assert mfu(5762, LLAMA8, 8192, None) is None
    assert mfu(5762, LLAMA8, 8192, "Quantum-9000") is None  # unknown: no MFU, never a wrong one
    assert mfu(1000, LLAMA8, 2048, find_gpu("T4")) == pytest.approx(
        1000 * model_flops_per_token(LLAMA8, 2048) / 65e12
    )


def test_speed_counts_the_padding_of_variable_lengths() -> None:
    from autotune.estimate.speed import batch_layout_of

    g = find_gpu("A100-80GB")
    fixed, chat = Workload("m", seq_len=2048), Workload("m", seq_len=2048, lengths="lognormal:5.0,1.0")
    c = Candidate(micro_batch=8, grad_accum=4)
    lay = batch_layout_of(chat, c)
    assert batch_layout_of(fixed, c) == type(lay)(1.0, 2048.0, 8 * 2048.0)
    assert lay.slots_per_token > 2.0 and lay.tokens_per_micro_batch < 8 * 400  # median ~150 tokens, padded to the longest
    padded, packed = predict_speed(LLAMA8, chat, c, g), predict_speed(LLAMA8, chat, replace(c, packing=True), g)
    flat = predict_speed(LLAMA8, chat, replace(c, packing=True, attn="flash_attention_2"), g)
    assert padded.tokens_per_s < packed.tokens_per_s < flat.tokens_per_s
    # real tokens per step: a step of short sequences is shorter than one of 2048-token sequences
    assert padded.step_time_s < predict_speed(LLAMA8, fixed, c, g).step_time_s
    # model FLOPs (MFU) count each sequence's own attention length, not --seq-len's
    assert padded.hardware_flops_per_token < predict_speed(LLAMA8, fixed, c, g).hardware_flops_per_token
    # a micro-batch of thousands is laid out as one of LAYOUT_MAX_MICRO_BATCH (first-fit is quadratic in rows)
    from autotune.estimate.speed import LAYOUT_MAX_MICRO_BATCH

    big = batch_layout_of(chat, Candidate(micro_batch=65536, packing=True))
    cap = batch_layout_of(chat, Candidate(micro_batch=LAYOUT_MAX_MICRO_BATCH, packing=True))
    assert big.slots_per_token == cap.slots_per_token
    assert big.tokens_per_micro_batch == pytest.approx(cap.tokens_per_micro_batch * 65536 / LAYOUT_MAX_MICRO_BATCH)


def test_speed_levers_and_calibration() -> None:
    g = find_gpu("A100-80GB")
    wl = Workload("m", seq_len=2048)
    base = predict_speed(LLAMA8, wl, Candidate(micro_batch=4), g)
    ck = predict_speed(LLAMA8, wl, Candidate(micro_batch=4, grad_ckpt=True), g)
    assert ck.tokens_per_s < base.tokens_per_s
    assert g.efficiency is None and base.base_efficiency == DEFAULT_EFFICIENCY  # the fitted default
    assert base.step_time_s == pytest.approx(base.compute_time_s + base.overhead_time_s)
    off = predict_speed(
        LLAMA8, wl, Candidate(micro_batch=4, world_size=8, zero_stage=3, offload="optimizer"), g
    )
    assert off.offload_time_s > 0 and off.efficiency < base.efficiency
    ideal = ideal_tokens_per_s(LLAMA8, wl, Candidate(micro_batch=4), g)
    assert calibrate([(0.3 * ideal, ideal), (0.5 * ideal, ideal), (0.4 * ideal, ideal)]) == pytest.approx(0.4)
    assert calibrate([]) is None and calibrate([(0, 10)]) is None
    cal = predict_speed(LLAMA8, wl, Candidate(micro_batch=4), g, efficiency=0.4)
    assert cal.compute_time_s == pytest.approx(base.compute_time_s * DEFAULT_EFFICIENCY / 0.4)
    # round trip: a probe measured at what efficiency 0.3 predicts calibrates to 0.3 (overheads taken out)
    measured = predict_speed(LLAMA8, wl, Candidate(micro_batch=4), g, efficiency=0.3).tokens_per_s_per_gpu
    req = ProbeRequest(wl, Candidate(micro_batch=4)).to_dict()
    recs = [{"status": "ok", "request": req, "metrics": {"tokens_per_s": measured}},
            {"status": "oom", "request": req, "metrics": {}}]  # fmt: skip
    assert calibrate(calibration_pairs(recs, LLAMA8, g)) == pytest.approx(0.3)
    # a measured step shorter than the fixed overheads alone gives no pair
    fast = {"status": "ok", "request": req, "metrics": {"tokens_per_s": 1e9}}
    assert calibration_pairs([fast], LLAMA8, g) == []


def test_step_time_model_terms_and_fitted_constants() -> None:
    """The fitted constants (benchmarks/estimator_vs_published.py --fit, fit half of
    benchmarks/published_runs.json) and what each term of the step time does."""
    assert DEFAULT_EFFICIENCY == 0.54
    assert speed.SATURATION_TOKENS == 52
    assert speed.PER_OP_S == 6.3e-6
    assert speed.DEQUANT_BYTES_PER_PARAM == {"nf4": 20.5, "gptq": 13.4}
    assert speed.COMM_OVERLAP == 0.5
    # the Trainer's own times are measured (benchmarks/host_overhead.py), not fitted
    assert speed.MICROBATCH_OVERHEAD_S == 0.0002
    assert speed.TRAINER_STEP_S == 0.001
    assert speed.COMPILE_FACTOR == 1.0
    g = find_gpu("A100-80GB")
    lora = Workload("m", seq_len=256, mode="lora", lora_r=16, lora_targets=("all-linear",))
    c = Candidate(micro_batch=1, grad_accum=8, grad_ckpt=True, attn="flash_attention_2")
    sp = predict_speed(LLAMA8, lora, c, g)
    # the operations a micro-batch dispatches: per layer its forward twice (checkpointed: recomputed) and the frozen
    # base's backward, per adapted linear (7 a layer) the same, and the rest once (with the base frozen: the head and
    # loss, less the first layer's input gradient, which a frozen embedding does not need)
    ops = speed.OPS_PER_STEP["sdpa"]["llama"]
    assert ops == {"layer_forward": 91, "layer_backward_full": 162, "layer_backward_frozen": 113, "lora_module_forward": 13,
                   "lora_module_backward": 22, "fixed": 72, "fixed_frozen": 1}  # fmt: skip
    assert speed.ops_per_micro_batch(LLAMA8, lora, c) == 32 * (2 * 91 + 113) + 32 * 7 * (2 * 13 + 22) + 1
    # fixed time: 8 micro-batches x (their operations' dispatch + the Trainer's own), and once per step the clipping
    # and update of the LoRA parameters as streams at the A100's bandwidth (2,039 GB/s x BANDWIDTH_SHARE) plus a
    # launch per tensor and the Trainer's own step
    lora_params = lora_param_count(LLAMA8, 16, ("all-linear",))
    update = lora_params * (12 + 72) / (2039e9 * speed.BANDWIDTH_SHARE) + 2 * 7 * 32 * speed.PER_TENSOR_S + 0.001
    assert speed.step_update_time(LLAMA8, lora, c, g) == pytest.approx(update)
    dispatch = 8 * speed.ops_per_micro_batch(LLAMA8, lora, c) * speed.PER_OP_S
    assert sp.dispatch_time_s == pytest.approx(dispatch)
    assert sp.overhead_time_s == pytest.approx(dispatch + 8 * 0.0002 + update)
    # without checkpointing the forward is dispatched once; full fine-tuning's backward computes every weight's
    # gradient and has no adapters; eager attention dispatches its softmax and masking as operations of their own
    plain = Candidate(micro_batch=1, grad_accum=8)
    assert speed.ops_per_micro_batch(LLAMA8, lora, plain) == 32 * (91 + 113) + 32 * 7 * (13 + 22) + 1
    full = Workload("m", seq_len=256, mode="full")
    assert speed.ops_per_micro_batch(LLAMA8, full, plain) == 32 * (91 + 162) + 72
    eager = Candidate(micro_batch=1, grad_accum=8, attn="eager")
    assert speed.ops_per_micro_batch(LLAMA8, full, eager) == 32 * (116 + 187) + 95
    # an fp32 step runs no autocast, so none of its casts
    fp32 = Candidate(micro_batch=1, grad_accum=8, precision="fp32")
    assert speed.ops_per_micro_batch(LLAMA8, full, fp32) == 32 * (77 + 142) + 66
    # a short step is mostly dispatch, and it follows the model's depth, not a constant: one micro-batch of a 3B
    # LoRA at 210 tokens x 4 on an L40S (PEFT's published runs: 0.117 s a step) within 0.6-1.6 of it, and GPT-2
    # 124M at 128 tokens x 4 on an RTX 3090 in fp32 (a transformers issue's runs: 0.049 s) too
    llama3b = arch_from_config(cfg("llama-3.2-3b"))
    short = predict_speed(llama3b, Workload("m", seq_len=210, mode="lora", lora_r=32, lora_targets=("q_proj", "v_proj")),
                          Candidate(micro_batch=4, grad_accum=1, attn="sdpa", optim="adamw_torch"), find_gpu("L40S"))
    assert 0.117 / 1.6 < short.step_time_s < 0.117 / 0.6
    gpt2 = arch_from_config(cfg("gpt2"))
    tiny = predict_speed(gpt2, Workload("m", seq_len=128, mode="full"),
                         Candidate(micro_batch=4, precision="fp32", attn="eager", optim="adamw_torch"), find_gpu("RTX-3090"))
    assert 0.049 / 1.6 < tiny.step_time_s < 0.049 / 0.6
    assert tiny.dispatch_time_s < short.dispatch_time_s / 2
    # full fine-tuning's update is memory-bound: fused AdamW moves 28 B per parameter, foreach 72, 8-bit 16
    full = Workload("m", seq_len=2048, mode="full")
    t = {o: speed.step_update_time(LLAMA8, full, Candidate(optim=o), g) for o in ("adamw_torch_fused", "adamw_torch", "adamw_8bit")}
    assert t["adamw_8bit"] < t["adamw_torch_fused"] < t["adamw_torch"]
    per_step = (32 * 11 + 3) * speed.PER_TENSOR_S + speed.TRAINER_STEP_S  # a launch per tensor, the Trainer's step
    assert t["adamw_torch_fused"] == pytest.approx(LLAMA8.params_total * 40 / (2039e9 * 0.8) + per_step)
    # a GPU with a slower memory pays more for it; one without a bandwidth in the catalog gets OPTIMIZER_BYTES_PER_S
    assert speed.step_update_time(LLAMA8, full, Candidate(), find_gpu("A10G")) > speed.step_update_time(LLAMA8, full, Candidate(), g)
    import dataclasses

    nobw = dataclasses.replace(g, memory_bandwidth_gbs=None)
    assert speed.step_update_time(LLAMA8, full, Candidate(optim="adamw_torch_fused"), nobw) == pytest.approx(
        LLAMA8.params_total * 40 / speed.OPTIMIZER_BYTES_PER_S + per_step)
    assert predict_step_time(LLAMA8, lora, c, g) == sp.step_time_s
    # short sequences are overhead-bound: tokens/s rises with the sequence length at a fixed batch
    long = predict_speed(LLAMA8, Workload("m", seq_len=4096, mode="lora", lora_targets=("all-linear",)), c, g)
    assert long.tokens_per_s > 2 * sp.tokens_per_s
    # QLoRA pays to dequantize every pass, more with checkpointing (3 passes) than without (2)
    q = Workload("m", seq_len=1024, mode="qlora", lora_targets=("all-linear",))
    qs = predict_speed(LLAMA8, q, c, g)
    # a stream at the A100's bandwidth: 20.5 B a weight a pass at 2,039 GB/s x 0.8
    assert qs.dequant_time_s == pytest.approx(8 * 3 * LLAMA8.params_linear_total * 20.5 / (2039e9 * 0.8))
    assert predict_speed(LLAMA8, q, c, g, quant="gptq").dequant_time_s < qs.dequant_time_s
    # a stream: the A10G's 600 GB/s pays 2,039 / 600 times what the A100 pays
    assert predict_speed(LLAMA8, q, c, find_gpu("A10G")).dequant_time_s == pytest.approx(qs.dequant_time_s * 2039 / 600)
    with pytest.raises(SpecError, match="quant must be one of nf4, gptq"):
        predict_speed(LLAMA8, q, c, g, quant="awq")
    # FlashAttention's causal kernel counts half the attention FLOPs; eager the full s x s products
    fa = predict_speed(LLAMA8, Workload("m", seq_len=8192), Candidate(attn="flash_attention_2"), g)
    eg = predict_speed(LLAMA8, Workload("m", seq_len=8192), Candidate(attn="eager"), g)
    assert eg.compute_time_s > fa.compute_time_s / speed.ATTN_FACTOR["eager"] * 0.999


# ---------------------------------------------------------------- catalog


def test_reserved_with_variable_length_batches() -> None:
    """The default allocator's reserve grows with variable-length batches (benchmarks/allocator_replay.py):
    VARLEN_RESERVE_GROWTH x the transient part (the dynamic part less what the forward saves for the backward: the
    activations and autocast's weight copies) on top of allocated; the fit test keeps the fixed-length reserve."""
    from autotune.estimate import memory

    wl = Workload("m", seq_len=4096, mode="lora", lora_targets=("all-linear",))
    br = estimate_memory(LLAMA8, wl, Candidate(micro_batch=2, grad_ckpt=True))
    static = sum(br.terms.get(k, 0) for k in memory.STATIC_TERMS)
    transient = br.allocated - static - br.terms.get("activations", 0)  # the saved activations do not fragment
    assert "weight_copies" not in br.terms
    assert br.reserved_variable_lengths == br.allocated + int(memory.VARLEN_RESERVE_GROWTH * transient)
    assert br.reserved_variable_lengths > br.reserved > br.allocated
    assert br.to_dict()["reserved_variable_lengths"] == br.reserved_variable_lengths
    # without checkpointing the saved activations (and the adapters' 16-bit copies) are several times larger, and
    # add nothing to the growth (the replay: 18.2 GiB with checkpointing, 19.3 without, for Qwen2.5-7B LoRA at 2,048
    # tokens)
    nockpt = estimate_memory(LLAMA8, wl, Candidate(micro_batch=2))
    assert nockpt.terms["activations"] > 5 * br.terms["activations"] and nockpt.terms["weight_copies"] > 0
    assert nockpt.reserved_variable_lengths - nockpt.allocated <= br.reserved_variable_lengths - br.allocated
    # never under the fixed-length reserved figure (the longest batch alone reaches it), even where the transients
    # are small beside the saved activations (QLoRA without checkpointing on an H100)
    q = estimate_memory(LLAMA8, Workload("m", seq_len=2048, mode="qlora"),
                        Candidate(micro_batch=8, attn="flash_attention_2", liger=True))
    kept = sum(q.terms.get(k, 0) for k in (*memory.STATIC_TERMS, *memory.SAVED_FOR_BACKWARD_TERMS))
    assert q.allocated + memory.VARLEN_RESERVE_GROWTH * (q.allocated - kept) < q.reserved  # the case in question
    assert q.reserved_variable_lengths == q.reserved


def test_a_tied_embeddings_last_gradient_sits_beside_all_the_others() -> None:
    """Full fine-tuning with tied embeddings: the embedding's gradient is computed last, with every other gradient
    live, then added into the lm_head's (the meta trace of Llama-3.2-1B: the estimate was 0.90x it without this)."""
    full, fused = Workload("m", seq_len=2048, mode="full"), Candidate(optim="adamw_torch_fused", grad_ckpt=True)
    tied = estimate_memory(LLAMA1B, full, fused)
    assert LLAMA1B.tied and tied.phase == "optimizer_step"
    assert tied.terms["tied_embedding_grad"] == 4 * LLAMA1B.vocab * LLAMA1B.hidden
    assert "tied_embedding_grad" not in estimate_memory(LLAMA8, full, fused).terms  # untied: nothing extra
    # foreach AdamW's fp32 temporary (larger, and not live at the same moment) covers it
    step = estimate_memory(LLAMA1B, full, replace(fused, optim="adamw_torch")).phase_terms["optimizer_step"]
    assert "tied_embedding_grad" not in step and step["optimizer_temp"] > 4 * LLAMA1B.vocab * LLAMA1B.hidden


def test_trls_fused_head_replaces_the_logits_term() -> None:
    """TRL's SFTTrainer (trainer="trl") never materialises the logits: its tiles, the hidden states' fp32 gradient
    and per-token statistics instead of 12-14 B per logit; on a CPU its torch-op kernels add fp32 temporaries per
    tile element; an fp32 head is cast a vocabulary chunk at a time (no whole 16-bit copy)."""
    from autotune.estimate import memory

    wl = Workload("m", seq_len=4096, mode="lora", lora_targets=("all-linear",), trainer="trl")
    c = Candidate(micro_batch=2, grad_ckpt=True)
    trl = estimate_memory(LLAMA8, wl, c)
    hf = estimate_memory(LLAMA8, replace(wl, trainer="hf"), c)
    tokens, h = 2 * 4096, LLAMA8.hidden
    tile = memory.TRL_TOKEN_CHUNK * memory.TRL_VOCAB_CHUNK
    assert memory.trl_head_bytes(LLAMA8, tokens, wb=2, cb=2, head_trained=False, device="cuda") == (
        tile * 2 + tokens * (h * 6 + memory.TRL_PER_TOKEN_BYTES))
    assert memory.trl_head_bytes(LLAMA8, tokens, wb=2, cb=2, head_trained=False, device="cpu") == (
        tile * (2 + memory.TRL_TILE_TEMP_BYTES) + tokens * (h * 6 + memory.TRL_PER_TOKEN_BYTES))
    assert hf.terms["logits_loss"] > 20 * memory.trl_head_bytes(LLAMA8, tokens, wb=2, cb=2, head_trained=False,
                                                                 device="cuda")
    # story 1 on an A10G: without Liger, LoRA at micro-batch 2 fits under TRL as it does with Liger's loss
    liger = estimate_memory(LLAMA8, replace(wl, trainer="hf"), replace(c, liger=True))
    assert trl.total < find_gpu("A10G").memory_bytes < hf.total
    assert abs(trl.total - liger.total) < 0.05 * liger.total
    # full fine-tuning with checkpointing: no whole 16-bit copy of the fp32 head, and the head's fp32 gradient is
    # live with the tiles
    full = Workload("m", seq_len=2048, mode="full")
    ckpt = Candidate(grad_ckpt=True, optim="adamw_torch_fused")
    assert "weight_copies" not in estimate_memory(LLAMA1B, replace(full, trainer="trl"), ckpt).terms
    assert estimate_memory(LLAMA1B, full, ckpt).phase_terms["backward_start"]["weight_copies"] > 0
    # speed: the head's logit tiles are computed again in TRL's backward, 2 x vocabulary x hidden FLOPs a token
    g = find_gpu("A10G")
    hf_s, trl_s = predict_speed(LLAMA8, replace(wl, trainer="hf"), c, g), predict_speed(LLAMA8, wl, c, g)
    # (about 2 % of story 1's step: 2 x 128,256 x 4,096 = 1.05 GFLOPs a token against 54 with checkpointing)
    assert trl_s.compute_time_s > hf_s.compute_time_s and trl_s.dispatch_time_s == hf_s.dispatch_time_s
    assert 0.95 < trl_s.tokens_per_s / hf_s.tokens_per_s < 0.99


def test_builtin_catalog() -> None:
    names = {g.name for g in builtin_catalog()}
    for n in ("T4", "L4", "A10G", "RTX-4090", "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200",
              "MI300X"):  # fmt: skip
        assert n in names
    for g in builtin_catalog():
        assert g.price_date == "2026-11-30" and g.price_source
        assert g.flash_attention_2 == (g.vendor == "amd" or float(g.compute_capability or 0) >= 8.0)
    t4 = find_gpu("t4")
    assert not t4.bf16 and not t4.flash_attention_2 and t4.half_precision == "fp16"
    assert find_gpu("a100_80gb").name == find_gpu("A100-SXM4-80GB").name == "A100-80GB"
    assert find_gpu("rtx 4090").name == "RTX-4090"
    # every built-in GPU has its data sheet's memory bandwidth (the optimizer update and clipping are priced by it)
    assert all(g.memory_bandwidth_gbs for g in builtin_catalog())
    assert find_gpu("H100-SXM").memory_bandwidth_gbs == 3350 and find_gpu("A10G").memory_bandwidth_gbs == 600


def test_unknown_gpu_lists_names() -> None:
    with pytest.raises(SpecError, match="unknown GPU 'V100'; known: T4, L4"):
        find_gpu("V100")
    with pytest.raises(SpecError, match="'V100', 'K80'"):
        find_gpus("V100,A10G,K80")


def test_catalog_validation_reports_every_problem() -> None:
    bad = {
        "gpus": [
            {"name": "X1", "memory": "lots", "fp16_tflops": -1, "fp32_tflops": 10, "bf16": "yes",
             "flash_attention_2": True, "price_per_hour_usd": 1.0, "colour": "red"},
            {"name": "X2", "memory": "24GB", "fp16_tflops": 100, "fp32_tflops": 10, "bf16": True,
             "flash_attention_2": False},
        ]
    }  # fmt: skip
    with pytest.raises(SpecError) as e:
        parse_catalog(bad, source="mine.yaml")
    msg = str(e.value)
    for part in ("X1: unknown field(s) colour", "X1: memory 'lots'", "fp16_tflops must be a positive number",
                 "bf16 must be true or false", "X2: missing field(s) price_per_hour_usd"):  # fmt: skip
        assert part in msg, msg
    assert len(e.value.problems) >= 5
    # a number without its unit is bytes: 0, -1 or a bare 24 is refused, not a GPU of 24 bytes
    for memory in (0, -1, 24):
        entry = {**bad["gpus"][1], "memory": memory, "price_per_hour_usd": None}
        with pytest.raises(SpecError, match="give it with its unit"):
            parse_catalog({"gpus": [entry]}, source="mine.yaml")


def test_user_catalog_extends_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text(
        "gpus:\n"
        "  - {name: V100, aliases: [V100-32GB], memory: 32GB, fp16_tflops: 125, fp32_tflops: 15.7, bf16: false,\n"
        "     flash_attention_2: false, price_per_hour_usd: 0.5}\n"
        "  - {name: T4, memory: 15360MiB, fp16_tflops: 65, fp32_tflops: 8.1, bf16: false,\n"
        "     flash_attention_2: false, price_per_hour_usd: 0.11}\n"
    )
    cat = load_catalog(f)
    assert find_gpu("v100-32gb", cat).memory_bytes == 32 * 10**9
    assert find_gpu("T4", cat).price_per_hour_usd == 0.11
    assert catalog_paths_from_env({"AUTOTUNE_GPU_CATALOG": str(f)}) == [str(f)]
    assert catalog_paths_from_env({}) == []
    with pytest.raises(SpecError, match="cannot read GPU catalog"):
        load_catalog(tmp_path / "missing.yaml")


def test_a_user_entry_takes_the_spellings_it_uses_and_a_repeated_one_is_refused(tmp_path: Path) -> None:
    entry = ("  - {{name: {name}, memory: 40GB, fp16_tflops: 312, fp32_tflops: 19.5, bf16: true, bf16_tflops: 312,\n"
             "     flash_attention_2: true, price_per_hour_usd: 0.5{extra}}}\n")
    f = tmp_path / "mine.yaml"
    # 'A100' is the built-in A100-80GB's alias: --gpu A100 found that 80 GB card, not the user's 40 GB one
    f.write_text("gpus:\n" + entry.format(name="A100", extra=""))
    cat = load_catalog(f)
    assert find_gpu("A100", cat).memory_bytes == 40 * 10**9
    assert find_gpu("A100-80GB", cat).memory_bytes > 79 * 2**30 and "A100" not in find_gpu("A100-80GB", cat).aliases
    f.write_text("gpus:\n" + entry.format(name="Mine", extra=", aliases: [H100]"))
    assert find_gpu("H100", load_catalog(f)).name == "Mine"
    f.write_text("gpus:\n" + entry.format(name="Mine", extra=", aliases: [H100-SXM]"))
    with pytest.raises(SpecError, match="alias 'H100-SXM' is the name of another GPU.*the name 'H100-SXM'"):
        load_catalog(f)
    # a copy-paste twice: the last entry, or the last of a repeated key, had won without a word
    f.write_text("gpus:\n" + entry.format(name="X", extra="") + entry.format(name="X", extra=""))
    with pytest.raises(SpecError, match="'X' is defined twice in this file"):
        load_catalog(f)
    f.write_text("gpus:\n  - name: X\n    memory: 24GB\n    memory: 80GB\n")
    with pytest.raises(SpecError, match=r"key 'memory' is set 2 times \(lines 3, 4\); keep one"):
        load_catalog(f)


# ---------------------------------------------------------------- plan


def test_story4_qwen7b_full_needs_zero_over_8_gpus() -> None:
    r = plan(cfg("qwen2.5-7b"), gpus=find_gpus("A100-80GB,H100-SXM"), mode="full", tokens=parse_tokens("2B"))
    for row in r.rows:
        assert row.fits and row.option is not None
        c = row.option.candidate
        assert c.zero_stage >= 1 and c.world_size == 8
        assert row.option.memory.total <= row.capacity_bytes * (1 - HEADROOM)
        assert c.micro_batch * c.grad_accum * c.world_size == 64
        assert row.hours and row.hours > 0 and row.cost_usd
        assert row.cost_usd == pytest.approx(row.hours * 8 * row.gpu.price_per_hour_usd)
        assert row.option.speed.mfu and 0.05 < row.option.speed.mfu < 0.7
    # full fine-tuning of 7.6B params on one GPU with AdamW and neither sharding nor offload cannot fit
    # (16 B/param); the plan finds offload or a smaller optimizer state (Adafactor: ~8 B/param)
    solo = plan(cfg("qwen2.5-7b"), gpus=[find_gpu("A100-80GB")], gpus_per_node=1)
    o = solo.rows[0].option
    assert (
        o is None
        or o.candidate.offload != "none"
        or o.candidate.optim not in ("adamw_torch", "adamw_torch_fused")
    )
    pinned = plan(cfg("qwen2.5-7b"), gpus=[find_gpu("A100-80GB")], gpus_per_node=1,
                  pin={"optim": "adamw_torch_fused", "offload": "none"})  # fmt: skip
    assert pinned.rows[0].option is None or pinned.rows[0].option.mode != "full"
    d = r.to_dict()
    json.dumps(d)
    assert d["gpus"][0]["option"]["candidate"]["world_size"] == 8


# Llama-3.1-70B's published config.json (meta-llama/Llama-3.1-70B), the keys the planner reads
LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
             "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": False, "head_dim": 128,
             "torch_dtype": "bfloat16", "hidden_act": "silu"}  # fmt: skip


def test_70b_lora_on_eight_h100s_is_sharded_with_zero3_not_sent_to_qlora() -> None:
    """A 70B base in bf16 (141 GB) fills a 80 GB card whole; ZeRO-3 shards it over the 8 GPUs, so LoRA fits
    (the plan once considered ZeRO only for full fine-tuning and answered "use QLoRA", which is slower)."""
    r = plan(LLAMA_70B, gpus=[find_gpu("H100-SXM")], gpus_per_node=8, seq_len=4096, effective_batch=32, mode="lora")
    o = r.rows[0].option
    assert r.rows[0].fits and o is not None and o.mode == "lora", r.rows[0]
    assert o.candidate.zero_stage == 3 and o.candidate.world_size == 8
    assert o.memory.total < 80e9
    qlora = plan(LLAMA_70B, gpus=[find_gpu("H100-SXM")], gpus_per_node=8, seq_len=4096, effective_batch=32,
                 mode="qlora").rows[0].option
    assert qlora is not None and o.speed.tokens_per_s > qlora.speed.tokens_per_s
    # one GPU per node: nothing to shard over, so LoRA does not fit a 70B base
    solo = plan(LLAMA_70B, gpus=[find_gpu("H100-SXM")], gpus_per_node=1, seq_len=4096, effective_batch=32, mode="lora")
    assert solo.rows[0].option is None or solo.rows[0].option.mode != "lora"


def test_story1_llama8b_lora_seq4096_fits_a10g_with_checkpointing() -> None:
    r = plan(cfg("llama-3.1-8b"), gpus=[find_gpu("A10G")], gpus_per_node=1, seq_len=4096, mode="lora")
    row = r.rows[0]
    assert row.fits and row.option is not None and row.option.mode == "lora"
    assert row.option.candidate.grad_ckpt and "checkpointing" in row.option.levers
    # without checkpointing it does not fit even at micro-batch 1
    no_ck = estimate_memory(
        LLAMA8, Workload("m", seq_len=4096, mode="lora"),
        Candidate(grad_ckpt=False, liger=True, attn="flash_attention_2"), gpu=find_gpu("A10G"),
    )  # fmt: skip
    assert no_ck.total > row.usable_bytes


def test_story2_t4_suggests_qlora_and_never_bf16_or_fa2() -> None:
    t4 = find_gpu("T4")
    r = plan(cfg("llama-3.1-8b"), gpus=[t4], gpus_per_node=1, mode="lora")
    row = r.rows[0]
    assert not row.fits and row.option is not None and row.option.mode == "qlora"
    assert "qlora" in row.note
    for mode in ("full", "lora", "qlora"):
        for rr in plan(cfg("mistral-7b"), gpus=[t4], gpus_per_node=2, mode=mode, seq_len=1024).rows:
            if rr.option:
                assert rr.option.candidate.precision == "fp16"
                assert rr.option.candidate.attn != "flash_attention_2"


def test_plan_small_model_fits_everywhere_and_validates() -> None:
    r = plan(cfg("smollm2-135m"), gpus=builtin_catalog(), gpus_per_node=1, seq_len=1024, tokens=10**8)
    assert all(row.fits for row in r.rows)
    with pytest.raises(SpecError, match="mode must be one of") as e:
        plan(cfg("gpt2"), gpus=[find_gpu("L4")], mode="dora", seq_len=0)
    assert "seq_len must be a positive integer" in str(e.value)
    # learned positions stop at 1024: refused, with the fix; RoPE models extend, with a note
    with pytest.raises(SpecError, match="learned positions.*max_position_embeddings 1024.*--seq-len 1024"):
        plan(cfg("gpt2"), gpus=[find_gpu("L4")], seq_len=4096)
    rope = plan(cfg("qwen2.5-0.5b"), gpus=[find_gpu("L4")], seq_len=65536, mode="lora", effective_batch=8)
    assert any("max_position_embeddings" in n and "RoPE" in n for n in rope.notes)


@pytest.mark.parametrize(("text", "n"), [("1B", 10**9), ("500M", 5 * 10**8), ("2e9", 2 * 10**9), ("1.5b", 1_500_000_000),
                                         ("250k", 250_000), ("1_000", 1000), (42, 42), ("3T", 3 * 10**12)])  # fmt: skip
def test_parse_tokens(text: str, n: int) -> None:
    assert parse_tokens(text) == n


@pytest.mark.parametrize("text", ["", "1Q", "-5M", "B", "1e999", "0", "abc", "1.9"])  # 1.9: was read as 2
def test_parse_tokens_rejects(text: str) -> None:
    with pytest.raises(SpecError, match="tokens"):
        parse_tokens(text)
    if text == "1e999":  # infinite: said so, not "at least 1"
        with pytest.raises(SpecError, match="finite"):
            parse_tokens(text)


def test_the_catalog_holds_the_gpus_users_rent_each_with_its_data_sheet() -> None:
    from pathlib import Path as _Path

    import autotune.estimate as est

    names = {g.name for g in est.load_catalog()}
    assert {"L4", "L40S", "A10G", "RTX-3090", "RTX-4090", "RTX-A6000", "A40", "A100-80GB", "H100-SXM", "H200",
            "H20", "B200", "MI300X"} <= names
    assert est.find_gpu("h20").name == "H20" and est.find_gpu("H200").name == "H200"
    for alias, name in (("A6000", "RTX-A6000"), ("3090", "RTX-3090"), ("l40s", "L40S")):
        assert est.find_gpu(alias).name == name
    l40s, a40 = est.find_gpu("L40S"), est.find_gpu("A40")
    assert l40s.peak_flops("bf16") == pytest.approx(362.05e12) and a40.peak_flops("bf16") == pytest.approx(149.7e12)
    text = (_Path(est.__file__).parent / "gpus.yaml").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(text):
        if line.startswith("  - name:"):
            assert text[i - 1].lstrip().startswith("#"), f"{line.strip()}: no source comment above the entry"



def test_operation_counts_are_what_transformers_dispatches() -> None:
    """OPS_PER_STEP is measured, not chosen: benchmarks/op_counts.py counts the aten operations of one training step
    (bf16 autocast or fp32, forward with labels and backward) of small Llama and GPT-2 models and LoRA on them; a
    transformers or torch upgrade that changes the modeling code changes the count and fails here (rerun the script
    and copy its table)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("op_counts", Path(__file__).parents[1] / "benchmarks" / "op_counts.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for attn, family, autocast in (("sdpa", "llama", True), ("eager", "gpt2", True), ("sdpa", "gpt2", False)):
        key = attn if autocast else f"{attn} fp32"
        assert mod.family_counts(family, attn, autocast=autocast) == speed.OPS_PER_STEP[key][family], key


def test_collectives_over_pcie_are_priced_and_nvlink_keeps_its_factor() -> None:
    """Over PCIe (a catalog GPU with interconnect_gbs) the step pays what its collectives expose beyond the factor per
    ZeRO stage every multi-GPU step pays, so a PCIe card is never faster than the same card on NVLink. ZeRO-3 gathers
    the parameters every micro-batch; DDP all-reduces fp32 gradients once a step."""
    from autotune.estimate import speed

    a10g, h100, rtx = (find_gpu(n) for n in ("A10G", "H100-SXM", "RTX-4090"))
    assert (a10g.interconnect_gbs, rtx.interconnect_gbs, h100.interconnect_gbs) == (22, 15, None)
    w = Workload("m", seq_len=512, mode="full")
    ddp = Candidate(micro_batch=1, grad_accum=4, world_size=4, precision="bf16")
    z3 = replace(ddp, zero_stage=3)
    nvlinked = replace(a10g, interconnect_gbs=None)
    for c in (ddp, z3):
        pcie, nvl = predict_speed(LLAMA8, w, c, a10g), predict_speed(LLAMA8, w, c, nvlinked)
        assert nvl.comm_time_s == 0.0 and pcie.comm_time_s > 0 and pcie.tokens_per_s < nvl.tokens_per_s
    # DDP: 2 x 3/4 of 8B fp32 gradients at 22 GB/s, less half of the last micro-batch and less the factor's charge
    est = predict_speed(LLAMA8, w, ddp, a10g)
    mb = est.compute_time_s / ddp.grad_accum
    per_mb = (est.step_time_s - est.comm_time_s - speed.step_update_time(LLAMA8, w, ddp, a10g)) / ddp.grad_accum
    charged = est.compute_time_s * (1 / speed.SCALING_FACTOR[0] - 1)
    expected = 2 * 0.75 * LLAMA8.params_total * 4 / 22e9 - speed.COMM_OVERLAP * per_mb - charged
    assert mb > 0 and est.comm_time_s == pytest.approx(expected, rel=0.02)
    # a large micro-batch hides what it gathers: no more than the factor's charge
    big = predict_speed(LLAMA8, Workload("m", seq_len=4096, mode="full"), replace(z3, micro_batch=4, grad_accum=1,
                                                                                 world_size=8), rtx)
    assert big.comm_time_s == 0.0


def test_a_catalog_number_yaml_read_as_text_says_how_to_write_it() -> None:
    entry = {"name": "X", "memory": "24GB", "fp16_tflops": "1e2", "fp32_tflops": 10, "bf16": False,
             "flash_attention_2": False, "price_per_hour_usd": 1}
    with pytest.raises(SpecError, match=r"got '1e2' \(YAML reads an exponent without a dot or a sign as text: "
                                         r"write 1\.0e\+2\)"):
        parse_catalog({"gpus": [entry]})
    # the spelling given is one YAML reads as the number (1.0e2, the hint's first version, is text to YAML too)
    assert yaml.safe_load("x: 1.0e+2")["x"] == 100.0 and yaml.safe_load("x: 1.0e2")["x"] == "1.0e2"
    entry["fp16_tflops"] = "24"  # a quoted number without an exponent: no such hint
    with pytest.raises(SpecError) as info:
        parse_catalog({"gpus": [entry]})
    assert "got '24'" in str(info.value) and "exponent" not in str(info.value)


def test_unpacked_rows_are_sized_at_the_longest_sequence_the_lengths_can_have() -> None:
    """Rows are padded to the longest sequence of their batch: data that never reaches --seq-len never makes a
    seq_len row (the probe's worst-case batch does not either). Sized at seq_len, a plan for 100-token rows under
    the default 2,048 turned checkpointing on and halved the micro-batch (2,985 against 4,329 tok/s)."""
    c = cfg("llama-3.2-1b")
    arch = arch_from_config(c)
    wl = Workload("m", seq_len=2048, lengths="uniform:32-512")
    at_512 = estimate_memory(arch, Workload("m", seq_len=512), Candidate(micro_batch=8)).total
    assert estimate_memory(arch, wl, Candidate(micro_batch=8)).total == at_512
    packed = estimate_memory(arch, wl, Candidate(micro_batch=8, packing=True)).total  # packed rows fill seq_len
    assert packed == estimate_memory(arch, Workload("m", seq_len=2048), Candidate(micro_batch=8, packing=True)).total
    assert packed > at_512
    # lognormal has no longest length: seq_len stays the worst case
    assert estimate_memory(arch, Workload("m", seq_len=2048, lengths="lognormal:4,1"), Candidate(micro_batch=8)).total \
        == estimate_memory(arch, Workload("m", seq_len=2048), Candidate(micro_batch=8)).total


def test_zero_is_planned_where_it_fits_what_ddp_does_not_or_clearly_wins() -> None:
    # a 135M LoRA fits 10x over on each of 8 GPUs: ZeRO-3 was picked for a predicted 0.6 % over DDP
    r = plan(cfg("smollm2-135m"), gpus=find_gpus("A100-40GB"), gpus_per_node=8, seq_len=512, effective_batch=32,
             mode="lora").rows[0]
    assert r.option is not None and r.option.candidate.world_size == 8 and r.option.candidate.zero_stage == 0
    pinned = plan(cfg("smollm2-135m"), gpus=find_gpus("A100-40GB"), gpus_per_node=8, seq_len=512, effective_batch=32,
                  mode="lora", pin={"zero_stage": 3}).rows[0]
    assert pinned.option is not None and pinned.option.candidate.zero_stage == 3  # pinned: kept


def test_a_gpu_count_of_the_node_that_divides_the_batch_is_tried_not_only_powers_of_two() -> None:
    r = plan(cfg("llama-3.2-1b"), gpus=find_gpus("H100-SXM"), gpus_per_node=8, effective_batch=12).rows[0]
    assert r.option is not None and r.option.candidate.world_size == 6  # 4 was the most before
