"""The Hugging Face Hub, when the machine is online: a model's ``config.json`` (and tokenizer files).

Only small files are ever fetched, through ``huggingface_hub`` into the normal Hugging Face cache
(``HF_HUB_CACHE`` / ``HF_HOME/hub`` / ``~/.cache/huggingface/hub``): a model's ``config.json``, and for
a probe that tokenizes text with the model's own tokenizer, its tokenizer files. Never weights, never
code (``*.py``). ``HF_HUB_OFFLINE=1`` or ``--offline`` means no :class:`HubAccess` at all: resolution
is then exactly the offline one of :mod:`autotune.models.resolve`.

Failures are one line each (exit 2): a gated or private repository (401/403) names the model page
to accept and ``HF_TOKEN``; a missing repository or revision (404) says so; a network failure falls
back to what the cache holds, saying so, or names the endpoint when nothing is cached.

``huggingface_hub`` is imported lazily (the module imports nothing heavy).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import ModelNotFoundError, SpecError

__all__ = [
    "CONFIG_FILE",
    "TOKENIZER_FILES",
    "HubAccess",
    "HubError",
    "Fetched",
    "fetch_code",
    "fetch_config",
    "fetch_tokenizer",
    "is_offline",
    "split_revision",
]

CONFIG_FILE = "config.json"
# the files a tokenizer loads from: what is fetched, and what marks a folder as holding a tokenizer
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
)
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "on", "yes", "true"}
_HUB_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_REVISION_RE = re.compile(r"^[\w./-]{1,200}$")


class HubError(SpecError):
    """The Hub refused or could not be reached (one line; exit 2)."""


@dataclass(frozen=True)
class HubAccess:
    """How to reach the Hub: ``endpoint`` (``HF_ENDPOINT``), ``token`` (None: huggingface_hub's own
    choice, i.e. ``HF_TOKEN`` or the login token), ``timeout_s`` per request."""

    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    timeout_s: float = 10.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, offline: bool = False) -> HubAccess | None:
        """None when offline (``offline`` or ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` set), else the access
        the environment describes, as huggingface_hub reads it."""
        env = os.environ if environ is None else environ
        if is_offline(env, offline=offline):
            return None
        endpoint = (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        return cls(endpoint=endpoint, token=env.get("HF_TOKEN") or None)

    def model_page(self, repo_id: str) -> str:
        return f"{self.endpoint}/{repo_id}"


def is_offline(environ: Mapping[str, str] | None = None, *, offline: bool = False) -> bool:
    env = os.environ if environ is None else environ
    return offline or any(str(env.get(k, "")).strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def split_revision(ref: str) -> tuple[str, str | None]:
    """``ORG/NAME@REVISION`` -> (``ORG/NAME``, ``REVISION``); a reference without ``@`` -> (ref, None)."""
    if "@" not in ref:
        return ref, None
    repo, _, rev = ref.rpartition("@")
    if not _HUB_REPO_RE.match(repo) or not rev or not _REVISION_RE.match(rev) or ".." in rev:
        raise SpecError(
            f"model {ref!r}: a revision is written ORG/NAME@REVISION (a branch, tag or commit hash), "
            f"e.g. Qwen/Qwen3-8B@main"
        )
    return repo, rev


def is_hub_repo_id(text: str) -> bool:
    """``org/name`` (a bare legacy name is never fetched)."""
    return bool(_HUB_REPO_RE.match(text))


@dataclass(frozen=True)
class Fetched:
    """A snapshot folder in the HF cache that now holds ``config.json``, and its commit."""

    snapshot: Path
    commit: str


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:  # pragma: no cover - a dependency of transformers
        raise HubError("fetching from the Hub needs huggingface_hub: pip install huggingface_hub") from None
    return huggingface_hub


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return int(code) if isinstance(code, int) else None


def _is_network_error(exc: BaseException) -> bool:
    """A connection that failed or timed out (not an answer from the server)."""
    hub = _hub()
    if isinstance(exc, hub.errors.LocalEntryNotFoundError | hub.errors.OfflineModeIsEnabled):
        return True
    names = {t.__name__ for t in type(exc).__mro__}
    return bool(names & {"ConnectError", "ConnectTimeout", "TimeoutException", "NetworkError", "ReadTimeout",
                         "ConnectionError", "ProxyError"}) and _status(exc) is None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] + ("..." if len(text) > 200 else "")


def _refusal(exc: BaseException, repo_id: str, revision: str | None, access: HubAccess, what: str) -> HubError:
    """One line for a Hub answer that is not the file."""
    hub = _hub()
    errors = hub.errors
    status = _status(exc)
    at = f"@{revision}" if revision else ""
    page = access.model_page(repo_id)
    if isinstance(exc, errors.GatedRepoError) or status in (401, 403):
        have = "the token sent has no access" if status == 403 else "not authenticated"
        what_it_is = "is gated or private" if isinstance(exc, errors.GatedRepoError) else (
            "is private or does not exist")  # (the Hub answers 401 for both when not authenticated)
        return HubError(
            f"model {repo_id}{at} {what_it_is} on the Hub ({status or 'refused'}; {have}): accept its "
            f"terms at {page} and set HF_TOKEN to a token with access (or run `hf auth login`), "
            "or pass a local directory or a preset"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError(f"model {repo_id}: revision {revision!r} does not exist on the Hub ({page}); "
                        "pass an existing branch, tag or commit hash after @")
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return HubError(f"model {repo_id}{at} has no {what} on the Hub ({page}); autotune needs the model's "
                        f"{what}: pass a local directory holding one, or a preset")
    if isinstance(exc, errors.RepositoryNotFoundError) or status == 404:
        return HubError(f"model {repo_id}{at} does not exist on the Hub ({page}, 404): check the id, or pass "
                        "a local directory or a preset")
    return HubError(f"model {repo_id}{at}: the Hub at {access.endpoint} answered {status or 'with an error'} "
                    f"for {what} ({_one_line(exc)})")


def fetch_config(repo_id: str, revision: str | None, access: HubAccess, cache_dir: Path) -> Fetched:
    """Download ``config.json`` of ``repo_id`` at ``revision`` (default ``main``) into ``cache_dir``.

    A file already in the cache at the same commit is not downloaded again (huggingface_hub asks
    with HEAD first). Raises HubError; a network failure raises :class:`HubUnreachable`.
    """
    hub = _hub()
    try:
        # one HEAD without retries first: an unreachable Hub fails at once (hf_hub_download alone retries
        # with back-off for ~25 s when nothing is cached), and a refusal is answered before any download
        hub.get_hf_file_metadata(
            hub.hf_hub_url(repo_id, CONFIG_FILE, revision=revision, endpoint=access.endpoint),
            token=access.token, timeout=access.timeout_s, endpoint=access.endpoint,
        )  # fmt: skip
        path = hub.hf_hub_download(
            repo_id, CONFIG_FILE, revision=revision, cache_dir=str(cache_dir), endpoint=access.endpoint,
            token=access.token, etag_timeout=access.timeout_s,
        )  # fmt: skip
    except Exception as exc:
        if _is_network_error(exc):
            raise HubUnreachable(
                f"the Hub at {access.endpoint} cannot be reached ({type(exc).__name__}: {_one_line(exc)})"
            ) from None
        raise _refusal(exc, repo_id, revision, access, CONFIG_FILE) from None
    snapshot = Path(path).parent
    return Fetched(snapshot=snapshot, commit=snapshot.name)


def fetch_tokenizer(repo_id: str, commit: str, access: HubAccess, cache_dir: Path) -> list[str]:
    """Download the tokenizer files ``repo_id`` has at ``commit`` into the same snapshot; their names.

    The repository's file list comes from ``/api/models/{repo}/revision/{commit}``; only names in
    :data:`TOKENIZER_FILES` are fetched. Raises HubError / HubUnreachable.
    """
    return _fetch_some(repo_id, commit, access, cache_dir, lambda n: n in TOKENIZER_FILES, "tokenizer")


def fetch_code(repo_id: str, commit: str, access: HubAccess, cache_dir: Path) -> list[str]:
    """The model's own code (top-level ``*.py``), fetched only when ``--trust-remote-code`` allows it and the
    config's ``auto_map`` needs it, so that a probe (offline) can import it from the snapshot."""
    return _fetch_some(repo_id, commit, access, cache_dir, lambda n: n.endswith(".py") and "/" not in n,
                       "remote code")


def _fetch_some(repo_id: str, commit: str, access: HubAccess, cache_dir: Path, wanted: Any, what: str) -> list[str]:
    hub = _hub()
    try:
        info = hub.HfApi(endpoint=access.endpoint, token=access.token).model_info(repo_id, revision=commit)
        names = sorted({s.rfilename for s in (info.siblings or []) if wanted(s.rfilename)})
        for name in names:
            hub.hf_hub_download(repo_id, name, revision=commit, cache_dir=str(cache_dir), endpoint=access.endpoint,
                                token=access.token, etag_timeout=access.timeout_s)  # fmt: skip
    except Exception as exc:
        if _is_network_error(exc):
            raise HubUnreachable(
                f"the Hub at {access.endpoint} cannot be reached ({type(exc).__name__}: {_one_line(exc)})"
            ) from None
        raise _refusal(exc, repo_id, commit, access, what) from None
    return names


class HubUnreachable(ModelNotFoundError):
    """The network failed (no answer from the Hub)."""
