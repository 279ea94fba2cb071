"""autotune check: the checklist as pure logic, and the CLI's exit codes."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

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
    assert status(r, "batch") == ["info"] and "unless the sequences are long" in r.by_id("batch")[0].message
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


def test_an_unset_tf32_is_said_as_transformers_treats_it():
    """transformers turns TF32 on by itself only under torch_compile: an empty config was told it did so anyway, beside
    the FAIL for fp32 without TF32 that contradicted it."""
    r = gather(bundle(training_args={"seed": 1}), gpu=A10G)
    assert status(r, "precision") == ["fail"] and status(r, "tf32") == ["warn"]
    assert "only with torch_compile" in r.by_id("tf32")[0].message
    r = gather(bundle(training_args={"seed": 1, "torch_compile": True}), gpu=A10G)
    assert status(r, "tf32") == ["info"] and "with torch_compile" in r.by_id("tf32")[0].message
    r = gather(bundle(training_args={"seed": 1, "bf16": True}), gpu=A10G)
    assert status(r, "tf32") == ["info"] and "beside bf16" in r.by_id("tf32")[0].message


def test_eager_attention_fails_and_torch_dtype_warns():
    r = gather(bundle(model_kwargs={"attn_implementation": "eager", "torch_dtype": "bfloat16"}))
    assert status(r, "attention") == ["fail"] and "sdpa" in r.by_id("attention")[0].fix
    assert status(r, "names") == ["warn"]


def test_cpu_run_does_not_fail_on_fp32():
    r = gather(bundle(training_args={"use_cpu": True, "seed": 1}))
    assert status(r, "precision") == ["info"] and not r.failed


def test_a_cpu_answer_checked_for_a_gpu_fails_its_device_and_its_precision():
    a10g = GpuInfo(name="A10G", bf16=True, flash_attention_2=True, tf32=True)
    r = gather(bundle(training_args={"use_cpu": True, "bf16": False, "seed": 1}), gpu=a10g)
    assert status(r, "device") == ["fail"] and "use_cpu" in r.by_id("device")[0].fix and "A10G" in r.by_id("device")[0].message
    assert status(r, "precision") == ["fail"] and "bf16: true" in r.by_id("precision")[0].fix
    assert r.failed
    # the same file without --gpu is a CPU run, judged as one
    assert status(gather(bundle(training_args={"use_cpu": True, "bf16": False, "seed": 1})), "device") == []
    # accelerate's use_cpu too
    r = gather(bundle(training_args={"bf16": True, "seed": 1}, accelerate={"use_cpu": True}), gpu=a10g)
    assert status(r, "device") == ["fail"] and "accelerate" in r.by_id("device")[0].source


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


def test_cli_a_cpu_answer_checked_for_a_gpu_exits_1(app, tmp_path):
    # what `autotune run --device cpu` emits, checked for the GPU it was not tuned on: the README's promise
    transformers = pytest.importorskip("transformers")
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    out = tmp_path / "best"
    req = ProbeRequest(workload=Workload(model="m"), candidate=Candidate(micro_batch=4, grad_accum=4, precision="fp32"),
                       settings=ProbeSettings(device="cpu"))
    emit_all(ProbeResult(status="ok", request=req.to_dict()), out, fields=fields)
    assert CliRunner().invoke(app, ["check", str(out)]).exit_code == 0  # as the CPU run it is
    res = CliRunner().invoke(app, ["check", str(out), "--gpu", "A10G", "--json"])
    assert res.exit_code == 1, res.output
    failed = {i["id"] for i in json.loads(res.stdout)["items"] if i["status"] == "fail"}
    assert {"device", "precision"} <= failed, failed


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


def test_an_empty_yaml_file_is_named_empty_and_a_json_byte_order_mark_is_not_content(app, tmp_path):
    empty = tmp_path / "args.yaml"
    empty.write_text("")
    res = CliRunner().invoke(app, ["check", str(empty)])
    assert res.exit_code == 2 and "args.yaml is empty" in res.stderr and "NoneType" not in res.stderr
    bom = tmp_path / "args.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"per_device_train_batch_size": 4, "bf16": True}).encode())
    res = CliRunner().invoke(app, ["check", str(bom), "--json"])
    assert res.exit_code in (0, 1) and json.loads(res.stdout)["items"], res.output


def test_cli_empty_directory_exits_2(app, tmp_path):
    res = CliRunner().invoke(app, ["check", str(tmp_path)])
    assert res.exit_code == 2


# ---------------------------------------------------------------- only what can be known here

FORMATS_DATA = Path(__file__).parent / "data" / "formats"


def _items(res, item_id):
    return [i for i in json.loads(res.stdout)["items"] if i["id"] == item_id]


def test_trl_names_are_an_info_naming_trl_when_trl_is_not_installed(app, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError, as without the package
    res = CliRunner().invoke(app, ["check", str(FORMATS_DATA / "trl_sft.yaml"), "--json"])
    assert res.exit_code == 0, res.output
    (names,) = _items(res, "names")
    assert names["status"] == "info" and "trl is not installed" in names["message"]
    assert "max_length, packing" in names["message"] and "pip install trl" in names["fix"]
    # what is known without TRL is still judged: a name transformers 5 removed
    bad = tmp_path / "sft.yaml"
    bad.write_text((FORMATS_DATA / "trl_sft.yaml").read_text() + "evaluation_strategy: steps\n")
    res = CliRunner().invoke(app, ["check", str(bad), "--json"])
    assert res.exit_code == 1
    assert [i["status"] for i in _items(res, "names")] == ["fail", "info"]


def test_training_arguments_names_are_an_info_when_transformers_is_not_installed(app, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    res = CliRunner().invoke(app, ["check", str(FORMATS_DATA / "ta.yaml"), "--json"])
    assert res.exit_code == 0, res.output
    (names,) = _items(res, "names")
    assert names["status"] == "info" and "transformers is not installed" in names["message"]
    assert "pip install transformers" in names["fix"]


_ACCELERATE = "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"


def _with_deepspeed(fmt: str, value: str) -> tuple[str, str]:
    """(file name, text) of a ``fmt`` config that names the DeepSpeed file ``value``."""
    quoted = json.dumps(value)
    if fmt == "llamafactory":
        text = (FORMATS_DATA / "lf_lora_sft.yaml").read_text().replace("deepspeed: ds_z3.json", f"deepspeed: {quoted}")
        return "lf.yaml", text
    if fmt == "axolotl":
        return "ax.yaml", (FORMATS_DATA / "axolotl_lora.yaml").read_text() + f"deepspeed: {quoted}\n"
    if fmt == "training_args":
        return "args.json", json.dumps({"output_dir": "o", "bf16": True, "seed": 1, "deepspeed": value})
    return "acc.yaml", _ACCELERATE + f"  deepspeed_config_file: {quoted}\n"


@pytest.mark.parametrize("fmt", ["llamafactory", "axolotl", "training_args", "accelerate"])
@pytest.mark.parametrize("target", ["missing", "folder", "device"])
def test_a_deepspeed_file_that_is_missing_or_not_a_file_fails_naming_the_key(app, tmp_path, monkeypatch, fmt,
                                                                              target):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds_folder.json").mkdir()
    value = {"missing": "no_such_ds.json", "folder": "ds_folder.json", "device": "/dev/zero"}[target]
    name, text = _with_deepspeed(fmt, value)
    (tmp_path / name).write_text(text)
    res = CliRunner().invoke(app, ["check", str(tmp_path / name), "--json"])
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["context"]["format"] == fmt
    (item,) = _items(res, "files")
    key = "deepspeed_config.deepspeed_config_file" if fmt == "accelerate" else "deepspeed"
    assert item["status"] == "fail" and item["message"].startswith(f"{key}: ")
    assert {"missing": "does not exist", "folder": "is a folder", "device": "is a device"}[target] in item["message"]
    assert item["fix"]


def test_a_deepspeed_file_that_is_there_is_read_and_passes(app, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ds_z3.json").write_bytes((FORMATS_DATA / "ds_z3.json").read_bytes())
    name, text = _with_deepspeed("llamafactory", "ds_z3.json")
    (tmp_path / "sub" / name).write_text(text)  # beside the config, not in the working directory
    res = CliRunner().invoke(app, ["check", str(tmp_path / "sub" / name), "--json"])
    assert res.exit_code == 0, res.output
    assert [i["status"] for i in _items(res, "files")] == ["pass"]
    assert "ds_z3.json" in json.loads(res.stdout)["files"]


@pytest.mark.parametrize("name, text, key", [
    ("ax.yaml", (FORMATS_DATA / "axolotl_lora.yaml").read_text().replace(
        "path: mhenrichsen/alpaca_2k_test", "path: ./no_such_data.jsonl"), "datasets[0].path"),
    ("lf.yaml", (FORMATS_DATA / "lf_lora_sft.yaml").read_text().replace("deepspeed: ds_z3.json", "")
     + "dataset_dir: /no/such/folder\n", "dataset_dir"),
    ("sft.yaml", (FORMATS_DATA / "trl_sft.yaml").read_text() + "dataset_name: data/no_such.jsonl\n", "dataset_name"),
])
def test_a_local_dataset_that_is_missing_fails_naming_the_key(app, tmp_path, monkeypatch, name, text, key):
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(text)
    res = CliRunner().invoke(app, ["check", str(tmp_path / name), "--json"])
    assert res.exit_code == 1, res.output
    (item,) = _items(res, "files")
    assert item["status"] == "fail" and item["message"].startswith(f"{key}: ") and "does not exist" in item["message"]
    # a Hub dataset id is not a local path: not judged
    if name == "ax.yaml":
        (tmp_path / name).write_text((FORMATS_DATA / "axolotl_lora.yaml").read_text())
        res = CliRunner().invoke(app, ["check", str(tmp_path / name), "--json"])
        assert _items(res, "files") == []


def test_a_trl_sft_cli_config_is_read_as_trl_reads_it(tmp_path: Path) -> None:
    """`trl sft --config` reads SFTConfig, ModelConfig and ScriptArguments from one file: the model's and the
    dataset's keys are valid there, PEFT is seen, and a key TRL renamed is named with its new name."""
    pytest.importorskip("trl")
    from autotune.cli.app import app
    from autotune.formats import read_config

    text = ("model_name_or_path: Qwen/Qwen2.5-0.5B\ndataset_name: trl-lib/Capybara\nuse_peft: true\nlora_r: 32\n"
            "lora_alpha: 64\nlora_target_modules: [q_proj, v_proj]\nmax_seq_length: 1024\noutput_dir: out\n"
            "per_device_train_batch_size: 2\nbf16: true\npacking: false\n")
    path = tmp_path / "sft.yaml"
    path.write_text(text)
    res = CliRunner().invoke(app, ["check", str(path), "--format", "trl", "--json"])
    items = json.loads(res.stdout)["items"]
    fails = [i for i in items if i["status"] == "fail"]
    assert [i["message"] for i in fails] == ["max_seq_length was renamed to max_length in TRL"], fails
    assert fails[0]["fix"] == "rename to max_length"
    levers = next(i for i in items if i["id"] == "memory_levers")
    assert "LoRA r=32" in levers["message"]
    req = read_config("sft.yaml", text, fmt="trl").request
    assert (req["model"], req["mode"], req["lora_r"], req["lora_alpha"], req["lora_targets"]) == (
        "Qwen/Qwen2.5-0.5B", "lora", 32, 64, "q_proj,v_proj")


@pytest.mark.parametrize("seq,status,needle", [
    (4096, "info", "long sequences keep a GPU's matmuls large"),
    (512, "warn", "too few tokens per micro-batch"),
    (None, "info", "unless the sequences are long"),
])
def test_micro_batch_1_is_judged_by_its_tokens_where_the_file_states_its_length(
    tmp_path: Path, seq: int | None, status: str, needle: str,
) -> None:
    """An 8B model at 4k tokens trains at micro-batch 1 for good reasons: that is not 'too small'."""
    from autotune.cli.app import app

    cfg = {"output_dir": "o", "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True}
    name = "sft.json" if seq is not None else "training_args.json"
    if seq is not None:
        cfg.update(max_length=seq, packing=False)
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    extra = ["--format", "trl"] if seq is not None else []
    res = CliRunner().invoke(app, ["check", str(path), *extra, "--json"])
    item = next(i for i in json.loads(res.stdout)["items"] if i["id"] == "batch")
    assert item["status"] == status and needle in item["message"], item


def test_a_trl_sft_configs_model_keys_of_the_wrong_type_are_one_line_each(tmp_path: Path) -> None:
    """`use_peft`/`lora_r`/... are read into the request: a wrong type is named once, by check and by run."""
    from autotune.cli.app import app

    path = tmp_path / "sft.yaml"
    path.write_text("use_peft: true\nlora_r: many\noutput_dir: o\nper_device_train_batch_size: 2\nbf16: true\n")
    res = CliRunner().invoke(app, ["check", str(path), "--format", "trl", "--json"])
    fails = [i["message"] for i in json.loads(res.stdout)["items"] if i["status"] == "fail"]
    assert fails == ["lora_r must be an integer >= 1, got 'many'"], fails
    run = CliRunner().invoke(app, ["run", "--from", str(path), "--format", "trl", "--gpu-budget", "8GB", "--model",
                                   "tiny-llama", "--device", "cpu", "--out", str(tmp_path / "out")])
    assert run.exit_code == 2 and "lora_r must be an integer >= 1" in run.output
    assert not (tmp_path / "out").exists()


def test_an_unknown_key_is_named_as_the_file_has_it_with_the_format_s_own_key_as_the_fix(tmp_path: Path) -> None:
    """The checklist speaks the file's vocabulary, but an unknown key is quoted as written: an Axolotl file's
    ``per_device_train_batch_size`` was reported as ``micro_batch_size`` (its valid key), whose removal the fix
    then asked for."""
    from autotune.cli.check import bundle_from_file

    src = tmp_path / "ax.yaml"
    src.write_text("base_model: tiny-llama\nadapter: lora\nmicro_batch_size: 2\ngradient_accumulation_steps: 4\n"
                   "per_device_train_batch_size: 4\nsequence_len: 64\n")
    names = [i for i in gather(bundle_from_file(src)).items if i.id == "names"]
    assert [(i.message.split()[0], i.fix) for i in names] == [("per_device_train_batch_size",
                                                               "remove it, or use micro_batch_size")]


def test_a_deepspeed_config_whose_fixed_batch_differs_from_the_training_arguments_fails(tmp_path: Path) -> None:
    from autotune.cli.check import bundle_from_file

    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto", '
                                      '"zero_optimization": {"stage": 2}}')
    src = tmp_path / "ta.json"
    src.write_text('{"output_dir": "o", "per_device_train_batch_size": 8, "deepspeed": "ds.json"}')
    items = [i for i in gather(bundle_from_file(src)).items if i.id == "ds_agrees"]
    assert [i.status for i in items] == ["fail"]
    assert "train_micro_batch_size_per_gpu 2 against per_device_train_batch_size 8" in items[0].message
    src.write_text('{"output_dir": "o", "per_device_train_batch_size": 2, "deepspeed": "ds.json"}')
    assert not [i for i in gather(bundle_from_file(src)).items if i.id == "ds_agrees"]


def test_bf16_and_fp16_both_true_fails_in_check_and_is_refused_by_run_from() -> None:
    from autotune.formats import value_problems

    items = [i for i in gather(bundle(training_args={"bf16": True, "fp16": True})).items if i.id == "precision"]
    assert [i.status for i in items] == ["fail"] and "both true" in items[0].message
    assert any("bf16 and fp16 are both true" in m for m in value_problems("trl", {"bf16": True, "fp16": True}, "f"))
    assert not value_problems("trl", {"bf16": True, "fp16": False}, "f")
    # DeepSpeed asserts on the same contradiction in its own config ("cannot be simultaneously enabled")
    ds = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}, "fp16": {"enabled": True}}
    (item,) = gather(bundle(deepspeed=ds)).by_id("precision")
    assert item.status == "fail" and "DeepSpeed refuses to start" in item.message and item.source == "deepspeed.json"


@pytest.mark.parametrize(("kind", "data", "fix"), [
    ("training_args", {"bf16": True}, "set fp16: true, bf16: false"),
    ("accelerate", {"mixed_precision": "bf16"}, "set mixed_precision: fp16"),
    ("deepspeed", {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}},
     "set fp16.enabled: true, bf16.enabled: false"),
])
def test_the_precision_fix_is_written_in_the_keys_of_the_file_that_set_it(kind, data, fix) -> None:
    """A T4 has no bf16: the fix names the key of the file the precision was read from (a top-level fp16: in an
    accelerate or DeepSpeed file does nothing)."""
    (item,) = gather(bundle(**{kind: data}), gpu=T4).by_id("precision")
    assert item.status == "fail" and item.fix == fix, item


def test_bf16_asked_for_outside_the_precision_keys_is_said_on_a_card_without_it() -> None:
    """A T4: the model loaded in bfloat16 (model kwargs' or TRL's dtype) and bf16_full_eval passed beside fp16."""
    for data in ({"training_args": {"fp16": True}, "model_kwargs": {"dtype": "bfloat16"}},
                 {"training_args": {"fp16": True, "dtype": "bfloat16"}},
                 {"training_args": {"fp16": True, "bf16_full_eval": True}}):
        items = gather(bundle(**data), gpu=T4).by_id("precision")
        assert [i.status for i in items] == ["warn", "pass"] and "T4 has no bf16" in items[0].message, items
        assert not [i for i in gather(bundle(**data), gpu=A10G).by_id("precision") if "has no bf16" in i.message]


def test_a_card_without_flash_attention_2_is_never_advised_it() -> None:
    """check --gpu T4: packing and attention advice name sdpa, not flash_attention_2, which the T4 cannot run."""
    for gpu, offered in ((T4, False), (A10G, True)):
        r = gather(bundle(training_args={"bf16": gpu.bf16, "fp16": not gpu.bf16}), gpu=gpu)
        advice = [f"{i.message} {i.fix}" for i in r.items if i.id in ("packing", "attention")]
        assert advice and all(("'flash_attention_2'" in a or "with flash_attention_2" in a) == offered
                              for a in advice), advice
    eager = gather(bundle(training_args={"fp16": True}, model_kwargs={"attn_implementation": "eager"}), gpu=T4)
    assert eager.by_id("attention")[0].fix == "attn_implementation: sdpa"


def test_a_name_transformers_refuses_fails_the_check_and_the_run_from(tmp_path: Path) -> None:
    """optim, lr_scheduler_type, the strategies and report_to hold names TrainingArguments (or the Trainer) refuses
    outside its own: such a file does not start, so check fails it with the nearest name, and run --from refuses it."""
    from _cli import cli

    from autotune.env import training_enums

    enums = training_enums()
    assert {"adamw_torch", "adamw_torch_fused"} <= enums["optim"] and "cosine" in enums["lr_scheduler_type"]
    assert {"steps", "epoch"} <= enums["save_strategy"] and {"tensorboard", "none"} <= enums["report_to"]
    ta = {"optim": "adamw_torchh", "lr_scheduler_type": "cosine", "report_to": ["tensorboard", "wandbb"]}
    items = gather(bundle(training_args=ta), enums=enums).by_id("types")
    assert [(i.status, i.fix) for i in items] == [("fail", "optim: adamw_torch"), ("fail", "report_to: wandb")]
    assert not gather(bundle(training_args={**ta, "optim": "adamw_torch", "report_to": "none"}),
                      enums=enums).by_id("types")
    src = tmp_path / "args.json"
    src.write_text(json.dumps({"output_dir": "o", "per_device_train_batch_size": 2, "save_strategy": "step"}))
    assert cli(tmp_path, "check", str(src)).returncode == 1
    p = cli(tmp_path, "run", "--from", str(src), "--model", "tiny-llama", "--device", "cpu", "--gpu-budget", "3GB",
            "--out", str(tmp_path / "out"), fake=True)
    assert p.returncode == 2 and "save_strategy 'step'" in p.stderr and "save_strategy: steps" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("value", "make", "needle"), [
    ("adir", lambda p: p.mkdir(), "is a folder"),
    ("ds.yaml", lambda p: p.write_text("zero_optimization:\n  stage: 2\n"), "is not a DeepSpeed JSON file"),
    ("ds_bad.json", lambda p: p.write_text('{"zero_optimization": {"stage": 2},}'), "is not a DeepSpeed JSON file"),
])
def test_a_deepspeed_reference_the_trainer_cannot_read_fails_whatever_its_suffix(tmp_path: Path, value: str, make,
                                                                                  needle: str) -> None:
    """transformers reads any string as a path (or base64 JSON) with json.load: a folder, a YAML file or broken
    JSON is a FAIL naming the key, not skipped for its suffix nor a whole-check exit 2."""
    from autotune.cli.check import bundle_from_file

    make(tmp_path / value)
    src = tmp_path / "ta.json"
    src.write_text(json.dumps({"output_dir": "o", "deepspeed": value}))
    items = [i for i in gather(bundle_from_file(src)).items if i.id == "files"]
    assert [i.status for i in items] == ["fail"] and needle in items[0].message, items


def test_a_deepspeed_config_given_as_base64_json_is_read_not_looked_for() -> None:
    import base64

    from autotune.formats import distributed_setup, file_references

    encoded = base64.b64encode(b'{"zero_optimization": {"stage": 3}}').decode()
    assert file_references("training_args", {"deepspeed": encoded}) == []
    fixed = base64.b64encode(b'{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4}').decode()
    items = gather(bundle(training_args={"per_device_train_batch_size": 2, "deepspeed": fixed})).items
    assert [i.status for i in items if i.id == "ds_agrees"] == ["fail"]  # read as the inline mapping is
    setup, _ = distributed_setup({"deepspeed": encoded}, Path("ta.json"))
    assert setup is not None and setup["zero_stage"] == 3


def test_an_axolotl_value_run_from_refuses_is_a_fail_in_check(tmp_path: Path) -> None:
    from autotune.cli.check import bundle_from_file

    src = tmp_path / "ax.yaml"
    src.write_text("base_model: tiny-llama\nadapter: lora\nmicro_batch_size: 2\nsequence_len: 0\n")
    items = [i for i in gather(bundle_from_file(src)).items if i.id == "types"]
    assert [i.status for i in items] == ["fail"] and "sequence_len must be an integer >= 8" in items[0].message


def test_a_key_set_twice_is_a_warning_naming_its_lines_and_the_value_read(tmp_path: Path) -> None:
    """YAML and JSON readers keep a repeated key's last value without a word: the first line reads as the setting
    and is dead. check names the key (in the file's own words), its lines and the value read, and judges that one."""
    from autotune.cli.check import bundle_from_file
    from autotune.spec.files import repeated_keys

    ax = tmp_path / "axolotl.yaml"
    ax.write_text("base_model: m\nmicro_batch_size: 4\ngradient_accumulation_steps: 8\nmicro_batch_size: 2\n"
                  "lora_r: 8\nmicro_batch_size: 1\n")
    ta = tmp_path / "args.json"
    ta.write_text('{"per_device_train_batch_size": 4,\n "learning_rate": 1e-4,\n "per_device_train_batch_size": 2}\n')
    for path, key, times, lines, value in ((ax, "micro_batch_size", 3, [2, 4, 6], 1),
                                           (ta, "per_device_train_batch_size", 2, [1, 3], 2)):
        items = gather(bundle_from_file(path)).items
        (warn,) = [i for i in items if i.id == "repeated"]
        assert warn.status == "warn" and warn.message == (
            f"{key} is set {times} times (lines {', '.join(map(str, lines))}): the training tool reads the last, {value}")
        assert warn.fix == f"keep one {key}"
        (batch,) = [i for i in items if i.id == "batch"]
        assert f"micro-batch {value} " in batch.message, batch.message
    once = tmp_path / "once.yaml"
    once.write_text("micro_batch_size: 4\ngradient_accumulation_steps: 8\nbase_model: m\n")
    assert not [i for i in gather(bundle_from_file(once)).items if i.id == "repeated"]
    # nested mappings are not looked at; a JSON key also written inside a nested object has no lines
    assert repeated_keys("a: 1\nb: {a: 2, a: 3}\n", yaml_text=True) == []
    assert repeated_keys('{"a": 1, "b": {"a": 2}, "a": 3}', yaml_text=False) == [("a", 2, [])]
    assert repeated_keys("[1, 1]", yaml_text=False) == repeated_keys("- 1\n- 1\n", yaml_text=True) == []
    assert repeated_keys('\ufeff{"a": 1,\n"a": 2}', yaml_text=False) == [("a", 2, [1, 2])]  # a BOM is not content


def test_an_answer_folder_without_its_training_args_says_so(tmp_path: Path) -> None:
    """A best/ copied in part (training_args.json left behind): its train.py would not start, and the items that file
    judges say nothing, so the check FAILs naming the missing file; a whole folder has no such item."""
    from autotune.cli.check import load_bundle

    (tmp_path / "train.py").write_text("# train.py\n")
    (tmp_path / "model_kwargs.json").write_text('{"attn_implementation": "sdpa"}')
    (item,) = [i for i in gather(load_bundle(tmp_path)).items if i.id == "files"]
    assert item.status == "fail" and "training_args.json is not in" in item.message, item
    (tmp_path / "training_args.json").write_text('{"per_device_train_batch_size": 2, "seed": 1}')
    assert not [i for i in gather(load_bundle(tmp_path)).items if i.id == "files"]
