"""The random-weight base a QLoRA probe quantizes: built and saved once, reused by every probe.  [worker side]

bitsandbytes quantizes a model to 4-bit NF4 while loading it from a checkpoint, so a QLoRA probe
needs its random-weight base on disk. Building it (random initialisation of every parameter on the
CPU) and saving it (safetensors) is the same work for every probe of a model, so it is done once per
(model config content, dtype, seed, torch and transformers versions) and kept under
``$AUTOTUNE_CACHE/qlora-base`` (else ``~/.cache/autotune/qlora-base``), one folder per key.

Writes are atomic: the checkpoint is saved into a temporary folder beside the entry, its manifest
(``autotune-qlora-base.json``: the key and every file's size) written last, and the folder renamed into
place, under an exclusive lock on ``<key>.lock`` so concurrent probes build it once and never see a
half-written entry. An entry whose manifest is missing, unreadable, of another key, or whose files do
not match it (a partial copy, a truncated file) is rebuilt. An 8B base takes ~16 GB of disk in bf16;
delete the folder to reclaim it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST", "QLORA_BASE_FORMAT", "base_key", "default_root", "ensure_qlora_base", "load_qlora_base"]

QLORA_BASE_FORMAT = 1
MANIFEST = "autotune-qlora-base.json"
# config fields that name where a config came from, not what it builds
_NOT_CONTENT = ("_name_or_path", "transformers_version", "_commit_hash")


def default_root() -> Path:
    """``$AUTOTUNE_CACHE/qlora-base`` when set, else ``~/.cache/autotune/qlora-base``."""
    root = os.environ.get("AUTOTUNE_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "autotune"
    return base / "qlora-base"


def _config_content(cfg: Any) -> dict[str, Any]:
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    return {k: v for k, v in d.items() if k not in _NOT_CONTENT}


def base_key(cfg: Any, *, dtype: str, seed: int) -> str:
    """sha256 of the config's content, the dtype, the seed and the versions whose init code builds it."""
    import torch
    import transformers

    payload = {"format": QLORA_BASE_FORMAT, "config": _config_content(cfg), "dtype": str(dtype), "seed": int(seed),
               "torch": torch.__version__, "transformers": transformers.__version__}
    text = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _complete(entry: Path, key: str) -> bool:
    """True when ``entry`` holds the whole checkpoint its manifest lists, for ``key``."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("key") != key or not isinstance(files, dict) or not files:
            return False
        return all((entry / name).is_file() and (entry / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _build_into(folder: Path, cfg: Any, *, dtype: str, seed: int, trust_remote_code: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
    model.save_pretrained(str(folder), safe_serialization=True)
    del model


def ensure_qlora_base(
    cfg: Any, *, dtype: str, seed: int, trust_remote_code: bool = False, root: str | os.PathLike[str] | None = None,
) -> tuple[Path, bool]:
    """(the folder holding the random-weight checkpoint for ``cfg``, whether this call built it).

    ``dtype``: a torch dtype name (``bfloat16``, ``float16``, ``float32``).
    """
    base = Path(root) if root is not None else default_root()
    key = base_key(cfg, dtype=dtype, seed=seed)
    entry = base / key
    if _complete(entry, key):
        return entry, False
    base.mkdir(parents=True, exist_ok=True)
    with _locked(base / f"{key}.lock"):
        if _complete(entry, key):  # another probe built it while this one waited
            return entry, False
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=base))
        try:
            _build_into(tmp, cfg, dtype=dtype, seed=seed, trust_remote_code=trust_remote_code)
            files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
            manifest = tmp / MANIFEST
            manifest.write_text(json.dumps({"format": QLORA_BASE_FORMAT, "key": key, "files": files}, indent=1),
                                encoding="utf-8")
            for p in tmp.iterdir():
                with open(p, "rb") as fh:
                    os.fsync(fh.fileno())
            if entry.exists() or entry.is_symlink():  # a partial or damaged entry: set aside, then replace
                stale = base / f".stale-{key[:16]}-{uuid.uuid4().hex[:8]}"
                os.rename(entry, stale)
                shutil.rmtree(stale, ignore_errors=True)
            os.rename(tmp, entry)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return entry, True


def load_qlora_base(cfg: Any, mk: dict[str, Any], w: Any, *, device_index: int) -> Any:
    """The 4-bit NF4 base for a probe: the cached random-weight checkpoint, quantized at load."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    dtype = str(mk["dtype"])
    compute = getattr(torch, dtype)
    folder, _ = ensure_qlora_base(cfg, dtype=dtype, seed=int(w.seed), trust_remote_code=bool(w.trust_remote_code))
    return AutoModelForCausalLM.from_pretrained(
        str(folder),
        quantization_config=BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=compute,
            bnb_4bit_use_double_quant=True,
        ),
        dtype=compute,
        attn_implementation=mk["attn_implementation"],
        device_map={"": device_index},
        local_files_only=True,
    )
