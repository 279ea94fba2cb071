"""``--trainer trl``: probes measured through TRL's SFTTrainer with the config ``best/sft_config.json`` holds.

Fast: the pure pieces (probe overrides, request checks, padding-free counting, the worst-case sampler),
one in-process probe per packing mode on a save_to_disk chat dataset (its measured SFTConfig is the
emitted one; its real tokens are the chats' tokens), and the CLI's refusals. Slow: the issue's "done
when": ``autotune run --trainer trl`` from the CLI, then ``best/train_sft.py --max-steps 5`` on the
same data at the probe's speed (interleaved with re-measures of the probe; ``-s`` prints the figures).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autotune.emit import build_files
from autotune.formats.training_args import RUN_ONLY_KEYS
from autotune.formats.trl import TRL_PACKING_QUALITY_NOTE, sft_config, sft_probe_overrides
from autotune.probe.collate import pop_counts
from autotune.probe.trl_probe import FrontSampler, trainer_problems
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

ROOT = Path(__file__).resolve().parent.parent
TINY_CHAT = ROOT / "autotune" / "models" / "tokenizers" / "tiny-chat"
TINY_LLAMA = ROOT / "autotune" / "models" / "tiny" / "tiny-llama"
CHAT = [
    {"role": "user", "content": "how fast is the model ?"},
    {"role": "assistant", "content": "very fast ."},
]


def _fields() -> set[str]:
    trl = pytest.importorskip("trl")
    return set(trl.SFTConfig.__dataclass_fields__)


def _request(packing: bool, *, dataset: str | None = None, tokenizer: str | None = str(TINY_CHAT),
             budget: int | None = None, micro_batch: int = 4) -> ProbeRequest:
    return ProbeRequest(
        workload=Workload(model="tiny-llama", model_path=str(TINY_LLAMA), seq_len=64, dataset=dataset,
                          tokenizer=tokenizer, trainer="trl"),
        candidate=Candidate(micro_batch=micro_batch, grad_accum=1, precision="fp32", packing=packing),
        settings=ProbeSettings(device="cpu", warmup_steps=1, steps=2, budget_bytes=budget, timeout_s=300),
    )


def _chat_dir(tmp_path: Path, rows: int = 32) -> Path:
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "chat"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"messages": [CHAT] * rows})}).save_to_disk(str(out))
    return out


def _chat_tokens() -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY_CHAT)
    return len(tok(tok.apply_chat_template(CHAT, tokenize=False), add_special_tokens=False)["input_ids"])


# ------------------------------------------------------------------ pure pieces


def test_probe_overrides_touch_only_run_only_keys() -> None:
    fields = _fields()
    req = _request(True)
    over = sft_probe_overrides(req, fields=fields, device="cpu")
    assert set(over) <= RUN_ONLY_KEYS and over["max_steps"] == 3 and over["save_strategy"] == "no"
    # SFTTrainer's own seeded sampler order is kept (train_sft.py reads in it)
    assert "train_sampling_strategy" not in over
    emitted = sft_config(req, fields=fields, device="cpu", mean_seq_len=20.0)
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "packing", "packing_strategy",
                "max_length", "optim", "bf16", "activation_checkpointing", "dataloader_num_workers"):
        assert key not in over, key
        assert key in emitted or key == "activation_checkpointing" and "gradient_checkpointing" in emitted


def test_trainer_problems_name_the_fix() -> None:
    wl = _request(False).workload
    assert trainer_problems(dataclasses.replace(wl, trainer="hf", tokenizer=None)) == []
    assert trainer_problems(wl) == []
    no_tok = trainer_problems(dataclasses.replace(wl, tokenizer=None))
    assert len(no_tok) == 1 and "--tokenizer DIR" in no_tok[0]
    dist = trainer_problems(wl, Candidate(world_size=2))
    assert len(dist) == 1 and "--trainer hf" in dist[0]


def test_padding_free_row_counts_its_sequences() -> None:
    # TRL's padding-free collator: one flattened row, no attention mask, positions restarting per sequence
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    c = pop_counts({"input_ids": torch.ones_like(pos), "position_ids": pos, "labels": torch.ones_like(pos)})
    assert (c.real_tokens, c.sequences, c.rows, c.slots) == (9, 3, 1, 9)
    # a padded batch: tokens from the mask, one sequence per row
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    c = pop_counts({"input_ids": torch.ones_like(mask), "attention_mask": mask})
    assert (c.real_tokens, c.sequences, c.rows, c.slots) == (4, 2, 2, 6)


def test_front_sampler_puts_the_worst_case_first_once() -> None:
    s = FrontSampler([3, 0, 2, 1, 4], front=[2, 4])
    assert list(s) == [2, 4, 3, 0, 1] and len(s) == 5
    assert list(s) == [3, 0, 2, 1, 4]  # later epochs: the base order


# ------------------------------------------------------------------ a real SFTTrainer probe, in process


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False, True])
def test_trl_probe_measures_the_emitted_sft_config(tmp_path: Path, packing: bool) -> None:
    pytest.importorskip("trl")
    from autotune.probe.worker import run_probe_in_process

    data = _chat_dir(tmp_path)
    req = _request(packing, dataset=str(data), budget=8 * 2**30)
    res = run_probe_in_process(req, launch_time=time.time())
    assert res.status == "ok", res.reason
    m = res.metrics
    n = _chat_tokens()
    assert m["trainer"] == "trl" and m["dataset_column"] == "messages"
    assert m["mean_seq_len"] == pytest.approx(n)
    # the measured SFTConfig is best/sft_config.json's, apart from the probe's run-only keys
    files = build_files(ProbeResult.from_dict(res.to_dict()), fields=_fields(), device="cpu")
    emitted = json.loads(files["sft_config.json"])
    measured = dict(m["trainer_config"])
    over = sft_probe_overrides(req, fields=_fields(), device="cpu")
    assert {k: v for k, v in measured.items() if k not in over} == {k: v for k, v in emitted.items() if k not in over}
    # real tokens only: every step holds whole chats of n tokens, no padding counted
    if packing:
        rows = emitted["per_device_train_batch_size"]
        assert rows == round(4 * n / 64) and m["trl_padding_free"] is True
        per_row = 64 // n
        assert m["step_real_tokens"] == [rows * per_row * n] * 2
        assert m["step_sequences"] == [rows * per_row] * 2
        assert m["quality_notes"] == [TRL_PACKING_QUALITY_NOTE]
    else:
        assert emitted["per_device_train_batch_size"] == 4 and m["trl_padding_free"] is False
        assert m["step_real_tokens"] == [4 * n] * 2 and m["step_sequences"] == [4] * 2
        assert "quality_notes" not in m
    assert m["padding_fraction"] == 0.0
    assert m["tokens_per_s"] > 0 and m["peak_mem_bytes"] > 0 and len(m["losses"]) == 3
    from autotune.cli.render import probe_table_rows

    rows = dict(probe_table_rows(res))
    assert rows["model"].endswith("through TRL SFTTrainer")
    assert rows["SFTConfig"].startswith(f"per_device_train_batch_size {emitted['per_device_train_batch_size']}")
    assert (rows.get("quality note") == TRL_PACKING_QUALITY_NOTE) is packing


@pytest.mark.slow
def test_trl_probe_on_synthetic_tokens(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from autotune.probe.worker import run_probe_in_process

    req = dataclasses.replace(_request(True), workload=dataclasses.replace(_request(True).workload,
                                                                          lengths="uniform:8-40"))
    res = run_probe_in_process(req, launch_time=time.time())
    assert res.status == "ok", res.reason
    m = res.metrics
    assert m["dataset_column"] == "input_ids" and 8 <= m["mean_seq_len"] <= 40
    assert all(0 < t <= 64 * m["trainer_config"]["per_device_train_batch_size"] for t in m["step_real_tokens"])


# ------------------------------------------------------------------ the CLI


def _cli(tmp: Path, *args: str, timeout: float = 300, process: bool = False) -> subprocess.CompletedProcess[str]:
    """The CLI in-process (tests/_cli.py; a probe still runs in a process of its own), or in a real process."""
    from _cli import cli

    return cli(tmp, *args, timeout=timeout, process=process)


@pytest.mark.parametrize("cmd", ["probe", "run"])
def test_trainer_trl_without_tokenizer_is_refused(cmd: str, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    extra = ["--gpu-budget", "4GB", "--out", str(tmp_path / "r")] if cmd == "run" else []
    p = _cli(tmp_path, cmd, "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--trainer", "trl", *extra)
    assert p.returncode == 2, p.stderr
    assert "--tokenizer DIR" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "r").exists()


def test_bad_trainer_value_is_refused(tmp_path: Path) -> None:
    p = _cli(tmp_path, "probe", "--model", "tiny-llama", "--device", "cpu", "--trainer", "deepspeed")
    assert p.returncode == 2 and "trainer must be one of hf, trl" in p.stderr


@pytest.mark.slow
def test_probe_cli_trainer_trl_json(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    data = _chat_dir(tmp_path)
    p = _cli(tmp_path, "probe", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--micro-batch", "2",
             "--warmup-steps", "1", "--steps", "1", "--precision", "fp32", "--dataset", str(data),
             "--tokenizer", str(TINY_CHAT), "--trainer", "trl", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    assert res["status"] == "ok" and res["request"]["workload"]["trainer"] == "trl"
    assert res["metrics"]["step_real_tokens"] == [2 * _chat_tokens()]


def test_tune_keys_and_reports_the_trainer(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from _fakes import FakeExecutor

    from autotune.run._tune import tune

    ex = FakeExecutor()
    res = tune("tiny-llama", gpu_budget="10GiB", seq_len=512, effective_batch=8, space="cpu", device="cpu",
               max_trials=4, out=tmp_path, executor=ex, trainer="trl", tokenizer=str(TINY_CHAT))
    assert res.summary["trainer"] == "trl"
    assert res.summary["environment"]["software"]["trl"]  # TRL's version keys the answer too
    assert json.loads((res.run_dir / "run.json").read_text())["request"]["trainer"] == "trl"
    assert {(r.workload.trainer, r.workload.tokenizer) for r in ex.requests} == {("trl", str(TINY_CHAT))}
    hf = tune("tiny-llama", gpu_budget="10GiB", seq_len=512, effective_batch=8, space="cpu", device="cpu",
              max_trials=4, out=tmp_path, executor=FakeExecutor())
    assert hf.summary["trainer"] == "hf" and "trl" not in hf.summary["environment"]["software"]
    assert hf.summary["cache_key"] != res.summary["cache_key"]  # the trainer is part of the request


# ------------------------------------------------------------------ done when (issue 16)


def _varied_chat_dir(tmp_path: Path, rows: int = 96) -> Path:
    import random

    datasets = pytest.importorskip("datasets")
    r = random.Random(0)
    words = "the model trains fast on small data and the answer is yes no maybe".split()
    msgs = [[{"role": "user", "content": " ".join(r.choice(words) for _ in range(r.randint(2, 12)))},
             {"role": "assistant", "content": " ".join(r.choice(words) for _ in range(r.randint(2, 20)))}]
            for _ in range(rows)]
    out = tmp_path / "chat"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"messages": msgs})}).save_to_disk(str(out))
    return out


@pytest.mark.timeout(900)  # a real end-to-end run: minutes on 2 cores
@pytest.mark.slow
@pytest.mark.serial  # it compares train_sft.py's speed with the reported one
@pytest.mark.ray
def test_run_trainer_trl_then_train_sft_py_at_the_reported_speed(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    import transformers

    data = _varied_chat_dir(tmp_path)
    space = tmp_path / "small.yaml"
    space.write_text("# autotune run ... --trainer trl --space small.yaml\nmicro_batch: [4, 8]\n"
                     "packing: [false, true]\nattn: [sdpa]\nprecision: [fp32]\npin_memory: [false]\nworkers: [0]\n")
    out = tmp_path / "results"
    p = _cli(tmp_path, "run", "--model", "tiny-llama", "--device", "cpu", "--gpu-budget", "4GB", "--seq-len", "64",
             "--effective-batch", "8", "--space", str(space), "--max-trials", "2", "--top-k", "1", "--steps", "3",
             "--confirm-rounds", "1:1",
             "--dataset", str(data), "--tokenizer", str(TINY_CHAT), "--trainer", "trl", "--out", str(out), "--json",
             timeout=900, process=True)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout)
    assert summary["status"] == "complete" and summary["trainer"] == "trl"
    rd = Path(summary["run_dir"])
    best = json.loads((rd / "best_result.json").read_text())
    assert best["request"]["workload"]["trainer"] == "trl"
    emitted = json.loads((rd / "best" / "sft_config.json").read_text())
    measured = best["metrics"]["trainer_config"]
    assert {k: v for k, v in emitted.items() if k not in RUN_ONLY_KEYS} == {
        k: v for k, v in measured.items() if k not in RUN_ONLY_KEYS}
    if best["request"]["candidate"]["packing"]:
        assert summary["quality_notes"] == [TRL_PACKING_QUALITY_NOTE]

    # train_sft.py runs the emitted config on the same data: weights for the tiny model first
    model_dir = tmp_path / "model"
    cfg = transformers.AutoConfig.from_pretrained(TINY_LLAMA)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(model_dir)
    w = best["request"]["settings"]["warmup_steps"]

    def train_sft(i: int) -> float:
        log = tmp_path / f"speed{i}.json"
        t = subprocess.run(
            [sys.executable, str(rd / "best" / "train_sft.py"), "--model", str(model_dir), "--tokenizer",
             str(TINY_CHAT), "--dataset", str(data), "--max-steps", "5", "--use-cpu", "--output-dir",
             str(tmp_path / "out"), "--log-speed", str(log)],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )  # fmt: skip
        assert t.returncode == 0, t.stderr[-3000:]
        speed = json.loads(log.read_text())
        assert len(speed["seconds"]) == 5 and all(x > 0 for x in speed["real_tokens"])
        # the probe's window: after its warm-up steps, real tokens over seconds
        return sum(speed["real_tokens"][w:]) / sum(speed["seconds"][w:])

    def probe(i: int) -> float:  # the winner's request again, through the worker an executor starts
        (tmp_path / f"req{i}.json").write_text(json.dumps(best["request"]))
        p = subprocess.run([sys.executable, "-m", "autotune.probe.worker", str(tmp_path / f"req{i}.json"),
                            str(tmp_path / f"res{i}.json")], capture_output=True, text=True, timeout=600, cwd=ROOT)
        res = json.loads((tmp_path / f"res{i}.json").read_text())
        assert p.returncode == 0 and res["status"] == "ok", (res["status"], res.get("reason"))
        return float(res["metrics"]["tokens_per_s"])

    # "Within the measured noise". On a shared machine the load changes between minutes, so the run's
    # own repeats are not the noise train_sft.py meets later (measured: a run confirming 73-82 tok/s
    # under load, then train_sft.py at 580 tok/s once the load had gone). So the probe is measured
    # again interleaved with train_sft.py (probe, train_sft, probe, train_sft), and train_sft.py's
    # median must lie inside the probe samples' range (the run's repeats and these) widened by their
    # own relative spread ((max - min) / median), by at least 25%, the CPU confirmation tolerance.
    probes = [float(x) for x in summary["best"]["tokens_per_s_measurements"]]
    sft = []
    for i in range(2):
        probes.append(probe(i))
        sft.append(train_sft(i))
    probes.sort()
    med = probes[len(probes) // 2] if len(probes) % 2 else (probes[len(probes) // 2 - 1] + probes[len(probes) // 2]) / 2
    slack = 1.0 + max(0.25, (probes[-1] - probes[0]) / med)
    tps = sum(sft) / len(sft)
    print(f"train_sft.py {[round(x, 1) for x in sft]} tok/s; probe {[round(x, 1) for x in probes]} tok/s "
          f"(reported {summary['best']['tokens_per_s']:.1f}); slack {slack:.2f}; best {summary['best']['label']}")
    assert probes[0] / slack <= tps <= probes[-1] * slack, (sft, probes, slack)


def test_verify_loss_expects_trl_packing_to_change_the_batches() -> None:
    from autotune.run._verify import expected_differences

    ref = Candidate(micro_batch=8, precision="fp32")
    packed = dataclasses.replace(ref, packing=True)
    (hf,) = expected_differences(packed, ref)
    (trl,) = expected_differences(packed, ref, trainer="trl")
    assert hf["expected"].startswith("small difference") and trl["expected"].startswith("changed batches")
