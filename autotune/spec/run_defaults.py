"""The rules for what a search run does when the request leaves it open.  [pure]

Each default has its one home here; ``tune``'s plan resolves them once (the cache key, the
pre-flight, the searcher and summary.json read the plan), and ``search.Searcher`` falls back to
the same rules when it is built directly.
"""

from __future__ import annotations

__all__ = ["CONFIRM_STEPS_FACTOR", "POOLS", "confirm_steps", "prune_default", "load_monitor_default", "max_world",
           "pool_for"]

# what may run a search's probes (``--pool``)
POOLS = ("auto", "ray", "local")

# a confirmation probe times this many times the search probe's steps (a longer, steadier window)
CONFIRM_STEPS_FACTOR = 2


def confirm_steps(steps: int) -> int:
    """Timed steps of each confirmation probe, for search probes of ``steps``."""
    return steps * CONFIRM_STEPS_FACTOR


def prune_default(prune: bool | None, device: str) -> bool:
    """Whether the memory model skips candidates predicted far above the budget: ``prune`` as given,
    else on for GPUs and off on CPU (where the memory model is rougher)."""
    return bool(prune) if prune is not None else device == "cuda"


def load_monitor_default(load_monitor: bool | None, *, own_executor: bool, cluster: bool) -> bool:
    """Whether other load on the machine is watched: ``load_monitor`` as given, else on when autotune
    runs its own probes on this machine (its own executor, no cluster)."""
    return bool(load_monitor) if load_monitor is not None else own_executor and not cluster


def max_world(device: str, gpu_count: int, *, cluster: bool, executor_gpus: int | None = None) -> int | None:
    """The most GPUs one probe may use (None: no bound known).

    On cpu, 1. On this machine's GPUs, the GPUs in use (``gpu_count``), bounded by what the executor
    reports when it does. On a cluster the local GPUs say nothing: a distributed probe's ranks run on
    one node, so the largest node bounds it once the executor reports it (``executor_gpus``).
    """
    if device == "cpu":
        return 1
    if cluster:
        return int(executor_gpus) if executor_gpus else None
    bound = gpu_count or None
    if executor_gpus:
        bound = min(bound or int(executor_gpus), int(executor_gpus))
    return bound


def pool_for(pool: str, *, device: str, ray_address: str | None) -> str:
    """``ray`` or ``local``: ``pool`` as given, else (``auto``) local on a CPU without a cluster, Ray otherwise.

    On a CPU the Ray pool runs one probe at a time on this machine (a probe uses every core), as the
    local executor does, but it must start a Ray runtime and a fresh Ray worker per probe; the local
    one forks each probe from a process that has imported the libraries once (``executors.warm``).
    """
    if pool != "auto":
        return pool
    return "local" if device == "cpu" and ray_address is None else "ray"
