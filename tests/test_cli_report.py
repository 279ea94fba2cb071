"""``autotune report RUN_DIR``: rebuilds report.md and report.html from a run directory."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.spec.baseline import hf_default_candidate
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

runner = CliRunner()
GiB = 2**30
BUDGET = 24 * GiB


def run(*args: str):  # noqa: ANN201
    return runner.invoke(app, ["report", *args])


def _probe(c: Candidate, status: str, model_dir: Path, device: str, **metrics) -> ProbeResult:
    req = ProbeRequest(
        workload=Workload(model="tiny-llama", model_path=str(model_dir), seq_len=512),
        candidate=c,
        settings=ProbeSettings(budget_bytes=BUDGET),
    )
    return ProbeResult(status=status, request=req.to_dict(), reason="" if status == "ok" else "CUDA out of memory",
                       metrics={"budget_bytes": BUDGET, "usable_bytes": int(BUDGET * 0.95), **metrics},
                       env={"device": device, "device_type": "cuda"})  # fmt: skip


def _record(r: ProbeResult, phase: str = "search", inferred: bool = False) -> dict:
    c = r.request["candidate"]
    return {"key": json.dumps(c, sort_keys=True)[:12], "status": r.status, "candidate": c, "params": {},
            "reason": r.reason, "inferred": inferred, "phase": phase, "repeat": 0,
            "result": None if inferred else r.to_dict(), "tokens_per_s": r.tokens_per_s,
            "peak_mem_bytes": r.peak_mem_bytes, "step_time_spread": None, "wall_s": 3.0, "number": 0, "label": ""}  # fmt: skip


def make_run_dir(tmp_path: Path, *, device: str = "NVIDIA A10G", with_summary: bool = True) -> Path:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
        "num_attention_heads": 4, "vocab_size": 2048}))  # fmt: skip
    rd = tmp_path / "results" / "tiny-llama-20261130-000000-abcdef12"
    rd.mkdir(parents=True)
    probes = []
    for mb in (1, 2, 4, 8):
        c = Candidate(micro_batch=mb, grad_accum=16 // mb, precision="bf16")
        probes.append(_probe(c, "ok", model_dir, device, tokens_per_s=1000.0 * mb**0.5,
                             peak_mem_bytes=(2 + mb) * GiB, data_wait_fraction=0.02, gpu_util_mean=93.0))  # fmt: skip
    probes.append(_probe(Candidate(micro_batch=16, grad_accum=1, precision="bf16"), "oom", model_dir, device))
    base = _probe(hf_default_candidate(16), "ok", model_dir, device, tokens_per_s=900.0, peak_mem_bytes=12 * GiB,
                  data_wait_fraction=0.3, gpu_util_samples=[0, 100] * 30)  # fmt: skip
    lines = [_record(p) for p in probes] + [_record(base, phase="baseline")]
    inferred = _probe(Candidate(micro_batch=16, grad_accum=1, precision="bf16", grad_ckpt=True), "oom", model_dir,
                      device)  # fmt: skip
    lines.append(_record(inferred, inferred=True))
    text = "\n".join(json.dumps(x) for x in lines) + "\n" + '{"key": "cut-sh'  # a line cut short by a kill
    (rd / "journal.jsonl").write_text(text)
    best = probes[3]
    (rd / "best_result.json").write_text(json.dumps(best.to_dict()))
    if with_summary:
        summary = {"run_id": rd.name, "status": "complete", "model": "tiny-llama", "mode": "full", "seq_len": 512,
                   "effective_batch": 16, "device": "cuda", "gpu_budget": "24GiB", "budget_bytes": BUDGET,
                   "usable_bytes": int(BUDGET * 0.95),
                   "best": {"candidate": dataclasses.asdict(best.probe_request().candidate)},
                   "baseline": {"label": "hf", "status": "ok"}}  # fmt: skip
        (rd / "summary.json").write_text(json.dumps(summary))
    return rd


def test_rebuilds_both_reports_and_prints_their_paths(tmp_path: Path) -> None:
    rd = make_run_dir(tmp_path)
    (rd / "report.md").write_text("stale")
    r = run(str(rd))
    assert r.exit_code == 0, r.output
    assert r.output.split() == [str(rd / "report.md"), str(rd / "report.html")]
    md = (rd / "report.md").read_text()
    assert md.startswith("# autotune report: tiny-llama-20261130-000000-abcdef12")
    assert "## Top configurations" in md and "## Best vs the HF default" in md  # render_report_md's part
    assert "## Diagnosis" in md and "### Per probe" in md
    assert "data loading" in md  # the HF default waits for data
    assert re.search(r"\| \d+\.\d+% \|", md)  # MFU from config.json + the A10G in the catalog
    assert "$" in md  # A10G has a price
    page = (rd / "report.html").read_text()
    assert not re.search(r"<script[^>]+src=", page)
    assert "oom (inferred)" in page  # inferred infeasibility on the map
    assert not [p for p in rd.iterdir() if p.name.endswith(".tmp")]  # atomic writes leave nothing behind


def test_gpu_override_for_a_device_missing_from_the_catalog(tmp_path: Path) -> None:
    rd = make_run_dir(tmp_path, device="NVIDIA Mystery 9000")
    assert run(str(rd)).exit_code == 0
    md = (rd / "report.md").read_text()
    assert "no price" in md and "not in the catalog" in md
    r = run(str(rd), "--gpu", "L4")
    assert r.exit_code == 0, r.output
    md = (rd / "report.md").read_text()
    assert "not in the catalog" not in md and "$" in md
    bad = run(str(rd), "--gpu", "Mystery")
    assert bad.exit_code == 2 and "unknown GPU 'Mystery'" in bad.output


def test_journal_only_run_is_reported_with_a_note(tmp_path: Path) -> None:
    rd = make_run_dir(tmp_path, with_summary=False)
    r = run(str(rd))
    assert r.exit_code == 0, r.output
    assert "summary.json is missing" in (rd / "report.md").read_text()
    # stopped before its baseline phase, but the search measured the HF default's configuration: that is the figure
    journal = rd / "journal.jsonl"
    kept = [ln for ln in journal.read_text().splitlines() if '"phase": "baseline"' not in ln]
    base = _probe(hf_default_candidate(16, precision="bf16"), "ok", tmp_path / "model", "NVIDIA A10G",
                  tokens_per_s=900.0, peak_mem_bytes=12 * GiB)
    journal.write_text("\n".join([*kept, json.dumps(_record(base))]) + "\n")
    assert run(str(rd)).exit_code == 0
    md = (rd / "report.md").read_text()
    assert "The HF default was not measured" not in md and "900" in md.split("## Best vs the HF default")[1]


def test_bad_run_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for target, words in ((tmp_path / "nope", "does not exist"), (tmp_path, "not an autotune run directory")):
        r = run(str(target))
        assert r.exit_code == 2
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("autotune: error:") and words in lines[0], r.output
    (tmp_path / "summary.json").write_text("{not json")
    r = run(str(tmp_path))
    assert r.exit_code == 2 and "cannot read" in r.output
    # a journal with no probe it can read, and no summary: not "nothing fits" with exit 0
    for i, content in enumerate(('{"garbage": 1}\n', "{not json\n")):
        d = tmp_path / f"j{i}"
        d.mkdir()
        (d / "journal.jsonl").write_text(content)
        r = run(str(d))
        assert r.exit_code == 2 and "holds no probe this version can read" in r.output, r.output


def test_report_from_a_run_written_by_tune(tmp_path: Path) -> None:
    """A run directory as ``autotune run`` writes it (probes from the fake executor, no torch)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _fakes import FakeExecutor

    from autotune.run._tune import tune

    res = tune("tiny-llama", gpu_budget="6GB", seq_len=512, effective_batch=16, device="cpu", space="cpu",
               executor=FakeExecutor(), out=str(tmp_path / "results"), max_trials=8, top_k=1)  # fmt: skip
    r = run(str(res.run_dir))
    assert r.exit_code == 0, r.output
    md = (res.run_dir / "report.md").read_text()
    page = (res.run_dir / "report.html").read_text()
    assert "## Diagnosis" in md and "Machine-hours and cost per 1B tokens" in page
    assert "<h2>Best vs the HF default</h2>" in page
