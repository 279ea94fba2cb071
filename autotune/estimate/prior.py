"""What the estimator knows about a configuration before any probe, as the model strategy's prior.  [pure]

The model strategy (``autotune.search``, ``--strategy model``) fits its per-lever terms as departures
from this structure, so a lever the estimator models is right from the first probe on, and a probe
only has to correct it:

* ``speeds(c)``: ``-log(compute per real token)``, one figure per fixed per-micro-batch cost in
  ``FIXED_COSTS`` (on a CPU; on a GPU FLOPs alone); the model strategy keeps the one its probes make likeliest (the fit's evidence). Compute per
  real token = the hardware FLOPs of every token slot the probe's layout computes, padding included
  (:func:`~autotune.estimate.speed.flops_per_real_token`: the length distribution's padded or packed rows at
  their widths, checkpointing's recomputed forward for the share of layers it recomputes), plus
  ``k x`` one full-length sequence's FLOPs per micro-batch, spread over the micro-batch's real tokens: the
  launches, Python and bookkeeping every micro-batch pays whatever its size, which is most of a small model's
  step on a CPU and next to nothing of a large one's on a GPU. The device's rate is a constant the fit's
  intercept absorbs; what this does not show (kernels, precision, the loader, Liger) is the fit's to learn.
  (The planner's whole step-time model as the GPU prior was tried on the simulated story-1 landscapes:
  14-14.5 probes against 12.5-13.5 with FLOPs alone, so no gain; benchmarks/README.md.)
* ``memory(c)``: ``log(predicted peak / usable budget)`` from
  :func:`~autotune.estimate.memory.estimate_memory` (the planner's memory model; on a GPU the catalog
  knows, ``gpu`` or the first of ``gpu_infos``, with its CUDA context; on a CPU with the heap glibc keeps),
  None when the estimator cannot read the architecture. Its constant error is the fit's intercept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.estimate.arch import Arch, arch_from_config
from autotune.estimate.catalog import GPU
from autotune.estimate.memory import estimate_memory
from autotune.estimate.probe_time import _gpu_of
from autotune.estimate.speed import batch_layout_of, flops_per_real_token, hardware_flops_per_token
from autotune.spec.probe_request import Candidate, Workload

__all__ = ["CostPrior", "FIXED_COSTS"]

# The fixed cost per micro-batch the speed prior may carry on a CPU, in full-length sequences' FLOPs (k above): 0
# (FLOPs alone, the first: what the prior is before a probe tells them apart) to 3. Spaced x3, about the
# resolution three probes with ~8 % noise can tell apart. On a GPU the prior is FLOPs alone (k = 0): choosing k
# by the evidence there made the simulated story-1 runs slower (H100: 12 probes and 8.6 min at the median
# against 11 and 6.8 min; benchmarks/README.md), the fixed cost being a small share of a large model's step.
FIXED_COSTS = (0.0, 0.03, 0.1, 0.3, 1.0, 3.0)
# a dataset's lengths are thinned to at most this many (every k-th) before the layout draws from them
LENGTHS_SAMPLE_MAX = 4096


class CostPrior:
    """The estimator's structure for one workload on one device (``config``: the model's config.json; ``gpu``,
    or the first of ``gpu_infos`` the catalog knows, on ``device="cuda"``; ``lengths_sample``: a dataset's token
    lengths, which the speed prior's layout then draws from; ``retained_heap`` False: CPU peaks without the heap
    glibc's default malloc keeps, as a probe under ``MALLOC_MMAP_THRESHOLD_=65536`` measured them)."""

    def __init__(self, config: Mapping[str, Any] | Arch, workload: Workload, *, device: str, usable_bytes: int,
                 gpu: GPU | None = None, gpu_infos: Sequence[Mapping[str, Any]] = (),
                 lengths_sample: Sequence[int] = (), retained_heap: bool = True) -> None:
        self.arch = config if isinstance(config, Arch) else arch_from_config(config)
        # a dataset's token lengths (a run with --dataset): the layout is drawn from them instead of ``lengths``
        step = max(1, -(-len(lengths_sample) // LENGTHS_SAMPLE_MAX))
        self.sample = tuple(int(n) for n in list(lengths_sample)[::step])
        self.workload, self.device, self.usable = workload, device, max(1, int(usable_bytes))
        self.gpu = gpu if gpu is not None else (_gpu_of([dict(g) for g in gpu_infos]) if device == "cuda" else None)
        # False: peaks as a CPU process whose malloc returns freed blocks at once measures them (the live tensors)
        self.retained_heap = retained_heap

    def speeds(self, c: Candidate) -> tuple[float, ...]:
        """log real tokens per FLOP (up to the device's constant rate: the fit's intercept), one per fixed
        per-micro-batch cost in ``FIXED_COSTS`` on a CPU, one (FLOPs alone) on a GPU."""
        wl = self.workload
        per_token = flops_per_real_token(self.arch, wl, c, sample=self.sample)
        sequence = hardware_flops_per_token(self.arch, wl.seq_len, wl.mode) * wl.seq_len
        tokens = batch_layout_of(wl, c, sample=self.sample).tokens_per_micro_batch
        return tuple(-math.log(per_token + k * sequence / tokens) for k in (FIXED_COSTS if self.device == "cpu" else (0.0,)))

    def speed(self, c: Candidate) -> float:
        """log real tokens per FLOP with no fixed cost (the first of :meth:`speeds`)."""
        return self.speeds(c)[0]

    def memory(self, c: Candidate) -> float | None:
        """log(predicted peak / usable budget); None when the memory model cannot predict it."""
        try:
            est = estimate_memory(self.arch, self.workload, c, device=self.device, gpu=self.gpu)
            peak = est.total if self.retained_heap else est.live
        except Exception:  # an architecture or lever the memory model does not know: no prior
            return None
        return math.log(max(peak, 1) / self.usable)
