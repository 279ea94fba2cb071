"""Checks ``tune`` runs before it writes anything: a request that cannot work fails here, fast.

Everything in this module raises :class:`~autotune.errors.SpecError` (exit 2) and writes nothing:
no run directory exists yet when it runs. The checks, cheapest first:

* the effective batch: at least one micro-batch of the space must divide it (with a world size
  the hardware holds), or no probe could hold it;
* the weights: if the model's weights alone (the estimator's ``weights`` term, for the leanest
  precision/sharding the space allows) exceed the budget in the requested mode, nothing can fit;
  the message gives the minimum and the mode that would fit;
* ``--ray-address``: the cluster's port must answer within ``RAY_CONNECT_TIMEOUT_S``;
* ``--dataset``: read (and tokenized, into the shared cache the probes then hit) once here, so a
  missing tokenizer, an empty file, a malformed line or a token id outside the model's vocabulary
  is exit 2, not a run of crashed probes (whose "nothing fits" would then be cached).

Run earlier by ``tune`` (each also exit 2, nothing written):

* ``check_model_config``: the size fields of ``config.json`` the estimator and the probe build
  read (``hidden_size``, ``vocab_size``, ...) are positive integers and the heads divide evenly;
* ``detect_capabilities`` (effectful: installed packages, GPU compute capability) feeds
  ``autotune.spec.capabilities.filter_space``, which drops the choices that cannot run here;
* ``check_cpu_probe_time``: with ``--device auto`` resolved to a CPU, a model whose cheapest probe
  is predicted (``autotune.estimate.probe_time``) above ``AUTO_CPU_PROBE_LIMIT_S`` (or the explicit
  ``--probe-timeout``) is refused.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.spec.budget import format_bytes
from autotune.spec.probe_request import Candidate, Workload
from autotune.spec.shell import command_line
from autotune.spec.space import SearchSpace

__all__ = ["RAY_CONNECT_TIMEOUT_S", "check_batch", "weights_floor", "check_weights", "check_ray", "check_dataset",
           "preflight", "check_model_config", "detect_capabilities", "default_space_for", "dataset_lengths", "mean_sequence_tokens",
           "check_cpu_probe_time", "AUTO_CPU_PROBE_LIMIT_S"]

RAY_CONNECT_TIMEOUT_S = 10.0


def check_batch(space: SearchSpace, effective_batch: int, max_world: int | None) -> list[str]:
    """Problems with the effective batch: no usable world size, or no micro-batch that divides it."""
    from autotune.search import usable_micro_batches, usable_worlds

    worlds, _ = usable_worlds(space, max_world)
    if not worlds:
        return [f"no gpus_per_trial choice in {list(space.gpus_per_trial)} fits the {max_world} GPU(s) available"]
    mbs, _ = usable_micro_batches(space, effective_batch, worlds)
    if not mbs:
        return [f"no micro_batch in {list(space.micro_batch)} divides the effective batch {effective_batch} "
                f"with gpus_per_trial {worlds}; choose an effective batch that is a multiple of one of them"]
    return []


def weights_floor(
    config: dict[str, Any], *, mode: str, space: SearchSpace, device: str, seq_len: int, max_world: int | None,
) -> tuple[int, int] | None:
    """(bytes the weights alone take on one device at best, parameter count), or None if unknown.

    The least over the space's precisions, ZeRO stages, sharding, offload and world sizes, so a
    request is refused only when no configuration of the space could hold the weights.
    """
    try:
        from autotune.estimate import arch_from_config, estimate_memory

        arch = arch_from_config(config)
    except Exception:  # an architecture the estimator does not know: let the probes decide
        return None
    worlds = [w for w in space.gpus_per_trial if max_world is None or w <= max_world] or [1]
    workload = Workload(model="preflight", seq_len=seq_len, mode=mode)
    best: int | None = None
    for precision, zero, sharding, offload, world in itertools.product(
        space.precision, space.zero_stage, space.sharding, space.offload, worlds
    ):
        cand = Candidate(micro_batch=1, grad_accum=1, grad_ckpt=True, precision=precision, zero_stage=zero,
                         sharding=sharding, offload=offload, world_size=world)
        if cand.problems():
            continue
        try:
            terms = estimate_memory(arch, workload, cand, device=device).terms
        except Exception:
            continue
        w = int(terms.get("weights", 0))
        best = w if best is None else min(best, w)
    return None if best is None else (best, arch.params_total)


def check_weights(
    config: dict[str, Any], *, name: str, mode: str, space: SearchSpace, device: str, seq_len: int,
    max_world: int | None, budget_text: str, budget_bytes: int,
) -> list[str]:
    """A problem when the weights alone exceed the budget: the minimum, and the mode that would fit."""
    floor = weights_floor(config, mode=mode, space=space, device=device, seq_len=seq_len, max_world=max_world)
    if floor is None or floor[0] <= budget_bytes:
        return []
    need, params = floor
    text = (f"{name} needs at least {format_bytes(need)} for its weights alone with --mode {mode} "
            f"({params / 1e6:,.0f}M parameters), more than the budget {budget_text} ({format_bytes(budget_bytes)})")
    others = [m for m in ("full", "lora", "qlora") if m != mode and not (m == "qlora" and device == "cpu")]
    fitting: list[str] = []
    for m in others:
        f = weights_floor(config, mode=m, space=space, device=device, seq_len=seq_len, max_world=max_world)
        if f is not None and f[0] <= budget_bytes:
            fitting.append(f"--mode {m} (weights {format_bytes(f[0])})")
    if fitting:
        return [f"{text}; try {' or '.join(fitting)}, or a budget of at least {format_bytes(need)}"]
    return [f"{text}; no mode fits it: give a budget of at least {format_bytes(need)}"
            + (" or try --mode qlora on a GPU" if device == "cpu" and mode != "qlora" else "")]


def check_ray(ray_address: str | None, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A bounded wait for ``--ray-address`` (SpecError naming the address if it does not answer)."""
    if ray_address is None:
        return
    from autotune.executors.ray_pool import check_reachable

    check_reachable(ray_address, timeout_s)


def _vocab_size(config: dict[str, Any]) -> int | None:
    for cfg in (config, config.get("text_config")):
        if isinstance(cfg, dict):
            v = cfg.get("vocab_size")
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def check_dataset(dataset: str | None, workload: Workload, config: dict[str, Any] | None = None) -> None:
    """Read the dataset once (DatasetError: missing tokenizer, empty, malformed, a token id outside
    the model's vocabulary); the probes then hit the tokenized cache."""
    if dataset is None:
        return
    from autotune.errors import DatasetError
    from autotune.probe.data import find_tokenizer, load_token_sequences

    loaded = load_token_sequences(dataset, seq_len=workload.seq_len, tokenizer=find_tokenizer(workload),
                                  split=workload.split, trust_remote_code=workload.trust_remote_code)
    vocab = _vocab_size(config or {})
    top = loaded.sequences.max_token()
    if vocab is not None and top >= vocab:
        raise DatasetError(
            f"dataset {dataset!r} holds token id {top}, but {workload.model}'s vocabulary has {vocab} ids "
            f"(0..{vocab - 1}, vocab_size in its config.json); tokenize the data with this model's tokenizer "
            "(--tokenizer DIR) or pass the --model it was tokenized for")


# config.json fields the estimator and the probe's model build read as sizes (absent is fine:
# transformers then uses its default; present, they must be positive integers)
_SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "head_dim", "max_position_embeddings", "n_embd", "n_layer",
                "n_head", "n_inner", "n_positions", "n_ctx", "num_local_experts", "num_experts_per_tok")


def check_model_config(config: Any, config_path: str) -> None:
    """SpecError (one line, naming the file and the fix) when config.json's size fields are not
    positive integers or the attention heads do not divide evenly."""
    if not isinstance(config, dict):
        raise SpecError(f"model config {config_path}: must be a JSON object, got {type(config).__name__}")
    problems: list[str] = []
    for where, cfg in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(cfg, dict):
            continue
        for name in _SIZE_FIELDS:
            v = cfg.get(name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                problems.append(f"{where}{name} must be a positive integer, got {v!r}")
        ok = [n for n in ("hidden_size", "num_attention_heads", "num_key_value_heads")
              if isinstance(cfg.get(n), int) and not isinstance(cfg.get(n), bool) and cfg[n] > 0]
        if {"hidden_size", "num_attention_heads"} <= set(ok) and cfg.get("head_dim") is None \
                and cfg["hidden_size"] % cfg["num_attention_heads"]:
            problems.append(f"{where}hidden_size {cfg['hidden_size']} is not a multiple of "
                            f"{where}num_attention_heads {cfg['num_attention_heads']}")
        if {"num_attention_heads", "num_key_value_heads"} <= set(ok) \
                and cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
            problems.append(f"{where}num_attention_heads {cfg['num_attention_heads']} is not a multiple of "
                            f"{where}num_key_value_heads {cfg['num_key_value_heads']}")
    if problems:
        raise SpecError(f"model config {config_path}: {'; '.join(problems)}; fix these fields in config.json "
                        "(or point --model at the model's original config)")


# --------------------------------------------------------------------------- device and space


def _compute_capability(index: int) -> list[int] | None:
    """(major, minor) of GPU ``index`` from NVML, None when NVML cannot say."""
    try:
        import pynvml  # type: ignore[import-untyped]  # noqa: TID251 - effectful on purpose (not a pure module)
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(index))
        return [int(major), int(minor)]
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def trainer_reads_every_n_layers() -> bool | None:
    """Whether the installed transformers' Trainer checkpoints one decoder layer in k
    (``activation_checkpointing_kwargs={"every_n_layers": k}``, transformers >= 5.24); None when unknown.
    Read from the Trainer's source, so nothing is imported (torch would come with it)."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        trainer = Path(root) / "trainer.py"
        if trainer.is_file():
            return "every_n_layers" in trainer.read_text(encoding="utf-8", errors="replace")
    return None


def detect_capabilities(device: str, gpu_infos: list[dict[str, Any]], ray_address: str | None,
                        model_type: str | None = None) -> dict[str, Any]:
    """What :func:`autotune.spec.capabilities.filter_space` needs to know about this machine.

    With ``--ray-address`` the probes run on the cluster's machines, whose packages and GPUs are
    not visible from here: only the device type is given (nothing is dropped for the rest).
    The GPUs' compute capability is also written into ``gpu_infos`` (the cache key's fingerprint).
    """
    caps: dict[str, Any] = {"device": device}
    if model_type:  # what the model's family supports (Liger patches some), wherever the probes run
        caps["model_type"] = model_type
    if ray_address is not None:
        return caps
    caps["packages"] = {name: _has_module(name) for name in
                        ("flash_attn", "bitsandbytes", "liger_kernel", "deepspeed", "triton")}
    caps["partial_ckpt"] = trainer_reads_every_n_layers()
    if device == "cpu":
        caps["cxx_compiler"] = any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "g++", "clang++"))
    else:
        ccs = []
        for g in gpu_infos:
            g.setdefault("compute_capability", _compute_capability(int(g.get("index", 0))))
            ccs.append(g["compute_capability"])
        caps["compute_capability"] = min(ccs) if ccs and all(ccs) else None
    return caps


def default_space_for(device: str, mode: str = "full", gpus: int = 1) -> str:
    """The search space of the request's situation when none is named: ``cpu`` on a CPU; on GPUs,
    ``multi-gpu`` with several in use, ``lora`` for LoRA and QLoRA on one (the frozen base makes the
    optimizer and ZeRO choices moot), ``default`` for full fine-tuning on one."""
    if device == "cpu":
        return "cpu"
    if gpus > 1:
        return "multi-gpu"
    return "lora" if mode in ("lora", "qlora") else "default"


# levers left out of a situation's default space unless a named space lists them: (value, why)
DEAR_LEVERS: dict[str, tuple[Any, str]] = {
    "torch_compile": (True, "a torch.compile probe times whole optimizer steps and pays the compilation, many "
                            "times a composed probe's time, and the cost model predicts no speed-up to repay it; "
                            "name a space that lists it (--space) to measure it"),
}
# with fixed-length data every sequence fills its row (the planner searches packing only when lengths vary too)
FIXED_LENGTH_PACKING = (True, "the data is fixed-length (every sequence fills its row, also where every length of "
                              "--lengths reaches --seq-len and is cut to it): packing has no padding to remove, and "
                              "with sdpa or eager attention its block mask costs memory; give --lengths shorter than "
                              "--seq-len, or --dataset, to search it")


def situation_space(space: SearchSpace, *, variable_lengths: bool) -> tuple[SearchSpace, list[Any]]:
    """A situation's default space less the choices that cannot repay their probes in this request, each with why:
    the dear levers (``DEAR_LEVERS``: torch.compile) and, with fixed-length data, packing. A named space
    (``--space``) is searched as written."""
    import dataclasses

    from autotune.spec.capabilities import DroppedChoice

    leave_out = dict(DEAR_LEVERS)
    if not variable_lengths:
        leave_out["packing"] = FIXED_LENGTH_PACKING
    kept: dict[str, tuple[Any, ...]] = {}
    dropped = []
    for knob, (value, why) in leave_out.items():
        choices = space.choices(knob)
        if value in choices and len(choices) > 1:
            kept[knob] = tuple(v for v in choices if v != value)
            dropped.append(DroppedChoice(knob, value, why))
    return (dataclasses.replace(space, **kept) if kept else space), dropped


def dataset_lengths(workload: Workload) -> list[int]:
    """The token lengths of the workload's dataset (truncated to seq_len), as the probes read it (the tokenize
    cache); [] without a dataset."""
    if workload.dataset is None:
        return []
    from autotune.probe.data import find_tokenizer, load_token_sequences

    lengths = load_token_sequences(workload.dataset, seq_len=workload.seq_len, tokenizer=find_tokenizer(workload),
                                   split=workload.split, trust_remote_code=workload.trust_remote_code).sequences.lengths()
    return [int(n) for n in lengths]


def mean_sequence_tokens(workload: Workload) -> float:
    """Real tokens per sequence on average: the dataset's (truncated to seq_len), else the length
    distribution's (a fixed sample of 4,096 draws), else seq_len."""
    if workload.dataset is not None:
        lengths = dataset_lengths(workload)
        return sum(lengths) / len(lengths) if lengths else float(workload.seq_len)
    if workload.lengths == "fixed":
        return float(workload.seq_len)
    from autotune.spec.lengths import sample_lengths

    sample = sample_lengths(workload.lengths, 4096, workload.seq_len, workload.seed)
    return sum(sample) / len(sample)


# one probe on a CPU that --device auto fell back to may take this long before the request is refused
# (an explicit --probe-timeout is the limit instead)
AUTO_CPU_PROBE_LIMIT_S = 300.0


def check_cpu_probe_time(
    seconds: float | None, *, workload: Workload, effective_batch: int, limit_s: float, limit_text: str,
    requested_device: str, model_ref: str | None = None,
) -> float | None:
    """``seconds``: the least predicted time of one CPU probe of the space (``autotune.run._forecast``).

    Raises SpecError when ``--device auto`` resolved to this CPU and that exceeds ``limit_s``; an
    explicit ``--device cpu`` is the user saying they want it, and only gets the figure back.
    """
    if seconds is None:
        return None
    if requested_device == "auto" and seconds > limit_s:
        ref = model_ref or workload.model
        raise SpecError(
            f"no GPU found, and on this CPU one probe of {workload.model} (--mode {workload.mode}, --seq-len "
            f"{workload.seq_len}, --effective-batch {effective_batch}) is predicted to take {_duration(seconds)}, "
            f"past the {limit_text}: see what it needs on a GPU with `"
            f"{command_line('autotune', 'plan', '--model', ref, '--mode', workload.mode, '--seq-len', str(workload.seq_len))}"
            "`, or pass --device cpu "
            "to search on this CPU anyway")
    return seconds


def _duration(seconds: float) -> str:
    from autotune.spec.parse import duration_text

    return duration_text(seconds)


def preflight(
    *, config: dict[str, Any], name: str, workload: Workload, space: SearchSpace, effective_batch: int,
    device: str, max_world: int | None, budget_text: str, budget_bytes: int, ray_address: str | None,
) -> None:
    """Every check above, in order; the batch and weights problems are reported together."""
    problems = check_batch(space, effective_batch, max_world)
    problems += check_weights(config, name=name, mode=workload.mode, space=space, device=device,
                              seq_len=workload.seq_len, max_world=max_world, budget_text=budget_text,
                              budget_bytes=budget_bytes)
    if problems:
        raise SpecError(problems)
    check_ray(ray_address)
    check_dataset(workload.dataset, workload, config)
