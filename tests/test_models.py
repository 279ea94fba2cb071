"""Model presets, tiny test models and model-reference resolution (no network, meta device only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.errors import ModelNotFoundError, SpecError
from autotune.models import (
    PRESETS,
    TINY,
    PresetInfo,
    ResolvedModel,
    check_seq_len,
    default_hf_cache_dir,
    resolve_model,
)

# Published parameter counts (model cards / hub), independent of the table in _registry.py.
PUBLISHED_PARAMS: dict[str, float] = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70.6e9,  # the model card's 70.6B
    "llama-3.2-1b": 1.236e9,
    "llama-3.2-3b": 3.213e9,
    "mistral-7b": 7.25e9,
    "mistral-7b-v0.1": 7.24e9,
    "qwen2.5-0.5b": 494e6,
    "qwen2.5-1.5b": 1.544e9,
    "qwen2.5-7b": 7.616e9,
    "qwen2.5-72b": 72.7e9,
    "gemma-2-2b": 2.61e9,
    "phi-3-mini": 3.82e9,
    "gpt2": 124_439_808,
    "smollm2-135m": 134.5e6,
    "smollm2-360m": 362e6,
    "smollm2-1.7b": 1.711e9,
}

TINY_NAMES = ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-gpt2"]
ALL_NAMES = [*PUBLISHED_PARAMS, *TINY_NAMES]


@pytest.fixture(autouse=True)
def _empty_hf_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the HF cache at an empty directory so that a developer's real cache changes nothing."""
    cache = tmp_path_factory.mktemp("empty-hf-cache")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def _write_config(directory: Path, config: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(config))
    return path


def _fake_snapshot(cache: Path, hub_id: str, revision: str, config: dict[str, object]) -> Path:
    repo = cache / ("models--" + hub_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    _write_config(snapshot, config)
    return snapshot


# --- the table ---------------------------------------------------------------------------------


def test_table_covers_required_models() -> None:
    presets = {p.name for p in PRESETS}
    assert presets == set(PUBLISHED_PARAMS)
    everything = {p.name for p in [*PRESETS, *TINY]}
    assert everything == set(ALL_NAMES)
    for info in [*PRESETS, *TINY]:
        assert isinstance(info, PresetInfo)
        assert info.name == info.name.lower()
        assert Path(info.path, "config.json").is_file(), info.name
        assert info.description
        assert (info.kind == "tiny") == (info.hub_id is None)


def test_import_does_not_pull_torch_or_transformers() -> None:
    code = (
        "import sys, autotune.models as m; m.resolve_model('llama-3.1-8b'); m.resolve_model('tiny-gpt2'); "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("name", ALL_NAMES)
def test_config_builds_on_meta_with_expected_params(name: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    info = next(p for p in [*PRESETS, *TINY] if p.name == name)
    config = transformers.AutoConfig.from_pretrained(info.path, local_files_only=True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    n_params = sum(p.numel() for p in model.parameters())
    assert type(model).__name__ == json.loads(Path(info.path, "config.json").read_text())["architectures"][0]
    assert n_params == pytest.approx(info.params, rel=0.01)
    if info.kind == "preset":
        assert n_params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)
    else:
        assert 2e6 <= n_params <= 20e6
        assert config.vocab_size <= 4096  # small, so that activation levers are visible


def test_llama_3_1_8b_exact_param_count() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = resolve_model("llama-3.1-8b").auto_config()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248


def test_auto_config_is_fresh_each_call() -> None:
    pytest.importorskip("transformers")
    resolved = resolve_model("tiny-llama")
    a, b = resolved.auto_config(), resolved.auto_config()
    assert a is not b
    assert a.hidden_size == 256 and a.num_key_value_heads == 2


# --- resolution ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "short", "name"),
    [
        ("llama-3.1-8b", "llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("LLAMA-3.1-8B", "llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("META-LLAMA/llama-3.1-8b", "llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("mistralai/Mistral-7B-v0.3", "mistral-7b", "mistralai/Mistral-7B-v0.3"),
        ("Mistral-7B-v0.3", "mistral-7b", "mistralai/Mistral-7B-v0.3"),
        ("Qwen/Qwen2.5-0.5B", "qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B"),
        ("qwen2.5-7b", "qwen2.5-7b", "Qwen/Qwen2.5-7B"),
        ("google/gemma-2-2b", "gemma-2-2b", "google/gemma-2-2b"),
        ("microsoft/Phi-3-mini-4k-instruct", "phi-3-mini", "microsoft/Phi-3-mini-4k-instruct"),
        ("gpt2", "gpt2", "openai-community/gpt2"),
        ("openai-community/gpt2", "gpt2", "openai-community/gpt2"),
        ("HuggingFaceTB/SmolLM2-135M", "smollm2-135m", "HuggingFaceTB/SmolLM2-135M"),
        (" SmolLM2-1.7B ", "smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B"),
    ],
)
def test_resolve_preset(ref: str, short: str, name: str) -> None:
    resolved = resolve_model(ref)
    assert isinstance(resolved, ResolvedModel)
    assert resolved.ref == ref
    assert resolved.source == "preset"
    assert resolved.name == name
    assert Path(resolved.path).name == short
    assert resolved.config["model_type"] == resolved.model_type
    assert Path(resolved.config_path).is_file()


@pytest.mark.parametrize("name", TINY_NAMES)
def test_resolve_tiny(name: str) -> None:
    resolved = resolve_model(name.upper())
    assert resolved.source == "tiny"
    assert resolved.name == name
    assert resolved.max_positions is not None and resolved.max_positions >= 1024


def test_max_positions_per_family() -> None:
    assert resolve_model("llama-3.1-8b").max_positions == 131072
    assert resolve_model("gpt2").max_positions == 1024  # n_positions
    assert resolve_model("phi-3-mini").max_positions == 4096
    assert resolve_model("gemma-2-2b").max_positions == 8192
    assert resolve_model("qwen2.5-0.5b").max_positions == 32768


def test_resolve_local_dir_and_config_file(tmp_path: Path) -> None:
    config = json.loads(Path(resolve_model("tiny-llama").config_path).read_text())
    config_file = _write_config(tmp_path / "my-model", config)
    by_dir = resolve_model(str(tmp_path / "my-model"))
    by_file = resolve_model(str(config_file))
    for resolved in (by_dir, by_file):
        assert resolved.source == "local"
        assert resolved.path == str((tmp_path / "my-model").resolve())
        assert resolved.model_type == "llama"
        assert resolved.max_positions == 2048


def test_local_dir_wins_over_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = json.loads(Path(resolve_model("tiny-gpt2").config_path).read_text())
    _write_config(tmp_path / "gpt2", config)
    monkeypatch.chdir(tmp_path)
    resolved = resolve_model("gpt2")
    assert resolved.source == "local"
    assert resolved.max_positions == 1024
    assert resolved.config["n_embd"] == 256


def test_dir_without_config_falls_through_or_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gpt2").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_model("gpt2").source == "preset"  # a bare name: the preset
    with pytest.raises(ModelNotFoundError, match=r"model directory './gpt2' has no config.json"):
        resolve_model("./gpt2")  # clearly a path: no fallback
    with pytest.raises(ModelNotFoundError, match=r"does not exist.*llama-3.1-8b"):
        resolve_model(str(tmp_path / "missing"))


def test_file_that_is_not_config_json(tmp_path: Path) -> None:
    other = tmp_path / "weights.json"
    other.write_text("{}")
    with pytest.raises(SpecError, match=r"is a file but not a config.json"):
        resolve_model(str(other))


def test_hf_cache_prefers_refs_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    base = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096}
    old = _fake_snapshot(cache, "my-org/My-Model", "aaaa", {**base, "hidden_size": 1})
    new = _fake_snapshot(cache, "my-org/My-Model", "bbbb", {**base, "hidden_size": 2})
    os.utime(old / "config.json", (time.time() + 100, time.time() + 100))  # old looks newest
    (cache / "models--my-org--My-Model" / "refs").mkdir()
    (cache / "models--my-org--My-Model" / "refs" / "main").write_text("bbbb\n")
    resolved = resolve_model("my-org/My-Model")
    assert resolved.source == "hf-cache"
    assert resolved.name == "my-org/My-Model"
    assert Path(resolved.path) == new
    assert resolved.config["hidden_size"] == 2
    assert resolved.max_positions == 4096
    # case-insensitive, like the hub
    assert Path(resolve_model("MY-ORG/my-model").path) == new
    # without refs/main: the most recently written snapshot
    (cache / "models--my-org--My-Model" / "refs" / "main").unlink()
    assert Path(resolve_model("my-org/My-Model").path) == old


def test_hf_cache_wins_over_preset_and_explicit_cache_dir(tmp_path: Path) -> None:
    config = json.loads(Path(resolve_model("gpt2").config_path).read_text())
    snapshot = _fake_snapshot(tmp_path, "openai-community/gpt2", "cafe", config)
    assert resolve_model("openai-community/gpt2").source == "preset"  # env cache is empty
    resolved = resolve_model("openai-community/gpt2", hf_cache=tmp_path)
    assert resolved.source == "hf-cache"
    assert Path(resolved.path) == snapshot


def test_hf_cache_dir_from_environment() -> None:
    assert default_hf_cache_dir({"HF_HUB_CACHE": "/a/hub", "HF_HOME": "/b"}) == Path("/a/hub")
    assert default_hf_cache_dir({"HF_HOME": "/b"}) == Path("/b/hub")
    assert default_hf_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")
    assert default_hf_cache_dir({}) == Path("~/.cache/huggingface/hub").expanduser()


def test_unknown_model_message() -> None:
    with pytest.raises(ModelNotFoundError, match=r"unknown model 'acme/NoSuchModel-3B'") as info:
        resolve_model("acme/NoSuchModel-3B")
    message = str(info.value)
    assert "\n" not in message
    assert "llama-3.1-8b" in message and "smollm2-135m" in message and "tiny-llama" in message
    assert "local directory containing config.json" in message
    assert "never downloads" in message
    assert isinstance(info.value, SpecError)
    with pytest.raises(ModelNotFoundError, match=r"use a preset \(llama-3.1-8b, "):
        resolve_model("llama-9")
    with pytest.raises(SpecError, match=r"non-empty string"):
        resolve_model("  ")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", r"not valid JSON: .* at line 1 column 2"),
        ("[1, 2]", r"must hold a JSON object, got a list"),
        ('{"hidden_size": 8}', r'must name its architecture in "model_type"; it has none'),
        ('{"model_type": 3}', r'must name its architecture in "model_type"; got 3'),
    ],
)
def test_malformed_config(tmp_path: Path, content: str, problem: str) -> None:
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(SpecError, match=r".*config\.json:? " + problem):
        resolve_model(str(tmp_path))


def test_remote_code_needs_trust(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _write_config(
        tmp_path,
        {
            "model_type": "acme_moe",
            "auto_map": {"AutoConfig": "configuration_acme.AcmeConfig"},
            "max_position_embeddings": 4096,
        },
    )
    with pytest.raises(SpecError, match=r"'acme_moe' .*needs the model's own code.*--trust-remote-code"):
        resolve_model(str(tmp_path))
    resolved = resolve_model(str(tmp_path), trust_remote_code=True)
    assert resolved.trust_remote_code and resolved.model_type == "acme_moe"


def test_unknown_model_type_without_auto_map(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _write_config(tmp_path, {"model_type": "acme_moe"})
    with pytest.raises(SpecError, match=r"'acme_moe' is not known to transformers .* no auto_map"):
        resolve_model(str(tmp_path), trust_remote_code=True)


def test_native_model_type_with_auto_map_is_fine(tmp_path: Path) -> None:
    # Phi-3's published config carries an auto_map although transformers ships phi3.
    config = json.loads(Path(resolve_model("phi-3-mini").config_path).read_text())
    config["auto_map"] = {"AutoConfig": "configuration_phi3.Phi3Config"}
    _write_config(tmp_path, config)
    assert resolve_model(str(tmp_path)).model_type == "phi3"


def test_check_seq_len() -> None:
    gpt2 = resolve_model("gpt2")
    check_seq_len(gpt2, 1024)
    with pytest.raises(SpecError, match=r"openai-community/gpt2 takes at most 1024 tokens, got seq_len=2048"):
        check_seq_len(gpt2, 2048)
    with pytest.raises(SpecError, match=r"seq_len must be a positive integer, got 0"):
        check_seq_len(gpt2, 0)
    check_seq_len(resolve_model("llama-3.1-8b"), 131072)
    unknown = ResolvedModel(
        ref="x", name="x", path="/x", source="local", config={}, model_type="llama", max_positions=None
    )
    check_seq_len(unknown, 10**6)  # nothing to check against
