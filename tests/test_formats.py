"""autotune.formats: detection, requests, the checklist in each format's vocabulary, write-back."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import autotune.run
from autotune.check import gather
from autotune.cli.check import bundle_from_file
from autotune.env import sft_fields, training_fields
from autotune.errors import AutotuneError, SpecError
from autotune.formats import key_source, read_config, tuned_file, write_back_text
from autotune.spec.probe_request import Candidate

DATA = Path(__file__).parent / "data" / "formats"
FILES = {"lf_lora_sft.yaml": "llamafactory", "ds_z3.json": "deepspeed", "axolotl_lora.yaml": "axolotl",
         "trl_sft.yaml": "trl", "ta.yaml": "training_args"}


def _check(name: str, fmt: str | None = None):
    fields, version = training_fields()
    b = bundle_from_file(DATA / name, fmt)
    if b.fmt == "trl":
        fields = sft_fields() or fields
    return gather(b, fields=fields, transformers_version=version)


@pytest.mark.parametrize("name,fmt", FILES.items())
def test_detected_by_keys(name: str, fmt: str) -> None:
    assert read_config(name, (DATA / name).read_text()).format == fmt


def test_undetectable_file_names_the_format_flag() -> None:
    with pytest.raises(SpecError, match="--format"):
        read_config("x.yaml", "foo: 1\n")


def test_requests_from_files() -> None:
    ax = read_config("a.yaml", (DATA / "axolotl_lora.yaml").read_text()).request
    assert (ax["model"], ax["mode"], ax["seq_len"], ax["effective_batch"], ax["lora_r"]) == (
        "TinyLlama/TinyLlama_v1.1", "lora", 128, 8, 8)
    lf = read_config("l.yaml", (DATA / "lf_lora_sft.yaml").read_text()).request
    assert (lf["mode"], lf["seq_len"], lf["effective_batch"], lf["lora_r"], lf["lora_targets"]) == (
        "lora", 1024, 8, 16, ("all-linear",))
    assert "lora_alpha" not in lf  # the file gives none: 2 x the rank, LLaMA-Factory's default and autotune's
    trl = read_config("t.yaml", (DATA / "trl_sft.yaml").read_text()).request
    assert (trl["seq_len"], trl["effective_batch"], trl["packing"]) == (512, 16, False)


@pytest.mark.parametrize("name", FILES)
def test_no_false_fail_for_a_format_key(name: str) -> None:
    rep = _check(name)
    assert not rep.failed, [i for i in rep.items if i.status == "fail"]


def test_llamafactory_real_findings_in_its_vocabulary() -> None:
    rep = _check("lf_lora_sft.yaml")
    warned = {i.id for i in rep.items if i.status == "warn"}
    assert {"batch", "dataloader_workers", "checkpoints", "seed", "tracking", "ds_overlap"} <= warned
    assert rep.files == ["lf_lora_sft.yaml", "ds_z3.json"]  # the DeepSpeed JSON it names is read too
    (attn,) = rep.by_id("attention")
    assert "flash_attn" in attn.message


def test_deepspeed_zero3_overlap_comm_false() -> None:
    rep = _check("ds_z3.json")
    (item,) = rep.by_id("ds_overlap")
    assert item.status == "warn" and "overlap_comm" in item.fix
    assert not rep.by_id("ds_save")  # stage3_gather_16bit_weights_on_model_save is true in this file


def test_axolotl_vocabulary_and_unknown_key(tmp_path: Path) -> None:
    text = (DATA / "axolotl_lora.yaml").read_text().replace("dataloader", "x") + "micro_batchsize: 4\n"
    (tmp_path / "a.yaml").write_text(text)
    rep = _check(str(tmp_path / "a.yaml"))
    names = [i for i in rep.by_id("names") if i.status != "pass"]
    assert [i.status for i in names] == ["warn"] and "micro_batchsize" in names[0].message
    assert key_source("axolotl")["repo"] == "axolotl-ai-cloud/axolotl"
    (packing,) = rep.by_id("packing")
    assert "sample_packing" in packing.message and "per_device" not in packing.fix


def test_llamafactory_unknown_key_fails(tmp_path: Path) -> None:
    if training_fields()[0] is None:
        pytest.skip("transformers not importable")
    (tmp_path / "l.yaml").write_text((DATA / "lf_lora_sft.yaml").read_text() + "cutof_len: 512\n")
    rep = _check(str(tmp_path / "l.yaml"))
    assert rep.failed and any("cutof_len" in i.message for i in rep.items if i.status == "fail")


def test_ds_rules_offload_without_pinned_memory_and_missing_save() -> None:
    cfg = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": False},
                                 "reduce_bucket_size": 1e6}}
    from autotune.check import ConfigBundle

    rep = gather(ConfigBundle(target="d", data={"deepspeed": cfg}, sources={"deepspeed": "d.json"}))
    assert {"ds_pin_memory", "ds_save", "ds_buckets"} <= {i.id for i in rep.items if i.status == "warn"}
    assert rep.by_id("ds_overlap")[0].status == "pass"  # DeepSpeed's default under ZeRO-3 is on


CAND = dataclasses.asdict(Candidate(micro_batch=8, grad_accum=1, grad_ckpt=False, precision="fp32",
                                    optim="adamw_torch_fused", packing=True))


@pytest.mark.parametrize("name", ["axolotl_lora.yaml", "lf_lora_sft.yaml", "trl_sft.yaml", "ta.yaml"])
def test_write_back_touches_only_tuned_keys(name: str) -> None:
    text = (DATA / name).read_text()
    cfg = read_config(name, text)
    out, updates = tuned_file(cfg, CAND, fields=training_fields()[0])
    assert updates
    before, after = yaml.safe_load(text), yaml.safe_load(out)
    assert {k: v for k, v in after.items() if k not in updates} == {k: v for k, v in before.items() if k not in updates}
    assert {k: after[k] for k in updates} == updates
    changed_lines = [ln for ln in out.splitlines() if ln not in text.splitlines()]
    assert all(ln.split(":")[0] in updates for ln in changed_lines), changed_lines
    kept = [ln for ln in text.splitlines() if ln.split(":")[0] not in updates]
    assert kept == [ln for ln in out.splitlines() if ln.split(":")[0] not in updates][: len(kept)]


def test_write_back_keeps_comment_on_a_changed_line() -> None:
    out = write_back_text("a.yaml", "a: 1   # note\nb: x\n", {"a": 2, "c": True})
    assert out == "a: 2   # note\nb: x\nc: true\n"


def test_json_write_back_keeps_bytes() -> None:
    text = (DATA / "ds_z3.json").read_text().replace('"auto",\n  "gradient_accumulation_steps": "auto"',
                                                      '4,\n  "gradient_accumulation_steps": 2')
    cfg = read_config("d.json", text)
    out, updates = tuned_file(cfg, CAND)
    assert updates == {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1}
    assert "1e9" in out and out.count("\n") == text.count("\n")
    assert json.loads(out)["zero_optimization"] == json.loads(text)["zero_optimization"]
    added = write_back_text("x.json", '{\n    "a": 1\n}\n', {"b": [1, 2]})
    assert added == '{\n    "a": 1,\n    "b": [1, 2]\n}\n'


def test_write_back_refuses_a_nested_target() -> None:
    with pytest.raises(AutotuneError, match="mapping or list"):
        write_back_text("a.yaml", "a:\n  b: 1\n", {"a": 3})


def test_run_from_axolotl_writes_back(tmp_path: Path) -> None:
    """The whole run in-process with the fake executor: what is written back depends on the answer, not on
    how its probes were measured (real probes through Ray: tests/test_cli_run.py); the fake's landscape
    starts at 4 GiB, hence the budget."""
    from _cli import cli

    src = tmp_path / "axolotl_lora.yaml"
    src.write_text((DATA / "axolotl_lora.yaml").read_text())
    out = tmp_path / "tuned.yaml"
    proc = cli(tmp_path, "run", "--from", str(src), "--device", "cpu", "--model", "tiny-llama", "--gpu-budget", "16GB",
               "--max-trials", "3", "--steps", "2", "--top-k", "1", "--confirm-rounds", "1",
               "--out", str(tmp_path / "res"), "--write-back", str(out), "--json", fake=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    wb = summary["write_back"]
    text, new = src.read_text(), out.read_text()
    changed = {ln.split(":")[0] for ln in set(new.splitlines()) ^ set(text.splitlines())}
    assert changed <= set(wb["changed"]), changed
    assert "sequence_len: 128          # short on purpose" in new
    assert summary["best"]["effective_batch"]["value"] == 8  # micro_batch_size 2 x accumulation 4, held


def test_run_from_reads_the_request_and_flags_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from autotune.cli.app import app

    seen: dict = {}

    def spy(request):
        seen.update(vars(request))
        raise SpecError("stop here")

    monkeypatch.setattr(autotune.run, "tune", spy)
    lf = str(DATA / "lf_lora_sft.yaml")
    res = CliRunner().invoke(app, ["run", "--from", lf, "--gpu-budget", "24GB"], catch_exceptions=False)
    assert res.exit_code == 2
    assert (seen["model"], seen["mode"], seen["seq_len"], seen["effective_batch"]) == (
        "Qwen/Qwen2.5-0.5B-Instruct", "lora", 1024, 8)
    res = CliRunner().invoke(app, ["run", "--from", lf, "--gpu-budget", "24GB", "--model", "tiny-llama",
                                   "--seq-len", "64"], catch_exceptions=False)
    assert (seen["model"], seen["seq_len"], seen["effective_batch"]) == ("tiny-llama", 64, 8)
    # the flags that replace the file's values are named, with what the tuned file then trains with
    assert "--seq-len 64 (the file's: 1024): the flag wins" in res.output
    assert "trains with the sequence length measured" in " ".join(res.output.split())


@pytest.mark.parametrize("name,fmt", [("lora-1b.yml", "axolotl"), ("fft-8b.yaml", "axolotl")])
def test_run_from_a_file_that_packs_into_rows_needs_the_batch_in_sequences(
    name: str, fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A packed file's batch keys count rows of the sequence length: read as sequences they would hold
    another batch than the file trains with. Without --effective-batch: exit 2 naming the fix; with it,
    the flag is the effective batch (in sequences) and the run goes on."""
    from typer.testing import CliRunner

    from autotune.cli.app import app
    from autotune.errors import SpecError

    seen: dict = {}

    def spy(request):
        seen.update(vars(request))
        raise SpecError("stop here")

    monkeypatch.setattr(autotune.run, "tune", spy)
    src = str(DATA.parent / "clients" / fmt / name)
    res = CliRunner().invoke(app, ["run", "--from", src, "--gpu-budget", "24GB", "--model", "tiny-llama"],
                             catch_exceptions=False)
    assert res.exit_code == 2 and "sample_packing: true" in res.output and "--effective-batch" in res.output
    assert not seen  # refused before tune
    res = CliRunner().invoke(app, ["run", "--from", src, "--gpu-budget", "24GB", "--model", "tiny-llama",
                                   "--effective-batch", "64"], catch_exceptions=False)
    assert seen["effective_batch"] == 64


@pytest.mark.parametrize("args,needle", [
    (["--write-back", "x.yaml", "--model", "m"], "--write-back needs --from"),
    (["--format", "axolotl", "--model", "tiny-llama"], "--format needs --from"),
    (["--from", str(DATA / "ds_z3.json")], "names it"),
    ([], "--model is required"),
])
def test_run_from_bad_input_is_exit_2(args: list[str], needle: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune", "run", "--gpu-budget", "24GB", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_one_key_record_serves_the_checklist_and_the_emitters() -> None:
    """autotune/emit/schemas/*_keys.json is the one record (tools/extract_target_keys.py): the checklist's
    key sets are its top-level and plugin sections, pydantic aliases and LLaMA-Factory's generation
    arguments included."""
    import json

    from autotune.formats import known_keys

    schemas = Path(__file__).resolve().parents[1] / "autotune" / "emit" / "schemas"
    ax = json.loads((schemas / "axolotl_keys.json").read_text())
    keys = known_keys("axolotl", ta_fields=None)
    assert keys == set(ax["sections"][""]) | set(ax["sections"]["plugin:liger"])
    assert {"model_kwargs", "liger_rms_norm", "sample_packing"} <= keys and "auto_wrap_policy" not in keys  # fsdp_config only
    assert key_source("axolotl") == ax["source"]
    lf = known_keys("llamafactory", ta_fields={"learning_rate"})
    assert lf is not None and {"temperature", "cutoff_len", "learning_rate", "predict_with_generate"} <= lf
    assert not any(k.startswith("_") for k in lf)
    assert not (schemas.parent.parent / "formats" / "keys.json").exists()


def test_an_axolotl_batch_size_is_the_effective_batch_and_stays_the_one_key() -> None:
    """Axolotl's ``batch_size`` (per device) with ``micro_batch_size`` and no ``gradient_accumulation_steps``: the
    accumulation is batch_size // micro_batch_size, as Axolotl derives it, so the effective batch held is the
    file's; a write-back changes batch_size (micro-batch x accumulation), never adds the accumulation key beside
    it (Axolotl refuses a file that sets both)."""
    import dataclasses

    from autotune.formats import read_config, tuned_file
    from autotune.spec.probe_request import Candidate

    text = "base_model: tiny-llama\nsequence_len: 128\nmicro_batch_size: 2\nbatch_size: 32\n"
    cfg = read_config("ax.yaml", text)
    req = cfg.module.to_request(cfg.data)
    assert (req["micro_batch"], req["grad_accum"], req["effective_batch"]) == (2, 16, 32)
    out, updates = tuned_file(cfg, dataclasses.asdict(Candidate(micro_batch=4, grad_accum=8)))
    assert "gradient_accumulation_steps" not in out and "batch_size: 32" in out and updates["micro_batch_size"] == 4
    out, updates = tuned_file(read_config("ax.yaml", text.replace("32", "8")),
                              dataclasses.asdict(Candidate(micro_batch=1, grad_accum=4)))  # the file's 8 -> 4
    assert "gradient_accumulation_steps" not in out and updates.get("batch_size") == 4 and "micro_batch_size: 1" in out


@pytest.mark.parametrize(("name", "text", "key"), [
    ("ax.yaml", "base_model: tiny-llama\nadapter: lora\nload_in_8bit: true\nmicro_batch_size: 2\n", "load_in_8bit"),
    ("ax.yaml", "base_model: tiny-llama\nadapter: ia3\nmicro_batch_size: 2\n", "adapter"),
    ("ax.yaml", "base_model: tiny-llama\nadapter: lora\npeft_use_dora: true\nmicro_batch_size: 2\n", "peft_use_dora"),
    ("ax.yaml", "base_model: tiny-llama\nrl: dpo\nmicro_batch_size: 2\n", "rl"),
    ("lf.yaml", "model_name_or_path: tiny-llama\nstage: dpo\nfinetuning_type: lora\ncutoff_len: 64\n", "stage"),
    ("lf.yaml", "model_name_or_path: tiny-llama\nstage: sft\nfinetuning_type: freeze\ncutoff_len: 64\n", "finetuning_type"),
    ("lf.yaml", "model_name_or_path: tiny-llama\nstage: sft\nquantization_bit: 8\ncutoff_len: 64\n", "quantization_bit"),
    ("lf.yaml", "model_name_or_path: tiny-llama\nstage: sft\nuse_dora: true\ncutoff_len: 64\n", "use_dora"),
])
def test_a_from_file_that_trains_what_the_probes_do_not_measure_is_refused(tmp_path: Path, name: str, text: str,
                                                                           key: str) -> None:
    """An 8-bit base, an adapter other than LoRA, DoRA, freeze fine-tuning, a preference-training stage: the
    search would measure another set-up than the file trains and write its levers back into it, so --from
    refuses the file before anything runs, naming the key (they were read as 16-bit LoRA or full SFT)."""
    from autotune.run._request import read_source

    src = tmp_path / name
    src.write_text(text)
    with pytest.raises(SpecError, match=f"{key}: .* autotune cannot measure it"):
        read_source(src, None, effective_batch_given=True)


@pytest.mark.parametrize("text", [
    "  output_dir: out\n  max_length: 512\n  per_device_train_batch_size: 4\n  gradient_accumulation_steps: 2\n",
    "\ufeffper_device_train_batch_size: 4\noutput_dir: out\nmax_length: 512\ngradient_accumulation_steps: 2\n",
])
def test_a_layout_the_write_back_cannot_edit_is_refused_before_the_search(tmp_path: Path, text: str) -> None:
    """A top-level mapping indented, or a byte-order mark before a tuned key: the write-back is tried on every key
    it may change before the search (it failed after it, the search's time lost)."""
    from autotune.run._request import plan_write_back, read_source

    src = tmp_path / "sft.yaml"
    src.write_text(text, encoding="utf-8")
    cfg, _ = read_source(src, "trl", effective_batch_given=True)
    with pytest.raises(SpecError, match="checked before the search"):
        plan_write_back(cfg, None)


def test_keys_appended_to_a_crlf_file_end_their_lines_as_the_file_does() -> None:
    out = write_back_text("x.yaml", "a: 1\r\nb: 2\r\n", {"b": 3, "c": True})
    assert out == "a: 1\r\nb: 3\r\nc: true\r\n"
    assert write_back_text("x.yaml", "a: 1\nb: 2", {"c": True}) == "a: 1\nb: 2\nc: true\n"


@pytest.mark.parametrize(("text", "files", "expected"), [
    ("deepspeed: ds/z3.json\n", {"ds/z3.json": '{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}'},
     {"zero_stage": 3, "offload": "params", "sharding": "deepspeed"}),
    ("deepspeed: {zero_optimization: {stage: 2, offload_optimizer: {device: cpu}}}\n", {},
     {"zero_stage": 2, "offload": "optimizer", "sharding": "deepspeed"}),
    ("fsdp: full_shard auto_wrap offload\n", {}, {"zero_stage": 3, "offload": "params", "sharding": "fsdp"}),
    ("fsdp: [shard_grad_op, auto_wrap]\n", {}, {"zero_stage": 2, "offload": "none", "sharding": "fsdp"}),
    ("fsdp_version: '2'\nfsdp_config: {reshard_after_forward: true, offload_params: 'true'}\n", {},
     {"zero_stage": 3, "offload": "params", "sharding": "fsdp"}),
    ("fsdp_version: 2\nfsdp_config: {reshard_after_forward: false, offload_params: 'false'}\n", {},
     {"zero_stage": 2, "offload": "none", "sharding": "fsdp"}),
    ("deepspeed: {zero_optimization: {stage: 2, offload_param: {device: cpu}}}\n", {},
     {"zero_stage": 2, "offload": "none", "sharding": "deepspeed"}),  # DeepSpeed offloads parameters at stage 3 only
    ("seed: 1\n", {}, {"zero_stage": 0, "offload": "none", "sharding": "deepspeed"}),
])
def test_the_distributed_set_up_a_training_file_trains_with(tmp_path: Path, text: str, files: dict,
                                                             expected: dict) -> None:
    """A DeepSpeed config inline or by path (found beside the file, as the training tool would from there), FSDP
    options as a string or a list, Axolotl's FSDP v2 settings, or none of them."""
    from autotune.formats import distributed_setup, parse_text

    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    setup, where = distributed_setup(parse_text("f.yaml", text), tmp_path / "f.yaml")
    assert setup == expected
    assert bool(where) == ("seed" not in text)


def _from_request(tmp_path: Path, extra: str, **given: Any) -> Any:
    src = tmp_path / "lf.yaml"
    src.write_text("model_name_or_path: tiny-llama\nstage: sft\nfinetuning_type: lora\ncutoff_len: 64\n"
                   "per_device_train_batch_size: 2\ngradient_accumulation_steps: 4\n" + extra)
    return autotune.run.RunRequest.from_file(src, gpu_budget="24GB", **given)


def test_a_from_search_on_gpus_measures_the_file_s_own_zero_set_up(tmp_path: Path) -> None:
    """The write-back keeps the file's deepspeed / fsdp keys, so the probes measure that set-up (the multi-GPU
    space would otherwise choose its own ZeRO stage and offload, and the tuned file would train another one);
    the HF-default baseline is compared under it too."""
    from autotune.run._plan import _space_for_device, baseline_candidate
    from autotune.spec.space import load_space

    (tmp_path / "ds_z3.json").write_text('{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}')
    request = _from_request(tmp_path, "deepspeed: ds_z3.json\n")
    read = autotune.run._request.read_request(request)
    gpus = [{"index": i, "name": "NVIDIA A10G", "memory_total": 24 * 2**30} for i in range(4)]
    space, _, _, notes = _space_for_device(load_space("multi-gpu"), "cuda", gpus, "cuda", "127.0.0.1:6379", "lora",
                                           read.args.source)
    assert (space.zero_stage, space.offload, space.sharding) == ((3,), ("optimizer",), ("deepspeed",))
    assert any("the probes measure ZeRO-3 (DeepSpeed), optimizer offload, as the DeepSpeed config 'ds_z3.json'"
               in n for n in notes), notes
    base = baseline_candidate(space, 8, "cuda")
    assert base is not None and (base.zero_stage, base.offload) == (3, "optimizer")
    # a file that names none: measured without sharding, as the tuned file will train
    plain = autotune.run._request.read_request(_from_request(tmp_path, "")).args.source
    space, _, _, notes = _space_for_device(load_space("multi-gpu"), "cuda", gpus, "cuda", "127.0.0.1:6379", "lora",
                                           plain)
    assert (space.zero_stage, space.offload) == ((0,), ("none",))
    assert any("names no DeepSpeed or FSDP set-up" in n for n in notes), notes
    # on a CPU the space stays and the note says the probes measure without it
    space, _, _, notes = _space_for_device(None, "cpu", [], "cpu", None, "lora", read.args.source)
    assert any("which a CPU probe cannot run" in n for n in notes), notes


def test_a_from_file_naming_a_deepspeed_config_that_is_not_there_is_refused_on_gpus(tmp_path: Path) -> None:
    from autotune.run._plan import _space_for_device
    from autotune.spec.space import load_space

    read = autotune.run._request.read_request(_from_request(tmp_path, "deepspeed: missing/ds_z3.json\n"))
    with pytest.raises(SpecError, match="names the DeepSpeed config 'missing/ds_z3.json', but missing/ds_z3.json "
                                        "does not exist .*remove the deepspeed key"):
        _space_for_device(load_space("multi-gpu"), "cuda", [{"index": 0}, {"index": 1}], "cuda", "127.0.0.1:6379",
                          "lora", read.args.source)


def test_a_quoted_value_holding_a_hash_is_replaced_whole_and_its_comment_kept() -> None:
    assert write_back_text("x.yaml", 'a: "x # y"  # note\nb: 2\n', {"a": "z"}) == "a: z  # note\nb: 2\n"
    assert write_back_text("x.yaml", "a: 'it''s # here' # c\n", {"a": 2}) == "a: 2 # c\n"


def test_a_deepspeed_config_that_fixes_the_batch_or_precision_is_refused_before_the_search(tmp_path: Path) -> None:
    """transformers refuses to start when a DeepSpeed config's fixed micro-batch, accumulation or precision differs
    from the training arguments, so no tuned file could start with it: exit 2 naming the values and the fix."""
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto", '
                                      '"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}')
    with pytest.raises(SpecError, match=r"fixes train_micro_batch_size_per_gpu 2, bf16.enabled True: .*\"auto\""):
        _from_request(tmp_path, "deepspeed: ds.json\n")
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}, '
                                      '"zero_optimization": {"stage": 2}}')
    assert _from_request(tmp_path, "deepspeed: ds.json\n").source.distributed["zero_stage"] == 2


def test_an_exponent_written_without_a_dot_is_a_number_where_the_framework_reads_it_as_one() -> None:
    """YAML 1.1 reads ``2e-5`` as text; TRL's parser and LLaMA-Factory's read it as a float, so their files are
    not refused for it; transformers' own YAML reader keeps it text, so a TrainingArguments file still is."""
    text = "model_name_or_path: m\ndataset_name: d.jsonl\noutput_dir: o\nlearning_rate: 2e-5\nmax_length: 64\n"
    cfg = read_config("sft.yaml", text, fmt="trl")
    assert not cfg.problems and cfg.data["learning_rate"] == "2e-5"  # the file's data as written
    assert read_config("ta.yaml", "output_dir: o\nlearning_rate: 2e-5\n", fmt="training_args").problems


def test_a_trl_file_that_leaves_the_lora_targets_to_peft_is_measured_with_peft_s_default(tmp_path: Path) -> None:
    """TRL passes lora_target_modules None to peft, which picks its default per model type (q_proj, v_proj for
    Llama); the probes measured autotune's q/k/v/o instead, twice the adapters the file trains."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft_map

    from autotune.formats.model import PEFT_DEFAULT, PEFT_DEFAULT_PATTERNS, PEFT_DEFAULT_TARGETS
    from autotune.run._request import _peft_default_targets

    assert all(tuple(peft_map[k]) == v for k, v in PEFT_DEFAULT_TARGETS.items())  # the installed peft's table
    assert {k: v for k, v in peft_map.items() if isinstance(v, str)} == PEFT_DEFAULT_PATTERNS  # its patterns
    src = tmp_path / "sft.yaml"
    src.write_text("model_name_or_path: tiny-llama\noutput_dir: o\nmax_length: 64\nuse_peft: true\n")
    request = autotune.run.RunRequest.from_file(src, gpu_budget="4GB", device="cpu")
    assert request.lora_targets == PEFT_DEFAULT
    read = autotune.run._request.read_request(request)
    assert read.args.lora_targets == "q_proj,v_proj"

    class Unmapped:
        config = {"model_type": "phi3"}

    with pytest.raises(SpecError, match="no default for model_type 'phi3'"):
        _peft_default_targets(request, Unmapped())

    class Patterned:
        config = {"model_type": "gemma4"}

    with pytest.raises(SpecError, match=r"default for model_type 'gemma4' is the pattern .*language_model.*name the"):
        _peft_default_targets(request, Patterned())
    assert _peft_default_targets(dataclasses.replace(request, mode="full"), Unmapped()).lora_targets == "attn"
    src.write_text("model_name_or_path: tiny-llama\noutput_dir: o\nmax_length: 64\nuse_peft: true\n"
                   "lora_target_modules: []\n")
    with pytest.raises(SpecError, match="lora_target_modules is empty"):
        autotune.run.RunRequest.from_file(src, gpu_budget="4GB", device="cpu")


def test_a_key_with_no_value_is_written_after_its_colon() -> None:
    """``fp16:`` (null, as older Axolotl examples write it) refused the whole write-back with a message about a
    byte-order mark or indentation; a comment after the empty value is kept."""
    out = write_back_text("x.yaml", "a: 1\nfp16:\nb: 2\nc:   # note\nd: ~\n", {"fp16": False, "c": 3, "d": True})
    assert out == "a: 1\nfp16: false\nb: 2\nc: 3   # note\nd: true\n"


def test_a_from_search_over_several_gpus_says_the_file_s_batch_is_per_process(tmp_path: Path) -> None:
    from autotune.run._plan import _per_process_batch_note
    from autotune.spec.space import load_space

    request = _from_request(tmp_path, "")
    notes = _per_process_batch_note(request, "cuda", load_space("multi-gpu"))
    assert len(notes) == 1 and "counts the sequences of one process" in notes[0] and "--effective-batch" in notes[0]
    assert _per_process_batch_note(request, "cuda", load_space("lora")) == []  # one GPU a configuration
    assert _per_process_batch_note(dataclasses.replace(request, effective_batch=32), "cuda",
                                   load_space("multi-gpu")) == []  # the flag gave the batch


def test_yaml_in_a_file_without_a_yaml_name_is_told_to_take_one(tmp_path: Path) -> None:
    from autotune.cli.check import bundle_from_file

    (tmp_path / "train_config").write_text("output_dir: o\nper_device_train_batch_size: 2\n")
    for call in (lambda: read_config("train_config", (tmp_path / "train_config").read_text()),
                 lambda: bundle_from_file(tmp_path / "train_config")):
        with pytest.raises(SpecError, match="it reads as YAML: give it a .yaml or .yml name"):
            call()


@pytest.mark.parametrize(("text", "needle"), [
    ("deepspeed: {zero_optimization: {stage: '3'}}\n", "zero_optimization.stage must be 0, 1, 2 or 3"),
    ("deepspeed: {zero_optimization: {stage: 4}}\n", "zero_optimization.stage must be 0, 1, 2 or 3"),
    ("fsdp: shard_grad_op offload\n", "shard_grad_op with CPU offload"),
    ("fsdp: FULL_SHARD\n", "are not transformers'"),
    ("fsdp: offload\n", "names no sharding strategy"),
])
def test_a_distributed_set_up_that_cannot_train_or_be_measured_is_one_line(tmp_path: Path, text: str,
                                                                           needle: str) -> None:
    from autotune.formats import distributed_setup, parse_text

    with pytest.raises(SpecError, match=needle):
        distributed_setup(parse_text("f.yaml", text), tmp_path / "f.yaml")


def test_training_fields_are_read_from_the_source_as_dataclasses_gives_them(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed TrainingArguments' fields, read from its source without importing it, are the fields
    ``dataclasses.fields`` gives; a class the syntax tree cannot answer for is None (the caller imports it)."""
    import dataclasses
    import importlib.util

    from transformers import TrainingArguments

    from autotune.env import dataclass_field_names

    fields, version = training_fields()
    assert fields == {f.name for f in dataclasses.fields(TrainingArguments)}
    assert version == importlib.import_module("transformers").__version__
    src = tmp_path / "m.py"
    src.write_text(
        "import dataclasses\nfrom dataclasses import dataclass, field, KW_ONLY, InitVar\nfrom typing import ClassVar\n"
        "@dataclass\nclass A:\n    a: int = 1\n    b: 'ClassVar[int]' = 2\n    _: KW_ONLY\n    c: list = field(default_factory=list)\n"
        "    d: InitVar[int] = 0\n    e: typing.ClassVar[str] = ''\n    def f(self) -> None:\n        g: int = 3\n"
        "@dataclasses.dataclass(eq=True)\nclass B(A):\n    h: int = 0\n"
        "class C:\n    a: int = 1\n"
        "@dataclass\nclass D:\n    if True:\n        a: int = 1\n")
    spec = importlib.util.spec_from_file_location("_dataclass_fields_case", src)
    module = importlib.util.module_from_spec(spec)
    module.__dict__["typing"] = importlib.import_module("typing")
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses resolves string annotations through it
    spec.loader.exec_module(module)
    assert dataclass_field_names(src, "A") == {f.name for f in dataclasses.fields(module.A)} == {"a", "c"}
    assert [dataclass_field_names(src, n) for n in ("B", "C", "D", "Missing")] == [None] * 4
    # a base class's fields, given by name, are inherited; an unknown base is None
    a = dataclass_field_names(src, "A")
    assert dataclass_field_names(src, "B", inherited={"A": a}) == {f.name for f in dataclasses.fields(module.B)}
    assert dataclass_field_names(src, "B", inherited={"A": None}) is None


def test_sft_fields_are_read_from_the_sources_as_dataclasses_gives_them() -> None:
    pytest.importorskip("trl")
    from trl import ModelConfig, ScriptArguments, SFTConfig

    from autotune.env import sft_fields

    assert sft_fields() == {f.name for c in (SFTConfig, ModelConfig, ScriptArguments) for f in dataclasses.fields(c)}


def test_check_and_the_answers_files_do_not_import_torch(tmp_path: Path) -> None:
    """``autotune check`` (a TrainingArguments file, a TRL file) and the emitted files' key check hold keys against
    TrainingArguments and TRL's configs without importing them (torch, peft and most of transformers: 4-8 s of a
    2-core machine's start)."""
    cfg = tmp_path / "ta.json"
    cfg.write_text(json.dumps({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "bf16": False}))
    code = ("import sys\nfrom autotune.cli.app import main\nfor path in sys.argv[1:]:\n"
            "    sys.argv = ['autotune', 'check', path]\n"
            "    try:\n        main()\n    except SystemExit:\n        pass\n"
            "from autotune.run._outputs import _training_args_fields\nassert 'learning_rate' in _training_args_fields()\n"
            "print(sorted(m for m in ('torch', 'transformers.training_args', 'peft', 'trl.trainer.sft_config') "
            "if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code, str(cfg), str(DATA / "trl_sft.yaml")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[]", p.stdout[-2000:]


def test_a_llamafactory_files_dataset_is_read_through_its_dataset_info(tmp_path, monkeypatch) -> None:
    """LLaMA-Factory names a local file through dataset + dataset_dir + dataset_info.json (as the emitted file's
    note says to write it); it was ignored without a word, and the probes measured full-length synthetic rows."""
    import json

    from autotune.formats.llamafactory import dataset_from_info
    from autotune.run import RunRequest

    data = tmp_path / "data"
    data.mkdir()
    (data / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    chat = {"file_name": "chat.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
            "tags": {"role_tag": "role", "content_tag": "content"}}
    (data / "dataset_info.json").write_text(json.dumps({"support_chat": chat, "alpaca_style": {
        "file_name": "chat.jsonl"}}))
    cfg = tmp_path / "lf.yaml"
    cfg.write_text("model_name_or_path: tiny-llama\nstage: sft\nfinetuning_type: lora\ndataset: support_chat\n"
                   "dataset_dir: data\ncutoff_len: 128\nper_device_train_batch_size: 2\n"
                   "gradient_accumulation_steps: 8\n")
    monkeypatch.chdir(tmp_path)
    notes: list[str] = []
    req = RunRequest.from_file(cfg, gpu_budget="24GB", progress=lambda kind, d: notes.append(d.get("text", "")))
    assert req.dataset == str(Path("data") / "chat.jsonl") and notes == []
    # a layout autotune does not read: said in one line, and the request keeps synthetic data
    cfg.write_text(cfg.read_text().replace("dataset: support_chat", "dataset: alpaca_style"))
    req = RunRequest.from_file(cfg, gpu_budget="24GB", progress=lambda kind, d: notes.append(d.get("text", "")))
    assert req.dataset is None and len(notes) == 1 and "its dataset 'alpaca_style' was not read" in notes[0]
    assert "pass --dataset FILE" in notes[0]
    assert dataset_from_info("a,b", {}, "data")[1] == "it mixes 2 datasets (a, b)"
    assert dataset_from_info("x", None, "data")[1] == "no dataset_info.json in 'data'"
    assert dataset_from_info("x", {"x": {"hf_hub_url": "org/x"}}, "d")[1].endswith("names no local .json/.jsonl/.parquet file")
