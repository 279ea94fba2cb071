"""What running the real LLaMA-Factory and Axolotl found (tests/test_clients.py runs them), pinned down here
without them: each test failed on the code before its fix."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml

from autotune.check import gather
from autotune.cli.check import bundle_from_file
from autotune.emit import build_files, emit_all
from autotune.env import training_fields
from autotune.formats import known_keys, read_config, tuned_file
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "formats"
CLIENTS = ROOT / "data" / "clients"
FIELDS = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}


def _cand(**kw) -> dict:
    return dataclasses.asdict(Candidate(**{"micro_batch": 4, "grad_accum": 2, "precision": "fp32", **kw}))


def _result(cand: Candidate, *, mode="full", device="cpu", **wl) -> ProbeResult:
    req = ProbeRequest(workload=Workload(model="tiny", seq_len=64, mode=mode, **wl), candidate=cand,
                       settings=ProbeSettings(device=device))
    return ProbeResult(status="ok", request=req.to_dict(), metrics={"tokens_per_s": 1.0, "mean_seq_len": 64.0})


# ---------------------------------------------------------------- LLaMA-Factory write-back


@pytest.mark.parametrize("ckpt", [True, False])
def test_llamafactory_write_back_uses_its_own_checkpointing_switch(ckpt: bool) -> None:
    cfg = read_config("l.yaml", (DATA / "lf_lora_sft.yaml").read_text())
    out, updates = tuned_file(cfg, _cand(grad_ckpt=ckpt), fields=FIELDS)
    after = yaml.safe_load(out)
    assert "activation_checkpointing" not in after and "gradient_checkpointing" not in after  # LLaMA-Factory refuses it
    # its default is ON: "off" must be written, "on" is its non-reentrant form (the default is reentrant)
    assert after.get("disable_gradient_checkpointing", False) is (not ckpt)
    if ckpt:
        assert after["use_reentrant_gc"] is False
    assert read_config("l.yaml", out).request["grad_ckpt"] is ckpt


def test_llamafactory_write_back_packs_with_neat_packing() -> None:
    cfg = read_config("l.yaml", (DATA / "lf_lora_sft.yaml").read_text())
    after = yaml.safe_load(tuned_file(cfg, _cand(packing=True), fields=FIELDS)[0])
    assert after["neat_packing"] is True and after["packing"] is True


def test_llamafactory_checkpointing_default_is_on_for_check_and_request() -> None:
    text = (CLIENTS / "llamafactory" / "qwen3_lora_sft.yaml").read_text()
    assert read_config("l.yaml", text).request["grad_ckpt"] is True
    rep = _check(CLIENTS / "llamafactory" / "qwen3_lora_sft.yaml")
    (levers,) = rep.by_id("memory_levers")
    assert "activation checkpointing on" in levers.message
    off = read_config("l.yaml", text + "disable_gradient_checkpointing: true\n").request
    assert off["grad_ckpt"] is False


# ---------------------------------------------------------------- LLaMA-Factory's own transformers


def test_llamafactory_keys_are_its_pinned_releases_not_the_installed_transformers() -> None:
    keys = known_keys("llamafactory", ta_fields=FIELDS)
    assert "activation_checkpointing" not in keys  # transformers 5.24 has it, LLaMA-Factory's 5.6 does not
    assert {"disable_gradient_checkpointing", "neat_packing", "warmup_ratio", "per_device_train_batch_size"} <= keys
    from autotune.formats.llamafactory import accepted_fields, llamafactory_config

    req = ProbeRequest(workload=Workload(model="tiny", seq_len=64), candidate=Candidate(),
                       settings=ProbeSettings(device="cpu"))
    cfg, notes = llamafactory_config(req, fields=FIELDS, device="cpu", accepted=accepted_fields() - {"data_seed"})
    assert "data_seed" not in cfg and any("data_seed" in n for n in notes)


def test_check_fails_a_key_llamafactorys_transformers_does_not_know(tmp_path: Path) -> None:
    path = tmp_path / "l.yaml"
    path.write_text((DATA / "lf_lora_sft.yaml").read_text() + "dataloader_in_order: true\n")
    rep = _check(path)
    assert any("dataloader_in_order" in i.message for i in rep.items if i.status == "fail")


# ---------------------------------------------------------------- paths that work from any folder


def test_emitted_deepspeed_paths_are_absolute(tmp_path: Path) -> None:
    cand = Candidate(micro_batch=2, precision="bf16", world_size=2, zero_stage=3, offload="params")
    emit_all(_result(cand, device="cuda"), tmp_path / "best", fields=FIELDS)
    ds = str((tmp_path / "best" / "deepspeed.json").resolve())
    assert yaml.safe_load((tmp_path / "best" / "llamafactory.yaml").read_text())["deepspeed"] == ds
    assert yaml.safe_load((tmp_path / "best" / "axolotl.yaml").read_text())["deepspeed"] == ds
    acc = yaml.safe_load((tmp_path / "best" / "accelerate_config.yaml").read_text())
    assert acc["deepspeed_config"]["deepspeed_config_file"] == ds


def test_scripts_store_a_relative_tokenizer_and_dataset_as_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok").mkdir()
    (tmp_path / "data.jsonl").write_text('{"text": "a b"}\n')
    emit_all(_result(Candidate(), tokenizer="tok", dataset="data.jsonl"), tmp_path / "best", fields=FIELDS)
    for script in ("train.py", "train_sft.py"):
        text = (tmp_path / "best" / script).read_text()
        line = next(ln for ln in text.splitlines() if ln.startswith("MEASURED = "))
        measured = json.loads(eval(line.split("json.loads(", 1)[1][:-1]))  # the literal the script parses
        assert measured["tokenizer"] == str(tmp_path / "tok"), script
        assert measured["dataset"] == str(tmp_path / "data.jsonl"), script
    lf = yaml.safe_load((tmp_path / "best" / "llamafactory.yaml").read_text())
    assert os.path.isabs(lf["output_dir"]) is False  # run output stays where the user trains


# ---------------------------------------------------------------- Axolotl's own switches


def test_axolotl_lora_kernels_are_written_off() -> None:
    files = build_files(_result(Candidate(), mode="lora"), fields=FIELDS)
    ax = yaml.safe_load(files["axolotl.yaml"])
    kernels = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")
    assert all(ax[k] is False for k in kernels)
    cfg = read_config("a.yaml", (DATA / "axolotl_lora.yaml").read_text())
    out, _ = tuned_file(cfg, _cand())
    assert all(yaml.safe_load(out)[k] is False for k in kernels)
    kept = read_config("a.yaml", (DATA / "axolotl_lora.yaml").read_text() + "lora_mlp_kernel: true\n")
    assert "lora_qkv_kernel" not in tuned_file(kept, _cand())[1]  # one set: Axolotl enables nothing itself


# ---------------------------------------------------------------- the LLaMA-Factory dataset note


def test_llamafactory_note_says_how_to_use_a_save_to_disk_folder() -> None:
    files = build_files(_result(Candidate(), dataset="/data/chat", split="train"), fields=FIELDS)
    note = next(ln for ln in files["llamafactory.yaml"].splitlines() if ln.startswith("# NOTE dataset"))
    assert """python -c 'import datasets; datasets.load_from_disk("/data/chat")["train"].to_json("/data/chat.jsonl")'""" \
        in note
    assert '"file_name": "/data/chat.jsonl"' in note and '"formatting": "sharegpt"' in note
    plain = build_files(_result(Candidate(), dataset="/data/chat.jsonl"), fields=FIELDS)["llamafactory.yaml"]
    assert "load_from_disk" not in plain and '"file_name": "/data/chat.jsonl"' in plain


# ---------------------------------------------------------------- check on the clients' own examples


def _check(path: Path):
    fields, version = training_fields()
    return gather(bundle_from_file(path), fields=fields, transformers_version=version)


EXAMPLES = sorted((CLIENTS / "llamafactory").glob("*.yaml")) + sorted((CLIENTS / "axolotl").glob("*.y*ml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_check_on_the_clients_examples_has_no_false_alarm(path: Path, monkeypatch) -> None:
    monkeypatch.chdir(path.parent)  # LLaMA-Factory's examples name their DeepSpeed file from the repository root
    rep = _check(Path(path.name))
    assert not rep.failed, [i.message for i in rep.items if i.status == "fail"]
    text = " | ".join(f"{i.status} {i.message}" for i in rep.items)
    assert "None" not in text
    assert "warn 0 workers" not in text  # Axolotl sets workers itself; LLaMA-Factory's examples state 4
    assert "activation checkpointing off" not in text  # every one of them checkpoints (LLaMA-Factory: by default)
    (levers,) = rep.by_id("memory_levers")
    if "ZeRO-3" in levers.message or "FSDP" in levers.message.split(";")[0]:
        assert "ZeRO" not in levers.message.split(";")[1], levers.message
    if "4-bit" in levers.message:
        assert "QLoRA" not in levers.message.split(";")[1], levers.message


def test_check_sees_4_bit_fsdp_and_zero3_in_the_examples(monkeypatch) -> None:
    monkeypatch.chdir(CLIENTS / "llamafactory")
    assert "4-bit" in _check(Path("qwen3_lora_sft_otfq.yaml")).by_id("memory_levers")[0].message
    assert "ZeRO-3" in _check(Path("qwen3_lora_sft_ds3.yaml")).by_id("memory_levers")[0].message
    assert "4-bit" in _check(CLIENTS / "axolotl" / "qlora-1b.yml").by_id("memory_levers")[0].message
    rep = _check(CLIENTS / "axolotl" / "fft-8b-liger-fsdp.yaml")
    assert "FSDP" in rep.by_id("memory_levers")[0].message
    deprecated = [i.message for i in rep.by_id("deprecated")]
    assert any("FSDP1" in m for m in deprecated) and any("fsdp_ prefix" in m for m in deprecated)


def test_axolotl_saves_follow_axolotls_own_defaults(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text((DATA / "axolotl_lora.yaml").read_text().replace("saves_per_epoch: 1\n", "save_steps:\n")
                    .replace("save_total_limit: 2\n", ""))
    (item,) = _check(path).by_id("checkpoints")
    assert item.status == "pass" and item.message == "saved every epoch, last 4 kept"


def test_axolotl_write_back_states_0_workers_where_axolotl_would_pick_its_own() -> None:
    text = (CLIENTS / "axolotl" / "lora-1b.yml").read_text()  # no data-loader key: Axolotl sets 1 worker, pinned
    out, updates = tuned_file(read_config("a.yml", text), _cand(workers=0))
    assert updates["dataloader_num_workers"] == 0
    assert read_config("a.yml", out).data["dataloader_num_workers"] == 0
