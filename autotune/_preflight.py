"""Checks ``tune`` runs before it writes anything: a request that cannot work fails here, fast.

Everything in this module raises :class:`~autotune.errors.SpecError` (exit 2) and writes nothing:
no run directory exists yet when it runs. The checks, cheapest first:

* the effective batch: at least one micro-batch of the space must divide it (with a world size
  the hardware holds), or no probe could hold it;
* the weights: if the model's weights alone (the estimator's ``weights`` term, for the leanest
  precision/sharding the space allows) exceed the budget in the requested mode, nothing can fit;
  the message gives the minimum and the mode that would fit;
* ``--ray-address``: the cluster's port must answer within ``RAY_CONNECT_TIMEOUT_S``;
* ``--dataset``: read (and tokenized, into the shared cache the probes then hit) once here, so a
  missing tokenizer, an empty file or a malformed line is exit 2, not a run of crashed probes.
"""

from __future__ import annotations

import itertools
from typing import Any

from autotune.errors import SpecError
from autotune.spec.budget import format_bytes
from autotune.spec.probe_request import Candidate, Workload
from autotune.spec.space import SearchSpace

__all__ = ["RAY_CONNECT_TIMEOUT_S", "check_batch", "weights_floor", "check_weights", "check_ray", "check_dataset",
           "preflight"]

RAY_CONNECT_TIMEOUT_S = 10.0


def check_batch(space: SearchSpace, effective_batch: int, max_world: int | None) -> list[str]:
    """Problems with the effective batch: no usable world size, or no micro-batch that divides it."""
    from autotune.search._logic import usable_micro_batches, usable_worlds

    worlds, _ = usable_worlds(space, max_world)
    if not worlds:
        return [f"no gpus_per_trial choice in {list(space.gpus_per_trial)} fits the {max_world} GPU(s) available"]
    mbs, _ = usable_micro_batches(space, effective_batch, worlds)
    if not mbs:
        return [f"no micro_batch in {list(space.micro_batch)} divides the effective batch {effective_batch} "
                f"with gpus_per_trial {worlds}; choose an effective batch that is a multiple of one of them"]
    return []


def weights_floor(
    config: dict[str, Any], *, mode: str, space: SearchSpace, device: str, seq_len: int, max_world: int | None,
) -> tuple[int, int] | None:
    """(bytes the weights alone take on one device at best, parameter count), or None if unknown.

    The least over the space's precisions, ZeRO stages, sharding, offload and world sizes, so a
    request is refused only when no configuration of the space could hold the weights.
    """
    try:
        from autotune.estimate import arch_from_config, estimate_memory

        arch = arch_from_config(config)
    except Exception:  # an architecture the estimator does not know: let the probes decide
        return None
    worlds = [w for w in space.gpus_per_trial if max_world is None or w <= max_world] or [1]
    workload = Workload(model="preflight", seq_len=seq_len, mode=mode)
    best: int | None = None
    for precision, zero, sharding, offload, world in itertools.product(
        space.precision, space.zero_stage, space.sharding, space.offload, worlds
    ):
        cand = Candidate(micro_batch=1, grad_accum=1, grad_ckpt=True, precision=precision, zero_stage=zero,
                         sharding=sharding, offload=offload, world_size=world)
        if cand.problems():
            continue
        try:
            terms = estimate_memory(arch, workload, cand, device=device).terms
        except Exception:
            continue
        w = int(terms.get("weights", 0))
        best = w if best is None else min(best, w)
    return None if best is None else (best, arch.params_total)


def check_weights(
    config: dict[str, Any], *, name: str, mode: str, space: SearchSpace, device: str, seq_len: int,
    max_world: int | None, budget_text: str, budget_bytes: int,
) -> list[str]:
    """A problem when the weights alone exceed the budget: the minimum, and the mode that would fit."""
    floor = weights_floor(config, mode=mode, space=space, device=device, seq_len=seq_len, max_world=max_world)
    if floor is None or floor[0] <= budget_bytes:
        return []
    need, params = floor
    text = (f"{name} needs at least {format_bytes(need)} for its weights alone with --mode {mode} "
            f"({params / 1e6:,.0f}M parameters), more than the budget {budget_text} ({format_bytes(budget_bytes)})")
    others = [m for m in ("full", "lora", "qlora") if m != mode and not (m == "qlora" and device == "cpu")]
    fitting: list[str] = []
    for m in others:
        f = weights_floor(config, mode=m, space=space, device=device, seq_len=seq_len, max_world=max_world)
        if f is not None and f[0] <= budget_bytes:
            fitting.append(f"--mode {m} (weights {format_bytes(f[0])})")
    if fitting:
        return [f"{text}; try {' or '.join(fitting)}, or a budget of at least {format_bytes(need)}"]
    return [f"{text}; no mode fits it: give a budget of at least {format_bytes(need)}"
            + (" or try --mode qlora on a GPU" if device == "cpu" and mode != "qlora" else "")]


def check_ray(ray_address: str | None, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A bounded wait for ``--ray-address`` (SpecError naming the address if it does not answer)."""
    if ray_address is None:
        return
    from autotune.executors.ray_pool import _check_reachable

    _check_reachable(ray_address, timeout_s)


def check_dataset(dataset: str | None, workload: Workload) -> None:
    """Read the dataset once (DatasetError: missing tokenizer, empty, malformed); the probes hit the cache."""
    if dataset is None:
        return
    from autotune.probe.data import find_tokenizer, load_token_sequences

    load_token_sequences(dataset, seq_len=workload.seq_len, tokenizer=find_tokenizer(workload))


def preflight(
    *, config: dict[str, Any], name: str, workload: Workload, space: SearchSpace, effective_batch: int,
    device: str, max_world: int | None, budget_text: str, budget_bytes: int, ray_address: str | None,
) -> None:
    """Every check above, in order; the batch and weights problems are reported together."""
    problems = check_batch(space, effective_batch, max_world)
    problems += check_weights(config, name=name, mode=workload.mode, space=space, device=device,
                              seq_len=workload.seq_len, max_world=max_world, budget_text=budget_text,
                              budget_bytes=budget_bytes)
    if problems:
        raise SpecError(problems)
    check_ray(ray_address)
    check_dataset(workload.dataset, workload)
