"""The built-in model table: presets (published configs) and tiny test models.  [pure]

Each entry has a directory ``presets/<name>/`` or ``tiny/<name>/`` beside this file holding a
``config.json``. Preset configs copy the architecture fields of the model's published
``config.json`` on the Hugging Face hub; ``params`` is the parameter count of the model built from
it (checked against the published size in ``tests/test_models.py``). Weights never come from here:
probes build models with random weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["PresetInfo", "PRESETS", "TINY", "lookup"]

_HERE = Path(__file__).resolve().parent

PresetKind = Literal["preset", "tiny"]


@dataclass(frozen=True)
class PresetInfo:
    """One built-in model: a short name, the hub ids it answers to, and where its config lives."""

    name: str
    hub_ids: tuple[str, ...]
    params: int
    description: str
    kind: PresetKind = "preset"

    @property
    def hub_id(self) -> str | None:
        """The canonical hub id (None for tiny test models, which exist only here)."""
        return self.hub_ids[0] if self.hub_ids else None

    @property
    def display_name(self) -> str:
        """The name to show: the canonical hub id, else the short name."""
        return self.hub_id or self.name

    @property
    def path(self) -> str:
        """Directory holding this model's ``config.json``."""
        folder = "presets" if self.kind == "preset" else "tiny"
        return str(_HERE / folder / self.name)


PRESETS: tuple[PresetInfo, ...] = (
    PresetInfo(
        "llama-3.1-8b",
        ("meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B"),
        8_030_261_248,
        "Llama 3.1 8B: 8.03B params, 32 layers, GQA 32/8 heads, 128k vocab, 128k context",
    ),
    PresetInfo(
        "llama-3.1-70b",
        ("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"),
        70_553_706_496,
        "Llama 3.1 70B: 70.6B params, 80 layers, GQA 64/8 heads, 128k vocab, 128k context",
    ),
    PresetInfo(
        "llama-3.2-1b",
        ("meta-llama/Llama-3.2-1B",),
        1_235_814_400,
        "Llama 3.2 1B: 1.24B params, 16 layers, GQA 32/8 heads, 128k vocab, tied embeddings",
    ),
    PresetInfo(
        "llama-3.2-3b",
        ("meta-llama/Llama-3.2-3B",),
        3_212_749_824,
        "Llama 3.2 3B: 3.21B params, 28 layers, GQA 24/8 heads, 128k vocab, tied embeddings",
    ),
    PresetInfo(
        "mistral-7b",
        ("mistralai/Mistral-7B-v0.3",),
        7_248_023_552,
        "Mistral 7B v0.3: 7.25B params, 32 layers, GQA 32/8 heads, 32k vocab, 32k context",
    ),
    PresetInfo(
        "mistral-7b-v0.1",
        ("mistralai/Mistral-7B-v0.1",),
        7_241_732_096,
        "Mistral 7B v0.1: 7.24B params, 32 layers, GQA 32/8 heads, 32,000 vocab, 4k sliding window",
    ),
    PresetInfo(
        "qwen2.5-0.5b",
        ("Qwen/Qwen2.5-0.5B",),
        494_032_768,
        "Qwen2.5 0.5B: 494M params, 24 layers, GQA 14/2 heads, 152k vocab, tied embeddings",
    ),
    PresetInfo(
        "qwen2.5-1.5b",
        ("Qwen/Qwen2.5-1.5B",),
        1_543_714_304,
        "Qwen2.5 1.5B: 1.54B params, 28 layers, GQA 12/2 heads, 152k vocab, tied embeddings",
    ),
    PresetInfo(
        "qwen2.5-7b",
        ("Qwen/Qwen2.5-7B",),
        7_615_616_512,
        "Qwen2.5 7B: 7.62B params, 28 layers, GQA 28/4 heads, 152k vocab",
    ),
    PresetInfo(
        "qwen2.5-72b",
        ("Qwen/Qwen2.5-72B",),
        72_706_203_648,
        "Qwen2.5 72B: 72.7B params, 80 layers, GQA 64/8 heads, 152k vocab",
    ),
    PresetInfo(
        "gemma-2-2b",
        ("google/gemma-2-2b",),
        2_614_341_888,
        "Gemma 2 2B: 2.61B params, 26 layers, GQA 8/4 heads, 256k vocab, 8k context",
    ),
    PresetInfo(
        "phi-3-mini",
        ("microsoft/Phi-3-mini-4k-instruct",),
        3_821_079_552,
        "Phi-3 mini 4k: 3.82B params, 32 layers, 32 heads (no GQA), 32k vocab, 4k context",
    ),
    PresetInfo(
        "gpt2",
        ("openai-community/gpt2", "gpt2"),
        124_439_808,
        "GPT-2 small: 124M params, 12 layers, 12 heads, 50k vocab, 1k context",
    ),
    PresetInfo(
        "smollm2-135m",
        ("HuggingFaceTB/SmolLM2-135M",),
        134_515_008,
        "SmolLM2 135M: 135M params, 30 layers, GQA 9/3 heads, 49k vocab, tied embeddings",
    ),
    PresetInfo(
        "smollm2-360m",
        ("HuggingFaceTB/SmolLM2-360M",),
        361_821_120,
        "SmolLM2 360M: 362M params, 32 layers, GQA 15/5 heads, 49k vocab, tied embeddings",
    ),
    PresetInfo(
        "smollm2-1.7b",
        ("HuggingFaceTB/SmolLM2-1.7B",),
        1_711_376_384,
        "SmolLM2 1.7B: 1.71B params, 24 layers, 32 heads, 49k vocab, tied embeddings",
    ),
)

TINY: tuple[PresetInfo, ...] = (
    PresetInfo(
        "tiny-llama",
        (),
        4_000_000,
        "test model: Llama, 4.0M params, hidden 256, 4 layers, GQA 4/2 heads, vocab 2048",
        kind="tiny",
    ),
    PresetInfo(
        "tiny-qwen2",
        (),
        3_477_760,
        "test model: Qwen2, 3.5M params, hidden 256, 4 layers, GQA 4/2 heads, vocab 2048, tied",
        kind="tiny",
    ),
    PresetInfo(
        "tiny-mistral",
        (),
        4_000_000,
        "test model: Mistral, 4.0M params, hidden 256, 4 layers, GQA 4/2 heads, vocab 2048",
        kind="tiny",
    ),
    PresetInfo(
        "tiny-gpt2",
        (),
        3_945_984,
        "test model: GPT-2, 3.9M params, hidden 256, 4 layers, 4 heads, vocab 2048, tied",
        kind="tiny",
    ),
)


def _build_index() -> dict[str, PresetInfo]:
    index: dict[str, PresetInfo] = {}
    for info in (*PRESETS, *TINY):
        keys = {info.name}
        for hub_id in info.hub_ids:
            keys.add(hub_id)
            keys.add(hub_id.rsplit("/", 1)[-1])  # the bare repo name: "Mistral-7B-v0.3"
        for key in keys:
            other = index.setdefault(key.lower(), info)
            if other is not info:  # a programming error in the table above, not user input
                raise RuntimeError(f"model name {key!r} is claimed by {other.name} and {info.name}")
    return index


_INDEX = _build_index()


def lookup(ref: str) -> PresetInfo | None:
    """The preset or tiny model that ``ref`` names (short name or hub id, any case), else None."""
    return _INDEX.get(ref.strip().lower())
