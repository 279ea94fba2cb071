"""The run directory: ``results/<run-id>/`` and everything written into it.

Layout::

    results/<model-short>-<YYYYmmdd-HHMMSS>-<hash8>/
        run.json        the request (model, space, budget, ...) and its cache key; written first
        journal.jsonl   append-only, one TrialRecord per line, flushed + fsynced per probe
        study.db        the Optuna study (sqlite:///...; --storage URL puts it elsewhere)
        trials.csv      every probe, inference and skip (rewritten atomically)
        summary.json    the answer; its ``status`` is ``complete`` or ``nothing_fits``
        best/           the emitted configs
        .lock           held (flock) by the process running the search, for as long as it runs

``<hash8>`` is the first 8 hex digits of the cache key, so a repeat request finds its earlier run
by name (``find_cached``) and an interrupted one finds the run to resume (``find_resumable``).
Every file except the journal is written atomically (temporary file + ``os.replace``).

One process at a time works in a run folder: it holds an exclusive ``flock`` on ``.lock`` for the
life of the search. The kernel releases it when the process exits, ``kill -9`` included, so a killed
run can be resumed at once, while a second ``--resume`` of a run that is still going is refused
instead of appending to the same journal and study.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import SpecError, WriteError
from autotune.spec.trial import TrialRecord
from autotune.store.atomic import write_error, write_json_atomic, write_text_atomic

RESUME_HINT = "the run folder {path} is left resumable: free space, then rerun the same command with --resume"

__all__ = [
    "RunDir",
    "RunLock",
    "Journal",
    "make_run_id",
    "find_cached",
    "find_resumable",
    "check_out_dir",
    "TRIALS_CSV_COLUMNS",
    "trials_csv_text",
]

TRIALS_CSV_COLUMNS = (
    "number",
    "phase",
    "origin",
    "status",
    "inferred",
    "tokens_per_s",
    "peak_mem_bytes",
    "step_time_spread",
    "wall_s",
    "micro_batch",
    "grad_accum",
    "world_size",
    "effective_batch",
    "grad_ckpt",
    "attn",
    "precision",
    "packing",
    "workers",
    "pin_memory",
    "optim",
    "torch_compile",
    "liger",
    "zero_stage",
    "offload",
    "sharding",
    "label",
    "reason",
    "key",
)


def _slug(text: str, limit: int = 32) -> str:
    last = text.rstrip("/").split("/")[-1]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", last).strip("-.").lower()
    return (slug or "model")[:limit]


def make_run_id(model: str, cache_key: str, *, now: float | None = None) -> str:
    """Readable, sortable, unique enough: ``llama-3.1-8b-20261130-142501-1a2b3c4d``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{_slug(model)}-{stamp}-{cache_key[:8]}"


class Journal:
    """Append-only JSONL of TrialRecords; each line flushed and fsynced as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, record: TrialRecord) -> None:
        line = (json.dumps(record.to_dict(), default=str) + "\n").encode("utf-8")
        try:
            with open(self.path, "ab+") as fh:
                # a line torn by a kill has no newline: start on a fresh line, or this record would be
                # glued to the torn one and lost with it on the next load
                if fh.seek(0, os.SEEK_END) > 0:
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        line = b"\n" + line
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:  # disk full: the lines before are intact, a torn one is skipped on resume
            raise WriteError(f"{write_error(self.path, exc).args[0].split('; ')[0]}; "
                             + RESUME_HINT.format(path=self.path.parent)) from exc

    def __call__(self, record: TrialRecord) -> None:
        self.append(record)

    def load(self) -> list[TrialRecord]:
        """Every readable record; a line cut short by a kill (or otherwise unreadable) is ignored."""
        return self.load_checked()[0]

    def load_checked(self) -> tuple[list[TrialRecord], list[int]]:
        """(every readable record, the 1-based numbers of the lines that could not be read).

        A line is unreadable when it is not UTF-8, not JSON, or not a record (``[1,2,3]``, a field
        of the wrong type): it is skipped, never fatal, so one damaged line costs one probe.
        """
        if not self.path.exists():
            return [], []
        out: list[TrialRecord] = []
        bad: list[int] = []
        for n, raw in enumerate(self.path.read_bytes().split(b"\n"), 1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw.decode("utf-8"))
                if not isinstance(data, dict):
                    raise TypeError(f"a {type(data).__name__}, not a record")
                record = TrialRecord.from_dict(data)
                _check_record(record)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                bad.append(n)
                continue
            out.append(record)
        return out, bad


def _check_record(r: TrialRecord) -> None:
    """TypeError unless every field of a loaded record has the type the search relies on."""
    num = (int, float)
    ok = (
        isinstance(r.key, str) and isinstance(r.status, str) and isinstance(r.phase, str)
        and isinstance(r.reason, str) and isinstance(r.label, str) and isinstance(r.origin, str)
        and isinstance(r.params, dict) and isinstance(r.inferred, bool)
        and isinstance(r.number, int) and isinstance(r.repeat, int)
        and (r.candidate is None or isinstance(r.candidate, dict))
        and (r.result is None or isinstance(r.result, dict))
        and all(v is None or (isinstance(v, num) and not isinstance(v, bool))
                for v in (r.tokens_per_s, r.peak_mem_bytes, r.step_time_spread, r.wall_s))
    )
    if not ok:
        raise TypeError("a field of the wrong type")
    if r.candidate is not None:
        cand = r.candidate_obj()  # unknown candidate fields raise TypeError here
        if cand is not None and cand.problems():
            raise TypeError("; ".join(cand.problems()))


def trials_csv_text(records: list[TrialRecord]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(TRIALS_CSV_COLUMNS), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in records:
        row: dict[str, Any] = {
            "number": r.number,
            "phase": r.phase,
            "origin": r.origin,
            "status": r.status,
            "inferred": r.inferred,
            "tokens_per_s": "" if r.tokens_per_s is None else f"{r.tokens_per_s:.2f}",
            "peak_mem_bytes": "" if r.peak_mem_bytes is None else r.peak_mem_bytes,
            "step_time_spread": "" if r.step_time_spread is None else f"{r.step_time_spread:.4f}",
            "wall_s": "" if r.wall_s is None else f"{r.wall_s:.2f}",
            "label": r.label,
            "reason": " ".join(str(r.reason).split()),
            "key": r.key,
        }
        c = r.candidate or {}
        row.update({k: v for k, v in c.items() if k in TRIALS_CSV_COLUMNS})
        if c:
            row["effective_batch"] = c["micro_batch"] * c["grad_accum"] * c["world_size"]
        else:  # skipped: only the Optuna params are known
            row.update({k: v for k, v in r.params.items() if k in TRIALS_CSV_COLUMNS})
        w.writerow(row)
    return buf.getvalue()


class RunLock:
    """An exclusive advisory lock on a run folder (``flock`` on ``<run>/.lock``); a context manager.

    ``RunLock.acquire(path)`` returns None when another process holds it. The holder's pid is written
    into the file for the refusal message.
    """

    def __init__(self, fd: int | None, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, run_path: Path) -> RunLock | None:
        path = Path(run_path) / ".lock"
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no locking, as before
            return cls(None, path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(fd, path)

    @staticmethod
    def holder(run_path: Path) -> str:
        """The pid written by the process that holds (or last held) the lock, or '?'."""
        try:
            return (Path(run_path) / ".lock").read_text(encoding="utf-8").strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass
class RunDir:
    """One run's folder and the files in it."""

    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def journal(self) -> Journal:
        return Journal(self.path / "journal.jsonl")

    @property
    def study_db(self) -> Path:
        return self.path / "study.db"

    def storage_url(self) -> str:
        return f"sqlite:///{self.study_db.resolve()}"

    @property
    def best_dir(self) -> Path:
        return self.path / "best"

    @classmethod
    def create(cls, out: str | os.PathLike[str], run_id: str) -> RunDir:
        base = Path(out)
        path = base / run_id
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError(f"--out {base}: cannot create the folder ({exc.strerror or exc}); "
                            "give a folder you can write to") from None
        n = 2
        while True:  # mkdir is the claim: two runs started in the same second get two folders
            try:
                path.mkdir()
                return cls(path)
            except FileExistsError:
                path = base / f"{run_id}-{n}"
                n += 1
            except OSError as exc:
                raise SpecError(f"--out {base}: cannot create a run folder in it ({exc.strerror or exc}); "
                                "give a folder you can write to") from None

    def try_lock(self) -> RunLock | None:
        """Claim this folder for the calling process; None when another process holds it."""
        return RunLock.acquire(self.path)

    def write_json(self, name: str, obj: Any) -> Path:
        try:
            return write_json_atomic(self.path / name, obj)
        except WriteError as exc:
            raise self._resumable(exc) from exc

    def _resumable(self, exc: WriteError) -> WriteError:
        return WriteError(f"{exc.args[0].split('; ')[0]}; {RESUME_HINT.format(path=self.path)}")

    def read_json(self, name: str) -> Any:
        p = self.path / name
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except ValueError:
            return None

    def write_trials_csv(self, records: list[TrialRecord]) -> Path:
        try:
            return write_text_atomic(self.path / "trials.csv", trials_csv_text(records))
        except WriteError as exc:
            raise self._resumable(exc) from exc


def check_out_dir(out: str | os.PathLike[str], *, writable: bool = True) -> None:
    """SpecError unless ``out`` is a folder autotune can create run folders in (or create itself).

    Refused, before anything is written: an empty path (it would mean the current folder), a path
    that is a file or lies under a file, and (``writable``) a folder (or the nearest existing parent of a
    missing one) this user cannot write into: a stored answer is served from a read-only folder, a search
    needs to write.
    """
    text = os.fspath(out)
    if not str(text).strip():
        raise SpecError("--out is empty; give the folder for run directories, e.g. --out results")
    path = Path(text)
    probe = path
    while not probe.exists():
        if probe.is_symlink():  # a dangling link: mkdir would fail on it
            raise SpecError(f"--out {text}: {probe} is a dangling symbolic link; give another folder")
        parent = probe.parent
        if parent == probe:
            break
        probe = parent
    if probe.exists() and not probe.is_dir():
        where = "is a file" if probe == path else f"lies under {probe}, which is a file"
        raise SpecError(f"--out {text} {where}, not a folder; give a folder for run directories")
    if writable and probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        which = "is" if probe == path else f"cannot be created: {probe}"
        raise SpecError(f"--out {text} {which} not writable (a read-only mount, or not this user's); give a folder "
                        "you can write to")


def _runs_with_key(out: Path, cache_key: str) -> Iterator[RunDir]:
    """Run folders whose run.json carries exactly ``cache_key``, newest first."""
    if not out.is_dir():
        return
    short = cache_key[:8]
    candidates = [p for p in out.iterdir() if p.is_dir() and re.search(rf"-{short}(-\d+)?$", p.name)]
    candidates.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for p in candidates:
        rd = RunDir(p)
        meta = rd.read_json("run.json")
        if isinstance(meta, dict) and meta.get("cache_key") == cache_key:
            yield rd


def stored_answer_problem(best: Any, *, effective_batch: int, device: str, seq_len: int,
                          usable_bytes: int | None = None) -> str | None:
    """Why a stored ``best_result.json`` cannot answer the request (edited, damaged, from another
    request), or None: it must be a measured ``ok`` probe of a valid request whose micro-batch x
    accumulation x GPUs is the requested effective batch, at the requested sequence length, in a
    precision this device runs, with finite positive tokens/s and a peak within the budget."""
    import math

    from autotune.spec.probe_request import ProbeRequest

    if not isinstance(best, dict) or best.get("status") != "ok":
        return "it is not a measured ok probe"
    try:
        req = ProbeRequest.from_dict(best["request"])
        req.validate()
    except Exception as exc:  # any field missing or of the wrong type
        return f"its request does not read back ({type(exc).__name__})"
    c = req.candidate
    eb = c.micro_batch * c.grad_accum * c.world_size
    if eb != effective_batch:
        return (f"its effective batch is {c.micro_batch} x {c.grad_accum} x {c.world_size} = {eb}, "
                f"not the {effective_batch} requested")
    if req.workload.seq_len != seq_len:
        return f"its sequence length is {req.workload.seq_len}, not {seq_len}"
    if device == "cpu" and c.precision not in ("fp32", "bf16"):
        return f"its precision {c.precision} does not run on a CPU"
    metrics = best.get("metrics")
    tps = metrics.get("tokens_per_s") if isinstance(metrics, dict) else None
    if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not math.isfinite(tps) or tps <= 0:
        return "it holds no finite positive tokens/s"
    peak = metrics.get("peak_mem_bytes") if isinstance(metrics, dict) else None
    if usable_bytes is not None and isinstance(peak, (int, float)) and not isinstance(peak, bool) and peak > usable_bytes:
        return "its peak memory is above the budget"
    return None


def find_cached(out: str | os.PathLike[str], cache_key: str,
                validate: Callable[[Any], str | None] | None = None,
                rejected: list[tuple[RunDir, str]] | None = None) -> RunDir | None:
    """The newest finished run (summary status ``complete``) answering the same request.

    ``validate(best_result) -> problem or None``: a stored answer failing it is skipped (and listed in
    ``rejected``), so it is re-measured, never served."""
    for rd in _runs_with_key(Path(out), cache_key):
        summary = rd.read_json("summary.json")
        if isinstance(summary, dict) and summary.get("status") == "complete" and (rd.path / "best_result.json").exists():
            if validate is not None:
                try:
                    best = rd.read_json("best_result.json")
                except Exception:  # unreadable: not an answer
                    best = None
                problem = validate(best)
                if problem is not None:
                    if rejected is not None:
                        rejected.append((rd, problem))
                    continue
            return rd
    return None


def find_cached_nothing_fits(out: str | os.PathLike[str], cache_key: str) -> tuple[RunDir, dict[str, Any]] | None:
    """The newest stored "nothing fits" answer to the same request, with its summary, when it rests on a
    measured oom/over_budget and no later run of the request completed; else None."""
    for rd in _runs_with_key(Path(out), cache_key):
        s = rd.read_json("summary.json")
        if isinstance(s, dict) and s.get("status") == "nothing_fits" and s.get("measured_infeasible"):
            return rd, s
        if isinstance(s, dict) and s.get("status") == "complete":
            return None
    return None


def find_resumable(out: str | os.PathLike[str], cache_key: str) -> RunDir | None:
    """The newest unfinished run (no summary.json) of the same request."""
    for rd in _runs_with_key(Path(out), cache_key):
        if not (rd.path / "summary.json").exists():
            return rd
    return None
