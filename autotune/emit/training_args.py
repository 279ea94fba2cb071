"""The TrainingArguments and model arguments the probe and the emitted files share, under their old path.  [pure]

They live in ``autotune.formats.training_args`` (the TrainingArguments lever table, both directions),
``autotune.formats.model`` (model kwargs, LoRA) and ``autotune.formats.deepspeed`` / ``autotune.formats.accelerate``;
this module re-exports them so ``autotune.emit.training_args`` keeps working for the probe and the estimator.
"""

from __future__ import annotations

from autotune.formats.accelerate import accelerate_config
from autotune.formats.deepspeed import deepspeed_config, emitted_deepspeed_config
from autotune.formats.model import (
    LORA_DROPOUT,
    emitted_model_kwargs,
    lora_config,
    lora_target_modules,
    model_dtype,
    model_kwargs,
    quantization_config,
)
from autotune.formats.training_args import (
    LEARNING_RATES,
    RUN_DEFAULTS,
    RUN_ONLY_KEYS,
    WARMUP_RATIO,
    checkpointing_field,
    emitted_training_args,
    performance_kwargs,
    probe_kwargs,
)

__all__ = [
    "LEARNING_RATES", "LORA_DROPOUT", "RUN_DEFAULTS", "RUN_ONLY_KEYS", "WARMUP_RATIO", "accelerate_config",
    "checkpointing_field", "deepspeed_config", "emitted_deepspeed_config", "emitted_model_kwargs",
    "emitted_training_args", "lora_config", "lora_target_modules", "model_dtype", "model_kwargs", "performance_kwargs",
    "probe_kwargs", "quantization_config",
]  # fmt: skip
