"""benchmarks/gpu_check.sh: the one-pass GPU script, run in its dry mode on CPU (the same code paths)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def test_usage_without_an_output_folder() -> None:
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 2 and "usage:" in res.stderr


def test_the_script_is_valid_bash() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], cwd=REPO).returncode == 0


@pytest.mark.slow
def test_dry_run_writes_every_output_in_at_most_8_files(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check"
    res = subprocess.run(["bash", str(SCRIPT), str(out), "--dry-run"], capture_output=True, text=True, cwd=REPO,
                         timeout=900)
    assert res.returncode == 0, res.stderr
    files = sorted(p.name for p in out.rglob("*"))
    assert len(files) <= 8 and all(p.is_file() and p.parent == out for p in out.rglob("*")), files
    summary = (out / "summary.txt").read_text()
    for step in ("environment: ok", "landscape: ok", "tuned vs HF default: ok", "zero stages: ok",
                 "estimator accuracy: ok"):
        assert step in summary, summary
    land = json.loads((out / "landscape.json").read_text())
    assert land["model"] == "tiny-llama" and any(e["repeats"] for e in land["entries"])
    tvd = json.loads((out / "tuned_vs_default.json").read_text())
    assert tvd["tuned"]["status"] == "ok" and tvd["hf_default"]["status"] == "ok" and tvd["speedup"] > 0
    assert "sdpa" in tvd["hf_default"]["label"]
    assert json.loads((out / "environment.json").read_text())["device"].startswith("cpu")
