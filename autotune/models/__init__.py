"""Model references: built-in presets, tiny test models, local directories and the HF cache.

Only configs live here; probes build models from them with random weights. Importing this
package imports neither torch nor transformers.
"""

from __future__ import annotations

from autotune.models._registry import PRESETS, TINY, PresetInfo
from autotune.models.resolve import (
    ModelSource,
    ResolvedModel,
    check_seq_len,
    default_hf_cache_dir,
    resolve_model,
)

__all__ = [
    "PRESETS",
    "TINY",
    "ModelSource",
    "PresetInfo",
    "ResolvedModel",
    "check_seq_len",
    "default_hf_cache_dir",
    "resolve_model",
]
