"""A hostile Hub endpoint (``HF_ENDPOINT`` pointed at a mirror or proxy that misbehaves) against the stand-in.

What it must not be able to do: write outside the Hugging Face cache (an ``ETag`` or ``X-Repo-Commit``
that is a path, a second HEAD that answers differently, a 404 naming a path as its commit), poison a
cached blob (content that is not what its ``ETag`` says), hang the command (a body or headers trickled
a byte at a time: a deadline per file and one for all the fetches of a command), fill the disk or the
memory (a file over its cap is refused by its announced size before the download, and by the bytes
counted while streaming when the size was a lie). Each refusal is one line, exit 2. Files written
follow the umask, like every other output.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import _cli
import pytest
from _hub_stand_in import Hostile, Repo, online_against, parquet_bytes, serve

from autotune.errors import DatasetError, SpecError
from autotune.models import HubAccess, HubError, resolve_model
from autotune.models.hub import HubUnreachable, fetch_config, fetch_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CONFIG = (ROOT / "autotune" / "models" / "tiny" / "tiny-llama" / "config.json").read_bytes()
TOK_DIR = ROOT / "autotune" / "models" / "tokenizers" / "tiny-chat"
TOKENIZER = {n: (TOK_DIR / n).read_bytes() for n in ("tokenizer.json", "tokenizer_config.json")}
MODEL = "standin/tiny-model"
DATA = "standin/tiny-data"
CAP = 8 * 2**20  # the cap on a config (every file a user names has it too)


def _repos() -> list[Repo]:
    return [
        Repo(MODEL, "model", {"config.json": CONFIG, **TOKENIZER}),
        Repo(DATA, "dataset", {"README.md": b"---\nlicense: mit\n---\n",
                               "data/train-00000-of-00001.parquet": parquet_bytes([{"text": f"row {i}"}
                                                                                   for i in range(20)])}),
    ]


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with serve(*_repos()) as h:
        online_against(monkeypatch, h, tmp_path)
        yield h


def _cache(tmp_path: Path) -> Path:
    return tmp_path / "hf" / "hub"


def _blobs(tmp_path: Path, repo: str = MODEL) -> Path:
    return _cache(tmp_path) / f"models--{repo.replace('/', '--')}" / "blobs"


def _files(folder: Path) -> list[str]:
    """Every file (and link) under ``folder``, relative."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def _escape(tmp_path: Path, start: Path) -> tuple[str, Path]:
    """A relative path from ``start`` (a folder in the cache) to a file outside the cache, and that file."""
    target = tmp_path / "outside" / "ESCAPED"
    return os.path.relpath(target, start), target


def cli(*args: str, env_extra: dict[str, str] | None = None, timeout: float = 300,
        process: bool = False) -> subprocess.CompletedProcess:
    """The real CLI, in-process unless ``process`` (tests/_cli.py), in the environment the fixtures set."""
    return _cli.cli(Path.cwd(), *args, env={"PYTHONPATH": str(ROOT), **(env_extra or {})}, timeout=timeout,
                    process=process, offline=False)


# --------------------------------------------------------------------------- writes outside the cache


def test_an_etag_that_is_a_path_writes_nothing_outside_the_cache(hub, tmp_path: Path) -> None:
    rel, target = _escape(tmp_path, _blobs(tmp_path))
    hub.hostile["config.json"] = Hostile(etag=f'"{rel}"')
    res = cli("plan", "--model", MODEL, "--gpu", "L4", "--json")
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr)
    assert "ETag" in lines[0] and hub.url in lines[0], lines[0]
    assert not target.exists() and not target.parent.exists()
    assert [f for f in _files(tmp_path / "hf") if "blobs" in f or "snapshots" in f] == []


@pytest.mark.parametrize("case", ["absolute etag", "weak etag with a path", "etag not a hash", "commit a path",
                                  "commit not a hash"])
def test_headers_that_are_not_hashes_are_refused_before_anything_is_written(hub, tmp_path: Path, case: str) -> None:
    rel, target = _escape(tmp_path, _blobs(tmp_path))
    snap_rel = os.path.relpath(target, _blobs(tmp_path).parent / "snapshots")
    hostile = {
        "absolute etag": Hostile(etag=f'"{target}"'),
        "weak etag with a path": Hostile(etag=f'W/"{rel}"'),
        "etag not a hash": Hostile(etag='"config"'),
        "commit a path": Hostile(commit=snap_rel.removesuffix("/ESCAPED")),
        "commit not a hash": Hostile(commit="main"),
    }[case]
    hub.hostile["config.json"] = hostile
    with pytest.raises(HubError) as info:
        resolve_model(MODEL, hub=HubAccess.from_env())
    msg = str(info.value)
    assert "\n" not in msg and ("ETag" if "etag" in case else "X-Repo-Commit") in msg, msg
    assert not target.exists() and not target.parent.exists()
    assert _files(_cache(tmp_path)) == [] if _cache(tmp_path).exists() else True


def test_a_second_head_answering_differently_cannot_redirect_the_write(hub, tmp_path: Path) -> None:
    """huggingface_hub asks again with its own HEAD; autotune asks once and writes what that answer named."""
    rel, target = _escape(tmp_path, _blobs(tmp_path))
    hub.hostile["config.json"] = Hostile(etag=f'"{rel}"', from_head=2)
    resolved = resolve_model(MODEL, hub=HubAccess.from_env())
    assert not target.exists()
    assert Path(resolved.config_path).read_bytes() == CONFIG
    assert [p for p in hub.paths("HEAD") if p.endswith("config.json")] == [f"/{MODEL}/resolve/main/config.json"]


def test_content_that_is_not_what_its_etag_says_is_refused_and_not_cached(hub, tmp_path: Path) -> None:
    """A blob is named by its hash: a mirror cannot plant content under another file's name in the shared cache."""
    other = '"' + hashlib.sha256(b"another file").hexdigest() + '"'
    hub.hostile["config.json"] = Hostile(etag=other)
    with pytest.raises(HubError, match="does not match its ETag"):
        resolve_model(MODEL, hub=HubAccess.from_env())
    assert _files(_cache(tmp_path)) == []


def test_a_git_sha1_etag_is_checked_as_git_hashes_a_blob(hub, tmp_path: Path) -> None:
    """The Hub's ETag of a file kept in git (not LFS) is its git blob id: checked the same way."""
    git = hashlib.sha1(b"blob %d\0" % len(CONFIG) + CONFIG).hexdigest()
    hub.hostile["config.json"] = Hostile(etag=f'"{git}"')
    resolved = resolve_model(MODEL, hub=HubAccess.from_env())
    assert Path(resolved.config_path).resolve() == _blobs(tmp_path) / git
    hub.hostile["config.json"] = Hostile(etag='"' + hashlib.sha1(CONFIG).hexdigest() + '"')  # not git's hash
    with pytest.raises(HubError, match="does not match its ETag"):
        resolve_model(f"{MODEL}@main", hub=HubAccess.from_env(), hf_cache=tmp_path / "other-cache")


def test_the_cache_layout_is_huggingface_hubs_and_found_offline(hub, tmp_path: Path) -> None:
    from huggingface_hub import try_to_load_from_cache

    repo = hub.repos[("model", MODEL)]
    resolved = resolve_model(MODEL, hub=HubAccess.from_env(), tokenizer=True)
    storage = _cache(tmp_path) / f"models--{MODEL.replace('/', '--')}"
    snap = storage / "snapshots" / repo.commit
    assert resolved.path == str(snap) and resolved.revision == repo.commit
    assert (storage / "refs" / "main").read_text() == repo.commit
    for name, data in {"config.json": CONFIG, **TOKENIZER}.items():
        link = snap / name
        assert link.is_symlink() and not os.path.isabs(os.readlink(link)), name
        assert link.resolve() == storage / "blobs" / hashlib.sha256(data).hexdigest()
        assert link.read_bytes() == data
        assert try_to_load_from_cache(MODEL, name, cache_dir=str(_cache(tmp_path))) == str(link)
    assert [f for f in _files(storage) if ".tmp" in f or "incomplete" in f] == []
    offline = resolve_model(MODEL)  # no HubAccess: the offline resolution finds the same snapshot
    assert offline.source == "hf-cache" and offline.path == str(snap)


def test_the_token_goes_to_the_endpoint_as_a_bearer_and_not_to_another_host(hub, tmp_path: Path) -> None:
    with serve(*_repos()) as cdn:
        hub.hostile["tokenizer.json"] = Hostile(redirect_to=cdn.url)  # as the Hub does for a file in LFS
        access = HubAccess(endpoint=hub.url, token="hf_secret")
        resolve_model(MODEL, hub=access, tokenizer=True)
    assert hub.auth and set(hub.auth) == {"Bearer hf_secret"}
    assert cdn.files_fetched() == ["tokenizer.json"] and cdn.auth == [None]
    snap = _cache(tmp_path) / f"models--{MODEL.replace('/', '--')}" / "snapshots" / hub.repos[("model", MODEL)].commit
    assert (snap / "tokenizer.json").read_bytes() == TOKENIZER["tokenizer.json"]


# --------------------------------------------------------------------------- deadlines


def test_a_trickling_hub_is_cut_at_the_deadline_in_one_line(hub, tmp_path: Path) -> None:
    hub.hostile["config.json"] = Hostile(trickle_s=0.25)  # 612 bytes: 2.5 minutes
    start = time.monotonic()
    res = cli("plan", "--model", MODEL, "--gpu", "L4", "--json", env_extra={"AUTOTUNE_HUB_TIMEOUT": "1"}, timeout=60)
    took = time.monotonic() - start
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr)  # no retry chatter either
    assert "within 1 s" in lines[0] and "AUTOTUNE_HUB_TIMEOUT" in lines[0] and "config.json" in lines[0], lines[0]
    assert took < 30, took
    assert not list(_cache(tmp_path).rglob("config.json"))


def test_headers_trickled_line_by_line_are_cut_at_the_deadline(hub, tmp_path: Path, monkeypatch) -> None:
    hub.hostile["config.json"] = Hostile(trickle_headers_s=2.0)  # 6 header lines: 12 s per answer
    monkeypatch.setenv("AUTOTUNE_HUB_TIMEOUT", "1")
    start = time.monotonic()
    with pytest.raises(HubUnreachable, match=r"within 1 s \(AUTOTUNE_HUB_TIMEOUT"):
        resolve_model(MODEL, hub=HubAccess.from_env())
    assert time.monotonic() - start < 4


def test_all_the_fetches_of_a_command_share_one_deadline(hub, tmp_path: Path) -> None:
    for name, data in {"config.json": CONFIG, **TOKENIZER}.items():  # each file ~0.8 s, well within its own limit
        hub.hostile[name] = Hostile(trickle_s=0.1, step=len(data) // 8 + 1)
    access = HubAccess(endpoint=hub.url, deadline_s=10.0, total_s=1.5)
    start = time.monotonic()
    fetched = fetch_config(MODEL, None, access, _cache(tmp_path))
    with pytest.raises(HubUnreachable, match=r"more than 1\.5 s in all"):
        fetch_tokenizer(MODEL, fetched.commit, access, _cache(tmp_path))
    assert time.monotonic() - start < 4
    assert [f for f in _files(_cache(tmp_path)) if ".tmp" in f] == []


def test_the_deadline_setting_is_checked() -> None:
    assert HubAccess.from_env({"AUTOTUNE_HUB_TIMEOUT": "2.5"}) == HubAccess(deadline_s=2.5, total_s=12.5)
    assert HubAccess.from_env({}).deadline_s == 60.0
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(SpecError, match="AUTOTUNE_HUB_TIMEOUT"):
            HubAccess.from_env({"AUTOTUNE_HUB_TIMEOUT": bad})


# --------------------------------------------------------------------------- sizes


def test_a_config_over_the_cap_is_refused_by_its_size_before_the_download(hub, tmp_path: Path) -> None:
    hub.hostile["config.json"] = Hostile(size=CAP + 1)
    with pytest.raises(HubError, match=r"config\.json of 8,388,609 bytes.*more than the 8,388,608"):
        resolve_model(MODEL, hub=HubAccess.from_env())
    assert hub.files_fetched() == [], "refused on the HEAD's size: never downloaded"
    assert _files(_cache(tmp_path)) == [] if _cache(tmp_path).exists() else True


def test_a_hub_that_lies_about_the_size_is_cut_at_the_cap_while_streaming(hub, tmp_path: Path) -> None:
    hub.hostile["config.json"] = Hostile(size=64 * 2**20, declared=len(CONFIG))  # says 612 bytes, sends 64 MiB
    with pytest.raises(HubError, match=r"more than the 8,388,608 bytes"):
        resolve_model(MODEL, hub=HubAccess.from_env())
    assert hub.sent["config.json"] < 40 * 2**20, "the download stopped at the cap (plus what the sockets buffer)"
    assert _files(_cache(tmp_path)) == []


def test_a_tokenizer_file_over_its_cap_is_refused_in_one_line(hub, tmp_path: Path) -> None:
    hub.hostile["tokenizer_config.json"] = Hostile(size=CAP + 1)  # read whole for the remote-code check
    with pytest.raises(HubError, match=r"tokenizer_config\.json of 8,388,609 bytes"):
        resolve_model(MODEL, hub=HubAccess.from_env(), tokenizer=True)
    assert "tokenizer_config.json" not in hub.files_fetched()


def test_the_remote_code_check_names_a_file_over_its_cap_instead_of_skipping_it(tmp_path: Path) -> None:
    from autotune.models.trust import require_trusted

    folder = tmp_path / "tok"
    folder.mkdir()
    body = '{"auto_map": {"AutoTokenizer": [null, "evil.EvilTok"]}, "pad": "' + " " * CAP + '"}'
    (folder / "tokenizer_config.json").write_text(body)
    with pytest.raises(SpecError, match=r"tokenizer_config\.json.*more than the 8,388,608 bytes") as info:
        require_trusted(folder, trust_remote_code=False)
    assert "\n" not in str(info.value)
    require_trusted(folder, trust_remote_code=True)  # trusted: not read at all


# --------------------------------------------------------------------------- the dataset sample


def test_a_hostile_dataset_endpoint_writes_nothing_outside_the_caches(hub, tmp_path: Path) -> None:
    from autotune.probe.hub_sample import sample_hub_dataset

    storage = _cache(tmp_path) / f"datasets--{DATA.replace('/', '--')}"
    rel, target = _escape(tmp_path, storage / "blobs")
    hub.hostile["README.md"] = Hostile(etag=f'"{rel}"')
    with pytest.raises(DatasetError, match="ETag") as info:
        sample_hub_dataset(DATA, split=None, config_name=None, rows=5, endpoint=hub.url, token=None)
    assert "\n" not in str(info.value) and not target.exists()
    # a missing file's 404 naming a path as its commit (huggingface_hub records the absence under that name)
    del hub.hostile["README.md"]
    no_exist_rel = os.path.relpath(target.parent, storage / ".no_exist")
    hub.hostile[".huggingface.yaml"] = Hostile(commit=no_exist_rel)
    with pytest.raises(DatasetError, match="X-Repo-Commit"):
        sample_hub_dataset(DATA, split=None, config_name=None, rows=5, endpoint=hub.url, token=None)
    assert not target.parent.exists()
    # the repository's commit (its info's sha) is a path: refused before anything is asked with it
    del hub.hostile[".huggingface.yaml"]
    hub.repos[("dataset", DATA)].announced = "../" * 8 + "tmp"
    with pytest.raises(DatasetError, match="commit"):
        sample_hub_dataset(DATA, split=None, config_name=None, rows=5, endpoint=hub.url, token=None)


# --------------------------------------------------------------------------- permissions


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_hub_written_files_follow_the_umask(hub, tmp_path: Path, umask: int) -> None:
    from autotune.probe.hub_sample import sample_hub_dataset

    old = os.umask(umask)
    try:
        file, _ = sample_hub_dataset(DATA, split=None, config_name=None, rows=5, endpoint=hub.url, token=None)
        resolve_model(MODEL, hub=HubAccess.from_env(), tokenizer=True)
    finally:
        os.umask(old)
    want = oct(0o666 & ~umask)
    written = [file, file.with_suffix(".json"), *(_blobs(tmp_path).iterdir()),
               _blobs(tmp_path).parent / "refs" / "main"]
    modes = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in written}
    assert set(modes.values()) == {want}, modes
    assert json.loads(file.with_suffix(".json").read_text())["rows"] == 5
