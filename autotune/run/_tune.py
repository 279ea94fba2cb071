"""``autotune.tune``: search for the fastest configuration that fits, and hand it back ready to use.

    result = autotune.tune("llama-3.1-8b", gpu_budget="24GB", mode="lora", seq_len=4096,
                           effective_batch=32)
    args = result.training_arguments("out/")        # a transformers.TrainingArguments

    request = RunRequest.from_file("sft.yaml", gpu_budget="24GB", write_back="sft.tuned.yaml")
    result = autotune.tune(request)                 # result.summary is summary.json

The stages, one module each: the request (``_request``) -> the plan: device, space, pre-flight, forecast,
cache key (``_plan``, ``_preflight``, ``_forecast``) -> a stored answer to the same request
(``_outputs.answer_from_cache``) -> the search, its confirmation and the loss check (``_search``,
``_verify``) -> the summary and the outputs, summary.json last (``_outputs``). Nothing fits ->
NothingFitsError (exit 3) whose message gives the smallest footprint measured and the lever needed.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from autotune.run._outputs import RunResult, answer_from_cache, summarize, write_answer
from autotune.run._plan import plan_search, predict_run
from autotune.run._request import RunRequest, announce_source, read_request
from autotune.run._search import claim_run_dir, run_search, start_run
from autotune.store.run_dir import check_out_dir

__all__ = ["tune"]

_FIELDS = frozenset(f.name for f in dataclasses.fields(RunRequest))


def tune(request: RunRequest | str | None = None, /, **kwargs: Any) -> RunResult:
    """Find the fastest configuration that fits the request's budget, by measuring; see :class:`RunRequest`
    for what may be asked. ``tune(request)`` takes a built request; ``tune(model, gpu_budget=..., ...)``
    (the keyword form, kept for one release) builds one from the keywords.

    Raises SpecError (exit 2) for a bad request, NothingFitsError (exit 3) when no configuration fits.
    ``request.executor`` replaces the default Ray pool (and is not closed here). ``prune`` (default: on
    for GPUs, off on CPU where the memory model is rougher) skips candidates the estimator predicts far
    above the budget (recorded as inferred); ``pruner`` replaces that rule. ``progress(event, data)``
    receives ``start``, ``submit``, ``record``, ``tick``, ``confirm``, ``done``, ``cached``, ``run_dir``,
    ``write_back`` and ``note`` events. ``verify_loss`` (K > 0) runs the quality guard after the search:
    the chosen configuration and the HF-default reference for K steps each, same seed and data order, loss
    trajectories compared (``verify_loss.json``, ``summary["verify_loss"]``). ``space`` None is the
    device's own: ``cpu`` on a CPU (also when ``device="auto"`` finds no GPU), ``default`` on a GPU;
    choices the device or installation cannot run are dropped before any probe
    (``summary["dropped_choices"]``). ``confirm_rounds`` (min, max) and ``confirm_tolerance`` set the
    confirmation policy. ``load_monitor`` (default: on when autotune runs its own probes on this machine)
    watches for other load and fills ``summary["warnings"]``. ``trainer="trl"`` measures every probe
    through TRL's SFTTrainer (it needs a ``tokenizer``). ``hub`` (an ``autotune.models.HubAccess``; None:
    never the network) lets a model or Hub dataset missing from the caches be fetched. ``lora_r``,
    ``lora_alpha`` (default 2 x rank) and ``lora_targets`` are the adapters a lora/qlora run measures.
    A request with a ``source`` (:meth:`RunRequest.from_file`) writes the tuned file back
    (``summary["write_back"]``).

    The stages, in order: :func:`read_request` -> :func:`plan_search` -> :func:`answer_from_cache` ->
    :func:`predict_run` -> claim the run folder -> :func:`start_run` -> :func:`run_search` ->
    :func:`summarize` -> :func:`write_answer`. Nothing is written before the run folder is claimed.
    """
    request = _as_request(request, kwargs)
    t0 = time.monotonic()
    r = read_request(request)
    plan = plan_search(r)
    announce_source(r)
    cached = answer_from_cache(r, plan, started=t0)
    if cached is not None:  # served from a read-only results folder too: nothing is written
        return cached
    check_out_dir(request.out)  # a search writes its run folder there
    plan = predict_run(r, plan)
    run_dir, lock, resumed = claim_run_dir(Path(request.out), plan.key, r.resolved.name, request.resume,
                                           request.fresh, request.progress)
    with lock:  # held until the run ends; the kernel drops it if this process is killed
        started = start_run(r, plan, run_dir, resumed)
        searched = run_search(r, plan, run_dir, started)
        summary = summarize(r, plan, searched, started.base_summary)
        return write_answer(r, run_dir, summary, searched, device=plan.device)


def _as_request(request: RunRequest | str | None, kwargs: dict[str, Any]) -> RunRequest:
    if isinstance(request, RunRequest):
        if kwargs:
            raise TypeError("tune(request) takes no keywords: dataclasses.replace(request, ...) changes a field")
        return request
    if request is not None:
        kwargs = {"model": request, **kwargs}
    unknown = sorted(set(kwargs) - _FIELDS)
    if unknown:
        raise TypeError(f"tune() got an unexpected keyword argument {unknown[0]!r}")
    return RunRequest(**kwargs)
