"""autotune check: the checklist as pure logic, and the CLI's exit codes."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from autotune.check import ConfigBundle, GpuInfo, bundle_from_texts, gather, parse_config, render_text
from autotune.emit import emit_all
from autotune.errors import SpecError
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

T4 = GpuInfo(name="T4", bf16=False, flash_attention_2=False, tf32=False)
A10G = GpuInfo(name="A10G", bf16=True, flash_attention_2=True, tf32=True)

BAD = {
    "evaluation_strategy": "steps",
    "no_cuda": False,
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 32,
    "dataloader_num_workers": 0,
    "save_strategy": "steps",
}


def status(report, item_id):
    return [i.status for i in report.by_id(item_id)]


def bundle(**data) -> ConfigBundle:
    b = ConfigBundle(target="t")
    for kind, d in data.items():
        b.data[kind] = d
        b.sources[kind] = f"{kind}.json"
    return b


# ---------------------------------------------------------------- pure rules


def test_bad_training_args_fail_with_the_right_items():
    r = gather(bundle(training_args=BAD))
    names = r.by_id("names")
    assert [i.status for i in names] == ["fail", "fail"]
    assert "eval_strategy" in names[0].fix and "use_cpu" in names[1].fix
    assert status(r, "precision") == ["fail"]
    assert "bf16" in r.by_id("precision")[0].fix
    assert status(r, "batch") == ["warn"] and "too small" in r.by_id("batch")[0].message
    assert status(r, "dataloader_workers") == ["warn"]
    assert status(r, "checkpoints") == ["warn"] and "save_total_limit" in r.by_id("checkpoints")[0].fix
    assert status(r, "seed") == ["warn"]
    assert status(r, "tracking") == ["warn"]
    assert r.failed and r.exit_code == 1
    assert all(i.fix for i in r.items if i.status in ("warn", "fail"))


def test_unknown_names_fail_against_installed_fields():
    r = gather(bundle(training_args={"bf16": True, "not_a_field": 1}), fields={"bf16", "seed"})
    msgs = [i.message for i in r.by_id("names") if i.status == "fail"]
    assert any("not_a_field" in m for m in msgs)


def test_deprecated_alias_warns():
    r = gather(bundle(training_args={"gradient_checkpointing": True, "bf16": True}))
    assert status(r, "names") == ["warn"] and "activation_checkpointing" in r.by_id("names")[0].fix


def test_gpu_aware_precision_and_attention():
    r = gather(
        bundle(training_args={"bf16": True}, model_kwargs={"attn_implementation": "flash_attention_2"}),
        gpu=T4,
    )
    assert status(r, "precision") == ["fail"] and "fp16" in r.by_id("precision")[0].fix
    assert status(r, "attention") == ["fail"]
    r = gather(bundle(training_args={"fp16": True, "tf32": True}), gpu=T4)
    assert status(r, "precision") == ["pass"] and status(r, "tf32") == ["fail"]
    r = gather(bundle(training_args={"fp16": True}), gpu=A10G)
    assert status(r, "precision") == ["warn"]


def test_eager_attention_fails_and_torch_dtype_warns():
    r = gather(bundle(model_kwargs={"attn_implementation": "eager", "torch_dtype": "bfloat16"}))
    assert status(r, "attention") == ["fail"] and "sdpa" in r.by_id("attention")[0].fix
    assert status(r, "names") == ["warn"]


def test_cpu_run_does_not_fail_on_fp32():
    r = gather(bundle(training_args={"use_cpu": True, "seed": 1}))
    assert status(r, "precision") == ["info"] and not r.failed


def test_deepspeed_offload_and_batch_mismatch():
    ds = {
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "train_batch_size": 16,
        "bf16": {"enabled": True},
    }
    acc = {"distributed_type": "DEEPSPEED", "num_processes": 4}
    r = gather(bundle(deepspeed=ds, accelerate=acc))
    assert status(r, "offload") == ["warn"]
    assert "fail" in status(r, "effective_batch")  # 2 x 4 x 4 = 32, not 16
    assert status(r, "precision") == ["pass"]


def test_parse_config_classifies_and_rejects():
    assert parse_config("x.json", json.dumps({"zero_optimization": {}}))[0] == "deepspeed"
    assert parse_config("x.json", json.dumps({"attn_implementation": "sdpa"}))[0] == "model_kwargs"
    assert parse_config("x.json", json.dumps({"bf16": True}))[0] == "training_args"
    assert parse_config("a.yaml", "distributed_type: 'NO'\n")[0] == "accelerate"
    with pytest.raises(SpecError, match="not valid JSON"):
        parse_config("x.json", "{nope")
    with pytest.raises(SpecError, match="not an accelerate config"):
        parse_config("x.yaml", "foo: 1\n")
    with pytest.raises(SpecError, match="JSON object"):
        parse_config("x.json", "[1]")
    b = bundle_from_texts("d", {"training_args.json": "{}", "model_kwargs.json": "{}"}, directory=True)
    assert set(b.data) == {"training_args", "model_kwargs"}


def test_render_text_has_one_line_per_item_and_a_verdict():
    r = gather(bundle(training_args=BAD))
    text = render_text(r)
    assert "FAIL" in text and "fix: rename to eval_strategy" in text
    assert text.strip().splitlines()[-1].startswith("FAILED:")


# ---------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def app():
    from autotune.cli.app import app

    return app


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    out = tmp_path_factory.mktemp("run") / "best"
    req = ProbeRequest(
        workload=Workload(model="m", mode="lora"),
        candidate=Candidate(
            micro_batch=4, grad_accum=8, workers=4, precision="bf16", zero_stage=2, world_size=2
        ),
        settings=ProbeSettings(device="cuda"),
    )
    emit_all(ProbeResult(status="ok", request=req.to_dict()), out, fields=fields)
    return out


def test_cli_good_emitted_config_passes(app, emitted):
    res = CliRunner().invoke(app, ["check", str(emitted), "--gpu", "A10G"])
    assert res.exit_code == 0, res.output
    assert "effective batch" in res.output and "4 x 8 x 2 = 64" in res.output
    for name in ("training_args.json", "accelerate_config.yaml", "deepspeed.json"):
        res = CliRunner().invoke(app, ["check", str(emitted / name)])
        assert res.exit_code == 0, res.output


def test_cli_bad_config_exits_1_and_json_parses(app, tmp_path):
    p = tmp_path / "my_args.json"
    p.write_text(json.dumps(BAD))
    res = CliRunner().invoke(app, ["check", str(p)])
    assert res.exit_code == 1
    assert "evaluation_strategy" in res.output
    res = CliRunner().invoke(app, ["check", str(p), "--json"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["ok"] is False and data["counts"]["fail"] >= 3
    assert {"names", "precision", "batch"} <= {i["id"] for i in data["items"]}


@pytest.mark.parametrize("content", [None, "{not json", "[]"])
def test_cli_unreadable_input_exits_2_with_one_line(app, tmp_path, content):
    p = tmp_path / "args.json"
    if content is not None:
        p.write_text(content)
    res = CliRunner().invoke(app, ["check", str(p)])
    assert res.exit_code == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("autotune: error:")


def test_cli_empty_directory_exits_2(app, tmp_path):
    res = CliRunner().invoke(app, ["check", str(tmp_path)])
    assert res.exit_code == 2
