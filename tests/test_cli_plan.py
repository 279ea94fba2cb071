"""``autotune plan`` end to end: table, --json, every flag, errors, and no torch import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.cli.plan import PlanQuery, PlanSources, gather, render

runner = CliRunner()


def run(*args: str):  # noqa: ANN201
    return runner.invoke(app, ["plan", *args])


def test_table_output() -> None:
    r = run("--model", "qwen2.5-7b", "--gpu", "A100-80GB,H100-SXM", "--tokens", "2B")
    assert r.exit_code == 0, r.output
    for part in ("A100-80GB", "H100-SXM", "ZeRO", "tok/s", "MFU", "2026-11-30"):
        assert part in r.output


def test_json_parses_and_carries_every_flag() -> None:
    r = run("--model", "llama-3.1-8b", "--gpu", "a10g,T4", "--gpus-per-node", "1", "--seq-len", "4096",
            "--effective-batch", "32", "--mode", "lora", "--tokens", "500M", "--lora-r", "8", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["mode"] == "lora" and d["seq_len"] == 4096 and d["effective_batch"] == 32
    assert d["gpus_per_node"] == 1 and d["tokens"] == 500_000_000
    a10g, t4 = d["gpus"]
    assert a10g["gpu"] == "A10G" and a10g["fits"] and "LoRA r=8" in a10g["option"]["levers"]
    assert a10g["option"]["candidate"]["grad_ckpt"] is True
    assert t4["fits"] is False and t4["mode"] == "qlora"
    assert t4["option"]["candidate"]["precision"] == "fp16"
    for g in d["gpus"]:
        c = g["option"]["candidate"]
        assert c["micro_batch"] * c["grad_accum"] * c["world_size"] == 32
        assert g["hours"] > 0 and g["cost_usd"] > 0
        # reserved and allocated as torch counts them: the total less the context, less the allocator's reserve
        m = g["option"]["memory"]
        assert m["reserved"] == m["total"] - m["terms"]["cuda_context"] > 0
        assert m["allocated"] == m["reserved"] - m["terms"]["allocator_reserve"] > 0


def test_catalog_flag_and_env(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    f = tmp_path / "mine.yaml"
    f.write_text(
        "gpus:\n  - {name: V100, memory: 32GB, fp16_tflops: 125, fp32_tflops: 15.7, bf16: false,\n"
        "     flash_attention_2: false, price_per_hour_usd: 0.5}\n"
    )
    r = run("--model", "gpt2", "--gpu", "V100", "--catalog", str(f), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["gpus"][0]["gpu"] == "V100"
    monkeypatch.delenv("AUTOTUNE_GPU_CATALOG", raising=False)
    assert run("--model", "gpt2", "--gpu", "V100").exit_code == 2
    monkeypatch.setenv("AUTOTUNE_GPU_CATALOG", str(f))
    assert run("--model", "gpt2", "--gpu", "V100").exit_code == 0


def _one_line_error(r) -> str:  # noqa: ANN001
    assert r.exit_code == 2, r.output
    err = r.stderr if r.stderr_bytes is not None else r.output
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("autotune: error:")
    return lines[0]


def test_bad_tokens_gpu_mode_model_exit_2_with_one_line() -> None:
    assert "--tokens" in _one_line_error(run("--model", "gpt2", "--tokens", "lots"))
    line = _one_line_error(run("--model", "gpt2", "--gpu", "V100,A10G"))
    assert "unknown GPU(s) 'V100'" in line and "H100-SXM" in line
    assert "--mode" in _one_line_error(run("--model", "gpt2", "--mode", "dora"))
    assert "--seq-len" in _one_line_error(run("--model", "gpt2", "--seq-len", "0"))
    assert "--seq-len must be an integer >= 8" in _one_line_error(run("--model", "gpt2", "--seq-len", "1"))
    _one_line_error(run("--model", "no-such-model-anywhere"))
    # a pinned GPU count is named as the flag it came from, and a pin that cannot act is refused, not kept
    assert "--world-size must be an integer >= 1" in _one_line_error(run("--model", "gpt2", "--world-size", "-1"))
    line = _one_line_error(run("--model", "gpt2", "--ckpt-every", "2", "--no-grad-ckpt"))
    assert "ckpt_every 2 acts only with grad_ckpt" in line
    assert "zipf" in _one_line_error(run("--model", "gpt2", "--lengths", "zipf:1"))
    # LoRA target names that match no linear of the model would plan (and measure) all-linear instead: refused,
    # with the model's names; the default attn on GPT-2 (c_attn, c_proj) still falls back as the probe does
    line = _one_line_error(run("--model", "llama-3.1-8b", "--mode", "lora", "--lora-targets", "bogus_proj"))
    assert "match no linear layer" in line and "q_proj" in line
    assert run("--model", "llama-3.1-8b", "--mode", "lora", "--lora-targets", "q_proj,bogus").exit_code == 0
    assert run("--model", "gpt2", "--mode", "lora").exit_code == 0


def test_variable_lengths_count_padding_and_search_packing() -> None:
    common = ("--model", "llama-3.2-1b", "--gpu", "H100-SXM", "--gpus-per-node", "1", "--seq-len", "2048",
              "--effective-batch", "32", "--mode", "lora", "--json")
    fixed = json.loads(run(*common).output)["gpus"][0]["option"]
    chat = json.loads(run(*common, "--lengths", "lognormal:5.0,1.0").output)
    assert chat["lengths"] == "lognormal:5.0,1.0" and fixed["candidate"]["packing"] is False  # nothing to pack
    packed = chat["gpus"][0]["option"]
    assert packed["candidate"]["packing"] is True and "packing" in packed["levers"]
    padded = json.loads(run(*common, "--lengths", "lognormal:5.0,1.0", "--no-packing").output)["gpus"][0]["option"]
    assert padded["candidate"]["packing"] is False
    # the best padded configuration computes its padding: fewer real tokens per second than packed
    assert padded["speed"]["tokens_per_s"] < packed["speed"]["tokens_per_s"]


def test_gather_then_render() -> None:
    query = PlanQuery(model="gpt2", gpu="T4", gpus_per_node=1, seq_len=512, tokens="1e8")
    res = gather(query, PlanSources(environ={}))
    text = render(res)
    assert "T4" in text and "fp16, sdpa" in text
    assert res.rows[0].fits and res.tokens == 100_000_000


def test_plan_does_not_import_torch() -> None:
    code = (
        "import sys; from autotune.cli.app import main; sys.argv=['autotune','plan','--model','llama-3.1-8b',"
        "'--json']\ntry:\n main()\nexcept SystemExit: pass\n"
        "bad=[m for m in ('torch','transformers','ray','pynvml') if m in sys.modules]\n"
        "sys.stderr.write('LOADED:'+','.join(bad))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "LOADED:" in p.stderr and p.stderr.strip().endswith("LOADED:"), p.stderr
    json.loads(p.stdout)


def test_pinned_flags_are_not_searched_and_show_in_json() -> None:
    r = run("--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--micro-batch", "2", "--grad-ckpt", "--zero-stage", "3",
            "--world-size", "4", "--offload", "optimizer", "--optim", "adamw_torch_fused", "--precision", "bf16",
            "--attn", "sdpa", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    c = d["gpus"][0]["option"]["candidate"]
    assert (c["micro_batch"], c["grad_ckpt"], c["zero_stage"], c["world_size"]) == (2, True, 3, 4)
    assert (c["offload"], c["optim"], c["precision"], c["attn"]) == (
        "optimizer",
        "adamw_torch_fused",
        "bf16",
        "sdpa",
    )
    assert d["pinned"]["world_size"] == 4 and "liger" not in d["pinned"]
    g = d["gpus"][0]
    assert g["host_bytes"] > 0 and g["host_memory_per_gpu_bytes"] > 0  # offload says what host RAM it needs
    b = g["breakdown"]
    shares = [t["share"] for t in b["terms"]]
    assert shares == sorted(shares, reverse=True) and abs(sum(shares) - 1) < 1e-9
    assert b["dominant"] == b["terms"][0]["term"] and b["lever"]


def test_no_grad_ckpt_and_lora_targets_pins() -> None:
    r = run("--model", "llama-3.1-8b", "--gpu", "H100", "--gpus-per-node", "1", "--mode", "qlora", "--lora-r", "32",
            "--lora-targets", "all-linear", "--no-grad-ckpt", "--seq-len", "1024", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    o = json.loads(r.output)["gpus"][0]["option"]
    assert o["candidate"]["grad_ckpt"] is False and "QLoRA r=32" in o["levers"]
    # all-linear adapts 7 linears per layer: more trainable parameters than the attention default
    attn = json.loads(run("--model", "llama-3.1-8b", "--gpu", "H100", "--gpus-per-node", "1", "--mode", "qlora",
                          "--lora-r", "32", "--seq-len", "1024", "--json").output)["gpus"][0]["option"]  # fmt: skip
    assert o["memory"]["trainable_params"] > 2 * attn["memory"]["trainable_params"]


def test_liger_pin_on_and_off() -> None:
    """--liger/--no-liger pins the fused loss: "does my config fit without Liger?" is a question."""
    base = ["--model", "llama-3.1-8b", "--gpu", "L4", "--gpus-per-node", "1", "--mode", "qlora", "--lora-r", "16",
            "--seq-len", "8192", "--effective-batch", "8", "--grad-ckpt", "--json"]  # fmt: skip
    off = json.loads(run(*base, "--no-liger").output)
    on = json.loads(run(*base, "--liger").output)
    assert off["pinned"]["liger"] is False and on["pinned"]["liger"] is True
    g_off, g_on = off["gpus"][0], on["gpus"][0]
    assert g_on["option"]["candidate"]["liger"] is True and "Liger fused loss" in g_on["option"]["levers"]
    if g_off["option"] is not None:
        assert g_off["option"]["candidate"]["liger"] is False
        assert g_off["option"]["memory"]["terms"]["logits_loss"] > g_on["option"]["memory"]["terms"]["logits_loss"]
    text = run(*base[:-1], "--no-liger").output
    assert "liger=False" in text


def test_a_full_precision_plan_runs_sdpa_not_flashattention() -> None:
    """FlashAttention-2 takes fp16/bf16 only: a plan pinned to fp32 (or tf32) picks sdpa where the GPU has FA2, and a
    pinned FA2 with fp32 is said not to run, in one line (the emitted config would fail when the model loads)."""
    base = ["--model", "qwen2.5-0.5b", "--gpu", "A10G", "--mode", "full", "--gpus-per-node", "1"]
    half = json.loads(run(*base, "--json").output)["gpus"][0]["option"]["candidate"]
    fp32 = json.loads(run(*base, "--precision", "fp32", "--json").output)["gpus"][0]["option"]["candidate"]
    assert half["attn"] == "flash_attention_2" and (fp32["precision"], fp32["attn"]) == ("fp32", "sdpa")
    both = json.loads(run(*base, "--precision", "fp32", "--attn", "flash_attention_2", "--json").output)["gpus"][0]
    assert not both["fits"] and "fp16 or bf16 only" in both["note"]


def test_tokens_under_one_step_are_said_and_cents_are_shown() -> None:
    r = run("--model", "llama-3.1-8b", "--gpu", "A10G", "--mode", "lora", "--tokens", "1M", "--effective-batch", "1024",
            "--seq-len", "4096", "--json")
    out = json.loads(r.output)
    assert any("less than one optimizer step" in n and "4,194,304" in n for n in out["notes"]), out["notes"]
    text = " ".join(run("--model", "llama-3.1-8b", "--gpu", "A10G", "--mode", "lora", "--tokens", "1M").output.split())
    assert "less than one optimizer step" not in text and " 0.36 " in text  # ($0.36 was shown as 0)


def test_the_attn_targets_on_a_fused_qkv_model_say_what_they_adapt() -> None:
    notes = json.loads(run("--model", "phi-3-mini", "--gpu", "A10G", "--mode", "lora", "--json").output)["notes"]
    assert any("adapts o_proj here" in n and "name qkv_proj,o_proj" in n for n in notes), notes
    named = json.loads(run("--model", "phi-3-mini", "--gpu", "A10G", "--mode", "lora", "--lora-targets",
                           "qkv_proj,o_proj", "--json").output)
    assert not any("fused" in n for n in named["notes"]) and named["gpus"][0]["option"]["memory"]["trainable_params"] \
        == 16 * (3072 + 9216 + 3072 + 3072) * 32  # qkv_proj 3072 -> 9216, o_proj 3072 -> 3072, 32 layers


def test_bad_pins_exit_2_with_one_line() -> None:
    assert "offload=params needs zero_stage 3" in _one_line_error(
        run("--model", "gpt2", "--seq-len", "512", "--zero-stage", "2", "--offload", "params")
    )
    assert "optim must be one of" in _one_line_error(
        run("--model", "gpt2", "--seq-len", "512", "--optim", "lion")
    )
    assert "world_size 16 exceeds gpus_per_node 8" in _one_line_error(
        run("--model", "gpt2", "--world-size", "16", "--gpus-per-node", "8")
    )
    # one node: a node of 100,000 GPUs was planned (78M tok/s) as if its link reached every one
    assert "--gpus-per-node must be at most 16" in _one_line_error(run("--model", "gpt2", "--gpus-per-node", "100000"))
    assert "--world-size must be at most 16" in _one_line_error(
        run("--model", "gpt2", "--world-size", "32", "--effective-batch", "64"))
    assert run("--model", "gpt2", "--gpus-per-node", "16", "--seq-len", "512").exit_code == 0
    assert "--lora-targets" in _one_line_error(run("--model", "gpt2", "--lora-targets", " , "))
    line = _one_line_error(run("--model", "gpt2", "--seq-len", "4096"))
    assert "learned positions" in line and "--seq-len 1024" in line


def test_text_shows_breakdown_dominant_term_and_zero_wording() -> None:
    r = run("--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--zero-stage", "3", "--world-size", "1",
            "--offload", "params", "--gpus-per-node", "1")  # fmt: skip
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "ZeRO-3, 1 GPU" in out and "over 1 GPUs" not in out
    assert "dominant:" in out and "memory at the" in out and "optimizer adamw_torch_fused" in out
    assert "host RAM per node" in out
    default = gather(PlanQuery(model="gpt2", gpu="L4"), PlanSources(environ={}))
    assert default.seq_len == 1024 and any("learned positions" in n for n in default.notes)


# ------------------------------------------------------------------------------ --calibrate RUN_DIR


def _run_folder(tmp_path: Path, *, on_gpu: str | None, share: float = 0.4) -> Path:
    """A run folder written by tune(): probes answered at the speed the step-time model predicts at
    base efficiency ``share`` on ``on_gpu`` (the device name NVML/torch report), or with no GPU (a CPU run)."""
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).parent))
    from _fakes import FakeExecutor, synthetic

    from autotune.estimate import arch_from_config, find_gpu
    from autotune.estimate.speed import predict_speed
    from autotune.models import resolve_model
    from autotune.run._tune import tune
    from autotune.spec.probe_request import Workload
    from autotune.spec.result import ProbeResult

    arch = arch_from_config(resolve_model("tiny-llama").config)
    gpu = find_gpu("A100-80GB")

    def landscape(c, seq_len):  # noqa: ANN001, ANN202
        peak, _ = synthetic(c, seq_len)
        sp = predict_speed(arch, Workload("tiny-llama", seq_len=seq_len), c, gpu, efficiency=share)
        return peak, sp.tokens_per_s_per_gpu

    class OnGpu(FakeExecutor):
        def result_for(self, request):  # noqa: ANN001, ANN202
            r = super().result_for(request)
            env = {"device_type": "cuda", "device": on_gpu} if on_gpu else {"device_type": "cpu", "device": "cpu"}
            return ProbeResult(status=r.status, request=r.request, reason=r.reason, metrics=r.metrics, env=env)

    result = tune("tiny-llama", gpu_budget="10GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu",
                  max_trials=6, top_k=1, out=tmp_path, executor=OnGpu(landscape))
    return result.run_dir


def test_calibrate_from_a_run_folder_sets_the_gpus_efficiency(tmp_path: Path) -> None:
    rd = _run_folder(tmp_path, on_gpu="NVIDIA A100-SXM4-80GB", share=0.4)
    flags = ["--model", "llama-3.1-8b", "--gpu", "A100-80GB,H100-SXM", "--mode", "lora", "--json"]
    plain = json.loads(run(*flags).output)
    r = run(*flags, "--calibrate", str(rd))
    assert r.exit_code == 0, r.output
    cal = json.loads(r.output)
    a100, a100_plain = cal["gpus"][0], plain["gpus"][0]
    assert a100["option"]["speed"]["base_efficiency"] == pytest.approx(0.4)
    assert a100_plain["option"]["speed"]["base_efficiency"] != pytest.approx(0.4)
    # a GPU the run did not measure keeps the catalog's efficiency, and says so
    assert cal["gpus"][1]["option"]["speed"] == plain["gpus"][1]["option"]["speed"]
    notes = " ".join(cal["notes"])
    assert "A100-80GB speed from" in notes and "base efficiency 0.40" in notes
    assert "no probe of" in notes and "H100-SXM" in notes


def test_calibrate_refuses_a_cpu_run_in_one_line(tmp_path: Path) -> None:
    rd = _run_folder(tmp_path, on_gpu=None)
    r = run("--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--calibrate", str(rd))
    assert r.exit_code == 2
    assert "no ok probe ran on a GPU of the catalog (cpu)" in r.output
    r = run("--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--calibrate", str(tmp_path / "missing"))
    assert r.exit_code == 2 and "does not exist" in r.output


def test_nothing_fits_answers_with_the_smallest_footprint_and_its_breakdown() -> None:
    """QLoRA of a 7B model at 2048 tokens on one T4 without Liger: nothing fits, and the answer says by how much
    (the smallest configuration's peak against the usable memory) and what fills it, in text and JSON."""
    args = ["--model", "qwen2.5-7b", "--gpu", "T4", "--mode", "qlora", "--seq-len", "2048", "--gpus-per-node", "1",
            "--no-liger"]
    g = json.loads(run(*args, "--json").output)["gpus"][0]
    assert not g["fits"] and g["option"] is None
    least = g["smallest"]
    assert least["mode"] == "qlora" and least["candidate"]["micro_batch"] == 1 and least["candidate"]["grad_ckpt"]
    assert g["breakdown"]["total"] == least["memory"]["total"] > g["usable_bytes"]
    assert g["breakdown"]["dominant"] == "weights" and any(t["term"] == "logits_loss" for t in g["breakdown"]["terms"])
    from autotune.spec.budget import format_bytes  # one unit per size (TiB beside GiB had been mixed)

    shown = f"the smallest footprint is {format_bytes(least['memory']['total'])} of {format_bytes(g['usable_bytes'])} usable"
    assert shown in g["note"], g["note"]
    r = run(*args)
    assert "the smallest footprint is" in r.output and "T4 memory at the" in r.output
    # the table's row sets the peak against the usable memory it was judged on, not the card's 15 GiB
    assert f"(smallest) / {format_bytes(g['usable_bytes'])} usable" in r.output, r.output
    assert r.exit_code == 3  # nothing fits on any GPU asked, in any mode tried: as `autotune run`
    assert "already 4-bit" in r.output  # the dominant term's lever leaves out what the plan already uses


def test_a_plan_the_run_could_not_measure_is_refused_or_not_offered() -> None:
    """QLoRA's probe does not shard its 4-bit base: a QLoRA plan with ZeRO or offload is refused, and no search
    falls back to one (70B QLoRA on an A10G said "fits" with ZeRO-3 parameter offload when pinned); Liger patches
    no GPT-2, so a GPT-2 plan neither assumes its fused loss nor accepts it pinned; a world size the effective
    batch cannot split is bad input, not "nothing fits"."""
    assert "QLoRA probe does not shard" in _one_line_error(
        run("--model", "llama-3.1-70b", "--mode", "qlora", "--gpu", "A10G", "--offload", "params"))
    r = run("--model", "llama-3.1-8b", "--mode", "full", "--gpu", "T4", "--zero-stage", "3", "--offload", "params",
            "--world-size", "1", "--json")
    option = json.loads(r.output)["gpus"][0]["option"]
    assert option is None or option["mode"] != "qlora", option
    g = json.loads(run("--model", "gpt2", "--gpu", "T4", "--seq-len", "1024", "--json").output)["gpus"][0]
    assert not g["option"]["candidate"]["liger"]
    assert "Liger does not patch model_type 'gpt2'" in _one_line_error(run("--model", "gpt2", "--seq-len", "1024",
                                                                           "--liger"))
    assert "not a multiple of world_size 3" in _one_line_error(run("--model", "llama-3.1-8b", "--gpu", "H100-SXM",
                                                                   "--world-size", "3"))


def test_an_answer_that_needs_liger_says_so_and_what_it_is_without() -> None:
    """8B LoRA at 4096 tokens on one A10G fits with Liger's fused loss; the answer names that assumption and what
    --no-liger gives (the default answer must not hide that it needs autotune[gpu])."""
    args = ["--model", "llama-3.1-8b", "--gpu", "A10G", "--mode", "lora", "--seq-len", "4096",
            "--effective-batch", "32", "--gpus-per-node", "1"]
    g = json.loads(run(*args, "--json").output)["gpus"][0]
    assert g["fits"] and g["option"]["candidate"]["liger"]
    plain = json.loads(run(*args, "--no-liger", "--json").output)["gpus"][0]
    without = ("lora does not fit" if plain["mode"] != "lora" else
               f"micro-batch {plain['option']['candidate']['micro_batch']}")
    assert len(g["assumptions"]) == 1 and "autotune[gpu]" in g["assumptions"][0] and without in g["assumptions"][0]
    assert plain["assumptions"] == []  # pinned off: nothing assumed
    assert "A10G: assumes Liger's fused linear+cross-entropy (pip install 'autotune[gpu]')" in run(*args).output


def test_under_trls_trainer_story_1_fits_without_liger() -> None:
    """--trainer trl prices TRL's SFTTrainer, whose fused LM head never holds the whole logits: 8B LoRA at 4,096
    tokens fits an A10G without Liger (which TRL turns off), where transformers' loss needs Liger or QLoRA."""
    args = ["--model", "llama-3.1-8b", "--gpu", "A10G", "--mode", "lora", "--seq-len", "4096",
            "--effective-batch", "32", "--gpus-per-node", "1", "--no-liger"]
    trl = json.loads(run(*args, "--trainer", "trl", "--json").output)
    hf = json.loads(run(*args, "--json").output)
    assert trl["trainer"] == "trl" and hf["trainer"] == "hf"
    g, h = trl["gpus"][0], hf["gpus"][0]
    assert g["fits"] and g["mode"] == "lora" and g["option"]["candidate"]["micro_batch"] >= 2
    assert h["mode"] != "lora" or h["option"]["candidate"]["micro_batch"] < g["option"]["candidate"]["micro_batch"]
    assert "TRL's SFTTrainer" in run(*args, "--trainer", "trl").output
    bad = run(*args, "--trainer", "deepspeed")
    assert bad.exit_code == 2 and "trainer must be one of hf, trl" in bad.output


def test_a_one_gpu_question_gets_a_one_gpu_answer_unless_told_otherwise() -> None:
    """The default plans one card (a node of eight answered a one-card question before); a pinned world size
    or --gpus-per-node widens it."""
    one = json.loads(run("--model", "llama-3.1-8b", "--gpu", "A10G", "--mode", "lora", "--seq-len", "4096",
                         "--effective-batch", "32", "--json").stdout)
    assert one["gpus_per_node"] == 1 and one["gpus"][0]["option"]["candidate"]["world_size"] == 1
    four = json.loads(run("--model", "llama-3.1-8b", "--gpu", "A10G", "--mode", "lora", "--world-size", "4",
                          "--json").stdout)
    assert four["gpus_per_node"] == 4 and four["gpus"][0]["option"]["candidate"]["world_size"] == 4
    node = json.loads(run("--model", "llama-3.1-8b", "--gpu", "A10G", "--mode", "lora", "--gpus-per-node", "8",
                          "--json").stdout)
    assert node["gpus_per_node"] == 8


def test_the_gpus_one_run_uses_have_one_name_in_plan_and_run() -> None:
    """plan's --world-size is run's --gpus-per-trial: each command takes both."""
    a = json.loads(run("--model", "gpt2", "--gpu", "A10G", "--world-size", "2", "--json").stdout)
    b = json.loads(run("--model", "gpt2", "--gpu", "A10G", "--gpus-per-trial", "2", "--json").stdout)
    assert a == b and a["gpus"][0]["option"]["candidate"]["world_size"] == 2
    import typer.main

    from autotune.cli.app import app

    run_cmd = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    (opt,) = [p for p in run_cmd.params if p.name == "gpus_per_trial"]
    assert set(opt.opts) == {"--gpus-per-trial", "--world-size"}


def test_mode_and_trainer_are_read_in_any_case_as_model_and_gpu_names_are() -> None:
    r = run("--model", "llama-3.1-8b", "--gpu", "a10g", "--mode", "QLoRA", "--trainer", "TRL", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["mode"] == "qlora"


def test_gpu_counts_the_effective_batch_cannot_split_over_are_named() -> None:
    notes = json.loads(run("--model", "gpt2", "--seq-len", "512", "--gpu", "L4", "--effective-batch", "7",
                           "--gpus-per-node", "8", "--json").output)["notes"]
    assert any("effective batch 7 does not split over 2, 4, 8 GPUs" in n for n in notes), notes


def test_a_gpu_name_that_could_mean_two_cards_says_which_it_was_read_as() -> None:
    """--gpu A100 plans on the 80 GB card; a user of the 40 GB one is told so (a 70 GiB plan read as fitting)."""
    notes = json.loads(run("--model", "llama-3.1-8b", "--gpu", "A100,A10G", "--mode", "lora", "--json").output)["notes"]
    said = [n for n in notes if "is read as" in n]
    assert said == ["--gpu A100 is read as A100-80GB; the catalog also holds A100-40GB: name the one you mean"]
    exact = json.loads(run("--model", "llama-3.1-8b", "--gpu", "A100-40GB", "--mode", "lora", "--json").output)
    assert not [n for n in exact["notes"] if "is read as" in n]


def test_the_dominant_terms_lever_is_never_a_smaller_micro_batch_than_1() -> None:
    """At micro-batch 1 the lever for activations or the loss is never "a smaller micro-batch"."""
    for args in (["--micro-batch", "1", "--no-grad-ckpt"], ["--seq-len", "1000000"]):
        out = json.loads(run("--model", "llama-3.1-8b", "--gpu", "T4", "--mode", "qlora", *args, "--json").output)
        b = out["gpus"][0]["breakdown"]
        assert b["dominant"] == "activations" and "smaller micro-batch" not in b["lever"], b["lever"]
