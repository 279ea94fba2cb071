"""The emitted train.py runs what the probe measured: same batches, same collator, same arguments.

The probe and ``train.py`` (run as a subprocess, as a user runs it) train on the same dataset; each
optimizer step must hold the same real tokens and sequences, and the first step's loss must agree
(same weights, same batch contents). Packing keeps the effective batch: sequences per optimizer
step == micro_batch x grad_accum. Packed sequences' logits under the collator train.py uses equal
those of each sequence alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _probes import probe  # noqa: E402

from autotune.emit import build_files, emit_all  # noqa: E402
from autotune.formats.training_args import RUN_ONLY_KEYS, probe_kwargs  # noqa: E402
from autotune.models import resolve_model  # noqa: E402
from autotune.probe import collate  # noqa: E402
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload  # noqa: E402
from autotune.spec.result import ProbeResult  # noqa: E402

SEQ_LEN = 48


@pytest.fixture(scope="module")
def fields() -> set[str]:
    return {f.name for f in dataclasses.fields(transformers.TrainingArguments)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pre-tokenized rows of varied lengths (some longer than SEQ_LEN: truncated), ids < tiny-llama's vocab."""
    rng = random.Random(5)
    path = tmp_path_factory.mktemp("data") / "ids.jsonl"
    with path.open("w") as fh:
        for _ in range(60):
            n = rng.choice([rng.randint(3, 20), rng.randint(20, 60)])
            fh.write(json.dumps({"input_ids": [rng.randint(3, 250) for _ in range(n)]}) + "\n")
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama with the weights the probe builds (seed 42, from its config): no tokenizer files."""
    path = tmp_path_factory.mktemp("tiny-llama-weights")
    src = resolve_model("tiny-llama").path
    cfg = transformers.AutoConfig.from_pretrained(src, local_files_only=True)
    cfg.use_cache = False
    torch.manual_seed(42)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    model.save_pretrained(path)
    assert not any(p.name.startswith("tokenizer") for p in path.iterdir())
    return path


def _request(dataset: Path | None, cand: Candidate, **wl: object) -> ProbeRequest:
    resolved = resolve_model("tiny-llama")
    return ProbeRequest(
        Workload(model=resolved.name, model_path=resolved.path, seq_len=SEQ_LEN,
                 dataset=str(dataset) if dataset else None, **wl),  # type: ignore[arg-type]
        cand,
        ProbeSettings(device="cpu", warmup_steps=1, steps=3, timeout_s=300.0, budget_bytes=8 * 2**30),
    )  # fmt: skip


def _run_train_py(best_dir: Path, model_dir: Path, out: Path, *extra: str) -> list[dict[str, object]]:
    log = out / "batches.jsonl"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(best_dir / "train.py"), "--model", str(model_dir), "--output-dir", str(out / "run"),
         "--max-steps", "4", "--use-cpu", "--log-batches", str(log), *extra],
        capture_output=True, text=True, timeout=600, env=env, cwd=out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "cand",
    [
        Candidate(micro_batch=3, grad_accum=2, precision="fp32", attn="sdpa", packing=True),
        Candidate(micro_batch=3, grad_accum=2, precision="fp32", attn="eager", packing=False),
    ],
    ids=["packing-sdpa", "padding-eager"],
)
def test_probe_and_train_py_see_the_same_batches(
    tmp_path: Path, dataset: Path, model_dir: Path, fields: set[str], cand: Candidate
) -> None:
    res = probe(_request(dataset, cand))
    assert res.status == "ok", res.reason
    m = res.metrics
    eff = cand.micro_batch * cand.grad_accum
    # micro_batch counts sequences, packed or not: every step holds the effective batch
    assert m["step_sequences"] == [eff] * 3
    assert m["sequences_per_step_min"] == m["sequences_per_step_max"] == m["sequences_per_step_mean"] == eff
    assert m["tokens_per_step_mean"] == pytest.approx(m["real_tokens"] / 3)

    best_dir = tmp_path / "best"
    emit_all(res, best_dir, fields=fields)
    steps = _run_train_py(best_dir, model_dir, tmp_path)  # --dataset defaults to the probe's
    assert len(steps) == 4
    timed = steps[1:4]  # the probe's window: after 1 warm-up step
    assert [s["sequences"] for s in timed] == m["step_sequences"]
    assert [s["real_tokens"] for s in timed] == m["step_real_tokens"]
    assert sum(s["token_slots"] for s in timed) == m["token_slots"]  # the same padding, row for row
    assert all(s["sequences"] == eff for s in steps)
    # same weights, same batch contents: the first step's loss agrees (it precedes any update)
    assert steps[0]["loss"] == pytest.approx(m["losses"][0], rel=1e-4)


@pytest.mark.slow
def test_train_py_reproduces_the_probes_synthetic_data(tmp_path: Path, model_dir: Path, fields: set[str]) -> None:
    cand = Candidate(micro_batch=2, grad_accum=2, precision="fp32", attn="sdpa", packing=True)
    res = probe(_request(None, cand, lengths="uniform:4-40"))
    assert res.status == "ok", res.reason
    emit_all(res, tmp_path / "best", fields=fields)
    steps = _run_train_py(tmp_path / "best", model_dir, tmp_path, "--synthetic")
    assert [s["real_tokens"] for s in steps[1:4]] == res.metrics["step_real_tokens"]
    assert [s["sequences"] for s in steps] == [4] * 4
    assert steps[0]["loss"] == pytest.approx(res.metrics["losses"][0], rel=1e-4)


def test_train_py_needs_a_dataset_or_synthetic(tmp_path: Path, model_dir: Path, fields: set[str]) -> None:
    emit_all(_ok(_request(None, Candidate(packing=True))), tmp_path, fields=fields)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "train.py"), "--model", str(model_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "--dataset PATH is required" in proc.stderr


def _ok(req: ProbeRequest) -> ProbeResult:
    return ProbeResult(status="ok", request=req.to_dict(), metrics={"tokens_per_s": 1.0})


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_under_train_py_collator_equal_each_sequence_alone(tmp_path: Path, attn: str) -> None:
    """The collator train.py builds (collate.make_collator, as the emitted text shows) isolates sequences."""
    text = build_files(_ok(_request(None, Candidate(packing=True, attn=attn))), fields=set(
        f.name for f in dataclasses.fields(transformers.TrainingArguments)))["train.py"]  # fmt: skip
    assert "collate.make_collator(" in text and "PACKING = True" in text
    cfg = transformers.AutoConfig.from_pretrained(resolve_model("tiny-llama").path, local_files_only=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(3, int(cfg.vocab_size), (n,), generator=g) for n in (30, 9, 17, 4)]
    collator = collate.make_collator(packing=True, seq_len=SEQ_LEN, pad_token_id=collate.pad_token_id_of(cfg),
                                     attn=attn, mask_dtype=collate.packing_mask_dtype("fp32", "float32"))  # fmt: skip
    batch = collator([{"input_ids": s} for s in seqs])
    assert int(batch.pop(collate.SEQUENCES_KEY)) == 4
    batch.pop(collate.REAL_TOKENS_KEY)
    batch.pop("labels")
    # 30 + 17 = 47 share a row of 48; 9 + 4 the next: two rows, the second padded
    assert batch["input_ids"].shape == (2, 47)
    with torch.no_grad():
        packed = model(**batch).logits
        alone = [model(input_ids=s[None]).logits[0] for s in seqs]
    got = [packed[0, :30], packed[1, :9], packed[0, 30:47], packed[1, 9:13]]
    for x, y in zip(got, alone, strict=True):
        assert (x - y).abs().max().item() < 1e-4


def test_training_args_json_is_accepted_and_equals_the_probes_values(tmp_path: Path, fields: set[str]) -> None:
    for cand, mode in ((Candidate(micro_batch=2, grad_accum=4, grad_ckpt=True, packing=True), "full"),
                       (Candidate(micro_batch=4, workers=2, optim="adamw_torch"), "lora")):  # fmt: skip
        req = _request(None, cand, mode=mode)
        targs = json.loads(build_files(_ok(req), fields=fields)["training_args.json"])
        assert set(targs) <= fields  # only arguments of the installed transformers
        args = transformers.TrainingArguments(output_dir=str(tmp_path), **targs)
        probe = probe_kwargs(req, fields=fields, device="cpu")
        # every argument the probe ran with is emitted with the same value, except the run's own
        # schedule and bookkeeping (RUN_ONLY_KEYS: speed and memory do not depend on them)
        assert set(probe) - set(targs) <= RUN_ONLY_KEYS
        for key in set(probe) & set(targs) - RUN_ONLY_KEYS:
            assert targs[key] == probe[key], key
        assert targs["learning_rate"] == probe["learning_rate"]
        # the warm-up survives the 5.x spelling: warmup_ratio is gone, a float warmup_steps < 1 is a ratio
        if "warmup_ratio" not in fields:
            assert "warmup_ratio" not in targs and 0 < targs["warmup_steps"] < 1
            assert args.get_warmup_steps(1000) == round(1000 * targs["warmup_steps"])
        else:
            assert args.get_warmup_steps(1000) == round(1000 * targs["warmup_ratio"])


def test_summary_and_report_show_what_each_step_held() -> None:
    from autotune.report.markdown import render_report_md, step_counts_text
    from autotune.spec.baseline import hf_default_candidate
    from autotune.spec.summary import EffectiveBatch

    cand = Candidate(micro_batch=4, grad_accum=2, packing=True)
    m = {"tokens_per_s": 900.0, "peak_mem_bytes": 2**30, "sequences_per_step_mean": 8.0,
         "sequences_per_step_min": 8, "sequences_per_step_max": 8, "tokens_per_step_mean": 1234.5}  # fmt: skip
    eb = EffectiveBatch.of(cand, m).model_dump()
    assert eb["value"] == 8 and eb["sequences_per_step"] == {"mean": 8.0, "min": 8, "max": 8}
    assert eb["tokens_per_step"] == {"mean": 1234.5}
    assert EffectiveBatch.of(cand).sequences_per_step is None  # not recorded: said so, not invented

    def result(c: Candidate, **metrics: object) -> ProbeResult:
        req = ProbeRequest(workload=Workload(model="tiny-llama"), candidate=c)
        return ProbeResult(status="ok", request=req.to_dict(), metrics=metrics)

    best = result(cand, **m)
    base = result(hf_default_candidate(8), tokens_per_s=500.0, peak_mem_bytes=2**30, sequences_per_step_mean=8.0,
                  sequences_per_step_min=8, sequences_per_step_max=8, tokens_per_step_mean=1234.5)  # fmt: skip
    assert step_counts_text(best) == "8 sequences, 1,234 real tokens"
    assert step_counts_text(result(cand, sequences_per_step_mean=7.5, sequences_per_step_min=6,
                                   sequences_per_step_max=8)) == "7.5 sequences (6–8)"  # fmt: skip
    md = render_report_md({"run_id": "r", "budget_bytes": 2 * 2**30}, [best, base], baseline=base, best=best)
    row = next(line for line in md.splitlines() if line.startswith("| per optimizer step"))
    assert row.count("8 sequences, 1,234 real tokens") == 2


def test_distributed_merge_adds_the_ranks_per_step_counts() -> None:
    from autotune.probe.launch import merge_rank_results
    from autotune.probe.stats import per_step_counts

    def rank(seqs: list[int], toks: list[int]) -> ProbeResult:
        m = {"real_tokens": sum(toks), "token_slots": sum(toks), "window_s": 1.0, "tokens_per_s": float(sum(toks)),
             **per_step_counts(seqs, toks)}  # fmt: skip
        return ProbeResult(status="ok", request={}, metrics=m)

    m = merge_rank_results({}, [rank([4, 4], [100, 90]), rank([4, 4], [80, 120])], exit_codes=[0, 0]).metrics
    assert m["step_sequences"] == [8, 8] and m["step_real_tokens"] == [180, 210]
    assert (m["sequences_per_step_mean"], m["sequences_per_step_min"], m["sequences_per_step_max"]) == (8, 8, 8)
    assert m["tokens_per_step_mean"] == 195
    partial = merge_rank_results({}, [rank([4], [10]), None], exit_codes=[0, 1], first_failed=1).metrics
    assert "sequences_per_step_mean" not in partial  # half a step is not a step
