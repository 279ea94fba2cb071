"""`autotune probe` end to end: the real CLI (in-process; its probe in a process of its own), a real probe on
CPU, and bad input; the console script and ``python -m autotune`` in real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import cli

BASE = ["--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--micro-batch", "2",
        "--warmup-steps", "1", "--steps", "2", "--precision", "fp32"]  # fmt: skip


def autotune(tmp: Path, *args: str, timeout: float = 300, process: bool = False) -> subprocess.CompletedProcess[str]:
    """The CLI in-process (its probe still runs in a probe process of its own), or in a real process."""
    return cli(tmp, *args, timeout=timeout, process=process)


@pytest.mark.slow
def test_probe_human_output_and_flags(tmp_path: Path) -> None:
    p = autotune(tmp_path, "probe", *BASE, "--grad-ckpt", "--attn", "eager", "--workers", "1", "--no-pin-memory",
                 "--packing", "--lengths", "lognormal:3.5,1.0", "--gpu-budget", "4GB", "--timeout", "200")  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "tokens/s (real tokens)" in out
    assert "ckpt on" in out and "attn eager" in out and "packing on" in out and "workers 1" in out
    assert "of 3.73 GiB budget" in out


@pytest.mark.slow
def test_probe_lora_mode_json_end_to_end(tmp_path: Path) -> None:
    p = autotune(tmp_path, "probe", *BASE, "--mode", "lora", "--lora-r", "4", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)  # stdout holds only the JSON
    assert data["status"] == "ok" and data["metrics"]["tokens_per_s"] > 0
    assert data["request"]["candidate"]["micro_batch"] == 2
    assert data["request"]["workload"]["model"] == "tiny-llama"
    m = data["metrics"]
    assert 0 < m["trainable_params"] < m["num_params"] / 10


@pytest.mark.slow
def test_unsupported_exits_1_with_reason(tmp_path: Path) -> None:
    p = autotune(tmp_path, "probe", *BASE, "--attn", "flash_attention_2")
    assert p.returncode == 1
    assert "unsupported" in p.stdout and "flash_attention_2" in p.stdout


@pytest.mark.slow
def test_over_budget_exits_3(tmp_path: Path) -> None:
    p = autotune(tmp_path, "probe", *BASE, "--gpu-budget", "2MB", "--json")
    assert p.returncode == 3
    assert json.loads(p.stdout)["status"] == "over_budget"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-model"], "unknown model"),
        (["--gpu-budget", "24XB"], "unknown unit"),
        (["--gpu-budget", "-1GB"], "must be positive"),
        (["--gpu-budget", "0"], "must be positive"),
        (["--seq-len", "999999"], "max"),
        (["--attn", "fast"], "--attn must be one of"),
        (["--micro-batch", "0"], "--micro-batch must be an integer >= 1"),
        (["--dataset", "/nonexistent/data.jsonl"], "data.jsonl"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    base = [a for a in BASE]
    # later flags override earlier ones in click; put the bad one last
    p = autotune(tmp_path, "probe", *base, *args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert message.lower() in lines[0].lower()
    assert "Traceback" not in p.stderr


def test_dataset_text_without_tokenizer_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    p = autotune(tmp_path, "probe", *BASE, "--dataset", str(data))
    assert p.returncode == 2
    assert "tokenizer" in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_dataset_with_input_ids_runs(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    rows = [{"input_ids": list(range(1, 10 + (i * 7) % 50))} for i in range(64)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = autotune(tmp_path, "probe", *BASE, "--dataset", str(data), "--json")
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout)["metrics"]
    assert m["real_tokens"] < m["token_slots"]


def test_python_m_and_console_script_agree(tmp_path: Path) -> None:
    p = autotune(tmp_path, "--help", process=True)
    assert p.returncode == 0 and "probe" in p.stdout
    exe = Path(sys.executable).parent / "autotune"
    if exe.exists():
        q = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
        assert q.returncode == 0 and "probe" in q.stdout
