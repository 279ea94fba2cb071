"""Evidence from a probe -> the bottleneck table of the domain notes.  [pure]

=====================================================  ==========================================
Observation (what the probe measured)                  Bottleneck, fix
=====================================================  ==========================================
status oom / over_budget                               memory: precision, batch, sequence, model
data_wait_fraction >= 10 % of step time, or GPU        data loading: workers, pinned memory,
utilisation swinging 0 <-> 100 %                       pre-tokenized data
utilisation high (>= 80 %), peak < 60 % of the budget  batch could be larger
utilisation low (< 70 %) with no data wait             small per-step work: larger micro-batch
world_size > 1, tokens/s per GPU < 80 % of 1 GPU's     communication / small per-GPU batches
CPU offload in the configuration                       capacity limit (PCIe-bound), not tuning
padding >= 20 % of token slots without packing         padding: packing
fp32 / eager attention on a GPU that has better        precision / attention kernels
=====================================================  ==========================================

GPU utilisation is NVML's percentage (0–100, ``gpu_util_samples``); CPU utilisation is the share
of the available cores the probe kept busy (0–1, ``cpu_util_mean``). Every threshold is a module
constant, so a report can state it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import SpecError
from autotune.estimate import GPU, predict_peak_bytes
from autotune.estimate.catalog import builtin_catalog
from autotune.spec.budget import format_bytes
from autotune.spec.levers import ADVICE
from autotune.spec.probe_request import Candidate, ProbeRequest
from autotune.spec.result import ProbeResult
from autotune.spec.trial import candidate_label

__all__ = [
    "DATA_WAIT_THRESHOLD",
    "HIGH_UTIL_PERCENT",
    "LOW_UTIL_PERCENT",
    "IDLE_UTIL_PERCENT",
    "SWING_IDLE_SHARE",
    "LOW_MEMORY_SHARE",
    "SCALING_OK",
    "PADDING_THRESHOLD",
    "Finding",
    "Diagnosis",
    "RunDiagnosis",
    "diagnose",
    "diagnose_run",
    "capacity_need",
    "CapacityNeed",
    "smallest_card",
]

DATA_WAIT_THRESHOLD = 0.10  # share of step time spent fetching batches
HIGH_UTIL_PERCENT = 80.0  # mean utilisation counted as "busy"
LOW_UTIL_PERCENT = 70.0  # the notes: below ~70 % for most of a run, look at the input first
IDLE_UTIL_PERCENT = 10.0  # a sample at or under this is "near 0"
SWING_IDLE_SHARE = 0.20  # at least this share of samples near 0 ...
SWING_BUSY_PERCENT = 80.0  # ... with a maximum at or above this: swinging 0 <-> 100
LOW_MEMORY_SHARE = 0.60  # peak under this share of the usable budget is "memory low"
SCALING_OK = 0.80  # tokens/s per GPU at world N vs world 1
PADDING_THRESHOLD = 0.20
SHARD_WORLDS = (2, 4, 8)

SEVERITIES = ("high", "medium", "info")


@dataclass(frozen=True)
class Finding:
    """One bottleneck: a key, a human name, the evidence (numbers), one line of fix."""

    key: str  # memory | data_loading | batch_larger | small_batch | communication | capacity | padding | ...
    bottleneck: str
    evidence: str
    fix: str
    severity: str = "medium"
    numbers: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Diagnosis:
    """The findings for one probe, most important first; ``mfu`` when it could be computed."""

    status: str
    label: str
    findings: tuple[Finding, ...] = ()
    mfu: float | None = None

    @property
    def headline(self) -> str:
        if self.findings:
            return self.findings[0].bottleneck
        return "no bottleneck found" if self.status == "ok" else self.status

    def keys(self) -> list[str]:
        return [f.key for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "label": self.label,
            "headline": self.headline,
            "mfu": self.mfu,
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass(frozen=True)
class RunDiagnosis:
    """Run-level findings, the chosen configuration's diagnosis, and every probe's."""

    findings: tuple[Finding, ...]
    chosen: Diagnosis | None
    probes: tuple[tuple[ProbeResult, Diagnosis], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "chosen": self.chosen.to_dict() if self.chosen else None,
            "probes": [d.to_dict() for _, d in self.probes],
        }


# --------------------------------------------------------------------------------- helpers


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _gb(n: float) -> str:
    """Decimal GB, as cards are sold (and as the notes say "a card with at least X GB")."""
    return f"{n / 1e9:.0f} GB" if n >= 10e9 else f"{n / 1e9:.1f} GB"


def _request(result: ProbeResult) -> ProbeRequest | None:
    try:
        return result.probe_request()
    except Exception:  # a malformed stored request: diagnose from the metrics alone
        return None


def _num(metrics: Mapping[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _on_cpu(result: ProbeResult, req: ProbeRequest | None) -> bool:
    dt = (result.env or {}).get("device_type")
    if dt is not None:
        return bool(dt == "cpu")
    if req is not None and req.settings.device == "cpu":
        return True
    return "gpu_util_samples" not in result.metrics and "cpu_util_mean" in result.metrics


def _usable(result: ProbeResult, req: ProbeRequest | None) -> float | None:
    m = result.metrics
    u = _num(m, "usable_bytes")
    if u:
        return u
    b = _num(m, "budget_bytes")
    if b:
        headroom = req.settings.headroom if req else 0.0
        return b * (1 - headroom)
    if req is not None:
        ub = req.settings.usable_bytes()
        return float(ub) if ub else None
    return None


def _util_stats(samples: Sequence[float]) -> dict[str, float]:
    vals = [float(s) for s in samples if isinstance(s, (int, float))]
    if not vals:
        return {}
    return {
        "mean": statistics.fmean(vals),
        "stdev": statistics.pstdev(vals),
        "max": max(vals),
        "idle_share": sum(1 for v in vals if v <= IDLE_UTIL_PERCENT) / len(vals),
        "n": float(len(vals)),
    }


def smallest_card(need_bytes: float, catalog: Iterable[GPU] | None = None) -> GPU | None:
    """The catalog card with the least memory that still holds ``need_bytes``."""
    cards = sorted(builtin_catalog() if catalog is None else catalog, key=lambda g: g.memory_bytes)
    return next((g for g in cards if g.memory_bytes >= need_bytes), None)


# --------------------------------------------------------------------------------- capacity


@dataclass(frozen=True)
class CapacityNeed:
    """What would remove an offload-only fit: the memory one card needs, and the source of it."""

    need_bytes: float | None
    source: str  # "estimate" | "measured" | "unknown"
    shard_world: int | None = None  # fewest GPUs (ZeRO-3, no offload) predicted to fit the budget


def capacity_need(
    result: ProbeResult,
    *,
    config: Mapping[str, Any] | None = None,
    measured_no_offload_peak: float | None = None,
    gpu: GPU | None = None,
) -> CapacityNeed:
    """Memory a single card needs to run ``result``'s configuration without offload.

    From the estimator (same configuration, no offload, no sharding, one GPU; plus the probe's
    headroom) when the model config is given, and the smallest peak measured among the run's
    non-offload configurations that went over budget (a lower bound): the larger of the two; an
    estimate at or under the budget contradicts the measurements and is dropped.
    """
    req = _request(result)
    headroom = req.settings.headroom if req else 0.05
    budget = req.settings.budget_bytes if req else None
    measured = measured_no_offload_peak / (1 - headroom) if measured_no_offload_peak else None
    estimate: float | None = None
    shard_world: int | None = None
    if req is not None and config:
        c = req.candidate
        single = dataclasses.replace(
            c, offload="none", zero_stage=0, world_size=1, grad_accum=c.grad_accum * c.world_size
        )
        try:
            estimate = predict_peak_bytes(req.workload, single, config, "cuda", gpu) / (1 - headroom)
        except (SpecError, KeyError, ValueError):
            estimate = None
        if estimate is not None and budget and estimate <= budget:
            estimate = None  # the estimator thinks it fits without offload: trust the measurements instead
        if estimate is not None and budget:
            for n in SHARD_WORLDS:
                sharded = dataclasses.replace(
                    c,
                    offload="none",
                    zero_stage=3,
                    world_size=n,
                    sharding="deepspeed",
                    grad_accum=max(1, c.grad_accum * c.world_size // n),
                )
                try:
                    p = predict_peak_bytes(req.workload, sharded, config, "cuda", gpu)
                except (SpecError, KeyError, ValueError):
                    break
                if p <= budget * (1 - headroom):
                    shard_world = n
                    break
    if estimate is not None and (measured is None or estimate >= measured):
        return CapacityNeed(estimate, "estimate", shard_world)
    if measured is not None:
        return CapacityNeed(measured, "measured", shard_world)
    return CapacityNeed(None, "unknown")


def _capacity_finding(need: CapacityNeed, c: Candidate, mode: str, tps: float | None) -> Finding:
    what = {"optimizer": "optimizer states", "params": "parameters and optimizer states"}.get(
        c.offload, c.offload
    )
    evidence = f"{what} offloaded to CPU memory: every step moves them over PCIe"
    if tps:
        evidence += f" ({tps:,.0f} tok/s)"
    options: list[str] = []
    numbers: dict[str, float] = {}
    if need.need_bytes:
        card = smallest_card(need.need_bytes)
        label = "predicted" if need.source == "estimate" else "measured, a lower bound"
        options.append(
            f"a card with at least {_gb(need.need_bytes)} ({label}"
            + (f"; e.g. {card.name}" if card else "; larger than any card in the catalog")
            + ")"
        )
        numbers["need_bytes"] = float(need.need_bytes)
    else:
        options.append("a card with more memory than the budget")
    if need.shard_world:
        options.append(f"{need.shard_world} GPUs sharding with ZeRO-3 (no offload)")
        numbers["shard_world"] = float(need.shard_world)
    else:
        options.append("more GPUs to shard over (ZeRO-3/FSDP)")
    if mode == "full":
        options.append("LoRA or QLoRA (4-bit base) instead of full fine-tuning")
    elif mode == "lora":
        options.append("QLoRA (4-bit base)")
    return Finding(
        key="capacity",
        bottleneck="capacity limit (PCIe-bound offload)",
        evidence=evidence,
        fix="not a tuning problem; what removes it: " + ", or ".join(options),
        severity="high",
        numbers=numbers,
    )


# --------------------------------------------------------------------------------- per probe


def _memory_finding(result: ProbeResult, req: ProbeRequest | None, usable: float | None) -> Finding:
    m = result.metrics
    peak = _num(m, "peak_mem_bytes")
    numbers: dict[str, float] = {}
    if result.status == "over_budget" and peak and usable:
        evidence = f"peak {format_bytes(int(peak))} > usable budget {format_bytes(int(usable))} ({_pct(peak / usable)})"
        numbers = {"peak_mem_bytes": peak, "usable_bytes": usable}
    else:
        reason = " ".join((result.reason or "out of memory").split())
        evidence = reason[:160]
        if peak:
            evidence += f"; peak before failing {format_bytes(int(peak))}"
            numbers["peak_mem_bytes"] = peak
    levers: list[str] = []
    if req is not None:
        c, w = req.candidate, req.workload
        if c.precision in ("fp32", "tf32"):
            levers.append("bf16 mixed precision (about halves activations)")
        if not c.grad_ckpt:
            levers.append("activation checkpointing")
        if c.micro_batch > 1:
            levers.append(f"a smaller micro-batch than {c.micro_batch} with more accumulation")
        levers.append(f"a shorter sequence than {w.seq_len}")
        if w.mode == "full":
            levers.append("LoRA/QLoRA")
        elif w.mode == "lora":
            levers.append("QLoRA")
        if c.world_size > 1 and c.zero_stage < 3:
            levers.append("ZeRO-3 sharding")
        levers.append("a smaller model")
    else:
        levers = ["bf16", "checkpointing", "a smaller micro-batch", "a shorter sequence", "a smaller model"]
    return Finding(
        key="memory",
        bottleneck="out of memory" if result.status == "oom" else "over the memory budget",
        evidence=evidence,
        fix="try " + ", ".join(levers),
        severity="high",
        numbers=numbers,
    )


def _data_fix(c: Candidate | None) -> str:
    steps: list[str] = []
    if c is None or c.workers == 0:
        steps.append(ADVICE["workers"])
    else:
        steps.append(f"more dataloader workers than {c.workers}")
    if c is None or not c.pin_memory:
        steps.append(ADVICE["pin_memory"])
    steps.append("pre-tokenize the dataset once and cache it (Arrow/Parquet)")
    return ", ".join(steps)


def _crash_fix(result: ProbeResult) -> str:
    """What to do about a crash: a probe that raised has a traceback to show; a process that was killed
    (``ProbeResult.died``: a signal, the kernel's out-of-memory killer) leaves none."""
    if result.died:
        return ("its process was killed and left no traceback: look at the machine's memory and other work "
                "(e.g. `dmesg | grep -i kill`), then probe it again")
    return "rerun as `autotune --debug probe ...` to see the traceback"


def _status_finding(result: ProbeResult) -> Finding:
    """The one finding of a probe that did not run to the end for a reason other than memory."""
    return Finding(
        key=result.status,
        bottleneck={"unsupported": "not possible here", "timeout": "probe timed out",
                    "crash": "probe crashed"}.get(result.status, result.status),
        evidence=" ".join((result.reason or "no reason recorded").split())[:200],
        fix={"unsupported": "drop this choice on this machine (the reason says what it needs)",
             "timeout": "raise --probe-timeout, or a smaller configuration",
             "crash": _crash_fix(result)}.get(result.status, ""),
        severity="info",
    )  # fmt: skip


@dataclass(frozen=True)
class _Probe:
    """What one probe that ran measured, as the per-probe rules read it, and the context they need."""

    result: ProbeResult
    req: ProbeRequest | None
    gpu: GPU | None
    config: Mapping[str, Any] | None
    single_gpu_tokens_per_s: float | None
    measured_no_offload_peak: float | None
    cpu: bool
    usable: float | None
    util_mean: float | None  # in percent of the device (GPU: NVML; CPU: share of the cores, x100)
    stats: dict[str, float]  # of the GPU utilisation samples (empty on a CPU)
    unit: str

    @property
    def c(self) -> Candidate | None:
        return self.req.candidate if self.req else None

    @property
    def tps(self) -> float | None:
        return self.result.tokens_per_s

    @property
    def wait(self) -> float | None:
        return _num(self.result.metrics, "data_wait_fraction")

    @property
    def peak(self) -> float | None:
        return _num(self.result.metrics, "peak_mem_bytes")

    @property
    def mem_share(self) -> float | None:
        peak, usable = self.peak, self.usable
        return (peak / usable) if peak and usable else None

    @property
    def swinging(self) -> bool:
        """Utilisation swinging 0 <-> 100 %: enough samples, many near 0, a maximum near 100."""
        stats = self.stats
        return bool(
            stats
            and stats["n"] >= 5
            and stats["idle_share"] >= SWING_IDLE_SHARE
            and stats["max"] >= SWING_BUSY_PERCENT
        )


def _utilisation(m: Mapping[str, Any], cpu: bool) -> tuple[float | None, dict[str, float], str]:
    """(mean utilisation in percent of the device, GPU sample statistics, the unit's name)."""
    util_mean: float | None
    stats: dict[str, float] = {}
    if cpu:
        cu = _num(m, "cpu_util_mean")
        util_mean = 100 * cu if cu is not None else None
        unit = "CPU utilisation"
    else:
        samples = m.get("gpu_util_samples") or []
        stats = _util_stats(samples) if isinstance(samples, list) else {}
        gm = _num(m, "gpu_util_mean")
        util_mean = gm if gm is not None else stats.get("mean")
        unit = "GPU utilisation"
    return util_mean, stats, unit


def _measured(
    result: ProbeResult,
    req: ProbeRequest | None,
    *,
    gpu: GPU | None,
    config: Mapping[str, Any] | None,
    single_gpu_tokens_per_s: float | None,
    measured_no_offload_peak: float | None,
) -> _Probe:
    """The figures the per-probe rules judge, read once from ``result``'s metrics."""
    cpu = _on_cpu(result, req)
    util_mean, stats, unit = _utilisation(result.metrics, cpu)
    return _Probe(
        result=result, req=req, gpu=gpu, config=config, single_gpu_tokens_per_s=single_gpu_tokens_per_s,
        measured_no_offload_peak=measured_no_offload_peak, cpu=cpu, usable=_usable(result, req),
        util_mean=util_mean, stats=stats, unit=unit,
    )  # fmt: skip


def _rule_capacity(p: _Probe, found: Sequence[Finding]) -> list[Finding]:
    """Capacity limit first: with offload the PCIe traffic dominates whatever else is seen."""
    c = p.c
    if c is None or c.offload == "none":
        return []
    need = capacity_need(
        p.result, config=p.config, measured_no_offload_peak=p.measured_no_offload_peak, gpu=p.gpu
    )
    return [_capacity_finding(need, c, p.req.workload.mode if p.req else "full", p.tps)]


def _rule_data_loading(p: _Probe, found: Sequence[Finding]) -> list[Finding]:
    """Data loading: a large measured data wait, or utilisation swinging 0 <-> 100 %."""
    wait, stats, unit = p.wait, p.stats, p.unit
    if not ((wait is not None and wait >= DATA_WAIT_THRESHOLD) or p.swinging):
        return []
    bits: list[str] = []
    numbers: dict[str, float] = {}
    if wait is not None:
        bits.append(f"{_pct(wait)} of step time waiting for batches")
        numbers["data_wait_fraction"] = wait
    if p.swinging:
        bits.append(
            f"{unit} swings 0↔{stats['max']:.0f}% ({_pct(stats['idle_share'])} of samples ≤ "
            f"{IDLE_UTIL_PERCENT:.0f}%, mean {stats['mean']:.0f}%)"
        )
        numbers.update({"util_idle_share": stats["idle_share"], "util_max": stats["max"]})
    elif p.util_mean is not None:
        bits.append(f"{unit} mean {p.util_mean:.0f}%")
    evidence = "; ".join(bits)
    if p.swinging and (wait is None or wait < DATA_WAIT_THRESHOLD):
        evidence += (
            " — the measured data wait is small, so host-side work between steps (logging, "
            "synchronisation, CPU preprocessing inside the step) is the other suspect"
        )
    return [
        Finding("data_loading", "data loading / CPU preprocessing", evidence, _data_fix(p.c), "high", numbers)
    ]


def _rule_batch_larger(p: _Probe, found: Sequence[Finding]) -> list[Finding]:
    """Batch could be larger: busy device, memory mostly unused."""
    c, util_mean, mem_share = p.c, p.util_mean, p.mem_share
    busy = util_mean is not None and util_mean >= HIGH_UTIL_PERCENT
    if not (busy and mem_share is not None and mem_share < LOW_MEMORY_SHARE and c is not None):
        return []
    evidence = (
        f"{p.unit} mean {util_mean:.0f}%, peak memory {format_bytes(int(p.peak or 0))} = "
        f"{_pct(mem_share)} of the usable budget {format_bytes(int(p.usable or 0))}"
    )
    if c.grad_ckpt:
        fix = "turn activation checkpointing off (saves its ~20–30% recompute); then a larger micro-batch"
    elif c.grad_accum > 1:
        fix = f"{ADVICE['micro_batch']} (now micro-batch {c.micro_batch}, accumulation {c.grad_accum})"
    else:
        fix = (
            "the micro-batch is already the whole effective batch; the free memory allows a "
            "larger effective batch or longer sequences"
        )
    return [
        Finding("batch_larger", "batch could be larger", evidence, fix, "medium",
                {"util_mean": float(util_mean or 0), "memory_share": mem_share})
    ]  # fmt: skip


def _rule_small_batch(p: _Probe, found: Sequence[Finding]) -> list[Finding]:
    """Device underused, and not because of data: small per-step work / launch overhead."""
    c, cpu, util_mean = p.c, p.cpu, p.util_mean
    data_found = any(f.key == "data_loading" for f in found)
    offloading = c is not None and c.offload != "none"
    if not (util_mean is not None and util_mean < LOW_UTIL_PERCENT and not data_found and not offloading):
        return []
    parts: list[str] = []
    if cpu:
        parts.append("check that nothing else competes for the cores (such measurements are noisy)")
    if c is None or c.grad_accum > 1:
        parts.append(f"{ADVICE['micro_batch']} (more work per step)")
    if not cpu:
        parts.append("torch.compile / fused kernels (Liger) cut per-kernel launch overhead")
    elif c is not None and c.grad_accum == 1:
        parts.append(
            "the micro-batch is already the whole effective batch: a small model leaves threads idle"
        )
    fix = "; ".join(parts)
    return [
        Finding("small_batch", "CPU underused (small per-step work or contention)"
                if cpu else "GPU underused (small per-step work)",
                f"{p.unit} mean {util_mean:.0f}% with little data wait"
                + (f" ({_pct(p.wait)})" if p.wait is not None else ""),
                fix, "medium", {"util_mean": float(util_mean)})
    ]  # fmt: skip


def _rule_scaling(p: _Probe, found: Sequence[Finding]) -> list[Finding]:
    """Multi-GPU scaling: tokens/s per GPU against the same configuration on one GPU."""
    c, tps, single = p.c, p.tps, p.single_gpu_tokens_per_s
    if not (c is not None and c.world_size > 1 and tps and single):
        return []
    per_gpu = tps / c.world_size
    eff = per_gpu / single
    if eff < SCALING_OK:
        return [
            Finding(
                "communication",
                "poor multi-GPU scaling (communication)",
                f"{per_gpu:,.0f} tok/s per GPU on {c.world_size} GPUs vs {single:,.0f} "
                f"on 1: {_pct(eff)} scaling efficiency",
                "larger per-GPU micro-batches (fewer all-reduces per token), overlap_comm, a lower "
                "ZeRO stage; check the interconnect (NVLink/P2P) is used",
                "high",
                {"scaling_efficiency": eff},
            )
        ]
    return []


def _rule_padding(p: _Probe, found: Sequence[Finding]) -> list[Finding]:
    """Padding: a large share of padded token slots without packing."""
    pad = _num(p.result.metrics, "padding_fraction")
    if not (pad is not None and pad >= PADDING_THRESHOLD and p.c is not None and not p.c.packing):
        return []
    return [
        Finding("padding", "padding", f"{_pct(pad)} of token slots are padding",
                "enable packing (padding-free, with per-sequence attention masks)", "medium",
                {"padding_fraction": pad})
    ]  # fmt: skip


def _rule_kernels(p: _Probe, found: Sequence[Finding]) -> list[Finding]:
    """GPU kernels the card could run faster: fp32 on a bf16 card, eager attention."""
    c, gpu = p.c, p.gpu
    if p.cpu or c is None or gpu is None:
        return []
    out: list[Finding] = []
    if c.precision == "fp32" and gpu.bf16:
        out.append(
            Finding("precision", "fp32 on a bf16-capable GPU", f"{gpu.name} has bf16 tensor cores; fp32 leaves them idle",
                    "bf16=True (changes numerics slightly); or at least tf32", "info")
        )  # fmt: skip
    if c.attn == "eager":
        out.append(
            Finding("attention", "unfused (eager) attention", "eager attention materialises the s×s scores",
                    ADVICE["attn"], "info")
        )  # fmt: skip
    return out


# the per-probe rules, in the order their findings are listed before sorting by severity; each sees the
# findings of the rules before it
_PROBE_RULES = (
    _rule_capacity,
    _rule_data_loading,
    _rule_batch_larger,
    _rule_small_batch,
    _rule_scaling,
    _rule_padding,
    _rule_kernels,
)


def diagnose(
    result: ProbeResult,
    *,
    gpu: GPU | None = None,
    config: Mapping[str, Any] | None = None,
    single_gpu_tokens_per_s: float | None = None,
    measured_no_offload_peak: float | None = None,
    mfu: float | None = None,
) -> Diagnosis:
    """The notes' table applied to one probe.

    ``gpu``: the catalog entry it ran on (enables the precision/attention advice and a card name).
    ``config``: the model's config.json dict (capacity need from the estimator).
    ``single_gpu_tokens_per_s``: the same configuration measured on one GPU (scaling check).
    ``measured_no_offload_peak``: fallback capacity figure (see :func:`capacity_need`).
    ``mfu``: precomputed MFU to carry in the diagnosis.
    """
    req = _request(result)
    c = req.candidate if req else None
    label = candidate_label(c) if c is not None else "?"
    if result.status in ("oom", "over_budget"):
        return Diagnosis(result.status, label, (_memory_finding(result, req, _usable(result, req)),), mfu)
    if result.status != "ok":
        return Diagnosis(result.status, label, (_status_finding(result),), mfu)
    p = _measured(
        result, req, gpu=gpu, config=config, single_gpu_tokens_per_s=single_gpu_tokens_per_s,
        measured_no_offload_peak=measured_no_offload_peak,
    )
    findings: list[Finding] = []
    for rule in _PROBE_RULES:
        findings.extend(rule(p, findings))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order.get(f.severity, len(order)))
    return Diagnosis(result.status, label, tuple(findings), mfu)


# --------------------------------------------------------------------------------- run level

_SCALING_IGNORED = ("world_size", "grad_accum", "zero_stage", "offload", "sharding")


def _family(c: Candidate) -> tuple[Any, ...]:
    """Every choice but the batch split."""
    return tuple(v for k, v in dataclasses.asdict(c).items() if k not in ("micro_batch", "grad_accum"))


def _single_gpu_reference(c: Candidate, ok: list[tuple[ProbeResult, Candidate]]) -> float | None:
    """Best tokens/s of the same configuration on one GPU (world size, accumulation, sharding aside)."""
    want = {k: v for k, v in dataclasses.asdict(c).items() if k not in _SCALING_IGNORED}
    best: float | None = None
    for r, oc in ok:
        if oc.world_size != 1:
            continue
        have = {k: v for k, v in dataclasses.asdict(oc).items() if k not in _SCALING_IGNORED}
        if have == want and r.tokens_per_s:
            best = max(best or 0.0, r.tokens_per_s)
    return best


@dataclass(frozen=True)
class _Run:
    """A run's probes with their candidates (None for a malformed request), and what every probe's
    diagnosis shares: the fitting, measured ones, the capacity fallback, the card and the model config."""

    results: list[ProbeResult]
    cands: list[Candidate | None]
    ok: list[tuple[ProbeResult, Candidate]]
    measured_need: float | None  # smallest peak of a non-offload configuration that went over budget
    gpu: GPU | None
    config: Mapping[str, Any] | None


def _run_of(
    results: list[ProbeResult], gpu: GPU | None, config: Mapping[str, Any] | None
) -> _Run:
    cands: list[Candidate | None] = []
    for r in results:
        req = _request(r)
        cands.append(req.candidate if req else None)
    ok = [(r, c) for r, c in zip(results, cands, strict=True) if r.fits and r.tokens_per_s and c is not None]
    # smallest peak measured by a non-offload configuration that did not fit: capacity fallback
    no_off = [
        float(r.peak_mem_bytes)
        for r, c in zip(results, cands, strict=True)
        if r.status == "over_budget" and r.peak_mem_bytes and c is not None and c.offload == "none"
    ]
    return _Run(results, cands, ok, min(no_off) if no_off else None, gpu, config)


def _larger_failed(run: _Run, c: Candidate) -> tuple[int, str] | None:
    """The smallest larger micro-batch of the same configuration that did not fit, if measured."""
    fam = _family(c)
    worse = [
        (oc.micro_batch, r.status)
        for r, oc in zip(run.results, run.cands, strict=True)
        if oc is not None
        and r.status in ("oom", "over_budget")
        and oc.micro_batch > c.micro_batch
        and _family(oc) == fam
    ]
    return min(worse) if worse else None


def _diagnose_in_run(run: _Run, r: ProbeResult, c: Candidate | None, m: float | None) -> Diagnosis:
    """One probe's diagnosis in its run: the scaling reference and capacity fallback from the other
    probes, and "batch could be larger" demoted when the next larger micro-batch was measured not to fit."""
    ref = _single_gpu_reference(c, run.ok) if c is not None and c.world_size > 1 else None
    d = diagnose(r, gpu=run.gpu, config=run.config, single_gpu_tokens_per_s=ref,
                 measured_no_offload_peak=run.measured_need, mfu=m)  # fmt: skip
    if c is None or "batch_larger" not in d.keys():
        return d
    failed = _larger_failed(run, c)
    if failed is None:
        return d
    mb, status = failed
    amended = tuple(
        dataclasses.replace(
            f,
            severity="info",
            bottleneck="memory looks low, but the next batch did not fit",
            fix=f"micro-batch {mb} of this configuration was measured: {status}; {c.micro_batch} is the "
            "largest that fits (activations grow with the batch), so the headroom is not usable this way",
        )
        if f.key == "batch_larger"
        else f
        for f in d.findings
    )
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return dataclasses.replace(d, findings=tuple(sorted(amended, key=lambda f: order.get(f.severity, 9))))


def _chosen_diagnosis(
    run: _Run, best: ProbeResult | None, probes: tuple[tuple[ProbeResult, Diagnosis], ...]
) -> Diagnosis | None:
    """The diagnosis of ``best``, else of the fastest probe that fits; None when there is neither."""
    chosen_result = best
    if chosen_result is None and run.ok:
        chosen_result = max(run.ok, key=lambda rc: rc[0].tokens_per_s or 0)[0]
    if chosen_result is None:
        return None
    idx = next((i for i, r in enumerate(run.results) if r is chosen_result), None)
    if idx is not None:
        return probes[idx][1]
    req = _request(chosen_result)
    return _diagnose_in_run(run, chosen_result, req.candidate if req else None, None)


def _nothing_fits_finding(run: _Run) -> Finding:
    mem_fail = [r for r in run.results if r.status in ("oom", "over_budget")]
    peaks = [float(r.peak_mem_bytes) for r in mem_fail if r.peak_mem_bytes]
    evidence = f"{len(mem_fail)} of {len(run.results)} probes ran out of memory or over budget"
    if peaks:
        evidence += f"; smallest measured peak {format_bytes(int(min(peaks)))}"
    return Finding("nothing_fits", "no configuration fits", evidence,
                   "bf16, checkpointing, micro-batch 1, a shorter sequence, LoRA/QLoRA, sharding over more "
                   "GPUs, or a larger card", "high")  # fmt: skip


def _offload_only_finding(run: _Run) -> Finding:
    ok = run.ok
    fastest = max(ok, key=lambda rc: rc[0].tokens_per_s or 0)
    req = _request(fastest[0])
    need = capacity_need(
        fastest[0], config=run.config, measured_no_offload_peak=run.measured_need, gpu=run.gpu
    )
    f = _capacity_finding(need, fastest[1], req.workload.mode if req else "full", fastest[0].tokens_per_s)
    return dataclasses.replace(
        f,
        key="offload_only",
        bottleneck="only configurations with CPU offload fit: a capacity limit (PCIe-bound)",
        evidence=(
            f"all {len(ok)} configurations that fit offload to CPU memory; "
            if len(ok) > 1
            else "the one configuration that fits offloads to CPU memory; "
        )
        + f.evidence,
    )


def _run_data_loading_finding(
    run: _Run, probes: tuple[tuple[ProbeResult, Diagnosis], ...]
) -> Finding | None:
    """Data loading as a run-level finding, when any fitting probe waits for data."""
    counts: dict[str, int] = {}
    for r, d in probes:
        if r.fits:
            for k in set(d.keys()):
                counts[k] = counts.get(k, 0) + 1
    if not counts.get("data_loading"):
        return None
    return Finding("data_loading", "data loading limits throughput",
                   f"{counts['data_loading']} of {len(run.ok)} fitting probes wait for data",
                   _data_fix(None), "medium")  # fmt: skip


def _run_findings(run: _Run, probes: tuple[tuple[ProbeResult, Diagnosis], ...]) -> list[Finding]:
    """The run as a whole: nothing fits, only offload fits, data loading across the fitting probes."""
    out: list[Finding] = []
    if not run.ok:
        out.append(_nothing_fits_finding(run))
    elif all(c.offload != "none" for _, c in run.ok):
        out.append(_offload_only_finding(run))
    if run.ok:
        data = _run_data_loading_finding(run, probes)
        if data is not None:
            out.append(data)
    return out


def diagnose_run(
    results: Iterable[ProbeResult],
    *,
    best: ProbeResult | None = None,
    gpu: GPU | None = None,
    config: Mapping[str, Any] | None = None,
    mfus: Sequence[float | None] | None = None,
) -> RunDiagnosis:
    """Diagnose every probe, the chosen configuration (``best``, else the fastest that fits), and
    the run as a whole (e.g. "only offload configurations fit", "nothing fits")."""
    results = list(results)
    run = _run_of(results, gpu, config)
    mfu_list = list(mfus) if mfus is not None else [None] * len(results)
    if len(mfu_list) != len(results):
        raise ValueError(f"mfus must have one entry per result: {len(mfu_list)} for {len(results)}")
    probes = tuple(
        (r, _diagnose_in_run(run, r, c, m)) for r, c, m in zip(results, run.cands, mfu_list, strict=True)
    )
    chosen = _chosen_diagnosis(run, best, probes)
    return RunDiagnosis(tuple(_run_findings(run, probes)), chosen, probes)
