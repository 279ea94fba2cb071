"""The run: one ``autotune run`` from its request to its answer, in stages.

    request  -> read_request: the arguments validated once (TuneArgs -> Request)
    pre-flight -> _preflight: the model, budget, dataset and Ray checked before anything is written
    forecast -> _forecast: the time to answer and --time-budget (one probe's time: autotune.estimate)
    search   -> plan_search / start_run / run_search: the Optuna search over the probes
    confirm + verify -> summarize / _verify: the top-k re-measured, the winner's losses compared
    outputs  -> write_answer: summary.json, best/, the report

``tune()`` runs them all; the CLI's ``autotune run`` is a thin caller.
"""

from __future__ import annotations

from autotune.run._forecast import (
    MAX_UNBUDGETED_S,
    PREDICTED,
    check_time_budget,
    forecast,
    forecast_line,
    parse_probe_timeout,
)
from autotune.run._preflight import (
    AUTO_CPU_PROBE_LIMIT_S,
    RAY_CONNECT_TIMEOUT_S,
    check_batch,
    check_cpu_probe_time,
    check_dataset,
    check_model_config,
    check_ray,
    check_weights,
    default_space_for,
    detect_capabilities,
    mean_sequence_tokens,
    preflight,
    weights_floor,
)
from autotune.run._tune import (
    API_ONLY,
    EstimatePruner,
    Request,
    RunStart,
    Searched,
    SearchPlan,
    TuneArgs,
    TuneResult,
    answer_from_cache,
    nothing_fits_message,
    plan_search,
    predict_run,
    read_request,
    run_search,
    start_run,
    summarize,
    tune,
    write_answer,
)
from autotune.run._verify import (
    DEFAULT_STEPS,
    DEFAULT_TOLERANCE,
    IDENTICAL_KNOBS,
    compare_losses,
    expected_differences,
    reference_candidate,
    run_verify,
    verify_requests,
)

__all__ = [
    "API_ONLY",
    "AUTO_CPU_PROBE_LIMIT_S",
    "DEFAULT_STEPS",
    "DEFAULT_TOLERANCE",
    "IDENTICAL_KNOBS",
    "MAX_UNBUDGETED_S",
    "PREDICTED",
    "RAY_CONNECT_TIMEOUT_S",
    "EstimatePruner",
    "Request",
    "RunStart",
    "SearchPlan",
    "Searched",
    "TuneArgs",
    "TuneResult",
    "answer_from_cache",
    "check_batch",
    "check_cpu_probe_time",
    "check_dataset",
    "check_model_config",
    "check_ray",
    "check_time_budget",
    "check_weights",
    "compare_losses",
    "default_space_for",
    "detect_capabilities",
    "expected_differences",
    "forecast",
    "forecast_line",
    "mean_sequence_tokens",
    "nothing_fits_message",
    "parse_probe_timeout",
    "plan_search",
    "predict_run",
    "preflight",
    "read_request",
    "reference_candidate",
    "run_search",
    "run_verify",
    "start_run",
    "summarize",
    "tune",
    "verify_requests",
    "weights_floor",
    "write_answer",
]
