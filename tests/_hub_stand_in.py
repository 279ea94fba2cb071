"""A stand-in for the Hugging Face Hub on 127.0.0.1, for tests that must never reach the real one.

It answers the routes ``huggingface_hub`` and ``datasets`` use, with the headers they read:

* ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` (models) and ``/datasets/{repo}/resolve/{rev}/{path}``:
  ``X-Repo-Commit``, ``ETag`` (the file's sha256, quoted), ``Content-Length``, byte ranges (parquet is
  read by range); a missing file is 404 with ``X-Error-Code: EntryNotFound`` and the commit header;
* ``GET /api/{models,datasets}/{repo}[/revision/{rev}]``: the repo's info with ``sha`` and ``siblings``;
* ``GET /api/{models,datasets}/{repo}/tree/{rev}[/{path}]`` and ``POST .../paths-info/{rev}``: listings;
* a gated repo answers 401 (403 with a token) ``X-Error-Code: GatedRepo``; an unknown repo 404
  ``X-Error-Code: RepoNotFound``; an unknown revision 404 ``RevisionNotFound``.

Every request is recorded (method, path) in :attr:`HubStandIn.requests`, so a test can check what
was fetched. Start it with :func:`serve` (a context manager) and point ``HF_ENDPOINT`` at ``.url``.

A hostile Hub: :attr:`HubStandIn.hostile` maps a file's path (in any repository) to a :class:`Hostile`,
which changes what the stand-in answers for it: an ``ETag`` or ``X-Repo-Commit`` that is a path (the
second HEAD only, if asked), a body trickled byte by byte or headers trickled line by line, a body of
any size with a ``Content-Length`` that lies; :attr:`Repo.announced` makes the repository's info and
headers announce another commit (``sha``) than the one it serves.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import sys
import threading
import traceback
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["Hostile", "HubStandIn", "Repo", "serve"]


@dataclass
class Repo:
    """One repository: its files at one commit (``files``: path -> bytes)."""

    repo_id: str
    kind: str  # "model" | "dataset"
    files: dict[str, bytes]
    commit: str = ""
    gated: bool = False
    announced: str | None = None  # the commit its info (``sha``) and headers (``X-Repo-Commit``) announce

    def commit_header(self) -> str:
        return self.commit if self.announced is None else self.announced

    def __post_init__(self) -> None:
        if not self.commit:
            h = hashlib.sha1(self.repo_id.encode())
            for name in sorted(self.files):
                h.update(name.encode() + b"\0" + self.files[name])
            self.commit = h.hexdigest()


@dataclass
class Hostile:
    """How the stand-in answers for one file path (of any repository) when it is hostile."""

    etag: str | None = None  # the ETag header value sent (verbatim, quotes included) instead of the sha256
    commit: str | None = None  # the X-Repo-Commit header sent (also on a 404 for a missing file)
    from_head: int = 1  # etag/commit are sent from this HEAD of the path on (2: the first HEAD is honest)
    trickle_s: float = 0.0  # seconds between the pieces of the body (GET)
    step: int = 1  # bytes per piece when trickling
    trickle_headers_s: float = 0.0  # seconds between the header lines (HEAD and GET)
    size: int | None = None  # a body of this many bytes (a JSON object padded with spaces) instead of the file
    declared: int | None = None  # the Content-Length claimed; the GET then sends the body chunked, unannounced
    redirect_to: str | None = None  # answer 302 to this base URL + the path, as the Hub does for a file in LFS
    heads: int = 0  # HEADs of this path answered so far


@dataclass
class HubStandIn:
    repos: dict[tuple[str, str], Repo] = field(default_factory=dict)
    hostile: dict[str, Hostile] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)  # the Authorization header of each request
    sent: dict[str, int] = field(default_factory=dict)  # bytes of a hostile file's body written, by path
    ranges: list[tuple[str, str | None, int]] = field(default_factory=list)  # (path, Range header, bytes sent)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    # set when the stand-in shuts down: a trickling answer stops at its next pause, so no handler thread of
    # one test is still writing (and failing) while the next test runs
    closing: threading.Event = field(default_factory=threading.Event)
    # what a handler raised that was not the client hanging up (``_Server.handle_error``): never printed,
    # since an in-process CLI call of the same test may be capturing ``sys.stderr`` at that moment
    errors: list[str] = field(default_factory=list)

    def add(self, repo: Repo) -> Repo:
        self.repos[(repo.kind, repo.repo_id)] = repo
        return repo

    def paths(self, method: str | None = None) -> list[str]:
        with self.lock:
            return [p for m, p in self.requests if method is None or m == method]

    def files_fetched(self) -> list[str]:
        """The file paths whose bytes were sent (GET of a resolve URL)."""
        out = []
        for p in self.paths("GET"):
            m = _RESOLVE.match(urllib.parse.unquote(p.split("?")[0]))
            if m:
                out.append(m.group("path"))
        return out


_RESOLVE = re.compile(r"^/(?:(?P<ds>datasets)/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_API = re.compile(
    r"^/api/(?P<kind>models|datasets)/(?P<repo>[^/]+/[^/]+)"
    r"(?:/(?P<what>revision|tree|paths-info)/(?P<rev>[^/]+)(?:/(?P<path>.*))?)?$"
)


def _etag(data: bytes) -> str:
    return '"' + hashlib.sha256(data).hexdigest() + '"'


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        return

    # --- plumbing
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            if status in (200, 206) and content_type == "application/octet-stream":
                with self.hub.lock:
                    self.hub.ranges.append((urllib.parse.unquote(self.path.split("?")[0]),
                                            self.headers.get("Range"), len(body)))

    def _error(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message, **(headers or {})})

    def _record(self) -> None:
        with self.hub.lock:
            self.hub.requests.append((self.command, self.path))
            self.hub.auth.append(self.headers.get("Authorization"))

    def _repo(self, kind: str, repo_id: str) -> Repo | None:
        repo = self.hub.repos.get((kind, repo_id))
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
            return None
        if repo.gated:
            authorized = "authorization" in {k.lower() for k in self.headers}
            self._error(403 if authorized else 401, "GatedRepo",
                        f"Access to {kind} {repo_id} is restricted. You must have access to it and be authenticated.")
            return None
        return repo

    def _revision_ok(self, repo: Repo, rev: str) -> bool:
        if urllib.parse.unquote(rev) in ("main", repo.commit):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return False

    # --- routes
    def do_HEAD(self) -> None:
        self._record()
        self._resolve()

    def do_GET(self) -> None:
        self._record()
        path = urllib.parse.unquote(self.path.split("?")[0])
        if path.startswith("/api/"):
            self._api(path)
        else:
            self._resolve()

    def do_POST(self) -> None:
        self._record()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = urllib.parse.unquote(self.path.split("?")[0])
        m = _API.match(path)
        if not m or m.group("what") != "paths-info":
            self._error(404, "EntryNotFound", f"no route {path}")
            return
        repo = self._repo("dataset" if m.group("kind") == "datasets" else "model", m.group("repo"))
        if repo is None or not self._revision_ok(repo, m.group("rev")):
            return
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            wanted = json.loads(body or b"{}").get("paths", [])
        else:
            wanted = urllib.parse.parse_qs(body.decode()).get("paths", [])
        out = []
        for p in wanted:
            p = p.strip("/")
            if p in repo.files:
                out.append(self._file_entry(p, repo.files[p]))
            elif any(f.startswith(p + "/") for f in repo.files):
                out.append({"type": "directory", "path": p, "oid": repo.commit})
        self._send(200, json.dumps(out).encode())

    def _file_entry(self, path: str, data: bytes) -> dict[str, object]:
        return {"type": "file", "path": path, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}

    def _api(self, path: str) -> None:
        m = _API.match(path)
        if not m:
            self._error(404, "EntryNotFound", f"no route {path}")
            return
        kind = "dataset" if m.group("kind") == "datasets" else "model"
        repo = self._repo(kind, m.group("repo"))
        if repo is None:
            return
        what, rev = m.group("what"), m.group("rev") or "main"
        if not self._revision_ok(repo, rev):
            return
        if what in (None, "revision"):
            info = {"id": repo.repo_id, "_id": repo.commit[:24], "sha": repo.commit_header(), "private": False,
                    "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [],
                    "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z",
                    "siblings": [{"rfilename": f} for f in sorted(repo.files)]}
            if kind == "dataset":
                info["cardData"] = {}
            self._send(200, json.dumps(info).encode())
            return
        if what == "tree":
            sub = (m.group("path") or "").strip("/")
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
            entries: dict[str, dict[str, object]] = {}
            for f, data in sorted(repo.files.items()):
                if sub and not f.startswith(sub + "/"):
                    continue
                rest = f[len(sub) + 1 :] if sub else f
                if recursive:
                    parts = rest.split("/")
                    for i in range(1, len(parts)):
                        d = "/".join(([sub] if sub else []) + parts[:i])
                        entries.setdefault(d, {"type": "directory", "path": d, "oid": repo.commit})
                    entries[f] = self._file_entry(f, data)
                elif "/" in rest:
                    d = (sub + "/" if sub else "") + rest.split("/")[0]
                    entries.setdefault(d, {"type": "directory", "path": d, "oid": repo.commit})
                else:
                    entries[f] = self._file_entry(f, data)
            if sub and not entries:
                self._error(404, "EntryNotFound", f"{sub} does not exist on {rev}")
                return
            self._send(200, json.dumps(list(entries.values())).encode())
            return
        self._error(404, "EntryNotFound", f"no route {path}")

    def _resolve(self) -> None:
        path = urllib.parse.unquote(self.path.split("?")[0])
        m = _RESOLVE.match(path)
        if not m:
            self._error(404, "EntryNotFound", f"no route {path}")
            return
        repo = self._repo("dataset" if m.group("ds") else "model", m.group("repo"))
        if repo is None or not self._revision_ok(repo, m.group("rev")):
            return
        name = m.group("path")
        hostile = self.hub.hostile.get(name)
        if hostile is not None:
            with self.hub.lock:
                if self.command == "HEAD":
                    hostile.heads += 1
                now = hostile.heads >= hostile.from_head
        commit = {"X-Repo-Commit": repo.commit_header()}
        if hostile is not None and hostile.commit is not None and now:
            commit = {"X-Repo-Commit": hostile.commit}
        if name not in repo.files:
            self._error(404, "EntryNotFound", f"{name} does not exist on {m.group('rev')}", commit)
            return
        data = repo.files[name]
        headers = {**commit, "ETag": _etag(data), "Accept-Ranges": "bytes"}
        if hostile is not None:
            if hostile.etag is not None and now:
                headers["ETag"] = hostile.etag
            self._hostile(hostile, data, headers)
            return
        rng = self.headers.get("Range")
        if rng and self.command == "GET":
            mm = re.match(r"bytes=(\d*)-(\d*)", rng)
            if mm:
                start_s, end_s = mm.groups()
                if start_s == "":
                    start, end = max(0, len(data) - int(end_s)), len(data) - 1
                else:
                    start = int(start_s)
                    end = min(int(end_s), len(data) - 1) if end_s else len(data) - 1
                if start >= len(data):
                    self._send(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"})
                    return
                part = data[start : end + 1]
                self._send(206, part, {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"},
                           content_type="application/octet-stream")
                return
        self._send(200, data, headers, content_type="application/octet-stream")


    def _hostile(self, hostile: Hostile, data: bytes, headers: dict[str, str]) -> None:
        """The answer for a file with a :class:`Hostile` entry (no byte ranges)."""
        if hostile.redirect_to is not None:
            self._send(302, b"", {**headers, "Location": hostile.redirect_to + self.path,
                                  "X-Linked-Etag": headers["ETag"], "X-Linked-Size": str(len(data))})
            return
        size = len(data) if hostile.size is None else hostile.size
        declared = size if hostile.declared is None else hostile.declared
        name = _RESOLVE.match(urllib.parse.unquote(self.path.split("?")[0])).group("path")  # type: ignore[union-attr]
        chunked = self.command == "GET" and declared != size
        self.send_response(200)
        lines = [("Content-Type", "application/octet-stream"), *headers.items()]
        lines.append(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(declared)))
        try:
            for k, v in lines:
                self.send_header(k, v)
                if hostile.trickle_headers_s:
                    self.flush_headers()
                    self._pause(hostile.trickle_headers_s)
            self.end_headers()
            if self.command == "HEAD":
                return
            with self.hub.lock:
                self.hub.ranges.append((urllib.parse.unquote(self.path.split("?")[0]), None, size))
            for piece in _body(data if hostile.size is None else None, size,
                               hostile.step if hostile.trickle_s else 1 << 16):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                self.wfile.flush()
                with self.hub.lock:
                    self.hub.sent[name] = self.hub.sent.get(name, 0) + len(piece)
                if hostile.trickle_s:
                    self._pause(hostile.trickle_s)
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, _Closing):  # the client gave up, or the stand-in closes
            self.close_connection = True

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` between two pieces of a trickled answer; :class:`_Closing` once the stand-in shuts down."""
        if self.hub.closing.wait(seconds):
            raise _Closing


def _body(data: bytes | None, size: int, step: int) -> Iterator[bytes]:
    """``data`` in pieces of ``step`` bytes, or ``size`` generated bytes: a JSON object padded with spaces."""
    if data is None:
        head, tail = b'{"model_type": "llama"', b"}"
        if size < len(head) + len(tail):
            data = b" " * size
        else:
            pad = b" " * max(step, 1 << 16)
            yield from _body(head, len(head), step)
            left = size - len(head) - len(tail)
            while left > 0:
                n = min(left, step, len(pad))
                yield pad[:n]
                left -= n
            yield tail
            return
    for i in range(0, len(data), step):
        yield data[i : i + step]


class _Closing(Exception):
    """The stand-in is shutting down: a trickling handler stops where it is."""


class _Server(ThreadingHTTPServer):
    """The stand-in's server: an error in a handler is kept in ``hub.errors``, not printed.

    ``socketserver`` prints a handler's traceback to ``sys.stderr``. A handler runs in a thread of the test
    process, and a test's in-process CLI call captures ``sys.stderr`` as the command's own error output: a
    client hanging up on a trickled answer (what a hostile-server test provokes) then reads as a second
    line of the command's error message.
    """

    daemon_threads = True
    hub: HubStandIn

    def handle_error(self, request: object, client_address: object) -> None:
        kind = sys.exc_info()[0]
        if kind is not None and issubclass(kind, (BrokenPipeError, ConnectionResetError, _Closing)):
            return
        with self.hub.lock:
            self.hub.errors.append(traceback.format_exc())


@contextlib.contextmanager
def serve(*repos: Repo) -> Iterator[HubStandIn]:
    """A running stand-in on 127.0.0.1 (a free port) holding ``repos``; shut down on exit."""
    hub = HubStandIn()
    for r in repos:
        hub.add(r)
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = _Server(("127.0.0.1", 0), handler)
    server.hub = hub
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert not hub.errors, "the stand-in Hub failed while answering:\n" + "\n".join(hub.errors)


def parquet_bytes(rows: list[dict[str, object]]) -> bytes:
    """``rows`` as one parquet file (pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def isolate_hf_caches(monkeypatch: object, root: object) -> None:
    """Point huggingface_hub's and datasets' caches at ``root`` for this test, in this process too.

    Both libraries read ``HF_HUB_CACHE`` / ``HF_DATASETS_CACHE`` once, at import, and fsspec keeps one
    ``HfFileSystem`` (with its listings) per endpoint for the process: a test that only sets the environment
    would read what an earlier test cached. A command line starts with a fresh process; a test must start
    with fresh caches.
    """
    from pathlib import Path

    root = Path(str(root))
    mp = monkeypatch
    mp.setenv("HF_HOME", str(root))  # type: ignore[attr-defined]
    mp.setenv("HF_HUB_CACHE", str(root / "hub"))  # type: ignore[attr-defined]
    mp.setenv("HF_DATASETS_CACHE", str(root / "datasets"))  # type: ignore[attr-defined]
    import huggingface_hub.constants as hub_constants

    mp.setattr(hub_constants, "HF_HUB_CACHE", str(root / "hub"))  # type: ignore[attr-defined]
    try:
        import datasets.config as ds_config
    except ImportError:  # pragma: no cover - datasets is an optional extra
        ds_config = None
    if ds_config is not None:
        mp.setattr(ds_config, "HF_DATASETS_CACHE", root / "datasets")  # type: ignore[attr-defined]
        mp.setattr(ds_config, "HF_MODULES_CACHE", root / "modules")  # type: ignore[attr-defined]
    from huggingface_hub import HfFileSystem

    HfFileSystem.clear_instance_cache()


def online_against(monkeypatch: object, hub: HubStandIn, tmp_path: object) -> None:
    """The environment of an online user whose ``HF_ENDPOINT`` is ``hub``: caches under ``tmp_path`` (the Hub's
    and autotune's), no offline switch, no token, the default Hub deadline."""
    from pathlib import Path

    tmp = Path(str(tmp_path))
    mp = monkeypatch
    mp.setenv("HF_ENDPOINT", hub.url)  # type: ignore[attr-defined]
    isolate_hf_caches(monkeypatch, tmp / "hf")
    mp.setenv("AUTOTUNE_CACHE", str(tmp / "autotune-cache"))  # type: ignore[attr-defined]
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN", "AUTOTUNE_HUB_TIMEOUT"):
        mp.delenv(k, raising=False)  # type: ignore[attr-defined]

