"""Run with Axolotl's python: what Axolotl's own config loader makes of each YAML given.

    python ax_resolve.py FILE.yaml [...]   ->  the last stdout line: JSON, path -> resolved values

Each file goes through ``axolotl.cli.config.load_cfg`` (what ``axolotl train FILE`` runs: plugins,
``validate_config`` with this machine's capabilities, ``normalize_config``); the warnings Axolotl logs while
doing so are returned with it. An answer for a GPU is validated with the capabilities of a bf16 GPU
(``bf16``/``tf32`` true), since Axolotl refuses ``bf16: true`` on a machine without one; a ``deepspeed:`` file
is opened from the working directory but left out of the validation (Axolotl starts an NCCL process group for
it); ``adjusted`` says what was changed.
"""

import json
import logging
import sys


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def resolve(path: str) -> dict:
    import yaml
    from axolotl.cli import config as cli_config

    raw = yaml.safe_load(open(path))
    adjusted = []
    ds_path = raw.pop("deepspeed", None)
    if ds_path is not None:
        # Axolotl starts a NCCL process group to load a DeepSpeed file, which a CPU machine cannot: the file is
        # validated without it and the DeepSpeed JSON opened below, from the working directory as Axolotl does
        path = path + ".nodeepspeed.yaml"
        with open(path, "w") as out:
            yaml.safe_dump(raw, out)
        adjusted.append("deepspeed")
    real = cli_config.gpu_capabilities
    if raw.get("bf16") is True or raw.get("tf32") is True:
        def gpu_like():
            caps, env = real()
            caps.update(bf16=True, tf32=True, compute_capability="sm_90")
            return caps, env
        cli_config.gpu_capabilities = gpu_like
        adjusted.append("capabilities: a bf16 GPU")
    keep = _Keep()
    logging.getLogger().addHandler(keep)
    logging.getLogger("axolotl").addHandler(keep)
    try:
        cfg = cli_config.load_cfg(path)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:2000], "warnings": keep.messages}
    finally:
        cli_config.gpu_capabilities = real
        logging.getLogger().removeHandler(keep)
        logging.getLogger("axolotl").removeHandler(keep)
    attn = cfg.get("attn_implementation")
    out = {
        "adjusted": adjusted,
        "warnings": sorted(set(keep.messages)),
        "micro_batch": cfg.micro_batch_size,
        "grad_accum": cfg.gradient_accumulation_steps,
        "batch_size": cfg.batch_size,
        "grad_ckpt": bool(cfg.gradient_checkpointing),
        "grad_ckpt_kwargs": cfg.gradient_checkpointing_kwargs,
        "attn": str(attn) if attn is not None else None,
        "bf16": cfg.bf16,
        "fp16": cfg.fp16,
        "tf32": cfg.tf32,
        "sample_packing": bool(cfg.sample_packing),
        "adapter": cfg.adapter,
        "load_in_4bit": bool(cfg.load_in_4bit),
        "lora_r": cfg.lora_r,
        "lora_target_modules": cfg.lora_target_modules,
        "lora_kernels": {k: cfg.get(k) for k in ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel",
                                                 "lora_embedding_kernel")},
        # unset here, the Trainer's own defaults apply (Axolotl passes only what is set): 0 workers, pinned
        "workers": 0 if cfg.dataloader_num_workers is None else cfg.dataloader_num_workers,
        "pin_memory": True if cfg.dataloader_pin_memory is None else cfg.dataloader_pin_memory,
        "prefetch_factor": cfg.dataloader_prefetch_factor,
        "optimizer": str(cfg.optimizer),
        "torch_compile": cfg.torch_compile,
        "deepspeed": cfg.deepspeed,
        "fsdp_version": cfg.fsdp_version,
        "fsdp_config": dict(cfg.fsdp_config) if cfg.fsdp_config else None,
        "plugins": cfg.plugins,
        "save_steps": cfg.save_steps,
        "saves_per_epoch": cfg.saves_per_epoch,
    }
    if ds_path is not None:
        import os
        try:
            with open(ds_path) as f:
                ds = json.load(f)
        except OSError as exc:
            out["deepspeed_error"] = f"{ds_path}: {exc.strerror} (from {os.getcwd()})"
            return out
        zero = ds.get("zero_optimization", {})
        out["zero_stage"] = zero.get("stage")
        out["offload"] = ("params" if "offload_param" in zero else
                          "optimizer" if "offload_optimizer" in zero else "none")
    return out


if __name__ == "__main__":
    results = {p: resolve(p) for p in sys.argv[1:]}
    print("\n" + json.dumps(results, default=str))
