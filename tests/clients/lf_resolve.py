"""Run with LLaMA-Factory's python: what LLaMA-Factory's own parser makes of each YAML given.

    python lf_resolve.py [--run SCRIPT ARG] [--cwd DIR] FILE.yaml [...]
        ->  the last stdout line: JSON, path -> resolved values

``--cwd DIR`` resolves the files after it from DIR (a batch per working directory, one process for all), and
``--run SCRIPT ARG`` runs a script of the repository as ``python SCRIPT ARG`` would, in this process (its result
under ``"run SCRIPT"``: ``{}``, or the error it raised), so that one LLaMA-Factory start serves every check.

Reads each file as ``llamafactory-cli train FILE`` does (OmegaConf, then ``_parse_train_args``: HfArgumentParser
over its Model/Data/Training/Finetuning/Generating arguments, unknown keys refused). An answer tuned for a GPU
(no ``use_cpu``) is parsed with ``use_cpu: true`` added and ``tf32`` left out, since TrainingArguments refuses
bf16/tf32 without a GPU; ``adjusted`` lists what was changed. The DeepSpeed file a config names is opened the way
the HF Trainer opens it: relative to the working directory.
"""

import json
import os
import runpy
import sys
import traceback
from pathlib import Path

from llamafactory.hparams.parser import _parse_train_args
from omegaconf import OmegaConf


def resolve(path: str) -> dict:
    cfg = OmegaConf.to_container(OmegaConf.load(Path(path).absolute()))
    adjusted = []
    if cfg.get("use_cpu") is not True:
        cfg["use_cpu"] = True
        adjusted.append("use_cpu")
        if "tf32" in cfg:
            del cfg["tf32"]
            adjusted.append("tf32")
    ds_path = cfg.pop("deepspeed", None)  # opened below: the Trainer's DeepSpeed setup needs deepspeed and a launcher
    if ds_path is not None:
        adjusted.append("deepspeed")
    try:
        model, data, train, finetune, _ = _parse_train_args(cfg)
    except Exception as exc:  # the parser's refusal is the answer
        return {"error": f"{type(exc).__name__}: {exc}"}
    out = {
        "adjusted": adjusted,
        "micro_batch": train.per_device_train_batch_size,
        "grad_accum": train.gradient_accumulation_steps,
        "grad_ckpt": not model.disable_gradient_checkpointing or bool(train.gradient_checkpointing),
        "use_reentrant_gc": model.use_reentrant_gc,
        "flash_attn": str(getattr(model.flash_attn, "value", model.flash_attn)),
        "bf16": train.bf16,
        "fp16": train.fp16,
        "packing": bool(data.packing),
        "neat_packing": bool(data.neat_packing),
        "finetuning_type": finetune.finetuning_type,
        "lora_rank": finetune.lora_rank,
        "lora_target": finetune.lora_target,
        "quantization_bit": model.quantization_bit,
        "liger": bool(model.enable_liger_kernel),
        "optim": str(getattr(train.optim, "value", train.optim)),
        "workers": train.dataloader_num_workers,
        "cutoff_len": data.cutoff_len,
        "torch_compile": bool(train.torch_compile),
    }
    if ds_path is not None:
        try:
            ds = json.loads(Path(ds_path).read_text())  # relative paths: from the working directory
        except OSError as exc:
            out["deepspeed_error"] = f"{ds_path}: {exc.strerror} (from {os.getcwd()})"
        else:
            zero = ds.get("zero_optimization", {})
            out["zero_stage"] = zero.get("stage")
            out["offload"] = ("params" if "offload_param" in zero else
                              "optimizer" if "offload_optimizer" in zero else "none")
    return out


def run(script: str, arg: str) -> dict:
    argv = sys.argv
    sys.argv = [script, arg]
    try:
        runpy.run_path(script, run_name="__main__")
    except BaseException:  # noqa: B036 - a SystemExit from the script is its failure too, reported with the rest
        return {"error": traceback.format_exc()[-3000:]}
    finally:
        sys.argv = argv
    return {}


def main(args: list[str]) -> dict:
    out = {}
    while args:
        arg = args.pop(0)
        if arg == "--cwd":
            os.chdir(args.pop(0))
        elif arg == "--run":
            script, script_arg = args.pop(0), args.pop(0)
            out[f"run {script}"] = run(script, script_arg)
        else:
            out[arg] = resolve(arg)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
