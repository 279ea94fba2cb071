"""The probe worker: one configuration, measured through ``transformers.Trainer`` in a fresh process.

Run as ``python -m autotune.probe.worker REQUEST.json RESULT.json`` by an executor. It always tries
to leave a RESULT.json (status ok | oom | over_budget | unsupported | timeout | crash); a process
that dies without one is classified by the parent (crash, with exit code/signal and stderr tail).

A distributed candidate (world size > 1, or a ZeRO/FSDP stage) runs one of these per rank, started
by ``autotune.probe.launch`` with RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set: each rank
measures its own window and memory into its own result file, and the launcher merges them. The
TrainingArguments (DeepSpeed config or FSDP) are built before the model there, so a ZeRO-3 model
is built already partitioned, as the HF docs prescribe.

Measurement protocol (nanoGPT's, through the Trainer the user will run):
warm-up steps, then a window of timed optimizer steps. Each step's time runs from the end of the
previous step to the end of this one, with ``torch.cuda.synchronize()`` at both ends on GPU, so it
includes fetching the batches (data-loader starvation shows) as well as forward, backward and the
optimizer. Throughput counts only real tokens (the collator reports them), never padding.

Short probes (``autotune.spec.probe_window``): the Trainer runs at a small probe accumulation, each
micro-step is timed too (CUDA events on a GPU, so nothing extra is synchronised), and the step at
the candidate's true accumulation is composed from a non-boundary micro-step and the boundary
(``autotune.probe.compose``). The window stops once the composed figure is stable. The result's
request, and everything emitted from it, keep the true accumulation.

The worker runs in stages (``run_probe_in_process``): the window and device, the arguments derived
from ``autotune.formats`` (model, training_args) (computed once: the model's, the adapter's, the
TrainingArguments), the meter of the device kind (CPU: RSS growth and perf_counter marks; GPU: the
CUDA context, the allocator cap, NVML and CUDA events), then build -> trainer -> train -> verdict.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from autotune.probe.failure import classify_exception
from autotune.spec.budget import format_bytes
from autotune.spec.probe_request import ALLOC_CONF_VARS, ProbeRequest
from autotune.spec.probe_window import ProbeWindow, probe_window
from autotune.spec.result import ProbeResult
from autotune.store.atomic import write_json_atomic

__all__ = ["import_modeling_module", "run_probe_in_process", "main"]



def compiled_graphs() -> int:
    """Graphs torch.compile (dynamo) has compiled in this process so far (0 without dynamo loaded)."""
    mod = sys.modules.get("torch._dynamo.utils")
    if mod is None:
        return 0
    try:
        return int(mod.counters["stats"]["unique_graphs"])
    except Exception:
        return 0


def _resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise _Unsupported("device cuda requested but torch sees no CUDA GPU")
    return requested


class _Unsupported(Exception):
    """A configuration this device or installation cannot run (status ``unsupported``)."""


def _precheck(req: ProbeRequest, device: str) -> None:
    """Refuse what cannot work here, with the reason, before spending time on it."""
    import importlib.util

    import torch

    c, w = req.candidate, req.workload
    if c.attn == "flash_attention_2":
        if device != "cuda":
            raise _Unsupported("flash_attention_2 needs a CUDA GPU (sm80+); this probe runs on cpu")
        major, _ = torch.cuda.get_device_capability()
        if major < 8:
            raise _Unsupported(f"flash_attention_2 needs sm80+; this GPU is sm{major}x")
        if c.precision not in ("bf16", "fp16"):
            raise _Unsupported(
                f"flash_attention_2 runs in fp16/bf16 only; precision {c.precision} keeps the attention inputs"
                " in fp32: use precision bf16 (or fp16), or attn sdpa"
            )
        if importlib.util.find_spec("flash_attn") is None:
            raise _Unsupported("flash_attention_2 needs the flash-attn package: pip install flash-attn")
    if c.attn == "flex_attention" and device == "cpu":
        raise _Unsupported("flex_attention has no backward pass on cpu in torch; use sdpa or eager")
    if c.precision == "fp16" and device == "cpu":
        raise _Unsupported("fp16 mixed precision needs a GPU (torch AMP fp16 is CUDA-only in the Trainer)")
    if c.precision == "tf32" and device == "cpu":
        raise _Unsupported("tf32 is a CUDA matmul mode; use fp32 on cpu")
    if c.precision == "bf16" and device == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        # torch's default counts emulation (bf16 on a T4/V100 runs, several times slower than fp16)
        raise _Unsupported("bf16 is not supported natively by this GPU (needs sm80+); use fp16")
    if c.precision == "tf32" and device == "cuda" and torch.cuda.get_device_capability()[0] < 8:
        raise _Unsupported("tf32 needs an Ampere or newer GPU (sm80+)")
    if w.mode == "qlora" or c.optim in ("adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit"):
        what = "qlora" if w.mode == "qlora" else c.optim
        if device != "cuda":
            raise _Unsupported(f"{what} needs bitsandbytes on a CUDA GPU")
        if importlib.util.find_spec("bitsandbytes") is None:
            raise _Unsupported(f"{what} needs bitsandbytes: pip install 'autotune[gpu]'")
    if c.liger and importlib.util.find_spec("liger_kernel") is None:
        raise _Unsupported("liger kernels need the liger-kernel package: pip install 'autotune[gpu]'")
    if c.liger and device != "cuda":
        raise _Unsupported("liger kernels are Triton kernels and need a GPU")
    if w.trainer == "trl":
        from autotune.probe.trl_probe import trl_unsupported_reason

        why = trl_unsupported_reason(req)
        if why is not None:
            raise _Unsupported(why)
    if c.world_size > 1 or c.zero_stage > 0:
        _precheck_distributed(req, device)


def dist_env() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) set by the launcher, or None outside a distributed probe."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank = int(os.environ["RANK"])
    return rank, int(os.environ.get("LOCAL_RANK", rank)), int(os.environ["WORLD_SIZE"])


def _precheck_distributed(req: ProbeRequest, device: str) -> None:
    import importlib.util

    import torch

    c, w = req.candidate, req.workload
    if c.zero_stage > 0 and c.sharding == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise _Unsupported(
            f"ZeRO-{c.zero_stage} with sharding=deepspeed needs deepspeed: pip install 'autotune[deepspeed]'"
            " (or sharding=fsdp: FSDP full_shard stands in for ZeRO-3, shard_grad_op for ZeRO-1/2)"
        )
    if device == "cuda" and c.world_size > torch.cuda.device_count():
        raise _Unsupported(
            f"world_size {c.world_size} needs {c.world_size} GPUs; {torch.cuda.device_count()} visible"
        )
    if w.mode == "qlora" and c.zero_stage > 0:
        raise _Unsupported("qlora's 4-bit base is not sharded by ZeRO/FSDP in this probe; use zero_stage 0")
    if c.sharding == "fsdp" and c.zero_stage > 0 and c.offload != "none" and device == "cpu":
        raise _Unsupported("FSDP CPU offload moves parameters off a GPU; this probe runs on cpu")
    de = dist_env()
    if de is None:
        raise _Unsupported(
            "a distributed probe (world_size > 1 or ZeRO/FSDP) runs through autotune.probe.launch, "
            "which sets RANK/WORLD_SIZE for each rank"
        )
    if de[2] != c.world_size:
        raise _Unsupported(
            f"WORLD_SIZE={de[2]} in the environment, but the candidate's world_size is {c.world_size}"
        )


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _build_model(req: ProbeRequest, device: str, mk: dict[str, Any]) -> Any:
    """Random-weight model from config.json, built directly on the target device and dtype
    (``mk``: the emitted model kwargs, ``attn_implementation`` and ``dtype``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    w = req.workload
    dtype = _torch_dtype(mk["dtype"])
    # a fresh config object per model: from_config(dtype=...) mutates the config it is given
    cfg = AutoConfig.from_pretrained(
        w.model_path, trust_remote_code=w.trust_remote_code, local_files_only=True
    )
    if getattr(cfg, "use_cache", None) is not None:
        cfg.use_cache = False  # training: no KV cache
    # the same seed gives the same initial weights (autotune.run's verification compares two configurations'
    # loss trajectories; without it the weights came from whatever the RNG had been used for)
    torch.manual_seed(w.seed)
    if w.mode == "qlora":
        return _build_qlora_base(cfg, mk, w)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            cfg,
            dtype=dtype,
            attn_implementation=mk["attn_implementation"],
            trust_remote_code=w.trust_remote_code,
        )
    return model


def _build_qlora_base(cfg: Any, mk: dict[str, Any], w: Any) -> Any:
    """4-bit NF4 base: bitsandbytes quantizes at load time, from the random-weight checkpoint built
    once per (config, dtype, seed) and cached (autotune.probe.qlora_base)."""
    from autotune.probe.qlora_base import load_qlora_base

    return load_qlora_base(cfg, mk, w, device_index=qlora_device_index())


def qlora_device_index() -> int:
    """The GPU a 4-bit base is loaded on: this rank's (LOCAL_RANK), as the Trainer will use it."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def _apply_peft(model: Any, req: ProbeRequest, emitted: _Emitted) -> Any:
    w = req.workload
    if w.mode == "full":
        return model
    from peft import LoraConfig, get_peft_model

    if w.mode == "qlora":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=req.candidate.grad_ckpt)
    # the emitted lora_config.json's own arguments, with the targets this model has
    cfg = LoraConfig(**emitted.lora_for(model, w.lora_targets))
    return get_peft_model(model, cfg)


def _make_trainer_class(base: Any = None) -> Any:
    """``base``: the trainer class measured (default ``transformers.Trainer``; TRL's ``SFTTrainer``
    for ``--trainer trl``)."""
    from autotune.probe.collate import measured_trainer_class

    class ProbeTrainer(measured_trainer_class(base)):  # type: ignore[misc]
        """The Trainer ``train.py`` runs (the data's sampler order, the collator's counts popped per
        optimizer step), plus timing: ``get_batch_samples`` fetches the micro-batches of one
        optimizer step, so timing it gives the time spent waiting for data.
        """

        probe_meter: _Meter

        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            meter = self.probe_meter
            meter.fetch_started()
            n_before = len(getattr(self, "step_counts", ()))
            batches, n_items = super().get_batch_samples(epoch_iterator, num_batches, device)
            counts = self.step_counts[-1] if len(self.step_counts) > n_before else (0, 0, 0, 0)
            meter.fetch_done(*counts)
            return batches, n_items

        def create_accelerator_and_postprocess(self) -> Any:
            out = super().create_accelerator_and_postprocess()
            _fsdp_on_cpu(self)
            return out

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            self.probe_meter.micro_started(inputs)
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.probe_meter.micro_done()
            self.probe_meter.add_loss(loss)
            return loss

    return ProbeTrainer


def _fsdp_on_cpu(trainer: Any) -> None:
    """Let FSDP run on cpu (gloo), so that CI exercises the sharded path the GPUs run.

    accelerate 1.15 turns an FSDP plugin into ``DistributedType.FSDP`` only for accelerator devices;
    with ``use_cpu`` it silently falls back to DDP (MULTI_CPU). FSDP2 (``fully_shard``) itself works
    on cpu, so here the state is switched to FSDP with the plugin the TrainingArguments describe.
    """
    args = trainer.args
    plugin_args = getattr(args, "fsdp_plugin_args", None)
    if not args.use_cpu or not plugin_args:
        return
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU or getattr(state, "fsdp_plugin", None) is not None:
        return
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**plugin_args)
    state.distributed_type = DistributedType.FSDP
    trainer.is_fsdp_enabled = True


def _timed_request(req: ProbeRequest, window: ProbeWindow) -> ProbeRequest:
    """The request the Trainer runs: the window's accumulation, warm-up and step count."""
    import dataclasses

    c, s = req.candidate, req.settings
    if c.grad_accum == window.grad_accum and s.warmup_steps == window.warmup_steps:
        return req
    return dataclasses.replace(
        req,
        candidate=dataclasses.replace(c, grad_accum=window.grad_accum),
        settings=dataclasses.replace(s, warmup_steps=window.warmup_steps),
    )


def _cpu_mark() -> Any:
    return time.perf_counter()


def _cuda_mark() -> Any:
    """A CUDA event on the current stream: it times the GPU's work without a host synchronisation."""
    import torch

    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def _mark_seconds(a: Any, b: Any) -> float:
    if isinstance(a, float):
        return b - a
    return float(a.elapsed_time(b)) / 1000.0  # both recorded before the step's synchronize()


class _Meter:
    """Per-optimizer-step records, filled by the trainer subclass and the step-end callback.

    ``micro_times[j]``: the forward + backward time of each micro-step of step ``j``, from marks
    taken around ``training_step`` (perf_counter on cpu; CUDA events on a GPU, resolved after the
    step's synchronize()).
    """

    def __init__(self, sync: Any, mark: Any = _cpu_mark, *, window: ProbeWindow | None = None,
                 true_accum: int = 1, collective_stop: bool = False) -> None:
        self.sync = sync
        self.mark = mark
        self.window = window
        self.true_accum = true_accum
        self.collective_stop = collective_stop
        self.micro_times: list[list[float]] = []
        self.micro_slots: list[list[int]] = []  # input_ids.numel() of each micro-batch (rows x padded length)
        self._slots: list[int] = []
        # the largest micro-batch's tensors (input_ids, labels, masks; a packed 4D mask is L x L):
        # the Trainer fetches a step's micro-batches up front, on the device, so A of them are held
        self.max_batch_bytes = 0
        self._marks: list[tuple[Any, Any]] = []
        self._micro_t0: Any = None
        self.stopped_early_at: int | None = None
        self.first_fetch_t: float | None = None
        self.step_end_t: list[float] = []
        self.fetch_wait: list[float] = []
        self.tokens: list[int] = []
        self.sequences: list[int] = []
        self.rows: list[int] = []
        self.slots: list[int] = []
        self.losses: list[float] = []
        # compiled graphs so far, at the end of each step: a rise inside the timed window is a
        # recompile that the window's time includes
        self.graphs: list[int] = []
        self._t_fetch = 0.0
        self._loss_acc: Any = None

    def fetch_started(self) -> None:
        now = time.perf_counter()
        if self.first_fetch_t is None:
            self.sync()
            now = time.perf_counter()
            self.first_fetch_t = now
        self._t_fetch = now

    def fetch_done(self, tokens: int, sequences: int, rows: int, slots: int) -> None:
        self.fetch_wait.append(time.perf_counter() - self._t_fetch)
        self.tokens.append(tokens)
        self.sequences.append(sequences)
        self.rows.append(rows)
        self.slots.append(slots)

    def add_loss(self, loss: Any) -> None:
        self._loss_acc = loss if self._loss_acc is None else self._loss_acc + loss

    def micro_started(self, inputs: Any = None) -> None:
        ids = inputs.get("input_ids") if isinstance(inputs, dict) else None
        self._slots.append(int(ids.numel()) if ids is not None and hasattr(ids, "numel") else 0)
        if isinstance(inputs, dict):
            size = sum(int(v.numel()) * int(v.element_size()) for v in inputs.values()
                       if hasattr(v, "numel") and hasattr(v, "element_size"))
            self.max_batch_bytes = max(self.max_batch_bytes, size)
        self._micro_t0 = self.mark()

    def micro_done(self) -> None:
        if self._micro_t0 is not None:
            self._marks.append((self._micro_t0, self.mark()))
            self._micro_t0 = None

    def step_end(self) -> None:
        self.sync()
        self.step_end_t.append(time.perf_counter())
        self.micro_times.append([_mark_seconds(a, b) for a, b in self._marks])
        self._marks = []
        self.micro_slots.append(self._slots)
        self._slots = []
        self.graphs.append(compiled_graphs())
        if self._loss_acc is not None:
            self.losses.append(float(self._loss_acc.float().item()))
            self._loss_acc = None

    def timed_durations(self) -> list[float]:
        """The timed steps so far (after the warm-up), each from the previous step's end."""
        if self.first_fetch_t is None or self.window is None:
            return []
        ends = [self.first_fetch_t, *self.step_end_t]
        durations = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        w = self.window.warmup_steps
        return durations[w : w + self.window.max_timed_steps]

    def composed(self) -> Any:
        """The timed window so far at the true accumulation (``autotune.probe.compose``), or None
        when the window does not compose or has no timed step yet."""
        win = self.window
        durations = self.timed_durations()
        if win is None or not win.composed or not durations:
            return None
        from autotune.probe.compose import compose_window

        w, n = win.warmup_steps, len(durations)
        return compose_window(
            step_times=durations, fetch_wait=self.fetch_wait[w : w + n], micro_times=self.micro_times[w : w + n],
            tokens=self.tokens[w : w + n], sequences=self.sequences[w : w + n], slots=self.slots[w : w + n],
            probe_accum=win.grad_accum, true_accum=self.true_accum,
            micro_slots=self.micro_slots[w : w + n] if len(self.micro_slots) >= w + n else None,
        )

    def rel_error(self) -> float | None:
        """Relative standard error of the window's tokens/s so far (jackknife over timed steps)."""
        from autotune.probe.compose import jackknife_rel_error

        comp = self.composed()
        if comp is not None:
            return comp.info["rel_std_error"]
        durations = self.timed_durations()
        w = self.window.warmup_steps if self.window is not None else 0
        return jackknife_rel_error(self.tokens[w : w + len(durations)], durations)

    def should_stop(self) -> bool:
        """The adaptive rule: at least ``min_timed_steps`` timed, and the estimate's relative standard
        error at most ``STABLE_REL_ERROR`` (every rank's, in a distributed probe)."""
        from autotune.spec.probe_window import STABLE_REL_ERROR

        win = self.window
        if win is None or not win.adaptive:
            return False
        n = len(self.timed_durations())
        if n < win.min_timed_steps or n >= win.max_timed_steps:
            return False
        rel = self.rel_error()
        stable = rel is not None and rel <= STABLE_REL_ERROR
        if self.collective_stop:
            stable = _all_ranks(stable)
        if stable:
            self.stopped_early_at = n
        return stable


def _all_ranks(flag: bool) -> bool:
    """True only if every rank's ``flag`` is (a one-element all-reduce; every rank calls it at the
    same step, so no rank stops while another waits for it in a collective)."""
    import torch
    import torch.distributed as tdist

    if not tdist.is_available() or not tdist.is_initialized():
        return flag
    dev = "cuda" if tdist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1 if flag else 0], device=dev, dtype=torch.int32)
    tdist.all_reduce(t, op=tdist.ReduceOp.MIN)
    return bool(int(t.item()))


def _make_callback(meter: _Meter) -> Any:
    from transformers import TrainerCallback

    class _StepClock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            meter.step_end()
            if meter.should_stop():
                control.should_training_stop = True
            return control

    return _StepClock()


# ---------------------------------------------------------------------------------------------
# The probe in stages: begin (window, device) -> emit-derived arguments -> meter (one per device
# kind) -> distributed set-up -> build -> trainer -> train -> verdict. A stage that settles the
# probe early raises _Stop with its result; run_probe_in_process returns it.
# ---------------------------------------------------------------------------------------------


class _Stop(Exception):
    """A stage's verdict before the end of the probe: ``result`` is what the probe returns."""

    def __init__(self, result: ProbeResult) -> None:
        super().__init__(result.status)
        self.result = result


@dataclass
class _Probe:
    """One probe's request, window, clocks and the metrics/env its result carries."""

    req: ProbeRequest
    timed: ProbeRequest  # what the Trainer runs: the probe's accumulation and warm-up
    window: ProbeWindow
    launch_time: float
    result_path: str | None
    t_start: float = field(default_factory=time.perf_counter)
    wall0: float = field(default_factory=time.time)
    reqd: dict[str, Any] = field(default_factory=dict)  # the request as asked (true accumulation)
    metrics: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)

    def result(self, status: str, reason: str = "") -> ProbeResult:
        self.metrics["wall_s"] = time.time() - self.launch_time
        return ProbeResult(status=status, request=self.reqd, reason=reason, metrics=self.metrics, env=self.env)

    def stop(self, status: str, reason: str = "") -> NoReturn:
        raise _Stop(self.result(status, reason))

    def record_window(self, meter: _Meter) -> None:
        _record_window(self.metrics, meter, self.window, self.launch_time, self.wall0, self.t_start)


@dataclass(frozen=True)
class _Emitted:
    """The emit-derived arguments of one probe, computed once (``_emitted``) from the request and the
    device: what the emitted train.py builds the model with, its lora_config.json (the targets are
    resolved against the built model, ``lora_for``) and the TrainingArguments the probe runs."""

    model_kwargs: dict[str, Any]  # attn_implementation, dtype
    lora: dict[str, Any] | None  # None for full fine-tuning
    training_args: dict[str, Any]  # everything but output_dir

    def lora_for(self, model: Any, requested: tuple[str, ...] | list[str]) -> dict[str, Any]:
        from autotune.formats.model import lora_target_modules

        assert self.lora is not None
        leaf_names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        return {**self.lora, "target_modules": lora_target_modules(leaf_names, requested)}


def _emitted(req: ProbeRequest, timed: ProbeRequest, device: str) -> _Emitted:
    from transformers import TrainingArguments

    from autotune.formats.model import lora_config, model_kwargs
    from autotune.formats.training_args import probe_kwargs

    fields = set(TrainingArguments.__dataclass_fields__)
    return _Emitted(
        model_kwargs=model_kwargs(req.candidate, req.workload),
        lora=lora_config(req.workload),
        training_args=probe_kwargs(timed, fields=fields, device=device),
    )


def run_probe_in_process(
    req: ProbeRequest, *, launch_time: float, result_path: str | None = None
) -> ProbeResult:
    """Measure ``req`` in this process. Never raises for a failed configuration.

    Stages: ``_begin`` (the window, the imports), ``_device_stage`` (device, pre-checks, rank),
    ``_emitted`` (the emit-derived arguments, once), the meter of this device kind
    (``_start_cpu_meter`` / ``_start_gpu_meter``), then ``_measure``: distributed set-up, build,
    trainer (TRL or HF), train, verdict.
    """
    probe = _begin(req, launch_time, result_path)
    try:
        device, dist = _device_stage(probe)
        emitted = _emitted(req, probe.timed, device)
        dm = _start_cpu_meter(probe) if device == "cpu" else _start_gpu_meter(probe.metrics, req.settings.budget_bytes)
    except _Stop as stop:
        return stop.result
    out_dir = tempfile.mkdtemp(prefix="autotune-trainer-")
    try:
        _preload_libraries(req)
        return _measure(probe, device, dist, emitted, dm, out_dir)
    except _Stop as stop:
        return stop.result
    finally:
        dm.stop()
        import shutil

        shutil.rmtree(out_dir, ignore_errors=True)


def _begin(req: ProbeRequest, launch_time: float, result_path: str | None) -> _Probe:
    """The window this probe runs, recorded; then the imports whose time is fixed overhead."""
    window = probe_window(req.settings, req.candidate, req.workload)
    probe = _Probe(req=req, timed=_timed_request(req, window), window=window, launch_time=launch_time,
                   result_path=result_path, reqd=req.to_dict())
    if window.warmup_steps != req.settings.warmup_steps:
        probe.metrics["warmup_steps_extended_to"] = window.warmup_steps
    probe.metrics["window"] = {
        "probe_grad_accum": window.grad_accum, "composed": window.composed, "adaptive": window.adaptive,
        "warmup_steps": window.warmup_steps, "min_timed_steps": window.min_timed_steps,
        "max_timed_steps": window.max_timed_steps,
    }
    import torch  # noqa: F401
    import transformers  # noqa: F401  (import time belongs to the fixed overhead)

    probe.metrics["import_s"] = time.perf_counter() - probe.t_start
    return probe


def _device_stage(probe: _Probe) -> tuple[str, tuple[int, int, int] | None]:
    """The device, the environment's fingerprint, the pre-checks and this rank's place (if distributed)."""
    import torch

    from autotune.env import fingerprint
    from autotune.probe.launch import is_distributed

    req, metrics, env = probe.req, probe.metrics, probe.env
    try:
        device = _resolve_device(req.settings.device)
    except _Unsupported as exc:
        env.update(fingerprint())
        probe.stop("unsupported", str(exc))
    env.update(fingerprint(device))
    env["device_type"] = device
    try:
        _precheck(req, device)
    except _Unsupported as exc:
        probe.stop("unsupported", str(exc))
    dist = dist_env() if is_distributed(req.candidate) else None
    if dist is not None:
        metrics["rank"] = dist[0]
        env["rank"] = dist[0]
        if device == "cuda":
            torch.cuda.set_device(dist[1])  # LOCAL_RANK picks this rank's GPU among the visible ones
    metrics["budget_bytes"] = req.settings.budget_bytes
    metrics["usable_bytes"] = req.settings.usable_bytes()
    return device, dist


class _DeviceMeter:
    """What a probe measures with on its kind of device (``_CpuMeter``, ``_GpuMeter``): the step
    marks and synchronisation the step meter uses, and the memory and utilisation samplers."""

    kind: str
    sampler: Any = None  # RssSampler on cpu
    nvml: Any = None  # NvmlSampler on a GPU

    def sync(self) -> None:
        return None

    def mark(self) -> Any:
        raise NotImplementedError

    def before_build(self, metrics: dict[str, Any]) -> None:
        return None

    def stop(self) -> None:
        raise NotImplementedError

    def record_memory(self, metrics: dict[str, Any], usable: int | None) -> None:
        _record_memory(metrics, self.kind, self.sampler, self.nvml, usable)


class _CpuMeter(_DeviceMeter):
    """A CPU probe's meter: perf_counter marks, nothing to synchronise, memory as the RSS growth
    over a baseline taken just before the build (and past the budget the probe stops at once)."""

    kind = "cpu"
    mark = staticmethod(_cpu_mark)  # type: ignore[assignment]

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def before_build(self, metrics: dict[str, Any]) -> None:
        self.sampler.rebase()
        metrics["rss_baseline_bytes"] = self.sampler.baseline
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()


class _GpuMeter(_DeviceMeter):
    """A GPU probe's meter: CUDA-event marks, a synchronize() at each step's end, memory from torch's
    allocator and NVML (sampled from the start: the CUDA context is measured before the build)."""

    kind = "cuda"
    mark = staticmethod(_cuda_mark)  # type: ignore[assignment]

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize()

    def stop(self) -> None:
        self.nvml.stop()


def _start_cpu_meter(probe: _Probe) -> _CpuMeter:
    import torch

    from autotune.probe.memory import RssSampler

    req, settings = probe.req, probe.req.settings
    budget = settings.budget_bytes
    # Threads as the emitted train.py will have them: torch's default (OMP_NUM_THREADS, else the
    # physical cores this process may use). Pinning os.cpu_count() here measured another
    # program: it counts SMT siblings and CPUs outside the affinity mask, and overrode the
    # user's OMP_NUM_THREADS. Only an explicit cpu_threads setting, or the ranks of a distributed
    # CPU probe (which share the cores), set a count.
    if settings.cpu_threads or req.candidate.world_size > 1:
        torch.set_num_threads(settings.cpu_threads or max(1, (os.cpu_count() or 1) // req.candidate.world_size))
    probe.env["torch_threads"] = torch.get_num_threads()  # what was measured with

    def over_limit(growth: int) -> None:
        # the CPU stand-in for a capped GPU: past the budget itself, stop at once
        probe.metrics["mem_rss_growth_bytes"] = growth
        probe.metrics["peak_mem_bytes"] = growth
        res = probe.result(
            "over_budget",
            f"memory grew by {format_bytes(growth)}, past the budget {format_bytes(budget)}; stopped mid-run",
        )
        if probe.result_path:
            write_json_atomic(probe.result_path, res.to_dict())
        os._exit(0)

    return _CpuMeter(RssSampler(limit_bytes=budget, on_exceed=over_limit if budget else None))


def _start_gpu_meter(metrics: dict[str, Any], budget: int | None, *, nvml: Any = None) -> _GpuMeter:
    """NVML sampling from before the CUDA context exists, the context measured, the allocator capped
    at the budget less the context. ``nvml``: an ``NvmlSampler`` (default: this GPU's)."""
    import torch

    from autotune.probe.memory import NvmlSampler

    if nvml is None:
        nvml = NvmlSampler(device_index=_nvml_index(torch.cuda.current_device()))
    nvml.sample_once()
    device_used_before = nvml.peak_device_used_bytes
    nvml.peak_device_used_bytes = None
    torch.cuda.init()
    _load_cuda_libraries(torch)
    nvml.sample_once()
    context = None
    if nvml.peak_process_bytes is not None:
        context = nvml.peak_process_bytes - torch.cuda.memory_reserved()
        metrics["cuda_context_source"] = "NVML process memory - torch reserved, after a cuBLAS matmul"
    elif nvml.peak_device_used_bytes is not None and device_used_before is not None:
        # the process is not visible to NVML (a PID namespace): the device's growth, exact only
        # while nothing else allocates on this GPU
        context = nvml.peak_device_used_bytes - device_used_before - torch.cuda.memory_reserved()
        metrics["cuda_context_source"] = "NVML device used growth - torch reserved, after a cuBLAS matmul"
    metrics["cuda_context_bytes"] = context
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    metrics["device_memory_bytes"] = int(total)
    if budget is not None and budget < total:
        cap = budget - (context or 0)
        torch.cuda.set_per_process_memory_fraction(max(0.01, min(1.0, cap / total)))
        metrics["allocator_cap_bytes"] = int(cap)
    # TF32 is decided in one place only, TrainingArguments(tf32=...) from probe_kwargs (what the
    # emitted run does too); setting torch's legacy flag here as well contradicted it for fp16 and
    # mixes torch's two TF32 APIs (transformers sets torch.backends.fp32_precision)
    nvml.start()
    return _GpuMeter(nvml)


def _measure(
    probe: _Probe, device: str, dist: tuple[int, int, int] | None, emitted: _Emitted, dm: _DeviceMeter,
    out_dir: str,
) -> ProbeResult:
    """Distributed set-up, build, trainer, train, verdict."""
    early_args = _distributed_setup(probe, emitted, out_dir) if dist is not None else None
    dm.before_build(probe.metrics)
    model = _build_stage(probe, device, emitted, dm)
    meter = _Meter(dm.sync, dm.mark, window=probe.window, true_accum=probe.req.candidate.grad_accum,
                   collective_stop=dist is not None)
    trainer = _trainer_stage(probe, model, device, emitted, meter, dm, out_dir, early_args)
    if dist is not None:
        # what the Trainer made of it: DEEPSPEED / FSDP / MULTI_CPU (DDP) / MULTI_GPU, and the backend
        state = trainer.accelerator.state
        probe.metrics["distributed_type"] = str(getattr(state.distributed_type, "value", state.distributed_type))
        probe.metrics["dist_backend"] = getattr(state, "backend", None)
    _train_stage(probe, trainer, meter, dm)
    if dist is not None:
        # evidence of the sharding: DTensor under FSDP2, a 0-size local tensor under ZeRO-3
        p0 = next(trainer.model_wrapped.parameters(), None)
        if p0 is not None:
            probe.metrics["param_type"] = type(p0).__name__
            probe.metrics["param_local_numel"] = int(p0.numel())
    return _verdict(probe, meter, dm)


def _distributed_setup(probe: _Probe, emitted: _Emitted, out_dir: str) -> Any:
    """TrainingArguments before the model, as the HF docs ask for DeepSpeed: its config is then
    registered and a ZeRO-3 model is built already partitioned (zero.Init) by from_config.
    Touching .device initialises the process group (gloo on cpu, nccl on GPUs)."""
    import torch._dynamo  # noqa: F401  (zero.Init fails without it imported first)

    c = probe.req.candidate
    try:
        args = _training_args(emitted, out_dir)
        _ = args.device
        if c.zero_stage > 0 and c.sharding == "deepspeed":
            # deepspeed.comm wraps the process group now, else zero.Init's config counts 1 rank
            import deepspeed
            import torch.distributed as tdist

            deepspeed.init_distributed(dist_backend=tdist.get_backend())
    except Exception as exc:
        status, reason = classify_exception(exc)
        probe.stop(status, f"distributed setup: {reason}")
    return args


def _build_stage(probe: _Probe, device: str, emitted: _Emitted, dm: _DeviceMeter) -> Any:
    req, metrics = probe.req, probe.metrics
    t_build = time.perf_counter()
    try:
        model = _build_model(req, device, emitted.model_kwargs)
        if req.workload.trainer != "trl":  # SFTTrainer applies lora_config.json itself, as train_sft.py
            model = _apply_peft(model, req, emitted)
    except Exception as exc:  # build failures: OOM for huge models, unsupported attention, ...
        status, reason = classify_exception(exc)
        dm.record_memory(metrics, req.settings.usable_bytes())
        probe.stop(status, f"building the model: {reason}")
    metrics["build_s"] = time.perf_counter() - t_build
    # ZeRO-3 partitions parameters at build: ds_numel is the full size of each one
    metrics["num_params"] = int(sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()))
    metrics["trainable_params"] = int(
        sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)
    )
    return model


def _trainer_stage(
    probe: _Probe, model: Any, device: str, emitted: _Emitted, meter: _Meter, dm: _DeviceMeter,
    out_dir: str, early_args: Any,
) -> Any:
    """The Trainer that is timed: TRL's SFTTrainer as train_sft.py builds it, or the HF Trainer on
    autotune's own batches. A data error is a crash with its reason; any other failure is classified."""
    from autotune.errors import DatasetError, SpecError

    req, metrics = probe.req, probe.metrics
    usable = req.settings.usable_bytes()
    trl = req.workload.trainer == "trl"
    try:
        if trl:
            from autotune.probe.trl_probe import build_sft_trainer

            trainer = build_sft_trainer(
                probe.timed, model, trainer_base=_make_trainer_class(_sft_trainer_class()), out_dir=out_dir,
                device=device, callbacks=[_make_callback(meter)], num_optimizer_steps=probe.window.max_optimizer_steps,
                worst_case_first=usable is not None, metrics=metrics,
                lora=emitted.lora_for(model, req.workload.lora_targets) if emitted.lora is not None else None,
            )
            # SFTTrainer applied the adapter: count again, as the hf probe counts after _apply_peft
            params = list(trainer.model.parameters())
            metrics["num_params"] = int(sum(p.numel() for p in params))
            metrics["trainable_params"] = int(sum(p.numel() for p in params if p.requires_grad))
        else:
            trainer = _hf_trainer(probe, model, emitted, meter, out_dir=out_dir, early_args=early_args)
    except (DatasetError, SpecError) as exc:
        probe.stop("crash", f"data: {exc}")
    except Exception as exc:
        status, reason = classify_exception(exc)
        dm.record_memory(metrics, usable)
        probe.stop(status, f"building the {'SFTTrainer' if trl else 'Trainer'}: {reason}")
    trainer.probe_meter = meter
    return trainer


def _train_stage(probe: _Probe, trainer: Any, meter: _Meter, dm: _DeviceMeter) -> None:
    t_train = time.perf_counter()
    try:
        trainer.train()
    except Exception as exc:
        status, reason = classify_exception(exc)
        dm.record_memory(probe.metrics, probe.req.settings.usable_bytes())
        probe.record_window(meter)
        probe.stop(status, f"training: {reason}")
    probe.metrics["train_s"] = time.perf_counter() - t_train


def _verdict(probe: _Probe, meter: _Meter, dm: _DeviceMeter) -> ProbeResult:
    """The window, utilisation and memory recorded; then ok, or why not (no window, over the budget)."""
    metrics, window, settings = probe.metrics, probe.window, probe.req.settings
    usable = settings.usable_bytes()
    probe.record_window(meter)
    _record_utilisation(metrics, meter, window, dm.sampler, dm.nvml)
    dm.record_memory(metrics, usable)
    _add_prefetched_batches(metrics, meter, window, probe.req.candidate.grad_accum)
    if metrics.get("tokens_per_s") is None:
        return probe.result("crash", f"no timed window completed ({len(meter.step_end_t)} optimizer steps ran, "
                                     f"{window.warmup_steps} warm-up + at least {window.min_timed_steps} timed needed)")
    peak = metrics.get("peak_mem_bytes")
    if usable is not None and peak is not None and peak > usable:
        return probe.result(
            "over_budget",
            f"peak memory {format_bytes(peak)} > usable budget {format_bytes(usable)} "
            f"({format_bytes(settings.budget_bytes)} less {settings.headroom:.0%} headroom)",
        )
    return probe.result("ok")


def _sft_trainer_class() -> Any:
    from trl import SFTTrainer

    return SFTTrainer


def _hf_trainer(probe: _Probe, model: Any, emitted: _Emitted, meter: _Meter, *, out_dir: str, early_args: Any) -> Any:
    """The ``transformers.Trainer`` the hf probe times, on autotune's own batches."""
    from autotune.probe.collate import packing_mask_dtype, pad_token_id_of
    from autotune.probe.data import build_train_data

    req, metrics = probe.timed, probe.metrics
    cfg = model.config
    data = build_train_data(
        req.workload,
        req.candidate,
        num_optimizer_steps=probe.window.max_optimizer_steps,
        vocab_size=int(cfg.vocab_size),
        pad_token_id=pad_token_id_of(cfg),
        mask_dtype=packing_mask_dtype(req.candidate.precision, emitted.model_kwargs["dtype"]),
        # longest sequences first make the measured peak the worst case: only a probe held
        # to a budget needs that; one without (autotune.run's loss comparison) needs the
        # same data order whatever the micro-batch
        worst_case_first=req.settings.usable_bytes() is not None,
    )
    metrics["token_slots_per_step"] = getattr(data, "token_slots_per_step", None)
    # what the emitters for row-counting packers (Axolotl, LLaMA-Factory) and dataset types need
    metrics["mean_seq_len"] = data.info.get("mean_seq_len")
    metrics["pack_fill"] = data.info.get("pack_fill")
    if data.info.get("column"):
        metrics["dataset_column"] = data.info["column"]

    args = early_args if early_args is not None else _training_args(emitted, out_dir)
    trainer_cls = _make_trainer_class()
    return trainer_cls(
        model=model,
        args=args,
        train_dataset=data.dataset,
        data_collator=data.collator,
        callbacks=[_make_callback(meter)],
    )


def _training_args(emitted: _Emitted, out_dir: str) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=out_dir, **emitted.training_args)


def _load_cuda_libraries(torch: Any) -> None:
    """Create the CUDA context and load cuBLAS/cuBLASLt (one small matmul per 16/32-bit dtype).

    The context measured right after ``torch.zeros(1)`` left out the cuBLAS handles and kernels
    that the first matmul loads, so ``reserved + context`` under-counted the process.
    """
    for dtype in (torch.float32, torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False)
                  else torch.float16):
        a = torch.ones(64, 64, device="cuda", dtype=dtype)
        (a @ a).sum().item()
    torch.cuda.synchronize()


def _nvml_index(torch_index: int, *, visible: str | None = None, nvml: Any = None) -> int:
    """NVML counts physical GPUs; torch counts the visible ones (CUDA_VISIBLE_DEVICES, as Ray sets it).

    Entries of CUDA_VISIBLE_DEVICES are indices or UUIDs (``GPU-8932f937-...``, or a unique prefix
    of one, as CUDA accepts): a UUID is looked up among NVML's devices. An entry that cannot be
    resolved (a MIG UUID, NVML missing) falls back to ``torch_index``.
    """
    raw = os.environ.get("CUDA_VISIBLE_DEVICES", "") if visible is None else visible
    entries = [v.strip() for v in raw.split(",") if v.strip()]
    if torch_index >= len(entries):
        return torch_index
    entry = entries[torch_index]
    if entry.isdigit():
        return int(entry)
    if not entry.upper().startswith("GPU-"):
        return torch_index
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
        for i in range(nvml.nvmlDeviceGetCount()):
            uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            if uuid.lower().startswith(entry.lower()):
                return i
    except Exception:
        pass
    return torch_index


def import_modeling_module(model_path: str | None, *, trust_remote_code: bool = False) -> None:
    """Import the modeling module of ``model_path``'s config (the build, or the probe, reports a bad config)."""
    if not model_path:
        return
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        cfg = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code, local_files_only=True)
        MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]  # imports the modeling module
    except Exception:  # noqa: S110 - the build reports what is wrong with the config
        pass


def _preload_libraries(req: ProbeRequest) -> None:
    """Import what building and training will import, before the memory baseline is taken.

    Otherwise the RSS growth of a CPU probe would include a few hundred MB of library code that
    transformers, accelerate and peft import lazily, which no configuration choice changes.
    """
    import importlib

    from transformers import Trainer, TrainingArguments  # noqa: F401

    import autotune.probe.data  # noqa: F401

    w = req.workload
    import_modeling_module(w.model_path, trust_remote_code=w.trust_remote_code)
    for name in ("accelerate", "torch.utils.data", "torch.optim"):
        importlib.import_module(name)
    if w.mode != "full":
        importlib.import_module("peft")
    c = req.candidate
    if c.zero_stage > 0 and c.sharding == "deepspeed":
        importlib.import_module("deepspeed")
    if w.trainer == "trl":
        for name in ("datasets", "trl", "trl.trainer.sft_trainer"):
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # the precheck has said what is missing


def _note_noise(metrics: dict[str, Any], rel: float, n: int, *, composed: bool) -> None:
    """A warning for a figure whose relative standard error is over ``NOISY_REL_ERROR``: a composed one is not
    combined (``composition_noisy``: the confirmation never calls it confirmed); a whole-step one stands, saying how
    little it holds (a 2-core machine under other load ran whole steps of 0.5 and 2.8 s in one window)."""
    from autotune.spec.probe_window import NOISY_REL_ERROR

    if composed:
        metrics["composition_noisy"] = True
        metrics.setdefault("warnings", []).append(
            f"the composed figure is too noisy to combine: relative standard error {rel:.0%} > "
            f"{NOISY_REL_ERROR:.0%} after {n} timed steps (other load, or a variable-length stream); "
            "re-measure on a quiet machine, with more --steps, or with --window whole")
    else:
        metrics.setdefault("warnings", []).append(
            f"the figure is noisy: relative standard error {rel:.0%} > {NOISY_REL_ERROR:.0%} over {n} timed steps "
            "(other load, or a variable-length stream); re-measure on a quiet machine or with more --steps")


def _record_window(
    metrics: dict[str, Any], meter: _Meter, window: ProbeWindow, launch_time: float, wall0: float, t0: float
) -> None:
    from autotune.probe.stats import per_step_counts, summarize_window
    from autotune.spec.probe_window import NOISY_REL_ERROR, STABLE_REL_ERROR

    if meter.first_fetch_t is None:
        return
    ends = [meter.first_fetch_t, *meter.step_end_t]
    durations = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    metrics["steps_completed"] = len(durations)
    metrics["probe_micro_batches"] = sum(len(m) for m in meter.micro_times)
    if meter.losses:
        metrics["losses"] = meter.losses
        metrics["loss_first"] = meter.losses[0]
        metrics["loss_last"] = meter.losses[-1]
    w = window.warmup_steps
    timed = meter.timed_durations()
    n = len(timed)
    if n < window.min_timed_steps:
        return
    # launch -> start of the first timed step: imports, build, data, Trainer setup, warm-up
    first_timed_start = ends[w]
    metrics["overhead_s"] = (wall0 - launch_time) + (first_timed_start - t0)
    # of which: the fixed setup (launch -> first step: imports, build, data, Trainer) and the
    # warm-up steps (the measurement's own cost, proportional to the step time)
    metrics["setup_s"] = (wall0 - launch_time) + (ends[0] - t0)
    metrics["warmup_s"] = first_timed_start - ends[0]
    metrics["probe_window_s"] = ends[w + n] - first_timed_start  # the timed steps as they ran
    # each timed step's micro-step durations as measured (forward + backward), at most 64 a step
    metrics["micro_times_s"] = [[round(t, 6) for t in m[:64]] for m in meter.micro_times[w : w + n]]
    comp = meter.composed()
    if comp is not None:
        step_times, tokens, seqs, fetch, slot_list = comp.step_times, comp.tokens, comp.sequences, comp.fetch_wait, comp.slots
        metrics["composed"] = True
        metrics["composition"] = comp.info
        rel = comp.info["rel_std_error"]
    else:
        step_times, tokens, seqs = timed, meter.tokens[w : w + n], meter.sequences[w : w + n]
        fetch, slot_list = meter.fetch_wait[w : w + n], meter.slots[w : w + n]
        metrics["composed"] = False
        rel = meter.rel_error()
    metrics["rel_std_error"] = rel
    metrics["stopped_early"] = meter.stopped_early_at is not None
    if window.adaptive:
        metrics["window_rule"] = (
            f"stop after >= {window.min_timed_steps} timed steps once the relative standard error of tokens/s "
            f"is <= {STABLE_REL_ERROR:.0%}; at most {window.max_timed_steps}"
        )
    if rel is not None and rel > NOISY_REL_ERROR:
        _note_noise(metrics, rel, n, composed=window.composed)
    metrics.update(summarize_window(step_times, tokens, seqs, fetch))
    metrics.update(per_step_counts(seqs, tokens))
    if meter.graphs and len(meter.graphs) >= w + n:
        before = meter.graphs[w - 1] if w > 0 else 0
        recompiles = meter.graphs[w + n - 1] - before
        if recompiles or meter.graphs[-1]:
            metrics["compiled_graphs"] = meter.graphs[-1]
            metrics["recompiles_in_window"] = recompiles
        if recompiles:
            metrics.setdefault("warnings", []).append(
                f"torch.compile compiled {recompiles} graph(s) inside the timed window: its tok/s includes"
                " compilation; more warm-up steps (or packing / fixed lengths, which keep shapes static) fix it"
            )
            if window.composed:  # a compile timed as a micro-step is multiplied by A - 1
                metrics["composition_noisy"] = True
    slots = sum(slot_list)
    metrics["token_slots"] = slots
    if slots:
        metrics["padding_fraction"] = max(0.0, 1.0 - metrics["real_tokens"] / slots)


def _add_prefetched_batches(metrics: dict[str, Any], meter: _Meter, window: ProbeWindow, true_accum: int) -> None:
    """A composed probe holds ``window.grad_accum`` fetched micro-batches at once; the true run holds
    ``true_accum`` (the Trainer's ``get_batch_samples`` takes a whole step's batches, which the
    data loader has already moved to the device). Add the difference to the peak."""
    if not window.composed or metrics.get("peak_mem_bytes") is None or not meter.max_batch_bytes:
        return
    extra = (true_accum - window.grad_accum) * meter.max_batch_bytes
    metrics["micro_batch_bytes"] = meter.max_batch_bytes
    metrics["prefetched_batches_extra_bytes"] = extra
    metrics["peak_mem_measured_bytes"] = metrics["peak_mem_bytes"]
    metrics["peak_mem_bytes"] = int(metrics["peak_mem_bytes"]) + extra
    metrics["memory_source"] = (str(metrics.get("memory_source", "")) + f"; + {true_accum - window.grad_accum} more "
                                "fetched micro-batches held at the true accumulation")


def _window_bounds(meter: _Meter, window: ProbeWindow) -> tuple[float, float] | None:
    """perf_counter times of the timed window's start and end, if it ran."""
    w = window.warmup_steps
    ends = [meter.first_fetch_t, *meter.step_end_t] if meter.first_fetch_t is not None else []
    if len(ends) <= w + 1:
        return None
    return ends[w], ends[-1]


def _record_utilisation(
    metrics: dict[str, Any], meter: _Meter, window: ProbeWindow, sampler: Any, nvml: Any
) -> None:
    """Utilisation during the timed window only (imports, build and warm-up would read as idle).

    CPU: mean share of the available cores this process kept busy. GPU: NVML's utilisation %.
    """
    bounds = _window_bounds(meter, window)
    if bounds is None:
        return
    t0, t1 = bounds
    if sampler is not None:
        cpu = [u for t, u in sampler.cpu_samples if t0 <= t <= t1]
        if cpu:
            metrics["cpu_util_mean"] = sum(cpu) / len(cpu)
            metrics["cpu_util_samples"] = [round(u, 3) for u in cpu[-600:]]
    if nvml is not None:
        gpu = [u for t, u in nvml.util_samples if t0 <= t <= t1]
        if gpu:
            metrics["gpu_util_samples"] = gpu[-600:]
            metrics["gpu_util_mean"] = sum(gpu) / len(gpu)


def _record_memory(metrics: dict[str, Any], device: str, sampler: Any, nvml: Any, usable: int | None) -> None:
    if device == "cpu":
        if sampler is None:
            return
        growth = sampler.growth()
        metrics["mem_rss_growth_bytes"] = growth
        metrics["peak_mem_bytes"] = growth
        metrics["memory_source"] = "peak RSS growth of the probe process over its pre-build baseline"
        return
    import torch

    reserved = int(torch.cuda.max_memory_reserved())
    metrics["mem_torch_reserved_bytes"] = reserved
    # the caching allocator's setting this process ran with (the emitted scripts set the same): the variables torch
    # reads, in its order, as the environment held them (the first one held is the one torch used, empty or not)
    metrics["cuda_alloc_conf"] = {v: os.environ[v] for v in ALLOC_CONF_VARS if v in os.environ}
    metrics["mem_torch_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    if nvml is not None:
        nvml.sample_once()
        metrics["mem_nvml_process_bytes"] = nvml.peak_process_bytes
        metrics["mem_nvml_device_used_bytes"] = nvml.peak_device_used_bytes
        # False: NVML answered but never listed this PID (a PID namespace); None: it never answered
        metrics["nvml_process_visible"] = nvml.process_visible
        metrics["nvml_processes_listed"] = nvml.max_processes_listed
        if nvml.query_errors:
            metrics["nvml_errors"] = dict(nvml.query_errors)
    context = metrics.get("cuda_context_bytes") or 0
    candidates = [reserved + context]
    nvml_peak = metrics.get("mem_nvml_process_bytes")
    if nvml_peak:
        candidates.append(int(nvml_peak))
        # what the process held outside torch's allocator at its peak (context, cuBLAS, NCCL):
        # the figure CUDA_CONTEXT_BYTES estimates
        metrics["non_torch_bytes"] = int(nvml_peak) - reserved
        metrics["memory_source"] = "max(torch max_memory_reserved + CUDA context, NVML per-process peak)"
    else:
        metrics["memory_source"] = (
            "torch max_memory_reserved + CUDA context (NVML per-process figure unavailable: "
            + ("this process is not visible to NVML)" if metrics.get("nvml_process_visible") is False
               else "NVML did not answer)")
        )
    metrics["peak_mem_bytes"] = max(candidates)


def main(argv: list[str] | None = None, *, own_process: bool = False) -> int:
    """``own_process``: run as ``__main__`` (a probe process), so it may kill itself at its deadline."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        print("usage: python -m autotune.probe.worker REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request_path, result_path = argv
    launch_time = float(os.environ.get("AUTOTUNE_LAUNCH_TIME", time.time()))
    data = json.loads(Path(request_path).read_text(encoding="utf-8"))
    req = ProbeRequest.from_dict(data)
    if own_process:  # never outlive the timeout the parent enforces, even if the parent cannot
        from autotune.probe.lifetime import DEADLINE_GRACE_S, start_deadline

        start_deadline(launch_time + float(req.settings.timeout_s) + DEADLINE_GRACE_S - time.time())
    try:
        res = run_probe_in_process(req, launch_time=launch_time, result_path=result_path)
    except Exception as exc:  # a bug or an unexpected library failure: still a result
        status, reason = classify_exception(exc)
        tb = traceback.format_exc(limit=6)
        print(tb, file=sys.stderr)
        res = ProbeResult(status=status, request=req.to_dict(), reason=reason, metrics={}, env={})
    write_json_atomic(result_path, res.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main(own_process=True))
