"""Model references: built-in presets, tiny test models, local directories, the HF cache and the Hub.

Only configs live here; probes build models from them with random weights. Importing this
package imports neither torch nor transformers.
"""

from __future__ import annotations

from autotune.models._registry import PRESETS, TINY, PresetInfo
from autotune.models.hub import TOKENIZER_FILES, HubAccess, HubError, is_offline
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
    "TOKENIZER_FILES",
    "HubAccess",
    "HubError",
    "ModelSource",
    "PresetInfo",
    "ResolvedModel",
    "check_seq_len",
    "default_hf_cache_dir",
    "is_offline",
    "resolve_model",
]
