"""What the estimator knows about a configuration before any probe, as the model strategy's prior.  [pure]

The model strategy (``autotune.search``, ``--strategy model``) fits its per-lever terms as departures
from this structure, so a lever the estimator models is right from the first probe on, and a probe
only has to correct it:

* ``speed(c)``: ``-log(hardware FLOPs per token)``: checkpointing's recomputed forward, for the share of
  layers it recomputes (:func:`~autotune.estimate.speed.recomputed`). The device's rate is a constant
  the fit's intercept absorbs; what FLOPs do not show (micro-batch overheads, kernels, precision, padding,
  the loader, Liger) is the fit's to learn. (The planner's whole step-time model as the GPU prior was
  tried on the simulated story-1 landscapes: 14-14.5 probes against 12.5-13.5 with FLOPs alone, so no
  gain; benchmarks/README.md.)
* ``memory(c)``: ``log(predicted peak / usable budget)`` from
  :func:`~autotune.estimate.memory.estimate_memory` (the planner's memory model; on a GPU the catalog
  knows, ``gpu`` or the first of ``gpu_infos``, with its CUDA context), None when the estimator cannot
  read the architecture. Its constant error (1.4-1.9x on the recorded CPU landscapes) is the fit's
  intercept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.estimate.arch import Arch, arch_from_config
from autotune.estimate.catalog import GPU
from autotune.estimate.memory import estimate_memory
from autotune.estimate.probe_time import _gpu_of
from autotune.estimate.speed import hardware_flops_per_token, recomputed
from autotune.spec.probe_request import Candidate, Workload

__all__ = ["CostPrior"]


class CostPrior:
    """The estimator's structure for one workload on one device (``config``: the model's config.json; ``gpu``,
    or the first of ``gpu_infos`` the catalog knows, on ``device="cuda"``)."""

    def __init__(self, config: Mapping[str, Any] | Arch, workload: Workload, *, device: str, usable_bytes: int,
                 gpu: GPU | None = None, gpu_infos: Sequence[Mapping[str, Any]] = ()) -> None:
        self.arch = config if isinstance(config, Arch) else arch_from_config(config)
        self.workload, self.device, self.usable = workload, device, max(1, int(usable_bytes))
        self.gpu = gpu if gpu is not None else (_gpu_of([dict(g) for g in gpu_infos]) if device == "cuda" else None)

    def speed(self, c: Candidate) -> float:
        """log tokens per FLOP (up to the device's constant rate: the fit's intercept)."""
        flops = hardware_flops_per_token(self.arch, self.workload.seq_len, self.workload.mode, recomputed(self.arch, c))
        return -math.log(flops)

    def memory(self, c: Candidate) -> float | None:
        """log(predicted peak / usable budget); None when the memory model cannot predict it."""
        try:
            peak = estimate_memory(self.arch, self.workload, c, device=self.device, gpu=self.gpu).total
        except Exception:  # an architecture or lever the memory model does not know: no prior
            return None
        return math.log(max(peak, 1) / self.usable)
