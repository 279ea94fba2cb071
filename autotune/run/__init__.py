"""The run: one ``autotune run`` from its request to its answer, in stages.

    request    -> _request: RunRequest (CLI, --from file or Python) validated once by read_request
    plan       -> _plan: device, space, settings, every default resolved; the cache key
      pre-flight -> _preflight: the model, budget, dataset and Ray checked before anything is written
      forecast -> _forecast: the time to answer and --time-budget (one probe's time: autotune.estimate)
    cache      -> _outputs.answer_from_cache: a stored answer to the same request
    search     -> _search: the run folder claimed, the Optuna search over the probes and its
                  confirmation of the top-k (autotune.search)
    verify     -> _verify: the winner's losses against the HF default's (--verify-loss)
    outputs    -> _outputs: best/, the --from file written back, the reports, summary.json last

``tune(request) -> RunResult`` runs them all; the CLI's ``autotune run`` builds the request and renders
the result.
"""

from __future__ import annotations

from autotune.run._forecast import (
    MAX_UNBUDGETED_S,
    PREDICTED,
    ProbeCount,
    check_time_budget,
    forecast,
    forecast_line,
    parse_probe_timeout,
)
from autotune.run._outputs import (
    RunResult,
    TuneResult,
    answer_from_cache,
    nothing_fits_message,
    summarize,
    trust_verdict,
    write_answer,
    write_back,
)
from autotune.run._plan import SearchPlan, baseline_candidate, plan_search, predict_run
from autotune.run._preflight import (
    AUTO_CPU_PROBE_LIMIT_S,
    RAY_CONNECT_TIMEOUT_S,
    check_batch,
    check_cpu_probe_time,
    check_dataset,
    check_model_config,
    check_ray,
    check_weights,
    dataset_lengths,
    default_space_for,
    detect_capabilities,
    mean_sequence_tokens,
    preflight,
    situation_space,
    weights_floor,
)
from autotune.run._request import (
    API_ONLY,
    FILLED_FROM_FILE,
    Request,
    RunRequest,
    TuneArgs,
    WriteBackPlan,
    plan_write_back,
    read_request,
    read_source,
)
from autotune.run._search import EstimatePruner, RunStart, Searched, claim_run_dir, run_search, start_run
from autotune.run._tune import tune
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
    "FILLED_FROM_FILE",
    "IDENTICAL_KNOBS",
    "MAX_UNBUDGETED_S",
    "PREDICTED",
    "RAY_CONNECT_TIMEOUT_S",
    "EstimatePruner",
    "ProbeCount",
    "Request",
    "RunRequest",
    "RunResult",
    "RunStart",
    "SearchPlan",
    "Searched",
    "TuneArgs",
    "TuneResult",
    "WriteBackPlan",
    "answer_from_cache",
    "baseline_candidate",
    "check_batch",
    "check_cpu_probe_time",
    "check_dataset",
    "check_model_config",
    "check_ray",
    "check_time_budget",
    "check_weights",
    "claim_run_dir",
    "compare_losses",
    "default_space_for",
    "situation_space",
    "detect_capabilities",
    "expected_differences",
    "forecast",
    "forecast_line",
    "dataset_lengths",
    "mean_sequence_tokens",
    "nothing_fits_message",
    "parse_probe_timeout",
    "plan_search",
    "plan_write_back",
    "predict_run",
    "preflight",
    "read_request",
    "read_source",
    "reference_candidate",
    "run_search",
    "run_verify",
    "start_run",
    "summarize",
    "trust_verdict",
    "tune",
    "verify_requests",
    "weights_floor",
    "write_answer",
    "write_back",
]
