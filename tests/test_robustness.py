"""Bad input and untrusted input, through the real CLI entry point (in-process unless a process is the point).

Every bad request must: exit 2, print exactly one line on stderr that names the problem and the
fix, show no traceback (unless ``--debug``), and write nothing under ``--out``.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli import cli

from autotune.errors import SpecError
from autotune.executors.local import worker_env
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.space import load_space

REPO = Path(__file__).resolve().parent.parent
RUN = ["run", "--model", "tiny-llama", "--device", "cpu", "--gpu-budget", "3GB", "--seq-len", "64",
       "--effective-batch", "4", "--space", "cpu", "--max-trials", "2"]  # fmt: skip


def autotune(tmp: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real CLI, in-process (tests/_cli.py): its entry point, exit codes and one-line errors."""
    return cli(tmp, *args, timeout=timeout)


def assert_refused(tmp: Path, p: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, one stderr line containing every needle, no traceback, nothing under --out."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("autotune: error: "), lines[0]
    assert "Traceback" not in p.stderr
    for needle in needles:
        assert needle.lower() in lines[0].lower(), (needle, lines[0])
    out = tmp / "out"
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))
    return lines[0]


def run_refused(tmp: Path, *extra: str, base: list[str] = RUN) -> str:
    """``autotune run`` with ``extra`` appended (click: a later flag overrides an earlier one)."""
    return assert_refused(tmp, autotune(tmp, *base, *extra, "--out", str(tmp / "out")))


# ------------------------------------------------------------------------------ budgets


@pytest.mark.parametrize(
    ("budget", "needles"),
    [
        ("24XB", ["gpu budget", "unknown unit", "24GB", "24GiB", "80%"]),
        ("-1GB", ["gpu budget must be positive", "-1GB"]),
        ("0", ["gpu budget must be positive"]),
        ("lots", ["gpu budget", "not a size", "24GB"]),
        ("150%", ["percentage", "(0%, 100%]"]),
    ],
)
def test_bad_budget_strings(tmp_path: Path, budget: str, needles: list[str]) -> None:
    line = run_refused(tmp_path, "--gpu-budget", budget)
    for n in needles:
        assert n.lower() in line.lower(), line


def test_budget_below_the_weights_says_the_minimum_and_that_no_mode_fits(tmp_path: Path) -> None:
    # smollm2-360m: 362M parameters = 1.35 GiB in fp32 alone; LoRA's bf16 base weights 690 MiB
    line = run_refused(tmp_path, "--model", "smollm2-360m", "--gpu-budget", "500MB", "--seq-len", "256",
                       "--space", "default")
    assert "needs at least 1.35 GiB for its weights alone with --mode full" in line
    assert "no mode fits" in line and "a budget of at least 1.35 GiB" in line


def test_budget_below_the_weights_names_the_mode_that_would_fit(tmp_path: Path) -> None:
    line = run_refused(tmp_path, "--model", "smollm2-360m", "--gpu-budget", "1GB", "--seq-len", "256",
                       "--space", "lora")
    assert "weights alone" in line and "try --mode lora" in line


# ------------------------------------------------------------------------------ models


def test_unknown_model(tmp_path: Path) -> None:
    line = run_refused(tmp_path, "--model", "no-such-model-xyz")
    assert "unknown model 'no-such-model-xyz'" in line and "preset" in line


def test_malformed_config_json(tmp_path: Path) -> None:
    model = tmp_path / "broken-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    line = run_refused(tmp_path, "--model", str(model))
    assert "config.json: not valid JSON" in line


def test_config_with_a_non_integer_size_is_refused_and_the_repeat_too(tmp_path: Path) -> None:
    # issue 12: this used to give exit 3 ("nothing fits") and the repeat answered "[cached]"
    model = tmp_path / "bad-model"
    model.mkdir()
    cfg = json.loads((REPO / "autotune" / "models" / "tiny" / "tiny-llama" / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "hidden_size": "abc"}))
    for _ in range(2):
        line = run_refused(tmp_path, "--model", str(model), "--gpu-budget", "1GB")
        assert f"{model}/config.json" in line and "hidden_size must be a positive integer, got 'abc'" in line
        assert "[cached]" not in line


def test_config_without_model_type(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64}')
    assert "model_type" in run_refused(tmp_path, "--model", str(model))


def test_seq_len_above_the_models_maximum(tmp_path: Path) -> None:
    line = run_refused(tmp_path, "--seq-len", "99999")
    assert "at most 2048" in line and "seq_len=99999" in line


# ------------------------------------------------------------------------------ datasets


def test_text_dataset_without_a_tokenizer(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    line = run_refused(tmp_path, "--dataset", str(data))
    assert "no tokenizer" in line and "input_ids" in line


@pytest.mark.parametrize(("content", "needle"), [("", "empty"), ("\n\n  \n", "empty")])
def test_empty_dataset(tmp_path: Path, content: str, needle: str) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(content)
    assert needle in run_refused(tmp_path, "--dataset", str(data))


def test_malformed_dataset_line(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5\n')
    line = run_refused(tmp_path, "--dataset", str(data))
    assert "line 2 is not valid JSON" in line


def test_dataset_with_token_ids_outside_the_vocabulary(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5000]}\n')
    for _ in range(2):  # refused again, never answered "[cached]"
        line = run_refused(tmp_path, "--dataset", str(data))
        assert "token id 5000" in line and "vocabulary has 2048 ids" in line and "tokenizer" in line


def test_missing_dataset(tmp_path: Path) -> None:
    assert "does not exist" in run_refused(tmp_path, "--dataset", str(tmp_path / "nope.jsonl"))


# ------------------------------------------------------------------------------ search spaces


def test_search_space_with_every_kind_of_problem_in_one_message(tmp_path: Path) -> None:
    space = tmp_path / "bad.yaml"
    space.write_text(
        "micro_batch: [1, two]\n"      # wrong type
        "grad_ckpt: []\n"              # empty choices
        "attn: [sdpa, warp_drive]\n"   # unknown choice
        "offload: [optimizer]\n"       # contradiction: offload needs a ZeRO stage
        "zero_stage: [0]\n"
        "learning_rate: [1e-4]\n"      # unknown key
    )
    line = run_refused(tmp_path, "--space", str(space))
    for needle in ("unknown key(s) learning_rate", "micro_batch: choices must be integers; got 'two'",
                   "grad_ckpt: needs at least one choice", "attn: choices must be among",
                   "offload 'optimizer' acts only with zero_stage 1, 2 or 3 among the choices"):
        assert needle in line, (needle, line)


def test_search_space_that_is_not_yaml_or_not_a_mapping(tmp_path: Path) -> None:
    space = tmp_path / "bad.yaml"
    space.write_text("micro_batch: [1, 2\n")
    assert "not valid YAML" in run_refused(tmp_path, "--space", str(space))
    space.write_text("- 1\n- 2\n")
    assert "must be a mapping" in run_refused(tmp_path, "--space", str(space))


def test_effective_batch_that_no_micro_batch_divides(tmp_path: Path) -> None:
    space = tmp_path / "even.yaml"
    space.write_text("micro_batch: [2, 4]\nprecision: [fp32]\n")
    line = run_refused(tmp_path, "--space", str(space), "--effective-batch", "7")
    assert "no micro_batch in [2, 4] divides the effective batch 7" in line


# ------------------------------------------------------------------------------ hardware


def test_gpus_naming_a_gpu_that_does_not_exist(tmp_path: Path) -> None:
    p = autotune(tmp_path, *RUN, "--device", "auto", "--gpus", "97", "--out", str(tmp_path / "out"))
    line = assert_refused(tmp_path, p)
    assert "--gpus 97" in line and "GPU" in line


def test_gpus_with_device_cpu_contradict(tmp_path: Path) -> None:
    assert "--gpus was given with --device cpu" in run_refused(tmp_path, "--gpus", "0")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_ray_address_is_a_bounded_wait(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    line = run_refused(tmp_path, "--ray-address", address)
    took = time.monotonic() - t0
    assert f"could not reach the Ray cluster at '{address}' within 10 s" in line
    assert took < 25, took  # 10 s of retries plus the interpreter's start-up


def test_malformed_ray_address(tmp_path: Path) -> None:
    assert "is not ray://HOST:PORT" in run_refused(tmp_path, "--ray-address", "not an address")


# ------------------------------------------------------------------------------ --debug, probe


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    p = autotune(tmp_path, "--debug", *RUN, "--gpu-budget", "24XB", "--out", str(tmp_path / "out"))
    assert p.returncode != 0
    assert "Traceback" in p.stderr and "SpecError" in p.stderr and "unknown unit" in p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [(["--gpu-budget", "24XB"], "unknown unit"), (["--model", "no-such-model-xyz"], "unknown model"),
     (["--seq-len", "99999"], "at most")],
)
def test_probe_refuses_bad_input_the_same_way(tmp_path: Path, extra: list[str], needle: str) -> None:
    base = ["probe", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64"]
    assert_refused(tmp_path, autotune(tmp_path, *base, *extra), needle)


# ------------------------------------------------------------------------------ security (item 4)


def _remote_code_model(tmp: Path) -> tuple[Path, Path]:
    """A model dir whose config needs its own code; importing that code would write ``marker``."""
    model, marker = tmp / "evil-model", tmp / "marker"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "evil_arch_xyz", "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"},
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 128,
    }))
    (model / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return model, marker


def test_remote_code_is_refused_without_trust_remote_code(tmp_path: Path) -> None:
    model, marker = _remote_code_model(tmp_path)
    line = run_refused(tmp_path, "--model", str(model))
    assert "needs the model's own code (auto_map)" in line and "--trust-remote-code" in line
    assert not marker.exists()


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    space = tmp_path / "evil.yaml"
    space.write_text(f'micro_batch: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(SpecError, match="not valid YAML"):
        load_space(space)
    line = run_refused(tmp_path, "--space", str(space))
    assert "not valid YAML" in line
    assert not marker.exists()


def test_user_paths_are_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for flag, value in (("--model", f"./$(touch {marker})"), ("--dataset", f"x.jsonl; touch {marker}"),
                        ("--space", f"`touch {marker}`.yaml")):
        run_refused(tmp_path, flag, value)
    assert not marker.exists()


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else (
                f"{getattr(f.value, 'id', getattr(f.value, 'attr', '?'))}.{f.attr}" if isinstance(f, ast.Attribute)
                else "?")
            out.append((name, node))
    return out


def test_nothing_is_unpickled_executed_or_shelled_out_in_the_package() -> None:
    """No pickle/marshal/unsafe YAML loads, no shell, no eval/exec anywhere under autotune/."""
    bad: list[str] = []
    for path in sorted((REPO / "autotune").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, call in _calls(tree):
            kw = {k.arg: k.value for k in call.keywords}
            where = f"{path.relative_to(REPO)}:{call.lineno} {name}"
            if name in ("pickle.load", "pickle.loads", "cloudpickle.load", "cloudpickle.loads", "marshal.load",
                        "marshal.loads", "dill.load", "dill.loads", "joblib.load", "shelve.open",
                        "yaml.load", "yaml.unsafe_load", "yaml.full_load", "os.system", "os.popen",
                        "eval", "exec"):
                bad.append(where)
            if name == "torch.load" and not (isinstance(kw.get("weights_only"), ast.Constant)
                                              and kw["weights_only"].value is True):
                bad.append(where + " without weights_only=True")
            if name in ("np.load", "numpy.load") and not (isinstance(kw.get("allow_pickle"), ast.Constant)
                                                          and kw["allow_pickle"].value is False):
                bad.append(where + " without allow_pickle=False")
            if isinstance(kw.get("shell"), ast.Constant) and kw["shell"].value is True:
                bad.append(where + " shell=True")
            if isinstance(kw.get("trust_remote_code"), ast.Constant) and kw["trust_remote_code"].value is True:
                bad.append(where + " trust_remote_code=True")
    assert not bad, bad


def test_probes_run_with_the_hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the user's environment cannot turn it back on
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    req = ProbeRequest(workload=Workload(model="tiny-llama", seq_len=64), candidate=Candidate(),
                       settings=ProbeSettings(device="cpu"))
    env = worker_env(req, 0.0)
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["HF_HUB_DISABLE_TELEMETRY"] == "1"


def test_trust_remote_code_is_off_by_default() -> None:
    import inspect

    from autotune.models import resolve_model
    from autotune.run import RunRequest

    assert RunRequest(model="m", gpu_budget="8GB").trust_remote_code is False
    assert inspect.signature(resolve_model).parameters["trust_remote_code"].default is False
    assert Workload(model="m", seq_len=64).trust_remote_code is False


_NO_NETWORK = """
import socket, os
_log = os.environ["AUTOTUNE_TEST_NET_LOG"]
_real = socket.socket.connect
def _blocked(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        with open(_log, "a") as fh:
            fh.write(f"{os.getpid()} {address!r}\\n")
        raise OSError("network blocked by the test")
    return _real(self, address)
socket.socket.connect = _blocked
socket.create_connection = lambda *a, **k: (_ for _ in ()).throw(OSError("network blocked by the test"))
"""


@pytest.mark.slow
def test_a_real_probe_makes_no_network_call(tmp_path: Path) -> None:
    """The CLI and its worker process run with every TCP/UDP connect blocked and logged: the probe
    still succeeds, and nothing tried to connect."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_NO_NETWORK)
    log = tmp_path / "net.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "AUTOTUNE_TEST_NET_LOG": str(log), "AUTOTUNE_CACHE": str(tmp_path / "cache")}
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(k, None)  # the probe must set them itself
    p = subprocess.run(
        [sys.executable, "-m", "autotune", "probe", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "32",
         "--micro-batch", "1", "--warmup-steps", "1", "--steps", "1", "--precision", "fp32", "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["status"] == "ok"
    assert not log.exists(), log.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["probe", "--model", "tiny-llama", "--seq-len", "abc"], "Invalid value for '--seq-len'"),
        (["run", "--model", "tiny-llama", "--gpu-budget", "1GB", "--bogus"], "No such option: --bogus"),
        (["frobnicate"], "No such command"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    p = subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr
