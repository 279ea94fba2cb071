"""The probe worker's stages, in process on CPU: the emit-derived arguments computed once, and a
failure in any stage a classified result (with what was measured so far), never an exception."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from autotune.probe import worker
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload


def _tiny(**workload: Any) -> ProbeRequest:
    from autotune.models import resolve_model

    model = resolve_model("tiny-llama")
    return ProbeRequest(
        Workload(model=model.name, model_path=model.path, seq_len=64, **workload),
        Candidate(micro_batch=2, precision="fp32", attn="sdpa"),
        ProbeSettings(device="cpu", warmup_steps=1, steps=2, timeout_s=240.0),
    )


TINY_CHAT = Path(__file__).resolve().parents[1] / "autotune" / "models" / "tokenizers" / "tiny-chat"


@pytest.mark.parametrize("trainer", ["hf", "trl"])
def test_the_emit_derived_arguments_are_computed_once_per_probe(monkeypatch: pytest.MonkeyPatch, trainer: str) -> None:
    from autotune.formats import model as fm
    from autotune.formats import training_args as ta

    if trainer == "trl":
        pytest.importorskip("trl")

    calls: dict[str, int] = {}

    def counted(name: str, module: Any) -> Any:
        real = getattr(module, name)

        def f(*a: Any, **kw: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return real(*a, **kw)

        return f

    for name in ("model_kwargs", "model_dtype", "lora_config", "lora_target_modules"):
        monkeypatch.setattr(fm, name, counted(name, fm))
    monkeypatch.setattr(ta, "probe_kwargs", counted("probe_kwargs", ta))
    req = _tiny(mode="lora", trainer=trainer, tokenizer=str(TINY_CHAT) if trainer == "trl" else None)
    res = worker.run_probe_in_process(req, launch_time=time.time())
    assert res.status == "ok", res.reason
    # model_kwargs reads model_dtype once itself; nothing else asks for it again
    # TRL: sft_probe_overrides reads the run-only keys from probe_kwargs over SFTConfig's own fields, a
    # second call with other fields (TrainingArguments' are the worker's), not a repeat of the first
    assert calls == {"model_kwargs": 1, "model_dtype": 1, "lora_config": 1, "lora_target_modules": 1,
                     "probe_kwargs": 2 if trainer == "trl" else 1}  # fmt: skip
    assert res.metrics["trainable_params"] < res.metrics["num_params"]


def test_a_trainer_that_cannot_be_built_is_a_classified_result(monkeypatch: pytest.MonkeyPatch) -> None:
    # TrainingArguments refusing an option this transformers lacks, say: the probe used to raise out
    # of run_probe_in_process, and main() wrote a result without the environment or any metric
    def refuse(*a: Any, **kw: Any) -> Any:
        raise ValueError("optim 'adamw_torch_fused' is not available in this transformers")

    monkeypatch.setattr(worker, "_training_args", refuse)
    res = worker.run_probe_in_process(_tiny(), launch_time=time.time())
    assert res.status == "crash"
    assert res.reason.startswith("building the Trainer: ") and "adamw_torch_fused" in res.reason
    assert res.env["device_type"] == "cpu" and res.metrics["build_s"] > 0
    assert res.metrics["peak_mem_bytes"] is not None and "window" in res.metrics


def test_a_data_error_building_the_trainer_is_a_crash_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.errors import DatasetError
    from autotune.probe import data

    def no_data(*a: Any, **kw: Any) -> Any:
        raise DatasetError("no rows left after filtering")

    monkeypatch.setattr(data, "build_train_data", no_data)
    res = worker.run_probe_in_process(_tiny(), launch_time=time.time())
    assert res.status == "crash" and res.reason == "data: no rows left after filtering"


def test_an_unsupported_configuration_stops_before_the_meter_starts() -> None:
    req = _tiny()
    req = ProbeRequest(req.workload, Candidate(precision="fp16"), req.settings)
    res = worker.run_probe_in_process(req, launch_time=time.time())
    assert res.status == "unsupported" and "fp16" in res.reason
    assert res.env["device_type"] == "cpu" and "rss_baseline_bytes" not in res.metrics


def test_a_trl_lora_probe_counts_the_adapter_among_its_parameters() -> None:
    # SFTTrainer applies lora_config.json itself: the parameters counted at the build were the base
    # alone, while the trainable ones (counted after) were the adapter's, so "N (M trainable)" did
    # not add up as the hf probe's does
    pytest.importorskip("trl")
    from transformers import AutoConfig, AutoModelForCausalLM

    req = _tiny(mode="lora", trainer="trl", tokenizer=str(TINY_CHAT))
    res = worker.run_probe_in_process(req, launch_time=time.time())
    assert res.status == "ok", res.reason
    base = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(req.workload.model_path))
               .parameters())  # fmt: skip
    m = res.metrics
    assert 0 < m["trainable_params"] < base
    assert m["num_params"] == base + m["trainable_params"]
    assert m["lora_target_modules"] == list(req.workload.lora_targets)  # the targets tiny-llama has
