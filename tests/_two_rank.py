"""Two-rank probes on CPU (2 gloo processes, the tiny Llama), each run once per session.

A two-rank probe costs a minute or more on 2 cores (two interpreters, two models, DeepSpeed's start), so
the tests that need one read the same result: ``tests/test_short_probes.py`` (a composed window's peak
against the whole window's, on DDP and ZeRO-3) and ``tests/test_distributed.py`` (what each rank
reports and how the ranks' figures merge, on the same probes).
"""

from __future__ import annotations

import functools

from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

SEQ, MB, ACCUM, WARMUP = 64, 2, 8, 1
# the composed window measures 3 micro-steps at accumulation 2; the whole window 2 optimizer steps
COMPOSED_STEPS, WHOLE_STEPS = 3, 2
# DeepSpeed compiles its ops on first use (deepspeed_shm_comm ~1-3 min on 2 cores); later runs load them
TIMEOUT_S = 600.0


def request(*, window: str = "adaptive", zero_stage: int = 0) -> ProbeRequest:
    from autotune.models import resolve_model

    resolved = resolve_model("tiny-llama")
    return ProbeRequest(
        Workload(model=resolved.name, model_path=resolved.path, seq_len=SEQ),
        Candidate(micro_batch=MB, precision="fp32", attn="sdpa", grad_accum=ACCUM, world_size=2,
                  zero_stage=zero_stage),
        ProbeSettings(device="cpu", warmup_steps=WARMUP, steps=WHOLE_STEPS if window == "whole" else COMPOSED_STEPS,
                      timeout_s=TIMEOUT_S, window=window),
    )


@functools.cache
def probe(window: str = "adaptive", zero_stage: int = 0) -> ProbeResult:
    """The two-rank probe of that window and ZeRO stage (0: DDP), run the first time it is asked for."""
    from autotune.executors.local import run_probe_process

    return run_probe_process(request(window=window, zero_stage=zero_stage))
