"""Model references → a ``config.json`` on disk. The network only with a :class:`HubAccess`.

A reference is resolved in this order; the first match wins:

1. **local**: an existing directory holding ``config.json`` (or the path of a ``config.json``
   file itself, meaning its directory). ``~`` is expanded.
2. **hf-cache**: a hub id (``org/name``, or a bare legacy name such as ``gpt2``) already present in
   the local Hugging Face cache: ``models--{org}--{name}/snapshots/<rev>/config.json``, preferring
   the snapshot that ``refs/main`` points to. The cache directory is ``hf_cache`` when given, else
   ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (as huggingface_hub
   decides it). A model the user really has wins over our copy of its config, so the cache comes
   before the presets.
3. **preset** / **tiny**: a built-in config, named by its short name (``llama-3.1-8b``), one of
   its hub ids (``meta-llama/Llama-3.1-8B``, ``meta-llama/Meta-Llama-3.1-8B``) or its bare repo
   name (``Mistral-7B-v0.3``), in any case.

4. **hub** (only when given ``hub``, a :class:`~autotune.models.hub.HubAccess`: the machine is online
   and not ``HF_HUB_OFFLINE``): an ``org/name`` id is fetched from the Hub, ``config.json`` only (and
   the tokenizer files when ``tokenizer=True``), into the HF cache (:mod:`autotune.models.hub`).

``org/name@REVISION`` names a branch, tag or commit: a commit hash in the cache is used as it is; a
branch or tag is asked of the Hub when online (one HEAD request when the cached file is current),
and a network failure then falls back to the cached snapshot of that name, with a note. Without
``hub`` (offline) a revision is looked up in the cache only. The snapshot's commit hash is
``ResolvedModel.revision`` (None for local folders and presets).

Anything else raises :class:`~autotune.errors.ModelNotFoundError`. Only the config is needed:
probes build models from it with random weights.

Importing this module imports neither torch nor transformers; transformers is imported lazily,
and only to ask whether it knows an uncommon ``model_type``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from autotune.errors import ModelNotFoundError, SpecError
from autotune.models._registry import PRESETS, TINY, lookup
from autotune.models.hub import (
    TOKENIZER_FILES,
    HubAccess,
    HubUnreachable,
    fetch_code,
    fetch_config,
    fetch_tokenizer,
    is_hub_repo_id,
    split_revision,
)
from autotune.spec.files import read_json_file
from autotune.spec.shell import command_line

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = [
    "ModelSource",
    "ResolvedModel",
    "check_seq_len",
    "default_hf_cache_dir",
    "resolve_model",
]

ModelSource = Literal["local", "hf-cache", "hub", "preset", "tiny"]

CONFIG_NAME = "config.json"

# Config keys that carry the longest sequence a model takes, in order of preference.
_MAX_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")

# model_types every supported transformers version (>= 5.17) ships; for these the (slow, torch-
# importing) look-up in transformers' CONFIG_MAPPING is skipped.
_NATIVE_MODEL_TYPES = frozenset(
    {
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
        "gemma3_text", "phi", "phi3", "gpt2", "gpt_neox", "gptj", "opt", "falcon", "starcoder2",
        "olmo", "olmo2", "granite", "cohere", "stablelm", "bloom",
    }
)  # fmt: skip

# A hub id: "org/name" or a bare legacy name ("gpt2"). Hub names use letters, digits, "-", "_", ".".
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference resolved to a directory holding its ``config.json``.

    ``config`` is the parsed ``config.json``; treat it as read-only. ``max_positions`` is the
    longest sequence the model takes (``max_position_embeddings`` or its GPT-2 style equivalent),
    None when the config does not say.
    """

    ref: str
    name: str
    path: str
    source: ModelSource
    config: dict[str, Any] = field(compare=False, hash=False, repr=False)
    model_type: str
    max_positions: int | None
    trust_remote_code: bool = False
    revision: str | None = None  # the HF cache snapshot's commit hash (hf-cache, hub); None otherwise
    notes: tuple[str, ...] = field(default=(), compare=False)  # what the user should know (a fallback)

    @property
    def config_path(self) -> str:
        """The ``config.json`` file itself."""
        return os.path.join(self.path, CONFIG_NAME)

    def auto_config(self) -> PretrainedConfig:
        """A fresh ``transformers`` config for this model (imports transformers).

        Fresh on every call: ``from_config(cfg, dtype=...)`` mutates the config it is given, so
        build each model from its own copy.
        """
        from transformers import AutoConfig

        config: PretrainedConfig = AutoConfig.from_pretrained(
            self.path, trust_remote_code=self.trust_remote_code, local_files_only=True
        )
        return config


def default_hf_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache directory, decided as huggingface_hub decides it."""
    env = os.environ if environ is None else environ
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(env[key]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    xdg = env.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def resolve_model(
    ref: str,
    *,
    trust_remote_code: bool = False,
    hf_cache: str | os.PathLike[str] | None = None,
    hub: HubAccess | None = None,
    tokenizer: bool = False,
) -> ResolvedModel:
    """Resolve ``ref`` (local path, hub id or preset name) to its config; see the module doc.

    ``hub``: fetch from the Hub what the cache lacks (None: never touch the network). ``tokenizer``:
    the caller will tokenize with the model's own tokenizer, so a Hub model's tokenizer files are
    fetched too (when ``hub`` is given and the snapshot lacks them).

    Raises ModelNotFoundError when nothing matches, SpecError when the ``config.json`` found is
    malformed or needs remote code that ``trust_remote_code`` does not allow, HubError (a SpecError)
    when the Hub refuses.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise SpecError(f"model must be a non-empty string (preset, hub id or directory), got {ref!r}")
    text = ref.strip()
    path = Path(text).expanduser()

    # 1. a local directory (or its config.json)
    if path.is_file():
        if path.name != CONFIG_NAME:
            raise SpecError(
                f"model path {text!r} is a file but not a {CONFIG_NAME}; give the directory that "
                f"holds the model's {CONFIG_NAME} or that file itself"
            )
        path = path.parent
    if path.is_dir() and (path / CONFIG_NAME).is_file():
        directory = path.resolve()
        return _build(ref, str(directory), str(directory), "local", trust_remote_code)
    if _looks_like_path(text):
        why = f"has no {CONFIG_NAME}" if path.is_dir() else "does not exist"
        raise ModelNotFoundError(
            f"model directory {text!r} {why}; point at a local directory containing {CONFIG_NAME}, "
            f"or use a preset ({_preset_names()})"
        )

    cache_dir = Path(hf_cache).expanduser() if hf_cache is not None else default_hf_cache_dir()
    repo, revision = split_revision(text) if "@" in text else (text, None)
    if revision is not None:
        return _resolve_revision(ref, repo, revision, cache_dir, hub, trust_remote_code, tokenizer)

    # 2. the local Hugging Face cache
    if _HUB_ID_RE.match(text):
        found = _find_in_hf_cache(cache_dir, text)
        if found is not None:
            hub_id, snapshot = found
            notes = _tokenizer_for(hub_id, snapshot, hub, cache_dir, tokenizer, trust_remote_code) if hub else ()
            return _build(ref, hub_id, str(snapshot), "hf-cache", trust_remote_code, revision=snapshot.name,
                          notes=notes)

    # 3. the built-in presets and tiny test models
    info = lookup(text)
    if info is not None:
        return _build(ref, info.display_name, info.path, info.kind, trust_remote_code)

    # 4. the Hub, when online
    if hub is not None and is_hub_repo_id(text):
        return _fetch(ref, text, None, cache_dir, hub, trust_remote_code, tokenizer)

    hint = ""
    if "/" in text and _HUB_ID_RE.match(text):
        hint = (
            f" (autotune never downloads; `{command_line('hf', 'download', text, CONFIG_NAME)}` puts its config "
            f"in the cache, which is {cache_dir})"
        )
    raise ModelNotFoundError(
        f"unknown model {text!r}: not a local directory, not in the Hugging Face cache and not a "
        f"preset{hint}; use a preset ({_preset_names()}), a test model "
        f"({', '.join(t.name for t in TINY)}) or a local directory containing {CONFIG_NAME}"
    )


def check_seq_len(resolved: ResolvedModel, seq_len: int) -> None:
    """Raise SpecError when ``seq_len`` is not positive or exceeds the model's maximum."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise SpecError(f"seq_len must be a positive integer, got {seq_len!r}")
    limit = resolved.max_positions
    if limit is not None and seq_len > limit:
        raise SpecError(
            f"seq_len must be at most the model's max_position_embeddings: {resolved.name} takes at "
            f"most {limit} tokens, got seq_len={seq_len}"
        )


# --- helpers ---------------------------------------------------------------------------------


def _preset_names() -> str:
    return ", ".join(p.name for p in PRESETS)


def _looks_like_path(text: str) -> bool:
    """True for references that can only mean a filesystem path, never a hub id or preset."""
    return (
        text.startswith(("/", "./", "../", "~", "."))
        or "\\" in text
        or text.count("/") > 1
        or text.endswith("/")
    )


def _find_in_hf_cache(cache_dir: Path, hub_id: str, revision: str | None = None) -> tuple[str, Path] | None:
    """(hub id as cached, snapshot directory) for ``hub_id`` in ``cache_dir``, or None.

    Matches the repo folder case-insensitively (the hub treats ids so). Prefers the snapshot
    ``refs/main`` names; otherwise the most recently modified snapshot that has a config.json.
    With ``revision``: the snapshot ``refs/<revision>`` names, or the snapshot of that commit, only.
    """
    if not cache_dir.is_dir():
        return None
    if revision is not None:
        repo_dir = _hf_cache_repo_dir(cache_dir, hub_id)
        if repo_dir is None:
            return None
        commit = revision
        ref_file = repo_dir / "refs" / revision
        if not _COMMIT_RE.match(revision):
            try:
                commit = ref_file.read_text(encoding="utf-8").strip() if ref_file.is_file() else ""
            except OSError:
                commit = ""
        snap = repo_dir / "snapshots" / commit
        if commit and (snap / CONFIG_NAME).is_file():
            return _cached_hub_id(repo_dir), snap
        return None
    wanted = "models--" + hub_id.replace("/", "--")
    repo_dir = cache_dir / wanted
    if not repo_dir.is_dir():
        try:
            matches = [d for d in cache_dir.iterdir() if d.name.lower() == wanted.lower() and d.is_dir()]
        except OSError:
            return None
        if not matches:
            return None
        repo_dir = sorted(matches)[0]
    snapshots = repo_dir / "snapshots"
    main_ref = repo_dir / "refs" / "main"
    if main_ref.is_file():
        try:
            revision = main_ref.read_text(encoding="utf-8").strip()
        except OSError:
            revision = ""
        if revision and (snapshots / revision / CONFIG_NAME).is_file():
            return _cached_hub_id(repo_dir), snapshots / revision
    try:
        candidates = [s for s in snapshots.iterdir() if (s / CONFIG_NAME).is_file()]
    except OSError:
        return None
    if not candidates:
        return None
    newest = max(candidates, key=lambda s: (s / CONFIG_NAME).stat().st_mtime)
    return _cached_hub_id(repo_dir), newest


def _hf_cache_repo_dir(cache_dir: Path, hub_id: str) -> Path | None:
    wanted = "models--" + hub_id.replace("/", "--")
    if (cache_dir / wanted).is_dir():
        return cache_dir / wanted
    try:
        matches = [d for d in cache_dir.iterdir() if d.name.lower() == wanted.lower() and d.is_dir()]
    except OSError:
        return None
    return sorted(matches)[0] if matches else None


def _has_tokenizer(snapshot: Path) -> bool:
    return any((snapshot / name).is_file() for name in TOKENIZER_FILES)


def _tokenizer_for(repo: str, snapshot: Path, hub: HubAccess, cache_dir: Path, wanted: bool,
                   trust_remote_code: bool) -> tuple[str, ...]:
    """What a Hub snapshot lacks: the model's own code when ``trust_remote_code`` allows it and the config's
    auto_map needs it; the tokenizer files (``wanted`` only). Notes on a fallback."""
    if trust_remote_code and is_hub_repo_id(repo) and not any(snapshot.glob("*.py")):
        config = _json_or_none(snapshot / CONFIG_NAME)
        if isinstance(config, dict) and isinstance(config.get("auto_map"), dict):
            try:
                fetch_code(repo, snapshot.name, hub, cache_dir)
            except HubUnreachable as exc:
                return (f"{repo}: its own code (auto_map) is not in the local cache and {exc}",)
    if not wanted:
        return ()
    if not is_hub_repo_id(repo) or _has_tokenizer(snapshot):
        _check_tokenizer_code(snapshot, trust_remote_code)
        return ()
    try:
        fetch_tokenizer(repo, snapshot.name, hub, cache_dir)
    except HubUnreachable as exc:
        return (f"{repo}: its tokenizer is not in the local cache and {exc}; going on without it",)
    _check_tokenizer_code(snapshot, trust_remote_code)
    return ()


def _check_tokenizer_code(snapshot: Path, trust_remote_code: bool) -> None:
    """A tokenizer whose tokenizer_config.json maps to its own code (auto_map) needs --trust-remote-code."""
    file = snapshot / "tokenizer_config.json"
    if trust_remote_code or not file.is_file():
        return
    cfg = _json_or_none(file)
    if isinstance(cfg, dict) and cfg.get("auto_map"):
        raise SpecError(f"{file}: the tokenizer needs its own code (auto_map); pass --trust-remote-code to run "
                        "that code, or --tokenizer DIR of another tokenizer")


def _fetch(ref: str, repo: str, revision: str | None, cache_dir: Path, hub: HubAccess, trust_remote_code: bool,
           tokenizer: bool, fallback: Path | None = None) -> ResolvedModel:
    """config.json (and the tokenizer) from the Hub; on a network failure the cached ``fallback``."""
    at = f"@{revision}" if revision else ""
    try:
        fetched = fetch_config(repo, revision, hub, cache_dir)
    except HubUnreachable as exc:
        if fallback is not None:
            note = (f"{repo}{at}: {exc}; using the cached snapshot {fallback.name[:12]} of {revision or 'main'} "
                    f"from {cache_dir}")
            return _build(ref, _cached_hub_id(fallback.parent.parent), str(fallback), "hf-cache", trust_remote_code,
                          revision=fallback.name, notes=(note,))
        raise HubUnreachable(
            f"model {repo}{at} is not in the local Hugging Face cache ({cache_dir}) and {exc}; connect and retry, "
            f"put its config in the cache (`{command_line('hf', 'download', repo, CONFIG_NAME)}`), or pass a local "
            f"directory or a preset ({_preset_names()})"
        ) from None
    snapshot = fetched.snapshot
    _build(ref, repo, str(snapshot), "hub", trust_remote_code)  # refuses remote code before anything else
    notes = _tokenizer_for(repo, snapshot, hub, cache_dir, tokenizer, trust_remote_code)
    return _build(ref, repo, str(snapshot), "hub", trust_remote_code, revision=fetched.commit, notes=notes)


def _resolve_revision(ref: str, repo: str, revision: str, cache_dir: Path, hub: HubAccess | None,
                      trust_remote_code: bool, tokenizer: bool) -> ResolvedModel:
    """``org/name@revision``: a cached commit as it is; a branch or tag asked of the Hub when online."""
    found = _find_in_hf_cache(cache_dir, repo, revision)
    if found is not None and (hub is None or _COMMIT_RE.match(revision)):
        hub_id, snapshot = found
        notes = _tokenizer_for(hub_id, snapshot, hub, cache_dir, tokenizer, trust_remote_code) if hub else ()
        return _build(ref, hub_id, str(snapshot), "hf-cache", trust_remote_code, revision=snapshot.name, notes=notes)
    if hub is not None:
        return _fetch(ref, repo, revision, cache_dir, hub, trust_remote_code, tokenizer,
                      fallback=found[1] if found is not None else None)
    raise ModelNotFoundError(
        f"model {ref!r}: revision {revision!r} of {repo} is not in the local Hugging Face cache ({cache_dir}) and "
        f"the Hub is off (HF_HUB_OFFLINE or --offline); "
        f"`{command_line('hf', 'download', repo, CONFIG_NAME, '--revision', revision)}` "
        "puts it there, or drop the revision"
    )


def _cached_hub_id(repo_dir: Path) -> str:
    return repo_dir.name.removeprefix("models--").replace("--", "/")


def _build(
    ref: str, name: str, directory: str, source: ModelSource, trust_remote_code: bool,
    revision: str | None = None, notes: tuple[str, ...] = (),
) -> ResolvedModel:
    config_file = os.path.join(directory, CONFIG_NAME)
    config = _read_config(config_file)
    model_type = config["model_type"]
    if source in ("local", "hf-cache", "hub"):
        _check_model_type(config, config_file, trust_remote_code)
    return ResolvedModel(
        ref=ref,
        name=name,
        path=directory,
        source=source,
        config=config,
        model_type=model_type,
        max_positions=_max_positions(config),
        trust_remote_code=trust_remote_code,
        revision=revision if revision and _COMMIT_RE.match(revision) else None,
        notes=notes,
    )


def _json_or_none(file: Path) -> Any:
    """A small JSON file of a model or tokenizer folder, through the bounded reader; None when it cannot be
    read (the step that needs it reports that)."""
    try:
        return read_json_file(file, what="model file")
    except SpecError:
        return None


def _read_config(config_file: str) -> dict[str, Any]:
    """config.json through the bounded reader (size checked before reading, numbers bounded): SpecError
    naming the file otherwise."""
    config = read_json_file(config_file, what="model config")
    if not isinstance(config, dict):
        raise SpecError(f"{config_file} must hold a JSON object, got a {type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        got = "it has none" if model_type is None else f"got {model_type!r}"
        raise SpecError(f'{config_file} must name its architecture in "model_type"; {got}')
    return config


def _check_model_type(config: Mapping[str, Any], config_file: str, trust_remote_code: bool) -> None:
    model_type = config["model_type"]
    if model_type in _NATIVE_MODEL_TYPES:
        return
    known, version = _transformers_knows(model_type)
    if known:
        return
    if isinstance(config.get("auto_map"), dict):
        if trust_remote_code:
            return
        raise SpecError(
            f"{config_file}: model_type {model_type!r} is not built into transformers {version} and "
            f"needs the model's own code (auto_map); pass --trust-remote-code to run that code"
        )
    raise SpecError(
        f"{config_file}: model_type {model_type!r} is not known to transformers {version} and the "
        f"config has no auto_map for remote code; upgrade transformers or use another model"
    )


def _transformers_knows(model_type: str) -> tuple[bool, str]:
    """(whether transformers' CONFIG_MAPPING has ``model_type``, transformers' version)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING, transformers.__version__


def _max_positions(config: Mapping[str, Any]) -> int | None:
    for source in (config, config.get("text_config")):
        if not isinstance(source, Mapping):
            continue
        for key in _MAX_POSITION_KEYS:
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None
