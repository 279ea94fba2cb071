"""report.html: built from synthetic results, self-contained, and rendered in headless Chromium."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

from autotune.report._model import build_model, cost_rows, lever_rows
from autotune.report.diagnosis import render_diagnosis_md
from autotune.report.html import render_html
from autotune.spec.baseline import hf_default_candidate
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

GiB = 2**30
BUDGET = 24 * GiB
LLAMA = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
}
H100 = {"device": "NVIDIA H100 80GB HBM3", "device_type": "cuda"}
SUMMARY = {
    "run_id": "synthetic-run",
    "model": "llama-3.2-1b",
    "mode": "full",
    "seq_len": 1024,
    "effective_batch": 32,
    "gpu_budget": "24GB",
    "budget_bytes": BUDGET,
    "usable_bytes": int(BUDGET * 0.95),
    "device": "cuda",
    "wall_s": 321.0,
}


def res(
    c: Candidate, status: str = "ok", env: dict | None = None, reason: str = "", **metrics
) -> ProbeResult:
    req = ProbeRequest(
        workload=Workload(model="llama-3.2-1b", model_path="/nowhere", seq_len=1024),
        candidate=c,
        settings=ProbeSettings(budget_bytes=BUDGET),
    )
    m = {"budget_bytes": BUDGET, "usable_bytes": int(BUDGET * 0.95), **metrics}
    return ProbeResult(status=status, request=req.to_dict(), reason=reason, metrics=m, env=dict(env or H100))


def synthetic_results() -> list[ProbeResult]:
    out = []
    for prec in ("bf16", "fp32"):
        for ckpt in (False, True):
            for mb in (1, 2, 4, 8, 16):
                c = Candidate(micro_batch=mb, grad_accum=32 // mb, grad_ckpt=ckpt, precision=prec, workers=2)
                peak = int((3 + mb * (0.6 if ckpt else 1.6) * (0.6 if prec == "bf16" else 1.0)) * GiB)
                if mb == 16 and not ckpt:
                    out.append(res(c, "oom", reason="CUDA out of memory. Tried to allocate 4.00 GiB"))
                    continue
                if peak > BUDGET * 0.95:
                    out.append(
                        res(c, "over_budget", reason="peak above the usable budget", peak_mem_bytes=peak)
                    )
                    continue
                tps = 4000 * mb**0.4 * (0.75 if ckpt else 1.0) * (2.5 if prec == "bf16" else 1.0)
                samples = [95, 97, 96, 98] * 10 if mb >= 4 else [0, 100, 3, 99] * 10
                out.append(res(c, tokens_per_s=tps, peak_mem_bytes=peak, data_wait_fraction=0.01 if mb >= 4 else 0.2,
                               gpu_util_samples=samples, gpu_util_mean=sum(samples) / len(samples),
                               step_time_spread=0.05))  # fmt: skip
    out.append(res(Candidate(micro_batch=16, grad_accum=2, attn="eager", precision="fp32"), "over_budget",
                   reason="peak above the usable budget", peak_mem_bytes=int(27.5 * GiB)))  # fmt: skip
    out.append(res(Candidate(micro_batch=4, grad_accum=8, attn="flash_attention_2"), "unsupported",
                   reason="flash_attention_2 needs the flash-attn package"))  # fmt: skip
    return out


def baseline() -> ProbeResult:
    c = hf_default_candidate(32)
    return res(c, tokens_per_s=4000 * 8**0.4, peak_mem_bytes=int(15.8 * GiB), data_wait_fraction=0.15,
               gpu_util_samples=[0, 100] * 20, gpu_util_mean=50.0)  # fmt: skip


def build_page(**kw) -> str:
    results = synthetic_results()
    ok = [r for r in results if r.fits]
    best = max(ok, key=lambda r: r.tokens_per_s or 0)
    inferred = [
        ProbeResult(status="oom", request={**results[0].request, "candidate": {**results[0].request["candidate"],
                                           "micro_batch": 32, "grad_accum": 1}}, metrics={"inferred": True})
    ]  # fmt: skip
    return render_html(
        build_model(SUMMARY, results, baseline=baseline(), best=best, config=LLAMA, inferred=inferred, **kw)
    )


def test_html_has_every_section_and_is_self_contained():
    page = build_page()
    assert page.startswith("<!DOCTYPE html>")
    # no external scripts, styles or fonts: plotly.js is inlined
    assert not re.search(r"<script[^>]+src=", page, re.IGNORECASE)
    assert not re.search(r"<link[^>]+href=[\"']https?://", page, re.IGNORECASE)
    assert "cdn.plot.ly/plotly" not in re.sub(
        r"<script type=\"text/javascript\">.*?</script>", "", page, flags=re.S
    )
    assert len(page) > 1_000_000  # the plotly.js bundle is in the page
    for heading in ("Chosen configuration", "Best vs the HF default", "Tokens/s vs micro-batch",
                    "Peak memory vs the budget", "Feasible / infeasible", "Parameter importance",
                    "GPU-hours and cost per 1B tokens", "Which levers keep the training math identical",
                    "Every probe, with its diagnosis"):  # fmt: skip
        assert f"<h2>{heading}</h2>" in page, heading
    for div in ("fig-throughput", "fig-memory", "fig-feasibility", "fig-importance"):
        assert f'id="{div}"' in page
    assert "Method: share of the variance of log(tok/s)" in page
    assert "H100-SXM at $2.99 per GPU-hour" in page
    assert "changes numerics" in page and "identical math" in page
    assert "data loading / CPU preprocessing" in page  # small micro-batches starve
    assert "MFU = (6N + 12·L·H·Q·T)" in page
    assert re.search(r"<td>MFU</td><td>\d+\.\d%</td>", page)  # the chosen config's MFU is shown


def test_model_numbers_cost_importance_levers():
    results = synthetic_results()
    best = max((r for r in results if r.fits), key=lambda r: r.tokens_per_s or 0)
    model = build_model(SUMMARY, results, baseline=baseline(), best=best, config=LLAMA)
    assert model.gpu is not None and model.gpu.name == "H100-SXM"
    assert model.best_mfu is not None and 0 < model.best_mfu < 1
    assert all(m is None for r, m in zip(model.results, model.mfus, strict=True) if not r.fits)
    rows, note = cost_rows(model)
    top = rows[0]
    assert top.hours_per_1b == pytest.approx(1e9 / best.tokens_per_s / 3600)
    assert top.cost_per_1b == pytest.approx(top.hours_per_1b * 2.99)
    assert len({r.label for r in rows}) == len(rows)  # the chosen probe is not listed twice
    # precision drives the synthetic landscape most
    assert list(model.importance.values)[0] in ("precision", "micro_batch")
    assert "grad_accum" not in model.importance.values
    levers = {row[0]: row for row in lever_rows(best.probe_request().candidate, hf_default_candidate(32))}
    assert levers["precision"][3] is False and levers["data-loader workers"][3] is True
    md = render_diagnosis_md(model)
    assert "## Diagnosis" in md and "### Per probe" in md and "$" in md


def test_unknown_gpu_and_cpu_say_no_price_and_no_mfu():
    mystery = {"device": "NVIDIA Mystery 9000", "device_type": "cuda"}
    r = res(Candidate(micro_batch=4, grad_accum=8), env=mystery, tokens_per_s=1000.0, peak_mem_bytes=8 * GiB)
    model = build_model(SUMMARY, [r], config=LLAMA)
    assert model.gpu is None and model.mfus == [None]
    rows, note = cost_rows(model)
    assert rows[0].cost_per_1b is None and "no price" in note and "Mystery 9000" in note
    assert any("not in the catalog" in n for n in model.notes)
    page = render_html(model)
    assert "no price" in page
    cpu = res(Candidate(micro_batch=4, grad_accum=8, precision="fp32"), env={"device": "cpu: x", "device_type": "cpu"},
              tokens_per_s=700.0, peak_mem_bytes=GiB, cpu_util_mean=0.9)  # fmt: skip
    cm = build_model({**SUMMARY, "device": "cpu"}, [cpu], config=LLAMA)
    assert cm.cpu and cm.mfus == [None] and cm.notes == []
    rows, note = cost_rows(cm)
    assert rows[0].cost_per_1b is None and note.startswith("CPU run")
    assert "Machine-hours and cost per 1B tokens" in render_html(cm)


def test_nothing_fits_page():
    results = [r for r in synthetic_results() if not r.fits]
    page = render_html(build_model(SUMMARY, results, config=LLAMA))
    assert "No configuration fits the budget." in page and "no configuration fits" in page


# ------------------------------------------------------------------------------- chromium


def _png_info(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct values in the decompressed scanlines) of a PNG, without Pillow."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    return width, height, len(set(raw[:: max(1, len(raw) // 200_000)]))


def _distinct_colours(path: Path) -> int | None:
    try:
        from PIL import Image
    except ImportError:
        return None
    with Image.open(path) as im:
        return len(im.convert("RGB").getcolors(maxcolors=1 << 20) or [])


def _chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe is not None
    profile = tempfile.mkdtemp(prefix="autotune-chromium-")
    try:
        return subprocess.run(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={profile}", "--virtual-time-budget=10000", *args],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
    reason="headless Chromium is not installed (Debian: apt-get install -y chromium)",
)
def test_renders_in_headless_chromium(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(build_page(), encoding="utf-8")
    url = page.resolve().as_uri()

    # the plots were drawn: plotly turned each figure div into SVG (scripts ran, nothing fetched)
    dom = _chromium("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for div in ("fig-throughput", "fig-memory", "fig-feasibility", "fig-importance"):
        m = re.search(rf'<div id="{div}"[^>]*class="[^"]*js-plotly-plot', dom.stdout)
        assert m, f"{div} was not rendered by plotly"
    assert dom.stdout.count('class="main-svg"') >= 4

    shot = tmp_path / "report.png"
    run = _chromium(f"--screenshot={shot}", "--window-size=1280,2000", url)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    width, height, distinct = _png_info(shot)
    assert (width, height) == (1280, 2000)
    assert shot.stat().st_size > 60_000, "screenshot suspiciously small: a blank page?"
    assert distinct > 50
    colours = _distinct_colours(shot)
    if colours is not None:
        assert colours > 200
    keep = Path(tempfile.gettempdir()) / "autotune-report-screenshot.png"
    shutil.copyfile(shot, keep)  # left for a person to look at
