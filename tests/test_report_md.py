"""report.md rendering (pure)."""

from __future__ import annotations

import dataclasses

from autotune.report.markdown import HF_DEFAULT_DESCRIPTION, render_report_md
from autotune.search import ConfirmPolicy
from autotune.spec.baseline import hf_default_candidate
from autotune.spec.probe_request import Candidate, ProbeRequest, Workload
from autotune.spec.result import ProbeResult

GiB = 2**30
SUMMARY = {
    "run_id": "r1",
    "model": "tiny-llama",
    "mode": "lora",
    "seq_len": 512,
    "budget_bytes": 24 * GiB,
    "gpu_budget": "24GiB",
    "wall_s": 93.2,
}


def res(
    cand: Candidate, status: str = "ok", tok: float | None = 1000.0, peak: int | None = 10 * GiB, **metrics
):
    req = ProbeRequest(workload=Workload(model="tiny-llama", mode="lora"), candidate=cand)
    m = {"tokens_per_s": tok, "peak_mem_bytes": peak, "step_time_spread": 0.1, **metrics}
    return ProbeResult(
        status=status,
        request=req.to_dict(),
        reason="" if status == "ok" else "CUDA out of memory",
        metrics={k: v for k, v in m.items() if v is not None},
    )


def test_top_configs_baseline_and_counts():
    best = res(Candidate(micro_batch=4, grad_accum=8, grad_ckpt=True, precision="bf16"), tok=3000.0)
    second = res(Candidate(micro_batch=2, grad_accum=16, precision="bf16", zero_stage=2), tok=2000.0)
    oom = res(Candidate(micro_batch=16, grad_accum=2), status="oom", tok=None, peak=None)
    inferred = res(Candidate(micro_batch=32, grad_accum=1), status="oom", tok=None, peak=None, inferred=True)
    over = res(Candidate(micro_batch=8, grad_accum=4), status="over_budget", tok=None, peak=30 * GiB)
    baseline = res(hf_default_candidate(32), tok=1000.0, peak=20 * GiB)
    md = render_report_md(SUMMARY, [second, oom, best, over, inferred, baseline], baseline=baseline)

    assert md.startswith("# autotune report: r1")
    top = md.split("## Top configurations")[1].split("##")[0]
    rows = [line for line in top.splitlines() if line.startswith("| 1") or line.startswith("| 2")]
    assert "3,000 ± 5%" in rows[0] and "4 × 8 × 1 = 32" in rows[0] and "ckpt" in rows[0]
    assert "10.00 GiB / 24.00 GiB (42%)" in rows[0]
    assert "ZeRO-2" in rows[1]
    vs = md.split("## Best vs the HF default")[1].split("## Probes")[0]
    assert HF_DEFAULT_DESCRIPTION in vs
    assert "3.00× the HF default's throughput (single measurements" in vs and "8 × 4 × 1 = 32" in vs
    counts = md.split("## Probes by status")[1]
    assert "| oom | 2 |" in counts and "| over_budget | 1 |" in counts and "| ok | 3 |" in counts
    assert "| total | 6 | 1 inferred without running |" in counts


def test_every_table_shows_one_figure_per_configuration_the_re_measured_one_first():
    import dataclasses

    from autotune.report._model import build_model
    from autotune.report.diagnosis import render_diagnosis_md
    from autotune.spec.summary import RankingEntry

    # the search figure of `noise` was the highest (1,429), but its re-measured median is 5,423; `fast`
    # was never re-measured: its search figure is shown as one, after the re-measured configurations
    winner = res(Candidate(micro_batch=4, grad_accum=8, packing=True), tok=1429.0)
    second = res(Candidate(micro_batch=2, grad_accum=16), tok=1300.0)
    fast = res(Candidate(micro_batch=8, grad_accum=4), tok=6000.0)
    # as summary.json holds them (RankingEntry: the candidate, no key of its own)
    top = [{"candidate": dataclasses.asdict(candidate_of_res(r)), "label": "x", "status": "confirmed",
            "median_tokens_per_s": med, "measurements": [med - 10, med, med + 10]}
           for r, med in ((winner, 5423.0), (second, 5000.0))]
    assert all(set(e) <= set(RankingEntry.model_fields) for e in top)
    summary = {**SUMMARY, "top": top, "best": {"tokens_per_s": 5423.0}}
    md = render_report_md(summary, [fast, second, winner], best=winner, baseline=None)
    rows = [ln for ln in md.split("## Top configurations")[1].split("##")[0].splitlines() if ln[:3] in ("| 1", "| 2", "| 3")]
    assert "5,423" in rows[0] and "confirmed: median of 3 re-measurements" in rows[0] and "1,429" not in md.split("## Best")[0]
    assert "5,000" in rows[1] and "6,000" in rows[2] and "search probe" in rows[2]
    model = build_model(summary, [fast, second, winner], best=winner)
    cost = render_diagnosis_md(model).split("### Cost per 1B tokens")[1].split("###")[0]
    assert "5,423" in cost and "1,429" not in cost and "search probe" in cost


def candidate_of_res(r: ProbeResult) -> Candidate:
    return r.probe_request().candidate


def test_baseline_that_does_not_fit_and_missing_baseline():
    best = res(Candidate(micro_batch=2, grad_accum=16, grad_ckpt=True))
    base = res(hf_default_candidate(32), status="oom", tok=None, peak=None)
    md = render_report_md(SUMMARY, [best, base], baseline=base)
    assert "does not run within the budget (oom)" in md
    md = render_report_md({}, [best], baseline=None)
    assert "was not measured" in md and md.startswith("# autotune report: run")


def test_a_baseline_that_crashed_or_timed_out_is_not_called_a_budget_failure():
    import dataclasses

    from autotune.diagnose import diagnose

    best = res(Candidate(micro_batch=4, grad_accum=8), tok=2000.0)
    killed = dataclasses.replace(
        res(hf_default_candidate(32), status="crash", tok=None, peak=None, exit_code=-9),
        reason="probe process killed by SIGKILL without a result (SIGKILL: possibly the kernel's out-of-memory killer)")
    md = render_report_md(SUMMARY, [best, killed], baseline=killed)
    assert "within the budget" not in md and "not a budget failure" in md and "SIGKILL" in md
    # a killed process leaves no traceback: the advice says where to look instead of --debug
    finding = next(f for f in diagnose(killed).findings if f.key == "crash")
    assert "--debug" not in finding.fix and "no traceback" in finding.fix
    raised = dataclasses.replace(killed, metrics={}, reason="RuntimeError: bad kernel")
    assert "--debug" in next(f for f in diagnose(raised).findings if f.key == "crash").fix
    late = dataclasses.replace(killed, status="timeout", metrics={}, reason="past the 300 s deadline")
    md = render_report_md(SUMMARY, [best, late], baseline=late)
    assert "within the budget" not in md and "deadline (timeout)" in md


def test_nothing_fits():
    md = render_report_md(SUMMARY, [res(Candidate(), status="oom", tok=None, peak=None)], baseline=None)
    assert "No configuration fits the budget." in md
    assert "| oom | 1 |" in md


def test_confirmed_speedup_with_its_range_ties_and_load_warnings():
    best = res(Candidate(micro_batch=4, grad_accum=8, precision="bf16"), tok=3000.0)
    baseline = res(hf_default_candidate(32), tok=1000.0, peak=20 * GiB)
    summary = {
        **SUMMARY, "speedup_vs_baseline": 2.9, "speedup_range": [2.5, 3.3], "speedup_distinguishable": True,
        "search": {"confirm": {"min_rounds": 2, "max_rounds": 4, "tolerance": 0.25}},
        "top": [{"label": "mb4x8 bf16", "status": "confirmed", "median_tokens_per_s": 2900.0, "range": [2800, 3000],
                 "measurements": [2800.0, 3000.0], "search_tokens_per_s": 3400.0, "indistinguishable": True}],
        "tie": ["mb8x4 bf16"],
        "warnings": [{"kind": "cpu", "message": "other processes used 1.2 of 2 CPU cores during the probe",
                      "label": "mb4x8 bf16"}],
        "trust": {"doubtful": True, "reasons": ["1 load warning(s) (cpu)"]},
    }
    md = render_report_md(summary, [best, baseline], best=best, baseline=baseline)
    vs = md.split("## Best vs the HF default")[1].split("## Confirmation")[0]
    assert "**2.90×**" in vs and "2.50–3.30×" in vs
    conf = md.split("## Confirmation")[1].split("## Probes")[0]
    assert "2 to 4" in conf and "25%" in conf and "confirmed (tie)" in conf and "2,800, 3,000" in conf
    assert "3,400" in conf  # the search value is shown, apart from the figure
    assert "mb8x4 bf16" in conf and "other processes used 1.2 of 2 CPU cores" in conf
    assert "Doubtful answer" in conf and "--strict" in conf
    assert "single re-measurement" not in conf  # the CPU policy: two re-measurements at least
    summary["search"]["confirm"] = ConfirmPolicy.for_device("cuda").to_dict()
    conf = render_report_md(summary, [best, baseline], best=best, baseline=baseline).split("## Confirmation")[1]
    assert "1 to 4" in conf and "10%" in conf and "single re-measurement confirms" in conf and "at least the leader's" in conf


def test_both_columns_hold_the_same_kind_of_figure_and_one_peak_per_configuration():
    """A noisy winner's median was called "confirmed" beside the noisy baseline's search figure (4,217 beside
    5,025 above "11.13x"), and one configuration showed three peaks (summary.json's highest, the re-measurement
    closest to the median, the search probe)."""
    best = res(Candidate(micro_batch=8, grad_accum=1, attn="eager"), tok=4100.0, peak=169 * 2**20)
    baseline = res(hf_default_candidate(8), tok=5025.0, peak=159 * 2**20)
    summary = {**SUMMARY, "budget_bytes": None,
               "best": {"tokens_per_s": 4216.8, "confirm_status": "noisy", "search_tokens_per_s": 5204.0,
                        "peak_mem_bytes": 174 * 2**20},
               "baseline": {"tokens_per_s": 379.0, "confirm_status": "noisy", "confirmed": False,
                            "peak_mem_bytes": 162 * 2**20},
               "speedup_vs_baseline": None,
               "speedup_note": "the winner and the HF default were never re-measured alike",
               "top": [{"candidate": dataclasses.asdict(candidate_of_res(best)), "label": "x", "status": "noisy",
                        "median_tokens_per_s": 4216.8, "measurements": [4216.8], "peak_mem_bytes": 174 * 2**20}]}
    md = render_report_md(summary, [best, baseline], best=best, baseline=baseline)
    vs = md.split("## Best vs the HF default")[1].split("## Probes")[0]
    tok = next(ln for ln in vs.splitlines() if ln.startswith("| tok/s"))
    assert "4,217 (median of re-measurements that disagree)" in tok and "379 (median of re-measurements that" in tok
    assert "confirmed median" not in vs and "5,025" not in vs and "11." not in vs
    assert "No speed-up: the winner and the HF default were never re-measured alike" in vs
    mem = next(ln for ln in vs.splitlines() if ln.startswith("| peak memory"))
    assert "174.00 MiB" in mem and "162.00 MiB" in mem
    top = md.split("## Top configurations")[1].split("##")[0]
    assert "174.00 MiB" in top and "169.00 MiB" not in md
    # the baseline not re-measured: both sides are single search measurements, the ratio indicative
    summary["baseline"] = {"tokens_per_s": 5025.0, "confirmed": False}
    vs = render_report_md(summary, [best, baseline], best=best, baseline=baseline).split("## Best vs")[1]
    assert "5,204 (search measurement)" in vs and "1.04× the HF default's throughput (single measurements" in vs


def test_the_re_measured_rows_keep_the_confirmations_order_the_chosen_first():
    """A tie went to a configuration with the lower median: the console and summary.json put it first, report.md had
    put the HF default first (by median)."""
    chosen = res(Candidate(micro_batch=8, grad_accum=1, pin_memory=False), tok=5900.0)
    default = res(hf_default_candidate(8), tok=6000.0)
    top = [{"candidate": dataclasses.asdict(candidate_of_res(r)), "label": "x", "status": "confirmed",
            "median_tokens_per_s": med, "measurements": [med]} for r, med in ((chosen, 5997.0), (default, 6084.0))]
    md = render_report_md({**SUMMARY, "top": top}, [default, chosen], best=chosen, baseline=default)
    rows = [ln for ln in md.split("## Top configurations")[1].split("##")[0].splitlines() if ln[:3] in ("| 1", "| 2")]
    assert "5,997" in rows[0] and "6,084" in rows[1]
