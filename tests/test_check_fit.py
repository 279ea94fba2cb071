"""``check --gpu``: the file's predicted memory on that GPU and the micro-batch to use there, for the model
the file (or ``--model``) names at the file's sequence length. In-process (the planner's models are pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.check import FitTarget, GpuInfo, gather
from autotune.cli.check import bundle_from_file
from autotune.estimate import arch_from_config, find_gpu
from autotune.models import resolve_model

A10G = GpuInfo(name="A10G", bf16=True, flash_attention_2=True, tf32=True)

# story 1's file: 8B LoRA at 4,096 tokens, micro-batch 1 x 32, checkpointing and Liger, as `trl sft --config` reads it
STORY_1 = """\
model_name_or_path: meta-llama/Llama-3.1-8B
use_peft: true
lora_r: 16
lora_target_modules: [q_proj, k_proj, v_proj, o_proj]
max_length: 4096
per_device_train_batch_size: {mb}
gradient_accumulation_steps: {acc}
activation_checkpointing: true
bf16: true
use_liger_kernel: true
seed: 1
"""


def _target(model: str, **kw) -> FitTarget:
    resolved = resolve_model(model)
    return FitTarget(model=resolved.name, arch=arch_from_config(resolved.config), gpu=find_gpu("A10G"), **kw)


@pytest.fixture(scope="module")
def app():
    from autotune.cli.app import app as _app

    return _app


@pytest.fixture
def _check(tmp_path: Path):
    def check(text: str, target: FitTarget | None, name: str = "sft.yaml", gpu_info: GpuInfo = A10G, **kw):
        f = tmp_path / name
        f.write_text(text)
        return gather(bundle_from_file(f), gpu=gpu_info, target=target, **kw)

    return check


def _one(report, item_id):
    (item,) = report.by_id(item_id)
    return item


def test_an_8b_lora_file_at_4k_tokens_fits_and_micro_batch_1_is_not_called_too_small(_check):
    r = _check(STORY_1.format(mb=1, acc=32), _target("meta-llama/Llama-3.1-8B"))
    fit, batch = _one(r, "fit"), _one(r, "batch")
    assert fit.status == "pass" and "lora" in fit.message and "4,096 tokens" in fit.message and "GiB" in fit.message
    assert batch.status == "pass", batch.message  # micro-batch 2 fits too but is predicted no faster at 4k tokens
    assert not r.failed


def test_a_micro_batch_that_cannot_fit_fails_and_the_fix_keeps_the_effective_batch(_check):
    r = _check(STORY_1.format(mb=4, acc=8), _target("meta-llama/Llama-3.1-8B"))
    fit = _one(r, "fit")
    assert fit.status == "fail" and "over the" in fit.message and "A10G" in fit.message
    assert "micro-batch 2 x accumulation 16" in fit.fix  # 4 x 8 = 2 x 16: the effective batch the file asked for
    assert r.failed and r.exit_code == 1
    assert r.by_id("batch") == []  # no second, contradicting, token-count advice


def test_an_sft_config_is_priced_with_trls_fused_head_not_transformers_logits(_check, tmp_path: Path):
    """An SFTConfig trains through TRL's SFTTrainer, whose fused LM head never holds the logits: story 1 at
    micro-batch 2 without Liger fits an A10G; the same levers as transformers' TrainingArguments do not."""
    text = STORY_1.format(mb=2, acc=16).replace("use_liger_kernel: true\n", "")
    r = _check(text, _target("meta-llama/Llama-3.1-8B"))
    assert _one(r, "fit").status == "pass", _one(r, "fit").message
    ta = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 16, "gradient_checkpointing": True,
          "bf16": True, "seed": 1}
    hf = _check(json.dumps(ta), _target("meta-llama/Llama-3.1-8B", seq_len=4096, mode="lora"),
                name="training_args.json")
    assert _one(hf, "fit").status == "fail", _one(hf, "fit").message
    # where nothing fits with the file's levers, the plan it points to is TRL's, and Liger is not offered
    nockpt = _check(text.replace("activation_checkpointing: true", "activation_checkpointing: false"),
                    _target("meta-llama/Llama-3.1-8B"))
    fix = _one(nockpt, "fit").fix
    assert "--trainer trl" in fix and "Liger" not in fix, fix
    # a file without max_length (its ModelConfig keys still say TRL) is priced at SFTConfig's own default length
    nomax = _check(text.replace("max_length: 4096\n", ""), _target("meta-llama/Llama-3.1-8B"))
    trl = pytest.importorskip("trl")
    import dataclasses

    default = {f.name: f.default for f in dataclasses.fields(trl.SFTConfig)}["max_length"]
    assert f"{default:,} tokens per sequence, TRL's default max_length" in _one(nomax, "fit").message
    assert all(i.status != "fail" for i in nomax.by_id("names")), nomax.by_id("names")  # not read as TrainingArguments
    # the script's ModelConfig attn_implementation is the attention the model is built with, and is priced
    eager = _check(text + "attn_implementation: eager\n", _target("meta-llama/Llama-3.1-8B"))
    assert _one(eager, "fit").status == "fail" and "eager" in _one(eager, "attention").message


def test_a_small_model_at_short_sequences_is_told_which_larger_micro_batch_fits(_check):
    text = STORY_1.format(mb=1, acc=32).replace("max_length: 4096", "max_length: 512")
    r = _check(text, _target("qwen2.5-0.5b"))
    batch = _one(r, "batch")
    assert batch.status == "warn", batch.message
    mb, acc = (int(x) for x in batch.fix.removeprefix("set the micro-batch to ").split(" (")[0]
               .split(" and accumulation to "))
    assert mb > 1 and mb * acc == 32
    assert "tok/s" in batch.message and "%" in batch.message


def test_the_command_lines_sequence_length_and_mode_are_over_the_files(_check):
    base = _check(STORY_1.format(mb=1, acc=32), _target("meta-llama/Llama-3.1-8B"))
    short = _check(STORY_1.format(mb=1, acc=32), _target("meta-llama/Llama-3.1-8B", seq_len=512))
    assert "512 tokens" in _one(short, "fit").message and "4,096" not in _one(short, "fit").message
    full = _check(STORY_1.format(mb=1, acc=32), _target("meta-llama/Llama-3.1-8B", mode="full"))
    assert _one(full, "fit").status == "fail" and _one(base, "fit").status == "pass"


def test_a_length_past_learned_positions_fails_as_plan_refuses_it(_check):
    # GPT-2 at 2,048 tokens was a PASS with a memory figure; the run ends at its first long batch
    text = STORY_1.format(mb=4, acc=4).replace("meta-llama/Llama-3.1-8B", "gpt2").replace("max_length: 4096", "max_length: 2048")
    fit = _one(_check(text, _target("gpt2")), "fit")
    assert fit.status == "fail" and "learned positions up to 1,024" in fit.message and "1,024 or less" in fit.fix
    assert _one(_check(text.replace("2048", "1024"), _target("gpt2")), "fit").status == "pass"


def test_what_a_file_leaves_unsaid_is_assumed_aloud(_check):
    ta = json.dumps({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8, "bf16": True,
                     "optim": "lion_32bit"})
    r = _check(ta, _target("qwen2.5-0.5b"), name="training_args.json")
    fit = _one(r, "fit")
    assert "full fine-tuning" in fit.message and "--mode" in fit.message
    assert "2,048 tokens" in fit.message and "--seq-len" in fit.message
    assert "lion_32bit" in fit.message  # an optimizer the model does not price is said, not silently swapped


def test_without_a_model_the_fit_is_said_unjudged_and_the_token_rule_stands(_check):
    ta = json.dumps({"per_device_train_batch_size": 1, "gradient_accumulation_steps": 16, "bf16": True})
    r = _check(ta, None, name="training_args.json", unjudged="the file names no model")
    fit = _one(r, "fit")
    assert fit.status == "info" and "not judged" in fit.message and "--model" in fit.fix
    assert _one(r, "batch").status == "info"  # the token-count advice, as without --gpu


def test_cli_model_options_need_a_gpu_and_a_named_model_must_resolve(app, tmp_path: Path):
    f = tmp_path / "sft.yaml"
    f.write_text(STORY_1.format(mb=4, acc=8))
    res = CliRunner().invoke(app, ["check", str(f), "--model", "llama-3.1-8b"])
    assert res.exit_code == 2 and "give --gpu too" in res.output and len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["check", str(f), "--gpu", "A10G", "--model", "no-such/model", "--offline"])
    assert res.exit_code == 2 and "no-such/model" in res.output
    res = CliRunner().invoke(app, ["check", str(f), "--gpu", "A10G", "--mode", "huge"])
    assert res.exit_code == 2 and "--mode" in res.output
    # the file's own model, read offline from the presets: judged, and over the card at micro-batch 4
    res = CliRunner().invoke(app, ["check", str(f), "--gpu", "A10G", "--offline", "--json"])
    assert res.exit_code == 1, res.output
    items = {i["id"]: i for i in json.loads(res.output)["items"]}
    assert items["fit"]["status"] == "fail"
    figures = items["fit"]["figures"]  # the numbers behind the message, for a pipeline
    assert figures["predicted_peak_bytes"] > figures["capacity_bytes"] and figures["micro_batch"] == 4
    assert (figures["advised_micro_batch"], figures["advised_grad_accum"]) == (2, 16)
    assert figures["advised_peak_bytes"] <= figures["usable_bytes"]
    # a model the file names that cannot be read: the rest of the checklist stands, the fit is said unjudged
    f.write_text(STORY_1.format(mb=1, acc=32).replace("meta-llama/Llama-3.1-8B", "no-such/model"))
    res = CliRunner().invoke(app, ["check", str(f), "--gpu", "A10G", "--offline", "--json"])
    items = {i["id"]: i for i in json.loads(res.output)["items"]}
    assert res.exit_code == 0 and items["fit"]["status"] == "info" and "no-such/model" in items["fit"]["message"]


@pytest.mark.parametrize("mb", [1, 8])
def test_a_runs_best_folder_is_judged_for_the_model_and_length_its_run_recorded(app, tmp_path: Path, mb: int):
    best = tmp_path / "run" / "best"
    best.mkdir(parents=True)
    (best / "training_args.json").write_text(json.dumps({
        "per_device_train_batch_size": mb, "gradient_accumulation_steps": 32 // mb, "bf16": True,
        "activation_checkpointing": True, "use_liger_kernel": True, "seed": 1}))
    (best / "model_kwargs.json").write_text(json.dumps({"attn_implementation": "sdpa"}))
    (best / "lora_config.json").write_text(json.dumps({"r": 16, "target_modules": ["q_proj", "v_proj"]}))
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"model": "llama-3.1-8b", "seq_len": 4096,
                                                                "mode": "lora"}))
    res = CliRunner().invoke(app, ["check", str(best), "--gpu", "A10G", "--offline", "--json"])
    items = {i["id"]: i for i in json.loads(res.output)["items"]}
    assert "4,096 tokens" in items["fit"]["message"] and "lora" in items["fit"]["message"]
    assert items["fit"]["status"] == ("pass" if mb == 1 else "fail"), items["fit"]


def test_bf16_on_a_card_without_it_is_priced_as_its_fix_runs_not_a_type_failure(_check):
    t4 = FitTarget(model="meta-llama/Llama-3.1-8B", arch=_target("meta-llama/Llama-3.1-8B").arch, gpu=find_gpu("T4"))
    r = _check(STORY_1.format(mb=1, acc=32), t4,
               gpu_info=GpuInfo(name="T4", bf16=False, flash_attention_2=False, tf32=False))
    assert r.by_id("types") == []
    fit = _one(r, "fit")
    assert "fp16, as T4 has no bf16" in fit.message and fit.status == "fail"  # 18.5 GiB on a 15 GiB card


def test_an_optimizer_alias_is_priced_as_the_optimizer_it_names(_check):
    ta = json.dumps({"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "bf16": True,
                     "activation_checkpointing": True})
    target = _target("meta-llama/Llama-3.1-8B", mode="full")
    plain = _one(_check(ta, target, name="training_args.json"), "fit").message
    eight = _one(_check(ta.replace("}", ', "optim": "adamw_8bit"}'), target, name="training_args.json"), "fit").message
    alias = _one(_check(ta.replace("}", ', "optim": "adamw_bnb_8bit"}'), target, name="training_args.json"),
                 "fit").message
    assert "priced as" not in alias and alias == eight != plain


def test_a_file_without_a_micro_batch_says_the_fit_was_not_judged(_check):
    r = _check(json.dumps({"bf16": True, "per_device_train_batch_size": None}), _target("qwen2.5-0.5b"),
               name="training_args.json")
    assert any(i.id == "fit" and i.status == "info" and "not judged" in i.message for i in r.items)


def test_a_mode_given_on_the_command_line_is_not_also_said_to_be_assumed(_check):
    ta = json.dumps({"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True})
    fit = _one(_check(ta, _target("qwen2.5-0.5b", mode="lora"), name="training_args.json"), "fit")
    assert ", lora," in fit.message and "full fine-tuning" not in fit.message


def test_a_file_whose_variable_length_reserve_would_outgrow_the_card_is_told_the_allocator_setting(_check):
    """Story 1 at micro-batch 2 fits an A10G at the fixed-length reserve, but with variable-length batches the
    default allocator's reserve grows past the card: an info item names the setting that holds it (the file cannot
    say how the run is launched or how long its sequences are, so it does not fail). Micro-batch 1 has room."""
    two = _check(STORY_1.format(mb=2, acc=16), _target("meta-llama/Llama-3.1-8B"))
    assert _one(two, "fit").status == "pass"
    info = _one(two, "allocator")
    assert info.status == "info" and "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in info.message
    assert info.figures["reserved_variable_lengths_bytes"] > info.figures["usable_bytes"]
    one = _check(STORY_1.format(mb=1, acc=32), _target("meta-llama/Llama-3.1-8B"))
    assert one.by_id("allocator") == []
