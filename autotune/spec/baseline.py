"""The "HF default" baseline candidate a tuned configuration is compared with.  [pure]"""

from __future__ import annotations

from autotune.spec.levers import LEVERS
from autotune.spec.probe_request import Candidate

__all__ = ["HF_DEFAULT_MICRO_BATCH", "hf_default_candidate"]

# The configuration a user would type without tuning ("HF default"): each lever's HF default as declared in
# autotune.spec.levers (TrainingArguments' per-device batch 8, no checkpointing, no workers, fused AdamW, the
# model's default attention: sdpa in transformers 5, no packing, fp32), the precision the user chose if any,
# and accumulation chosen to keep the effective batch the search held fixed. A speedup
# over it at another precision mixes in the precision's own gain: pass ``precision=`` to compare
# like with like (benchmarks/gpu_check.sh uses the tuned configuration's precision).
HF_DEFAULT_MICRO_BATCH: int = LEVERS["micro_batch"].hf_default


def hf_default_candidate(effective_batch: int, *, world_size: int = 1, precision: str = "fp32") -> Candidate:
    """The "HF default" configuration for the same effective batch (the report's baseline).

    Micro-batch 8 when it divides the per-rank batch; otherwise the largest divisor below 8, so the
    effective batch is never changed silently.
    """
    if effective_batch < 1 or world_size < 1:
        raise ValueError(f"effective batch and world size must be >= 1, got {effective_batch}, {world_size}")
    per_rank = max(1, effective_batch // world_size)
    micro = next(m for m in range(min(HF_DEFAULT_MICRO_BATCH, per_rank), 0, -1) if per_rank % m == 0)
    hf = {name: lv.hf_default for name, lv in LEVERS.items() if lv.hf_default is not None}
    return Candidate(**{**hf, "micro_batch": micro, "grad_accum": per_rank // micro, "precision": precision,
                        "world_size": world_size})
