"""The config formats users already have, read and written back in their own vocabulary.  [pure]

One module per format holds the whole key mapping, both directions (see ``_common``):
``training_args`` (TrainingArguments JSON/YAML), ``trl`` (SFTConfig), ``axolotl``, ``llamafactory``,
``accelerate``, ``deepspeed``. ``read_config`` parses and detects; ``known_keys`` gives the key set a
format accepts (Axolotl from ``autotune/emit/schemas/axolotl_keys.json``, recorded from its source with
``tools/extract_target_keys.py``; LLaMA-Factory from ``llamafactory_fields.json``, every argument its pinned
release parses, recorded from an install with ``tools/record_client_fields.py``; TrainingArguments / SFTConfig
from the installed packages, passed in);
``write_back_text`` changes the tuned keys of the user's file and nothing else.

The training frameworks' modules (``training_args``, ``trl``, ``axolotl``, ``llamafactory``) each hold one
lever-to-key table (``LEVER_KEYS``, ``lever_values``) that the emitted file (``autotune.emit``) and the
write-back (:func:`tuned_file`) both use; :func:`measured_at` says what the values depend on besides the
candidate (the device, the sequence length, the mean real length packed rows are counted from).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from types import ModuleType
from typing import Any

from autotune.errors import SpecError
from autotune.formats import accelerate, axolotl, deepspeed, llamafactory, training_args, trl
from autotune.formats._common import REQUEST_FIELDS, Measured, packed_sequence_tokens
from autotune.formats._distributed import (
    REFERENCE_KINDS,
    base64_json,
    deepspeed_fixed_values,
    distributed_setup,
    locate_reference,
    setup_words,
)
from autotune.formats._inputs import unmeasured_problems, value_problems
from autotune.formats._types import ENUMS_JUDGED, enum_problems, numbers_read_as_text, type_problems
from autotune.formats._writeback import is_yaml_name, uneditable, write_back_text
from autotune.formats.training_args import checkpointed_every, stated_checkpointing_kwargs
from autotune.spec.dataset_ref import DATA_FILE_SUFFIXES
from autotune.spec.result import ProbeResult

__all__ = [
    "FORMATS",
    "Measured",
    "REFERENCE_KINDS",
    "base64_json",
    "REQUEST_FIELDS",
    "ReadConfig",
    "checkpointed_every",
    "ENUMS_JUDGED",
    "deepspeed_fixed_values",
    "detect_format",
    "distributed_setup",
    "enum_problems",
    "file_references",
    "format_module",
    "key_source",
    "key_source_label",
    "known_keys",
    "locate_reference",
    "measured_at",
    "numbers_read_as_text",
    "packed_sequence_tokens",
    "packs_into_rows",
    "parse_text",
    "read_config",
    "setup_words",
    "target_device",
    "translate",
    "tuned_file",
    "type_problems",
    "uneditable",
    "unexpressed_levers",
    "unified_diff",
    "unmeasured_problems",
    "writable_keys",
    "value_problems",
    "write_back_text",
]

# detection order: the most specific key sets first (LLaMA-Factory files also hold TrainingArguments keys)
FORMATS: dict[str, ModuleType] = {
    "deepspeed": deepspeed,
    "accelerate": accelerate,
    "axolotl": axolotl,
    "llamafactory": llamafactory,
    "trl": trl,
    "training_args": training_args,
}


@dataclass
class ReadConfig:
    name: str
    format: str
    data: dict[str, Any]
    text: str
    request: dict[str, Any] = field(default_factory=dict)
    # values of the wrong type (autotune.formats._types): one message each; ``clean`` is ``data`` without them
    problems: list[str] = field(default_factory=list)
    clean: dict[str, Any] = field(default_factory=dict)
    # the ZeRO/FSDP set-up it trains with and where that was read (``distributed_setup``, read by a --from run;
    # None with ``distributed_from`` saying why it could not be read)
    distributed: dict[str, Any] | None = None
    distributed_from: str = ""
    notes: list[str] = field(default_factory=list)  # what a --from run says about the file before it searches

    @property
    def module(self) -> ModuleType:
        return FORMATS[self.format]


def format_module(name: str) -> ModuleType:
    if name not in FORMATS:
        raise SpecError(f"--format must be one of {', '.join(FORMATS)}; got {name!r}")
    return FORMATS[name]


def parse_text(name: str, text: str) -> dict[str, Any]:
    """The file's top-level mapping (YAML for .yaml/.yml, JSON otherwise), through the bounded loaders
    (an alias bomb or a document nested thousands deep is a one-line SpecError, not minutes of CPU)."""
    from autotune.spec.files import load_json, load_yaml

    if is_yaml_name(name):
        data = load_yaml(text, what=name)
    else:
        try:
            data = load_json(text, what=name)
        except SpecError as exc:
            if _reads_as_yaml_mapping(text):
                raise SpecError(f"{name} is not JSON ({' '.join(str(exc).split())[:120]}); it reads as YAML: give it "
                                "a .yaml or .yml name, which is how autotune tells the two apart") from None
            raise
    if data is None:
        raise SpecError(f"{name} is empty: it must hold the settings (key: value lines)")
    if not isinstance(data, dict):
        raise SpecError(f"{name} must hold a mapping of settings, got {type(data).__name__}")
    return data




def _reads_as_yaml_mapping(text: str) -> bool:
    from autotune.spec.files import load_yaml

    try:
        return isinstance(load_yaml(text, what="text"), dict)
    except SpecError:
        return False


def _path_like(value: Any, suffixes: tuple[str, ...]) -> bool:
    """A string that can only mean a local path (a DeepSpeed value may also be base64 JSON, a dataset a Hub id)."""
    return isinstance(value, str) and bool(value) and (
        value.startswith(("/", "./", "../", "~")) or value.lower().endswith(suffixes))


def file_references(fmt: str, data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The local files and folders a ``fmt`` config names, as (key, path, kind): ``deepspeed`` (a DeepSpeed
    JSON: a regular file), ``dataset`` (a data file, or a folder of one) or ``folder``. The training tool
    refuses to start when one is missing, so ``autotune check`` FAILs it; a value that is not a path
    (a DeepSpeed config given inline or as base64, a Hub dataset id, LLaMA-Factory's ``ONLINE``) is left out."""
    refs: list[tuple[str, str, str]] = []
    ds = data.get("deepspeed")
    if fmt in ("training_args", "trl", "llamafactory", "axolotl") and isinstance(ds, str) and ds.strip() \
            and base64_json(ds) is None:  # a path, whatever its suffix: transformers reads any other string as one
        refs.append(("deepspeed", data["deepspeed"], "deepspeed"))
    if fmt == "accelerate":
        ds = data.get("deepspeed_config")
        if isinstance(ds, dict) and _path_like(ds.get("deepspeed_config_file"), (".json",)):
            refs.append(("deepspeed_config.deepspeed_config_file", ds["deepspeed_config_file"], "deepspeed"))
    if fmt == "axolotl":
        for section in ("datasets", "test_datasets"):
            entries = data.get(section)
            for i, entry in enumerate(entries if isinstance(entries, list) else []):
                if isinstance(entry, dict) and _path_like(entry.get("path"), DATA_FILE_SUFFIXES):
                    refs.append((f"{section}[{i}].path", entry["path"], "dataset"))
    if fmt == "trl" and _path_like(data.get("dataset_name"), DATA_FILE_SUFFIXES):
        refs.append(("dataset_name", data["dataset_name"], "dataset"))
    if fmt == "llamafactory" and isinstance(data.get("dataset_dir"), str) and data["dataset_dir"] not in ("", "ONLINE"):
        refs.append(("dataset_dir", data["dataset_dir"], "folder"))
    return refs


def detect_format(name: str, data: dict[str, Any]) -> str:
    for fmt, mod in FORMATS.items():
        if mod.detect(data):
            return fmt
    raise SpecError(
        f"{name}: cannot tell its format from its keys ({', '.join(list(data)[:6])}); "
        f"pass --format {'|'.join(FORMATS)}"
    )


# the type table (autotune.formats._types) each format's own keys follow
_TYPE_KIND = {"deepspeed": "deepspeed", "accelerate": "accelerate", "training_args": "training_args",
              "trl": "training_args", "llamafactory": "training_args", "axolotl": ""}


def without(data: dict[str, Any], dotted_keys: list[str]) -> dict[str, Any]:
    """A deep copy of ``data`` without the (dotted) keys."""
    import copy

    out = copy.deepcopy(data)
    for dotted in dotted_keys:
        *parents, last = dotted.split(".")
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def read_config(name: str, text: str, *, fmt: str | None = None) -> ReadConfig:
    """Parse and detect; values of the wrong type are listed in ``problems`` (the request is read
    without them, so a bad type is never a crash here: the caller refuses or FAILs them)."""
    data = parse_text(name, text)
    chosen = format_module(fmt).NAME if fmt else detect_format(name, data)
    # TRL's and LLaMA-Factory's parsers read 2e-5 as the number YAML 1.1 left as text (``data`` stays as written)
    read = numbers_read_as_text(data) if chosen in ("trl", "llamafactory") else data
    typed = type_problems(_TYPE_KIND.get(chosen, ""), read)
    clean = without(read, [k for k, _ in typed]) if typed else read
    try:
        raw = FORMATS[chosen].to_request(clean)
    except (TypeError, AttributeError, ValueError, KeyError) as exc:  # a shape the type table does not cover
        raise SpecError(f"{name}: a value has a type autotune cannot read ({type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:120]}); give each key the type its documentation names") from None
    req = {k: v for k, v in raw.items() if v is not None}
    return ReadConfig(name=name, format=chosen, data=data, text=text, request=req,
                      problems=[m for _, m in typed], clean=clean)


def _keys_file(fmt: str) -> dict[str, Any] | None:
    """``autotune/emit/schemas/<fmt>_keys.json`` (tools/extract_target_keys.py), the one record of the
    keys Axolotl / LLaMA-Factory accept: the emitters are tested against it, the checklist reads it."""
    if fmt not in ("axolotl", "llamafactory"):
        return None
    path = resources.files("autotune").joinpath("emit", "schemas", f"{fmt}_keys.json")
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _top_level_keys(fmt: str) -> set[str]:
    """The top-level section's keys and the plugins' (an Axolotl plugin's arguments are top-level keys)."""
    sections = (_keys_file(fmt) or {}).get("sections", {})
    return {k for name, keys in sections.items() if name == "" or name.startswith("plugin:") for k in keys}


def _client_fields(fmt: str) -> dict[str, Any] | None:
    """``autotune/emit/schemas/<fmt>_fields.json`` (tools/record_client_fields.py): every argument the pinned
    client release's own parser accepts, read from an install of it (its transformers included)."""
    if fmt != "llamafactory":
        return None
    path = resources.files("autotune").joinpath("emit", "schemas", f"{fmt}_fields.json")
    return dict(json.loads(path.read_text(encoding="utf-8")))


def key_source(fmt: str) -> dict[str, Any] | None:
    fields = _client_fields(fmt)
    if fields is not None:
        return dict(fields["source"])
    entry = _keys_file(fmt)
    return dict(entry["source"]) if entry else None


def key_source_label(fmt: str) -> str:
    """Where ``known_keys(fmt)`` comes from, in a few words (``llamafactory 0.9.5, transformers 5.6.0``)."""
    src = key_source(fmt) or {}
    if "commit" in src:
        return f"{src['repo']}@{src['commit'][:10]}"
    return ", ".join(f"{k} {v}" for k, v in src.items())


def known_keys(fmt: str, *, ta_fields: set[str] | None, trl_fields: set[str] | None = None) -> set[str] | None:
    """Every top-level key ``fmt`` accepts, or None where that cannot be known here."""
    if fmt == "training_args":
        return ta_fields
    if fmt == "trl":
        return trl_fields
    if fmt == "axolotl":
        return _top_level_keys("axolotl")
    if fmt == "llamafactory":
        # the pinned release's own parser, its transformers' TrainingArguments included (not the installed one:
        # a key newer transformers added is refused by LLaMA-Factory)
        return set((_client_fields("llamafactory") or {})["fields"])
    return None


def translate(fmt: str, text: str) -> str:
    """A checklist message or fix in ``fmt``'s vocabulary (longest phrases first)."""
    vocab = FORMATS[fmt].VOCAB
    for src in sorted(vocab, key=len, reverse=True):
        text = re.sub(r"(?<![\w])" + re.escape(src) + r"(?![\w])", lambda _m, v=vocab[src]: v, text)
    return text.replace(", ,", ",").replace(" ,", ",").strip().rstrip(",")


def target_device(best: ProbeResult) -> str:
    """``cpu`` or ``cuda``: where the configuration was measured (a CPU probe gives a CPU config)."""
    dev = str(best.request.get("settings", {}).get("device", "auto"))
    if dev in ("cpu", "cuda"):
        return dev
    env_dev = str(best.env.get("device", ""))
    if env_dev.startswith("cpu"):
        return "cpu"
    return "cuda"


def measured_at(best: ProbeResult, *, fields: set[str] | None = None, device: str | None = None) -> Measured:
    """What the lever keys of ``best``'s configuration depend on besides its levers: where it was measured,
    the sequence length and the mean real length (the rows a packed micro-batch fills)."""
    wl = best.probe_request().workload
    return Measured(device=device or target_device(best), mode=wl.mode, seq_len=wl.seq_len,
                    mean_seq_len=packed_sequence_tokens(best.metrics),
                    fields=None if fields is None else frozenset(fields))


def tuned_file(cfg: ReadConfig, candidate: dict[str, Any], *, fields: set[str] | None = None,
               best: ProbeResult | None = None) -> tuple[str, dict[str, Any]]:
    """(the user's file text with the tuned keys changed, those keys and values) for ``candidate``
    (``dataclasses.asdict`` of an ``autotune.spec.Candidate``). ``best``: the result it was measured in;
    with it the keys are the emitted file's exactly (packed rows, TF32 on a GPU, the sequence length),
    without it the levers that need no measurement."""
    at = measured_at(best, fields=fields) if best is not None else Measured(
        fields=None if fields is None else frozenset(fields))
    updates = cfg.module.tuned_keys(candidate, cfg.data, fields=fields, at=at)
    return write_back_text(cfg.name, cfg.text, updates), updates


def unified_diff(name: str, before: str, after: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{name}", tofile=f"b/{name}"))


# the keys under which each framework packs the dataset into rows of the sequence length ahead of
# training, so that its batch size counts ROWS (autotune's micro-batch counts sequences); TRL's
# padding_free alone keeps counting sequences
_ROW_PACKING_KEYS = {"axolotl": ("sample_packing",), "llamafactory": ("packing", "neat_packing"), "trl": ("packing",)}


def packs_into_rows(cfg: ReadConfig) -> str | None:
    """The key (``sample_packing``, ``packing``, ``neat_packing``) with which ``cfg`` packs sequences into
    rows, so that its batch keys count rows rather than sequences; None when they count sequences."""
    return next((k for k in _ROW_PACKING_KEYS.get(cfg.format, ()) if cfg.data.get(k) is True), None)


def unexpressed_levers(cfg: ReadConfig) -> dict[str, str]:
    """Levers a tuned copy of ``cfg`` cannot carry as measured -> why: the format has no key for them
    (its module's ``UNEXPRESSED``), or the file states the checkpointing kwargs as a mapping, which a
    write-back keeps as it is (``every_n_layers`` would be lost). A write-back's search holds them at their
    default."""
    out = {lever: f"{cfg.module.LABEL} has no key for it (the file {instead})"
           for lever, instead in getattr(cfg.module, "UNEXPRESSED", {}).items()}
    if cfg.format in ("training_args", "trl") and stated_checkpointing_kwargs(cfg.data):
        out["ckpt_every"] = ("the file states its checkpointing kwargs, which a write-back keeps as they are "
                             "(every_n_layers would be lost)")
    return out


def writable_keys(cfg: ReadConfig, *, fields: set[str] | None = None) -> set[str]:
    """Every key a write-back into ``cfg`` may change, whatever the search picks (checked before it)."""
    from autotune.spec.probe_request import Candidate

    at = Measured(device="cuda", seq_len=1, mean_seq_len=1.0, fields=None if fields is None else frozenset(fields))
    keys: set[str] = set()
    for cand in (Candidate(), Candidate(micro_batch=2, grad_accum=2, grad_ckpt=True, attn="eager", workers=2,
                                        pin_memory=False, precision="fp32", packing=True, optim="adamw_torch_fused",
                                        torch_compile=True, liger=True), Candidate(precision="fp16"),
                 Candidate(precision="tf32")):
        for where in (at, dataclasses.replace(at, device="cpu"), Measured(fields=at.fields)):
            keys |= set(cfg.module.tuned_keys(dataclasses.asdict(cand), cfg.data, fields=fields, at=where))
    return keys
