"""Partial activation checkpointing (``ckpt_every``: one decoder layer in k recomputed), the lever added
through the registry: declared once (``autotune.spec.levers``), run by the probe through the Trainer's own
``activation_checkpointing_kwargs``, searched, planned, emitted, written back, and held where a format
cannot carry it. The CPU measurement is ``benchmarks/partial_checkpointing.py``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from _fakes import FakeExecutor

from autotune.env import training_fields
from autotune.estimate import arch_from_config, estimate_memory, find_gpu, plan, predict_speed
from autotune.formats import read_config, tuned_file, unexpressed_levers
from autotune.formats.axolotl import axolotl_config
from autotune.formats.training_args import emitted_training_args, to_request
from autotune.models import resolve_model
from autotune.run import RunRequest, plan_search, read_request
from autotune.search._walk import FollowUps
from autotune.spec.capabilities import DroppedChoice, choice_problem, drop_dependants, filter_space
from autotune.spec.levers import LEVERS, inactive
from autotune.spec.probe_request import Candidate, ProbeRequest, ProbeSettings, Workload
from autotune.spec.space import parse_space
from autotune.spec.trial import candidate_id, candidate_label

CKPT = Candidate(micro_batch=2, grad_accum=4, grad_ckpt=True)


# ------------------------------------------------------------------------------ the declaration


def test_it_is_declared_once_and_acts_only_under_checkpointing() -> None:
    lever = LEVERS["ckpt_every"]
    assert (lever.default, lever.hf_default, lever.values, lever.ordered) == (1, 1, (1, 2, 4), True)
    assert inactive("ckpt_every", {"grad_ckpt": False}) and not inactive("ckpt_every", {"grad_ckpt": True})
    assert Candidate(grad_ckpt=True, ckpt_every=3).problems() == ["ckpt_every must be 1, 2 or 4; got 3"]
    assert candidate_label(dataclasses.replace(CKPT, ckpt_every=2)).split()[1] == "ckpt/2"
    assert candidate_label(CKPT).split()[1] == "ckpt"


def test_a_candidate_at_the_default_keeps_the_id_stored_runs_and_landscapes_hold() -> None:
    """Ids were stored before the lever existed (journals, recorded landscapes): at its default it is left
    out of the hash; away from it the id differs."""
    fields = {k: v for k, v in dataclasses.asdict(CKPT).items() if k != "ckpt_every"}
    before = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    assert candidate_id(CKPT) == before
    assert candidate_id(dataclasses.replace(CKPT, ckpt_every=2)) != before


# ------------------------------------------------------------------------------ the probe and the files


def _request(c: Candidate, device: str = "cpu") -> ProbeRequest:
    return ProbeRequest(candidate=c, workload=Workload(model="tiny-llama", seq_len=64),
                        settings=ProbeSettings(device=device))


def test_the_training_arguments_carry_it_and_read_it_back() -> None:
    fields = training_fields()[0]
    assert fields is not None
    targs = emitted_training_args(_request(dataclasses.replace(CKPT, ckpt_every=2)), fields=fields, device="cpu")
    key = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    assert targs[key] is True and targs[f"{key}_kwargs"] == {"use_reentrant": False, "every_n_layers": 2}
    assert to_request(targs)["ckpt_every"] == 2
    every_layer = emitted_training_args(_request(CKPT), fields=fields, device="cpu")
    assert every_layer[f"{key}_kwargs"] == {"use_reentrant": False}  # as before the lever existed


def test_the_trainer_checkpoints_one_layer_in_k(tmp_path: Path) -> None:
    """What the probe runs: the emitted TrainingArguments through transformers' Trainer, one step."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    resolved = resolve_model("tiny-llama")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolved.path))
    fields = training_fields()[0]
    assert fields is not None
    targs = emitted_training_args(_request(dataclasses.replace(CKPT, micro_batch=1, grad_accum=1, ckpt_every=2)),
                                  fields=fields, device="cpu")
    ids = torch.randint(3, 100, (2, 16))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to="none", save_strategy="no",
                             **{k: v for k, v in targs.items() if k not in ("report_to", "save_strategy")})
    Trainer(model=model, args=args, train_dataset=data).train()
    flags = [layer.gradient_checkpointing for layer in model.model.layers]
    assert flags == [i % 2 == 0 for i in range(len(flags))] and len(flags) == 4


def test_axolotl_and_llamafactory_files_say_they_checkpoint_every_layer() -> None:
    c = dataclasses.replace(CKPT, ckpt_every=2)
    cfg, notes = axolotl_config(c, Workload(model="tiny-llama", seq_len=64), device="cpu")
    assert "every_n_layers" not in json.dumps(cfg)
    assert any(n.startswith("ckpt_every: measured at 2") and "checkpoints every decoder layer" in n for n in notes)
    _, plain = axolotl_config(CKPT, Workload(model="tiny-llama", seq_len=64), device="cpu")
    assert not any(n.startswith("ckpt_every") for n in plain)


# ------------------------------------------------------------------------------ the write-back


TA_MAPPING = '{"per_device_train_batch_size": 2, "gradient_checkpointing": true,\n' \
             ' "gradient_checkpointing_kwargs": {"use_reentrant": false}, "output_dir": "o"}\n'
TA_PLAIN = '{"per_device_train_batch_size": 2, "gradient_checkpointing": true, "output_dir": "o"}\n'
LF = "model_name_or_path: tiny-llama\nstage: sft\nfinetuning_type: lora\ncutoff_len: 64\nlora_rank: 8\n"


def test_what_a_file_cannot_carry_is_named() -> None:
    assert "LLaMA-Factory has no key" in unexpressed_levers(read_config("lf.yaml", LF))["ckpt_every"]
    assert "kwargs" in unexpressed_levers(read_config("ta.json", TA_MAPPING))["ckpt_every"]
    assert "ckpt_every" not in unexpressed_levers(read_config("ta.json", TA_PLAIN))
    text, _ = tuned_file(read_config("ta.json", TA_PLAIN), dataclasses.asdict(dataclasses.replace(CKPT, ckpt_every=2)),
                         fields=training_fields()[0])
    assert '"every_n_layers": 2' in text


def test_a_write_back_search_holds_what_the_file_cannot_carry(tmp_path: Path) -> None:
    space = tmp_path / "s.yaml"
    space.write_text("micro_batch: [1, 2]\ngrad_ckpt: [false, true]\nckpt_every: [1, 2]\nprecision: [fp32]\n")
    src = tmp_path / "lf.yaml"
    src.write_text(LF)
    base: dict[str, Any] = dict(gpu_budget="8GB", device="cpu", space=str(space), out=tmp_path / "o",
                                executor=FakeExecutor(), load_monitor=False, effective_batch=4)
    held = plan_search(read_request(RunRequest.from_file(src, **base)))
    assert held.space.ckpt_every == (1,)
    (drop,) = [d for d in held.dropped if d.knob == "ckpt_every"]
    assert drop.value == 2 and "LLaMA-Factory has no key" in drop.reason
    free = plan_search(read_request(RunRequest(model="tiny-llama", **base)))
    assert free.space.ckpt_every == (1, 2) and free.key != held.key


# ------------------------------------------------------------------------------ where it can run


def test_a_transformers_without_every_n_layers_drops_it_before_the_search() -> None:
    assert "every_n_layers" in (choice_problem("ckpt_every", 2, {"partial_ckpt": False}) or "")
    assert choice_problem("ckpt_every", 2, {"partial_ckpt": True}) is None
    assert choice_problem("ckpt_every", 1, {"partial_ckpt": False}) is None
    space = parse_space({"grad_ckpt": [False, True], "ckpt_every": [1, 2, 4]})
    kept, dropped = filter_space(space, {"device": "cpu", "partial_ckpt": False})
    assert kept.ckpt_every == (1,) and [d.value for d in dropped if d.knob == "ckpt_every"] == [2, 4]


def test_what_acts_under_a_dropped_choice_goes_with_it() -> None:
    kept = {"grad_ckpt": (False,), "ckpt_every": (1, 2), "zero_stage": (0, 1), "offload": ("none", "params"),
            "sharding": ("deepspeed",)}
    dropped = drop_dependants(kept)
    assert kept["ckpt_every"] == (1,) and kept["offload"] == ("none",)
    assert DroppedChoice("ckpt_every", 2, "ckpt_every 2 acts only with grad_ckpt True, which was dropped") in dropped
    assert any(d.knob == "offload" and d.value == "params" and "zero_stage 3" in d.reason for d in dropped)


# ------------------------------------------------------------------------------ the models and the planner


def test_the_memory_and_speed_models_place_it_between_off_and_every_layer() -> None:
    resolved = resolve_model("llama-3.1-8b")
    arch = arch_from_config(resolved.config)
    wl = Workload(model="llama-3.1-8b", seq_len=4096, mode="lora")
    gpu = find_gpu("A100-40GB")
    ladder = [Candidate(micro_batch=1, grad_accum=32, precision="bf16")] + [
        Candidate(micro_batch=1, grad_accum=32, precision="bf16", grad_ckpt=True, ckpt_every=k) for k in (4, 2, 1)]
    acts = [estimate_memory(arch, wl, c, device="cuda", gpu=gpu).terms["activations"] for c in ladder]
    steps = [predict_speed(arch, wl, c, gpu).step_time_s for c in ladder]
    assert acts == sorted(acts, reverse=True) and len(set(acts)) == 4  # less memory at each step of the dial
    assert steps == sorted(steps) and len(set(steps)) == 4  # and more time


def test_the_planner_checkpoints_part_of_the_layers_where_that_is_faster() -> None:
    """8B LoRA at seq 4096 on one A100-40GB: one layer in 4 at micro-batch 1 is predicted faster than every
    layer at the micro-batch full checkpointing allows (the recompute costs LoRA half its 4N FLOPs)."""
    resolved = resolve_model("llama-3.1-8b")
    kw: dict[str, Any] = dict(seq_len=4096, effective_batch=32, mode="lora", gpus=[find_gpu("A100-40GB")],
                              gpus_per_node=1)
    free = plan(resolved.config, **kw).rows[0].option
    full = plan(resolved.config, **kw, pin={"ckpt_every": 1}).rows[0].option
    assert free is not None and full is not None
    assert (free.candidate.grad_ckpt, free.candidate.ckpt_every) == (True, 4)
    assert free.speed.tokens_per_s > full.speed.tokens_per_s and "checkpointing (1 layer in 4)" in free.levers


# ------------------------------------------------------------------------------ the search


def test_the_walk_steps_the_checkpointed_share_and_settles_it_when_checkpointing_goes() -> None:
    walk = FollowUps(choices={"micro_batch": [1, 2, 4], "grad_ckpt": [False, True], "ckpt_every": [1, 2]},
                     micro_batches=[1, 2, 4], grad_ckpt_choices=(False, True), effective_batch=8,
                     in_space=lambda c: True, records=lambda: [])
    on = Candidate(micro_batch=2, grad_accum=4, grad_ckpt=True)
    assert [c.ckpt_every for c in walk.one_knob_changes(on)] == [2]
    assert walk.one_knob_changes(dataclasses.replace(on, grad_ckpt=False)) == []  # it does nothing then
    off = [c for c in walk.boundary_moves(dataclasses.replace(on, ckpt_every=2)) if not c.grad_ckpt]
    assert [c.ckpt_every for c in off] == [1]  # one candidate, one id, for one measurement


def test_check_reads_it_back_from_an_emitted_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autotune.cli.app import app

    fields = training_fields()[0]
    assert fields is not None
    targs = emitted_training_args(_request(dataclasses.replace(CKPT, ckpt_every=2)), fields=fields, device="cpu")
    (tmp_path / "training_args.json").write_text(json.dumps(targs))
    res = CliRunner().invoke(app, ["check", str(tmp_path / "training_args.json"), "--json"])
    items = {i["id"]: i for i in json.loads(res.stdout)["items"]}
    assert "one layer in 2" in items["memory_levers"]["message"], items["memory_levers"]


def test_a_trainingarguments_write_back_holds_packing_it_cannot_carry() -> None:
    """The same rule for an older lever: a TrainingArguments file has no packing key, so a packed winner
    written back would train padded in the user's own script; the search holds packing off instead."""
    assert "pads each micro-batch" in unexpressed_levers(read_config("ta.json", TA_PLAIN))["packing"]
    trl = '{"per_device_train_batch_size": 2, "packing": false, "output_dir": "o", "max_length": 64}\n'
    assert "packing" not in unexpressed_levers(read_config("sft.json", trl))


def test_memory_and_speed_count_the_same_checkpointed_layers() -> None:
    """transformers checkpoints the layers whose index is a multiple of k: ceil(layers / k) of them, which
    the memory model keeps as inputs and the speed model recomputes (26 layers, one in 4: 7, not 6.5)."""
    from autotune.estimate import checkpointed_layers, recomputed

    arch = arch_from_config(resolve_model("gemma-2-2b").config)
    c = Candidate(grad_ckpt=True, ckpt_every=4)
    assert arch.layers == 26 and checkpointed_layers(arch, c) == 7
    assert recomputed(arch, c) == pytest.approx(7 / 26)
    assert recomputed(arch, dataclasses.replace(c, grad_ckpt=False)) == 0.0
    assert recomputed(arch, dataclasses.replace(c, ckpt_every=1)) == 1.0
