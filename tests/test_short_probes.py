"""Short probes: a probe's cost does not grow with the accumulation; the step at the true accumulation
is composed from a non-boundary micro-step and the boundary; the window stops once stable; the peak
memory measured this way is the peak at the true accumulation."""

from __future__ import annotations

import math
from typing import Any

import pytest
from _probes import probe

from autotune.probe import worker
from autotune.probe.compose import compose_window, jackknife_rel_error
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.probe_window import (
    MIN_TIMED_STEPS,
    NOISY_REL_ERROR,
    PROBE_GRAD_ACCUM,
    STABLE_REL_ERROR,
    composes,
    probe_window,
)

# --- the window's shape ------------------------------------------------------------------------


@pytest.mark.parametrize("accum", [3, 16, 64, 4096])
def test_a_probe_runs_the_same_micro_batches_whatever_the_accumulation(accum: int) -> None:
    s = ProbeSettings(warmup_steps=2, steps=5)
    w = probe_window(s, Candidate(grad_accum=accum))
    assert w.composed and w.grad_accum == PROBE_GRAD_ACCUM
    assert w.max_micro_batches == (2 + 5) * PROBE_GRAD_ACCUM
    assert w.min_timed_steps == MIN_TIMED_STEPS and w.adaptive


def test_whole_steps_where_composition_is_not_used_and_compile_warms_up_longer() -> None:
    s = ProbeSettings(warmup_steps=1, steps=4)
    small = probe_window(s, Candidate(grad_accum=2))
    assert not small.composed and small.grad_accum == 2 and small.adaptive  # nothing to compose
    compiled = probe_window(s, Candidate(grad_accum=16, torch_compile=True))
    assert not composes(Candidate(grad_accum=16, torch_compile=True))  # not trusted (see probe_window)
    assert compiled.grad_accum == 16 and compiled.warmup_steps >= 3
    whole = probe_window(ProbeSettings(warmup_steps=1, steps=4, window="whole"), Candidate(grad_accum=16))
    assert (whole.grad_accum, whole.composed, whole.adaptive, whole.min_timed_steps) == (16, False, False, 4)


def test_window_setting_is_validated() -> None:
    assert any("window" in p for p in ProbeSettings(window="short").problems())


# --- the composition rule ----------------------------------------------------------------------


def _simulated_steps(accum: int, n_steps: int, *, micro: float, fetch: float, extra: float,
                     jitter: float = 0.0) -> dict[str, Any]:
    """Steps of a model whose micro-step costs ``micro`` (+ ``fetch`` per micro-batch) and whose
    boundary adds ``extra`` (gradient sync + optimizer): what the Trainer's clock would see."""
    steps, fetches, micros = [], [], []
    for j in range(n_steps):
        f = fetch * accum
        m = [micro * (1 + jitter * math.sin(7 * j + i)) for i in range(accum)]
        m[-1] += 0.0  # the last micro-step's backward holds the all-reduce in DDP: part of ``extra``
        steps.append(f + sum(m) + extra)
        fetches.append(f)
        micros.append(m)
    return {"step_times": steps, "fetch_wait": fetches, "micro_times": micros,
            "tokens": [128 * accum] * n_steps, "sequences": [2 * accum] * n_steps, "slots": [128 * accum] * n_steps}


@pytest.mark.parametrize("true_accum", [3, 8, 32, 64, 4096])
def test_composed_step_equals_the_whole_step_of_the_same_cost_model(true_accum: int) -> None:
    probe = _simulated_steps(2, 4, micro=0.2, fetch=0.01, extra=0.15)
    comp = compose_window(**probe, probe_accum=2, true_accum=true_accum)
    whole = _simulated_steps(true_accum, 1, micro=0.2, fetch=0.01, extra=0.15)["step_times"][0]
    assert comp.step_times == pytest.approx([whole] * 4)
    assert comp.tokens == [128 * true_accum] * 4 and comp.sequences == [2 * true_accum] * 4
    assert comp.info["boundary_extra_s"] == pytest.approx(0.15)
    assert comp.info["micro_step"]["median_s"] == pytest.approx(0.21)
    assert comp.info["grad_accum"] == true_accum and comp.info["probe_grad_accum"] == 2
    assert comp.info["rel_std_error"] == pytest.approx(0.0, abs=1e-12)
    # the measured figure at the probe's accumulation is kept beside the composed one
    assert comp.info["measured_tokens_per_s"] == pytest.approx(256 / (2 * 0.21 + 0.15))


def test_composition_from_more_than_two_micro_batches() -> None:
    probe = _simulated_steps(4, 3, micro=0.1, fetch=0.0, extra=0.3)
    comp = compose_window(**probe, probe_accum=4, true_accum=16)
    assert comp.step_times == pytest.approx([16 * 0.1 + 0.3] * 3)


def test_composition_refuses_inconsistent_input() -> None:
    probe = _simulated_steps(2, 3, micro=0.1, fetch=0.0, extra=0.1)
    with pytest.raises(ValueError):
        compose_window(**probe, probe_accum=1, true_accum=8)
    bad = dict(probe, micro_times=[[0.1]] * 3)
    with pytest.raises(ValueError, match="micro-steps"):
        compose_window(**bad, probe_accum=2, true_accum=8)
    with pytest.raises(ValueError):
        compose_window(**dict(probe, tokens=[1]), probe_accum=2, true_accum=8)


def test_jackknife_error_is_zero_for_steady_steps_and_grows_with_noise() -> None:
    assert jackknife_rel_error([100] * 5, [1.0] * 5) == pytest.approx(0.0, abs=1e-12)
    assert jackknife_rel_error([100], [1.0]) is None
    small = jackknife_rel_error([100] * 5, [1.0, 1.01, 0.99, 1.0, 1.02])
    large = jackknife_rel_error([100] * 5, [1.0, 1.4, 0.7, 1.0, 1.3])
    assert small is not None and large is not None and 0 < small < STABLE_REL_ERROR < large
    # scale-free: the same relative noise at another speed is the same error
    assert jackknife_rel_error([1] * 5, [10.0, 14.0, 7.0, 10.0, 13.0]) == pytest.approx(large)


# --- the adaptive window (the meter the step-end callback asks) --------------------------------


def _meter(window: Any, accum: int) -> worker._Meter:
    m = worker._Meter(lambda: None, window=window, true_accum=accum)
    m.first_fetch_t = 0.0
    return m


def _feed(m: worker._Meter, step_s: float, micro_s: tuple[float, ...]) -> bool:
    t = m.step_end_t[-1] if m.step_end_t else 0.0
    m.step_end_t.append(t + step_s)
    m.fetch_wait.append(0.0)
    m.micro_times.append(list(micro_s))
    m.tokens.append(256)
    m.sequences.append(2)
    m.rows.append(2)
    m.slots.append(256)
    m.graphs.append(0)
    return m.should_stop()


def test_steady_steps_stop_the_window_at_its_minimum() -> None:
    win = probe_window(ProbeSettings(warmup_steps=1, steps=8), Candidate(grad_accum=32))
    m = _meter(win, 32)
    fed = 0
    while fed < 1 + 8:
        fed += 1
        if _feed(m, 0.5, (0.2, 0.3)):
            break  # the Trainer stops here
    assert fed == 1 + MIN_TIMED_STEPS  # warm-up + the minimum, then stable
    assert m.stopped_early_at == MIN_TIMED_STEPS


def test_noisy_steps_run_the_window_to_its_maximum_and_are_flagged() -> None:
    win = probe_window(ProbeSettings(warmup_steps=1, steps=6), Candidate(grad_accum=32))
    m = _meter(win, 32)
    micro = [0.1, 0.5, 0.15, 0.6, 0.1, 0.45, 0.2]
    stops = [_feed(m, mi + 0.3, (mi, 0.3)) for mi in micro]
    assert not any(stops) and m.stopped_early_at is None
    metrics: dict[str, Any] = {}
    worker._record_window(metrics, m, win, 0.0, 0.0, 0.0)
    assert metrics["composed"] and metrics["timed_steps"] == 6
    assert metrics["rel_std_error"] > NOISY_REL_ERROR and metrics["composition_noisy"]
    assert any("too noisy to combine" in w for w in metrics["warnings"])
    # whole steps as noisy: the figure stands (nothing to combine), and says it is noisy (it went out as a clean ok)
    whole = probe_window(ProbeSettings(warmup_steps=1, steps=6, window="whole"), Candidate(grad_accum=2))
    m = _meter(whole, 2)
    for mi in micro:
        _feed(m, mi + 0.3, (mi, 0.3))
    metrics = {}
    worker._record_window(metrics, m, whole, 0.0, 0.0, 0.0)
    assert not metrics["composed"] and "composition_noisy" not in metrics
    assert metrics["rel_std_error"] > NOISY_REL_ERROR and any("figure is noisy" in w for w in metrics["warnings"])


def test_a_whole_window_never_stops_early() -> None:
    win = probe_window(ProbeSettings(warmup_steps=0, steps=5, window="whole"), Candidate(grad_accum=4))
    m = _meter(win, 4)
    assert not any(_feed(m, 1.0, (0.25,) * 4) for _ in range(5))


def test_recorded_window_reports_the_composed_figure_and_its_components() -> None:
    win = probe_window(ProbeSettings(warmup_steps=1, steps=4), Candidate(grad_accum=16))
    m = _meter(win, 16)
    for _ in range(1 + 4):
        if _feed(m, 0.5, (0.2, 0.3)):
            break
    metrics: dict[str, Any] = {}
    worker._record_window(metrics, m, win, 0.0, 0.0, 0.0)
    step = 15 * 0.2 + 0.3
    assert metrics["composed"] and metrics["stopped_early"]
    assert metrics["timed_steps"] == MIN_TIMED_STEPS
    assert metrics["step_time_median_s"] == pytest.approx(step)
    assert metrics["tokens_per_s"] == pytest.approx(16 * 128 / step)
    assert metrics["sequences_per_step_mean"] == 16
    assert metrics["composition"]["measured_step_median_s"] == pytest.approx(0.5)
    assert metrics["probe_window_s"] == pytest.approx(0.5 * MIN_TIMED_STEPS)


def test_a_noisy_composition_is_never_confirmed() -> None:
    from autotune.search._confirm import ConfirmPolicy
    from autotune.search._searcher import _rank_entry
    from autotune.spec.trial import TrialRecord

    def rec(repeat: int, noisy: bool) -> TrialRecord:
        metrics = {"tokens_per_s": 1000.0, "composition_noisy": noisy}
        return TrialRecord(key="k", label="mb2", candidate={"micro_batch": 2}, status="ok", tokens_per_s=1000.0,
                           phase="confirm", repeat=repeat, result={"status": "ok", "metrics": metrics})

    policy = ConfirmPolicy.for_device("cpu")
    search = TrialRecord(key="k", label="mb2", candidate={"micro_batch": 2}, status="ok", tokens_per_s=1000.0)
    clean = _rank_entry(search, [rec(0, False), rec(1, False)], policy, 2)
    assert clean["status"] == "confirmed"
    noisy = _rank_entry(search, [rec(0, True), rec(1, True)], policy, 2)
    assert noisy["status"] == "noisy" and "too noisy" in noisy["reason"]


# --- real probes on CPU ------------------------------------------------------------------------


def _tiny(**overrides: Any) -> ProbeRequest:
    from autotune.models import resolve_model

    resolved = resolve_model("tiny-llama")
    wl = {"model": resolved.name, "model_path": resolved.path, "seq_len": 64}
    cand = {"micro_batch": 2, "precision": "fp32", "attn": "sdpa"}
    sett = {"device": "cpu", "warmup_steps": 1, "steps": 3, "timeout_s": 300.0}
    for key, value in overrides.items():
        for fields, target in ((Workload, wl), (Candidate, cand), (ProbeSettings, sett)):
            if key in fields.__dataclass_fields__:
                target[key] = value
                break
        else:
            raise KeyError(key)
    return ProbeRequest(Workload(**wl), Candidate(**cand), ProbeSettings(**sett))  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_huge_accumulation_does_not_make_a_probe_longer() -> None:
    r = probe(_tiny(grad_accum=4096))
    assert r.status == "ok", r.reason
    m = r.metrics
    assert m["composed"] and m["probe_micro_batches"] <= (1 + 3) * PROBE_GRAD_ACCUM
    assert r.request["candidate"]["grad_accum"] == 4096  # the result (and what is emitted) keeps it
    assert m["composition"]["grad_accum"] == 4096
    # tokens per composed optimizer step: 4096 micro-batches of 2 x 64 tokens
    assert m["tokens_per_step_mean"] == 4096 * 2 * 64
    assert m["step_time_median_s"] > 100 * m["composition"]["micro_step"]["median_s"]


def test_emitted_training_arguments_keep_the_true_accumulation() -> None:
    from transformers import TrainingArguments

    from autotune.formats.training_args import emitted_training_args

    req = _tiny(grad_accum=64)
    kw = emitted_training_args(req, fields=set(TrainingArguments.__dataclass_fields__), device="cpu")
    assert kw["gradient_accumulation_steps"] == 64


# memory: the peak at the probe's accumulation is the peak at the true one (gradients are held from
# the first micro-step of a step to the optimizer step whatever the accumulation); within the spread
# of repeated whole-step measurements (RSS on CPU moves by a few MB between identical runs)
# (two cases, three probes each: full fine-tuning on padded rows, and LoRA on packed rows of varying length,
# which covers both LoRA's adapter-only gradients and the packed path's varying rows in one probe set)
MEMORY_CASES = [
    pytest.param({}, id="full"),
    pytest.param({"mode": "lora", "packing": True, "lengths": "uniform:16-64"}, id="lora-packing"),
]


def _peak_pair(**kw: Any) -> tuple[int, int, int]:
    composed = probe(_tiny(grad_accum=8, **kw))
    whole = [probe(_tiny(grad_accum=8, window="whole", steps=2, **kw)) for _ in range(2)]
    for r in (composed, *whole):
        assert r.status == "ok", r.reason
    assert composed.metrics["composed"] and not whole[0].metrics["composed"]
    peaks = [int(r.metrics["peak_mem_bytes"]) for r in whole]
    return int(composed.metrics["peak_mem_bytes"]), min(peaks), max(peaks)


def _assert_same_peak(composed: int, lo: int, hi: int) -> None:
    slack = max(hi - lo, int(0.05 * hi), 8 * 2**20)
    assert lo - slack <= composed <= hi + slack, (composed, lo, hi)


@pytest.mark.slow
@pytest.mark.parametrize("kw", MEMORY_CASES)
def test_peak_memory_of_a_composed_probe_is_the_peak_at_the_true_accumulation(kw: dict[str, Any]) -> None:
    _assert_same_peak(*_peak_pair(**kw))


# DDP (the common case: every rank holds all gradients) and ZeRO-3 (parameters, gradients and optimizer states
# all partitioned, the composition hardest to get right); a ZeRO-2 probe (with optimizer offload) is run and
# merged by tests/test_distributed.py
DIST_CASES = [pytest.param(0, id="ddp"), pytest.param(3, id="zero3")]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two probes; the first DeepSpeed probe of a machine compiles its ops
@pytest.mark.xdist_group("two_rank")  # on the worker that ran them for test_distributed (tests/_two_rank.py)
@pytest.mark.parametrize("stage", DIST_CASES)
def test_distributed_peak_memory_and_collective_stop_on_two_gloo_ranks(stage: int) -> None:
    import importlib.util

    import _two_rank

    if stage and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("needs deepspeed (autotune[deepspeed])")
    composed = _two_rank.probe("adaptive", stage)
    whole = _two_rank.probe("whole", stage)
    assert composed.status == "ok", composed.reason
    assert whole.status == "ok", whole.reason
    m = composed.metrics
    assert m["composed"] and m["world_size"] == 2
    # both ranks ran the same number of steps (the early stop is collective), so the merge adds them
    assert all(rank["status"] == "ok" for rank in m["ranks"])
    c, w = int(m["peak_mem_bytes"]), int(whole.metrics["peak_mem_bytes"])
    # two ranks' RSS on one host moves more between identical runs than one process's: measured for
    # ZeRO-2 (2026-12-01, busy machine) composed 235, 237, 266 MB vs whole 243, 244 MB, the ranks of
    # one run 10-25 MB apart; a probe that skipped the gradients or Adam states would be 32+ MB lower.
    # Beside other tests (make test's first phase) a ZeRO-3 pair once came out 264 vs 306 MB, and 2 runs
    # alone passed: a pair that misses is taken again, and the test fails only if the second misses too
    if abs(c - w) > max(int(0.12 * w), 32 * 2**20):
        from autotune.executors.local import run_probe_process

        again = [run_probe_process(_two_rank.request(window=win, zero_stage=stage)) for win in ("adaptive", "whole")]
        assert all(r.status == "ok" for r in again), [r.reason for r in again]
        first, (c, w) = (c, w), (int(again[0].metrics["peak_mem_bytes"]), int(again[1].metrics["peak_mem_bytes"]))
        assert abs(c - w) <= max(int(0.12 * w), 32 * 2**20), (first, (c, w))


def test_a_graph_compiled_inside_the_window_flags_the_composition() -> None:
    # (compiled candidates time whole steps today; the flag guards a composed window that compiles)
    import dataclasses

    base = probe_window(ProbeSettings(warmup_steps=3, steps=3), Candidate(grad_accum=16))
    win = dataclasses.replace(base, warmup_steps=3)
    m = _meter(win, 16)
    for _ in range(3 + 3):
        _feed(m, 0.5, (0.2, 0.3))
    m.graphs = [2, 2, 2, 2, 3, 3]  # one graph compiled in the second timed step
    metrics: dict[str, Any] = {}
    worker._record_window(metrics, m, win, 0.0, 0.0, 0.0)
    assert metrics["recompiles_in_window"] == 1 and metrics["composition_noisy"]




def test_variable_length_micro_steps_are_priced_at_the_steps_mean_batch() -> None:
    # cost 1 ms per token slot; the non-boundary micro-batch of each step happens to be the short one
    slots = [[128, 384], [128, 384], [128, 384]]
    micro = [[s / 1000 for s in row] for row in slots]
    steps = [sum(m) + 0.05 for m in micro]
    probe = {"step_times": steps, "fetch_wait": [0.0] * 3, "micro_times": micro, "tokens": [400] * 3,
             "sequences": [8] * 3, "slots": [512] * 3}
    plain = compose_window(**probe, probe_accum=2, true_accum=16)
    priced = compose_window(**probe, probe_accum=2, true_accum=16, micro_slots=slots)
    # 15 micro-batches at the mean 256 slots + the boundary as it ran (its own 384-slot micro-step and
    # the extra 0.05 s: it holds the gradient sync, which does not scale with the batch, so it is not
    # re-priced; its batch is 1 of A)
    whole = 16 * 0.256 + 0.05
    assert priced.step_times == pytest.approx([15 * 0.256 + 0.384 + 0.05] * 3)
    assert abs(priced.step_times[0] / whole - 1) < 1 / 16
    assert priced.info["priced_at_mean_slots"] and not plain.info["priced_at_mean_slots"]
    assert plain.step_times[0] < 0.75 * whole  # what the short micro-step alone would have claimed


def test_variable_length_batches_without_packing_time_whole_steps() -> None:
    s = ProbeSettings(warmup_steps=1, steps=4)
    var = Workload(model="m", lengths="lognormal:4.0,0.8")
    data = Workload(model="m", dataset="chats.jsonl")
    assert not probe_window(s, Candidate(grad_accum=32), var).composed
    assert probe_window(s, Candidate(grad_accum=32), data).grad_accum == 32
    # packed, or fixed lengths: composed
    assert probe_window(s, Candidate(grad_accum=32, packing=True), var).composed
    assert probe_window(s, Candidate(grad_accum=32), Workload(model="m")).composed


def test_the_peak_counts_the_micro_batches_a_true_step_fetches_up_front() -> None:
    # a packed 4D mask of one micro-batch at seq 4096 in bf16 is 32 MiB a row: at A = 64 the Trainer
    # holds 64 of them (a whole step is fetched before its first forward), the probe only 2
    win = probe_window(ProbeSettings(warmup_steps=1, steps=3), Candidate(grad_accum=64))
    m = _meter(win, 64)
    m.max_batch_bytes = 64 * 2**20
    metrics: dict[str, Any] = {"peak_mem_bytes": 10 * 2**30, "memory_source": "x"}
    worker._add_prefetched_batches(metrics, m, win, 64)
    assert metrics["peak_mem_bytes"] == 10 * 2**30 + 62 * 64 * 2**20
    assert metrics["peak_mem_measured_bytes"] == 10 * 2**30 and "fetched micro-batches" in metrics["memory_source"]
    whole = probe_window(ProbeSettings(warmup_steps=1, steps=3, window="whole"), Candidate(grad_accum=64))
    untouched: dict[str, Any] = {"peak_mem_bytes": 5}
    worker._add_prefetched_batches(untouched, m, whole, 64)
    assert untouched == {"peak_mem_bytes": 5}
