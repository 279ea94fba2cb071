"""The QLoRA random-weight base: built once per (config, dtype, seed), atomic, a damaged entry rebuilt.

The saving half runs on a CPU (bitsandbytes' 4-bit load needs a GPU and is not exercised here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from transformers import AutoConfig  # noqa: E402

from autotune.models import resolve_model  # noqa: E402
from autotune.probe import qlora_base  # noqa: E402
from autotune.probe.qlora_base import MANIFEST, base_key, ensure_qlora_base  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def tiny_cfg(**changes: object) -> object:
    cfg = AutoConfig.from_pretrained(resolve_model("tiny-llama").path, local_files_only=True)
    for k, v in changes.items():
        setattr(cfg, k, v)
    return cfg


def test_built_once_then_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[Path] = []
    real = qlora_base._build_into

    def counting(folder: Path, *a: object, **kw: object) -> None:
        builds.append(folder)
        real(folder, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(qlora_base, "_build_into", counting)
    first, built = ensure_qlora_base(tiny_cfg(), dtype="float32", seed=42, root=tmp_path)
    assert built and len(builds) == 1
    assert (first / "model.safetensors").is_file() and (first / "config.json").is_file()
    manifest = json.loads((first / MANIFEST).read_text())
    assert manifest["key"] == first.name and manifest["files"]["model.safetensors"] > 0
    again, built_again = ensure_qlora_base(tiny_cfg(), dtype="float32", seed=42, root=tmp_path)
    assert again == first and not built_again and len(builds) == 1
    # nothing but the entry and its lock is left behind (no temporary folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, f"{first.name}.lock"])


def test_the_key_is_the_config_content_dtype_and_seed() -> None:
    k = base_key(tiny_cfg(), dtype="bfloat16", seed=42)
    assert base_key(tiny_cfg(), dtype="bfloat16", seed=42) == k
    assert base_key(tiny_cfg(_name_or_path="/elsewhere/copy"), dtype="bfloat16", seed=42) == k  # a renamed copy
    assert base_key(tiny_cfg(), dtype="float16", seed=42) != k
    assert base_key(tiny_cfg(), dtype="bfloat16", seed=7) != k
    assert base_key(tiny_cfg(num_hidden_layers=3), dtype="bfloat16", seed=42) != k


def test_the_same_seed_gives_the_same_weights_and_another_seed_others(tmp_path: Path) -> None:
    a, _ = ensure_qlora_base(tiny_cfg(), dtype="float32", seed=1, root=tmp_path / "a")
    b, _ = ensure_qlora_base(tiny_cfg(), dtype="float32", seed=1, root=tmp_path / "b")
    c, _ = ensure_qlora_base(tiny_cfg(), dtype="float32", seed=2, root=tmp_path / "c")
    data = [(p / "model.safetensors").read_bytes() for p in (a, b, c)]
    assert data[0] == data[1] and data[0] != data[2]


@pytest.mark.parametrize("damage", ["truncated", "no_manifest", "bad_manifest", "missing_file"])
def test_a_partial_or_damaged_entry_is_rebuilt(tmp_path: Path, damage: str) -> None:
    entry, _ = ensure_qlora_base(tiny_cfg(), dtype="float32", seed=42, root=tmp_path)
    good = (entry / "model.safetensors").read_bytes()
    weights = entry / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(good[: len(good) // 2])
    elif damage == "no_manifest":
        (entry / MANIFEST).unlink()
    elif damage == "bad_manifest":
        (entry / MANIFEST).write_text("{not json")
    else:
        weights.unlink()
    again, built = ensure_qlora_base(tiny_cfg(), dtype="float32", seed=42, root=tmp_path)
    assert built and again == entry and (entry / "model.safetensors").read_bytes() == good
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp or stale folder left


def test_a_build_that_fails_leaves_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(folder: Path, *a: object, **kw: object) -> None:
        (folder / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(qlora_base, "_build_into", broken)
    with pytest.raises(OSError, match="disk full"):
        ensure_qlora_base(tiny_cfg(), dtype="float32", seed=42, root=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [f"{base_key(tiny_cfg(), dtype='float32', seed=42)}.lock"]


@pytest.mark.slow
def test_concurrent_probes_build_it_once_and_never_see_half_of_it(tmp_path: Path) -> None:
    """Three processes ask at once: one builds, each gets a complete entry, the same one."""
    script = textwrap.dedent(f"""
        import json, sys
        from transformers import AutoConfig
        from autotune.models import resolve_model
        from autotune.probe import qlora_base
        cfg = AutoConfig.from_pretrained(resolve_model("tiny-llama").path, local_files_only=True)
        path, built = qlora_base.ensure_qlora_base(cfg, dtype="float32", seed=42, root={str(tmp_path)!r})
        ok = qlora_base._complete(path, path.name)
        print(json.dumps({{"path": str(path), "built": built, "complete": ok}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    outs = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(o["complete"] for o in outs)
    assert len({o["path"] for o in outs}) == 1
    assert sum(o["built"] for o in outs) == 1
