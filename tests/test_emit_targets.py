"""sft_config.json, axolotl.yaml, llamafactory.yaml: each loads where its library installs, and
every key is one the target declares, with a value of the declared type, where it does not."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

import autotune.emit
from autotune.emit import build_files, emit_all
from autotune.formats import axolotl as ax_mod
from autotune.formats import llamafactory as lf_mod
from autotune.formats import trl as trl_sft
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

transformers = pytest.importorskip("transformers")

SCHEMAS = Path(autotune.emit.__file__).parent / "schemas"

CASES = {
    "full-fp32": (Candidate(micro_batch=2, grad_accum=2, precision="fp32"), "full", "cpu"),
    "packing-ckpt": (Candidate(micro_batch=8, grad_accum=1, precision="fp32", packing=True, grad_ckpt=True), "full", "cpu"),
    "lora-bf16-gpu": (Candidate(micro_batch=4, precision="bf16", attn="flash_attention_2", workers=2), "lora", "cuda"),
    "qlora-liger": (Candidate(micro_batch=1, grad_accum=8, precision="bf16", liger=True, optim="paged_adamw_8bit"), "qlora", "cuda"),
    "zero3-offload": (Candidate(micro_batch=2, precision="bf16", world_size=2, zero_stage=3, offload="params"), "full", "cuda"),
    "fsdp": (Candidate(micro_batch=2, precision="bf16", world_size=2, zero_stage=2, sharding="fsdp", attn="flex_attention"), "full", "cuda"),
}  # fmt: skip


@pytest.fixture(scope="module")
def fields() -> set[str]:
    return {f.name for f in dataclasses.fields(transformers.TrainingArguments)}


def result_for(
    cand: Candidate, mode: str, device: str, *, metrics: dict | None = None, dataset=None
) -> ProbeResult:
    req = ProbeRequest(
        workload=Workload(
            model="tiny", seq_len=64, mode=mode, lora_targets=("q_proj", "v_proj"), dataset=dataset
        ),
        candidate=cand,
        settings=ProbeSettings(device=device),
    )
    return ProbeResult(
        status="ok", request=req.to_dict(), metrics={"tokens_per_s": 1000.0, **(metrics or {})}
    )


def _yaml(text: str) -> dict:
    return yaml.safe_load(text)


# ------------------------------------------------------------------ type checks against declared annotations


def _accepts(annotation: str, value) -> bool:
    """Does a value of this Python type satisfy the declared annotation text (the parts we emit)?"""
    a = annotation
    if value is None:
        return "None" in a or "Optional" in a
    if isinstance(value, bool):
        return bool(re.search(r"\bbool\b", a))
    if isinstance(value, int):
        return bool(re.search(r"\b(int|float)\b", a))
    if isinstance(value, float):
        return bool(re.search(r"\bfloat\b", a))
    if isinstance(value, str):
        if re.search(r"\bstr\b|StrEnum|AttentionFunction|QuantizationMethod|Optimizers", a):
            return True
        lits = re.findall(r"Literal\[([^\]]*)\]", a)
        return any(repr(value) in lit or f'"{value}"' in lit for lit in lits)
    if isinstance(value, list):
        return bool(re.search(r"\blist\b|\bList\b", a))
    if isinstance(value, dict):
        return bool(re.search(r"\bdict\b|\bDict\b|Config\b", a))
    return False


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}_keys.json").read_text())


def test_schema_files_say_where_they_came_from():
    for name, repo in (("axolotl", "axolotl-ai-cloud/axolotl"), ("llamafactory", "hiyouga/LLaMA-Factory")):
        src = _schema(name)["source"]
        assert src["repo"] == repo and re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and src["paths"]


def test_type_check_rejects_wrong_types():
    assert not _accepts("int | None", "8")
    assert not _accepts("bool", 1)
    assert not _accepts("Literal['lora', 'full']", "qlora")
    assert _accepts("Literal['lora', 'full']", "lora")


@pytest.mark.parametrize("case", sorted(CASES))
def test_axolotl_yaml_keys_and_types_match_axolotls_schema(fields, case):
    cand, mode, device = CASES[case]
    files = build_files(result_for(cand, mode, device, metrics={"mean_seq_len": 20.0}), fields=fields)
    cfg = _yaml(files["axolotl.yaml"])
    sections = _schema("axolotl")["sections"]
    top = sections[""]
    for key, value in cfg.items():
        assert key in top or key in sections["plugin:liger"], f"axolotl has no key {key!r}"
        ann = top.get(key) or sections["plugin:liger"][key]
        assert _accepts(ann, value), f"{key}={value!r} does not match axolotl's {ann}"
    for key, value in cfg.get("fsdp_config", {}).items():
        assert key in sections["fsdp_config"] and _accepts(sections["fsdp_config"][key], value)
    # the levers land where Axolotl reads them
    assert cfg["gradient_accumulation_steps"] == cand.grad_accum
    assert cfg["attn_implementation"] == cand.attn
    assert cfg["bf16"] is (cand.precision == "bf16")
    assert cfg["optimizer"] == cand.optim
    assert cfg.get("adapter") == (None if mode == "full" else mode)
    assert ("deepspeed" in cfg) == (cand.zero_stage > 0 and cand.sharding == "deepspeed")
    if "deepspeed" in cfg:
        assert cfg["deepspeed"] == "deepspeed.json" and "deepspeed.json" in files


def test_packed_rows_and_accumulation_hold_the_steps_sequences(fields):
    """Rows are whole: 2 sequences of 657 row tokens at 4,096 are 0.32 of a row, written 1; at the measured
    accumulation of 16, a step held 16 rows, about 100 sequences for the 32 asked. The accumulation written makes
    the rows hold the step's sequences (5 rows, 31); a probe's own config keeps its window's accumulation."""
    from autotune.formats import Measured
    from autotune.formats._common import packed_batch

    at = Measured(seq_len=4096, mean_seq_len=657.0)
    assert packed_batch(2, 16, at) == (1, 5)
    assert packed_batch(8, 4, at) == (1, 5)
    assert packed_batch(16, 2, at) == (3, 2)  # 2.57 rows a micro-batch: 6 rows for 5.1
    assert packed_batch(2, 16, Measured(seq_len=4096, mean_seq_len=657.0, probe=True)) == (1, 16)
    assert packed_batch(2, 16, Measured(seq_len=4096)) == (2, 16)  # an older result, no mean: as measured
    cand = Candidate(micro_batch=8, grad_accum=8, precision="fp32", packing=True)
    best = result_for(cand, "lora", "cpu", metrics={"mean_seq_len": 20.0, "pack_fill": 1.0})
    files = build_files(best, fields=fields)
    ax, lf = _yaml(files["axolotl.yaml"]), _yaml(files["llamafactory.yaml"])
    sft = json.loads(files["sft_config.json"])
    rows_per_step = 8 * 8 * 20 / 64  # 20 rows hold the step's 64 sequences
    for mb, acc in ((ax["micro_batch_size"], ax["gradient_accumulation_steps"]),
                    (lf["per_device_train_batch_size"], lf["gradient_accumulation_steps"]),
                    (sft["per_device_train_batch_size"], sft["gradient_accumulation_steps"])):
        assert (mb, acc) == (2, 10) and mb * acc == rows_per_step  # (the measured 8 would have made 16)
    assert not [n for n in files["axolotl.yaml"].splitlines() if "effective batch: rows are whole" in n]  # 64 held


def test_a_packed_step_whole_rows_cannot_match_is_said_in_the_file(fields):
    """8 sequences of 24 row tokens at 128 are 1.5 rows: whole rows hold ~11 (or ~5), not the 8 measured; the
    Axolotl and LLaMA-Factory files say so beside their batch (train.py holds 8); within 10 % nothing is said."""
    from autotune.formats import Measured
    from autotune.formats._common import packed_drift_note

    assert packed_drift_note(2, 16, Measured(seq_len=4096, mean_seq_len=657.0)) is None  # 31 for 32
    assert packed_drift_note(8, 1, Measured(seq_len=128, mean_seq_len=24.0, probe=True)) is None
    cand = Candidate(micro_batch=8, grad_accum=1, precision="fp32", packing=True)
    # (result_for's sequences are 64 tokens: 8 of 12 row tokens are the same 1.5 rows)
    files = build_files(result_for(cand, "lora", "cpu", metrics={"mean_seq_len": 12.0, "pack_fill": 1.0}),
                        fields=fields)
    for name in ("axolotl.yaml", "llamafactory.yaml"):
        (note,) = [n for n in files[name].splitlines() if "effective batch: rows are whole" in n]
        assert "2 row(s) x 1 hold ~11 sequences" in note and "not the 8 measured (+33%" in note, note


def test_packed_files_under_deepspeed_leave_the_batch_to_the_trainer(fields):
    """deepspeed.json states the measured micro-batch of sequences; Axolotl's and LLaMA-Factory's packed batch
    counts rows, and the HF integration refuses a DeepSpeed batch that differs from the trainer's: their files name
    deepspeed_packed.json, the same config with the batch left to the trainer."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    cand = Candidate(micro_batch=8, grad_accum=4, precision="fp32", packing=True, world_size=2, zero_stage=2)
    files = build_files(result_for(cand, "full", "cpu", metrics={"mean_seq_len": 20.0, "pack_fill": 1.0}),
                        fields=fields)
    ds, packed = json.loads(files["deepspeed.json"]), json.loads(files["deepspeed_packed.json"])
    assert ds["train_micro_batch_size_per_gpu"] == 8 and {k: v for k, v in packed.items() if v != "auto"} == {
        k: v for k, v in ds.items() if k not in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")}
    ax, lf = _yaml(files["axolotl.yaml"]), _yaml(files["llamafactory.yaml"])
    assert ax["deepspeed"] == lf["deepspeed"] == "deepspeed_packed.json"
    for name in ("deepspeed.json", "deepspeed_packed.json"):
        args = transformers.TrainingArguments(output_dir="o", per_device_train_batch_size=ax["micro_batch_size"],
                                              gradient_accumulation_steps=ax["gradient_accumulation_steps"],
                                              use_cpu=True)
        hf = HfTrainerDeepSpeedConfig(json.loads(files[name]))
        if name == "deepspeed.json":
            hf.trainer_config_process(args)
            with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu=8 vs hf per_device_train_batch_size=2"):
                hf.trainer_config_finalize(args, None, 100)
            continue
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, None, 100)
        assert hf.config["train_micro_batch_size_per_gpu"] == ax["micro_batch_size"] == 2
    unpacked = build_files(result_for(dataclasses.replace(cand, packing=False), "full", "cpu"), fields=fields)
    assert "deepspeed_packed.json" not in unpacked and _yaml(unpacked["axolotl.yaml"])["deepspeed"] == "deepspeed.json"


def test_axolotl_packing_counts_rows_and_says_so(fields):
    cand, mode, device = CASES["packing-ckpt"]
    # 8 sequences of mean 20 tokens hold 160 tokens: round(160 / 64) = 2 full rows
    files = build_files(result_for(cand, mode, device, metrics={"mean_seq_len": 20.0}), fields=fields)
    cfg = _yaml(files["axolotl.yaml"])
    assert cfg["sample_packing"] is True and cfg["pad_to_sequence_len"] is True
    assert cfg["micro_batch_size"] == round(8 * 20 / 64)
    assert "# NOTE packing:" in files["axolotl.yaml"] and "counts rows" in files["axolotl.yaml"]
    # without a recorded mean length: the measured sequences as rows (the worst case's memory), and it says so
    files = build_files(result_for(cand, mode, device), fields=fields)
    assert _yaml(files["axolotl.yaml"])["micro_batch_size"] == 8
    assert "no mean length recorded" in files["axolotl.yaml"]


def test_axolotl_datasets_entry_uses_the_measured_column(fields):
    cand, mode, device = CASES["full-fp32"]
    best = result_for(cand, mode, device, metrics={"dataset_column": "messages"}, dataset="/data/chat")
    cfg = _yaml(build_files(best, fields=fields)["axolotl.yaml"])
    ds_keys = _schema("axolotl")["sections"]["datasets[]"]
    assert cfg["datasets"] == [{"path": "/data/chat", "type": "chat_template"}]
    assert set(cfg["datasets"][0]) <= set(ds_keys)


@pytest.mark.parametrize("case", sorted(CASES))
def test_llamafactory_yaml_keys_and_types_match(fields, case):
    cand, mode, device = CASES[case]
    files = build_files(result_for(cand, mode, device, metrics={"mean_seq_len": 20.0}), fields=fields)
    cfg = _yaml(files["llamafactory.yaml"])
    own = _schema("llamafactory")["sections"][""]
    seq2seq = {f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)}
    for key, value in cfg.items():
        if key in own:
            assert _accepts(own[key], value), f"{key}={value!r} does not match LLaMA-Factory's {own[key]}"
        else:
            assert key in seq2seq, f"neither LLaMA-Factory nor Seq2SeqTrainingArguments has {key!r}"
    assert set(lf_mod.OWN_KEYS) <= set(own)
    assert cfg["disable_gradient_checkpointing"] is (not cand.grad_ckpt)
    assert cfg["finetuning_type"] == ("full" if mode == "full" else "lora")
    assert cfg["flash_attn"] == lf_mod.FLASH_ATTN_VALUES[cand.attn]
    if mode == "qlora":
        assert cfg["quantization_bit"] == 4
    if cand.zero_stage and cand.sharding == "deepspeed":
        assert cfg["deepspeed"] == "deepspeed.json"


def test_llamafactory_flex_attention_and_packing_are_commented(fields):
    text = build_files(result_for(*CASES["fsdp"], metrics={"mean_seq_len": 20.0}), fields=fields)[
        "llamafactory.yaml"
    ]
    assert "# NOTE attention:" in text and "flex_attention" in text
    text = build_files(result_for(*CASES["packing-ckpt"], metrics={"mean_seq_len": 20.0}), fields=fields)[
        "llamafactory.yaml"
    ]
    cfg = _yaml(text)
    assert cfg["neat_packing"] is True and cfg["per_device_train_batch_size"] == round(8 * 20 / 64)
    assert "# NOTE packing:" in text


def test_lever_maps_name_real_keys(fields):
    trl = pytest.importorskip("trl")
    sft_fields = {f.name for f in dataclasses.fields(trl.SFTConfig)}
    ax = _schema("axolotl")["sections"]
    ax_keys = set(ax[""]) | set(ax["plugin:liger"])
    lf_keys = set(_schema("llamafactory")["sections"][""]) | {
        f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)
    }
    for keys in trl_sft.LEVER_KEYS.values():
        assert all(k in sft_fields for k in keys), keys
    for keys in ax_mod.LEVER_KEYS.values():
        assert all(k in ax_keys for k in keys), keys
    for keys in lf_mod.LEVER_KEYS.values():
        assert all(k in lf_keys for k in keys), keys


# ------------------------------------------------------------------ TRL: the library's own loader


@pytest.mark.parametrize("case", ["full-fp32", "packing-ckpt", "lora-bf16-gpu", "qlora-liger"])
def test_sft_config_json_loads_as_trl_sftconfig(tmp_path, fields, case):
    trl = pytest.importorskip("trl")
    cand, mode, device = CASES[case]
    if cand.liger:
        pytest.importorskip("liger_kernel")
    if device == "cuda":
        pytest.skip("an SFTConfig for a GPU needs one (bf16/tf32 are checked against the device)")
    emit_all(result_for(cand, mode, device), tmp_path, fields=fields)
    kw = json.loads((tmp_path / "sft_config.json").read_text())
    assert set(trl_sft.SFT_KEYS) <= {f.name for f in dataclasses.fields(trl.SFTConfig)}
    cfg = trl.SFTConfig(output_dir=str(tmp_path / "out"), **kw)
    assert cfg.per_device_train_batch_size == cand.micro_batch  # no mean length recorded: rows = sequences
    assert cfg.gradient_accumulation_steps == cand.grad_accum
    assert cfg.max_length == 64
    assert cfg.packing is cand.packing
    if cand.packing:
        assert cfg.packing_strategy == "bfd"
    ckpt = getattr(cfg, "activation_checkpointing", None)
    assert bool(ckpt if ckpt is not None else cfg.gradient_checkpointing) is cand.grad_ckpt
    # the tuned TrainingArguments keys are the same as training_args.json's
    targs = json.loads((tmp_path / "training_args.json").read_text())
    targs.pop("remove_unused_columns", None)
    assert {k: v for k, v in kw.items() if k in targs} == targs


def test_sft_config_gpu_keys_match_training_args(fields):
    files = build_files(result_for(*CASES["lora-bf16-gpu"]), fields=fields)
    kw, targs = json.loads(files["sft_config.json"]), json.loads(files["training_args.json"])
    assert kw["bf16"] is True and kw["tf32"] is True and kw["dataloader_num_workers"] == 2
    assert set(kw) - set(targs) == {"max_length", "packing"} and {"max_length", "packing"} <= trl_sft.SFT_KEYS


def test_emit_all_writes_the_target_files_executable_script(tmp_path, fields):
    emit_all(result_for(*CASES["full-fp32"]), tmp_path, fields=fields)
    for name in ("sft_config.json", "train_sft.py", "axolotl.yaml", "llamafactory.yaml"):
        assert (tmp_path / name).is_file()
    assert (tmp_path / "train_sft.py").stat().st_mode & 0o100
    compile((tmp_path / "train_sft.py").read_text(), "train_sft.py", "exec")


# ------------------------------------------------------------------ train_sft.py runs as written


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False, True])
def test_train_sft_py_runs_on_a_save_to_disk_chat_dataset(tmp_path, fields, packing):
    import subprocess
    import sys

    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    tok_dir = Path(autotune.emit.__file__).parent.parent / "models" / "tokenizers" / "tiny-chat"
    chat = [
        {"role": "user", "content": "how fast is the model ?"},
        {"role": "assistant", "content": "very fast ."},
    ]
    data = tmp_path / "chat"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"messages": [chat] * 16})}).save_to_disk(
        str(data)
    )
    model_dir = tmp_path / "model"
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(model_dir)
    cand = Candidate(micro_batch=4, grad_accum=1, precision="fp32", packing=packing)
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    n = len(tok(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"])
    best = result_for(cand, "full", "cpu", dataset=str(data), metrics={"mean_seq_len": float(n)})
    emit_all(best, tmp_path / "best", fields=fields)
    log = tmp_path / "speed.json"
    out = subprocess.run(
        [sys.executable, str(tmp_path / "best" / "train_sft.py"), "--model", str(model_dir), "--tokenizer", str(tok_dir),
         "--dataset", str(data), "--split", "train", "--max-steps", "3", "--use-cpu", "--output-dir", str(tmp_path / "out"),
         "--log-speed", str(log)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    speed = json.loads(log.read_text())
    # every micro-batch holds 4 whole chats (with packing: one row of max_length 64 holding 4 chats of
    # n < 16 tokens), and only their real tokens are counted
    assert speed["real_tokens"] == [4 * n] * 3 and len(speed["seconds"]) == 3
    assert (tmp_path / "out" / "config.json").is_file()
