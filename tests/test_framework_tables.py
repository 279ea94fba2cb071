"""One lever-to-key table per framework: the file ``emit`` writes and the file ``run --from ... --write-back``
writes agree key by key, and each client reads the packed micro-batch as autotune measured it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from autotune.emit import build_files
from autotune.formats import FORMATS, Measured, read_config, tuned_file, writable_keys
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.result import ProbeResult

transformers = pytest.importorskip("transformers")

FIELDS = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
DATA = Path(__file__).parent / "data" / "formats"
SEQ_LEN, MEAN = 64, 20.0  # a micro-batch of 8 sequences holds 160 real tokens: round(160 / 64) = 2 full rows

# framework -> the emitted file that is also a user's file of that framework
EMITTED = {"training_args": "training_args.json", "trl": "sft_config.json", "axolotl": "axolotl.yaml",
           "llamafactory": "llamafactory.yaml"}
BASE = Candidate(micro_batch=4, grad_accum=2, precision="bf16", optim="adamw_torch")
# one variation per lever (the distributed set-up is held by a write-back: the file's DeepSpeed/FSDP config)
VARIANTS = {
    "micro_batch": {"micro_batch": 8}, "grad_accum": {"grad_accum": 4}, "grad_ckpt": {"grad_ckpt": True},
    "attn-eager": {"attn": "eager"}, "attn-fa2": {"attn": "flash_attention_2"}, "workers": {"workers": 2},
    "pin_memory": {"pin_memory": False}, "fp32": {"precision": "fp32"}, "fp16": {"precision": "fp16"},
    "tf32": {"precision": "tf32"}, "packing": {"packing": True, "micro_batch": 8},
    "optim": {"optim": "adamw_torch_fused"}, "torch_compile": {"torch_compile": True}, "liger": {"liger": True},
}  # fmt: skip
# the other way: from a packed, checkpointed, Liger file back to the plain candidate
REVERSE = dataclasses.replace(BASE, packing=True, micro_batch=8, grad_ckpt=True, liger=True, workers=2,
                              torch_compile=True)
_MISSING = object()


def _best(cand: Candidate, *, mode: str = "lora", device: str = "cuda", mean: float | None = MEAN,
          seq_len: int = SEQ_LEN) -> ProbeResult:
    req = ProbeRequest(workload=Workload(model="tiny", seq_len=seq_len, mode=mode, lora_targets=("q_proj",)),
                       candidate=cand, settings=ProbeSettings(device=device))
    metrics = {"tokens_per_s": 1.0, **({} if mean is None else {"mean_seq_len": mean})}
    return ProbeResult(status="ok", request=req.to_dict(), metrics=metrics)


def _load(name: str, text: str) -> dict:
    return yaml.safe_load(text) if name.endswith(".yaml") else json.loads(text)


def _lever_keys(fmt: str) -> set[str]:
    return {k for keys in FORMATS[fmt].LEVER_KEYS.values() for k in keys}


def _effective(fmt: str, data: dict, key: str):
    return data[key] if key in data else FORMATS[fmt].DEFAULTS.get(key, _MISSING)


def _emitted(fmt: str, best: ProbeResult) -> tuple[str, str]:
    name = EMITTED[fmt]
    return name, build_files(best, fields=FIELDS)[name]


def _inert(after: Candidate) -> set[str]:
    """Keys that change nothing for ``after``: checkpointing's kwargs with checkpointing off, Axolotl's Liger
    plugin with every Liger kernel off (a write-back leaves them as the file has them)."""
    out = set() if after.grad_ckpt else {"gradient_checkpointing_kwargs", "activation_checkpointing_kwargs",
                                         "use_reentrant_gc"}
    return out if after.liger else out | {"plugins"}


def _agree(fmt: str, before: Candidate, after: Candidate, *, device: str, mode: str) -> None:
    name, text = _emitted(fmt, _best(before, device=device, mode=mode))
    cfg = read_config(name, text, fmt=fmt)
    best = _best(after, device=device, mode=mode)
    out, _ = tuned_file(cfg, dataclasses.asdict(after), fields=FIELDS, best=best)
    written, emitted = _load(name, out), _load(name, _emitted(fmt, best)[1])
    bad = {k: (_effective(fmt, written, k), _effective(fmt, emitted, k)) for k in sorted(_lever_keys(fmt) - _inert(after))
           if _effective(fmt, written, k) != _effective(fmt, emitted, k)}
    assert not bad, f"{fmt}: written back != emitted (key: (written back, emitted)): {bad}"


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("lever", sorted(VARIANTS))
@pytest.mark.parametrize("fmt", sorted(EMITTED))
def test_emit_and_write_back_agree_key_by_key(fmt: str, lever: str, device: str) -> None:
    if device == "cpu" and lever == "tf32":
        pytest.skip("TF32 is a GPU mode")
    for mode in ("lora", "full"):
        _agree(fmt, BASE, dataclasses.replace(BASE, **VARIANTS[lever]), device=device, mode=mode)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("fmt", sorted(EMITTED))
def test_emit_and_write_back_agree_from_a_packed_file_back(fmt: str, device: str) -> None:
    _agree(fmt, REVERSE, BASE, device=device, mode="lora")
    _agree(fmt, BASE, REVERSE, device=device, mode="lora")


@pytest.mark.parametrize("fmt", sorted(EMITTED))
def test_lever_values_write_only_the_tables_keys(fmt: str) -> None:
    mod = FORMATS[fmt]
    for cand in [BASE, REVERSE, *(dataclasses.replace(BASE, **v) for v in VARIANTS.values()),
                 Candidate(precision="bf16", world_size=2, zero_stage=3, offload="params"),
                 Candidate(precision="bf16", world_size=2, zero_stage=2, sharding="fsdp", offload="optimizer")]:
        for at in (Measured(device="cuda", mode="lora", seq_len=64, mean_seq_len=MEAN, fields=frozenset(FIELDS)),
                   Measured(device="cpu", mode="full", fields=frozenset(FIELDS))):
            assert set(mod.lever_values(cand, at)) <= _lever_keys(fmt), (fmt, cand)


# ---------------------------------------------------------------- the packed micro-batch, as each client reads it


def _sequences_per_micro_batch(fmt: str, data: dict, seq_len: int, mean: float) -> float:
    """How many sequences of the measured mean length one micro-batch holds when the client reads ``data``:
    Axolotl (sample_packing), LLaMA-Factory (packing/neat_packing) and TRL (packing, bins of max_length)
    count packed ROWS of the sequence length; TRL's padding_free alone and unpacked runs count sequences."""
    batch_key = "micro_batch_size" if fmt == "axolotl" else "per_device_train_batch_size"
    batch = data[batch_key]
    rows = {"axolotl": data.get("sample_packing"), "llamafactory": data.get("packing") or data.get("neat_packing"),
            "trl": data.get("packing")}[fmt]
    return batch * seq_len / mean if rows else batch


# the user's own files, their sequence length held by the run
USER_FILES = {"axolotl": "axolotl_lora.yaml", "llamafactory": "lf_lora_sft.yaml", "trl": "trl_sft.yaml"}


@pytest.mark.parametrize("fmt", sorted(USER_FILES))
def test_write_back_of_a_packed_winner_holds_the_measured_micro_batch(fmt: str) -> None:
    """A packed winner of 8 sequences per micro-batch: the written-back batch counts the client's rows (as the
    emitted file does), not the 8 sequences, which the client would read as 8 rows of several sequences each."""
    name = USER_FILES[fmt]
    cfg = read_config(name, (DATA / name).read_text(), fmt=fmt)
    seq_len, mode = cfg.request["seq_len"], cfg.request.get("mode", "full")
    mean = seq_len / 4  # four measured sequences fill one row
    cand = Candidate(micro_batch=8, grad_accum=1, precision="fp32", packing=True)
    best = _best(cand, mode=mode, seq_len=seq_len, mean=mean)
    written = yaml.safe_load(tuned_file(cfg, dataclasses.asdict(cand), fields=FIELDS, best=best)[0])
    emitted = yaml.safe_load(build_files(best, fields=FIELDS)[EMITTED[fmt]])
    for data in (written, emitted):
        assert _sequences_per_micro_batch(fmt, data, seq_len, mean) == pytest.approx(8, abs=4 / 2)
    key = "micro_batch_size" if fmt == "axolotl" else "per_device_train_batch_size"
    assert written[key] == emitted[key] == 2


def test_write_back_keeps_trls_padding_free_where_the_batch_counts_sequences() -> None:
    text = (DATA / "trl_sft.yaml").read_text().replace("packing: false", "padding_free: false")
    cfg = read_config("t.yaml", text, fmt="trl")
    cand = Candidate(micro_batch=8, precision="fp32", packing=True)
    out = yaml.safe_load(tuned_file(cfg, dataclasses.asdict(cand), fields=FIELDS,
                                    best=_best(cand, mode="full", seq_len=512, mean=128.0))[0])
    assert out["padding_free"] is True and "packing" not in out
    assert _sequences_per_micro_batch("trl", out, 512, 128.0) == out["per_device_train_batch_size"] == 8


def test_trl_loads_the_written_back_packed_file_as_measured(tmp_path: Path) -> None:
    trl = pytest.importorskip("trl")
    name, text = _emitted("trl", _best(BASE, device="cpu", mode="full"))
    cfg = read_config(name, text.replace('"bf16": true', '"bf16": false'), fmt="trl")
    cand = dataclasses.replace(BASE, packing=True, micro_batch=8, precision="fp32")
    out = json.loads(tuned_file(cfg, dataclasses.asdict(cand), fields=FIELDS,
                                best=_best(cand, device="cpu", mode="full"))[0])
    sft = trl.SFTConfig(output_dir=str(tmp_path), **out)
    assert (sft.packing, sft.packing_strategy, sft.max_length) == (True, "bfd", SEQ_LEN)
    assert sft.per_device_train_batch_size == round(8 * MEAN / SEQ_LEN)


def test_an_unpacked_winner_turns_axolotls_padding_to_sequence_len_off() -> None:
    """The probe pads an unpacked micro-batch to its longest sequence; pad_to_sequence_len pads to sequence_len."""
    cfg = read_config("a.yaml", (DATA / "axolotl_lora.yaml").read_text())
    cand = Candidate(micro_batch=2, grad_accum=4, precision="bf16", grad_ckpt=True)
    _, updates = tuned_file(cfg, dataclasses.asdict(cand), best=_best(cand, seq_len=128))
    assert updates["pad_to_sequence_len"] is False and "micro_batch_size" not in updates


@pytest.mark.parametrize("name", ["axolotl_lora.yaml", "lf_lora_sft.yaml", "trl_sft.yaml", "ta.yaml"])
def test_the_keys_checked_before_the_search_cover_the_write_back(name: str) -> None:
    cfg = read_config(name, (DATA / name).read_text())
    keys = writable_keys(cfg, fields=FIELDS)
    for cand in (REVERSE, *(dataclasses.replace(BASE, **v) for v in VARIANTS.values())):
        for device in ("cuda", "cpu"):
            best = _best(cand, device=device, seq_len=cfg.request.get("seq_len", SEQ_LEN))
            assert set(tuned_file(cfg, dataclasses.asdict(cand), fields=FIELDS, best=best)[1]) <= keys


def test_training_arguments_lever_keys_are_fields_of_the_installed_transformers() -> None:
    assert _lever_keys("training_args") <= FIELDS | {"gradient_checkpointing", "gradient_checkpointing_kwargs"}


@pytest.mark.parametrize("name,fmt", [("axolotl_lora.yaml", "axolotl"), ("lf_lora_sft.yaml", "llamafactory"),
                                      ("trl_sft.yaml", "trl"), ("ta.yaml", "training_args")])
@pytest.mark.parametrize("tf32", [False, True, None], ids=["tf32-false", "tf32-true", "no-tf32"])
def test_a_cpu_answer_written_back_leaves_tf32_as_the_file_has_it(name: str, fmt: str, tf32: bool | None) -> None:
    """TF32 is a GPU mode: a CPU measurement says nothing about it, so a bf16 CPU winner written back neither
    turns a file's ``tf32: false`` on (it did, for Axolotl) nor adds the key; the device itself is written
    (``use_cpu``, where the format has it)."""
    text = (DATA / name).read_text()
    text = "\n".join(line for line in text.splitlines() if not line.startswith("tf32:")) + "\n"
    if tf32 is not None:
        text += f"tf32: {'true' if tf32 else 'false'}\n"
    cfg = read_config(name, text, fmt=fmt)
    winner = dataclasses.replace(BASE, precision="bf16")
    best = _best(winner, device="cpu", seq_len=cfg.request.get("seq_len", SEQ_LEN))
    out, updates = tuned_file(cfg, dataclasses.asdict(winner), fields=FIELDS, best=best)
    assert "tf32" not in updates, updates
    assert yaml.safe_load(out).get("tf32") == tf32
    if fmt != "axolotl":
        assert yaml.safe_load(out).get("use_cpu") is True
