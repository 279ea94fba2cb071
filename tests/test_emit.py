"""Emitters: every file loads with the library that consumes it, and train.py runs as written."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.emit import EMITTED_FILES, build_files, emit_all
from autotune.errors import AutotuneError
from autotune.formats.model import emitted_model_kwargs
from autotune.formats.training_args import performance_kwargs
from autotune.spec.baseline import hf_default_candidate
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult
from autotune.store.atomic import write_json_atomic, write_text_atomic

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def fields() -> set[str]:
    return {f.name for f in dataclasses.fields(transformers.TrainingArguments)}


def result_for(cand: Candidate, *, mode: str = "full", device: str = "cpu", seq_len: int = 32) -> ProbeResult:
    req = ProbeRequest(
        workload=Workload(model="tiny", mode=mode, seq_len=seq_len, lora_targets=("q_proj", "v_proj")),
        candidate=cand,
        settings=ProbeSettings(device=device),
    )
    return ProbeResult(status="ok", request=req.to_dict(), metrics={"tokens_per_s": 1000.0})


def tiny_llama_config():
    return transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


# ---------------------------------------------------------------- training_args.json


@pytest.mark.slow
def test_training_args_json_builds_training_arguments_and_runs_two_trainer_steps(tmp_path, fields):
    best = result_for(Candidate(micro_batch=2, grad_accum=2, precision="fp32", grad_ckpt=True))
    emit_all(best, tmp_path / "best", fields=fields)
    targs = json.loads((tmp_path / "best" / "training_args.json").read_text())
    # complete for a real run: the notes' defaults are there
    assert targs["seed"] == 42 and targs["save_strategy"] == "steps" and targs["save_total_limit"] == 3
    assert targs["learning_rate"] == 2e-5 and targs["lr_scheduler_type"] == "cosine"
    assert set(targs) <= fields
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), **targs)  # unmodified
    assert args.per_device_train_batch_size == 2 and args.gradient_accumulation_steps == 2

    run_args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), **{**targs, "max_steps": 2})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_llama_config())
    rows = [{"input_ids": torch.randint(3, 128, (16,)).tolist()} for _ in range(16)]
    rows = [{"input_ids": r["input_ids"], "labels": r["input_ids"]} for r in rows]
    trainer = transformers.Trainer(model=model, args=run_args, train_dataset=rows)
    out = trainer.train()
    assert out.global_step == 2


def test_gpu_config_uses_installed_names_and_loads_without_tf32(tmp_path, fields):
    best = result_for(
        Candidate(micro_batch=4, grad_accum=8, precision="bf16", grad_ckpt=True, workers=4),
        mode="lora",
        device="cuda",
    )
    files = build_files(best, fields=fields)
    targs = json.loads(files["training_args.json"])
    assert set(targs) <= fields
    if "activation_checkpointing" in fields:  # transformers >= 5.x renamed it
        assert targs["activation_checkpointing"] is True and "gradient_checkpointing" not in targs
    assert targs["tf32"] is True and targs["bf16"] is True and targs["learning_rate"] == 2e-4
    # tf32=True and bf16 need an Ampere GPU; on this CPU box only those two are adjusted
    rest = {k: v for k, v in targs.items() if k != "tf32"}
    transformers.TrainingArguments(output_dir=str(tmp_path), **{**rest, "use_cpu": True})


def test_fp16_never_sets_tf32_true(fields):
    kw = performance_kwargs(Candidate(precision="fp16"), Workload(model="m"), fields=fields, device="cuda")
    assert kw["tf32"] is False  # tf32=True raises on T4/V100, the GPUs that need fp16


def test_report_to_is_passed_through(fields):
    files = build_files(result_for(Candidate()), fields=fields, report_to="tensorboard")
    assert json.loads(files["training_args.json"])["report_to"] == "tensorboard"


def test_only_a_fitting_result_can_be_emitted(tmp_path, fields):
    r = result_for(Candidate())
    r.status = "oom"
    with pytest.raises(AutotuneError, match="status is 'oom'"):
        emit_all(r, tmp_path / "best", fields=fields)
    assert not (tmp_path / "best").exists()


# ---------------------------------------------------------------- model kwargs / LoRA


def test_qlora_model_kwargs_and_lora_config(fields):
    best = result_for(Candidate(precision="bf16"), mode="qlora", device="cuda")
    files = build_files(best, fields=fields)
    mk = json.loads(files["model_kwargs.json"])
    assert mk["attn_implementation"] == "sdpa" and mk["dtype"] == "bfloat16"
    qc = mk["quantization_config"]
    assert qc["load_in_4bit"] and qc["bnb_4bit_quant_type"] == "nf4" and qc["bnb_4bit_use_double_quant"]
    assert qc["bnb_4bit_compute_dtype"] == "bfloat16"
    bnb = transformers.BitsAndBytesConfig(**{k: v for k, v in qc.items() if k != "quant_method"})
    assert bnb.load_in_4bit and bnb.bnb_4bit_compute_dtype == torch.bfloat16
    lc = json.loads(files["lora_config.json"])
    peft = pytest.importorskip("peft")
    cfg = peft.LoraConfig(**lc)
    assert cfg.r == 16 and cfg.lora_dropout == 0.05 and set(cfg.target_modules) == {"q_proj", "v_proj"}


def test_full_mode_has_no_lora_and_plain_model_kwargs():
    assert emitted_model_kwargs(Candidate(attn="flash_attention_2"), Workload(model="m")) == {
        "attn_implementation": "flash_attention_2",
        "dtype": "float32",
    }


# ---------------------------------------------------------------- accelerate / DeepSpeed

ACCEL_CASES = {
    "single": (Candidate(precision="bf16"), "cuda"),
    "multi_gpu": (Candidate(precision="bf16", world_size=4), "cuda"),
    "deepspeed_z3_offload": (Candidate(world_size=2, zero_stage=3, offload="params"), "cuda"),
    "deepspeed_z2": (Candidate(world_size=2, zero_stage=2, precision="fp16"), "cuda"),
    "fsdp_full": (Candidate(world_size=2, zero_stage=3, sharding="fsdp"), "cuda"),
    "cpu": (Candidate(precision="fp32"), "cpu"),
}


@pytest.mark.parametrize("case", sorted(ACCEL_CASES))
def test_accelerate_config_loads_with_accelerates_loader(tmp_path, fields, case):
    from accelerate.commands.config.config_args import ClusterConfig

    cand, device = ACCEL_CASES[case]
    paths = emit_all(result_for(cand, device=device), tmp_path, fields=fields)
    path = tmp_path / "accelerate_config.yaml"
    assert path in paths
    cfg = ClusterConfig.from_yaml_file(str(path))
    assert cfg.num_processes == cand.world_size
    expected = {"single": "NO", "multi_gpu": "MULTI_GPU", "fsdp_full": "FSDP", "cpu": "NO"}.get(
        case, "DEEPSPEED"
    )
    assert cfg.distributed_type.value == expected
    if expected == "FSDP":
        assert cfg.fsdp_config["fsdp_version"] == 2 and cfg.fsdp_config["fsdp_reshard_after_forward"] is True
    if expected == "DEEPSPEED":
        # absolute: accelerate opens it from the working directory, and the launch may start anywhere
        assert cfg.deepspeed_config["deepspeed_config_file"] == str((tmp_path / "deepspeed.json").resolve())
        assert (tmp_path / "deepspeed.json").exists()
    # what `accelerate launch --config_file` does before starting processes
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", str(path), str(tmp_path / "train.py")])
    args, _defaults, _mp = _validate_launch_command(args)
    assert args.use_deepspeed == (expected == "DEEPSPEED") and args.use_fsdp == (expected == "FSDP")


@pytest.mark.parametrize("case", ["deepspeed_z3_offload", "deepspeed_z2"])
def test_deepspeed_json_accepted_by_deepspeeds_config_class(tmp_path, fields, case):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    cand, device = ACCEL_CASES[case]
    emit_all(result_for(cand, device=device), tmp_path, fields=fields)
    ds_file = json.loads((tmp_path / "deepspeed.json").read_text())
    cfg = DeepSpeedConfig(ds_file)  # the file as written (concrete values)
    assert cfg.zero_optimization_stage == cand.zero_stage
    assert cfg.train_micro_batch_size_per_gpu == cand.micro_batch
    # the inline "auto" config in training_args.json, filled the way the HF Trainer fills it
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    targs = json.loads((tmp_path / "training_args.json").read_text())
    inline = targs.pop("deepspeed")
    targs.pop("tf32", None)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "o"), **{**targs, "use_cpu": True})
    hf = HfTrainerDeepSpeedConfig(inline)
    hf.trainer_config_process(args)
    cfg2 = DeepSpeedConfig(hf.config)
    assert cfg2.zero_optimization_stage == cand.zero_stage
    assert cfg2.gradient_accumulation_steps == cand.grad_accum


def test_stale_files_are_removed_on_re_emit(tmp_path, fields):
    emit_all(
        result_for(*ACCEL_CASES["deepspeed_z2"][:1], device="cuda", mode="lora"), tmp_path, fields=fields
    )
    assert (tmp_path / "deepspeed.json").exists() and (tmp_path / "lora_config.json").exists()
    emit_all(result_for(Candidate(), device="cuda"), tmp_path, fields=fields)
    assert not (tmp_path / "deepspeed.json").exists() and not (tmp_path / "lora_config.json").exists()
    assert {p.name for p in tmp_path.iterdir()} <= set(EMITTED_FILES)


# ---------------------------------------------------------------- hf default


def test_hf_default_keeps_the_effective_batch():
    c = hf_default_candidate(64)
    assert (c.micro_batch, c.grad_accum, c.grad_ckpt, c.attn, c.workers, c.packing, c.precision) == (
        8, 8, False, "sdpa", 0, False, "fp32")  # fmt: skip
    assert hf_default_candidate(12).micro_batch * hf_default_candidate(12).grad_accum == 12
    assert hf_default_candidate(4).micro_batch == 4
    c = hf_default_candidate(32, world_size=2, precision="bf16")
    assert c.micro_batch * c.grad_accum * c.world_size == 32 and c.precision == "bf16"


# ---------------------------------------------------------------- atomic writes


def test_atomic_json_failure_leaves_old_file_intact(tmp_path):
    target = tmp_path / "training_args.json"
    write_json_atomic(target, {"seed": 1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"seed": 2, "bad": object()})  # serialisation fails mid-way
    assert json.loads(target.read_text()) == {"seed": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["training_args.json"]


def test_atomic_write_interrupted_after_partial_write(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    write_text_atomic(target, "old")

    def boom(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)  # the new text is half on its way when this fires
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(target, "new" * 1000)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_emit_all_build_failure_leaves_previous_emission_intact(tmp_path, fields, monkeypatch):
    emit_all(result_for(Candidate(micro_batch=2)), tmp_path, fields=fields)
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    import autotune.emit as emit_mod

    def fail(*a, **k):
        raise RuntimeError("render failed")

    monkeypatch.setattr(emit_mod, "render_train_script", fail)  # the last file to be built
    with pytest.raises(RuntimeError):
        emit_all(result_for(Candidate(micro_batch=4)), tmp_path, fields=fields)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before


# ---------------------------------------------------------------- train.py


def _save_tiny_model_and_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(100)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(path)
    transformers.LlamaForCausalLM(tiny_llama_config()).save_pretrained(path)


@pytest.mark.slow
@pytest.mark.parametrize("mode,packing", [("lora", True)])
def test_train_py_runs_two_steps(tmp_path, fields, mode, packing):
    """A text dataset, tokenized by the model directory's tokenizer (pre-tokenized rows and the
    probe comparison: tests/test_train_script.py). One file holds one column, as for the probe."""
    pytest.importorskip("peft")
    best_dir = tmp_path / "best"
    emit_all(
        result_for(
            Candidate(micro_batch=2, grad_accum=1, precision="fp32", packing=packing), mode=mode, seq_len=16
        ),
        best_dir,
        fields=fields,
    )
    yaml.safe_load((best_dir / "accelerate_config.yaml").read_text())
    model_dir = tmp_path / "tiny"
    _save_tiny_model_and_tokenizer(model_dir)
    data = tmp_path / "data.jsonl"
    with data.open("w") as fh:
        for i in range(24):
            fh.write(
                json.dumps({"text": " ".join(f"w{(i * 7 + j) % 100}" for j in range(5 + i % 11))}) + "\n"
            )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(best_dir / "train.py"), "--model", str(model_dir), "--dataset", str(data),
         "--output-dir", str(tmp_path / "out"), "--max-steps", "2", "--use-cpu"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    state = (
        json.loads((tmp_path / "out" / "checkpoint-2" / "trainer_state.json").read_text())
        if (tmp_path / "out" / "checkpoint-2").exists()
        else None
    )
    assert (tmp_path / "out" / "adapter_config.json").exists() or state is not None


def test_axolotl_and_llamafactory_files_of_a_built_in_test_model_say_it_has_no_weights(fields):
    import dataclasses as dc

    base = result_for(Candidate(micro_batch=2, grad_accum=2))
    req = base.probe_request()
    for model, noted in (("tiny-llama", True), ("meta-llama/Llama-3.1-8B", False)):
        best = dc.replace(base, request=dc.replace(req, workload=dc.replace(req.workload, model=model)).to_dict())
        files = build_files(best, fields=fields)
        for name, key in (("axolotl.yaml", "base_model"), ("llamafactory.yaml", "model_name_or_path")):
            note = f"# NOTE model: {model} is autotune's built-in test model"
            assert (note in files[name]) is noted, name
            if noted:
                assert f"set {key} to your model's folder or Hub id" in files[name]


def test_a_gpu_answer_sets_the_cuda_allocator_it_was_measured_with(fields, monkeypatch):
    """GPU probes run with a PYTORCH_CUDA_ALLOC_CONF (expandable segments unless the user set their own): the
    emitted scripts set the same before torch is imported, a value already in the environment winning, and
    the Axolotl / LLaMA-Factory launch lines carry it. A CPU answer sets nothing."""
    from autotune.spec.probe_request import ALLOC_CONF_VARS, CUDA_ALLOC_CONF_DEFAULT

    cpu = result_for(Candidate(micro_batch=2, grad_accum=2), mode="lora")
    req = cpu.probe_request()
    gpu_req = dataclasses.replace(req, settings=dataclasses.replace(req.settings, device="cuda",
                                                                    cuda_alloc_conf=CUDA_ALLOC_CONF_DEFAULT))
    gpu = dataclasses.replace(cpu, request=gpu_req.to_dict())
    launch = f"Train with: PYTORCH_CUDA_ALLOC_CONF={CUDA_ALLOC_CONF_DEFAULT} "
    for best, device, conf in ((gpu, "cuda", CUDA_ALLOC_CONF_DEFAULT), (cpu, "cpu", None)):
        files = build_files(best, fields=fields, device=device)
        assert (launch in files["axolotl.yaml"].splitlines()[0]) is (conf is not None)
        assert (launch in files["llamafactory.yaml"].splitlines()[0]) is (conf is not None)
        for script in ("train.py", "train_sft.py"):
            text = files[script]
            head = text[: text.index("\ndef ")]  # the module's top: what runs on import, before any torch import
            assert "import torch" not in head
            own = "garbage_collection_threshold:0.6"
            cases = [({}, None), *(({v: own}, own) for v in ALLOC_CONF_VARS),
                     # an empty variable torch would read first (as the default allocator) is set over
                     ({"PYTORCH_CUDA_ALLOC_CONF": ""}, conf), ({"PYTORCH_HIP_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": own}, conf)]
            for preset, user in cases:
                for v in ALLOC_CONF_VARS:
                    monkeypatch.delenv(v, raising=False)
                for v, value in preset.items():
                    monkeypatch.setenv(v, value)
                space: dict = {"__name__": "emitted", "__file__": "/x/" + script}
                exec(compile(head, script, "exec"), space)
                assert space["_ALLOC_CONF_VARS"] == ALLOC_CONF_VARS  # the script's copy of the names torch reads
                # what torch reads first: the user's own value where they set one; else the measured one (GPU)
                held = {v: os.environ[v] for v in ALLOC_CONF_VARS if v in os.environ}
                if conf:
                    assert next(iter(held.values())) == (user or conf), (script, preset, held)
                else:  # a CPU answer leaves the environment as it is
                    assert held == preset, (script, preset, held)
    for v in ALLOC_CONF_VARS:
        monkeypatch.delenv(v, raising=False)
