"""README "Use the answer": every block marked ``<!-- use-the-answer: TARGET -->`` runs as written.

The blocks are run against a fixture run's ``best/`` (tiny-llama with random weights, a
``save_to_disk`` chat dataset, the fake executor choosing the configuration), the placeholders
``results/RUN_ID/best``, ``MODEL_DIR`` and ``DATA_DIR`` replaced. Python blocks run in a fresh
interpreter; each command of a bash block runs on its own. ``axolotl`` and ``llamafactory-cli`` are
not installed beside transformers 5.x: their commands are not run, and their YAML is checked instead
against the published key sets (through ``autotune check`` and ``autotune.formats.known_keys``).
A ``deepspeed.json`` only exists when ZeRO was chosen, so lines naming it run against the ``best/``
of a ZeRO answer, whose files are also loaded with accelerate's and DeepSpeed's own config classes.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _fakes import FakeExecutor

from autotune.emit import emit_all
from autotune.formats import known_keys
from autotune.run._tune import tune
from autotune.spec import ProbeResult
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TOK = ROOT / "autotune" / "models" / "tokenizers" / "tiny-chat"
TARGETS = {"trainer", "trl", "axolotl", "llamafactory", "accelerate-deepspeed"}
NOT_INSTALLED = {"axolotl": "axolotl", "llamafactory-cli": "llamafactory"}
BLOCK = re.compile(r"<!-- use-the-answer: ([\w-]+) -->\s*\n```(\w+)\n(.*?)```", re.S)
CHAT = [
    {"role": "user", "content": "how fast is the model ?"},
    {"role": "assistant", "content": "very fast ."},
]


def readme_blocks() -> list[tuple[str, str, str]]:
    return [(t, lang, body) for t, lang, body in BLOCK.findall(README.read_text(encoding="utf-8"))]


def commands(body: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines dropped."""
    out, cur = [], ""
    for line in body.splitlines():
        line = line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("answer")
    data = root / "chat"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"messages": [CHAT] * 48})}).save_to_disk(
        str(data)
    )
    # the model the blocks load: tiny-llama's config, random weights, the tiny chat tokenizer beside them
    model = root / "model"
    from autotune.models import resolve_model

    cfg = transformers.AutoConfig.from_pretrained(resolve_model("tiny-llama").path, local_files_only=True)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(model)
    transformers.AutoTokenizer.from_pretrained(TOK).save_pretrained(model)
    result = tune("tiny-llama", gpu_budget="10GiB", seq_len=64, effective_batch=4, space="cpu", device="cpu",
                  max_trials=4, out=root / "runs", executor=FakeExecutor(), dataset=str(data), tokenizer=str(TOK))  # fmt: skip
    # a ZeRO answer (what a multi-GPU run chooses): the files a DeepSpeed launch reads
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    req = ProbeRequest(
        workload=Workload(model="tiny-llama", seq_len=64),
        candidate=Candidate(micro_batch=2, precision="bf16", world_size=2, zero_stage=3, offload="optimizer"),
        settings=ProbeSettings(device="cuda"),
    )
    zero = root / "zero" / "best"
    emit_all(
        ProbeResult(status="ok", request=req.to_dict(), metrics={"tokens_per_s": 1.0}), zero, fields=fields
    )
    return {"best": Path(result.run_dir) / "best", "zero": zero, "model": model, "data": data, "root": root}


def _fill(text: str, fx: dict[str, Path], best: Path) -> str:
    return (
        text.replace("results/RUN_ID/best", str(best))
        .replace("MODEL_DIR", str(fx["model"]))
        .replace("DATA_DIR", str(fx["data"]))
    )


def _env() -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "ACCELERATE_USE_CPU": "true", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip


def test_the_readme_has_one_marked_block_or_more_per_target() -> None:
    found = {t for t, _, _ in readme_blocks()}
    assert found == TARGETS, f"README 'Use the answer' blocks: {sorted(found)}"
    for target, lang, body in readme_blocks():
        assert lang in ("bash", "python") and body.strip(), target


def test_axolotl_and_llamafactory_yaml_use_only_published_keys(fixture: dict[str, Path]) -> None:
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    for fmt, name in (("axolotl", "axolotl.yaml"), ("llamafactory", "llamafactory.yaml")):
        for best in (fixture["best"], fixture["zero"]):
            cfg = yaml.safe_load((best / name).read_text())
            keys = known_keys(fmt, ta_fields=fields)
            assert keys and set(cfg) <= keys, (
                f"{name}: keys {sorted(set(cfg) - keys)} are not in {fmt}'s published set"
            )


def test_the_zero_answer_loads_in_accelerate_and_deepspeed(fixture: dict[str, Path]) -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    zero = fixture["zero"]
    cfg = ClusterConfig.from_yaml_file(str(zero / "accelerate_config.yaml"))
    assert cfg.distributed_type.value == "DEEPSPEED"
    assert (zero / cfg.deepspeed_config["deepspeed_config_file"]).is_file()
    pytest.importorskip("deepspeed")
    import json

    from deepspeed.runtime.config import DeepSpeedConfig

    assert DeepSpeedConfig(json.loads((zero / "deepspeed.json").read_text())).zero_optimization_stage == 3


@pytest.mark.timeout(600)  # each block trains for real: minutes on 2 cores
@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_each_readme_block_runs_as_written(fixture: dict[str, Path], target: str, tmp_path: Path) -> None:
    blocks = [(lang, body) for t, lang, body in readme_blocks() if t == target]
    assert blocks
    ran, skipped = [], []
    for lang, body in blocks:
        if lang == "python":
            code = _fill(body, fixture, fixture["best"])
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                                  env=_env(), cwd=tmp_path)  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-3000:]
            ran.append("python block")
            continue
        for cmd in commands(body):
            # the command's program: past any leading VAR=value assignments (the allocator's setting)
            exe = next(w for w in shlex.split(cmd) if not re.match(r"^[A-Z_][A-Z0-9_]*=", w))
            if exe in NOT_INSTALLED and shutil.which(exe) is None:
                skipped.append(exe)  # its YAML is checked against the published keys instead
                continue
            best = fixture["zero"] if "deepspeed.json" in cmd else fixture["best"]
            filled = _fill(cmd, fixture, best)
            proc = subprocess.run(["bash", "-c", filled], capture_output=True, text=True, timeout=600,
                                  env=_env(), cwd=tmp_path)  # fmt: skip
            out = proc.stdout + proc.stderr
            if exe == "autotune" and " check " in f" {cmd} " and cmd.endswith((".yaml", ".yml")):
                # judged for a GPU: a CPU answer (fp32) fails 'mixed precision', exit 1; the keys must pass
                assert proc.returncode in (0, 1) and re.search(r"PASS\s+argument names .* all known", out), (
                    out
                )
            else:
                assert proc.returncode == 0, f"{filled}\n{out[-3000:]}"
            ran.append(exe)
    assert ran, f"nothing of the {target} block ran"
    assert set(skipped) <= set(NOT_INSTALLED)
    if target in ("trainer", "accelerate-deepspeed", "trl"):
        assert (tmp_path / "out" / "config.json").is_file(), "the training run saved its model in out/"
