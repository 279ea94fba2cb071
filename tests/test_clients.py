"""The client tier: LLaMA-Factory and Axolotl themselves read every file autotune writes for them.

Each client is installed in a virtual environment of its own (tests/_clients.py: pinned, next to CPU torch,
cached under ~/.cache/autotune-clients), since neither installs beside autotune's transformers. For a set of
answers covering the levers (full / LoRA / QLoRA, packing, checkpointing on and off, sdpa / eager /
flash_attention_2 / flex_attention, fp32 / bf16, Liger, DeepSpeed ZeRO-2 and ZeRO-3 with offload, FSDP,
world size 2) and for ``run --from FILE --write-back`` on each client's own example configs, the client's own
parser resolves the file (tests/clients/*_resolve.py, run with the client's python, from a folder other than
the answer's) and the test compares what it resolved with what autotune measured. One CPU answer is then
trained for 2 steps by each client, on a ``save_to_disk`` dataset made usable the way the emitted note says.

A client's start (torch, transformers and the client imported) is most of what the tier costs, so each client
is started once to parse: one resolver process reads every emitted file and every write-back (LLaMA-Factory's
also records its argument set), and the tests each compare their part of what it resolved. The resolvers and the
two trainings are started together when the module's first test runs and run side by side; each test waits
for the process it reads.

    pytest -m clients tests/test_clients.py        # builds the venvs on first use (minutes), then reuses them

A venv that cannot be built (no network, say) skips these tests with pip's reason; nothing passes untested.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from autotune.emit import emit_all
from autotune.formats import read_config, tuned_file
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

sys.path.insert(0, str(Path(__file__).parent))
import _clients  # noqa: E402

pytestmark = pytest.mark.clients

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESOLVERS = HERE / "clients"
RECORD_FIELDS = ROOT / "tools" / "record_client_fields.py"
EXAMPLES = HERE / "data" / "clients"
TOK = ROOT / "autotune" / "models" / "tokenizers" / "tiny-chat"
FIELDS = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
CHAT = [{"role": "user", "content": "how fast is the model ?"}, {"role": "assistant", "content": "very fast ."}]

# name -> (candidate, mode, device the answer was measured on)
ANSWERS = {
    "full-fp32-eager": (Candidate(micro_batch=2, grad_accum=2, precision="fp32", attn="eager"), "full", "cpu"),
    "lora-packing-ckpt": (Candidate(micro_batch=4, grad_accum=1, precision="fp32", packing=True, grad_ckpt=True),
                          "lora", "cpu"),
    "full-ckpt-workers": (Candidate(micro_batch=4, grad_accum=2, precision="fp32", grad_ckpt=True, workers=2),
                          "full", "cpu"),
    "lora-bf16-fa2": (Candidate(micro_batch=4, precision="bf16", attn="flash_attention_2", workers=2), "lora", "cuda"),
    "qlora-liger": (Candidate(micro_batch=1, grad_accum=8, precision="bf16", liger=True), "qlora", "cuda"),
    "zero2": (Candidate(micro_batch=2, precision="bf16", world_size=2, zero_stage=2), "full", "cuda"),
    "zero3-offload": (Candidate(micro_batch=2, precision="bf16", world_size=2, zero_stage=3, offload="params"),
                      "full", "cuda"),
    "lora-fp16-compile": (Candidate(micro_batch=2, grad_accum=4, precision="fp16", torch_compile=True, attn="sdpa"),
                          "lora", "cuda"),
    "fsdp-flex": (Candidate(micro_batch=2, precision="bf16", world_size=2, zero_stage=3, sharding="fsdp",
                            attn="flex_attention"), "full", "cuda"),
}  # fmt: skip
TRAINED = "lora-packing-ckpt"
# the candidates written back into each client's own example configs: checkpointing and packing both ways
WRITE_BACKS = {
    "ckpt-off-packed": Candidate(micro_batch=4, grad_accum=2, precision="bf16", grad_ckpt=False, packing=True),
    "ckpt-on-unpacked": Candidate(micro_batch=2, grad_accum=4, precision="fp32", grad_ckpt=True, attn="eager",
                                  workers=2),
}  # fmt: skip


def _python(name: str) -> Path:
    own = os.environ.get(f"AUTOTUNE_{name.upper()}_PYTHON")  # a client install of your own instead of the cached venv
    if own:
        return Path(own)
    try:
        return _clients.build(_clients.CLIENTS[name])
    except _clients.BuildFailed as exc:
        pytest.skip(str(exc))


def _ready(name: str) -> bool:
    """The client's python is there without building anything (so starting its processes early costs no wait)."""
    return bool(os.environ.get(f"AUTOTUNE_{name.upper()}_PYTHON")) or (
        _clients.venv_dir(_clients.CLIENTS[name]) / ".complete").exists()


def _env(python: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if python is not None:  # the client's own commands (axolotl launches `accelerate`) from its venv first
        env["PATH"] = str(python.parent) + os.pathsep + env.get("PATH", "")
    return {**env, **_clients.CLIENT_ENV, "CUDA_VISIBLE_DEVICES": "", **extra}


class _Run:
    """A client command started in the background, in a process group of its own: the tier's client processes
    (one resolver and one training per client) run side by side, and the test that needs one waits for it."""

    def __init__(self, cmd: list, *, cwd: Path, env: dict[str, str], logs: Path, timeout: float = 900) -> None:
        self.cmd = [str(c) for c in cmd]
        self.timeout = timeout
        self._stopped = False
        self._out, self._err = logs.with_suffix(".out"), logs.with_suffix(".err")
        with self._out.open("w") as out, self._err.open("w") as err:
            self.proc = subprocess.Popen(self.cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=err, start_new_session=True)
        self._deadline = time.monotonic() + timeout
        atexit.register(self.stop)  # a session ended before the tier's teardown (Ctrl-C) leaves none behind

    def result(self) -> subprocess.CompletedProcess[str]:
        try:
            rc = self.proc.wait(timeout=max(0.0, self._deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{shlex.join(self.cmd)} ran past {self.timeout:.0f} s")
        return subprocess.CompletedProcess(self.cmd, rc, self._out.read_text(errors="replace"),
                                           self._err.read_text(errors="replace"))

    def stop(self) -> None:
        """The process and whatever it started (accelerate's trainer) are ended: nothing outlives the tier."""
        if self._stopped:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._stopped = True


_NEEDS: dict[str, str] = {}  # test name -> the client process it reads


def _needs(job: str) -> Callable:
    def mark(test: Callable) -> Callable:
        _NEEDS[test.__name__] = job
        return test
    return mark


class _Tier:
    """The client processes of the tier, each started once: every selected test's process is started before the
    first test waits (a client whose venv still has to be built starts when its first test asks for it)."""

    def __init__(self, world: dict[str, Path], root: Path) -> None:
        self.world, self.root = world, root
        self.inputs: dict[str, object] = {}  # what a job wrote for its tests to compare against
        self._started: dict[str, object] = {}
        self._resolved: dict[str, dict[str, dict]] = {}
        self._pythons: dict[str, Path | BaseException] = {}
        # the longest first; LLaMA-Factory's training last, after the note's export (run here, meanwhile)
        self._starters: dict[str, Callable[[], _Run]] = {
            "ax-train": self._ax_train, "lf-resolve": self._lf_resolve, "ax-resolve": self._ax_resolve,
            "lf-train": self._lf_train,
        }

    def start(self, job: str) -> _Run:
        if job not in self._started:
            try:
                self._started[job] = self._starters[job]()
            except (Exception, pytest.skip.Exception) as exc:  # raised again in the test that needs the job
                self._started[job] = exc
        got = self._started[job]
        if isinstance(got, BaseException):
            raise got
        return got

    def prestart(self, jobs: set[str]) -> None:
        for job in self._starters:
            if job in jobs and _ready("llamafactory" if job.startswith("lf") else "axolotl"):
                try:
                    self.start(job)
                except (Exception, pytest.skip.Exception):
                    pass  # the test that needs the job fails (or skips) with it

    def python(self, name: str) -> Path:
        """The client's python, built once for all its jobs (a venv that cannot be built skips each of them)."""
        if name not in self._pythons:
            try:
                self._pythons[name] = _python(name)
            except pytest.skip.Exception as exc:
                self._pythons[name] = exc
        got = self._pythons[name]
        if isinstance(got, BaseException):
            raise got
        return got

    def resolved(self, job: str) -> dict[str, dict]:
        """Path (or ``run SCRIPT``) -> what the client's own parser resolved, from the job's one process."""
        if job not in self._resolved:
            proc = self.start(job).result()
            assert proc.returncode == 0, proc.stderr[-3000:]
            self._resolved[job] = json.loads(proc.stdout.strip().splitlines()[-1])
        return self._resolved[job]

    def stop(self) -> None:
        for run in self._started.values():
            if isinstance(run, _Run):
                run.stop()

    # ------------------------------------------------------------------------------------ the jobs

    def _lf_resolve(self) -> _Run:
        """One LLaMA-Factory process: every emitted file from another folder, every write-back from the examples'
        own root, and the argument set its release accepts, recorded by tools/record_client_fields.py."""
        python, world = self.python("llamafactory"), self.world
        emitted = [world[name] / "llamafactory.yaml" for name in ANSWERS]
        work = self.root / "lf"
        written = _lf_write_backs(work)
        fields = self.root / "lf_fields.json"
        self.inputs["lf-write-backs"], self.inputs["lf-fields"] = written, fields
        cmd = [python, RESOLVERS / "lf_resolve.py", "--run", RECORD_FIELDS, fields, *emitted,
               "--cwd", work, *written.values()]
        return _Run(cmd, cwd=world["elsewhere"], env=_env(), logs=self.root / "lf-resolve")

    def _ax_resolve(self) -> _Run:
        """One Axolotl process: every emitted file, then every write-back, both from another folder."""
        python, world = self.python("axolotl"), self.world
        written = _ax_write_backs(self.root / "ax", world)
        self.inputs["ax-write-backs"] = written
        emitted = [world[name] / "axolotl.yaml" for name in ANSWERS]
        return _Run([python, RESOLVERS / "ax_resolve.py", *emitted, *written.values()], cwd=world["elsewhere"],
                    env=_env(), logs=self.root / "ax-resolve")

    def _lf_train(self) -> _Run:
        """The dataset exported and registered as the answer's note says, then ``llamafactory-cli train``."""
        python, world = self.python("llamafactory"), self.world
        note = _note((world[TRAINED] / "llamafactory.yaml").read_text(), "dataset:")
        # the export command the note gives, as a shell would split it (its program is one quoted argument)
        export = shlex.split(re.search(r": (python -c .*?); then write dataset_info", note).group(1))
        assert export[:2] == ["python", "-c"] and len(export) == 3, export
        done = subprocess.run([sys.executable, *export[1:]], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"the note's export failed: {export}\n{done.stderr[-3000:]}"
        entry = json.loads(re.search(r"write dataset_info.json (\{.*\}) and set", note).group(1))
        data_dir = world["root"] / "lf_data"
        data_dir.mkdir()
        (data_dir / "dataset_info.json").write_text(json.dumps(entry))
        cmd = [python.parent / "llamafactory-cli", "train", world[TRAINED] / "llamafactory.yaml",
               "dataset=autotune_data", f"dataset_dir={data_dir}", "template=default", "max_steps=2",
               f"output_dir={world['root'] / 'lf_out'}", "save_steps=1000", "logging_steps=1", "overwrite_cache=true"]
        return _Run(cmd, cwd=world["elsewhere"], env=_env(python, FORCE_TORCHRUN="0"), logs=self.root / "lf-train")

    def _ax_train(self) -> _Run:
        """``axolotl train`` on the answer as written, for 2 steps."""
        python, world = self.python("axolotl"), self.world
        cmd = [python.parent / "axolotl", "train", world[TRAINED] / "axolotl.yaml", "--max-steps", "2",
               "--output-dir", world["root"] / "ax_out", "--dataset-prepared-path", world["root"] / "ax_prepared",
               "--val-set-size", "0"]  # 2 steps: the emitted save_steps are never reached
        # one process to prepare and pack the 32 rows: the default (one per CPU core) only starts pools whose
        # every worker compiles Axolotl's numba packer again (the same packing function, run in this process)
        env = _env(python, AXOLOTL_DATASET_NUM_PROC="1")
        return _Run(cmd, cwd=world["elsewhere"], env=env, logs=self.root / "ax-train")


@pytest.fixture(scope="module")
def tier(request: pytest.FixtureRequest, world: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    selected = {item.name for item in request.session.items if getattr(item, "module", None) is request.module}
    tier = _Tier(world, tmp_path_factory.mktemp("client-runs"))
    tier.prestart({job for name, job in _NEEDS.items() if name in selected})
    yield tier
    tier.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model (random weights, the tiny chat tokenizer), a chat dataset as .jsonl and as save_to_disk,
    and every answer's best/ folder written by emit_all as a run writes it."""
    root = tmp_path_factory.mktemp("clients")
    model = root / "model"
    from autotune.models import resolve_model

    cfg = transformers.AutoConfig.from_pretrained(resolve_model("tiny-llama").path, local_files_only=True)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(model)
    transformers.AutoTokenizer.from_pretrained(TOK).save_pretrained(model)
    jsonl = root / "chat.jsonl"
    jsonl.write_text("".join(json.dumps({"messages": CHAT}) + "\n" for _ in range(32)))
    disk = root / "chat"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"messages": [CHAT] * 32})}).save_to_disk(str(disk))
    out = {"root": root, "model": model, "jsonl": jsonl, "disk": disk, "elsewhere": root / "elsewhere"}
    out["elsewhere"].mkdir()
    for name, (cand, mode, device) in ANSWERS.items():
        data = disk if name == TRAINED else jsonl
        req = ProbeRequest(workload=Workload(model=str(model), model_path=str(model), seq_len=64, mode=mode,
                                             lora_targets=("q_proj", "v_proj"), dataset=str(data),
                                             split="train" if data == disk else None, tokenizer=str(model)),
                           candidate=cand, settings=ProbeSettings(device=device))
        result = ProbeResult(status="ok", request=req.to_dict(),
                             metrics={"tokens_per_s": 1.0, "mean_seq_len": 20.0, "dataset_column": "messages"})
        emit_all(result, root / name / "best", fields=FIELDS)
        out[name] = root / name / "best"
    return out


def _rows(cand: Candidate) -> int:
    # packed answers count rows of the sequence length holding one measured micro-batch (mean length 20 of 64)
    return max(1, min(cand.micro_batch, round(cand.micro_batch * 20 / 64))) if cand.packing else cand.micro_batch


# ---------------------------------------------------------------------------------------- LLaMA-Factory

_LF_ATTN = {"eager": "disabled", "sdpa": "sdpa", "flash_attention_2": "fa2", "flex_attention": "auto"}


def _lf_expected(cand: Candidate, mode: str, *, rows: int | None = None) -> dict:
    exp = {"micro_batch": cand.micro_batch if rows is None else rows, "grad_accum": cand.grad_accum,
           "grad_ckpt": cand.grad_ckpt, "bf16": cand.precision == "bf16", "fp16": cand.precision == "fp16",
           "packing": cand.packing, "neat_packing": cand.packing, "workers": cand.workers, "liger": cand.liger}
    if cand.grad_ckpt:
        exp["use_reentrant_gc"] = False  # autotune measured non-reentrant checkpointing
    if mode is not None:
        exp["finetuning_type"] = "full" if mode == "full" else "lora"
        exp["quantization_bit"] = 4 if mode == "qlora" else None
    return exp


@_needs("lf-resolve")
def test_llamafactory_parses_every_emitted_file_as_measured(tier: _Tier, world: dict[str, Path]) -> None:
    got = tier.resolved("lf-resolve")  # resolved from world["elsewhere"]
    for name, (cand, mode, _dev) in ANSWERS.items():
        res = got[str(world[name] / "llamafactory.yaml")]
        assert "error" not in res, (name, res)
        exp = _lf_expected(cand, mode, rows=_rows(cand))
        exp["flash_attn"] = _LF_ATTN[cand.attn]
        assert {k: res[k] for k in exp} == exp, name
        assert res["cutoff_len"] == (63 if cand.packing else 64)  # LLaMA-Factory packs rows of cutoff_len - 1
        assert res["torch_compile"] == cand.torch_compile, name
        if cand.zero_stage and cand.sharding == "deepspeed":
            assert "deepspeed_error" not in res, res  # found from another working directory
            assert (res["zero_stage"], res["offload"]) == (cand.zero_stage, cand.offload), name


def _write_back(src: Path, cand: Candidate, out: Path) -> Path:
    cfg = read_config(src.name, src.read_text())
    text, _ = tuned_file(cfg, dataclasses.asdict(cand), fields=FIELDS)
    out.write_text(text)
    return out


def _lf_write_backs(work: Path) -> dict[tuple[str, str], Path]:
    """Every LLaMA-Factory example (and the repository's own) written back with each candidate, in a folder laid
    out as LLaMA-Factory's root (its examples name ``examples/deepspeed/...`` relative to it)."""
    (work / "examples").mkdir(parents=True)
    (work / "examples" / "deepspeed").symlink_to(EXAMPLES / "llamafactory" / "examples" / "deepspeed")
    sources = sorted((EXAMPLES / "llamafactory").glob("*.yaml")) + [HERE / "data" / "formats" / "lf_lora_sft.yaml"]
    (work / "ds_z3.json").write_text((HERE / "data" / "formats" / "ds_z3.json").read_text())
    written = {}
    for src in sources:
        for label, cand in WRITE_BACKS.items():
            written[(src.name, label)] = _write_back(src, cand, work / f"{src.stem}.{label}.yaml")
    return written


@_needs("lf-resolve")
def test_llamafactory_parses_every_write_back_as_measured(tier: _Tier) -> None:
    got = tier.resolved("lf-resolve")  # the write-backs resolved from the examples' own root
    written = tier.inputs["lf-write-backs"]
    for (src, label), path in written.items():
        res = got[str(path)]
        assert "error" not in res, (src, label, res)
        exp = _lf_expected(WRITE_BACKS[label], None)  # mode stays the file's
        assert {k: res[k] for k in exp} == exp, (src, label)
        assert "activation_checkpointing" not in path.read_text()


# ---------------------------------------------------------------------------------------- Axolotl


def _ax_expected(cand: Candidate, mode: str | None, *, rows: int | None = None) -> dict:
    exp = {"micro_batch": cand.micro_batch if rows is None else rows, "grad_accum": cand.grad_accum,
           "grad_ckpt": cand.grad_ckpt, "attn": cand.attn, "sample_packing": cand.packing,
           "workers": cand.workers, "pin_memory": cand.pin_memory}
    if cand.precision != "bf16":
        exp["bf16"] = False  # a bf16 answer may stay 'auto' in a user's file: Axolotl picks bf16 where the GPU has it
    if mode is not None:
        exp["adapter"] = None if mode == "full" else mode
        exp["load_in_4bit"] = mode == "qlora"
    return exp


def _no_kernel_auto_enabled(res: dict) -> None:
    assert not any("Auto-enabling LoRA kernel" in w for w in res["warnings"]), res["warnings"]
    assert not any(res["lora_kernels"].values()), res["lora_kernels"]


@_needs("ax-resolve")
def test_axolotl_loads_every_emitted_file_as_measured(tier: _Tier, world: dict[str, Path]) -> None:
    got = tier.resolved("ax-resolve")  # resolved from world["elsewhere"]
    for name, (cand, mode, _dev) in ANSWERS.items():
        res = got[str(world[name] / "axolotl.yaml")]
        assert "error" not in res, (name, res)
        exp = _ax_expected(cand, mode, rows=_rows(cand))
        exp["bf16"] = cand.precision == "bf16"
        exp["fp16"] = True if cand.precision == "fp16" else res["fp16"]  # unset is Axolotl's "off"
        exp["torch_compile"] = cand.torch_compile or res["torch_compile"]
        assert {k: res[k] for k in exp} == exp, name
        assert bool(res["fp16"]) == (cand.precision == "fp16") and bool(res["torch_compile"]) == cand.torch_compile
        assert res["batch_size"] == _rows(cand) * cand.grad_accum
        if mode != "full":
            _no_kernel_auto_enabled(res)
        if cand.grad_ckpt:
            assert res["grad_ckpt_kwargs"] == {"use_reentrant": False}
        if cand.liger:
            assert res["plugins"] == ["axolotl.integrations.liger.LigerPlugin"]
        if cand.zero_stage and cand.sharding == "deepspeed":
            assert "deepspeed_error" not in res, res  # Axolotl loaded it from another working directory
            assert (res["zero_stage"], res["offload"]) == (cand.zero_stage, cand.offload), name
        if cand.sharding == "fsdp":
            assert res["fsdp_version"] == 2 and not any("FSDP1" in w or "prefix" in w for w in res["warnings"])


def _ax_write_backs(folder: Path, world: dict[str, Path]) -> dict[tuple[str, str], Path]:
    """Every Axolotl example (and the repository's own) written back with each candidate, made to load offline."""
    folder.mkdir()
    sources = sorted((EXAMPLES / "axolotl").glob("*.y*ml")) + [HERE / "data" / "formats" / "axolotl_lora.yaml"]
    written = {}
    for src in sources:
        # offline: the examples' Hub models and datasets become the tiny model and the local chat file
        text = re.sub(r"(?m)^base_model: .*$", f"base_model: {world['model']}", src.read_text())
        local = folder / src.name
        local.write_text(text)
        local_cfg = yaml.safe_load(text)
        local_cfg["datasets"] = [{"path": str(world["jsonl"]), "type": "chat_template"}]
        for key in ("special_tokens", "chat_template", "dataset_prepared_path"):
            local_cfg.pop(key, None)
        for label, cand in WRITE_BACKS.items():
            out = folder / f"{src.stem}.{label}.yaml"
            _write_back(local, cand, out)
            # the data entry is replaced after the write-back (the write-back keeps the file's own)
            cfg = yaml.safe_load(out.read_text())
            cfg.update({k: local_cfg[k] for k in ("datasets",)})
            for key in ("special_tokens", "chat_template", "dataset_prepared_path"):
                cfg.pop(key, None)
            out.write_text(yaml.safe_dump(cfg, sort_keys=False))
            written[(src.name, label)] = out
    return written


@_needs("ax-resolve")
def test_axolotl_loads_every_write_back_as_measured(tier: _Tier) -> None:
    got = tier.resolved("ax-resolve")  # the write-backs resolved from world["elsewhere"], after the emitted files
    written = tier.inputs["ax-write-backs"]
    for (src, label), path in written.items():
        res = got[str(path)]
        assert "error" not in res, (src, label, res)
        cand = WRITE_BACKS[label]
        exp = _ax_expected(cand, None)
        if cand.packing:
            exp.pop("micro_batch")  # rows of sequence_len: the file's own sequence length decides
        assert {k: res[k] for k in exp} == exp, (src, label)
        if res["adapter"]:
            _no_kernel_auto_enabled(res)


# ---------------------------------------------------------------------------------------- training


def _note(text: str, prefix: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith(f"# NOTE {prefix}"))


@pytest.mark.slow
@_needs("lf-train")
def test_llamafactory_trains_the_cpu_answer_following_its_notes(tier: _Tier) -> None:
    run = tier.start("lf-train")  # the note's export, its dataset_info.json, then llamafactory-cli train
    proc = run.result()
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 and re.search(r"No module named 'torchaudio'|torchaudio/lib/_torchaudio", log):
        # llamafactory 0.9.5 imports torchaudio to train (data/mm_plugin.py); PyPI's torchaudio is a CUDA build
        # that does not load next to CPU torch, so training cannot be verified in this venv
        pytest.skip("llamafactory-cli train imports torchaudio, and no torchaudio wheel on PyPI loads next to CPU "
                    f"torch {torch.__version__}: training not verified here (parsing is)")
    assert proc.returncode == 0, shlex.join(run.cmd) + "\n" + log[-4000:]
    assert "Gradient checkpointing enabled." in log  # what autotune measured: on, non-reentrant
    assert re.search(r"'loss': [0-9.]+", log) or "train_loss" in log, log[-2000:]


@pytest.mark.slow
@_needs("ax-train")
def test_axolotl_trains_the_cpu_answer(tier: _Tier, world: dict[str, Path]) -> None:
    run = tier.start("ax-train")
    cfg = yaml.safe_load((world[TRAINED] / "axolotl.yaml").read_text())
    assert cfg["datasets"] == [{"path": str(world["disk"]), "type": "chat_template"}]
    proc = run.result()
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, shlex.join(run.cmd) + "\n" + log[-4000:]
    assert "Auto-enabling LoRA kernel" not in log
    assert re.search(r"'loss': '?[0-9.]+", log) or "train_loss" in log, log[-2000:]


@_needs("lf-resolve")
def test_the_recorded_llamafactory_argument_set_is_the_installed_releases(tier: _Tier) -> None:
    ran = tier.resolved("lf-resolve")[f"run {RECORD_FIELDS}"]  # tools/record_client_fields.py in its process
    assert "error" not in ran, ran["error"]
    recorded = json.loads((ROOT / "autotune" / "emit" / "schemas" / "llamafactory_fields.json").read_text())
    assert json.loads(tier.inputs["lf-fields"].read_text()) == recorded
