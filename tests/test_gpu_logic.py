"""The GPU code paths' logic, tested on CPU with fakes (issue 19, items 3, 6, 7 and 8).

NVML queries separated (a fake pynvml), the NVML index of a UUID in CUDA_VISIBLE_DEVICES, bf16
checked without emulation, flash-attention refused without a 16-bit dtype, QLoRA loaded on the
rank's own GPU, MASTER_PORT chosen again when taken, torch.compile recompiles in the timed window
detected, MFU's attention span with variable lengths, and the FSDP offload row's gloo backend.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.probe import launch as launch_mod
from autotune.probe import worker
from autotune.probe.memory import NvmlSampler
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

MiB = 2**20


class FakeNvml:
    """pynvml's surface as the sampler uses it; each query can be made to fail."""

    def __init__(self, *, pids: list[int], used: int = 900 * MiB, fail: tuple[str, ...] = (),
                 uuids: tuple[str, ...] = ("GPU-aaaa1111-0000", "GPU-bbbb2222-0000")) -> None:  # fmt: skip
        self.pids, self.used, self.fail, self.uuids = pids, used, fail, uuids

    def nvmlInit(self) -> None:
        if "init" in self.fail:
            raise RuntimeError("NVML_ERROR_LIBRARY_NOT_FOUND")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.uuids[h]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        if "processes" in self.fail:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return [SimpleNamespace(pid=p, usedGpuMemory=self.used) for p in self.pids]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        if "memory" in self.fail:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return SimpleNamespace(used=2 * self.used, total=10 * self.used)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        if "utilisation" in self.fail:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return SimpleNamespace(gpu=87)


# --- item 7: NVML queries separated, process visibility recorded -------------------------------


def test_a_failed_process_query_keeps_memory_and_utilisation() -> None:
    s = NvmlSampler(nvml=FakeNvml(pids=[os.getpid()], fail=("processes",)))
    s.sample_once()
    assert s.util_samples and s.util_samples[-1][1] == 87
    assert s.peak_device_used_bytes == 1800 * MiB
    assert s.peak_process_bytes is None and s.process_visible is None
    assert "NOT_SUPPORTED" in s.query_errors["processes"]


def test_a_failed_utilisation_query_keeps_the_process_memory() -> None:
    s = NvmlSampler(nvml=FakeNvml(pids=[os.getpid()], fail=("utilisation",)))
    s.sample_once()
    assert s.peak_process_bytes == 900 * MiB and s.process_visible is True
    assert s.util_samples == [] and "utilisation" in s.query_errors


def test_in_a_pid_namespace_the_process_is_not_visible_and_no_nvml_peak_is_claimed() -> None:
    # NVML lists the host's PIDs: ours never matches
    s = NvmlSampler(nvml=FakeNvml(pids=[os.getpid() + 100_000]))
    s.sample_once()
    assert s.process_visible is False and s.peak_process_bytes is None
    assert s.max_processes_listed == 1 and s.util_samples


def test_record_memory_says_where_the_peak_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 700 * MiB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 600 * MiB)
    seen = NvmlSampler(nvml=FakeNvml(pids=[os.getpid()], used=1000 * MiB))
    m: dict[str, Any] = {"cuda_context_bytes": 250 * MiB}
    worker._record_memory(m, "cuda", None, seen, None)
    assert m["nvml_process_visible"] is True and m["mem_nvml_process_bytes"] == 1000 * MiB
    assert m["non_torch_bytes"] == 300 * MiB  # NVML process peak - max reserved
    assert m["peak_mem_bytes"] == 1000 * MiB and "NVML per-process" in m["memory_source"]

    hidden = NvmlSampler(nvml=FakeNvml(pids=[1]))
    m = {"cuda_context_bytes": 250 * MiB}
    worker._record_memory(m, "cuda", None, hidden, None)
    assert m["nvml_process_visible"] is False and "non_torch_bytes" not in m
    assert m["peak_mem_bytes"] == 950 * MiB and "not visible" in m["memory_source"]


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, *, reserved: int, total: int) -> list[float]:
    import torch

    fractions: list[float] = []
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: reserved)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=total))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, *a: fractions.append(f))
    return fractions


def test_the_gpu_meter_measures_the_context_and_caps_the_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    fractions = _fake_cuda(monkeypatch, reserved=20 * MiB, total=80 * 1024 * MiB)
    monkeypatch.setattr(worker, "_load_cuda_libraries", lambda torch: None)
    m: dict[str, Any] = {}
    dm = worker._start_gpu_meter(m, 4096 * MiB, nvml=NvmlSampler(nvml=FakeNvml(pids=[os.getpid()], used=500 * MiB)))
    dm.stop()
    assert dm.kind == "cuda" and dm.sampler is None and dm.nvml is not None
    assert m["cuda_context_bytes"] == 480 * MiB and "NVML process memory" in m["cuda_context_source"]
    assert m["device_memory_bytes"] == 80 * 1024 * MiB
    assert m["allocator_cap_bytes"] == (4096 - 480) * MiB  # the budget less the context
    assert fractions == [pytest.approx((4096 - 480) / (80 * 1024))]


def test_the_gpu_meter_in_a_pid_namespace_reads_the_devices_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    fractions = _fake_cuda(monkeypatch, reserved=20 * MiB, total=8 * 1024 * MiB)
    fake = FakeNvml(pids=[os.getpid() + 100_000], used=900 * MiB)  # device used: 2 x used
    monkeypatch.setattr(worker, "_load_cuda_libraries", lambda torch: setattr(fake, "used", 1000 * MiB))
    m: dict[str, Any] = {}
    worker._start_gpu_meter(m, None, nvml=NvmlSampler(nvml=fake)).stop()
    assert m["cuda_context_bytes"] == (2000 - 1800 - 20) * MiB and "device used growth" in m["cuda_context_source"]
    assert "allocator_cap_bytes" not in m and fractions == []  # no budget: no cap


# --- item 8: _nvml_index with UUIDs -----------------------------------------------------------


def test_nvml_index_resolves_indices_and_uuids() -> None:
    nv = FakeNvml(pids=[])
    assert worker._nvml_index(0, visible="1,0", nvml=nv) == 1
    assert worker._nvml_index(1, visible="GPU-aaaa1111-0000,GPU-bbbb2222-0000", nvml=nv) == 1
    assert worker._nvml_index(0, visible="GPU-bbbb", nvml=nv) == 1  # a unique prefix, as CUDA accepts
    assert worker._nvml_index(0, visible="", nvml=nv) == 0
    assert worker._nvml_index(0, visible="GPU-ffff", nvml=nv) == 0  # unknown: the torch index
    assert worker._nvml_index(0, visible="MIG-1234", nvml=nv) == 0
    assert worker._nvml_index(0, visible="GPU-bbbb", nvml=FakeNvml(pids=[], fail=("init",))) == 0


# --- item 8: prechecks -------------------------------------------------------------------------


def _req(**cand: Any) -> ProbeRequest:
    return ProbeRequest(Workload(model="m", model_path="/nonexistent", seq_len=64), Candidate(**cand),
                        ProbeSettings(device="cuda"))  # fmt: skip


def test_bf16_is_checked_without_emulation(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    calls: list[dict[str, Any]] = []

    def bf16(including_emulation: bool = True) -> bool:
        calls.append({"including_emulation": including_emulation})
        return including_emulation  # a T4: emulated only

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", bf16)
    with pytest.raises(worker._Unsupported, match="natively"):
        worker._precheck(_req(precision="bf16"), "cuda")
    assert calls == [{"including_emulation": False}]


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_flash_attention_is_refused_without_a_16_bit_dtype(monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    with pytest.raises(worker._Unsupported, match="fp16/bf16 only"):
        worker._precheck(_req(attn="flash_attention_2", precision=precision), "cuda")


def test_qlora_loads_on_the_ranks_own_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import transformers
    from transformers import AutoConfig

    from autotune.models import resolve_model

    seen: dict[str, Any] = {}

    def fake_from_pretrained(path: str, **kw: Any) -> str:
        seen.update(kw)
        return "model"

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))  # the random-weight base is cached there
    cfg = AutoConfig.from_pretrained(resolve_model("tiny-llama").path)
    wl = Workload(model="tiny-llama", model_path=resolve_model("tiny-llama").path, seq_len=64, mode="qlora")
    try:
        worker._build_qlora_base(cfg, {"dtype": "bfloat16", "attn_implementation": "sdpa"}, wl)
    except ImportError as exc:  # BitsAndBytesConfig without bitsandbytes on some transformers
        pytest.skip(str(exc))
    assert seen["device_map"] == {"": 3}
    assert len(list((tmp_path / "qlora-base").glob("*/model.safetensors"))) == 1
    monkeypatch.delenv("LOCAL_RANK")
    assert worker.qlora_device_index() == 0


def test_tf32_is_decided_by_training_arguments_only() -> None:
    import inspect

    from autotune.formats.training_args import probe_kwargs

    # the worker no longer sets torch's legacy flag beside TrainingArguments(tf32=...)
    assert "allow_tf32 =" not in inspect.getsource(worker)
    fields = {"tf32", "bf16", "fp16", "per_device_train_batch_size", "gradient_accumulation_steps",
              "dataloader_num_workers", "dataloader_pin_memory", "optim", "seed", "data_seed",
              "remove_unused_columns", "gradient_checkpointing", "gradient_checkpointing_kwargs"}  # fmt: skip
    for precision, tf32 in (("fp16", False), ("fp32", False), ("bf16", True), ("tf32", True)):
        assert probe_kwargs(_req(precision=precision), fields=fields, device="cuda")["tf32"] is tf32


# --- item 8: torch.compile recompiles inside the timed window ----------------------------------


def test_a_compile_probe_gets_more_warmup_and_its_window_recompiles_are_counted() -> None:
    req = ProbeRequest(Workload(model="m", model_path="/x", seq_len=64), Candidate(torch_compile=True),
                       ProbeSettings(device="cpu", warmup_steps=3, steps=3))  # fmt: skip
    from autotune.spec.probe_window import COMPILE_WARMUP_STEPS, probe_window

    window = probe_window(req.settings, req.candidate)
    meter = worker._Meter(lambda: None, window=window)
    meter.first_fetch_t = 0.0
    meter.step_end_t = [1.0, 2.0, 3.0, 3.5, 4.0, 4.5]  # steady timed steps (a noisy window is warned of too)
    meter.tokens, meter.rows, meter.slots = [64] * 6, [1] * 6, [64] * 6
    meter.sequences = [1] * 6
    meter.fetch_wait = [0.0] * 6
    meter.graphs = [1, 1, 2, 2, 3, 3]  # one recompile in warm-up step 3, one in timed step 5
    m: dict[str, Any] = {}
    worker._record_window(m, meter, window, 0.0, 0.0, 0.0)
    assert m["recompiles_in_window"] == 1 and "inside the timed window" in m["warnings"][0]
    meter.graphs = [1, 2, 2, 2, 2, 2]
    m = {}
    worker._record_window(m, meter, window, 0.0, 0.0, 0.0)
    assert m["recompiles_in_window"] == 0 and "warnings" not in m
    assert COMPILE_WARMUP_STEPS >= 3 and window.warmup_steps >= 3 and not window.composed


# --- item 8: MASTER_PORT chosen again when it was taken ----------------------------------------


def _fake_python(tmp_path: Path, taken: int) -> Path:
    """A stand-in for ``python -m autotune.probe.worker REQ RES``: rank 0 fails to bind a taken port."""
    script = tmp_path / "fake-python"
    script.write_text(f"""#!{sys.executable}
import json, os, sys
req, res = sys.argv[3], sys.argv[4]
port, rank = int(os.environ["MASTER_PORT"]), int(os.environ["RANK"])
reqd = json.load(open(req))
if port == {taken}:
    if rank == 0:
        json.dump({{"status": "crash", "request": reqd, "reason": "distributed setup: The server socket has failed to listen on any local network address. port: {taken}, code: -98, name: EADDRINUSE, message: address already in use", "metrics": {{}}, "env": {{}}}}, open(res, "w"))
    sys.exit(0 if rank == 0 else 1)
json.dump({{"status": "ok", "request": reqd, "reason": "", "metrics": {{"tokens_per_s": 10.0, "real_tokens": 10, "window_s": 1.0, "port": port}}, "env": {{}}}}, open(res, "w"))
""")  # fmt: skip
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_a_taken_master_port_is_chosen_again(tmp_path: Path) -> None:
    req = ProbeRequest(Workload(model="m", model_path="/x", seq_len=64), Candidate(world_size=2),
                       ProbeSettings(device="cpu"))  # fmt: skip
    ports = iter([41001, 41002, 41003])
    res = launch_mod.launch(req, tmp_path / "result.json", python=str(_fake_python(tmp_path, 41001)),
                            free_port=lambda: next(ports))  # fmt: skip
    assert res.status == "ok", res.reason
    assert res.metrics["port_attempts"] == 2 and res.metrics["port"] == 41002


def test_port_was_taken_reads_the_reason_and_the_stderr() -> None:
    def r(reason: str, tail: str = "", status: str = "crash") -> ProbeResult:
        return ProbeResult(status=status, request={}, reason=reason, metrics={}, env={"stderr_tail": tail})

    assert launch_mod.port_was_taken(r("rank 0/2: distributed setup: ... EADDRINUSE ..."))
    assert launch_mod.port_was_taken(r("rank 1/2 exit code 1", "OSError: [Errno 98] Address already in use"))
    assert not launch_mod.port_was_taken(r("CUDA out of memory", status="oom"))
    assert not launch_mod.port_was_taken(r("", status="ok"))


# --- item 8: MFU's attention term with variable lengths ----------------------------------------


def test_attention_span_is_the_token_weighted_mean_length() -> None:
    from autotune.diagnose import attention_span
    from autotune.spec.lengths import sample_lengths

    assert attention_span("fixed", 2048) == 2048.0
    ls = sample_lengths("lognormal:5.0,0.8", 4096, 2048, 0)
    span = attention_span("lognormal:5.0,0.8", 2048)
    assert span == pytest.approx(sum(x * x for x in ls) / sum(ls))
    assert sum(ls) / len(ls) < span < 2048  # above the plain mean, far below seq_len


def test_mfu_with_variable_lengths_is_below_the_seq_len_convention() -> None:
    from autotune.diagnose import probe_mfu
    from autotune.estimate import arch_from_config, mfu
    from autotune.models import resolve_model

    model = resolve_model("llama-3.2-1b")

    def result(lengths: str) -> ProbeResult:
        req = ProbeRequest(Workload(model=model.name, model_path=model.path, seq_len=2048, lengths=lengths),
                           Candidate(micro_batch=4, precision="bf16"), ProbeSettings(device="cuda"))  # fmt: skip
        return ProbeResult(status="ok", request=req.to_dict(), reason="", metrics={"tokens_per_s": 20000.0},
                           env={"device": "NVIDIA H100 80GB HBM3", "device_type": "cuda"})  # fmt: skip

    fixed = probe_mfu(result("fixed"), model.config)
    varied = probe_mfu(result("lognormal:5.0,0.8"), model.config)
    arch = arch_from_config(model.config)
    assert fixed == pytest.approx(mfu(20000.0, arch, 2048, "H100", "full"))
    assert fixed is not None and varied is not None and varied < fixed


# --- item 6: the FSDP parameter-offload row on a GPU gets gloo beside NCCL ---------------------


def test_fsdp_offload_on_cuda_has_a_cpu_gloo_backend() -> None:
    from transformers import TrainingArguments

    from autotune.formats.training_args import probe_kwargs

    fields = set(TrainingArguments.__dataclass_fields__)
    offload = _req(world_size=1, zero_stage=3, sharding="fsdp", offload="params", precision="bf16")
    assert probe_kwargs(offload, fields=fields, device="cuda")["ddp_backend"] == "cuda:nccl,cpu:gloo"
    plain = _req(world_size=1, zero_stage=3, sharding="fsdp", precision="bf16")
    assert "ddp_backend" not in probe_kwargs(plain, fields=fields, device="cuda")
    assert "ddp_backend" not in probe_kwargs(offload, fields=fields, device="cpu")


def test_fake_python_result_format_matches_probe_result(tmp_path: Path) -> None:
    # the stand-in above writes what ProbeResult.from_dict reads (else the port test proves nothing)
    d = {"status": "ok", "request": {}, "reason": "", "metrics": {"tokens_per_s": 1.0}, "env": {}}
    assert ProbeResult.from_dict(json.loads(json.dumps(d))).tokens_per_s == 1.0
