"""The files a config names, found as the training tool finds them, and the ZeRO/FSDP set-up a training
config trains with.  [pure: reads the files it is asked about]

A training file's distributed set-up is not one of its tuned keys: a write-back keeps its ``deepspeed`` /
``fsdp`` keys as they are (each framework module's ``HELD_LEVERS``). So a ``--from`` search on GPUs measures
that set-up (:func:`distributed_setup`) rather than choosing its own, and the tuned file trains with what was
measured. The set-up as lever values (``autotune.spec.levers``):

* ``deepspeed``: a mapping given inline, or the path of a DeepSpeed JSON (looked for in the working
  directory, then beside the config, as :func:`locate_reference` does): ``zero_optimization.stage`` and its
  ``offload_param`` / ``offload_optimizer`` device (cpu or nvme: offloaded);
* ``fsdp`` (TrainingArguments, TRL, Axolotl): its options, a string or a list: ``full_shard`` or
  ``hybrid_shard`` is stage 3, ``shard_grad_op`` or ``hybrid_shard_zero2`` stage 2, ``offload`` offloads the
  parameters; Axolotl's ``fsdp_version: 2`` with ``fsdp_config`` (``reshard_after_forward`` false is stage 2,
  else 3; ``offload_params``, or v1's ``fsdp_offload_params``);
* neither: stage 0 (data parallel, or one GPU).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["REFERENCE_KINDS", "base64_json", "deepspeed_fixed_values", "distributed_setup", "locate_reference",
           "setup_words"]

# what the HF integration checks a DeepSpeed config against the training arguments for: "auto" lets it fill them
_TIED_TO_ARGS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")

REFERENCE_KINDS = {"deepspeed": "a DeepSpeed JSON file", "dataset": "a dataset file or folder", "folder": "a folder"}

_FSDP_STAGES = {"full_shard": 3, "hybrid_shard": 3, "shard_grad_op": 2, "hybrid_shard_zero2": 2}


def base64_json(value: Any) -> Mapping[str, Any] | None:
    """The JSON object a ``deepspeed`` string holds base64-encoded (transformers' ``HfDeepSpeedConfig`` takes a path,
    a mapping or that), None when it is not one: then it is a path."""
    import base64
    import binascii
    import json

    if not isinstance(value, str) or not value.strip() or value.lower().endswith(".json"):
        return None
    try:
        parsed = json.loads(base64.b64decode(value.strip(), validate=True).decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    return parsed if isinstance(parsed, Mapping) else None


def locate_reference(config: Path, value: str, kind: str) -> tuple[Path | None, str | None]:
    """(the file or folder ``value`` names, None) or (None, what is wrong with it). A relative path is looked
    for in the working directory, then beside the config (where the training tool may be started from)."""
    raw = Path(value).expanduser()
    cands = [raw] if raw.is_absolute() else list(dict.fromkeys([raw, config.parent / raw]))
    wrong: str | None = None  # the first candidate that exists but is the wrong kind (another may be right)
    for cand in cands:
        try:
            mode = os.stat(cand).st_mode
        except OSError:
            continue
        ok = (stat.S_ISREG(mode) if kind == "deepspeed" else stat.S_ISDIR(mode) if kind == "folder"
              else stat.S_ISREG(mode) or stat.S_ISDIR(mode))
        if ok:
            return cand, None
        what = "a folder" if stat.S_ISDIR(mode) else "a device or a pipe" if not stat.S_ISREG(mode) else "a file"
        wrong = wrong or f"{cand} is {what}, not {REFERENCE_KINDS[kind]}"
    if wrong is not None:
        return None, wrong
    where = str(raw) if raw.is_absolute() else f"in the working directory or beside {config.name}"
    return None, f"{value} does not exist ({where})"


def deepspeed_fixed_values(ds: Mapping[str, Any]) -> list[str]:
    """The batch and precision values a DeepSpeed config fixes rather than leaves ``auto``: transformers refuses to
    start when one differs from the training arguments (``HfTrainerDeepSpeedConfig.trainer_config_finalize``), so a
    tuned file that changes the micro-batch, the accumulation or the precision could not start."""
    fixed = [f"{key} {ds[key]!r}" for key in _TIED_TO_ARGS if key in ds and ds[key] != "auto"]
    for half in ("bf16", "fp16"):
        part = ds.get(half)
        if isinstance(part, Mapping) and "enabled" in part and part["enabled"] != "auto":
            fixed.append(f"{half}.enabled {part['enabled']!r}")
    return fixed


def _from_deepspeed(ds: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The set-up a DeepSpeed config states; SpecError for a stage that is not 0-3 or a value no tuned file could
    start with (``deepspeed_fixed_values``). DeepSpeed offloads parameters at stage 3 only, the optimizer from
    stage 1 (below, its ``offload_*`` entries do nothing)."""
    from autotune.errors import SpecError

    if fixed := deepspeed_fixed_values(ds):
        raise SpecError(_fixed_problem(where, fixed))
    zero = ds.get("zero_optimization", {})
    if not isinstance(zero, Mapping):
        raise SpecError(f"{where}: zero_optimization must be a mapping, got {zero!r}")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3) or not isinstance(stage, int):
        raise SpecError(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3 (a number), got {stage!r}")

    def offloaded(key: str) -> bool:
        part = zero.get(key)
        return isinstance(part, Mapping) and part.get("device") in ("cpu", "nvme")

    offload = ("params" if stage == 3 and offloaded("offload_param")
               else "optimizer" if stage >= 1 and offloaded("offload_optimizer") else "none")
    return {"zero_stage": stage, "offload": offload, "sharding": "deepspeed"}


_FSDP_WORDS = frozenset({*_FSDP_STAGES, "offload", "auto_wrap", "no_shard"})


def _flag(value: Any) -> bool:
    """A YAML boolean as Axolotl's schema reads it (``'false'`` is false, not a non-empty string)."""
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "yes", "1"))


def _from_fsdp(data: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """The FSDP set-up ``data`` states, None when it states none; SpecError for options transformers refuses or a
    set-up the probes cannot run (FSDP's shard_grad_op with CPU offload)."""
    from autotune.errors import SpecError

    raw = data.get("fsdp")
    options = raw.split() if isinstance(raw, str) else [str(o) for o in raw] if isinstance(raw, list) else []
    unknown = [o for o in options if o not in _FSDP_WORDS]
    if unknown:
        raise SpecError(f"{where}: fsdp option(s) {', '.join(map(repr, unknown))} are not transformers' (lowercase: "
                        f"{', '.join(sorted(_FSDP_WORDS))})")
    fcfg = data.get("fsdp_config")
    fcfg = fcfg if isinstance(fcfg, Mapping) else {}
    version = data.get("fsdp_version", fcfg.get("fsdp_version"))
    version2 = str(version).strip() == "2"
    stage = next((_FSDP_STAGES[o] for o in options if o in _FSDP_STAGES), None)
    if stage is None and version2:
        stage = 2 if fcfg.get("reshard_after_forward") in (False, "false", "False") else 3
    if stage is None:
        if options and set(options) - {"no_shard", "auto_wrap"}:
            raise SpecError(f"{where}: fsdp {raw!r} names no sharding strategy (full_shard, shard_grad_op, "
                            "hybrid_shard or hybrid_shard_zero2)")
        return None
    offload = "offload" in options or _flag(fcfg.get("offload_params")) or _flag(fcfg.get("fsdp_offload_params"))
    if offload and stage != 3:
        raise SpecError(f"{where}: FSDP shard_grad_op with CPU offload is a set-up autotune's probes cannot run (they "
                        "offload under a full shard only); use full_shard with offload, or drop the offload")
    return {"zero_stage": stage, "offload": "params" if offload else "none", "sharding": "fsdp"}


def distributed_setup(data: Mapping[str, Any], config: Path) -> tuple[dict[str, Any] | None, str]:
    """(the ZeRO/FSDP set-up a training config at ``config`` trains with, as ``zero_stage`` / ``offload`` /
    ``sharding`` values, and where it was read: "" when the file names none) or (None, why the DeepSpeed file it
    names cannot be found). SpecError when what it states cannot be trained or measured: a DeepSpeed file that is
    not a JSON object, a stage outside 0-3, batch or precision values fixed (``deepspeed_fixed_values``), FSDP
    options transformers refuses."""
    from autotune.errors import SpecError
    from autotune.spec.files import read_json_file

    ds = data.get("deepspeed")
    ds = base64_json(ds) or ds
    if isinstance(ds, Mapping):
        where = f"the DeepSpeed config given in {config.name}"
        return _from_deepspeed(ds, where), where
    if isinstance(ds, str) and ds.strip():
        found, problem = locate_reference(config, ds, "deepspeed")
        if found is None:
            return None, f"{config.name} names the DeepSpeed config {ds!r}, but {problem}"
        parsed = read_json_file(found, what=f"the DeepSpeed config {ds!r}")
        if not isinstance(parsed, Mapping):
            raise SpecError(f"the DeepSpeed config {ds!r} ({found}) is not a JSON object")
        return _from_deepspeed(parsed, f"the DeepSpeed config {ds!r} ({found})"), f"the DeepSpeed config {ds!r}"
    fsdp = _from_fsdp(data, config.name)
    if fsdp is not None:
        return fsdp, f"the FSDP settings of {config.name}"
    return {"zero_stage": 0, "offload": "none", "sharding": "deepspeed"}, ""


def _fixed_problem(where: str, fixed: list[str]) -> str:
    return (f"{where} fixes {', '.join(fixed)}: transformers refuses to start when the tuned file's micro-batch, "
            "accumulation or precision differs from it; set them to \"auto\" there (the Trainer fills them in)")


def setup_words(setup: Mapping[str, Any]) -> str:
    """``ZeRO-3 (DeepSpeed), parameter offload`` / ``no ZeRO or FSDP sharding``."""
    if not setup.get("zero_stage"):
        return "no ZeRO or FSDP sharding"
    head = (f"ZeRO-{setup['zero_stage']} (DeepSpeed)" if setup.get("sharding") == "deepspeed"
            else "FSDP " + ("full shard" if setup["zero_stage"] == 3 else "shard_grad_op"))
    offload = setup.get("offload", "none")
    return head + ("" if offload == "none" else f", {'parameter' if offload == 'params' else 'optimizer'} offload")
