"""The shape of a probe's measurement: how many micro-batches it runs, whatever the accumulation.  [pure]

A probe does not run whole optimizer steps at the candidate's gradient accumulation ``A`` (that made
its cost grow with the effective batch: 35 minutes per probe for Llama-3.1-8B LoRA at seq 4096,
effective batch 32 on an A10G). It runs the Trainer at a small *probe accumulation* ``a`` and times
the two components of an optimizer step separately:

- ``c_nb``, one non-boundary micro-step (fetch share + forward + backward, no gradient sync), and
- ``c_b``, the boundary (the last micro-step with its gradient all-reduce / reduce-scatter, gradient
  clipping, the optimizer step and ``zero_grad``),

then composes the step at the true accumulation as ``T(A) = (A - 1) * c_nb + c_b``. Everything the
probe emits keeps the true ``A``; only what is timed is smaller. Where the rule is not trusted the
probe times whole steps at ``A`` (``composes`` is False): ``A <= a`` (nothing to compose) and
torch.compile: measured on CPU (tiny-llama, A=16, 3 interleaved repeats each) the composed figure
read 1.15x the whole-step one with repeat spreads of 3-5 %, and 0.90x in an earlier pair, so the
rule is not trusted for compiled models until a measurement says why. And variable-length batches
without packing (a ``--lengths`` distribution or a dataset, padded per micro-batch): a few
micro-batches do not sample the stream's padding the way ``A`` of them do; measured on CPU one such
case read 1.15x the whole-step figure and 0.90x its peak (spreads 8 %), so those time whole steps.

The timed window is adaptive: after ``MIN_TIMED_STEPS`` timed optimizer steps (or ``steps`` if
smaller) it stops as soon as the composed step time's relative standard error (jackknife over the
timed steps) is at most ``STABLE_REL_ERROR``; ``ProbeSettings.steps`` is the maximum.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.spec.probe_request import Candidate, ProbeSettings, Workload

__all__ = [
    "COMPILE_WARMUP_STEPS",
    "MIN_TIMED_STEPS",
    "NOISY_REL_ERROR",
    "PROBE_GRAD_ACCUM",
    "STABLE_REL_ERROR",
    "ProbeWindow",
    "variable_padded",
    "composes",
    "probe_grad_accum",
    "probe_window",
]

# micro-batches per optimizer step that a composing probe runs: one non-boundary micro-step and one
# boundary per step, so every timed step measures both components
PROBE_GRAD_ACCUM = 2
# timed optimizer steps before the window may stop early (>= 2 boundaries inside the window)
MIN_TIMED_STEPS = 3
# the window stops once the composed step time's relative standard error is at most this
STABLE_REL_ERROR = 0.03
# a composition whose relative standard error is above this is flagged: too noisy to combine
NOISY_REL_ERROR = 0.10
# warm-up steps of a torch.compile probe at least: the first steps compile (and the first
# optimizer step, or the last partial micro-batch shape, can recompile)
COMPILE_WARMUP_STEPS = 3


def variable_padded(candidate: Candidate, workload: Workload | None) -> bool:
    """Micro-batches whose padded size varies: unpacked, from a length distribution or a dataset."""
    if workload is None or candidate.packing:
        return False
    return workload.variable_lengths


def composes(candidate: Candidate, workload: Workload | None = None) -> bool:
    """True when the probe times components at ``PROBE_GRAD_ACCUM`` and composes the true step
    (``workload`` None: judged by the candidate alone, as for fixed-length data)."""
    return (candidate.grad_accum > PROBE_GRAD_ACCUM and not candidate.torch_compile
            and not variable_padded(candidate, workload))


def probe_grad_accum(candidate: Candidate, workload: Workload | None = None) -> int:
    """The accumulation the probe's Trainer runs with (the candidate's own where it does not compose)."""
    return PROBE_GRAD_ACCUM if composes(candidate, workload) else candidate.grad_accum


@dataclass(frozen=True)
class ProbeWindow:
    """What one probe runs: warm-up and timed optimizer steps at ``grad_accum`` micro-batches each."""

    grad_accum: int  # micro-batches per optimizer step in the probe
    warmup_steps: int
    min_timed_steps: int
    max_timed_steps: int
    composed: bool
    adaptive: bool = True  # stop once the estimate is stable (else run max_timed_steps)

    @property
    def max_micro_batches(self) -> int:
        """Micro-batches (forward + backward) the probe runs at most, per rank."""
        return (self.warmup_steps + self.max_timed_steps) * self.grad_accum

    @property
    def min_micro_batches(self) -> int:
        return (self.warmup_steps + self.min_timed_steps) * self.grad_accum

    @property
    def max_optimizer_steps(self) -> int:
        return self.warmup_steps + self.max_timed_steps


def probe_window(settings: ProbeSettings, candidate: Candidate, workload: Workload | None = None) -> ProbeWindow:
    """The window a probe of ``candidate`` under ``settings`` runs (what the worker does, and what a
    probe-time prediction counts). ``settings.window == "whole"``: ``steps`` whole optimizer steps at
    the candidate's own accumulation, no early stop (a direct measurement)."""
    warmup = settings.warmup_steps
    if candidate.torch_compile:
        warmup = max(warmup, COMPILE_WARMUP_STEPS)
    if getattr(settings, "window", "adaptive") == "whole":
        return ProbeWindow(grad_accum=candidate.grad_accum, warmup_steps=warmup, min_timed_steps=settings.steps,
                           max_timed_steps=settings.steps, composed=False, adaptive=False)
    return ProbeWindow(
        grad_accum=probe_grad_accum(candidate, workload),
        warmup_steps=warmup,
        min_timed_steps=min(MIN_TIMED_STEPS, settings.steps),
        max_timed_steps=settings.steps,
        composed=composes(candidate, workload),
        adaptive=True,
    )
