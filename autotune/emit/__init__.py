"""Emitters: the best probe result -> ready-to-use config files.  [pure, apart from emit_all's write]

``build_files`` computes every file's text (pure, tested); ``emit_all`` writes them atomically. What each
file holds is its framework's module in ``autotune.formats`` (one lever-to-key table per framework, which
the write-back into a user's file uses too); this package picks the files, renders the scripts and
writes the bundle.

Files (in ``best/``):
- ``training_args.json``: ``TrainingArguments(output_dir=..., **json)`` on the installed transformers
- ``model_kwargs.json``: ``AutoModelForCausalLM.from_pretrained(model, **json)`` (for QLoRA the
  ``quantization_config`` dict holds BitsAndBytesConfig fields)
- ``lora_config.json`` (lora/qlora): ``peft.LoraConfig(**json)``
- ``accelerate_config.yaml``: ``accelerate launch --config_file accelerate_config.yaml train.py ...``
- ``deepspeed.json`` (ZeRO through DeepSpeed): DeepSpeed's own config format, concrete values
- ``deepspeed_packed.json`` (the same, packed): its batch keys ``auto``, for Axolotl and LLaMA-Factory, whose
  batch counts packed rows (the HF integration fills them from the trainer's own)
- ``sft_config.json``: ``trl.SFTConfig(output_dir=..., **json)`` (autotune.formats.trl), with
  ``train_sft.py`` that runs TRL's SFTTrainer on it (needs trl, datasets; not autotune)
- ``axolotl.yaml``: Axolotl's config keys (autotune.formats.axolotl), checked against its schema
- ``llamafactory.yaml``: ``llamafactory-cli train llamafactory.yaml`` (autotune.formats.llamafactory)
- ``train.py``: a minimal script that uses them and feeds the Trainer the batches the probe measured
  (it imports ``autotune.probe.collate`` from the installed autotune)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from pathlib import Path
from typing import Any

import yaml

from autotune.emit._train_script import render_train_script
from autotune.emit._train_sft_script import render_train_sft_script
from autotune.errors import AutotuneError
from autotune.formats import packed_sequence_tokens, target_device
from autotune.formats.accelerate import accelerate_config
from autotune.formats.axolotl import axolotl_config
from autotune.formats.deepspeed import emitted_deepspeed_config, packed_rows_deepspeed_config
from autotune.formats.llamafactory import llamafactory_config
from autotune.formats.model import emitted_model_kwargs, lora_config
from autotune.formats.training_args import emitted_training_args
from autotune.formats.trl import sft_config
from autotune.spec.probe_request import ProbeRequest
from autotune.spec.result import ProbeResult
from autotune.store.atomic import write_text_atomic

__all__ = ["EMITTED_FILES", "build_files", "emit_all", "target_device", "render_train_sft_script"]

EMITTED_FILES = (
    "training_args.json",
    "model_kwargs.json",
    "lora_config.json",
    "accelerate_config.yaml",
    "deepspeed.json",
    "deepspeed_packed.json",
    "train.py",
    "sft_config.json",
    "train_sft.py",
    "axolotl.yaml",
    "llamafactory.yaml",
)

# chat/text columns -> Axolotl's dataset type
_AXOLOTL_DATASET_TYPES = {"messages": "chat_template", "text": "completion"}

_ACCELERATE_HEADER = (
    "# Written by autotune. Launch with:\n"
    "#   accelerate launch --config_file accelerate_config.yaml train.py --model MODEL --dataset DATA.jsonl\n"
)
_ACCELERATE_RELATIVE = "# deepspeed_config_file (if any) is relative to the directory you launch from.\n"


def _located(location: str | None, name: str) -> str:
    """``name`` in the answer's folder: absolute when the folder is known (every client resolves a
    config path against the working directory, not against the file naming it), else bare."""
    return f"{location.rstrip('/')}/{name}" if location else name


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"


def _yaml_with_notes(title: str, notes: list[str], cfg: dict[str, Any]) -> str:
    lines = [f"# Written by autotune. {title}"]
    lines += [f"# NOTE {n}" for n in notes]
    return "\n".join(lines) + "\n" + yaml.safe_dump(cfg, sort_keys=False)


def build_files(
    best: ProbeResult,
    *,
    fields: set[str],
    device: str | None = None,
    report_to: str | list[str] = "none",
    location: str | None = None,
    paths: dict[str, str] | None = None,
) -> dict[str, str]:
    """File name -> text for the best result. ``fields``: the installed TrainingArguments' field names.

    ``location``: the absolute folder the files will be written to (the DeepSpeed file the others name is
    referred to by its absolute path there); ``paths``: the request's local paths (``tokenizer``,
    ``dataset``, ``model``) made absolute by the caller, so the scripts run from any working directory.
    """
    if not best.fits:
        raise AutotuneError(
            f"can only emit a configuration that fits; this probe's status is {best.status!r}"
        )
    req = best.probe_request()
    dev = device or target_device(best)
    try:
        targs = emitted_training_args(req, fields=fields, device=dev, report_to=report_to)
    except ValueError as exc:
        raise AutotuneError(str(exc)) from exc
    local = paths or {}
    files, ds_path = _transformers_files(best, req, targs, device=dev, location=location)
    if ds_path is not None and req.candidate.packing:  # Axolotl and LLaMA-Factory count packed rows
        files["deepspeed_packed.json"] = _json(packed_rows_deepspeed_config(json.loads(files["deepspeed.json"])))
        rows_ds_path: str | None = _located(location, "deepspeed_packed.json")
    else:
        rows_ds_path = ds_path
    files["train.py"] = _train_script(req, local)
    # the trainers people use: TRL, Axolotl, LLaMA-Factory
    files.update(_trl_files(best, req, fields=fields, device=dev, report_to=report_to, local=local))
    files.update(_trainer_cli_files(best, req, fields=fields, device=dev, ds_path=rows_ds_path, local=local))
    return files


def _transformers_files(
    best: ProbeResult, req: ProbeRequest, targs: dict[str, Any], *, device: str, location: str | None
) -> tuple[dict[str, str], str | None]:
    """The Trainer's files (arguments, model kwargs, LoRA, DeepSpeed, accelerate) and the path the others
    give the DeepSpeed file by (None without one)."""
    cand, wl = req.candidate, req.workload
    files: dict[str, str] = {
        "training_args.json": _json(targs),
        "model_kwargs.json": _json(emitted_model_kwargs(cand, wl)),
    }
    targets = best.metrics.get("lora_target_modules")  # what the probe actually adapted, if recorded
    lc = lora_config(wl, target_modules=targets)
    if lc is not None:
        files["lora_config.json"] = _json(lc)
    ds = emitted_deepspeed_config(
        cand,
        max_grad_norm=float(targs.get("max_grad_norm", 1.0)),
        learning_rate=float(targs.get("learning_rate", 2e-5)),
    )
    if ds is not None:
        files["deepspeed.json"] = _json(ds)
    ds_path = _located(location, "deepspeed.json") if ds is not None else None
    acc = accelerate_config(cand, device=device, deepspeed_file=ds_path or "deepspeed.json")
    files["accelerate_config.yaml"] = (_ACCELERATE_HEADER + ("" if location else _ACCELERATE_RELATIVE)
                                       + yaml.safe_dump(acc, sort_keys=True))
    return files, ds_path


def _train_script(req: ProbeRequest, local: dict[str, str]) -> str:
    """``train.py``, fed the batches the probe measured."""
    cand, wl = req.candidate, req.workload
    measured = {
        "seed": wl.seed,
        "lengths": wl.lengths,
        "dataset": local.get("dataset", wl.dataset),
        "split": wl.split,
        "tokenizer": local.get("tokenizer", wl.tokenizer),
        "worst_case_first": req.settings.usable_bytes() is not None,  # as the probe (worker.py)
        "precision": cand.precision,
        "cuda_alloc_conf": req.settings.cuda_alloc_conf,
    }
    return render_train_script(seq_len=wl.seq_len, packing=cand.packing, measured=measured)


def _trl_files(
    best: ProbeResult,
    req: ProbeRequest,
    *,
    fields: set[str],
    device: str,
    report_to: str | list[str],
    local: dict[str, str],
) -> dict[str, str]:
    """TRL's ``sft_config.json`` and the ``train_sft.py`` that runs SFTTrainer on it."""
    wl = req.workload
    mean_len = packed_sequence_tokens(best.metrics)  # the row tokens a packed sequence takes
    return {
        "sft_config.json": _json(
            sft_config(req, fields=fields, device=device, report_to=report_to, mean_seq_len=mean_len)
        ),
        "train_sft.py": render_train_sft_script(
            measured={
                "model": local.get("model", wl.model_path or wl.model),
                "dataset": local.get("dataset", wl.dataset),
                "split": wl.split,
                "tokenizer": local.get("tokenizer", wl.tokenizer),
                "cuda_alloc_conf": req.settings.cuda_alloc_conf,
            }
        ),
    }


def _trainer_cli_files(
    best: ProbeResult,
    req: ProbeRequest,
    *,
    fields: set[str],
    device: str,
    ds_path: str | None,
    local: dict[str, str],
) -> dict[str, str]:
    """Axolotl's and LLaMA-Factory's YAML files."""
    mean_len = packed_sequence_tokens(best.metrics)  # the row tokens a packed sequence takes
    column = best.metrics.get("dataset_column")
    wl = req.workload
    # Axolotl and LLaMA-Factory open the model and the data from the working directory: absolute paths
    wl = dataclasses.replace(wl, model=local.get("model", wl.model), dataset=local.get("dataset", wl.dataset))
    req = dataclasses.replace(req, workload=wl)
    ax, ax_notes = axolotl_config(
        req.candidate,
        wl,
        mean_seq_len=mean_len,
        deepspeed_path=ds_path,
        device=device,
        dataset_type=_AXOLOTL_DATASET_TYPES.get(str(column)),
    )
    ax_notes += _test_model_note(wl.model, "base_model")
    env = _launch_env(req)
    files = {"axolotl.yaml": _yaml_with_notes(f"Train with: {env}axolotl train axolotl.yaml", ax_notes, ax)}
    lf, lf_notes = llamafactory_config(
        req, fields=fields, device=device, mean_seq_len=mean_len, deepspeed_path=ds_path,
        dataset_column=None if column is None else str(column),
    )
    lf_notes += _test_model_note(wl.model, "model_name_or_path")
    files["llamafactory.yaml"] = _yaml_with_notes(
        f"Train with: {env}llamafactory-cli train llamafactory.yaml", lf_notes, lf
    )
    return files


def _launch_env(req: ProbeRequest) -> str:
    """The environment a launch line carries for what the probes measured (the CUDA allocator's setting;
    ``train.py`` and ``train_sft.py`` set it themselves), "" when none."""
    conf = req.settings.cuda_alloc_conf
    return f"PYTORCH_CUDA_ALLOC_CONF={shlex.quote(conf)} " if conf else ""


def _test_model_note(model: str, key: str) -> list[str]:
    """A built-in test model (tiny-llama, ...) is a config.json without weights: no client can load it."""
    from autotune.models import TINY

    if model not in {t.name for t in TINY}:
        return []
    return [f"model: {model} is autotune's built-in test model (a config.json, no weights to load): set {key} "
            "to your model's folder or Hub id"]


def _absolute_paths(best: ProbeResult) -> dict[str, str]:
    """The request's tokenizer / dataset / model folders that exist here, made absolute (as typed they are
    relative to where ``autotune run`` ran, and the emitted scripts run from anywhere)."""
    wl = best.probe_request().workload
    out: dict[str, str] = {}
    for key, value in (("tokenizer", wl.tokenizer), ("dataset", wl.dataset), ("model", wl.model)):
        if isinstance(value, str) and value and not os.path.isabs(value) and os.path.exists(value):
            out[key] = os.path.abspath(value)
    return out


def emit_all(
    best: ProbeResult,
    out_dir: Path,
    *,
    fields: set[str],
    device: str | None = None,
    report_to: str | list[str] = "none",
) -> list[Path]:
    """Write every file for ``best`` into ``out_dir``; returns the written paths.

    All texts are built first (a failure there leaves ``out_dir`` untouched), then each file is
    written atomically (temporary file + ``os.replace``), so none is ever half-written. Emitted files
    that this configuration does not have (e.g. a stale ``deepspeed.json`` from an earlier run) are
    removed afterwards, so the directory describes one configuration.
    """
    out_dir = Path(out_dir)
    files = build_files(best, fields=fields, device=device, report_to=report_to,
                        location=str(out_dir.resolve()), paths=_absolute_paths(best))
    written = [write_text_atomic(out_dir / name, text) for name, text in files.items()]
    umask = os.umask(0)  # read the umask (there is no getter) and put it back
    os.umask(umask)
    for script in ("train.py", "train_sft.py"):
        os.chmod(out_dir / script, 0o777 & ~umask)  # executable, as far as the umask allows
    for name in EMITTED_FILES:
        if name not in files and (out_dir / name).exists():
            (out_dir / name).unlink()
    return written
