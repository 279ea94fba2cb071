"""Every file the user can hand autotune, fed hostile content (issue 13): random bytes, documents nested
thousands deep, YAML alias bombs ("billion laughs"), a FIFO, /dev/zero, giant numbers.

Each must end in exit 2 with exactly one stderr line naming the problem, in bounded time and memory,
and write nothing. The CLI runs in-process (``autotune.cli.app.main``) so hypothesis can try many
inputs; the memory bound is checked with tracemalloc, and the alias bomb once more in a real process
by its peak RSS.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

RUN = ["run", "--model", "tiny-llama", "--device", "cpu", "--gpu-budget", "3GB", "--seq-len", "64",
       "--effective-batch", "4", "--space", "cpu", "--max-trials", "2"]  # fmt: skip
MAX_S = 20.0  # per call, on a busy 2-core machine
MAX_PY_BYTES = 64 * 2**20  # Python allocations during one refused call


def _cli(args: list[str], cwd: Path) -> tuple[int, list[str], float, int]:
    """(exit code, stderr lines, seconds, peak bytes allocated) of ``autotune ARGS`` in-process."""
    from autotune.cli import app

    err = io.StringIO()
    old_argv, old_cwd = sys.argv, os.getcwd()
    sys.argv = ["autotune", *args]
    os.chdir(cwd)
    app._DEBUG = False
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
                pytest.raises(SystemExit) as info:
            app.main()
    finally:
        took = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        sys.argv = old_argv
        os.chdir(old_cwd)
    return int(info.value.code or 0), [ln for ln in err.getvalue().splitlines() if ln.strip()], took, peak


def _refused(args: list[str], cwd: Path, *needles: str) -> str:
    code, lines, took, peak = _cli(args, cwd)
    assert code == 2, (code, lines)
    assert len(lines) == 1 and lines[0].startswith("autotune: error: "), lines
    assert "Traceback" not in lines[0] and "bug in autotune" not in lines[0], lines[0]
    assert took < MAX_S, took
    assert peak < MAX_PY_BYTES, peak
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert not (cwd / "out").exists() or not any((cwd / "out").iterdir())
    return lines[0]


# ------------------------------------------------------------------------------ hostile documents

def _nested(depth: int, opener: str, closer: str, leaf: str = "1") -> str:
    return opener * depth + leaf + closer * depth


def _laughs(levels: int, width: int) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    lines.append(f"micro_batch: [{', '.join([f'*l{levels - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


# nesting from twice to twenty times Python's recursion limit (1,000): every parser in the path meets it
hostile = st.one_of(
    st.binary(min_size=1, max_size=4096).map(lambda b: b"\xff\xfe" + b),  # never UTF-8
    st.integers(min_value=2_000, max_value=20_000).map(lambda d: _nested(d, "[", "]").encode()),
    st.integers(min_value=2_000, max_value=20_000).map(lambda d: _nested(d, '{"a": ', "}").encode()),
    st.integers(min_value=2_000, max_value=20_000).map(lambda d: ("a:\n" + _nested(d, "- [", "]")).encode()),
    st.tuples(st.integers(min_value=6, max_value=12), st.integers(min_value=6, max_value=10)).map(
        lambda lw: _laughs(*lw).encode()),
)

# each file input: (how to build the argv from the file's path, what is written where)
INPUTS = {
    "space": lambda f: [*RUN, "--space", str(f), "--out", "out"],
    "dataset": lambda f: [*RUN, "--dataset", str(f), "--out", "out"],
    "catalog": lambda f: ["plan", "--model", "tiny-llama", "--catalog", str(f)],
    "check": lambda f: ["check", str(f)],
    "histogram": lambda f: [*RUN, "--lengths", f"histogram:{f}", "--out", "out"],
}
SUFFIX = {"space": ".yaml", "dataset": ".jsonl", "catalog": ".yaml", "check": ".yaml", "histogram": ".json"}


@pytest.mark.parametrize("kind", sorted(INPUTS))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=hostile)
def test_any_hostile_file_input_is_one_line_exit_2_bounded(kind: str, content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        f = cwd / f"input{SUFFIX[kind]}"
        f.write_bytes(content)
        if kind == "check" and content.lstrip().startswith((b"[", b"{")):
            f = f.rename(cwd / "input.json")
        if kind == "dataset" and not content.startswith(b"\xff"):
            # one JSON line per record: a deep document on one line
            f.write_bytes(content.replace(b"\n", b" ") + b"\n")
        _refused(INPUTS[kind](f), cwd)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=hostile, name=st.sampled_from(["summary.json", "journal.jsonl"]))
def test_a_hostile_run_folder_for_report_is_one_line_exit_2_bounded(content: bytes, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        rd = cwd / "run"
        rd.mkdir()
        (rd / name).write_bytes(content)
        line = _refused(["report", str(rd)], cwd)
        assert "run" in line


@pytest.mark.parametrize("kind", ["space", "catalog", "check", "histogram"])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "folder"])
def test_a_file_input_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path, kind: str,
                                                                              special: str) -> None:
    if special == "fifo":
        f = tmp_path / f"pipe{SUFFIX[kind]}"
        os.mkfifo(f)
    elif special == "folder":
        f = tmp_path / f"dir{SUFFIX[kind]}"
        f.mkdir()
    else:
        f = Path(special)
    code, lines, took, _ = _cli(INPUTS[kind](f), tmp_path)
    assert code == 2 and len(lines) == 1 and took < MAX_S, (code, lines, took)
    if kind == "check" and special == "folder":
        return  # a folder is a valid `check` input (a run's best/): it holds no config, said in one line
    assert "regular file" in lines[0] or "folder" in lines[0], lines[0]


def test_a_histogram_of_dev_zero_neither_hangs_nor_eats_memory(tmp_path: Path) -> None:
    line = _refused([*RUN, "--lengths", "histogram:/dev/zero", "--out", "out"], tmp_path)
    assert "not a regular file" in line


def test_a_token_id_that_overflows_is_refused_naming_the_line(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [1000000000000000000000000000000, 2]}\n')
    line = _refused([*RUN, "--dataset", str(data), "--out", "out"], tmp_path)
    assert "line 2" in line and "input_ids" in line


def _child_peak_kib(args: list[str], cwd: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in KiB) of one CLI process: its own rusage (wait4), not the largest
    of every child pytest has waited for."""
    err_path = cwd / "stderr.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "autotune", *args], stdout=subprocess.DEVNULL, stderr=err,
                                cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), err_path.read_text(), usage.ru_maxrss


def test_a_billion_laughs_space_is_refused_with_bounded_memory_in_a_real_process(tmp_path: Path) -> None:
    """539 bytes that used to take over 5 GB (the error message quoted the expanded value)."""
    bomb = tmp_path / "laughs.yaml"
    bomb.write_text(_laughs(9, 9))
    assert bomb.stat().st_size < 1000
    # the same CLI refusing a plain bad space: what the process holds anyway (imports), in this environment
    plain = tmp_path / "plain.yaml"
    plain.write_text("micro_batch: [abc]\n")
    _, _, base_kib = _child_peak_kib([*RUN, "--space", str(plain), "--out", str(tmp_path / "out")], tmp_path)
    t0 = time.monotonic()
    code, stderr, peak_kib = _child_peak_kib([*RUN, "--space", str(bomb), "--out", str(tmp_path / "out")], tmp_path)
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "aliases" in stderr and str(bomb) in stderr
    assert time.monotonic() - t0 < 60
    assert peak_kib < base_kib + 100 * 1024, f"peak RSS {peak_kib} KiB vs {base_kib} KiB refusing a plain bad space"


def test_error_messages_quote_bounded_values() -> None:
    from autotune.errors import SpecError
    from autotune.spec.space import parse_space

    shared: list = ["x"] * 10
    for _ in range(8):  # 10**9 leaves once expanded, a few hundred objects in memory
        shared = [shared] * 10
    with pytest.raises(SpecError) as info:
        parse_space({"micro_batch": shared})
    assert len(str(info.value)) < 1000


def test_json_with_a_number_python_cannot_convert_is_one_line() -> None:
    from autotune.errors import SpecError
    from autotune.spec.files import load_json

    with pytest.raises(SpecError, match="x.json"):
        load_json('{"a": ' + "9" * 5000 + "}", what="x.json")

