"""Commands autotune suggests for pasting into a shell quote every path and value: a folder or model named
with ``$(...)`` or backticks is data when the line is pasted, never a command."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.spec.shell import command_line, py_str, python_c

HOSTILE = "d $(touch PWNED1) `touch PWNED2` \"q\" 'a' \\b"


def _pasted(line: str, cwd: Path, *commands: str) -> list[list[str]]:
    """Run ``line`` with bash in ``cwd`` as a user pasting it would, each of ``commands`` replaced by a shell
    function that records its arguments; the argument lists it was called with."""
    record = cwd / f"argv-{len(list(cwd.glob('argv-*')))}.jsonl"
    fns = "".join(
        f'{c}() {{ "{sys.executable}" -c "import json, sys; print(json.dumps(sys.argv[1:]))" "$@" >> {shlex.quote(str(record))}; }}; '
        for c in commands)
    subprocess.run(["bash", "-c", fns + line], cwd=cwd, check=True, timeout=30)
    return [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []


def _no_pwned(cwd: Path) -> None:
    assert not list(cwd.glob("PWNED*")), "the pasted line ran a command held in a name"


def test_quoting_helpers_round_trip_any_value() -> None:
    for value in (HOSTILE, "plain/path", "é ü", "line\nbreak", "tab\there", ""):
        assert shlex.split(command_line("hf", "download", value)) == ["hf", "download", value]
        assert eval(py_str(value)) == value  # a Python literal of exactly the value
    assert py_str("/data/chat") == '"/data/chat"'
    assert shlex.split(python_c('print("x")')) == ["python", "-c", 'print("x")']


_DATASETS_STAND_IN = """
import json


class _Data:
    def __init__(self, path, split=None):
        self.path, self.split = path, split

    def __getitem__(self, split):
        return _Data(self.path, split)

    def to_json(self, out):
        with open("calls.json", "w") as fh:
            json.dump([self.path, self.split, out], fh)


def load_from_disk(path):
    return _Data(path)
"""


def test_the_llamafactory_export_line_of_a_hostile_folder_name_runs_nothing_and_exports_it(tmp_path: Path) -> None:
    from autotune.formats.llamafactory import dataset_note

    folder = str(tmp_path / HOSTILE)
    note = dataset_note(folder, split="train", column="text")
    line = re.search(r"cannot be registered\): (.*); then write dataset_info\.json", note).group(1)
    assert len(shlex.split(line)) == 3 and shlex.split(line)[:2] == ["python", "-c"]
    (argv,) = _pasted(line, tmp_path, "python")
    assert argv[0] == "-c" and py_str(folder) in argv[1]
    _no_pwned(tmp_path)
    # the program itself, run by python against a stand-in for the datasets library (python -c imports from
    # the working directory first): it loads the folder and writes the .jsonl named in dataset_info.json
    (tmp_path / "datasets.py").write_text(_DATASETS_STAND_IN)
    done = subprocess.run(["bash", "-c", f"python() {{ {shlex.quote(sys.executable)} \"$@\"; }}; {line}"],
                          cwd=tmp_path, timeout=60, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    _no_pwned(tmp_path)
    assert json.loads((tmp_path / "calls.json").read_text()) == [folder, "train", folder + ".jsonl"]
    assert json.dumps(folder + ".jsonl") in note  # the file dataset_info.json registers


def test_suggested_commands_in_messages_quote_the_users_values(tmp_path: Path) -> None:
    from autotune.errors import SpecError
    from autotune.run._preflight import check_cpu_probe_time
    from autotune.spec.dataset_ref import missing_hub_dataset_message
    from autotune.spec.probe_request import Workload

    model = str(tmp_path / HOSTILE)
    with pytest.raises(SpecError) as info:
        check_cpu_probe_time(1e6, workload=Workload(model=model, mode="lora", seq_len=128), effective_batch=8,
                             limit_s=60, limit_text="60 s", requested_device="auto", model_ref=model)
    line = re.search(r"with `(autotune plan .*)`, or pass --device cpu", str(info.value)).group(1)
    assert _pasted(line, tmp_path, "autotune") == [["plan", "--model", model, "--mode", "lora", "--seq-len", "128"]]
    _no_pwned(tmp_path)

    ref = "org/x$(touch PWNED3)"
    msg = missing_hub_dataset_message(ref, tmp_path / "cache")
    line = re.search(r"download it once with `(python -c .*)` \(set HF_DATASETS_CACHE", msg).group(1)
    (argv,) = _pasted(line, tmp_path, "python")
    assert argv == ["-c", f"import datasets; datasets.load_dataset({py_str(ref)})"]
    _no_pwned(tmp_path)
