"""TRL's ``sft_config.json`` and the ``--trainer trl`` probe's overrides, under their old path.  [pure]

They live in ``autotune.formats.trl`` (SFTConfig, both directions); re-exported here for the TRL probe.
"""

from __future__ import annotations

from autotune.formats.trl import (
    LEVER_KEYS,
    PACKING_NOTE,
    SFT_KEYS,
    TRL_PACKING_QUALITY_NOTE,
    sft_config,
    sft_probe_overrides,
)

__all__ = ["SFT_KEYS", "LEVER_KEYS", "PACKING_NOTE", "TRL_PACKING_QUALITY_NOTE", "sft_config", "sft_probe_overrides"]
