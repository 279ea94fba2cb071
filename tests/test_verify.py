"""Quality guard (--verify-loss): the tuned config trains the same model as the HF default."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _fakes import FakeExecutor

import autotune.run
from autotune.run._tune import tune
from autotune.run._verify import (
    DEFAULT_TOLERANCE,
    IDENTICAL_KNOBS,
    compare_losses,
    expected_differences,
    reference_candidate,
    run_verify,
    verify_requests,
)
from autotune.spec.baseline import hf_default_candidate
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult


def test_compare_losses_reports_the_largest_step_difference() -> None:
    v = compare_losses([7.0, 6.5, 6.0], [7.0, 6.49, 6.1], tolerance=0.05)
    assert v["max_abs_diff"] == pytest.approx(0.1) and v["max_at_step"] == 3 and v["exceeds"]
    assert v["mean_abs_diff"] == pytest.approx(0.11 / 3) and v["final_abs_diff"] == pytest.approx(0.1)
    assert not compare_losses([1.0, 2.0], [1.0, 2.0 + 1e-7])["exceeds"]
    assert compare_losses([1.0, 2.0, 3.0], [1.0])["steps_compared"] == 1


def test_compare_losses_treats_missing_or_non_finite_losses_as_a_failure() -> None:
    assert compare_losses([], [1.0])["exceeds"] and compare_losses([], [1.0])["max_abs_diff"] is None
    assert compare_losses([float("nan")], [1.0])["problem"] == "a non-finite loss"
    with pytest.raises(ValueError, match="tolerance must be a finite number >= 0, got -1"):
        compare_losses([1.0], [1.0], tolerance=-1)


def test_expected_differences_name_the_knobs_and_what_they_do() -> None:
    ref = hf_default_candidate(8)
    diffs = expected_differences(dataclasses.replace(ref, micro_batch=2, grad_accum=4, packing=True), ref)
    assert [d["knob"] for d in diffs] == ["micro_batch", "grad_accum", "packing"]
    assert "identical math" in diffs[0]["expected"] and "the same sequences per step" in diffs[2]["expected"]
    assert {"micro_batch", "grad_accum", "grad_ckpt", "workers"} <= set(IDENTICAL_KNOBS)


def test_reference_is_the_hf_default_made_to_fit_with_checkpointing() -> None:
    assert reference_candidate(16) == hf_default_candidate(16)
    assert reference_candidate(16, needs_checkpointing=True) == dataclasses.replace(hf_default_candidate(16),
                                                                                    grad_ckpt=True)


def test_verify_requests_share_seed_data_and_window_without_warmup_or_ceiling() -> None:
    wl = Workload(model="m", seq_len=64, seed=7)
    st = ProbeSettings(device="cpu", budget_bytes=10**9, warmup_steps=2, steps=5)
    a, b = verify_requests(Candidate(micro_batch=2, grad_accum=4), hf_default_candidate(8), workload=wl,
                           settings=st, steps=12)
    assert a.workload == b.workload == wl and a.settings == b.settings
    assert (a.settings.warmup_steps, a.settings.steps, a.settings.budget_bytes) == (0, 12, None)
    with pytest.raises(ValueError, match="verify-loss steps must be an integer >= 1, got 0"):
        verify_requests(a.candidate, b.candidate, workload=wl, settings=st, steps=0)


class LossExecutor(FakeExecutor):
    """The fake landscape, plus a loss trajectory: bf16 changes it (here: a lot), everything else does not."""

    def result_for(self, request: ProbeRequest) -> ProbeResult:
        r = super().result_for(request)
        c = request.candidate
        r.metrics["losses"] = [7.0 - 0.1 * i + (0.05 * i if c.precision == "bf16" else 0.0) + 1e-7 * c.micro_batch
                               for i in range(request.settings.steps)]
        return r


def test_run_verify_runs_both_probes_and_flags_only_a_real_difference() -> None:
    ref = hf_default_candidate(8)
    wl, st = Workload(model="m", seq_len=64), ProbeSettings(device="cpu")
    ex = LossExecutor(slots=2)
    ok = run_verify(ex, chosen=dataclasses.replace(ref, micro_batch=2, grad_accum=4, grad_ckpt=True),
                    reference=ref, workload=wl, settings=st, steps=6)
    assert ok["verdict"].startswith("ok: max |dloss|") and not ok["exceeds"] and ok["expected_identical"]
    assert len(ok["chosen"]["losses"]) == 6 and ex.max_concurrent == 2
    flagged = run_verify(ex, chosen=dataclasses.replace(ref, precision="bf16"), reference=ref, workload=wl,
                         settings=st, steps=6)
    assert flagged["exceeds"] and flagged["max_abs_diff"] == pytest.approx(0.25)
    assert flagged["verdict"].startswith("FLAG") and "precision: small numerical difference" in flagged["verdict"]
    assert flagged["tolerance"] == DEFAULT_TOLERANCE


def test_tune_verify_loss_writes_the_file_and_the_summary_line(tmp_path: Path) -> None:
    ex = LossExecutor()
    result = tune("tiny-llama", gpu_budget="10GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu",
                  max_trials=6, out=tmp_path, executor=ex, verify_loss=5)
    v = json.loads((result.run_dir / "verify_loss.json").read_text())
    assert v["steps"] == 5 and v["chosen"]["candidate"] == dataclasses.asdict(result.candidate)
    assert v["reference"]["candidate"]["micro_batch"] == 8  # HF default at effective batch 16: 8 x 2
    line = result.summary["verify_loss"]
    assert line["steps"] == 5 and line["verdict"] == v["verdict"] and line["tolerance"] == DEFAULT_TOLERANCE
    verify_reqs = [r for r in ex.requests if r.settings.warmup_steps == 0 and r.settings.steps == 5]
    assert len(verify_reqs) == 2


def test_tune_rejects_negative_verify_steps(tmp_path: Path) -> None:
    from autotune.errors import SpecError

    with pytest.raises(SpecError, match="verify-loss steps must be an integer >= 0; got -2"):
        tune("tiny-llama", gpu_budget="10GiB", device="cpu", out=tmp_path, executor=FakeExecutor(), verify_loss=-2)


def test_a_loss_difference_the_levers_do_not_explain_makes_the_answer_doubtful() -> None:
    """--strict exits 5 on a doubtful answer: a FLAG where only identical-math levers differ (or a check that could not
    run) is one; a difference the levers explain (bf16 against fp32, packed against padded) is said, not doubted."""
    from typer.testing import CliRunner

    from autotune.cli.app import app
    from autotune.run import trust_verdict

    flag = {"exceeds": True, "expected_identical": True, "verdict": "FLAG: max |dloss| 1.5e-01 -- unexpected"}
    assert trust_verdict({"verify_loss": flag}) == {"doubtful": True, "reasons": [f"--verify-loss: {flag['verdict']}"]}
    assert trust_verdict({"verify_loss": {**flag, "expected_identical": False}})["doubtful"] is False
    assert trust_verdict({"verify_loss": {"exceeds": True, "verdict": "not verified: chosen: oom"}})["doubtful"]
    # --verify-loss-steps 0 skipped the check without a word
    res = CliRunner().invoke(app, ["run", "--model", "tiny-llama", "--gpu-budget", "4GB", "--verify-loss",
                                   "--verify-loss-steps", "0"])
    assert res.exit_code == 2 and "--verify-loss-steps must be at least 1" in res.output


# ------------------------------------------------------------------------------ real probes (CPU)


@pytest.mark.slow
def test_identical_math_gives_the_same_losses_on_real_cpu_probes() -> None:
    """Accumulation 1x8 with checkpointing vs the HF default 8x1 (fp32, same seed and data): accumulation and
    recompute in one pair of probes."""
    from _probes import Executor

    from autotune.models import resolve_model

    m = resolve_model("tiny-llama")
    wl = Workload(model=m.name, model_path=m.path, seq_len=64, lengths="lognormal:3.5,1.0")
    st = ProbeSettings(device="cpu", cpu_threads=1)
    ref = hf_default_candidate(8)
    with Executor(1) as ex:  # forked probes, as autotune run's on a CPU
        chosen = dataclasses.replace(ref, micro_batch=1, grad_accum=8, grad_ckpt=True)
        v = run_verify(ex, chosen=chosen, reference=ref, workload=wl, settings=st, steps=6)
        assert v["chosen"]["status"] == v["reference"]["status"] == "ok", v
        assert v["steps_compared"] == 6 and v["max_abs_diff"] < 1e-4, v["verdict"]


def test_cli_flags_reach_tune(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from autotune.cli.app import app
    from autotune.errors import SpecError

    seen: dict = {}

    def spy(request):
        seen.update(vars(request))
        raise SpecError("stop here")

    monkeypatch.setattr(autotune.run, "tune", spy)
    base = ["run", "--model", "m", "--gpu-budget", "24GB"]
    CliRunner().invoke(app, [*base, "--verify-loss"])
    assert seen["verify_loss"] == 20
    CliRunner().invoke(app, [*base, "--verify-loss", "--verify-loss-steps", "7"])
    assert seen["verify_loss"] == 7
    CliRunner().invoke(app, base)
    assert seen["verify_loss"] == 0
