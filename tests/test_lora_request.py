"""The adapters a LoRA run measures are the ones the user asked for: --lora-r / --lora-alpha / --lora-targets on
`run` and `tune()`, and a --from file's own rank, alpha and targets, reach every probe, the cache key and the
emitted files (a file's r=64 was probed and emitted as r=16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _cli import cli
from _fakes import FakeExecutor

from autotune.run._tune import tune

DATA = Path(__file__).parent / "data" / "formats"
BASE = dict(gpu_budget="10GiB", seq_len=256, effective_batch=8, space="cpu", max_trials=3, device="cpu", top_k=1,
            load_monitor=False, baseline=False, mode="lora")  # fmt: skip


def _tune(tmp_path: Path, **kw):  # noqa: ANN202
    ex = FakeExecutor()
    res = tune("tiny-llama", out=tmp_path / "out", executor=ex, **{**BASE, **kw})
    return res, ex


def test_tunes_lora_settings_reach_every_probe_the_key_and_the_emitted_files(tmp_path: Path) -> None:
    res, ex = _tune(tmp_path, lora_r=64, lora_alpha=32, lora_targets="all-linear")
    assert ex.requests and {(r.workload.lora_r, r.workload.lora_alpha, r.workload.lora_targets) for r in ex.requests} \
        == {(64, 32, ("all-linear",))}
    best = res.run_dir / "best"
    lc = json.loads((best / "lora_config.json").read_text())
    assert (lc["r"], lc["lora_alpha"], lc["target_modules"]) == (64, 32, "all-linear")
    lf = yaml.safe_load((best / "llamafactory.yaml").read_text())
    assert (lf["lora_rank"], lf["lora_alpha"], lf["lora_target"]) == (64, 32, "all")
    ax = yaml.safe_load((best / "axolotl.yaml").read_text())
    assert (ax["lora_r"], ax["lora_alpha"], ax.get("lora_target_linear")) == (64, 32, True)
    assert "lora_target_modules" not in ax
    # another rank is another request: not answered from the store
    again, ex2 = _tune(tmp_path, lora_r=16, lora_targets="q_proj,v_proj")
    assert not again.from_cache and again.summary["cache_key"] != res.summary["cache_key"]
    assert {(r.workload.lora_r, r.workload.lora_alpha, r.workload.lora_targets) for r in ex2.requests} \
        == {(16, 32, ("q_proj", "v_proj"))}  # alpha: 2 x the rank


@pytest.mark.parametrize("kw,needle", [({"lora_r": 0}, "LoRA rank must be an integer >= 1; got 0"),
                                       ({"lora_alpha": -1}, "LoRA alpha must be a number > 0; got -1"),
                                       ({"lora_targets": " , "}, "LoRA targets must be attn, all-linear or module")])
def test_bad_lora_settings_are_refused_before_anything_is_written(tmp_path: Path, kw: dict, needle: str) -> None:
    from autotune.errors import SpecError

    with pytest.raises(SpecError, match=needle):
        _tune(tmp_path, **kw)
    assert not (tmp_path / "out").exists()


def test_run_from_a_llamafactory_file_measures_its_own_adapters(tmp_path: Path, monkeypatch) -> None:
    """A LLaMA-Factory file with lora_rank 64 and two target modules: the probes measure r=64 (alpha 2 x 64, the
    file giving none) on those modules; a command-line --lora-r wins over the file."""
    import _fake_cli

    seen: list = []
    real_submit = _fake_cli.SlowFake.submit

    def submit(self, request):  # type: ignore[no-untyped-def]
        seen.append(request.workload)
        return real_submit(self, request)

    monkeypatch.setattr(_fake_cli.SlowFake, "submit", submit)
    monkeypatch.setenv("FAKE_PROBE_S", "0")
    text = (DATA / "lf_lora_sft.yaml").read_text().replace("lora_rank: 16", "lora_rank: 64")
    text = text.replace("lora_target: all", "lora_target: q_proj,v_proj")
    src = tmp_path / "lf.yaml"
    src.write_text(text)
    args = ["run", "--from", str(src), "--model", "tiny-llama", "--device", "cpu", "--gpu-budget", "64GiB", "--space", "cpu",
            "--max-trials", "2", "--top-k", "1", "--out", str(tmp_path / "out"), "--json"]
    done = cli(tmp_path, *args, fake=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert seen and {(w.lora_r, w.lora_alpha, w.lora_targets) for w in seen} == {(64, 128, ("q_proj", "v_proj"))}
    seen.clear()
    done = cli(tmp_path, *args, "--lora-r", "8", "--fresh", fake=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert {w.lora_r for w in seen} == {8}


def test_a_llamafactory_file_without_lora_target_adapts_every_linear_as_llamafactory_does() -> None:
    from autotune.formats import read_config

    text = "\n".join(ln for ln in (DATA / "lf_lora_sft.yaml").read_text().splitlines()
                     if not ln.startswith("lora_target")) + "\n"
    assert read_config("lf.yaml", text).request["lora_targets"] == ("all-linear",)
    assert read_config("ax.yaml", (DATA / "axolotl_lora.yaml").read_text()).request["lora_targets"] == ("all-linear",)


def test_a_bad_lora_flag_beside_from_is_refused_not_replaced_by_the_files_value(tmp_path: Path) -> None:
    args = ["run", "--from", str(DATA / "lf_lora_sft.yaml"), "--model", "tiny-llama", "--device", "cpu",
            "--gpu-budget", "64GiB", "--out", str(tmp_path / "out"), "--lora-r", "0"]
    done = cli(tmp_path, *args, fake=True)
    assert done.returncode == 2 and "LoRA rank must be an integer >= 1; got 0" in done.stderr, done.stderr[-1000:]
    assert not (tmp_path / "out").exists()
