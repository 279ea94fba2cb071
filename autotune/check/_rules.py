"""``autotune check``: the domain notes' checklist applied to a configuration.  [pure]

Input is text already read from disk (the CLI reads it); ``parse_config`` classifies one file,
``gather`` runs every rule over a :class:`ConfigBundle` and returns a :class:`CheckReport`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.check._fit import FileLevers, FitTarget, file_levers, fit_items
from autotune.check._report import CheckItem, CheckReport
from autotune.errors import SpecError
from autotune.formats import FORMATS, checkpointed_every, translate
from autotune.spec.levers import ADVICE

__all__ = [
    "CONFIG_FILE_KINDS",
    "KINDS",
    "REMOVED_IN_V5",
    "ConfigBundle",
    "GpuInfo",
    "parse_config",
    "bundle_from_texts",
    "gather",
]

KINDS = ("training_args", "model_kwargs", "lora", "accelerate", "deepspeed", "train_script")

# TrainingArguments names transformers 5 removed (TypeError) -> the fix.
REMOVED_IN_V5: dict[str, str] = {
    "evaluation_strategy": "rename to eval_strategy",
    "no_cuda": "rename to use_cpu",
    "per_gpu_train_batch_size": "rename to per_device_train_batch_size",
    "per_gpu_eval_batch_size": "rename to per_device_eval_batch_size",
    "overwrite_output_dir": "remove it (the Trainer no longer refuses a non-empty output_dir)",
    "logging_dir": "remove it (logs go under output_dir; TensorBoard reads TENSORBOARD_LOGGING_DIR)",
    "use_ipex": "remove it (IPEX support was dropped)",
    "include_tokens_per_second": "remove it; use include_num_input_tokens_seen",
    "warmup_ratio": "use warmup_steps with a float below 1 (e.g. warmup_steps: 0.03 is 3% of the steps)",
    "torch_dtype": "pass dtype to from_pretrained instead",
}
# Deprecated aliases (still accepted, with a warning) -> the new name.
DEPRECATED_IN_V5: dict[str, str] = {
    "gradient_checkpointing": "activation_checkpointing",
    "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs",
}

CONFIG_FILE_KINDS = {
    "training_args.json": "training_args",
    "model_kwargs.json": "model_kwargs",
    "lora_config.json": "lora",
    "accelerate_config.yaml": "accelerate",
    "deepspeed.json": "deepspeed",
    "train.py": "train_script",
}


@dataclass(frozen=True)
class GpuInfo:
    """What the checks need to know about the target GPU (from the catalog)."""

    name: str
    bf16: bool
    flash_attention_2: bool
    tf32: bool


@dataclass
class ConfigBundle:
    """The parsed files of one target: a single config file or a run's ``best/`` directory."""

    target: str
    data: dict[str, Any] = field(default_factory=dict)  # kind -> parsed dict (train_script: str)
    sources: dict[str, str] = field(default_factory=dict)  # kind -> file name
    # a file in another tool's format (autotune.formats): its name, its own keys, the keys it accepts
    fmt: str = "training_args"
    native: dict[str, Any] | None = None
    known_keys: set[str] | None = None
    key_source: str = ""  # where known_keys were read (repo, path, commit)
    problems: list[str] = field(default_factory=list)  # wrongly typed values found while reading: FAILs
    # top-level keys the file sets more than once: (key, times, the lines, the value its readers keep: the last)
    repeated: list[tuple[str, int, list[int], Any]] = field(default_factory=list)
    # the local files a config names (its file, key, path, None or what is wrong: missing, a folder, a device):
    # the CLI looks at the disk, the rule FAILs each problem (the training tool would not start)
    references: list[tuple[str, str, str, str | None]] = field(default_factory=list)
    # files an answer folder (a run's best/) lacks that what is there reads: (name, what reads it)
    missing: list[tuple[str, str]] = field(default_factory=list)

    def get(self, kind: str) -> Any:
        return self.data.get(kind)


def _classify_json(d: dict[str, Any]) -> str:
    if "zero_optimization" in d or "train_micro_batch_size_per_gpu" in d or "train_batch_size" in d:
        return "deepspeed"
    if "lora_alpha" in d or ("r" in d and "target_modules" in d):
        return "lora"
    if {"attn_implementation", "quantization_config"} & set(d) or (
        set(d) and set(d) <= {"dtype", "torch_dtype"}
    ):
        return "model_kwargs"
    return "training_args"


def parse_config(name: str, text: str, *, kind: str | None = None) -> tuple[str, Any]:
    """(kind, parsed) for one file's text. Raises SpecError for text that is not a usable config."""
    lower = name.lower()
    if kind == "train_script" or lower.endswith(".py"):
        return "train_script", text
    if lower.endswith((".yaml", ".yml")):
        from autotune.spec.files import load_yaml

        data = load_yaml(text, what=name)
        if not isinstance(data, dict) or not ({"distributed_type", "compute_environment"} & set(data)):
            raise SpecError(f"{name} is not an accelerate config (no distributed_type / compute_environment)")
        return "accelerate", data
    from autotune.spec.files import load_json

    data = load_json(text, what=name)
    if not isinstance(data, dict):
        raise SpecError(f"{name} must hold a JSON object, got {type(data).__name__}")
    return (kind or _classify_json(data)), data


def bundle_from_texts(target: str, texts: dict[str, str], *, directory: bool) -> ConfigBundle:
    """Parse the files of one target. In a directory, known file names decide the kind."""
    b = ConfigBundle(target=target)
    for name in sorted(texts):
        kind_hint = CONFIG_FILE_KINDS.get(name) if directory else None
        kind, data = parse_config(name, texts[name], kind=kind_hint)
        if kind in b.data:
            raise SpecError(f"{target}: both {b.sources[kind]} and {name} look like a {kind} config")
        b.data[kind] = data
        b.sources[kind] = name
    if not b.data:
        raise SpecError(f"{target}: no config files found (expected one of {', '.join(CONFIG_FILE_KINDS)})")
    return b


# --------------------------------------------------------------------------------------------
# rules
# --------------------------------------------------------------------------------------------


class _Ctx:
    def __init__(self, b: ConfigBundle, gpu: GpuInfo | None, fields: set[str] | None, version: str | None,
                 target: FitTarget | None = None):
        self.b = b
        self.gpu = gpu
        self.target = target
        self.batch_judged = False  # the fit rule gave the micro-batch advice (from the GPU and the model)
        self.ta_set_aside = 0  # TrainingArguments keys set aside for their type (known names all: the type table's)
        self.fields = fields
        self.version = version
        self.ta: dict[str, Any] = b.get("training_args") or {}
        self.acc: dict[str, Any] = b.get("accelerate") or {}
        self.ds: dict[str, Any] = b.get("deepspeed") or self._inline_ds()
        self.mk: dict[str, Any] | None = b.get("model_kwargs")
        self.items: list[CheckItem] = []

    def _inline_ds(self) -> dict[str, Any]:
        """The DeepSpeed config given inline, or base64-encoded (transformers takes both)."""
        from autotune.formats import base64_json

        v = (self.b.get("training_args") or {}).get("deepspeed")
        v = base64_json(v) or v
        return dict(v) if isinstance(v, dict) else {}

    def src(self, kind: str) -> str:
        return self.b.sources.get(kind, "")

    def add(self, id: str, title: str, status: str, message: str, fix: str = "", source: str = "",
            figures: dict[str, Any] | None = None) -> None:
        self.items.append(
            CheckItem(id=id, title=title, status=status, message=message, fix=fix, source=source,
                      figures=dict(figures or {}))
        )

    @property
    def has_ta(self) -> bool:
        return "training_args" in self.b.data

    @property
    def says_cpu(self) -> bool:
        """The file trains on the CPU (``use_cpu``/``no_cuda``, accelerate's ``use_cpu``)."""
        return bool(self.ta.get("use_cpu") or self.ta.get("no_cuda") or self.acc.get("use_cpu"))

    @property
    def cpu(self) -> bool:
        """Judge the file as a CPU run: it says so and no ``--gpu`` asks how it fares on a GPU (checked for
        one, a CPU answer is judged as that GPU would run it once ``use_cpu`` is removed)."""
        return self.says_cpu and self.gpu is None

    def precision(self) -> tuple[str | None, str]:
        """('bf16' | 'fp16' | 'fp32' | None if unknown, where it was read)."""
        if self.has_ta:
            if self.ta.get("bf16"):
                return "bf16", self.src("training_args")
            if self.ta.get("fp16"):
                return "fp16", self.src("training_args")
            return "fp32", self.src("training_args")
        mp = self.acc.get("mixed_precision")
        if mp in ("bf16", "fp16", "fp8"):
            return ("bf16" if mp == "fp8" else mp), self.src("accelerate")
        if self.ds:
            for p in ("bf16", "fp16"):
                en = (self.ds.get(p) or {}).get("enabled")
                if en is True:
                    return p, self.src("deepspeed")
            if any((self.ds.get(p) or {}).get("enabled") == "auto" for p in ("bf16", "fp16")):
                return None, self.src("deepspeed")
            return "fp32", self.src("deepspeed")
        if mp == "no":
            return "fp32", self.src("accelerate")
        return None, ""


def _set_precision(c: _Ctx, to: str) -> str:
    """The fix that makes the file train in ``to`` (bf16/fp16), in the keys of the file its precision was read from
    (``_Ctx.precision``'s order): TrainingArguments' (and Axolotl's, LLaMA-Factory's, TRL's) bf16/fp16, accelerate's
    mixed_precision, DeepSpeed's bf16.enabled/fp16.enabled."""
    other = "fp16" if to == "bf16" else "bf16"
    mp = c.acc.get("mixed_precision")
    if c.has_ta:
        return f"set {to}: true, {other}: false"
    if mp in ("bf16", "fp16", "fp8") or (mp == "no" and not c.ds):
        return f"set mixed_precision: {to}"
    if c.ds:
        return f"set {to}.enabled: true, {other}.enabled: false"
    return f"set {to}: true, {other}: false"


def _sixteen_bit_fix(c: _Ctx) -> str:
    if c.gpu is None:
        return f"{_set_precision(c, 'bf16')} (fp16 on GPUs without bf16, e.g. T4/V100)"
    return _set_precision(c, "bf16") if c.gpu.bf16 else f"{_set_precision(c, 'fp16')} ({c.gpu.name} has no bf16)"


def _both_sixteen_bit(c: _Ctx) -> tuple[str, str] | None:
    """(what, who refuses) when the file turns bf16 and fp16 on together, which nothing starts with."""
    stated = (c.b.native or {}) if c.b.fmt == "axolotl" else c.ta  # Axolotl's bf16: auto is not a true bf16
    if stated.get("bf16") is True and stated.get("fp16") is True:
        return "bf16 and fp16 are both true", "transformers refuses to start"
    if all((c.ds.get(p) or {}).get("enabled") is True for p in ("bf16", "fp16")):
        return "bf16.enabled and fp16.enabled are both true", "DeepSpeed refuses to start"
    return None


def _bf16_elsewhere(c: _Ctx) -> None:
    """On a card without bf16, what else asks for it: the model loaded in bfloat16 (model kwargs' or TRL's ``dtype``)
    and bf16 evaluation (``bf16_full_eval``), which the precision keys alone did not show."""
    if c.gpu is None or c.gpu.bf16:
        return
    for where, dtype in (("model_kwargs", (c.mk or {}).get("dtype") or (c.mk or {}).get("torch_dtype")),
                         ("training_args", c.ta.get("dtype") or c.ta.get("torch_dtype"))):
        if isinstance(dtype, str) and dtype.removeprefix("torch.") in ("bfloat16", "bf16"):
            c.add("precision", "mixed precision", "warn", f"the model is loaded in {dtype}, which {c.gpu.name} has "
                  "no bf16 for (torch emulates it, slowly)", "dtype: float16 (beside fp16: true)", c.src(where))
            break
    if c.ta.get("bf16_full_eval") is True:
        c.add("precision", "mixed precision", "warn", f"bf16_full_eval: true, and {c.gpu.name} has no bf16 (torch "
              "emulates it, slowly)",
              "bf16_full_eval: false (fp16_full_eval: true)", c.src("training_args"))


def _rule_precision(c: _Ctx) -> None:
    title = "mixed precision"
    _bf16_elsewhere(c)
    both = _both_sixteen_bit(c)
    if both is not None:
        src = c.src("training_args") if both[1].startswith("transformers") else c.src("deepspeed")
        c.add("precision", title, "fail", f"{both[0]}: {both[1]} (at most one of them)",
              "keep one: bf16 on Ampere or newer, else fp16", src)
        return
    prec, src = c.precision()
    if prec is None and not src:
        return
    if c.cpu:
        c.add("precision", title, "info", f"CPU run ({prec or 'auto'}): bf16 autocast is slow on CPUs without AMX",
              source=src)
        return
    if prec is None:
        c.add("precision", title, "info", "DeepSpeed precision is 'auto' (taken from TrainingArguments)", source=src)
        return
    if prec == "bf16":
        if c.gpu is not None and not c.gpu.bf16:
            c.add("precision", title, "fail", f"bf16 requested but {c.gpu.name} has no bf16",
                  _set_precision(c, "fp16"), src)
        else:
            c.add("precision", title, "pass", "bf16 mixed precision", source=src)
    elif prec == "fp16":
        if c.gpu is not None and c.gpu.bf16:
            c.add("precision", title, "warn", f"fp16 on {c.gpu.name}, which has bf16 (no loss scaling needed)",
                  _set_precision(c, "bf16"), src)
        else:
            c.add("precision", title, "pass", "fp16 mixed precision", source=src)
    elif c.ta.get("tf32") is True:
        c.add("precision", title, "warn", "fp32 weights and activations with TF32 matmuls",
              _sixteen_bit_fix(c) + " to halve activation memory", src)
    else:
        c.add("precision", title, "fail", "full fp32 without bf16/fp16 or TF32 leaves the tensor cores idle",
              _sixteen_bit_fix(c), src)


def _rule_device(c: _Ctx) -> None:
    """A config that trains on the CPU, checked for a GPU: it would not use that GPU at all."""
    if not (c.says_cpu and c.gpu is not None):
        return
    key = "no_cuda" if c.ta.get("no_cuda") and not c.ta.get("use_cpu") else "use_cpu"
    src = c.src("training_args") if (c.ta.get("use_cpu") or c.ta.get("no_cuda")) else c.src("accelerate")
    c.add("device", "device", "fail",
          f"{key}: true trains on the CPU, so this config would leave the {c.gpu.name} idle (an answer tuned on a "
          "CPU: its precision and batch were measured there, not on this GPU)",
          f"remove {key}, and tune on the {c.gpu.name} itself (autotune run --device cuda there) for its own "
          "precision and batch", src)


def _rule_tf32(c: _Ctx) -> None:
    if not c.has_ta or c.cpu:
        return
    title, src = "TF32", c.src("training_args")
    tf32 = c.ta.get("tf32")
    gpu_tf32 = None if c.gpu is None else c.gpu.tf32
    if tf32 is True and gpu_tf32 is False:
        c.add(
            "tf32",
            title,
            "fail",
            f"tf32: true but {c.gpu.name if c.gpu else 'the GPU'} has no TF32 (TrainingArguments raises)",
            "remove tf32",
            src,
        )
    elif tf32 is True:
        c.add("tf32", title, "pass", "TF32 on for the remaining fp32 matmuls", source=src)
    elif gpu_tf32 is False:
        c.add("tf32", title, "info", f"{c.gpu.name if c.gpu else 'this GPU'} has no TF32", source=src)
    elif tf32 is False:
        c.add(
            "tf32",
            title,
            "warn",
            "tf32: false keeps fp32 matmuls off the tensor cores",
            "set tf32: true (Ampere or newer)",
            src,
        )
    elif c.ta.get("torch_compile") and (c.ta.get("bf16") or not c.ta.get("fp16")):
        # TrainingArguments turns TF32 on by itself only for torch_compile (its __post_init__, transformers 4 and 5)
        c.add(
            "tf32",
            title,
            "info",
            "tf32 unset: with torch_compile, transformers turns TF32 on by itself where the GPU has it",
            "state tf32: true to make it explicit",
            src,
        )
    elif c.ta.get("bf16"):
        c.add("tf32", title, "info", "tf32 unset: the few fp32 matmuls left beside bf16 run without TF32 (PyTorch's "
              "default; transformers turns it on by itself only with torch_compile)", "set tf32: true on Ampere or "
              "newer", src)
    elif not c.ta.get("fp16"):
        c.add("tf32", title, "warn", "tf32 unset: fp32 matmuls run without TF32, off the tensor cores (PyTorch's "
              "default; transformers turns it on by itself only with torch_compile)", "set tf32: true on Ampere or "
              "newer, or train in bf16", src)
    else:
        c.add(
            "tf32",
            title,
            "warn",
            "tf32 unset with fp16: the remaining fp32 matmuls run without TF32",
            "set tf32: true on Ampere or newer",
            src,
        )


def _batch(c: _Ctx) -> tuple[int | None, int | None, str]:
    if c.has_ta:
        mb = c.ta.get("per_device_train_batch_size", 8)
        acc = c.ta.get("gradient_accumulation_steps", 1)
        return (
            (mb if isinstance(mb, int) else None),
            (acc if isinstance(acc, int) else None),
            c.src("training_args"),
        )
    if c.ds:
        mb = c.ds.get("train_micro_batch_size_per_gpu")
        acc = c.ds.get("gradient_accumulation_steps", 1)
        return (
            (mb if isinstance(mb, int) else None),
            (acc if isinstance(acc, int) else None),
            c.src("deepspeed"),
        )
    return None, None, ""


def _world(c: _Ctx) -> int | None:
    """accelerate's num_processes is the total over all machines: the data-parallel world."""
    n = c.acc.get("num_processes")
    return n if isinstance(n, int) and n >= 1 else None


def _rule_batch(c: _Ctx) -> None:
    mb, acc, src = _batch(c)
    title = "micro-batch / accumulation"
    if mb is None:
        return
    if c.ta.get("auto_find_batch_size"):
        c.add(
            "batch",
            title,
            "warn",
            "auto_find_batch_size retries after OOM in the same process and changes the "
            "effective batch silently",
            "set per_device_train_batch_size explicitly (autotune run measures it)",
            src,
        )
    if c.batch_judged:
        return
    if mb == 1 and (acc or 1) >= 4:
        _rule_small_micro_batch(c, acc, src)
    else:
        c.add("batch", title, "pass", f"micro-batch {mb} x accumulation {acc}", source=src)


# tokens in one micro-batch from which a larger micro-batch gains little: every layer's matmuls already have
# that many rows (a 4,096-row GEMM against a 4,096-wide weight runs near a GPU's peak; fewer rows waste it)
LONG_MICRO_BATCH_TOKENS = 4096
_FIX_SMALL = f"{ADVICE['micro_batch']} (autotune run measures what fits)"


def _seq_len(c: _Ctx) -> int | None:
    """The sequence length the file states (TRL max_length, Axolotl sequence_len, LLaMA-Factory cutoff_len)."""
    native = c.b.native if c.b.native is not None else c.ta
    if not native or c.b.fmt not in FORMATS:
        return None
    try:
        seq = FORMATS[c.b.fmt].to_request(native).get("seq_len")
    except (TypeError, AttributeError, ValueError, KeyError):
        return None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else None


def _rule_small_micro_batch(c: _Ctx, acc: Any, src: str) -> None:
    """Micro-batch 1 under accumulation: small for short sequences, enough for long ones; judged by the tokens
    per micro-batch where the file states its sequence length."""
    title, seq = "micro-batch / accumulation", _seq_len(c)
    if seq is not None and seq >= LONG_MICRO_BATCH_TOKENS:
        c.add("batch", title, "info", f"micro-batch 1 of {seq} tokens x accumulation {acc}: long sequences keep a "
              "GPU's matmuls large; a larger micro-batch gains little unless memory is spare", source=src)
    elif seq is not None:
        c.add("batch", title, "warn", f"micro-batch 1 of {seq} tokens with accumulation {acc}: too few tokens per "
              "micro-batch to keep the GPU busy", _FIX_SMALL, src)
    else:
        c.add("batch", title, "info", f"micro-batch 1 with accumulation {acc}: few tokens per micro-batch unless "
              f"the sequences are long ({LONG_MICRO_BATCH_TOKENS:,}+ tokens)", _FIX_SMALL, src)


def _file_request(c: _Ctx) -> dict[str, Any]:
    """What the file asks for as ``run --from`` reads it: its format's request fields (model, mode, sequence
    length, levers); a TrainingArguments view where the file has no format of its own (a best/ directory)."""
    from autotune.formats import training_args

    native = c.b.native if c.b.native is not None else None
    try:
        if native and c.b.fmt in FORMATS:
            return dict(FORMATS[c.b.fmt].to_request(native))
        return dict(training_args.to_request(c.ta)) if c.has_ta else {}
    except (TypeError, AttributeError, ValueError, KeyError):
        return {}


def _offload(c: _Ctx) -> str:
    zero = (c.ds.get("zero_optimization") or {}) if c.ds else {}
    on = {k for k in ("offload_optimizer", "offload_param") if (zero.get(k) or {}).get("device") in ("cpu", "nvme")}
    return "params" if "offload_param" in on else "optimizer" if on else "none"


def _fit_levers(c: _Ctx, req: dict[str, Any]) -> FileLevers:
    """The file's levers for the planner: its request, the keys only its TrainingArguments view or its own
    format names (optimizer, Liger), and what the bundle shows of PEFT, the world and ZeRO offload."""
    native = c.b.native or {}
    if c.b.fmt == "axolotl":  # its own keys for the optimizer and Liger's fused loss
        req.setdefault("optim", native.get("optimizer", c.ta.get("optim")))
        req.setdefault("liger", bool(native.get("liger_fused_linear_cross_entropy")))
    stage = (c.ds.get("zero_optimization") or {}).get("stage") if c.ds else None
    if isinstance(stage, int):
        req.setdefault("zero_stage", stage)
    assumed: list[str] = []
    mode = req.get("mode")
    if mode is None:
        lora, mk = c.b.get("lora"), c.mk or {}
        if (mk.get("quantization_config") or {}).get("load_in_4bit"):
            mode = "qlora"
        elif lora:
            mode = "lora"
            req.setdefault("lora_r", lora.get("r", 16))
            if lora.get("target_modules"):
                req.setdefault("lora_targets", tuple(lora["target_modules"]))
        else:
            mode = "full"
            if c.mk is None and not (c.target and c.target.mode):
                assumed.append("full fine-tuning, the file names no PEFT (--mode)")
    f = file_levers(req, c.ta, mode=mode, world=_world(c) or 1, precision=c.precision()[0], offload=_offload(c),
                    trainer="trl" if c.b.fmt == "trl" else "hf")  # an SFTConfig trains through TRL's fused LM head
    return dataclasses.replace(f, assumed=(*assumed, *f.assumed))


def requested_model(bundle: ConfigBundle) -> str | None:
    """The model a training file names (TRL/LLaMA-Factory ``model_name_or_path``, Axolotl ``base_model``)."""
    model = _file_request(_Ctx(bundle, None, None, None)).get("model")
    return model if isinstance(model, str) and model.strip() else None


def _rule_fit(c: _Ctx) -> None:
    """With ``--gpu`` and a model: the file's predicted peak on that GPU, and the micro-batch to use there."""
    if c.target is None or c.cpu:
        return
    mb, acc, src = _batch(c)
    if mb is None or acc is None:
        c.add("fit", f"memory on {c.target.gpu.name}", "info", "not judged: the file states no micro-batch "
              "(per_device_train_batch_size) and accumulation", "check the training config that states them",
              src or next(iter(c.b.sources.values()), ""))
        return
    req = _file_request(c)
    req.update(micro_batch=mb, grad_accum=acc)
    for id_, title, status, message, fix, figures in fit_items(c.target, _fit_levers(c, req)):
        c.add(id_, title, status, message, fix, src, figures)
    c.batch_judged = True  # the micro-batch is judged on the GPU (or the fit's FAIL names the one that fits)


def _rule_effective_batch(c: _Ctx) -> None:
    mb, acc, src = _batch(c)
    title = "effective batch"
    if mb is None and not c.has_ta:
        return
    if c.has_ta and "per_device_train_batch_size" not in c.ta:
        c.add(
            "effective_batch",
            title,
            "warn",
            "per_device_train_batch_size not stated (HF default 8 is used)",
            "state per_device_train_batch_size and gradient_accumulation_steps",
            src,
        )
        return
    world = _world(c)
    if mb is None or acc is None:
        c.add(
            "effective_batch",
            title,
            "info",
            "set by DeepSpeed 'auto' values from TrainingArguments",
            source=src,
        )
        return
    if world is None:
        c.add(
            "effective_batch",
            title,
            "pass",
            f"{mb} x {acc} = {mb * acc} per process (x the number of processes)",
            source=src,
        )
    else:
        c.add(
            "effective_batch",
            title,
            "pass",
            f"{mb} x {acc} x {world} = {mb * acc * world} sequences per step",
            source=src,
        )
    tbs = c.ds.get("train_batch_size") if c.ds else None
    if isinstance(tbs, int) and world is not None and tbs != mb * acc * world:
        c.add(
            "effective_batch",
            title,
            "fail",
            f"DeepSpeed train_batch_size {tbs} != {mb} x {acc} x {world} = {mb * acc * world}",
            "set train_batch_size to 'auto' (or remove it)",
            c.src("deepspeed"),
        )


def _rule_memory_levers(c: _Ctx) -> None:
    if not (c.has_ta or c.mk is not None or c.ds or c.acc):
        return
    parts = []
    ckpt = False
    if c.has_ta:
        ckpt = bool(c.ta.get("activation_checkpointing", c.ta.get("gradient_checkpointing")))
        every = checkpointed_every(c.ta) if ckpt else None
        parts.append(f"activation checkpointing {'on' if ckpt else 'off'}"
                     + (f" (one layer in {every}, every_n_layers)" if every and every > 1 else ""))
    lora = c.b.get("lora")
    if lora:
        parts.append(f"LoRA r={lora['r']}" if lora.get("r") is not None else "LoRA")
    four_bit = bool(c.mk and (c.mk.get("quantization_config") or {}).get("load_in_4bit"))
    if four_bit:
        parts.append("4-bit base (QLoRA)")
    stage = (c.ds.get("zero_optimization") or {}).get("stage") if c.ds else None
    if stage:
        parts.append(f"DeepSpeed ZeRO-{stage}")
    fsdp = c.acc.get("distributed_type") == "FSDP" or bool(c.ta.get("fsdp"))
    if fsdp:
        parts.append("FSDP")
    if not lora and c.has_ta and c.mk is not None:
        parts.append("full fine-tuning")
    # only the levers this config does not use yet
    more = [] if ckpt else ["checkpointing (~20-30% more compute)"]
    if not four_bit:
        more.append("QLoRA" if lora else "LoRA/QLoRA")
    if stage == 3 or (fsdp and "full_shard" in str(c.ta.get("fsdp") or "full_shard")):
        pass  # already fully sharded
    elif stage or fsdp:
        more.append("ZeRO-3 / FSDP full shard")
    else:
        more.append("ZeRO/FSDP")
    c.add(
        "memory_levers",
        "checkpointing / PEFT",
        "info",
        (", ".join(parts) or "no memory lever visible")
        + (f"; when memory is tight: {', '.join(more)}" if more else "; every memory lever is in use"),
    )


def _rule_offload(c: _Ctx) -> None:
    zero = (c.ds.get("zero_optimization") or {}) if c.ds else {}
    what = [
        k.replace("offload_", "")
        for k in ("offload_optimizer", "offload_param")
        if (zero.get(k) or {}).get("device") in ("cpu", "nvme")
    ]
    fsdp = c.acc.get("fsdp_config") or {}
    if fsdp.get("fsdp_offload_params") or "offload" in str(c.ta.get("fsdp") or ""):
        what.append("params (FSDP)")
    if what:
        c.add(
            "offload",
            "CPU offload",
            "warn",
            f"{' and '.join(what)} offloaded: every step crosses PCIe; a capacity limit, not a tuning problem",
            "more GPU memory, more GPUs to shard over, or LoRA/QLoRA; autotune run measures the cost",
            c.src("deepspeed") or c.src("accelerate") or c.src("training_args"),
        )


def _rule_loader(c: _Ctx) -> None:
    if not c.has_ta:
        return
    src = c.src("training_args")
    workers = c.ta.get("dataloader_num_workers", 0)
    if c.cpu:
        c.add("dataloader_workers", "data-loader workers", "info", f"{workers} worker{'' if workers == 1 else 's'} (CPU run)", source=src)
    elif not workers:
        c.add(
            "dataloader_workers",
            "data-loader workers",
            "warn",
            "0 workers: the main process prepares every batch while the GPU waits",
            f"{ADVICE['workers']}, dataloader_persistent_workers: true",
            src,
        )
    else:
        c.add("dataloader_workers", "data-loader workers", "pass", f"{workers} worker{'' if workers == 1 else 's'}", source=src)
    pin = c.ta.get("dataloader_pin_memory", True)
    if c.cpu:
        c.add("pin_memory", "pinned memory", "info", "not used on a CPU run", source=src)
    elif pin is False:
        c.add(
            "pin_memory",
            "pinned memory",
            "warn",
            "dataloader_pin_memory: false slows host-to-GPU copies",
            ADVICE["pin_memory"],
            src,
        )
    else:
        c.add("pin_memory", "pinned memory", "pass", "pinned host memory", source=src)


def _rule_pretokenized(c: _Ctx) -> None:
    script = c.b.get("train_script")
    if isinstance(script, str) and "input_ids" in script:
        c.add(
            "pretokenized",
            "pre-tokenized data",
            "info",
            "train.py accepts pre-tokenized rows ({'input_ids': [...]}); tokenize once and store them",
            source=c.src("train_script"),
        )
    elif c.has_ta:
        c.add(
            "pretokenized",
            "pre-tokenized data",
            "info",
            "not visible in a config: tokenize once and store Arrow/Parquet rather than per epoch",
        )


def _rule_checkpoints(c: _Ctx) -> None:
    if not c.has_ta:
        return
    src, title = c.src("training_args"), "checkpoints"
    strategy = c.ta.get("save_strategy", "steps")
    limit = c.ta.get("save_total_limit")
    if strategy == "no":
        c.add(
            "checkpoints",
            title,
            "warn",
            "save_strategy 'no': a preempted or crashed job loses all progress",
            "save_strategy: steps, save_steps: 500, save_total_limit: 3 (to durable storage)",
            src,
        )
    elif limit is None:
        every = f"every {c.ta.get('save_steps') or 500} steps" if strategy == "steps" else f"every {strategy}"
        c.add(
            "checkpoints",
            title,
            "warn",
            f"saved {every} but all are kept (save_total_limit unset)",
            "save_total_limit: 3",
            src,
        )
    else:
        every = f"every {c.ta.get('save_steps') or 500} steps" if strategy == "steps" else f"every {strategy}"
        c.add("checkpoints", title, "pass", f"saved {every}, last {limit} kept", source=src)


def _rule_seed(c: _Ctx) -> None:
    if not c.has_ta:
        return
    src = c.src("training_args")
    if "seed" in c.ta:
        c.add("seed", "seed", "pass", f"seed {c.ta['seed']}", source=src)
    else:
        c.add(
            "seed",
            "seed",
            "warn",
            "seed not stated (HF falls back to 42): state and report it",
            "seed: 42 (and data_seed)",
            src,
        )


def _rule_tracking(c: _Ctx) -> None:
    if not c.has_ta:
        return
    src = c.src("training_args")
    rt = c.ta.get("report_to", "none")
    names = [rt] if isinstance(rt, str) else list(rt or [])
    names = [n for n in names if n and n != "none"]
    if not names:
        c.add(
            "tracking",
            "experiment tracking",
            "warn",
            "report_to 'none': loss and metrics are not tracked",
            "report_to: tensorboard (or wandb, trackio, mlflow; the integration must be installed)",
            src,
        )
    elif names == ["all"]:
        c.add(
            "tracking",
            "experiment tracking",
            "info",
            "report_to 'all': every installed integration (none if none is)",
            source=src,
        )
    else:
        c.add("tracking", "experiment tracking", "pass", f"report_to {', '.join(names)}", source=src)


_PACKING_KEYS = {  # format -> (its packing keys, the one to suggest)
    "trl": (("packing", "padding_free"), "padding_free: true (or packing: true)"),
    "axolotl": (("sample_packing",), "sample_packing: true"),
    "llamafactory": (("neat_packing", "packing"), "neat_packing: true (packing without cross-attention)"),
}


def _rule_packing_native(c: _Ctx) -> None:
    keys, fix = _PACKING_KEYS[c.b.fmt]
    native = c.b.native or {}
    on = [k for k in keys if native.get(k)]
    if on:
        c.add("packing", "packing", "pass", f"{on[0]}: true (no padding)", source=c.src("training_args"))
    else:
        c.add("packing", "packing", "info",
              f"{' / '.join(keys)} off: for variable-length data packing measured faster where it applies",
              fix, c.src("training_args"))


def _rule_packing(c: _Ctx) -> None:
    if c.b.fmt in _PACKING_KEYS:
        _rule_packing_native(c)
        return
    script = c.b.get("train_script")
    if isinstance(script, str):
        if "PACKING = True" in script or "packing=True" in script:
            c.add(
                "packing",
                "packing",
                "pass",
                "train.py packs sequences (no padding)",
                source=c.src("train_script"),
            )
        else:
            c.add(
                "packing",
                "packing",
                "info",
                "train.py pads per batch; for variable-length data packing measured faster where it applies",
                source=c.src("train_script"),
            )
        return
    if c.has_ta:
        msg = "not a TrainingArguments setting: for variable-length data pack sequences"
        if c.ta.get("group_by_length"):
            msg = "group_by_length reduces padding; packing removes it"
        how = ("DataCollatorWithFlattening with flash_attention_2, TRL packing=True" if not _no_flash(c) else
               f"padding-free packing (DataCollatorWithFlattening, TRL's) needs flash_attention_2, which {c.gpu.name} "
               "cannot run: pack with per-sequence attention under sdpa, as autotune's train.py does")
        c.add("packing", "packing", "info", f"{msg} ({how})")


def _no_flash(c: _Ctx) -> bool:
    """The file is checked for a GPU that cannot run flash_attention_2 (a T4, a V100): sdpa is the advice."""
    return c.gpu is not None and not c.gpu.flash_attention_2


def _rule_attention(c: _Ctx) -> None:
    title = "attention implementation"
    if c.mk is None and c.b.fmt in ("axolotl", "llamafactory"):
        how = "flash_attn: auto" if c.b.fmt == "llamafactory" else "attn_implementation unset"
        c.add("attention", title, "info", f"{how}: the model's default (sdpa where supported)",
              source=c.src("training_args"))
        return
    if c.mk is None:
        if c.has_ta:
            c.add(
                "attention",
                title,
                "info",
                "model kwargs not given: load the model with attn_implementation="
                + (f"'sdpa' ({c.gpu.name} cannot run flash_attention_2)" if _no_flash(c) else
                   "'sdpa' or 'flash_attention_2'") + ", never 'eager'",
            )
        return
    src = c.src("model_kwargs")
    attn = c.mk.get("attn_implementation")
    if attn is None:
        c.add(
            "attention",
            title,
            "info",
            "not set: transformers 5 picks sdpa where the model supports it",
            source=src,
        )
    elif attn == "eager":
        c.add(
            "attention",
            title,
            "fail",
            "eager attention: unfused kernels, the full attention matrix in memory",
            "attn_implementation: sdpa" if _no_flash(c) else ADVICE["attn"],
            src,
        )
    elif attn == "flash_attention_2" and c.gpu is not None and not c.gpu.flash_attention_2:
        c.add(
            "attention",
            title,
            "fail",
            f"{c.gpu.name} cannot run flash_attention_2",
            "attn_implementation: sdpa",
            src,
        )
    else:
        c.add("attention", title, "pass", str(attn), source=src)


# items that name the file's own keys (its unknown keys, the framework's own deprecation messages): not translated
_VERBATIM_ITEMS = frozenset({"names", "deprecated", "repeated"})


def _rename_fix(fmt: str, key: str) -> str:
    """``remove or rename it``, naming the format's own key where ``key`` is another vocabulary's for it."""
    own = FORMATS[fmt].VOCAB.get(key)
    return f"remove it, or use {own}" if isinstance(own, str) and own and own != key else "remove or rename it"


def _rule_format_keys(c: _Ctx) -> None:
    """Axolotl / LLaMA-Factory: every key against the key set the format accepts."""
    b = c.b
    label = FORMATS[b.fmt].LABEL
    src = c.src("training_args")
    native = b.native or {}
    if b.known_keys is None:
        c.add("names", "argument names", "info", f"{len(native)} {label} keys, not checked (key set unknown here)",
              source=src)
        return
    bad = 0
    for key in native:
        if key in b.known_keys:
            continue
        if b.fmt == "llamafactory" and key in REMOVED_IN_V5:
            # LLaMA-Factory pins transformers <= 5.8, whose TrainingArguments still had these (its own examples use them)
            c.add("names", "argument names", "info",
                  f"{key} is gone from transformers {c.version or '5.x'} (installed); LLaMA-Factory's pinned "
                  "transformers still takes it", REMOVED_IN_V5[key], src)
            continue
        bad += 1
        if b.fmt == "axolotl":
            c.add("names", "argument names", "warn",
                  f"{key} is not in {label}'s schema ({b.key_source}): Axolotl ignores it silently",
                  _rename_fix(b.fmt, key), src)
        else:
            c.add("names", "argument names", "fail",
                  f"{key} is not a {label} argument ({b.key_source}): it refuses to start", _rename_fix(b.fmt, key),
                  src)
    if not bad:
        c.add("names", "argument names", "pass", f"{len(native)} {label} keys, all known ({b.key_source})",
              source=src)


def _rule_names(c: _Ctx) -> None:
    if c.b.fmt in ("axolotl", "llamafactory"):
        _rule_format_keys(c)
        if c.b.fmt == "axolotl":
            for message, fix in FORMATS["axolotl"].deprecations(c.b.native or {}):
                c.add("deprecated", "deprecated settings", "warn", f"{message} (Axolotl's own warning)", fix,
                      c.src("training_args"))
        return
    # check judges only what it can know: names are checked against the installed package's fields; where
    # that package is not installed (trl's SFTConfig adds fields to TrainingArguments), the names it alone
    # could judge are an INFO naming it
    missing = _names_package(c)
    unknown, bad = _training_args_names(c, missing)
    if c.mk is not None and "torch_dtype" in c.mk:
        c.add(
            "names",
            "argument names",
            "warn",
            "torch_dtype is deprecated in transformers 5",
            "rename to dtype",
            c.src("model_kwargs"),
        )
        bad += 1
    _names_verdict(c, missing, unknown, bad)


def _names_version(c: _Ctx) -> str:
    """The transformers the names are judged against, as the messages name it."""
    return f"transformers {c.version}" if c.version else "transformers 5"


def _training_args_names(c: _Ctx, missing: tuple[str, str] | None) -> tuple[list[str], int]:
    """Each training argument's name against transformers 5 and the installed fields: (the names only the
    missing package could judge, how many names were reported)."""
    unknown: list[str] = []
    bad = 0
    if not c.has_ta:
        return unknown, bad
    trl = c.b.fmt == "trl"
    where = ("an SFTConfig, ModelConfig or ScriptArguments field of the installed trl (what trl sft reads)"
             if trl else f"a TrainingArguments field in {_names_version(c)}")
    renamed = FORMATS["trl"].RENAMED if trl else {}
    src = c.src("training_args")
    for key in c.ta:
        if key in renamed and (c.fields is None or key not in c.fields):
            c.add("names", "argument names", "fail", f"{key} was renamed to {renamed[key]} in TRL",
                  f"rename to {renamed[key]}", src)
            bad += 1
        elif key in REMOVED_IN_V5 and (c.fields is None or key not in c.fields):
            c.add(
                "names",
                "argument names",
                "fail",
                f"{key} was removed in transformers 5 (TypeError)",
                REMOVED_IN_V5[key],
                src,
            )
            bad += 1
        elif key in DEPRECATED_IN_V5 and (c.fields is None or DEPRECATED_IN_V5[key] in c.fields):
            c.add(
                "names",
                "argument names",
                "warn",
                f"{key} is a deprecated alias in transformers 5",
                f"rename to {DEPRECATED_IN_V5[key]}",
                src,
            )
            bad += 1
        elif c.fields is not None and key not in c.fields and key != "output_dir" and missing:
            unknown.append(key)
        elif c.fields is not None and key not in c.fields and key != "output_dir":
            c.add(
                "names",
                "argument names",
                "fail",
                f"{key} is not {where}",
                "remove or rename it",
                src,
            )
            bad += 1
    return unknown, bad


def _names_verdict(c: _Ctx, missing: tuple[str, str] | None, unknown: list[str], bad: int) -> None:
    """The closing line on the names: an INFO on what the missing package would judge, or a PASS."""
    if c.has_ta and missing and (unknown or not bad):
        pkg, cls = missing
        if c.fields is None:
            judged = "checked only for the names transformers 5 removed"
        elif unknown:
            one = len(unknown) == 1
            judged = (f"{', '.join(unknown)} {'is not a TrainingArguments field' if one else 'are not TrainingArguments fields'}"
                      f", and whether {cls} takes {'it' if one else 'them'} is not known here")
        else:
            judged = "all TrainingArguments fields"
        n = len(c.ta) + c.ta_set_aside
        c.add("names", "argument names", "info", f"{n} argument{'' if n == 1 else 's'}, {judged} ({pkg} is not installed)",
              f"pip install {pkg} to check every name against {cls}", c.src("training_args"))
    elif c.has_ta and not bad:
        n = len(c.ta) + c.ta_set_aside
        c.add(
            "names",
            "argument names",
            "pass",
            f"{n} argument{'' if n == 1 else 's'}, known to "
            f"{'the installed trl (SFTConfig, ModelConfig, ScriptArguments) and ' if c.b.fmt == 'trl' else ''}"
            f"{_names_version(c)}",
            source=c.src("training_args"),
        )


def _names_package(c: _Ctx) -> tuple[str, str] | None:
    """(the package, its class) whose fields the names would be checked against, when it is not installed."""
    if c.b.fmt == "trl" and c.b.known_keys is None:
        return "trl", "SFTConfig"
    if c.fields is None:
        return "transformers", "TrainingArguments"
    return None


_BUCKETS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size")


def _rule_deepspeed_agrees(c: _Ctx) -> None:
    """A DeepSpeed config's fixed batch and precision values against the training arguments: transformers' DeepSpeed
    integration (``HfTrainerDeepSpeedConfig.trainer_config_finalize``) refuses to start on a mismatch; ``auto``
    lets it fill them in."""
    if not c.ds or not c.has_ta:
        return
    pairs = [("train_micro_batch_size_per_gpu", "per_device_train_batch_size", c.ta.get("per_device_train_batch_size", 8)),
             ("gradient_accumulation_steps", "gradient_accumulation_steps", c.ta.get("gradient_accumulation_steps", 1))]
    for half in ("bf16", "fp16"):
        part = c.ds.get(half)
        if isinstance(part, dict) and "enabled" in part:
            pairs.append((f"{half}.enabled", half, bool(c.ta.get(half, False))))
    wrong = []
    for ds_key, ta_key, ta_value in pairs:
        ds_value = c.ds.get(ds_key) if "." not in ds_key else c.ds[ds_key.split(".")[0]]["enabled"]
        if ds_value is None or ds_value == "auto" or ds_value == ta_value:
            continue
        wrong.append(f"DeepSpeed {ds_key} {ds_value!r} against {ta_key} {ta_value!r}")
    if wrong:
        c.add("ds_agrees", "DeepSpeed config agrees", "fail",
              f"{'; '.join(wrong)}: transformers refuses to start on the mismatch",
              'set them to "auto" in the DeepSpeed config (the Trainer fills them in)',
              c.src("deepspeed") or c.src("training_args"))


def _rule_deepspeed(c: _Ctx) -> None:
    """ZeRO settings DeepSpeed's docs recommend.

    Sources: DeepSpeed config JSON reference, "ZeRO Optimizations for FP16 Training"
    (https://www.deepspeed.ai/docs/config-json/#zero-optimizations-for-fp16-training): overlap_comm
    "attempts to overlap the reduction of the gradients with backward computation"; the bucket sizes
    trade memory for communication speed (default 5e8 elements); offload_optimizer/offload_param
    ``pin_memory`` "could boost throughput at the cost of extra memory overhead". deepspeed 0.19.8's
    ``DeepSpeedZeroConfig`` turns overlap_comm on by default under ZeRO-3 only (``overlap_comm_valid``)
    and pin_memory on by default. Hugging Face's DeepSpeed guide
    (https://huggingface.co/docs/transformers/deepspeed#zero-3-config): without
    ``stage3_gather_16bit_weights_on_model_save`` a ZeRO-3 save holds only the sharded checkpoint,
    not a 16-bit model ``from_pretrained`` can load.
    """
    zero = (c.ds.get("zero_optimization") or {}) if c.ds else {}
    stage = zero.get("stage")
    if not isinstance(stage, int) or stage < 2:
        return
    src = c.src("deepspeed") or c.src("training_args")
    ov = zero.get("overlap_comm")
    if ov is False or (ov is None and stage == 2):
        c.add("ds_overlap", "ZeRO overlap_comm", "warn",
              f"overlap_comm {'false' if ov is False else 'unset (off under ZeRO-2)'} under ZeRO-{stage}: gradient "
              "reduction waits for the backward pass instead of overlapping it",
              "zero_optimization.overlap_comm: true (costs bucket-sized buffers of GPU memory)", src)
    else:
        c.add("ds_overlap", "ZeRO overlap_comm", "pass", f"overlap_comm on under ZeRO-{stage}", source=src)
    small = [f"{k}={zero[k]:.0e}" for k in _BUCKETS if isinstance(zero.get(k), (int, float)) and zero[k] < 5e7]
    if small:
        c.add("ds_buckets", "ZeRO bucket sizes", "warn",
              f"{', '.join(small)}: small buckets mean many small collectives (DeepSpeed's default is 5e8)",
              "raise them toward 5e8, or 'auto' under the HF Trainer (sized from the model's hidden size)", src)
    for part in ("offload_optimizer", "offload_param"):
        off = zero.get(part) or {}
        if off.get("device") in ("cpu", "nvme") and off.get("pin_memory") is False:
            c.add("ds_pin_memory", "offload pinned memory", "warn",
                  f"{part} to {off['device']} with pin_memory false: pageable host copies are slower",
                  f"zero_optimization.{part}.pin_memory: true", src)
    if stage == 3 and not (zero.get("stage3_gather_16bit_weights_on_model_save")
                           or zero.get("gather_16bit_weights_on_model_save")):
        c.add("ds_save", "ZeRO-3 model save", "warn",
              "stage3_gather_16bit_weights_on_model_save unset: saves hold only ZeRO shards, no loadable model",
              "zero_optimization.stage3_gather_16bit_weights_on_model_save: true", src)


# what each item judges, by key (a key whose value was set aside for its type): its item would speak of the key
# as not stated, or of its default, where the file states a value of the wrong type
_ITEM_KEYS: dict[str, frozenset[str]] = {
    "batch": frozenset({"per_device_train_batch_size", "gradient_accumulation_steps"}),
    "effective_batch": frozenset({"per_device_train_batch_size", "gradient_accumulation_steps"}),
    "fit": frozenset({"per_device_train_batch_size", "gradient_accumulation_steps"}),
    "seed": frozenset({"seed"}),
    "checkpoints": frozenset({"save_total_limit", "save_steps", "save_strategy"}),
    "dataloader_workers": frozenset({"dataloader_num_workers", "dataloader_persistent_workers"}),
    "pin_memory": frozenset({"dataloader_pin_memory"}),
    "tracking": frozenset({"report_to"}),
    "precision": frozenset({"bf16", "fp16", "tf32", "mixed_precision", "enabled"}),
    "packing": frozenset({"packing", "padding_free", "group_by_length"}),
    "memory_levers": frozenset({"gradient_checkpointing", "activation_checkpointing"}),
    "attention": frozenset({"attn_implementation"}),
}


def _typed(bundle: ConfigBundle, enums: Mapping[str, frozenset[str]] | None = None,
           ) -> tuple[ConfigBundle, list[CheckItem], frozenset[str]]:
    """(a copy of ``bundle`` without its wrongly typed values, one FAIL item per such value, the names of the keys
    set aside; ``enums``: the values the installed transformers accepts for its enum-valued keys,
    ``autotune.env.training_enums``)."""
    import copy

    from autotune.formats import ENUMS_JUDGED, enum_problems, numbers_read_as_text, type_problems

    items: list[CheckItem] = [CheckItem(id="types", title="value types", status="fail", message=m,
                                        fix="give the key a value of the type or range named", source=bundle.target)
                              for m in bundle.problems]
    data, dropped = dict(bundle.data), set()
    if bundle.fmt in ("trl", "llamafactory") and isinstance(data.get("training_args"), dict):
        data["training_args"] = numbers_read_as_text(data["training_args"])  # as their parsers read 2e-5
    if enums and bundle.fmt in ENUMS_JUDGED:  # a name, judged as the file states it (the value is kept)
        items += [CheckItem(id="types", title="value types", status="fail", message=message, fix=fix,
                            source=bundle.sources.get("training_args", ""))
                  for _, message, fix in enum_problems(data.get("training_args"), enums)]
    for kind, content in list(data.items()):
        problems = type_problems(kind, content)
        if not problems:
            continue
        content = copy.deepcopy(content)
        for dotted, message in problems:
            items.append(CheckItem(id="types", title="value types", status="fail", message=message,
                                   fix=f"give {dotted} a value of the type or range named (the other checks ignored it)",
                                   source=bundle.sources.get(kind, "")))
            *parents, last = dotted.split(".")
            dropped.add(last)
            node = content
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(last, None)
        data[kind] = content
    return dataclasses.replace(bundle, data=data), items, frozenset(dropped)


def _rule_repeated_keys(c: _Ctx) -> None:
    """A key set twice at the top level: YAML and JSON readers keep the last value without a word, so the first is
    dead text that reads as the setting."""
    for key, times, lines, value in c.b.repeated:
        where = f" (lines {', '.join(map(str, lines))})" if lines else ""
        c.add("repeated", "keys set more than once", "warn",
              f"{key} is set {times} times{where}: the training tool reads the last, {value!r}",
              f"keep one {key}", c.b.target)


def _rule_missing(c: _Ctx) -> None:
    """An answer folder without a file its train.py reads (a best/ copied in part): it would not start, and the
    items that file would have judged (batch, seed, checkpoints) say nothing."""
    for name, reader in c.b.missing:
        c.add("files", "referenced files", "fail", f"{name} is not in {c.b.target}, and {reader} reads it",
              "copy the whole best/ folder again (a rerun of the same autotune run serves it and writes any file "
              "missing from it)", c.b.target)


def _rule_references(c: _Ctx) -> None:
    """A file the config names (a DeepSpeed JSON, a local dataset) must be there, and be a file."""
    for src, key, value, problem in c.b.references:
        if problem is None:
            c.add("files", "referenced files", "pass", f"{key}: {value} is there", source=src)
        else:
            c.add("files", "referenced files", "fail", f"{key}: {problem}; the training tool stops at it",
                  f"correct {key} (a relative path counts from where training starts), or remove it", src)


_RULES = (
    _rule_repeated_keys,
    _rule_missing,
    _rule_references,
    _rule_names,
    _rule_device,
    _rule_precision,
    _rule_tf32,
    _rule_fit,
    _rule_batch,
    _rule_effective_batch,
    _rule_memory_levers,
    _rule_offload,
    _rule_deepspeed_agrees,
    _rule_deepspeed,
    _rule_loader,
    _rule_pretokenized,
    _rule_checkpoints,
    _rule_seed,
    _rule_tracking,
    _rule_packing,
    _rule_attention,
)


def gather(
    bundle: ConfigBundle,
    *,
    gpu: GpuInfo | None = None,
    fields: set[str] | None = None,
    transformers_version: str | None = None,
    target: FitTarget | None = None,
    unjudged: str = "",
    enums: Mapping[str, frozenset[str]] | None = None,
) -> CheckReport:
    """Run the checklist over ``bundle``. ``fields``: installed TrainingArguments field names, if known.
    ``target``: the model and catalog GPU to judge the file's memory and micro-batch on (``check --gpu``);
    ``unjudged``: why there is none although a GPU was named (an INFO item says so); ``enums``: the values the
    installed transformers accepts for TrainingArguments' enum-valued keys (a value outside them is a FAIL).

    Each value's type is checked first (``autotune.formats._types``): a wrong type is a FAIL naming
    the key, and the rules judge the file without that key (never a crash, never a PASS on it)."""
    typed, type_items, dropped = _typed(bundle, enums)
    c = _Ctx(typed, gpu, fields, transformers_version, target)
    c.ta_set_aside = len(set(bundle.get("training_args") or {}) - set(c.ta))
    c.items.extend(type_items)
    if unjudged and gpu is not None:
        c.add("fit", f"memory on {gpu.name}", "info", f"not judged: {unjudged}",
              "--model names it: a preset, a directory with config.json, or a Hub id")
    for rule in _RULES:
        try:
            rule(c)
        except (TypeError, AttributeError, ValueError, KeyError) as exc:  # a shape the type table does not cover
            c.add("types", "value types", "fail",
                  f"a value has a type the {rule.__name__.removeprefix('_rule_')} check cannot judge "
                  f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]})",
                  "give each key the type its documentation names")
    # an item about a key set aside for its type would judge the file without it ("not stated", its default)
    c.items = [i for i in c.items if not (_ITEM_KEYS.get(i.id, frozenset()) & dropped)]
    if bundle.fmt in FORMATS and FORMATS[bundle.fmt].VOCAB:
        # every message in the file's own words, except those that quote the file's keys as they are
        c.items = [i if i.id in _VERBATIM_ITEMS else
                   CheckItem(id=i.id, title=i.title, status=i.status, message=translate(bundle.fmt, i.message),
                             fix=translate(bundle.fmt, i.fix), source=i.source, figures=i.figures)
                   for i in c.items]
    ctx: dict[str, Any] = {"transformers": transformers_version, "fields_known": fields is not None,
                           "format": bundle.fmt}
    if gpu is not None:
        ctx["gpu"] = gpu.name
    files = list(dict.fromkeys(bundle.sources[k] for k in KINDS if k in bundle.sources))
    return CheckReport(target=bundle.target, files=files, items=c.items, context=ctx)
