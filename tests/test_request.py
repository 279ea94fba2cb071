"""The answer for the request that was made (issue 12): the cache key, bad input, choices that
cannot run here, ``--device auto`` without a GPU.

Fast: every search runs on the fake executor (tests/_fakes.py); the cache-key tests stop a
request where a search would start (a miss) or take the stored answer (a hit).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from _fakes import FakeExecutor
from typer.testing import CliRunner

import autotune.run._preflight as preflight_mod
import autotune.run._tune as tune_mod
import autotune.store as store_mod
from autotune.cli.app import app
from autotune.errors import DatasetError, NothingFitsError, SpecError
from autotune.estimate import (
    CPU_FLOPS_PER_CORE,
    arch_from_config,
    cpu_probe_seconds,
    hardware_flops_per_token,
)
from autotune.models import resolve_model
from autotune.run._tune import tune
from autotune.spec.capabilities import filter_space
from autotune.spec.probe_request import Candidate, ProbeRequest, Workload
from autotune.spec.space import DIMENSIONS, load_space, parse_space

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "autotune" / "models" / "tiny" / "tiny-llama"
CPU_CAPS = {"device": "cpu", "cxx_compiler": True,
            "packages": {"flash_attn": False, "bitsandbytes": False, "liger_kernel": False, "deepspeed": True,
                         "triton": False}}


def run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []


# ------------------------------------------------------------------------------ the cache key


class Miss(Exception):
    """Raised where a search would start: the request was not answered from the cache."""


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One completed run on the fake executor; each test then asks a variant of its request."""
    tmp = tmp_path_factory.mktemp("keyed")
    model = tmp / "model-a"
    shutil.copytree(TINY, model)
    data = tmp / "data.jsonl"
    data.write_text("".join(json.dumps({"input_ids": list(range(1, 40 + i))}) + "\n" for i in range(24)))
    space = tmp / "spaces" / "s.yaml"
    space.parent.mkdir()
    space.write_text("micro_batch: [1, 2, 4]\ngrad_ckpt: [false, true]\nprecision: [fp32]\npin_memory: [false]\n")
    out = tmp / "out"
    kw: dict[str, Any] = dict(gpu_budget="10GiB", seq_len=64, effective_batch=8, space=str(space), device="cpu",
                              dataset=str(data), max_trials=3, out=out, mode="full", seed=42, steps=5,
                              warmup_steps=2, probe_timeout_s=300.0, top_k=1, time_budget=None, verify_loss=0,
                              baseline=True)
    first = tune(str(model), executor=FakeExecutor(), **kw)
    assert not first.from_cache
    assert first.summary["dataset"] == str(data) and first.summary["split"] is None  # the data the probes read
    return {"tmp": tmp, "model": model, "kw": kw, "key": first.summary["cache_key"], "data": data, "space": space}


def ask(stored: dict[str, Any], monkeypatch: pytest.MonkeyPatch, model: Path | None = None,
        **changes: Any) -> tuple[bool, str]:
    """(answered from the cache?, the request's key), without running a search."""
    seen: dict[str, str] = {}

    def claim(out: Path, key: str, name: str, resume: bool, *rest: Any) -> Any:
        seen["key"] = key
        raise Miss(key)

    monkeypatch.setattr(tune_mod, "claim_run_dir", claim)
    kw = {**stored["kw"], **changes}
    try:
        result = tune(str(model or stored["model"]), executor=FakeExecutor(), **kw)
    except Miss:
        return False, seen["key"]
    return result.from_cache, result.summary["cache_key"]


def test_an_unchanged_request_is_answered_from_the_cache(stored, monkeypatch) -> None:
    hit, key = ask(stored, monkeypatch)
    assert hit and key == stored["key"]


def test_the_budget_is_keyed_in_bytes_not_as_typed(stored, monkeypatch) -> None:
    hit, key = ask(stored, monkeypatch, gpu_budget=str(10 * 2**30))
    assert hit and key == stored["key"]


@pytest.mark.parametrize(
    ("field", "changes"),
    [
        ("gpu budget", {"gpu_budget": "9GiB"}),
        ("seq_len", {"seq_len": 32}),
        ("effective batch", {"effective_batch": 4}),
        ("mode", {"mode": "lora"}),
        ("steps", {"steps": 4}),
        ("warm-up steps", {"warmup_steps": 1}),
        ("probe timeout", {"probe_timeout_s": 200.0}),
        ("time budget", {"time_budget": "20m"}),
        ("top-k", {"top_k": 2}),
        ("max trials", {"max_trials": 4}),
        ("seed", {"seed": 7}),
        ("--verify-loss", {"verify_loss": 5}),
        ("--verify-loss tolerance", {"verify_loss_tolerance": 0.5}),
        ("baseline", {"baseline": False}),
        ("estimator pruning", {"prune": True}),
        ("trust_remote_code", {"trust_remote_code": True}),
        ("confirmation rounds", {"confirm_rounds": (1, 2)}),
        ("confirmation tolerance", {"confirm_tolerance": 0.5}),
        ("load monitor", {"load_monitor": True}),
    ],
)
def test_each_setting_that_changes_the_answer_is_in_the_key(stored, monkeypatch, field, changes) -> None:
    hit, key = ask(stored, monkeypatch, **changes)
    assert not hit and key != stored["key"], field


def test_the_space_is_keyed_by_its_content_not_its_name(stored, monkeypatch) -> None:
    same = stored["tmp"] / "spaces" / "renamed.yaml"
    shutil.copy(stored["space"], same)
    hit, key = ask(stored, monkeypatch, space=str(same))
    assert hit and key == stored["key"]
    other = stored["tmp"] / "other" / "s.yaml"  # the same name, one choice more
    other.parent.mkdir(exist_ok=True)
    other.write_text(stored["space"].read_text().replace("[1, 2, 4]", "[1, 2, 4, 8]"))
    hit, key = ask(stored, monkeypatch, space=str(other))
    assert not hit and key != stored["key"]


def test_the_dataset_is_keyed_by_its_content_not_its_path_or_mtime(stored, monkeypatch) -> None:
    copy = stored["tmp"] / "copied.jsonl"
    shutil.copy(stored["data"], copy)
    copy.touch()
    hit, key = ask(stored, monkeypatch, dataset=str(copy))
    assert hit and key == stored["key"]
    edited = stored["tmp"] / "edited.jsonl"
    edited.write_text(stored["data"].read_text() + json.dumps({"input_ids": [5, 6, 7]}) + "\n")
    hit, key = ask(stored, monkeypatch, dataset=str(edited))
    assert not hit and key != stored["key"]


def test_the_model_is_keyed_by_its_config_not_its_name(stored, monkeypatch) -> None:
    renamed = stored["tmp"] / "model-b"
    shutil.copytree(stored["model"], renamed, dirs_exist_ok=True)
    hit, _ = ask(stored, monkeypatch, model=renamed)
    assert hit
    changed = stored["tmp"] / "model-c"
    shutil.copytree(stored["model"], changed, dirs_exist_ok=True)
    cfg = json.loads((changed / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (changed / "config.json").write_text(json.dumps(cfg))
    hit, _ = ask(stored, monkeypatch, model=changed)
    assert not hit


@pytest.mark.parametrize("what", ["software", "hardware", "capabilities"])
def test_software_hardware_and_capabilities_are_in_the_key(stored, monkeypatch, what) -> None:
    if what == "software":
        real = store_mod.software_versions
        monkeypatch.setattr(store_mod, "software_versions", lambda: {**real(), "torch": "9.9.9"})
    elif what == "hardware":
        real_hw = store_mod.hardware_fingerprint
        monkeypatch.setattr(store_mod, "hardware_fingerprint", lambda dev, g=None: {**real_hw(dev, g), "cpu_count": 999})
    else:
        real_caps = preflight_mod.detect_capabilities
        monkeypatch.setattr(preflight_mod, "detect_capabilities",
                            lambda *a: {**real_caps(*a), "cxx_compiler": not real_caps(*a).get("cxx_compiler")})
    hit, key = ask(stored, monkeypatch)
    assert not hit and key != stored["key"]


def test_workload_fields_key_lora_settings_and_the_lengths_file_by_content(tmp_path: Path) -> None:
    from autotune.spec.probe_request import ProbeSettings
    from autotune.store import probe_fields, workload_fields

    w = Workload(model="a", model_path="/x", seq_len=64, mode="lora")
    assert workload_fields(w) == workload_fields(Workload(model="b", model_path="/y", seq_len=64, mode="lora"))
    assert workload_fields(w) != workload_fields(Workload(model="a", seq_len=64, mode="lora", lora_r=8))
    assert workload_fields(w) != workload_fields(Workload(model="a", seq_len=64, mode="lora", lora_targets=("q_proj",)))
    h1, h2 = tmp_path / "h1.json", tmp_path / "h2.json"
    h1.write_text('{"lengths": [10, 20]}')
    h2.write_text('{"lengths": [10, 20]}')
    f1 = workload_fields(Workload(model="a", seq_len=64, lengths=f"histogram:{h1}"))
    assert f1["lengths_file"] == workload_fields(Workload(model="a", seq_len=64, lengths=f"histogram:{h2}"))[
        "lengths_file"]
    h2.write_text('{"lengths": [10, 30]}')
    assert f1["lengths_file"] != workload_fields(Workload(model="a", seq_len=64, lengths=f"histogram:{h2}"))[
        "lengths_file"]
    h2.write_text('{"lengths": [10, 20]}')  # the same histogram at another path is the same workload
    assert f1 == workload_fields(Workload(model="a", seq_len=64, lengths=f"histogram:{h2}"))
    # the spelling parse_lengths also reads is keyed by the file's content too, never by a bare "histogram"
    h2.write_text('{"lengths": [10, 30]}')
    upper = [workload_fields(Workload(model="a", seq_len=64, lengths=f" HISTOGRAM: {h}")) for h in (h1, h2)]
    assert upper[0] == f1 and upper[1] != upper[0]
    s = ProbeSettings(budget_bytes=100, budget_text="100B")
    assert probe_fields(s) == probe_fields(ProbeSettings(budget_bytes=100, budget_text="0.1KB"))
    assert probe_fields(s) != probe_fields(ProbeSettings(budget_bytes=100, headroom=0.1))


def test_what_changes_nothing_is_not_keyed() -> None:
    """A full fine-tune's LoRA settings, and config.json's note of the transformers that saved it, made a new search."""
    import dataclasses

    from autotune.store import workload_fields
    from autotune.store.cache_key import KeyedRequest, cache_key

    full = Workload(model="a", seq_len=64, mode="full")
    assert workload_fields(full) == workload_fields(dataclasses.replace(full, lora_r=8, lora_targets=("q_proj",)))
    lora = dataclasses.replace(full, mode="lora")
    assert workload_fields(lora) != workload_fields(dataclasses.replace(lora, lora_r=8))
    base = KeyedRequest(model_config={"hidden_size": 64, "transformers_version": "5.24.0"}, space={}, budget_bytes=1,
                        seq_len=64, effective_batch=4, mode="full", hardware={}, software={})
    assert cache_key(base) == cache_key(dataclasses.replace(base, model_config={"hidden_size": 64,
                                                                                "transformers_version": "4.99.0"}))
    assert cache_key(base) != cache_key(dataclasses.replace(base, model_config={"hidden_size": 65}))
    # transformers 5 re-saves torch_dtype as dtype: the same entry, one key; another dtype is another key
    spelled = [{"hidden_size": 64, name: value} for name, value in
               (("torch_dtype", "bfloat16"), ("dtype", "bfloat16"), ("dtype", "float32"))]
    k = [cache_key(dataclasses.replace(base, model_config=c)) for c in spelled]
    assert k[0] == k[1] != k[2]


def test_one_length_distribution_spelled_two_ways_is_one_key() -> None:
    from autotune.store import workload_fields

    def key(lengths: str) -> dict:
        return workload_fields(Workload(model="a", seq_len=64, lengths=lengths))

    assert key("lognormal:3,0.5") == key("lognormal: 3.0, 0.50") == key("LOGNORMAL:3.00,.5")
    assert key("uniform:8-64") == key("uniform: 08-64") and key("fixed") == key(" fixed ")
    assert key("lognormal:3,0.5") != key("lognormal:3,0.6") and key("uniform:8-64") != key("uniform:8-65")
    assert key("lognormal:3") == {**key("fixed"), "lengths": "lognormal:3"}  # refused where it is checked


# ------------------------------------------------------------------------------ bad input is never cached


def test_nothing_fits_is_cached_only_when_a_probe_measured_oom_or_over_budget(tmp_path: Path) -> None:
    kw: dict[str, Any] = dict(gpu_budget="10GiB", seq_len=64, effective_batch=4, space="cpu", device="cpu",
                              max_trials=2, top_k=0, baseline=False, out=tmp_path)
    crashing = FakeExecutor(crash=lambda c: "crash")
    with pytest.raises(NothingFitsError, match="no probe could be measured"):
        tune("tiny-llama", executor=crashing, **kw)
    (rd,) = run_dirs(tmp_path)
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["status"] == "nothing_fits" and summary["measured_infeasible"] == 0
    again = FakeExecutor(crash=lambda c: "crash")
    with pytest.raises(NothingFitsError) as info:
        tune("tiny-llama", executor=again, **kw)
    assert "[cached]" not in str(info.value) and again.requests, "an unmeasured 'nothing fits' must be re-searched"
    # a measured one is the answer: the repeat comes from the stored run without probing
    small = {**kw, "gpu_budget": "3GiB", "out": tmp_path / "measured"}
    with pytest.raises(NothingFitsError):
        tune("tiny-llama", executor=FakeExecutor(), **small)
    third = FakeExecutor()
    with pytest.raises(NothingFitsError, match=r"\[cached\]"):
        tune("tiny-llama", executor=third, **small)
    assert not third.requests


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("hidden_size", "abc", "hidden_size must be a positive integer, got 'abc'"),
        ("vocab_size", 0, "vocab_size must be a positive integer, got 0"),
        ("num_hidden_layers", 2.5, "num_hidden_layers must be a positive integer, got 2.5"),
        ("num_key_value_heads", 3, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ("hidden_size", 250, "hidden_size 250 is not a multiple of num_attention_heads 4"),
    ],
)
def test_a_bad_config_json_is_refused_up_front_and_the_repeat_too(tmp_path: Path, field, value, needle) -> None:
    model = tmp_path / "bad-model"
    shutil.copytree(TINY, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg[field] = value
    (model / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    for _ in range(2):  # the repeat is refused the same way, never "[cached]"
        ex = FakeExecutor()
        with pytest.raises(SpecError, match="model config .*config.json") as info:
            tune(str(model), gpu_budget="1GB", device="cpu", seq_len=64, effective_batch=4, max_trials=2, out=out,
                 executor=ex)
        assert needle in str(info.value) and "fix" in str(info.value) and info.value.exit_code == 2
        assert not ex.requests and not out.exists()


def test_a_dataset_with_token_ids_outside_the_vocabulary_is_refused_up_front(tmp_path: Path) -> None:
    data = tmp_path / "ids.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [1, 2, 3, 2040 + i]}) + "\n" for i in range(12)))
    ex = FakeExecutor()
    with pytest.raises(DatasetError, match=r"holds token id 2051, but tiny-llama's vocabulary has 2048 ids") as info:
        tune("tiny-llama", gpu_budget="1GB", device="cpu", seq_len=64, effective_batch=4, max_trials=2,
             dataset=str(data), out=tmp_path / "out", executor=ex)
    assert info.value.exit_code == 2 and not ex.requests and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ choices that cannot run here


def _worker_says_unsupported(c: Candidate, mode: str = "full") -> str | None:
    """The probe worker's own pre-check on this (CPU) machine: the truth the filter must match."""
    from autotune.probe.worker import _precheck, _Unsupported

    try:
        _precheck(ProbeRequest(Workload(model="tiny-llama", seq_len=64, mode=mode), c), "cpu")
    except _Unsupported as exc:
        return str(exc)
    return None


def test_on_cpu_the_filter_drops_exactly_what_the_probe_would_call_unsupported() -> None:
    space = load_space("default")
    filtered, dropped = filter_space(space, CPU_CAPS)
    dropped_pairs = {(d.knob, d.value) for d in dropped}
    assert dropped_pairs == {("attn", "flash_attention_2"), ("precision", "fp16"), ("precision", "tf32"),
                             ("optim", "adamw_8bit"), ("liger", True)}
    for knob in DIMENSIONS:
        if knob in ("gpus_per_trial",):
            continue
        for value in space.choices(knob):
            c = Candidate(**{knob: value, **({"pin_memory": False} if knob != "pin_memory" else {})})
            if knob in ("zero_stage", "offload", "sharding") and value not in (0, "none", "deepspeed"):
                continue  # distributed choices are not in the default space
            assert (_worker_says_unsupported(c) is not None) == ((knob, value) in dropped_pairs), (knob, value)
    assert filtered.precision == ("bf16",) and filtered.attn == ("sdpa",) and filtered.liger == (False,)
    assert filtered.micro_batch == space.micro_batch and filtered.torch_compile == (False, True)


def test_the_filter_on_gpus_by_compute_capability_and_installed_packages() -> None:
    space = load_space("default")
    missing = {"flash_attn": False, "bitsandbytes": False, "liger_kernel": False, "deepspeed": False, "triton": False}
    _, dropped = filter_space(space, {"device": "cuda", "compute_capability": [7, 5], "packages": missing})
    reasons = {(d.knob, d.value): d.reason for d in dropped}
    assert "sm80" in reasons[("attn", "flash_attention_2")] and "sm75" in reasons[("attn", "flash_attention_2")]
    assert ("precision", "bf16") in reasons and ("precision", "tf32") in reasons
    assert ("precision", "fp16") not in reasons
    assert "pip install bitsandbytes" in reasons[("optim", "adamw_8bit")]
    assert "pip install liger-kernel" in reasons[("liger", True)]
    assert "triton" in reasons[("torch_compile", True)]
    installed = {k: True for k in missing}
    filtered, dropped = filter_space(space, {"device": "cuda", "compute_capability": [9, 0], "packages": installed})
    assert dropped == [] and filtered == space
    # unknown (a remote cluster): nothing is dropped for packages or capability
    assert filter_space(space, {"device": "cuda"})[1] == []
    # a model family Liger does not patch: use_liger_kernel would measure nothing, so it is not searched
    _, dropped = filter_space(space, {"device": "cuda", "model_type": "gpt2", "packages": installed})
    assert [(d.knob, d.value) for d in dropped] == [("liger", True)] and "model_type 'gpt2'" in dropped[0].reason
    assert filter_space(space, {"device": "cuda", "model_type": "llama", "packages": installed})[1] == []


def test_zero_stages_without_deepspeed_go_with_their_offload_unless_fsdp_stands_in() -> None:
    space = parse_space({"zero_stage": [0, 2, 3], "offload": ["none", "optimizer", "params"]})
    caps = {"device": "cuda", "packages": {"deepspeed": False}}
    filtered, dropped = filter_space(space, caps)
    assert filtered.zero_stage == (0,) and filtered.offload == ("none",)
    assert {(d.knob, d.value) for d in dropped} == {("zero_stage", 2), ("zero_stage", 3), ("offload", "optimizer"),
                                                    ("offload", "params")}
    both = parse_space({"zero_stage": [0, 3], "sharding": ["deepspeed", "fsdp"], "offload": ["none", "params"]})
    filtered, dropped = filter_space(both, caps)
    assert filtered.zero_stage == (0, 3) and filtered.sharding == ("fsdp",)
    assert [(d.knob, d.value) for d in dropped] == [("sharding", "deepspeed")]


def test_a_knob_left_without_a_choice_and_qlora_on_cpu_are_refused() -> None:
    with pytest.raises(SpecError, match=r"no choice of precision can run on cpu .*fp16.*tf32.*--space cpu") as info:
        filter_space(parse_space({"precision": ["fp16", "tf32"]}, name="gpu-only"), CPU_CAPS)
    assert len(info.value.problems) == 1
    with pytest.raises(SpecError, match="--mode qlora .* needs a CUDA GPU; use --mode lora"):
        filter_space(load_space("lora"), CPU_CAPS, mode="qlora")


def test_a_cpu_run_of_the_default_space_probes_no_unsupported_configuration(tmp_path: Path) -> None:
    # the executor answers "unsupported" exactly where the real probe worker would
    ex = FakeExecutor(crash=lambda c: "unsupported" if _worker_says_unsupported(c) else None)
    notes: list[str] = []
    result = tune("tiny-llama", gpu_budget="10GiB", seq_len=64, effective_batch=8, space="default", device="cpu",
                  max_trials=8, out=tmp_path, executor=ex,
                  progress=lambda ev, d: notes.append(d["text"]) if ev == "note" else None)
    assert all(_worker_says_unsupported(r.candidate) is None for r in ex.requests)
    assert result.summary["counts"]["unsupported"] == 0 and result.summary["counts"]["probed"] == 8
    dropped = result.summary["dropped_choices"]
    assert {(d["knob"], d["value"]) for d in dropped} >= {("precision", "tf32"), ("attn", "flash_attention_2")}
    assert all(d["reason"] for d in dropped)
    lines = [n for n in notes if n.startswith("not searched")]
    assert len(lines) == 1 and "precision=tf32 (tf32 is a CUDA matmul mode" in lines[0]


# ------------------------------------------------------------------------------ --device auto


def test_device_auto_without_a_gpu_searches_the_cpu_space_and_says_so(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("autotune.env.nvml_device_info", lambda: [])
    notes: list[str] = []
    result = tune("tiny-llama", gpu_budget="10GiB", seq_len=64, effective_batch=8, device="auto", max_trials=3,
                  out=tmp_path, executor=FakeExecutor(),
                  progress=lambda ev, d: notes.append(d["text"]) if ev == "note" else None)
    assert result.summary["device"] == "cpu" and result.summary["space"]["name"] == "cpu"
    # fixed-length synthetic data: the situation's space leaves packing out, and says why
    assert [(d["knob"], d["value"]) for d in result.summary["dropped_choices"]] == [("packing", True)]
    assert any("--device auto found no GPU" in n and "`cpu` search space" in n for n in notes)


def test_no_space_on_a_gpu_is_the_default_space(tmp_path: Path, monkeypatch) -> None:
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * 10**9, "driver": "x",
           "compute_capability": [9, 0]}
    monkeypatch.setattr("autotune.env.nvml_device_info", lambda: [dict(gpu)])
    result = tune("tiny-llama", gpu_budget="10GiB", seq_len=64, effective_batch=8, device="auto", max_trials=2,
                  top_k=0, out=tmp_path, executor=FakeExecutor())
    assert result.summary["device"] == "cuda" and result.summary["space"]["name"] == "default"
    gpus = result.summary["environment"]["hardware"]["gpus"]
    assert gpus[0]["compute_capability"] == [9, 0]


def test_device_auto_refuses_a_model_whose_cpu_probe_outlasts_the_timeout(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("autotune.env.nvml_device_info", lambda: [])
    res = CliRunner().invoke(app, ["run", "--model", "meta-llama/Llama-3.1-8B", "--mode", "lora", "--gpu-budget",
                                   "80GB", "--out", str(tmp_path / "out")], catch_exceptions=False)
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "no GPU found" in lines[0] and "past the 300 s one probe may take" in lines[0]
    assert "`autotune plan --model meta-llama/Llama-3.1-8B --mode lora --seq-len 2048`" in lines[0]
    assert "--device cpu" in lines[0] and not (tmp_path / "out").exists()


def test_an_explicit_device_cpu_runs_it_anyway_with_a_note(tmp_path: Path) -> None:
    notes: list[str] = []
    ex = FakeExecutor()
    tune("meta-llama/Llama-3.1-8B", mode="lora", gpu_budget="80GB", seq_len=256, effective_batch=8, device="cpu",
         max_trials=2, top_k=0, out=tmp_path, executor=ex, probe_timeout_s=5.0,
         progress=lambda ev, d: notes.append(d["text"]) if ev == "note" else None)
    assert ex.requests and any("past the 5 s probe timeout" in n for n in notes)


def test_the_cpu_probe_time_bound() -> None:
    tiny = arch_from_config(resolve_model("tiny-llama").config)
    big = arch_from_config(resolve_model("llama-3.1-8b").config)
    kw: dict[str, Any] = dict(mode="lora", seq_len=2048, mean_tokens=2048, effective_batch=64, optimizer_steps=7,
                              cores=8)
    assert cpu_probe_seconds(big, **kw) > 3600  # hours, not minutes, on 8 cores
    assert cpu_probe_seconds(tiny, **{**kw, "seq_len": 256, "mean_tokens": 256, "effective_batch": 16}) < 10
    # shorter real sequences, fewer cores: proportionally
    half = cpu_probe_seconds(big, **{**kw, "mean_tokens": 1024})
    assert half < cpu_probe_seconds(big, **kw) / 2
    assert cpu_probe_seconds(big, **{**kw, "cores": 4}) == pytest.approx(2 * cpu_probe_seconds(big, **kw))


def test_the_cpu_rate_stays_above_every_recorded_cpu_landscape() -> None:
    """The bound is a lower bound only if no CPU beats CPU_FLOPS_PER_CORE: check the recorded ones."""
    for path in sorted((REPO / "benchmarks" / "landscapes").glob("cpu-*.json")):
        land = json.loads(path.read_text())
        arch = arch_from_config(resolve_model(land["model"]).config)
        cores = land.get("cpu_threads") or land["environment"][0]["cpu_count"]
        # the landscape's own mode: a LoRA step does no weight-gradient matmuls (about 2/3 of full FT's FLOPs)
        flops = hardware_flops_per_token(arch, land["seq_len"], land.get("mode", "full"))
        per_core = land["optimum_tokens_per_s"] * flops / cores
        assert per_core * 2 < CPU_FLOPS_PER_CORE, (path.name, per_core)


def test_a_local_tokenizer_is_keyed_by_its_files_and_cpu_threads_by_what_a_probe_runs_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tokenizer folder edited in place changed what the probes measure (how long the sequences are) but not the
    key, so the stored answer came back; a copy elsewhere (or the path with a trailing slash) is the same request.
    A CPU probe's threads come from OMP_NUM_THREADS (else the core count) and run on the cores it may use: both are
    in the key."""
    from autotune.spec.probe_request import Workload
    from autotune.store import hardware_fingerprint, workload_fields

    tok = tmp_path / "tok"
    shutil.copytree(Path(__file__).resolve().parents[1] / "autotune" / "models" / "tokenizers" / "tiny-chat", tok)
    key = workload_fields(Workload(model="m", tokenizer=str(tok)))["tokenizer"]
    assert workload_fields(Workload(model="m", tokenizer=str(tok) + "/"))["tokenizer"] == key
    moved = tmp_path / "elsewhere"
    shutil.copytree(tok, moved)
    assert workload_fields(Workload(model="m", tokenizer=str(moved)))["tokenizer"] == key
    first = next(p for p in sorted(tok.iterdir()) if p.is_file())
    first.write_text(first.read_text() + " ")
    assert workload_fields(Workload(model="m", tokenizer=str(tok)))["tokenizer"] != key
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    default = hardware_fingerprint("cpu")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert hardware_fingerprint("cpu") != default and hardware_fingerprint("cpu")["omp_num_threads"] == "1"
