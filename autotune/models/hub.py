"""The Hugging Face Hub, when the machine is online: a model's ``config.json`` (and tokenizer files).

Only small files are ever fetched, into the normal Hugging Face cache (``HF_HUB_CACHE`` /
``HF_HOME/hub`` / ``~/.cache/huggingface/hub``, in ``huggingface_hub``'s layout, so ``transformers`` and
``hf`` find them there): a model's ``config.json``, and for a probe that tokenizes text with the model's
own tokenizer, its tokenizer files. Never weights; the model's own code (``*.py``) only with
``--trust-remote-code``. ``HF_HUB_OFFLINE=1`` or ``--offline`` means no :class:`HubAccess` at all:
resolution is then exactly the offline one of :mod:`autotune.models.resolve`.

Everything the endpoint answers is treated as hostile (``HF_ENDPOINT`` may name any mirror or proxy), so
the download is autotune's own (one HEAD for the metadata, one streamed GET), not ``hf_hub_download``,
which names the cached blob after the server's ``ETag`` unchecked and asks with a second HEAD that may
answer differently:

* the commit (``X-Repo-Commit``) must be 40 hex digits and the ``ETag`` a git sha1 or a sha256 (quotes
  and ``W/`` stripped), else the answer is refused before anything is written; the content must hash to
  its ``ETag`` before it becomes a blob, so no file can be planted under another's name;
* every file is written inside the repository's cache folder (its real path is checked), to a temporary
  file there and ``os.replace``-d into place, with the umask's permissions;
* a file is capped (:func:`max_bytes`): by the announced size before the download, and by the bytes
  counted while it streams (a server may lie about its size);
* each file has a deadline from the request to its last byte (``deadline_s``, 60 s), and all the
  fetches of one command a total (``total_s``, five times that): the sockets are shut when it passes,
  so a server that trickles a byte at a time, or its headers a line at a time, cannot hold the run.
  ``AUTOTUNE_HUB_TIMEOUT=SECONDS`` sets the per-file deadline (and the total, five times it).

Failures are one line each (exit 2): a gated or private repository (401/403) names the model page
to accept and ``HF_TOKEN``; a missing repository or revision (404) says so; a network failure or a
deadline falls back to what the cache holds, saying so, or names the endpoint when nothing is cached.

The token (``HF_TOKEN``, else the one ``hf auth login`` stored) is sent to the endpoint as
``Authorization: Bearer``, never to another host a download is redirected to (a CDN). Proxies come from
the usual environment variables (``HTTPS_PROXY``, ``NO_PROXY``, ...).
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import json
import math
import os
import re
import secrets
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import ModelNotFoundError, SpecError
from autotune.spec.files import MAX_FILE_BYTES, short_repr

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_DEADLINE_S",
    "MAX_VOCAB_BYTES",
    "TOKENIZER_FILES",
    "HubAccess",
    "HubError",
    "HubUnreachable",
    "Fetched",
    "fetch_code",
    "fetch_config",
    "fetch_tokenizer",
    "is_commit",
    "is_offline",
    "max_bytes",
    "normalize_etag",
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
# A vocabulary is bigger than a config: Gemma 3's tokenizer.json is 33 MB. Every other file fetched (config,
# tokenizer_config.json, code, the repository's file list) has the cap every file a user names has.
MAX_VOCAB_BYTES = 64 * 2**20
_VOCAB_FILES = frozenset({"tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt",
                          "merges.txt"})
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_DEADLINE_S = 60.0
_TOTAL_FACTOR = 5  # all the fetches of one command: five files' worth
_TRUE = {"1", "on", "yes", "true"}
_HUB_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_REVISION_PART_RE = re.compile(r"^[\w.-]{1,200}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_ETAG_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_FILE_NAME_RE = re.compile(r"^[A-Za-z0-9_][\w.-]{0,200}$")  # a top-level file of a repository
_MAX_REDIRECTS = 5
_CHUNK = 1 << 16


def max_bytes(name: str) -> int:
    """The most bytes autotune accepts for the repository file ``name``."""
    return MAX_VOCAB_BYTES if name in _VOCAB_FILES else MAX_FILE_BYTES


class HubError(SpecError):
    """The Hub refused or could not be reached (one line; exit 2)."""


class HubUnreachable(ModelNotFoundError):
    """The network failed (no answer from the Hub, or not within the deadline)."""


class _Clock:
    """Seconds the fetches of one :class:`HubAccess` (one command) have taken so far."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.lock = threading.Lock()


@dataclass(frozen=True)
class HubAccess:
    """How to reach the Hub: ``endpoint`` (``HF_ENDPOINT``), ``token`` (None: ``HF_TOKEN`` or the token
    ``hf auth login`` stored), ``timeout_s`` per connection and per read, ``deadline_s`` per file (from the
    request to its last byte), ``total_s`` for all the fetches made through this access (one command)."""

    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    timeout_s: float = 10.0
    deadline_s: float = DEFAULT_DEADLINE_S
    total_s: float = _TOTAL_FACTOR * DEFAULT_DEADLINE_S
    clock: _Clock = field(default_factory=_Clock, init=False, compare=False, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, offline: bool = False) -> HubAccess | None:
        """None when offline (``offline`` or ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` set), else the access
        the environment describes (``HF_ENDPOINT``, ``HF_TOKEN``, ``AUTOTUNE_HUB_TIMEOUT``)."""
        env = os.environ if environ is None else environ
        if is_offline(env, offline=offline):
            return None
        endpoint = (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        deadline = _seconds(env.get("AUTOTUNE_HUB_TIMEOUT"))
        return cls(endpoint=endpoint, token=env.get("HF_TOKEN") or None, deadline_s=deadline,
                   total_s=_TOTAL_FACTOR * deadline)

    def model_page(self, repo_id: str) -> str:
        return f"{self.endpoint}/{repo_id}"


def _seconds(text: str | None) -> float:
    if text is None or not text.strip():
        return DEFAULT_DEADLINE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"AUTOTUNE_HUB_TIMEOUT must be a positive number of seconds (the longest one file from the "
                        f"Hub may take; default {DEFAULT_DEADLINE_S:g}), got {short_repr(text)}")
    return value


def is_offline(environ: Mapping[str, str] | None = None, *, offline: bool = False) -> bool:
    env = os.environ if environ is None else environ
    return offline or any(str(env.get(k, "")).strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def split_revision(ref: str) -> tuple[str, str | None]:
    """``ORG/NAME@REVISION`` -> (``ORG/NAME``, ``REVISION``); a reference without ``@`` -> (ref, None)."""
    if "@" not in ref:
        return ref, None
    repo, _, rev = ref.rpartition("@")
    if not _HUB_REPO_RE.match(repo) or not _is_revision(rev):
        raise SpecError(
            f"model {ref!r}: a revision is written ORG/NAME@REVISION (a branch, tag or commit hash), "
            f"e.g. Qwen/Qwen3-8B@main"
        )
    return repo, rev


def _is_revision(rev: str) -> bool:
    """A branch, tag or commit: names joined by ``/`` (``refs/pr/1``), none of them ``.`` or ``..``."""
    parts = rev.split("/")
    return 0 < len(rev) <= 200 and all(_REVISION_PART_RE.match(p) and p not in (".", "..") for p in parts)


def is_hub_repo_id(text: str) -> bool:
    """``org/name`` (a bare legacy name is never fetched)."""
    return bool(_HUB_REPO_RE.match(text))


def is_commit(text: object) -> bool:
    """A full commit hash (40 lowercase hex digits), as the Hub names a snapshot."""
    return isinstance(text, str) and bool(_COMMIT_RE.match(text))


def normalize_etag(value: str | None) -> str | None:
    """An ``ETag`` header as the name of a cached blob: a git sha1 (40 hex) or a sha256 (64 hex), with its quotes
    and ``W/`` stripped; None when it is not one of those."""
    if value is None:
        return None
    text = value.strip()
    if text.startswith("W/"):
        text = text[2:]
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return text if _ETAG_RE.match(text) else None


@dataclass(frozen=True)
class Fetched:
    """A snapshot folder in the HF cache that now holds ``config.json``, and its commit."""

    snapshot: Path
    commit: str


# --------------------------------------------------------------------------------------------- fetching


def fetch_config(repo_id: str, revision: str | None, access: HubAccess, cache_dir: Path) -> Fetched:
    """Download ``config.json`` of ``repo_id`` at ``revision`` (default ``main``) into ``cache_dir``.

    One HEAD asks for the file's commit and hash; a file already in the cache at that commit is not
    downloaded again. Raises HubError; a network failure or the deadline raises :class:`HubUnreachable`.
    """
    commit = _fetch_file(repo_id, revision, CONFIG_FILE, access, cache_dir, what=CONFIG_FILE)
    return Fetched(snapshot=_storage(cache_dir, repo_id) / "snapshots" / commit, commit=commit)


def fetch_tokenizer(repo_id: str, commit: str, access: HubAccess, cache_dir: Path) -> list[str]:
    """Download the tokenizer files ``repo_id`` has at ``commit`` into the same snapshot; their names.

    The repository's file list comes from ``/api/models/{repo}/revision/{commit}``; only names in
    :data:`TOKENIZER_FILES` are fetched. Raises HubError / HubUnreachable.
    """
    return _fetch_some(repo_id, commit, access, cache_dir, lambda n: n in TOKENIZER_FILES, "tokenizer")


def fetch_code(repo_id: str, commit: str, access: HubAccess, cache_dir: Path) -> list[str]:
    """The model's own code (top-level ``*.py``), fetched only when ``--trust-remote-code`` allows it and the
    config's ``auto_map`` needs it, so that a probe (offline) can import it from the snapshot."""
    return _fetch_some(repo_id, commit, access, cache_dir, lambda n: n.endswith(".py"), "remote code")


def _fetch_some(repo_id: str, commit: str, access: HubAccess, cache_dir: Path, wanted: Callable[[str], bool],
                what: str) -> list[str]:
    names = [n for n in _list_files(repo_id, commit, access) if _FILE_NAME_RE.match(n) and wanted(n)]
    for name in names:
        _fetch_file(repo_id, commit, name, access, cache_dir, what=what)
    return names


def _list_files(repo_id: str, commit: str, access: HubAccess) -> list[str]:
    """The file names of ``repo_id`` at ``commit`` (its ``siblings``), read with the cap and the deadline."""
    what = "the file list"
    url = f"{access.endpoint}/api/models/{repo_id}/revision/{urllib.parse.quote(commit, safe='')}"
    with _fetching(access, repo_id, what) as watch:
        status, headers, resp = _request("GET", url, access, watch, repo_id, what, follow=_SAME_ORIGIN)
        with resp:
            if status != 200:
                raise _refused(status, headers, repo_id, commit, access, what)
            body = _read_capped(resp, MAX_FILE_BYTES, repo_id, what, access)
    try:
        info = json.loads(body)
    except (ValueError, RecursionError):
        raise HubError(f"model {repo_id}: the Hub at {access.endpoint} answered {what} with something that is not "
                       "JSON; check HF_ENDPOINT") from None
    siblings = info.get("siblings") if isinstance(info, dict) else None
    if not isinstance(siblings, list):
        return []
    names = {s.get("rfilename") for s in siblings if isinstance(s, dict)}
    return sorted(n for n in names if isinstance(n, str))


def _fetch_file(repo_id: str, revision: str | None, name: str, access: HubAccess, cache_dir: Path, *,
                what: str) -> str:
    """``name`` of ``repo_id`` at ``revision`` into the cache (blob, snapshot link, ref); the commit it is at."""
    storage = _storage(cache_dir, repo_id)
    if revision is not None and is_commit(revision) and (storage / "snapshots" / revision / name).is_file():
        return revision  # a commit's file never changes
    at = revision or "main"
    url = _resolve_url(access, repo_id, at, name)
    with _fetching(access, repo_id, name) as watch:
        status, headers, resp = _request("HEAD", url, access, watch, repo_id, name, follow=_SAME_ORIGIN)
        resp.close()
        if not 200 <= status < 400:
            raise _refused(status, headers, repo_id, revision, access, what)
        commit, etag = _metadata(headers, status, repo_id, revision, name, access)
        pointer = storage / "snapshots" / commit / name
        blob = storage / "blobs" / etag
        if not _holds(pointer, etag):  # (a blob already cached is checked too: it may have been tampered with)
            if not _holds(blob, etag):
                _download(_resolve_url(access, repo_id, commit, name), blob, etag, storage, access, watch, repo_id,
                          name)
            _link(blob, pointer, storage)
    if revision is None or revision != commit:
        _write_ref(storage, at, commit)
    return commit


def _storage(cache_dir: Path, repo_id: str) -> Path:
    return Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def _resolve_url(access: HubAccess, repo_id: str, revision: str, name: str) -> str:
    return f"{access.endpoint}/{repo_id}/resolve/{urllib.parse.quote(revision, safe='')}/{urllib.parse.quote(name)}"


def _metadata(headers: Any, status: int, repo_id: str, revision: str | None, name: str,
              access: HubAccess) -> tuple[str, str]:
    """(commit, etag) of a HEAD's answer, each checked, and its announced size, before anything is written."""
    raw_commit = headers.get("X-Repo-Commit")
    raw_etag = headers.get("X-Linked-Etag") or headers.get("ETag")
    where = f"model {repo_id}: the Hub at {access.endpoint} answered {name}"
    if not is_commit(raw_commit):
        raise HubError(f"{where} with an X-Repo-Commit that is not a commit hash ({short_repr(raw_commit)}; 40 hex "
                       "digits expected): refused, nothing written; check HF_ENDPOINT")
    if revision is not None and is_commit(revision) and raw_commit != revision:
        raise HubError(f"{where} for commit {revision[:12]} with another commit ({raw_commit[:12]}): refused, "
                       "nothing written; check HF_ENDPOINT")
    etag = normalize_etag(raw_etag)
    if etag is None:
        raise HubError(f"{where} with an ETag that is not a file hash ({short_repr(raw_etag)}; a git sha1 or a "
                       "sha256 expected): refused, nothing written; check HF_ENDPOINT")
    announced = headers.get("X-Linked-Size") or (None if 300 <= status < 400 else headers.get("Content-Length"))
    size = int(announced) if isinstance(announced, str) and announced.strip().isdigit() else None
    cap = max_bytes(name)
    if size is not None and size > cap:
        raise HubError(f"model {repo_id}: the Hub at {access.endpoint} announced {name} of {size:,} bytes, more than "
                       f"the {cap:,} autotune accepts for it: refused before the download")
    return raw_commit, etag  # type: ignore[return-value]


# ------------------------------------------------------------------------------------- the cache, on disk


def _inside(path: Path, root: Path) -> Path:
    """``path`` (a folder, existing or not) when its real location is inside ``root``'s; HubError otherwise."""
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(Path(os.path.realpath(root))):
        raise HubError(f"{path} would be written outside the cache folder {root}; refused, nothing written")
    return path


def _holds(path: Path, etag: str) -> bool:
    """Whether ``path`` is a file whose content hashes to ``etag`` (a cached blob may have been tampered with)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_VOCAB_BYTES:
            return False
        with open(path, "rb") as fh:
            return _digest(fh, etag) == etag
    except OSError:
        return False


def _digest(fh: Any, etag: str) -> str:
    """The hash of the open file ``fh`` in the kind ``etag`` is: sha256, or git's blob sha1 (40 hex)."""
    if len(etag) == 64:
        h = hashlib.sha256()
    else:
        size = os.fstat(fh.fileno()).st_size
        h = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    for chunk in iter(lambda: fh.read(_CHUNK), b""):
        h.update(chunk)
    return h.hexdigest()


def _temp_name(folder: Path, name: str) -> Path:
    return folder / f".{name}.{secrets.token_hex(4)}.tmp"


def _download(url: str, blob: Path, etag: str, storage: Path, access: HubAccess, watch: _Watch, repo_id: str,
              name: str) -> None:
    """GET ``url`` into ``blob``: capped, hashed against ``etag``, written to a temporary file beside it and
    ``os.replace``-d into place with the umask's permissions; nothing is left behind on a failure."""
    from autotune.store.atomic import new_file_mode, write_error

    folder = _made(blob.parent, storage)
    status, headers, resp = _request("GET", url, access, watch, repo_id, name, follow=_ANY_ORIGIN)
    tmp = _temp_name(folder, blob.name)
    try:
        with resp:
            if status != 200:
                raise _refused(status, headers, repo_id, None, access, name)
            try:
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            except OSError as exc:
                raise write_error(blob, exc) from None
            with os.fdopen(fd, "w+b") as fh:
                _stream(resp, fh, max_bytes(name), repo_id, name, access, blob)
                try:
                    os.fchmod(fh.fileno(), new_file_mode(blob))
                    fh.flush()
                    fh.seek(0)
                    ok = _digest(fh, etag) == etag
                    os.fsync(fh.fileno())
                except OSError as exc:
                    raise write_error(blob, exc) from None
                if not ok:
                    raise HubError(f"model {repo_id}: {name} from the Hub at {access.endpoint} does not match its "
                                   f"ETag ({etag[:12]}...): discarded, nothing cached; retry, or check HF_ENDPOINT")
        try:
            os.replace(tmp, blob)
        except OSError as exc:
            raise write_error(blob, exc) from None
    finally:
        tmp.unlink(missing_ok=True)


def _made(folder: Path, storage: Path) -> Path:
    """``folder``, created, after checking that it is (and stays, once made) inside ``storage``."""
    from autotune.store.atomic import write_error

    _inside(folder, storage)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(folder, exc) from None
    return _inside(folder, storage)


def _link(blob: Path, pointer: Path, storage: Path) -> None:
    """``snapshots/<commit>/<name>``: a relative symbolic link to the blob, or a copy where links fail."""
    from autotune.store.atomic import new_file_mode, write_error

    folder = _made(pointer.parent, storage)
    tmp = _temp_name(folder, pointer.name)
    try:
        try:
            os.symlink(os.path.relpath(blob, folder), tmp)
        except OSError:  # a file system without links: a copy, as huggingface_hub makes
            with open(blob, "rb") as src, open(tmp, "xb") as dst:
                os.fchmod(dst.fileno(), new_file_mode(pointer))
                for chunk in iter(lambda: src.read(_CHUNK), b""):
                    dst.write(chunk)
        os.replace(tmp, pointer)
    except OSError as exc:
        raise write_error(pointer, exc) from None
    finally:
        if os.path.lexists(tmp):
            tmp.unlink()


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """``refs/<revision>`` holds ``commit`` (a branch or tag; huggingface_hub writes no newline)."""
    from autotune.store.atomic import write_text_if_changed

    ref = storage / "refs" / revision
    _inside(ref.parent, storage)
    write_text_if_changed(ref, commit)


# ----------------------------------------------------------------------------------------- the network


class _Watch:
    """Shuts the sockets of one fetch down when its deadline passes, so that no read, no TLS handshake and no
    header line waits past it (a read timeout alone restarts with every byte a server trickles)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._conns: list[http.client.HTTPConnection] = []
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autotune-hub-deadline", daemon=True)
        self._thread.start()

    def add(self, conn: http.client.HTTPConnection) -> None:
        """A connection being made (its socket while it connects, tunnels and shakes hands)."""
        with self._lock:
            self._conns.append(conn)

    def connected(self, sock: socket.socket) -> None:
        """A connection's socket once made (urllib drops the connection's own reference to it)."""
        with self._lock:
            self._socks.append(sock)

    def _run(self) -> None:
        if self._done.wait(max(self.seconds, 0.0)):
            return
        self.expired = True
        while True:  # until the fetch gives up: a connection made meanwhile is shut too
            with self._lock:
                socks = [c.sock for c in self._conns if c.sock is not None] + self._socks
            for sock in socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if self._done.wait(0.05):
                return

    def close(self) -> None:
        self._done.set()
        self._thread.join()


class _NetError(Exception):
    """The network failed under a request or a read (the OSError or http.client error it wraps)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@contextmanager
def _fetching(access: HubAccess, repo_id: str, name: str) -> Iterator[_Watch]:
    """One file's fetch, under its deadline and what is left of the command's total; a network failure and the
    deadline become :class:`HubUnreachable`, in one line."""
    clock = access.clock
    with clock.lock:
        left = access.total_s - clock.spent
    if left <= 0:
        raise HubUnreachable(_over_total(access))
    seconds = min(access.deadline_s, left)
    watch = _Watch(seconds)
    start = time.monotonic()
    try:
        yield watch
    except HubError:
        if watch.expired:  # the sockets were shut: whatever broke (a short body fails its hash), that is why
            raise _late(access, repo_id, name, seconds) from None
        raise
    except _NetError as exc:
        if watch.expired:
            raise _late(access, repo_id, name, seconds) from None
        raise _unreachable(exc, access, name) from None
    finally:
        watch.close()
        with clock.lock:
            clock.spent += time.monotonic() - start
    if watch.expired:
        raise _late(access, repo_id, name, seconds)


def _unreachable(exc: _NetError, access: HubAccess, name: str) -> HubUnreachable:
    error = exc.error
    if isinstance(error, http.client.HTTPException):
        return HubUnreachable(f"the Hub at {access.endpoint} sent a broken answer for {name} "
                              f"({type(error).__name__}: {_one_line(error)})")
    reason = getattr(error, "reason", error)
    return HubUnreachable(f"the Hub at {access.endpoint} cannot be reached ({type(reason).__name__}: "
                          f"{_one_line(reason)})")


def _late(access: HubAccess, repo_id: str, name: str, seconds: float) -> HubUnreachable:
    if seconds < access.deadline_s:
        return HubUnreachable(_over_total(access))
    return HubUnreachable(f"the Hub at {access.endpoint} did not send {name} of {repo_id} within {seconds:g} s "
                          "(AUTOTUNE_HUB_TIMEOUT sets this limit)")


def _over_total(access: HubAccess) -> str:
    return (f"the Hub fetches of this command took more than {access.total_s:g} s in all (the Hub at "
            f"{access.endpoint}; AUTOTUNE_HUB_TIMEOUT sets the limit per file, and five times it in all)")


def _one_line(exc: object) -> str:
    text = " ".join(str(exc).split())
    return text[:200] + ("..." if len(text) > 200 else "")


_SAME_ORIGIN, _ANY_ORIGIN = "same", "any"


def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


def _request(method: str, url: str, access: HubAccess, watch: _Watch, repo_id: str, name: str, *,
             follow: str) -> tuple[int, Any, Any]:
    """(status, headers, response) of ``method url``; the caller closes the response.

    Redirects are followed by hand, at most five: for ``_SAME_ORIGIN`` only those to the endpoint's own host
    (a renamed repository; a HEAD stops at the Hub's redirect of a file in LFS, whose headers say what it is),
    for ``_ANY_ORIGIN`` any http(s) one, without the token once the host differs."""
    origin = _origin(url)
    token = access.token or _stored_token()
    for _ in range(_MAX_REDIRECTS + 1):
        headers = {"User-Agent": _user_agent()}
        if token and _origin(url) == origin:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, method=method, headers=headers)
        try:
            resp = _opener(watch).open(request, timeout=access.timeout_s)
            status, got = resp.status, resp.headers
        except urllib.error.HTTPError as exc:
            resp, status, got = exc, exc.code, exc.headers
        except (OSError, http.client.HTTPException) as exc:
            raise _NetError(exc) from None
        if status not in (301, 302, 303, 307, 308):
            return status, got, resp
        location = got.get("Location")
        target = urllib.parse.urljoin(url, location) if location else ""
        if follow == _SAME_ORIGIN and _origin(target) != origin:
            return status, got, resp
        resp.close()
        if urllib.parse.urlsplit(target).scheme.lower() not in ("http", "https"):
            raise HubError(f"model {repo_id}: the Hub at {access.endpoint} redirected {name} to "
                           f"{short_repr(location)}, not an http(s) address: refused")
        url = target
    raise HubError(f"model {repo_id}: the Hub at {access.endpoint} redirected {name} more than {_MAX_REDIRECTS} "
                   "times: refused")


def _read_capped(resp: Any, cap: int, repo_id: str, name: str, access: HubAccess) -> bytes:
    chunks: list[bytes] = []
    _stream(resp, _Sink(chunks), cap, repo_id, name, access, None)
    return b"".join(chunks)


class _Sink:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def write(self, data: bytes) -> None:
        self.chunks.append(data)


def _stream(resp: Any, out: Any, cap: int, repo_id: str, name: str, access: HubAccess, file: Path | None) -> None:
    """Copy the body of ``resp`` to ``out`` (writing ``file``), counting: more than ``cap`` bytes is a HubError
    (the size a server announces may be a lie; what it sends is counted)."""
    from autotune.store.atomic import write_error

    total = 0
    while True:
        try:
            chunk = resp.read(_CHUNK)
        except (OSError, http.client.HTTPException) as exc:
            raise _NetError(exc) from None
        if not chunk:
            return
        total += len(chunk)
        if total > cap:
            raise HubError(f"model {repo_id}: the Hub at {access.endpoint} sent more than the {cap:,} bytes autotune "
                           f"accepts for {name}: stopped, nothing cached")
        try:
            out.write(chunk)
        except OSError as exc:
            raise write_error(file or name, exc) from None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx comes back as it is; _request decides


class _Watched:
    """A connection the fetch's deadline can shut: registered with the watch, its socket handed over on connect."""

    def __init__(self, host: str, *, watch: _Watch, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)  # type: ignore[call-arg]
        self.watch = watch
        watch.add(self)

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self.watch.connected(self.sock)  # type: ignore[attr-defined]


class _WatchedHTTP(_Watched, http.client.HTTPConnection):
    pass


class _WatchedHTTPS(_Watched, http.client.HTTPSConnection):
    pass


class _Http(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def http_open(self, req: Any) -> Any:
        return self.do_open(functools.partial(_WatchedHTTP, watch=self.watch), req)


class _Https(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self.watch = watch
        self.ssl_context = context

    def https_open(self, req: Any) -> Any:
        return self.do_open(functools.partial(_WatchedHTTPS, watch=self.watch), req, context=self.ssl_context)


def _opener(watch: _Watch) -> urllib.request.OpenerDirector:
    """urllib with the environment's proxies, no automatic redirect, and every connection watched."""
    return urllib.request.build_opener(_Http(watch), _Https(watch, ssl.create_default_context()), _NoRedirects())


def _user_agent() -> str:
    try:
        from importlib.metadata import version

        return f"autotune/{version('autotune')}"
    except Exception:
        return "autotune"


def _stored_token() -> str | None:
    """``HF_TOKEN``, else the token ``hf auth login`` stored (huggingface_hub's own look-up)."""
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:
        return os.environ.get("HF_TOKEN") or None


def _refused(status: int, headers: Any, repo_id: str, revision: str | None, access: HubAccess,
             what: str) -> HubError:
    """One line for a Hub answer that is not the file."""
    code = (headers.get("X-Error-Code") if headers is not None else None) or ""
    at = f"@{revision}" if revision else ""
    page = access.model_page(repo_id)
    if code == "GatedRepo" or status in (401, 403):
        have = "the token sent has no access" if status == 403 else "not authenticated"
        what_it_is = "is gated or private" if code == "GatedRepo" else (
            "is private or does not exist")  # (the Hub answers 401 for both when not authenticated)
        return HubError(
            f"model {repo_id}{at} {what_it_is} on the Hub ({status}; {have}): accept its "
            f"terms at {page} and set HF_TOKEN to a token with access (or run `hf auth login`), "
            "or pass a local directory or a preset"
        )
    if code == "RevisionNotFound":
        return HubError(f"model {repo_id}: revision {revision!r} does not exist on the Hub ({page}); "
                        "pass an existing branch, tag or commit hash after @")
    if code == "EntryNotFound":
        return HubError(f"model {repo_id}{at} has no {what} on the Hub ({page}); autotune needs the model's "
                        f"{what}: pass a local directory holding one, or a preset")
    if code == "RepoNotFound" or status == 404:
        return HubError(f"model {repo_id}{at} does not exist on the Hub ({page}, 404): check the id, or pass "
                        "a local directory or a preset")
    return HubError(f"model {repo_id}{at}: the Hub at {access.endpoint} answered {status} for {what}")
