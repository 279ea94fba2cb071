"""Hardening (issue 13): every failure is one line, a damaged run recovers, results are shared files,
reports escape what they show.

Each test here failed on the main branch before the fix it covers: the CLI's own error handler
crashed, ``--out``/``--storage`` mistakes were tracebacks that left a half-made run folder, a
damaged ``study.db`` or journal line stopped ``--resume``, results were written 0600, and
``report.md`` passed raw HTML through.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import cli, one_line
from _fakes import FakeExecutor

import autotune.run as run_pkg
from autotune.errors import SpecError, WriteError
from autotune.run._tune import tune
from autotune.store.run_dir import Journal

RUN = ["run", "--model", "tiny-llama", "--device", "cpu", "--gpu-budget", "3GB", "--seq-len", "64",
       "--effective-batch", "4", "--space", "cpu", "--max-trials", "2"]  # fmt: skip
ROOT = os.geteuid() == 0


def autotune(tmp: Path, *args: str, timeout: float = 120, fake: bool = False, stdin: str | None = None,
             process: bool = False) -> subprocess.CompletedProcess[str]:
    """The real CLI, in-process (``process``: in a real process; ``fake``: with the fake probe executor,
    tests/_fake_cli.py); ``stdin``: text fed to it."""
    return cli(tmp, *args, timeout=timeout, fake=fake, stdin=stdin, process=process)


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# ------------------------------------------------------------------------------ 1: the error handler


def test_an_unexpected_exception_is_one_line_with_exit_1_not_a_chained_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autotune.cli import app

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("something nobody planned for")

    monkeypatch.setattr(run_pkg, "tune", boom)
    monkeypatch.setattr(sys, "argv", ["autotune", *RUN])
    monkeypatch.setattr(app, "_DEBUG", False)
    monkeypatch.delenv("AUTOTUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        app.main()
    assert info.value.code == 1
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == ["autotune: error: unexpected RuntimeError: something nobody planned for; this is a bug in "
                     "autotune: rerun as `autotune --debug COMMAND ...` (or with AUTOTUNE_DEBUG=1) for the traceback and "
                     "report it"], err


def test_an_os_error_is_one_line_naming_the_file_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autotune.cli import app

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/data/results/x")

    monkeypatch.setattr(run_pkg, "tune", full)
    monkeypatch.setattr(sys, "argv", ["autotune", *RUN])
    monkeypatch.setattr(app, "_DEBUG", False)
    monkeypatch.delenv("AUTOTUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        app.main()
    assert info.value.code == 2
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert "No space left on device: /data/results/x" in line


def test_out_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("hi\n")
    one_line(autotune(tmp_path, *RUN, "--out", str(f)), f"--out {f} is a file", "give a folder")
    assert f.read_text() == "hi\n"


def test_out_under_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("hi\n")
    one_line(autotune(tmp_path, *RUN, "--out", str(f / "sub" / "dir")), f"lies under {f}, which is a file")


def test_out_that_cannot_be_created_is_refused_in_one_line(tmp_path: Path) -> None:
    # /proc refuses mkdir even to root
    one_line(autotune(tmp_path, *RUN, "--out", "/proc/autotune-results"), "/proc", "give a folder you can write to")


@pytest.mark.skipif(ROOT, reason="root writes into a read-only folder anyway")
def test_out_in_a_read_only_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        one_line(autotune(tmp_path, *RUN, "--out", str(ro / "results")), "not writable")
        assert tree(ro) == []
    finally:
        ro.chmod(0o700)


def test_a_read_only_results_folder_serves_its_stored_answer_and_refuses_a_search(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared read-only mount of pre-flight answers (CI runners): a stored answer is served, nothing written; a
    request it does not hold is refused in one line before anything is written. (The process runs as root here, so
    the mount is stood in for by os.access, which a read-only mount answers for root too.)"""
    out = tmp_path / "shared"
    first = tune("tiny-llama", executor=FakeExecutor(), out=out, **KW)  # type: ignore[arg-type]
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: (not str(p).startswith(str(out))
                                                                or not mode & os.W_OK) and real(p, mode, *a, **k))
    again = tune("tiny-llama", executor=FakeExecutor(), out=out, **KW)  # type: ignore[arg-type]
    assert again.from_cache and again.run_dir == first.run_dir
    with pytest.raises(SpecError, match=r"--out .* is not writable \(a read-only mount, or not this user's\)"):
        tune("tiny-llama", executor=FakeExecutor(), out=out, **{**KW, "seq_len": 256})  # type: ignore[arg-type]
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_a_stored_tuned_copy_is_not_written_again_when_it_holds_the_same_text(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A --from request served from a read-only results folder said it answered, then failed writing the tuned
    copy and its diff, which the stored run already held word for word."""
    import autotune.store.atomic as atomic

    f = tmp_path / "lf.yaml"
    f.write_text("a: 1\n")

    def refuse(*a, **k):  # type: ignore[no-untyped-def]
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(atomic, "write_text_atomic", refuse)
    atomic.write_text_if_changed(f, "a: 1\n")  # the same text: nothing written
    with pytest.raises(OSError, match="Read-only"):
        atomic.write_text_if_changed(f, "a: 2\n")


@pytest.mark.parametrize(
    ("url", "needles"),
    [
        ("notaurl", ["not a database URL"]),
        ("foo://x/y", ["unknown database scheme 'foo'"]),
        ("sqlite:////proc/autotune/study.db", ["/proc/autotune", "does not exist"]),
        ("", ["--storage is empty"]),
    ],
)
def test_a_storage_that_cannot_work_is_refused_before_anything_is_written(
    tmp_path: Path, url: str, needles: list[str]
) -> None:
    out = tmp_path / "out"
    one_line(autotune(tmp_path, *RUN, "--out", str(out), "--storage", url), *needles)
    assert tree(out) == []


def test_a_storage_that_cannot_be_opened_leaves_no_run_folder(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(os.urandom(8192))
    out = tmp_path / "out"
    with pytest.raises(SpecError, match=r"could not open the Optuna storage .*garbage\.db"):
        tune("tiny-llama", gpu_budget="10GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu",
             max_trials=2, out=out, executor=FakeExecutor(), storage=f"sqlite:///{garbage}")
    assert tree(out) == []


# ------------------------------------------------------------------------------ 6: misleading verdicts


def test_resume_with_nothing_to_resume_says_so_and_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "out"
    one_line(autotune(tmp_path, *RUN, "--out", str(out), "--resume", fake=True),
             "--resume: no unfinished run of this request", str(out), "drop --resume")
    assert tree(out) == []


def test_an_empty_out_is_refused(tmp_path: Path) -> None:
    one_line(autotune(tmp_path, *RUN, "--out", ""), "--out is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ 4: a damaged run recovers

KW = dict(gpu_budget="10GiB", seq_len=512, effective_batch=16, space="cpu", device="cpu", max_trials=6, top_k=1)


class Interrupted(FakeExecutor):
    """Stops the run (as Ctrl-C would) once ``after`` probes were asked for."""

    def __init__(self, after: int = 4) -> None:
        super().__init__()
        self.after = after

    def poll(self, timeout=None):  # type: ignore[no-untyped-def]
        if len(self.requests) > self.after:
            raise KeyboardInterrupt
        return super().poll(timeout)


def interrupted_run(out: Path) -> Path:
    with pytest.raises(KeyboardInterrupt):
        tune("tiny-llama", executor=Interrupted(), out=out, **KW)  # type: ignore[arg-type]
    (rd,) = [p for p in out.iterdir() if p.is_dir()]
    assert (rd / "study.db").exists() and not (rd / "summary.json").exists()
    return rd


def resume(out: Path, notes: list[str]) -> tuple[object, FakeExecutor]:
    ex = FakeExecutor()

    def progress(event: str, data: dict) -> None:
        if event == "note":
            notes.append(data["text"])

    result = tune("tiny-llama", executor=ex, out=out, resume=True, progress=progress, **KW)  # type: ignore[arg-type]
    return result, ex


def finished_keys(rd: Path) -> set[str]:
    return {r.key for r in Journal(rd / "journal.jsonl").load() if r.phase == "search" and r.result is not None}


@pytest.mark.parametrize("damage", ["overwrite the first 4 KB", "truncate to 1000 bytes", "truncate to 0 bytes"])
def test_a_damaged_study_db_is_rebuilt_from_the_journal_on_resume(tmp_path: Path, damage: str) -> None:
    rd = interrupted_run(tmp_path)
    done = finished_keys(rd)
    db = rd / "study.db"
    data = db.read_bytes()
    if damage.startswith("overwrite"):
        db.write_bytes(os.urandom(4096) + data[4096:])
    else:
        db.write_bytes(data[: int(damage.split()[2])])
    notes: list[str] = []
    result, ex = resume(tmp_path, notes)
    assert result.summary["status"] == "complete" and result.run_dir == rd  # type: ignore[attr-defined]
    from autotune.search import candidate_id

    assert not {candidate_id(r.candidate) for r in ex.requests if r.settings.steps == 5} & done  # nothing re-run
    assert result.summary["counts"]["probed"] == 6  # type: ignore[attr-defined]
    if damage != "truncate to 0 bytes":  # an empty file is a new, sound database: nothing to recover
        recovered = [n for n in notes if n.startswith("recovered: study.db was damaged")]
        assert len(recovered) == 1 and "moved to study.db.damaged" in recovered[0], notes
        assert (rd / "study.db.damaged").exists()


def test_unreadable_journal_lines_are_skipped_and_reported(tmp_path: Path) -> None:
    rd = interrupted_run(tmp_path)
    journal = rd / "journal.jsonl"
    lines = journal.read_bytes().splitlines()
    damaged = [lines[0], b"[1,2,3]", lines[1], b'{"key": "x", "status": "ok", "candidate": 5}', b"\xff\xfe{",
               *lines[2:]]
    journal.write_bytes(b"\n".join(damaged) + b"\n")
    records, bad = Journal(journal).load_checked()
    assert bad == [2, 4, 5] and len(records) == len(lines)
    notes: list[str] = []
    result, _ = resume(tmp_path, notes)
    assert result.summary["status"] == "complete"  # type: ignore[attr-defined]
    (note,) = [n for n in notes if n.startswith("journal:")]
    assert note.startswith("journal: skipped 3 unreadable line(s) (2, 4, 5);"), note


def _disk_full(*_a: object, **_k: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["bare", "as optuna wraps it"])
def test_disk_full_in_the_study_is_a_clear_error_and_the_run_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      where: str) -> None:
    """SQLite's "database or disk is full", raised by the storage call itself (bare) or by the session's commit,
    which Optuna re-raises as its StorageInternalError (what a full disk does for real: it was exit 1, a bug)."""
    import sqlalchemy.exc
    import sqlalchemy.orm
    from optuna.storages import RDBStorage

    calls = {"n": 0}
    owner, name = (RDBStorage, "set_trial_state_values") if where == "bare" else (sqlalchemy.orm.Session, "commit")
    real = getattr(owner, name)
    after = 3 if where == "bare" else 12

    def full_after(self, *a, **k):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] > after:
            raise sqlalchemy.exc.OperationalError("UPDATE trials", {}, Exception("database or disk is full"))
        return real(self, *a, **k)

    monkeypatch.setattr(owner, name, full_after)
    with pytest.raises(WriteError, match=r"the Optuna study could not be written \(database or disk is full\); "
                                         r"the run folder .* is left resumable: free space, then rerun the same "
                                         r"command with --resume"):
        tune("tiny-llama", executor=FakeExecutor(), out=tmp_path, **KW)  # type: ignore[arg-type]
    monkeypatch.undo()
    (rd,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert not (rd / "summary.json").exists()
    result, _ = resume(tmp_path, [])
    assert result.summary["status"] == "complete" and result.run_dir == rd  # type: ignore[attr-defined]


def test_disk_full_writing_the_summary_is_a_clear_error_and_the_run_resumes(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    real = tempfile.mkstemp

    def full_for_summary(*a, prefix="", **k):  # type: ignore[no-untyped-def]
        if prefix.startswith(".summary.json"):
            _disk_full()
        return real(*a, prefix=prefix, **k)

    monkeypatch.setattr(tempfile, "mkstemp", full_for_summary)
    with pytest.raises(WriteError, match=r"could not write .*summary\.json: No space left on device \(errno 28\); "
                                         r"the run folder .* is left resumable"):
        tune("tiny-llama", executor=FakeExecutor(), out=tmp_path, **KW)  # type: ignore[arg-type]
    monkeypatch.undo()
    (rd,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert not (rd / "summary.json").exists()
    ex = FakeExecutor()
    result = tune("tiny-llama", executor=ex, out=tmp_path, resume=True, **KW)  # type: ignore[arg-type]
    assert result.summary["status"] == "complete" and result.run_dir == rd
    assert json.loads((rd / "summary.json").read_text())["status"] == "complete"


def test_a_report_that_cannot_be_written_does_not_fail_a_complete_run(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.report.build as build

    monkeypatch.setattr(build, "write_reports", _disk_full)
    notes: list[str] = []
    result = tune("tiny-llama", executor=FakeExecutor(), out=tmp_path,
                  progress=lambda e, d: notes.append(d["text"]) if e == "note" else None, **KW)  # type: ignore[arg-type]
    assert result.summary["status"] == "complete"
    assert any("could not write the report" in n for n in notes), notes
    assert json.loads((result.run_dir / "summary.json").read_text())["status"] == "complete"


# ------------------------------------------------------------------------------ 7: results honour the umask


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_results_are_written_with_the_umasks_permissions_not_0600(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        result = tune("tiny-llama", executor=FakeExecutor(), out=tmp_path, **KW)  # type: ignore[arg-type]
    finally:
        os.umask(old)
    files = [p for p in result.run_dir.rglob("*") if p.is_file() and p.name != ".lock"]
    names = {str(p.relative_to(result.run_dir)) for p in files}
    assert {"summary.json", "run.json", "trials.csv", "best_result.json", "report.md",
            "best/training_args.json"} <= names, names
    scripts = ("train.py", "train_sft.py")  # made executable on purpose by the emitter, as the umask allows
    modes = {str(p.relative_to(result.run_dir)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files
             if p.name not in scripts}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes
    exe = {oct(stat.S_IMODE(p.stat().st_mode)) for p in files if p.name in scripts}
    assert exe == {oct(0o777 & ~umask)}, exe


def test_an_atomic_rewrite_keeps_the_files_permissions(tmp_path: Path) -> None:
    from autotune.store.atomic import write_text_atomic

    f = tmp_path / "shared.json"
    f.write_text("{}")
    f.chmod(0o664)
    write_text_atomic(f, "[]")
    assert stat.S_IMODE(f.stat().st_mode) == 0o664 and f.read_text() == "[]"


# ------------------------------------------------------------------------------ 8: report.md escapes run data


def test_report_md_escapes_html_from_run_data(tmp_path: Path) -> None:
    from autotune.cli.report import command as _  # noqa: F401 - the report command is importable
    from autotune.report.build import write_reports

    result = tune("tiny-llama", executor=FakeExecutor(), out=tmp_path, **KW)  # type: ignore[arg-type]
    rd = result.run_dir
    summary = json.loads((rd / "summary.json").read_text())
    evil = "<script>alert(1)</script>"
    summary["model"] = evil
    summary["run_id"] = f"run {evil}"
    summary["probes_by_origin"] = {"<img src=x onerror=alert(2)>": 3}
    (rd / "summary.json").write_text(json.dumps(summary))
    lines = (rd / "journal.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    if rec.get("result"):
        rec["result"]["reason"] = f"<iframe src=//evil>|{evil}"
        rec["reason"] = rec["result"]["reason"]
    lines[0] = json.dumps(rec)
    (rd / "journal.jsonl").write_text("\n".join(lines) + "\n")
    write_reports(rd)
    md = (rd / "report.md").read_text()
    for raw in ("<script", "<img", "<iframe"):
        assert raw not in md, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md


def test_an_absurd_effective_batch_is_refused_up_front(tmp_path: Path) -> None:
    t0 = __import__("time").monotonic()
    one_line(autotune(tmp_path, *RUN, "--effective-batch", "1000000000", "--out", str(tmp_path / "out")),
             "effective batch 1,000,000,000 is more than the 65,536 sequences")
    assert __import__("time").monotonic() - t0 < 60
    assert tree(tmp_path / "out") == []


# ------------------------------------------------------- round 3: nothing from an input folder runs untrusted

TINY_CHAT = Path(__file__).resolve().parents[1] / "autotune" / "models" / "tokenizers" / "tiny-chat"
PROBE = ["probe", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--micro-batch", "2"]


def poisoned_tokenizer(tmp: Path, where: str = "tokenizer_config.json") -> tuple[Path, Path]:
    """A tokenizer folder whose ``auto_map`` names its own ``evil.py`` (which leaves a marker when run)."""
    import shutil

    folder = tmp / "evil-tok"
    shutil.copytree(TINY_CHAT, folder)
    marker = tmp / "MARKER"
    cfg_file = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.pop("tokenizer_class", None)
    amap = {"AutoTokenizer": [None, "evil.EvilTok"]}
    if where == "tokenizer_config.json":
        cfg["auto_map"] = amap
    else:
        (folder / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": amap}))
    cfg_file.write_text(json.dumps(cfg))
    (folder / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n\nclass EvilTok(PreTrainedTokenizerFast):\n    pass\n")
    (tmp / "t.jsonl").write_text('{"text": "hello world"}\n' * 4)
    return folder, marker


@pytest.mark.parametrize("where", ["tokenizer_config.json", "config.json"])
def test_a_tokenizer_with_its_own_code_is_refused_without_trust_remote_code_by_probe(tmp_path: Path,
                                                                                    where: str) -> None:
    folder, marker = poisoned_tokenizer(tmp_path, where)
    p = autotune(tmp_path, *PROBE, "--tokenizer", str(folder), "--dataset", "t.jsonl", stdin="y\n")
    one_line(p, "ships its own code", "auto_map", "evil.EvilTok", "--trust-remote-code")
    assert not marker.exists()
    assert "[y/N]" not in p.stdout + p.stderr


def test_a_tokenizer_with_its_own_code_is_refused_by_run_before_the_search_and_json_stays_clean(
        tmp_path: Path) -> None:
    folder, marker = poisoned_tokenizer(tmp_path)
    p = autotune(tmp_path, *RUN, "--tokenizer", str(folder), "--dataset", "t.jsonl", "--json",
                 "--out", str(tmp_path / "out"), fake=True, stdin="y\n")
    one_line(p, "ships its own code", "--trust-remote-code")
    assert p.stdout == "" and not marker.exists()


def test_every_tokenizer_load_passes_trust_remote_code_explicitly(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """Left unset, transformers prompts on stdin; passed, it refuses (False) or runs (True) without asking."""
    import transformers

    from autotune.probe.tokenize_cache import load_tokenizer

    seen: list[dict[str, object]] = []

    def spy(path: str, **kw: object) -> object:
        seen.append(kw)
        return object()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    load_tokenizer(str(TINY_CHAT))
    load_tokenizer("org/not-a-folder")
    folder, marker = poisoned_tokenizer(tmp_path)
    load_tokenizer(str(folder), trust_remote_code=True)  # the user's explicit choice
    assert [kw.get("trust_remote_code") for kw in seen] == [False, False, True]
    with pytest.raises(SpecError, match="ships its own code"):
        load_tokenizer(str(folder))
    assert len(seen) == 3 and not marker.exists()


def test_a_cached_tokenization_of_an_untrusted_tokenizer_is_not_served(tmp_path: Path) -> None:
    """A cache entry made with --trust-remote-code does not let a later run without it skip the rule."""
    from autotune.probe.tokenize_cache import load_token_sequences

    folder, _ = poisoned_tokenizer(tmp_path)
    cfg_file = folder / "tokenizer_config.json"
    clean = json.loads(cfg_file.read_text())
    amap = clean.pop("auto_map")
    cfg_file.write_text(json.dumps({**clean, "tokenizer_class": "PreTrainedTokenizerFast"}))
    first = load_token_sequences(tmp_path / "t.jsonl", seq_len=16, tokenizer=str(folder), cache_dir=tmp_path / "c")
    assert not first.cache_hit
    # the poisoned folder's files make another cache key: forge a hit by copying the entry there
    import shutil

    from autotune.probe import tokenize_cache as tc

    cfg_file.write_text(json.dumps({**clean, "auto_map": amap}))
    key = tc._cache_file(tmp_path / "c", tmp_path / "t.jsonl", str(folder), 16)
    shutil.copy(first.cache_file, key)
    with pytest.raises(SpecError, match="ships its own code"):
        load_token_sequences(tmp_path / "t.jsonl", seq_len=16, tokenizer=str(folder), cache_dir=tmp_path / "c")


# ------------------------------------------------- round 3: --from and --write-back, the user's own files

AXOLOTL = ("base_model: tiny-llama\nmicro_batch_size: 2\ngradient_accumulation_steps: 2\nsequence_len: 64\n"
           "learning_rate: 0.0002  # kept\n")
FROM_RUN = ["run", "--device", "cpu", "--gpu-budget", "24GB", "--space", "cpu", "--max-trials", "2"]


def from_run(tmp: Path, src: str, *extra: str, probe_log: Path | None = None, **kw: object
             ) -> subprocess.CompletedProcess[str]:
    """The fake-probe CLI's ``run --from src``; ``probe_log`` lists every probe that started."""
    log = probe_log or tmp / "probes.log"
    os.environ["FAKE_PROBE_LOG"] = str(log)
    try:
        return autotune(tmp, *FROM_RUN, "--from", src, "--out", str(tmp / "out"), *extra, fake=True, **kw)  # type: ignore[arg-type]
    finally:
        os.environ.pop("FAKE_PROBE_LOG", None)


def no_search(tmp: Path) -> None:
    """The refusal came before the search: no probe started, no run folder."""
    assert not (tmp / "probes.log").exists() or (tmp / "probes.log").read_text() == ""
    assert tree(tmp / "out") == []


@pytest.mark.parametrize("kind", ["symlink", "dangling", "fifo", "read-only", "folder", "device"])
def test_write_back_onto_a_link_device_fifo_folder_or_read_only_file_is_refused_before_the_search(
        tmp_path: Path, kind: str) -> None:
    (tmp_path / "ax.yaml").write_text(AXOLOTL)
    target = tmp_path / "target.yaml"
    needle = {"symlink": "symbolic link", "dangling": "symbolic link", "fifo": "not a regular file",
              "read-only": "read-only", "folder": "is a folder", "device": "not a regular file"}[kind]
    if kind == "symlink":
        (tmp_path / "real.yaml").write_text(AXOLOTL)
        target.symlink_to(tmp_path / "real.yaml")
    elif kind == "dangling":
        target.symlink_to("/proc/self/fd/1")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "read-only":
        target.write_text(AXOLOTL)
        target.chmod(0o444)
    elif kind == "folder":
        target.mkdir()
    else:
        if not ROOT:
            pytest.skip("making a device node needs root")
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # /dev/full
    before = os.lstat(target)
    one_line(from_run(tmp_path, "ax.yaml", "--write-back", str(target)), "--write-back", needle)
    no_search(tmp_path)
    after = os.lstat(target)
    assert (stat.S_IFMT(after.st_mode), after.st_ino) == (stat.S_IFMT(before.st_mode), before.st_ino)
    if kind == "read-only":
        assert target.read_text() == AXOLOTL


def test_write_atomic_never_replaces_a_link_or_a_device(tmp_path: Path) -> None:
    from autotune.store.atomic import write_text_atomic

    (tmp_path / "real").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")
    for name in ("link", "fifo"):
        with pytest.raises(WriteError, match="does not replace"):
            write_text_atomic(tmp_path / name, "tuned")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real").read_text() == "mine"
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)


def test_a_write_back_target_edited_during_the_search_is_not_overwritten(tmp_path: Path) -> None:
    import threading
    import time

    live = tmp_path / "live.yaml"
    live.write_text(AXOLOTL)
    log = tmp_path / "probes.log"
    edited = AXOLOTL + "warmup_steps: 10  # the user's edit during the search\n"

    def edit() -> None:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and not (log.exists() and log.read_text()):
            time.sleep(0.05)
        live.write_text(edited)

    t = threading.Thread(target=edit)
    t.start()
    os.environ["FAKE_PROBE_S"] = "0.5"
    try:
        p = from_run(tmp_path, "live.yaml", "--write-back", "live.yaml", "--json", probe_log=log)
    finally:
        os.environ.pop("FAKE_PROBE_S", None)
        t.join()
    assert p.returncode == 2 and p.stdout == "", p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("autotune: error: --write-back 'live.yaml' changed during the search"), line
    assert "live.tuned.yaml" in line and "Traceback" not in p.stderr
    assert live.read_text() == edited
    tuned = (tmp_path / "live.tuned.yaml").read_text()
    assert "learning_rate: 0.0002  # kept" in tuned and "warmup_steps" not in tuned


def test_write_back_in_place_still_works_when_nobody_edits(tmp_path: Path) -> None:
    live = tmp_path / "live.yaml"
    live.write_text(AXOLOTL)
    p = from_run(tmp_path, "live.yaml", "--write-back", "live.yaml", "--json")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["write_back"]["path"] == "live.yaml" and live.read_text() != AXOLOTL
    assert "learning_rate: 0.0002  # kept" in live.read_text() and not (tmp_path / "live.tuned.yaml").exists()


def test_an_alias_bomb_as_from_is_refused_in_bounded_time(tmp_path: Path) -> None:
    import time

    lines = ["base_model: tiny-llama", "micro_batch_size: 2", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    t0 = time.monotonic()
    one_line(from_run(tmp_path, "bomb.yaml", "--write-back", "out.yaml"), "bomb.yaml", "aliases")
    assert time.monotonic() - t0 < 90
    no_search(tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_from_a_fifo_dev_zero_or_a_huge_file_is_refused_by_the_bounded_reader(tmp_path: Path, kind: str) -> None:
    src = {"fifo": str(tmp_path / "ff.yaml"), "dev-zero": "/dev/zero", "huge": str(tmp_path / "huge.yaml")}[kind]
    if kind == "fifo":
        os.mkfifo(src)
    elif kind == "huge":
        with open(src, "wb") as fh:
            fh.truncate(64 * 2**20)
    needle = "more than the" if kind == "huge" else "not a regular file"
    one_line(from_run(tmp_path, src, timeout=60), "--from", needle)
    no_search(tmp_path)


@pytest.mark.parametrize("text,needle", [
    ("{base_model: tiny-llama, micro_batch_size: 2, sequence_len: 64}\n", "flow mapping"),
    (AXOLOTL + "...\n", "document end marker"),
    ("mb: &mb 2\nbase_model: tiny-llama\nmicro_batch_size: *mb\nsequence_len: 64\n", "alias *mb"),
    ("base_model: tiny-llama\nmicro_batch_size: &mb 2\neval_batch_size: *mb\nsequence_len: 64\n", "anchor &mb"),
    ("base: &b {micro_batch_size: 2}\n<<: *b\nbase_model: tiny-llama\nsequence_len: 64\n", "merge key"),
    (AXOLOTL + "micro_batch_size: 2\n", "'micro_batch_size' appears twice"),
])
def test_yaml_that_write_back_cannot_edit_is_refused_before_the_search(tmp_path: Path, text: str,
                                                                       needle: str) -> None:
    (tmp_path / "ax.yaml").write_text(text)
    one_line(from_run(tmp_path, "ax.yaml", "--json"), "cannot write the tuned keys back", needle,
             "before the search")
    no_search(tmp_path)
    assert (tmp_path / "ax.yaml").read_text() == text


def test_lora_targets_written_as_one_string_are_refused_naming_the_list_to_write() -> None:
    """A string was dropped without a word and the probes adapted the default targets (peft reads it as a regex)."""
    from autotune.formats._inputs import value_problems

    for fmt in ("axolotl", "trl"):
        (line,) = value_problems(fmt, {"lora_target_modules": "gate_proj"}, "f")
        assert "write a list, e.g. lora_target_modules: [gate_proj]" in line
        assert value_problems(fmt, {"lora_target_modules": "all-linear"}, "f") == []
        assert value_problems(fmt, {"lora_target_modules": ["gate_proj"]}, "f") == []


def test_lora_targets_from_a_file_that_match_nothing_are_blamed_on_the_file(tmp_path: Path) -> None:
    (tmp_path / "ax.yaml").write_text(AXOLOTL + "adapter: lora\nlora_r: 8\nlora_alpha: 16\n"
                                      "lora_target_modules: [qproj, vproj]\n")
    line = one_line(from_run(tmp_path, "ax.yaml", "--json"), "--from ax.yaml: its LoRA targets qproj,vproj match no linear layer")
    assert "--lora-targets" not in line
    no_search(tmp_path)


def test_json_that_sets_a_key_twice_is_refused_before_the_search(tmp_path: Path) -> None:
    """json.loads keeps the last value and the write-back edited one of the two (a stale value was left in front)."""
    text = ('{"output_dir": "o", "per_device_train_batch_size": 2, "per_device_train_batch_size": 4, '
            '"gradient_accumulation_steps": 4}\n')
    (tmp_path / "ta.json").write_text(text)
    one_line(from_run(tmp_path, "ta.json", "--json", "--model", "tiny-llama"), "cannot write the tuned keys back",
             "'per_device_train_batch_size' appears 2 times")
    no_search(tmp_path)
    assert (tmp_path / "ta.json").read_text() == text


@pytest.mark.parametrize("value", ['"two"', "2.5", "true", "-1", "[2]"])
def test_a_non_integer_axolotl_batch_is_refused_naming_the_key(tmp_path: Path, value: str) -> None:
    (tmp_path / "ax.yaml").write_text(AXOLOTL.replace("micro_batch_size: 2", f"micro_batch_size: {value}"))
    one_line(from_run(tmp_path, "ax.yaml"), "micro_batch_size must be an integer")
    no_search(tmp_path)


def test_from_values_are_type_checked_per_format() -> None:
    from autotune.formats._inputs import value_problems

    assert value_problems("axolotl", {"bf16": "auto", "gradient_checkpointing": "offload", "micro_batch_size": 2},
                          "f") == []
    assert value_problems("training_args", {"per_device_train_batch_size": "abc", "bf16": "yes"}, "f") == [
        "f: per_device_train_batch_size must be an integer >= 1, got 'abc'; write a whole number "
        "(e.g. per_device_train_batch_size: 2)", "f: bf16 must be true or false, got 'yes'"]
    assert value_problems("deepspeed", {"train_micro_batch_size_per_gpu": "auto"}, "f") == []
    assert value_problems("llamafactory", {"cutoff_len": 0}, "f")[0].startswith("f: cutoff_len must be")


def test_a_wrongly_typed_from_value_is_named_once(tmp_path: Path) -> None:
    """The type table and the value checks both judge the batch keys: one message per key, not two."""
    from autotune.run._request import read_source

    (tmp_path / "ta.yaml").write_text("output_dir: o\nper_device_train_batch_size: two\n")
    with pytest.raises(SpecError) as info:
        read_source(tmp_path / "ta.yaml", None, effective_batch_given=False)
    assert str(info.value).count("per_device_train_batch_size must be") == 1, str(info.value)


# ------------------------------------------------------ round 3: catalogs, stored studies, secrets, JSON

@pytest.mark.parametrize("field,value", [("price_per_hour_usd", ".nan"), ("bf16_tflops", ".inf"),
                                         ("fp16_tflops", ".nan"), ("fp32_tflops", "-.inf")])
def test_a_non_finite_catalog_number_is_refused_in_one_line(tmp_path: Path, field: str, value: str) -> None:
    entry = {"name": "X1", "memory": "32GB", "fp16_tflops": "125", "fp32_tflops": "15.7", "bf16": "true",
             "bf16_tflops": "125", "flash_attention_2": "false", "price_per_hour_usd": "0.5", field: value}
    (tmp_path / "cat.yaml").write_text("gpus:\n  - {" + ", ".join(f"{k}: {v}" for k, v in entry.items()) + "}\n")
    one_line(autotune(tmp_path, "plan", "--model", "tiny-llama", "--gpu", "X1", "--catalog", "cat.yaml", "--json"),
             field, "finite")


def test_json_output_never_holds_nan_or_infinity() -> None:
    from autotune.cli.render import dumps_json

    text = dumps_json({"a": float("nan"), "b": [float("inf"), 1.5], "c": (float("-inf"),)})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": [None]}
    assert "NaN" not in text and "Infinity" not in text


def test_dashboard_on_a_study_db_of_random_bytes_is_one_line_exit_2(tmp_path: Path) -> None:
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "study.db").write_bytes(os.urandom(8192))
    one_line(autotune(tmp_path, "dashboard", str(rd)), "not a readable Optuna study", "--resume")


def test_a_failing_storage_url_does_not_repeat_its_password(tmp_path: Path) -> None:
    line = one_line(autotune(tmp_path, *RUN, "--storage", "postgresql://alice:s3cr3t-pw@127.0.0.1:1/db",
                             "--out", str(tmp_path / "out"), fake=True), "storage")
    assert "s3cr3t-pw" not in line and "alice:***@" in line


def test_redact_hides_url_passwords_and_tokens() -> None:
    from autotune.spec.redact import redact

    assert redact("x 'mysql+pymysql://u:p%40ss@h:3306/d' y") == "x 'mysql+pymysql://u:***@h:3306/d' y"
    assert redact("redis://:secret@h/0") == "redis://:***@h/0"
    assert redact("token hf_abcdefghijklmnopqrstuvwxyz12 and ?password=pw&x=1") == "token *** and ?password=***&x=1"
    assert redact("sqlite:////tmp/a.db and http://host:8080/x") == "sqlite:////tmp/a.db and http://host:8080/x"


# ------------------------------------------------------------- round 3: probe validates as run does

TINY_LLAMA = Path(__file__).resolve().parents[1] / "autotune" / "models" / "tiny" / "tiny-llama" / "config.json"


@pytest.mark.parametrize("field,value", [("num_hidden_layers", -2), ("num_hidden_layers", 0), ("hidden_size", 0),
                                         ("hidden_size", "256"), ("hidden_size", 256.0), ("hidden_size", True)])
def test_probe_refuses_an_invalid_model_config_like_run(tmp_path: Path, field: str, value: object) -> None:
    cfg = json.loads(TINY_LLAMA.read_text())
    cfg[field] = value
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    args = ["probe", "--model", str(tmp_path / "m"), "--device", "cpu", "--seq-len", "64", "--micro-batch", "2"]
    one_line(autotune(tmp_path, *args), f"{field} must be a positive integer")


def test_probe_refuses_token_ids_outside_the_vocabulary(tmp_path: Path) -> None:
    vocab = json.loads(TINY_LLAMA.read_text())["vocab_size"]
    (tmp_path / "ids.jsonl").write_text(json.dumps({"input_ids": [1, 2, vocab + 5]}) + "\n")
    one_line(autotune(tmp_path, *PROBE, "--dataset", "ids.jsonl"), f"token id {vocab + 5}", "vocabulary")


# ------------------------------------------------------------------------ round 3: datasets

@pytest.mark.parametrize("line,needle", [
    ('{"messages": [{"role": "user", "content": null}]}', "line 1: 'messages' must be a non-empty list"),
    ('{"text": "ok"}\n{"text": "\\ud800"}', "line 2: 'text' holds an unpaired surrogate"),
    ('{"messages": [{"role": "user", "content": "hi \\udfff"}]}', "unpaired surrogate"),
    ('{"prompt": null, "completion": "x"}', "prompt is null"),
    ('{"text": null}', "'text' must be a string, got null"),
])
def test_dataset_rows_with_null_or_invalid_content_are_refused_with_the_row(tmp_path: Path, line: str,
                                                                            needle: str) -> None:
    from autotune.probe.readers import read_dataset

    (tmp_path / "d.jsonl").write_text(line + "\n")
    with pytest.raises(SpecError, match=re.escape(needle)):
        read_dataset(tmp_path / "d.jsonl")
    p = autotune(tmp_path, *PROBE, "--tokenizer", str(TINY_CHAT), "--dataset", "d.jsonl")
    one_line(p, needle)


def test_parquet_chat_and_prompt_completion_columns_are_accepted(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from autotune.probe.tokenize_cache import load_token_sequences

    msgs = [[{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]] * 3
    pq.write_table(pa.table({"messages": msgs}), tmp_path / "chat.parquet")
    pq.write_table(pa.table({"prompt": ["a b", "c"], "completion": [" d", " e f"]}), tmp_path / "pc.parquet")
    chat = load_token_sequences(tmp_path / "chat.parquet", seq_len=32, tokenizer=str(TINY_CHAT), use_cache=False)
    pc = load_token_sequences(tmp_path / "pc.parquet", seq_len=32, tokenizer=str(TINY_CHAT), use_cache=False)
    assert (chat.column, chat.num_records, pc.column, pc.num_records) == ("messages", 3, "prompt_completion", 2)
    pq.write_table(pa.table({"messages": [[{"role": "user", "content": None}]]}), tmp_path / "bad.parquet")
    with pytest.raises(SpecError, match="row 0: 'messages' must be"):
        load_token_sequences(tmp_path / "bad.parquet", seq_len=32, tokenizer=str(TINY_CHAT), use_cache=False)


def test_a_dataset_file_past_the_stated_bounds_is_refused_in_one_line(tmp_path: Path) -> None:
    from autotune.probe import readers

    big = tmp_path / "big.jsonl"
    with open(big, "wb") as fh:
        fh.truncate(readers.MAX_DATASET_BYTES + 1)  # sparse: no disk used
    one_line(autotune(tmp_path, *PROBE, "--dataset", "big.jsonl", timeout=60), "more than the", "sample")
    long_line = tmp_path / "long.jsonl"
    with open(long_line, "wb") as fh:
        fh.truncate(readers.MAX_LINE_BYTES + 10)  # one "line" of NUL bytes
    with pytest.raises(SpecError, match="line 1 is longer than"):
        readers.read_dataset(long_line)


# ----------------------------------------------------------- round 3: check validates types first

@pytest.mark.parametrize("name,text,needle", [
    ("ds.json", '{"zero_optimization": {"stage": 3, "offload_optimizer": "yes"}}',
     "zero_optimization.offload_optimizer must be a mapping"),
    ("ds.json", '{"zero_optimization": 3}', "zero_optimization must be a mapping"),
    ("ds.json", '{"zero_optimization": {"stage": 2}, "bf16": "on"}', "bf16 must be a mapping"),
    ("acc.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config: [1, 2]\n",
     "fsdp_config must be a mapping"),
    ("ta.json", '{"report_to": 5, "per_device_train_batch_size": 4}', "report_to must be a name"),
    ("ta.json", '{"per_device_train_batch_size": 4, "deepspeed": {"zero_optimization": "x"}}',
     "deepspeed.zero_optimization must be a mapping"),
])
def test_check_fails_a_wrong_type_naming_the_key_instead_of_crashing(tmp_path: Path, name: str, text: str,
                                                                     needle: str) -> None:
    (tmp_path / name).write_text(text)
    p = autotune(tmp_path, "check", name, "--json")
    assert p.returncode == 1 and "this is a bug" not in p.stderr, p.stderr
    fails = [i["message"] for i in json.loads(p.stdout)["items"] if i["status"] == "fail" and i["id"] == "types"]
    assert any(needle in m for m in fails), fails


@pytest.mark.parametrize("text,needles", [
    ('{"per_device_train_batch_size": "abc", "bf16": "yes"}',
     ["per_device_train_batch_size must be an integer >= 1, got 'abc'", "bf16 must be true or false, got 'yes'"]),
    ('{"per_device_train_batch_size": -4, "gradient_accumulation_steps": 0}',
     ["per_device_train_batch_size must be an integer >= 1, got -4", "gradient_accumulation_steps must be"]),
])
def test_check_never_passes_a_wrongly_typed_value(text: str, needles: list[str]) -> None:
    from autotune.check import ConfigBundle, gather

    rep = gather(ConfigBundle(target="t", data={"training_args": json.loads(text)}, sources={"training_args": "t"}))
    fails = [i.message for i in rep.items if i.status == "fail"]
    for needle in needles:
        assert any(needle in m for m in fails), fails
    passed = {i.id: i.message for i in rep.items if i.status == "pass"}
    assert "effective batch 0" not in " ".join(passed.values()), passed
    assert not any(i.id == "precision" and i.status == "pass" for i in rep.items)


def test_check_says_nothing_false_about_a_key_it_set_aside_for_its_type() -> None:
    """A key set aside for its type is named by its FAIL; no other item judges the file as if it were not stated
    ("seed not stated", "HF default 8 is used", a PASS on a micro-batch of 8 the file does not have)."""
    from autotune.check import ConfigBundle, gather

    ta = {"per_device_train_batch_size": 0, "gradient_accumulation_steps": 4, "seed": "42", "save_total_limit": -1,
          "dataloader_num_workers": "four", "bf16": True}
    rep = gather(ConfigBundle(target="t", data={"training_args": ta}, sources={"training_args": "t"}))
    assert len([i for i in rep.items if i.id == "types"]) == 4
    said = " | ".join(f"{i.id}: {i.message}" for i in rep.items if i.id != "types")
    for false in ("not stated", "HF default", "0 workers", "micro-batch 8", "save_total_limit unset"):
        assert false not in said, said
    assert "6 arguments" in said  # counted as the file states them


def test_run_from_with_a_wrongly_typed_inline_deepspeed_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "ta.json").write_text(json.dumps({"model_name_or_path": "tiny-llama", "per_device_train_batch_size": 2,
                                                  "deepspeed": {"zero_optimization": "x"}}))
    one_line(from_run(tmp_path, "ta.json"), "deepspeed.zero_optimization must be a mapping")
    no_search(tmp_path)


# ------------------------------------------------- round 3: stored answers and caches are checked

@pytest.mark.parametrize("edit", ["batch", "fp16-on-cpu", "nan-speed", "no-request"])
def test_an_edited_best_result_is_re_measured_not_served(tmp_path: Path, edit: str) -> None:
    first = autotune(tmp_path, *RUN, "--gpu-budget", "24GB", "--out", str(tmp_path / "out"), "--json", fake=True)
    assert first.returncode == 0, first.stderr
    (rd,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    best = json.loads((rd / "best_result.json").read_text())
    if edit == "batch":
        best["request"]["candidate"].update(micro_batch=3, grad_accum=5)
    elif edit == "fp16-on-cpu":
        best["request"]["candidate"]["precision"] = "fp16"
    elif edit == "nan-speed":
        best["metrics"]["tokens_per_s"] = float("nan")
    else:
        del best["request"]
    (rd / "best_result.json").write_text(json.dumps(best))
    again = autotune(tmp_path, *RUN, "--gpu-budget", "24GB", "--out", str(tmp_path / "out"), "--json", fake=True)
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["from_cache"] is False and summary["run_dir"] != str(rd)
    assert summary["best"]["effective_batch"]["value"] == 4
    assert "was not used: its best_result.json" in again.stderr


def test_the_unedited_stored_answer_is_still_served(tmp_path: Path) -> None:
    first = autotune(tmp_path, *RUN, "--gpu-budget", "24GB", "--out", str(tmp_path / "out"), "--json", fake=True)
    again = autotune(tmp_path, *RUN, "--gpu-budget", "24GB", "--out", str(tmp_path / "out"), "--json", fake=True)
    assert first.returncode == again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["from_cache"] is True


@pytest.mark.parametrize("tamper", ["long-sequence", "no-column", "offsets", "negative-id", "other-seq-len"])
def test_a_tampered_dataset_cache_entry_is_re_tokenized_not_served(tmp_path: Path, tamper: str) -> None:
    import numpy as np

    from autotune.probe.tokenize_cache import load_token_sequences

    data = tmp_path / "ids.jsonl"
    data.write_text("".join(json.dumps({"input_ids": list(range(1, 20 + i))}) + "\n" for i in range(5)))
    first = load_token_sequences(data, seq_len=64, cache_dir=tmp_path / "c")
    assert first.cache_file and not first.cache_hit
    with np.load(first.cache_file, allow_pickle=False) as z:
        tokens, offsets, meta = z["tokens"], z["offsets"], json.loads(str(z["meta"]))
    if tamper == "long-sequence":
        tokens, offsets = np.arange(6400, dtype=np.int32), np.array([0, 6400])
        meta.update(num_records=1, num_empty=0)
    elif tamper == "no-column":
        del meta["column"]
    elif tamper == "offsets":
        offsets = offsets[::-1].copy()
    elif tamper == "negative-id":
        tokens = tokens.copy()
        tokens[0] = -7
    else:
        meta["seq_len"] = 128
    np.savez(first.cache_file, tokens=tokens, offsets=offsets, meta=np.array(json.dumps(meta)))
    second = load_token_sequences(data, seq_len=64, cache_dir=tmp_path / "c")
    assert not second.cache_hit
    assert second.sequences.to_lists() == first.sequences.to_lists()
    assert load_token_sequences(data, seq_len=64, cache_dir=tmp_path / "c").cache_hit  # rewritten, sound


# --------------------------------------------- round 3: temporary folders go on every exit path

def test_a_probe_killed_at_its_timeout_leaves_no_temporary_folder(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker is killed (no cleanup of its own runs): the Trainer folder it made must go anyway."""
    import tempfile

    from autotune.executors.local import run_probe_process
    from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    made = tmp_path / "made"
    fake_python = tmp_path / "fake-python"
    fake_python.write_text(
        "#!/bin/sh\n"
        f"exec {sys.executable} -c \"import tempfile, time; d = tempfile.mkdtemp(prefix='autotune-trainer-'); "
        f"open('{made}', 'w').write(d); time.sleep(600)\"\n")
    fake_python.chmod(0o755)
    req = ProbeRequest(workload=Workload(model="tiny-llama", model_path=str(TINY_LLAMA.parent), seq_len=64),
                       candidate=Candidate(precision="fp32"), settings=ProbeSettings(device="cpu", timeout_s=4))
    res = run_probe_process(req, python=str(fake_python))
    assert res.status == "timeout" and made.exists()
    assert not Path(made.read_text()).exists()
    assert list(tmp.iterdir()) == []


def test_the_private_ray_pool_keeps_probe_folders_inside_its_own_folder() -> None:
    """A Ray worker killed with the driver runs no cleanup: its probes' folders are under the pool's
    folder, which the reaper removes on every exit path."""
    pytest.importorskip("ray")
    import ray

    from autotune.executors.ray_pool import _PrivateRuntime

    rt = _PrivateRuntime(ray)
    try:
        assert os.environ["AUTOTUNE_PROBE_TMPDIR"].startswith(rt.temp_dir + os.sep)
    finally:
        rt.release()
    assert "AUTOTUNE_PROBE_TMPDIR" not in os.environ and not os.path.exists(rt.temp_dir)


# --------------------------------- round 3: every file-reading entry point, hostile files, one line

def _hostile(tmp: Path, kind: str, suffix: str) -> str:
    path = tmp / f"hostile-{kind}{suffix}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero-link":
        path.symlink_to("/dev/zero")
    elif kind == "random":
        path.write_bytes(os.urandom(4096))
    elif kind == "truncated":
        path.write_text('{"a": [1, 2, {"b": ' if suffix == ".json" else "a:\n  - [1, 2\n")
    return str(path)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "random", "truncated"])
@pytest.mark.parametrize("entry", ["--from", "--dataset", "--catalog", "--space", "check"])
def test_every_file_entry_point_refuses_hostile_files_in_one_line(tmp_path: Path, entry: str, kind: str) -> None:
    import time

    suffix = {"--from": ".json", "--dataset": ".jsonl", "--catalog": ".yaml", "--space": ".yaml", "check": ".json"}
    src = _hostile(tmp_path, kind, suffix[entry])
    (tmp_path / "user-file").write_text("mine")
    if entry == "--from":
        args = [*FROM_RUN, "--from", src, "--out", str(tmp_path / "out")]
    elif entry == "--dataset":
        args = [*PROBE, "--dataset", src]
    elif entry == "--catalog":
        args = ["plan", "--model", "tiny-llama", "--gpu", "A100-80GB", "--catalog", src]
    elif entry == "--space":
        args = [*RUN, "--space", src, "--out", str(tmp_path / "out")]
    else:
        args = ["check", src]
    t0 = time.monotonic()
    p = autotune(tmp_path, *args, timeout=90, fake=entry in ("--from", "--space"))
    assert time.monotonic() - t0 < 90
    line = one_line(p)
    assert "this is a bug" not in line
    assert (tmp_path / "user-file").read_text() == "mine" and tree(tmp_path / "out") == []


def test_a_study_that_cannot_be_created_on_a_full_disk_is_one_short_line() -> None:
    """At study creation SQLite's error carried the whole CREATE TABLE statement, cut mid-word, and no fix."""
    from unittest import mock

    import optuna
    import sqlalchemy.exc

    from autotune.store.storage import open_storage

    err = sqlalchemy.exc.OperationalError("CREATE TABLE studies (\n id INTEGER)", {}, Exception("database or disk is full"))
    with mock.patch.object(optuna.storages, "RDBStorage", side_effect=err), pytest.raises(SpecError) as info:
        open_storage("sqlite:////tmp/autotune-none/study.db")
    assert str(info.value) == ("could not open the Optuna storage 'sqlite:////tmp/autotune-none/study.db': database or "
                               "disk is full; free space (or give a writable --out / --storage) and rerun")
