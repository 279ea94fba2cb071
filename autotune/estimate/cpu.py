"""How long one probe takes on a CPU, at the least.  [pure]

``autotune run`` uses this to refuse, before anything runs, a request that ``--device auto``
resolved to a CPU (no GPU found) and whose single probe would take longer than the probe timeout
(``--probe-timeout``, 300 s by default): such a probe would be killed at its timeout, every one
of the search's probes with it. An explicit ``--device cpu`` runs anyway.

The prediction is a *lower bound* on purpose, so the refusal errs towards running:

    seconds >= (warm-up + timed steps) x effective batch x mean sequence tokens
               x hardware FLOPs per token (``hardware_flops_per_token``, no checkpointing)
               / (logical cores x ``CPU_FLOPS_PER_CORE``)

``CPU_FLOPS_PER_CORE`` (1 TFLOP/s) stays above what a recorded CPU landscape reached per thread: at most
239 GFLOP/s (landscape R, tiny-mistral, bf16, one thread, on an AMD EPYC with AVX512-BF16: 60 % of such a
core's bf16 peak, ``vdpbf16ps`` at 16 lanes x 2 FLOPs x 2 FMA units x 3.1 GHz = 400 GFLOP/s), 4.2 times
below it; tests/test_request.py checks the constant stays at least twice above every recorded landscape.
It was that 400 GFLOP/s peak until landscape R came within 2x of it; a core with bf16 matrix units (Intel
AMX) can beat even 1 TFLOP/s on a large model's matmuls, where ``--device cpu`` runs anyway.
Model build, imports and data loading are not counted.
"""

from __future__ import annotations

from autotune.estimate.arch import Arch
from autotune.estimate.speed import hardware_flops_per_token

__all__ = ["CPU_FLOPS_PER_CORE", "cpu_probe_seconds"]

CPU_FLOPS_PER_CORE = 1.0e12


def cpu_probe_seconds(
    arch: Arch, *, mode: str, seq_len: int, mean_tokens: float, effective_batch: int, optimizer_steps: int,
    cores: int, flops_per_core: float = CPU_FLOPS_PER_CORE,
) -> float:
    """A lower bound on the seconds one CPU probe spends training (see the module docstring).

    ``mean_tokens``: real tokens per sequence on average (``seq_len`` for fixed lengths);
    ``optimizer_steps``: warm-up plus timed steps.
    """
    tokens = max(1.0, min(float(seq_len), float(mean_tokens)))
    flops = hardware_flops_per_token(arch, max(1, round(tokens)), mode, grad_ckpt=False)
    work = optimizer_steps * effective_batch * tokens * flops
    return work / (max(1, cores) * flops_per_core)
