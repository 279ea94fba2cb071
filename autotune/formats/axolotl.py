"""Axolotl YAML (``axolotl train config.yml``).  [pure]

Key names and defaults from Axolotl's pydantic schema (``AxolotlInputConfig``; the accepted key set
and its commit are in ``autotune/emit/schemas/axolotl_keys.json``). Axolotl ignores keys its schema does not have (pydantic's
default), so an unknown key is a setting that silently does nothing.

Semantics: with ``sample_packing`` Axolotl's ``micro_batch_size`` counts packed rows of
``sequence_len`` tokens, autotune's micro-batch counts sequences; with fixed-length data (autotune's
default synthetic workload) the two are the same number, with shorter real rows one Axolotl row holds
several sequences (see the README).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.formats._common import changed, local_dataset
from autotune.formats.training_args import precision_of

__all__ = ["NAME", "LABEL", "VOCAB", "MARKERS", "AXOLOTL_LOADER_DEFAULTS", "deprecations", "detect", "to_request",
           "to_checklist", "tuned_keys"]

NAME = "axolotl"
LABEL = "Axolotl"
MARKERS = frozenset({"base_model", "micro_batch_size", "sequence_len", "sample_packing", "adapter", "datasets",
                     "num_epochs", "lora_target_linear", "val_set_size"})
VOCAB: dict[str, str] = {
    "per_device_train_batch_size": "micro_batch_size",
    "dataloader_persistent_workers: true": "",  # no Axolotl key
    "report_to: tensorboard (or wandb, trackio, mlflow; the integration must be installed)":
        "use_tensorboard: true (or wandb_project: NAME, use_mlflow: true, use_trackio: true)",
    "report_to 'none': loss and metrics are not tracked":
        "no tracker set (use_tensorboard, wandb_project, use_mlflow, use_trackio): loss and metrics are not tracked",
    "report_to": "tracking",
    "seed: 42 (and data_seed)": "seed: 42",
    "save_strategy: steps, save_steps: 500, save_total_limit: 3": "save_steps: 500 (or saves_per_epoch), "
                                                                  "save_total_limit: 3",
    "optim": "optimizer",
}
# the attention keys Axolotl has had: attn_implementation (current) and the deprecated booleans
_ATTN_BOOLS = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager",
               "flex_attention": "flex_attention"}
DEFAULTS: dict[str, Any] = {
    "micro_batch_size": 1, "gradient_accumulation_steps": 1, "gradient_checkpointing": False,
    "sample_packing": False, "dataloader_num_workers": 0, "dataloader_pin_memory": True, "bf16": False,
    "fp16": False, "optimizer": "adamw_torch_fused", "torch_compile": False,
}  # fmt: skip


_LORA_KERNELS = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")
_LOADER_KEYS = ("dataloader_num_workers", "dataloader_pin_memory", "dataloader_prefetch_factor")
# what Axolotl sets when none of _LOADER_KEYS is given: one worker per GPU (WORLD_SIZE), pinned, prefetch 256
AXOLOTL_LOADER_DEFAULTS = {"dataloader_num_workers": 1, "dataloader_pin_memory": True}
_DEPRECATED_KEYS = {"noisy_embedding_alpha": "neftune_noise_alpha", "dpo_beta": "rl_beta",
                    "evaluation_strategy": "eval_strategy"}


def detect(cfg: Mapping[str, Any]) -> bool:
    return "base_model" in cfg or len(MARKERS & set(cfg)) >= 2


def _attn(cfg: Mapping[str, Any]) -> str | None:
    if isinstance(cfg.get("attn_implementation"), str):
        return str(cfg["attn_implementation"])
    for key, attn in _ATTN_BOOLS.items():
        if cfg.get(key) is True:
            return attn
    return None


def _mode(cfg: Mapping[str, Any]) -> str:
    adapter = cfg.get("adapter")
    if adapter == "qlora" or (adapter == "lora" and cfg.get("load_in_4bit")):
        return "qlora"
    return "lora" if adapter == "lora" else "full"


def _report_to(cfg: Mapping[str, Any]) -> list[str]:
    names = []
    if cfg.get("wandb_project") or cfg.get("use_wandb"):
        names.append("wandb")
    for key, name in (("use_tensorboard", "tensorboard"), ("use_mlflow", "mlflow"), ("use_comet", "comet_ml"),
                      ("use_trackio", "trackio")):
        if cfg.get(key):
            names.append(name)
    return names


def to_request(cfg: Mapping[str, Any]) -> dict[str, Any]:
    mb = cfg.get("micro_batch_size", 1)
    acc = cfg.get("gradient_accumulation_steps", 1)
    req: dict[str, Any] = {"mode": _mode(cfg), "micro_batch": mb, "grad_accum": acc,
                           "precision": precision_of(cfg.get("bf16"), cfg.get("fp16"), cfg.get("tf32")),
                           "packing": bool(cfg.get("sample_packing")),
                           "workers": cfg.get("dataloader_num_workers", 0),
                           "grad_ckpt": bool(cfg.get("gradient_checkpointing"))}
    if isinstance(cfg.get("base_model"), str):
        req["model"] = cfg["base_model"]
    if isinstance(cfg.get("sequence_len"), int):
        req["seq_len"] = cfg["sequence_len"]
    if isinstance(mb, int) and isinstance(acc, int):
        req["effective_batch"] = mb * acc
    if req["mode"] != "full":
        for key, field in (("lora_r", "lora_r"), ("lora_alpha", "lora_alpha")):
            if isinstance(cfg.get(key), int):
                req[field] = cfg[key]
    attn = _attn(cfg)
    if attn:
        req["attn"] = attn
    datasets = cfg.get("datasets")
    if isinstance(datasets, list) and datasets and isinstance(datasets[0], Mapping):
        ds = local_dataset(datasets[0].get("path"))
        if ds:
            req["dataset"] = ds
    return req


def to_checklist(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    ta: dict[str, Any] = {
        "per_device_train_batch_size": cfg.get("micro_batch_size", 1),
        "gradient_accumulation_steps": cfg.get("gradient_accumulation_steps", 1),
        "report_to": _report_to(cfg) or "none",
    }
    for key in ("bf16", "fp16", "tf32", "gradient_checkpointing", "dataloader_num_workers", "dataloader_pin_memory",
                "seed", "deepspeed"):
        if cfg.get(key) is not None:
            ta[key] = cfg[key]
    if ta.get("bf16") == "auto":
        ta["bf16"] = True  # Axolotl turns bf16 on where the GPU has it
    if all(cfg.get(k) is None for k in _LOADER_KEYS):
        # Axolotl's validation sets these itself when all three are unset (default_dataloader_opts)
        ta.update(AXOLOTL_LOADER_DEFAULTS)
    # Axolotl's trainer builder: save_steps -> steps; else save_strategy; else every epoch; keeps 4 unless told
    if cfg.get("save_steps"):
        ta.update(save_strategy="steps", save_steps=cfg["save_steps"])
    else:
        ta["save_strategy"] = cfg.get("save_strategy") or "epoch"
    ta["save_total_limit"] = cfg.get("save_total_limit") or 4
    if cfg.get("fsdp") or cfg.get("fsdp_config"):
        ta["fsdp"] = " ".join(cfg["fsdp"]) if isinstance(cfg.get("fsdp"), list) else str(cfg.get("fsdp") or "full_shard")
        fsdp_config = cfg.get("fsdp_config") or {}
        if isinstance(fsdp_config, Mapping) and (fsdp_config.get("offload_params") or fsdp_config.get("fsdp_offload_params")):
            ta["fsdp"] += " offload"
    out: dict[str, dict[str, Any]] = {"training_args": ta}
    attn = _attn(cfg)
    mk: dict[str, Any] = {"attn_implementation": attn} if attn else {}
    if cfg.get("load_in_4bit"):
        mk["quantization_config"] = {"load_in_4bit": True}
    if mk:
        out["model_kwargs"] = mk
    if _mode(cfg) != "full":
        out["lora"] = {"r": cfg.get("lora_r"), "lora_alpha": cfg.get("lora_alpha")}
    return out


def deprecations(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(what Axolotl 0.19 warns about this file, the fix): its own deprecation warnings, read from its validators."""
    out: list[tuple[str, str]] = []
    fsdp_config = cfg.get("fsdp_config")
    if isinstance(fsdp_config, Mapping) and fsdp_config:
        version = cfg.get("fsdp_version") or fsdp_config.get("fsdp_version") or fsdp_config.get("version")
        if str(version) != "2":
            out.append(("FSDP1 is deprecated (Axolotl warns it will be removed)", "fsdp_version: 2"))
        if any(str(k).startswith("fsdp_") and k != "fsdp_version" for k in fsdp_config):
            out.append(("fsdp_config keys with the fsdp_ prefix are deprecated",
                        "drop the fsdp_ prefix inside fsdp_config (fsdp_offload_params -> offload_params)"))
    for old, new in _DEPRECATED_KEYS.items():
        if cfg.get(old) is not None:
            out.append((f"{old} is deprecated", f"use {new}"))
    return out


def tuned_keys(candidate: Mapping[str, Any], cfg: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    c = candidate
    prec = c["precision"]
    wanted: dict[str, Any] = {
        "micro_batch_size": c["micro_batch"],
        "gradient_accumulation_steps": c["grad_accum"],
        "gradient_checkpointing": bool(c["grad_ckpt"]),
        "sample_packing": bool(c["packing"]),
        "dataloader_num_workers": c["workers"],
        "dataloader_pin_memory": bool(c["pin_memory"]),
        "optimizer": c["optim"],
        "torch_compile": bool(c["torch_compile"]),
    }
    if not (prec == "bf16" and cfg.get("bf16") == "auto"):
        wanted["bf16"] = prec == "bf16"
        wanted["fp16"] = prec == "fp16"
    if prec == "tf32" or "tf32" in cfg:
        wanted["tf32"] = prec in ("tf32", "bf16")
    if _mode(cfg) != "full" and all(cfg.get(k) is None for k in _LORA_KERNELS):
        # Axolotl auto-enables its LoRA kernels when none is set; autotune measured without them
        wanted.update(dict.fromkeys(_LORA_KERNELS, False))
    if _attn(cfg) != c["attn"]:
        bool_key = next((k for k, v in _ATTN_BOOLS.items() if cfg.get(k) is True), None)
        if bool_key is not None and "attn_implementation" not in cfg:
            wanted[bool_key] = False
        wanted["attn_implementation"] = c["attn"]
    defaults = dict(DEFAULTS)
    if all(cfg.get(k) is None for k in _LOADER_KEYS):
        defaults.update(AXOLOTL_LOADER_DEFAULTS)  # what Axolotl would set: a measured 0 workers must be written
    return changed(cfg, wanted, defaults)
