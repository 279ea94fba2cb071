"""Probe training data: length specs, datasets + cache, padding/packing collators, isolation."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pytest
import torch

from autotune.errors import DatasetError, SpecError
from autotune.probe import data as D
from autotune.probe import tokenize_cache
from autotune.probe.collate import (
    IGNORE_INDEX,
    REAL_TOKENS_KEY,
    SEQUENCES_KEY,
    PackingCollator,
    PaddingCollator,
    pop_counts,
)
from autotune.probe.data import build_train_data, load_token_sequences
from autotune.spec.lengths import (
    LengthDistribution,
    batch_layout,
    histogram_from_lengths,
    histogram_from_mapping,
    iter_lengths,
    pack_first_fit,
    parse_lengths,
    sample_lengths,
)
from autotune.spec.probe_request import Candidate, Workload

# ------------------------------------------------------------------ length specs


def test_parse_each_form(tmp_path: Path) -> None:
    assert parse_lengths("fixed").kind == "fixed"
    d = parse_lengths(" lognormal:3.5, 1.0 ")
    assert (d.kind, d.mu, d.sigma) == ("lognormal", 3.5, 1.0)
    d = parse_lengths("uniform:32-512")
    assert (d.kind, d.lo, d.hi) == ("uniform", 32, 512)
    f = tmp_path / "h.json"
    f.write_text(json.dumps({"bins": [1, 10, 100], "counts": [3, 1]}))
    d = parse_lengths(f"histogram:{f}")
    assert (d.kind, d.bins, d.counts) == ("histogram", (1, 10, 100), (3.0, 1.0))
    f.write_text(json.dumps({"lengths": [5, 7, 9]}))
    d = parse_lengths(f"histogram:{f}")
    assert (d.kind, d.lengths) == ("empirical", (5, 7, 9))
    assert parse_lengths(d) is d


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "non-empty"),
        ("gauss:1,2", "unknown kind 'gauss'.*accepted: fixed, lognormal"),
        ("fixed:12", "fixed takes no argument"),
        ("lognormal:3.5", "two numbers MU,SIGMA"),
        ("lognormal:a,1", "MU must be a number"),
        ("lognormal:3,-1", "SIGMA must be >= 0"),
        ("lognormal:nan,1", "MU must be finite"),
        ("uniform:10", "integer range LO-HI"),
        ("uniform:20-10", "1 <= LO <= HI"),
        ("uniform:0-10", "1 <= LO <= HI"),
        ("uniform:x-10", "LO must be an integer"),
        ("histogram:", "needs a path"),
        ("histogram:/nonexistent/h.json", "does not exist"),
    ],
)
def test_parse_errors(text: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        parse_lengths(text)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json", "cannot read histogram file"),
        ("[1, 2]", "top level must be a JSON object"),
        ('{"bins": [1, 2, 3]}', "missing 'bins'/'counts'"),
        ('{"bins": [1, 2, 3], "counts": [1]}', r"len\(counts\) == len\(bins\) - 1"),
        ('{"bins": [5, 2], "counts": [1]}', "strictly increasing"),
        ('{"bins": [1, 2.5], "counts": [1]}', "bin edges must be integers"),
        ('{"bins": [1, 2], "counts": [-1]}', "counts must be numbers >= 0"),
        ('{"bins": [1, 2], "counts": [0]}', "all zero"),
        ('{"lengths": []}', "non-empty list"),
        ('{"lengths": [3, 0]}', "positive integers"),
    ],
)
def test_histogram_file_errors(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "h.json"
    f.write_text(content)
    with pytest.raises(SpecError, match=match):
        parse_lengths(f"histogram:{f}")


def test_lengths_that_all_reach_seq_len_are_fixed_length_data() -> None:
    """uniform:70-80 under --seq-len 64: every row is cut to 64, fixed-length data; packing was searched on it."""
    from autotune.spec.probe_request import Workload

    assert parse_lengths("uniform:70-80").min_length(64) == 64 and parse_lengths("uniform:32-512").min_length(64) == 32
    assert not Workload("m", seq_len=64, lengths="uniform:70-80").variable_lengths
    assert Workload("m", seq_len=64, lengths="uniform:32-80").variable_lengths
    assert Workload("m", seq_len=64, lengths="lognormal:5,0.1").variable_lengths  # (no shortest: may be short)
    assert Workload("m", seq_len=64, lengths="fixed", dataset="d").variable_lengths


def test_rows_of_a_packed_dataset_hold_the_micro_batchs_sequences_at_the_packers_fill() -> None:
    """TRL, Axolotl and LLaMA-Factory count rows of a dataset packed ahead of training, and rows are never full: at
    full rows, 4 rows held 6.7 sequences of a chat set for a micro-batch of 8 (its rows were 86 % full)."""
    from autotune.formats import Measured, packed_sequence_tokens
    from autotune.formats._common import packed_rows
    from autotune.spec.lengths import packing_fill

    assert packing_fill([64] * 10, seq_len=64) == 1.0 and packing_fill([], seq_len=64) is None
    assert packing_fill([40] * 10, seq_len=64) == pytest.approx(40 / 64)  # one per row: 24 tokens of each left
    assert packing_fill([100, 30], seq_len=64) == pytest.approx((64 + 30) / 128)  # cut to seq_len, as the packers do
    metrics = {"mean_seq_len": 33.8, "pack_fill": 0.857}
    assert packed_sequence_tokens(metrics) == pytest.approx(33.8 / 0.857)
    assert packed_sequence_tokens({"mean_seq_len": 33.8}) == 33.8  # an older result: full rows
    at = Measured(seq_len=64, mean_seq_len=packed_sequence_tokens(metrics))
    assert packed_rows(8, at) == 5 and packed_rows(8, Measured(seq_len=64, mean_seq_len=33.8)) == 4


def test_the_packed_rows_are_counted_on_the_data_not_on_the_longest_first_sequences_a_probe_consumed(tmp_path) -> None:
    """A probe's first micro-batch holds the longest sequences (its worst case): its consumed mean leans long, and
    rows counted on it held more sequences than the micro-batch (lognormal(6, 1) at 4,096 tokens, a micro-batch of
    8: 1.7 rows for the data's 1.3). The rows the emitted files hold come from the whole data."""
    from autotune.formats import Measured, packed_sequence_tokens
    from autotune.formats._common import packed_rows
    from autotune.probe.data import data_shape

    wl = Workload(model="m", seq_len=4096, lengths="lognormal:6,1", seed=42)
    cand = Candidate(micro_batch=8, grad_accum=2, packing=True)
    td = build_train_data(wl, cand, num_optimizer_steps=7, vocab_size=50, pad_token_id=0)
    whole = sample_lengths("lognormal:6,1", 20000, 4096, seed=1)
    assert td.info["mean_seq_len"] == pytest.approx(sum(whole) / len(whole), rel=0.05)
    assert td.info["consumed_mean_seq_len"] > 1.2 * td.info["mean_seq_len"]  # 8 of 112 at 4,096
    rows = packed_rows(8, Measured(seq_len=4096, mean_seq_len=packed_sequence_tokens(td.info)))
    assert rows == round(8 * sum(whole) / len(whole) / 4096 / td.info["pack_fill"]) == 1
    # a dataset: every sequence it holds, as TRL's probe reads it
    lens = [5, 6, 7, 60, 61, 62, 63, 64]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input_ids": list(range(1, n + 1))}) + "\n" for n in lens))
    td = build_train_data(Workload(model="m", seq_len=64, dataset=str(data)), Candidate(micro_batch=2, packing=True),
                          num_optimizer_steps=1, vocab_size=100, pad_token_id=0, cache_dir=tmp_path / "c")
    assert td.info["mean_seq_len"] == pytest.approx(sum(lens) / len(lens))
    assert td.info["consumed_mean_seq_len"] == pytest.approx((64 + 63) / 2)  # the two longest, first
    assert td.info["pack_fill"] == data_shape(lens, seq_len=64)["pack_fill"]


def test_sampling_is_deterministic_and_clipped() -> None:
    a = sample_lengths("lognormal:3.5,1.0", 500, 256, seed=7)
    assert a == sample_lengths("lognormal:3.5,1.0", 500, 256, seed=7)
    assert a != sample_lengths("lognormal:3.5,1.0", 500, 256, seed=8)
    assert min(a) >= 16 and max(a) <= 256 and 256 in a  # long tail reaches the clip
    assert sample_lengths("fixed", 3, 100, seed=0) == [100, 100, 100]
    u = sample_lengths("uniform:10-20", 300, 15, seed=1)
    assert set(u) <= set(range(10, 16)) and 15 in u and 10 in u
    # global random state is neither used nor disturbed
    import random

    random.seed(0)
    x = random.random()
    random.seed(0)
    sample_lengths("uniform:1-9", 10, 9, seed=3)
    assert random.random() == x
    with pytest.raises(SpecError, match="seq_len must be a positive integer"):
        sample_lengths("fixed", 3, 0, seed=0)


def test_histogram_sampling_and_roundtrip() -> None:
    d = histogram_from_mapping({"bins": [10, 20, 40], "counts": [1, 0]})
    s = sample_lengths(d, 200, 512, seed=0)
    assert set(s) <= set(range(10, 20))
    assert d.max_length(512) == 20 and d.max_length(15) == 15
    obs = sample_lengths("lognormal:3.5,1.0", 2000, 512, seed=2)
    h = histogram_from_lengths(obs, num_bins=16)
    assert sum(h["counts"]) == 2000 and h["bins"][0] == min(obs) and h["bins"][-1] == max(obs)
    d2 = histogram_from_mapping(h)
    s2 = sample_lengths(d2, 2000, 512, seed=3)
    assert min(obs) <= min(s2) and max(s2) <= max(obs)
    med = sorted(obs)[1000]
    assert abs(sorted(s2)[1000] - med) < 0.25 * med  # the shape survives
    assert histogram_from_lengths([5, 5]) == {"bins": [5, 6], "counts": [2]}
    with pytest.raises(SpecError, match="no \\(positive\\) lengths"):
        histogram_from_lengths([])


def test_iter_lengths_validates_eagerly() -> None:
    with pytest.raises(SpecError, match="unknown kind"):
        iter_lengths("nope", 10, 0)
    assert isinstance(parse_lengths("fixed"), LengthDistribution)


# ------------------------------------------------------------------ collators


def _items(lengths: list[int], vocab: int = 100) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(1, vocab, (n,), generator=g)} for n in lengths]


def test_padding_collator_counts_real_tokens() -> None:
    items = _items([8, 8, 2, 14])
    batch = PaddingCollator(pad_token_id=0)(items)
    assert batch["input_ids"].shape == (4, 14)
    assert int(batch[REAL_TOKENS_KEY]) == 32  # of 56 slots: 24 are padding
    assert batch[REAL_TOKENS_KEY].dtype == torch.int64 and batch[REAL_TOKENS_KEY].ndim == 0
    assert int(batch["attention_mask"].sum()) == 32
    assert int((batch["labels"] == IGNORE_INDEX).sum()) == 24
    assert torch.equal(batch["input_ids"][2, :2], items[2]["input_ids"])
    assert batch["input_ids"][2, 2:].eq(0).all() and batch["labels"][2, 2:].eq(-100).all()
    assert torch.equal(batch["labels"][3], items[3]["input_ids"])
    assert pop_counts(batch).real_tokens == 32 and REAL_TOKENS_KEY not in batch
    assert pop_counts(batch).real_tokens == 32  # fallback: 2D attention mask
    assert PaddingCollator(0, pad_to_multiple_of=8)(items)["input_ids"].shape == (4, 16)


def test_packing_collator_4d_mask_and_labels() -> None:
    a, b, c = torch.arange(1, 6), torch.arange(11, 14), torch.arange(21, 25)
    feats = [{"input_ids": a}, {"input_ids": b}, {"input_ids": c}]
    batch = PackingCollator(seq_len=10, pad_token_id=0, attn="sdpa", mask_dtype=torch.float16)(feats)
    # first-fit decreasing: a (5) + c (4) share row 0 (9 <= 10), b (3) opens row 1; width = longest row
    m = batch["attention_mask"]
    assert m.shape == (2, 1, 9, 9) and m.dtype == torch.float16
    assert batch["input_ids"][0].tolist() == [*a.tolist(), *c.tolist()]
    assert batch["input_ids"][1].tolist() == [*b.tolist(), 0, 0, 0, 0, 0, 0]
    allowed = m[:, 0] == 0
    assert allowed[0, 4, :5].all() and not allowed[0, 4, 5:].any()  # seq a: causal within itself
    assert allowed[0, 8, 5:9].all() and not allowed[0, 8, :5].any()  # seq c never sees seq a
    assert not allowed[0, 2, 3]  # causal
    assert allowed[1, 5, 5] and not allowed[1, 5, :5].any()  # padding: itself only
    assert (m[:, 0][~allowed] == torch.finfo(torch.float16).min).all()
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert batch["labels"][0].tolist() == [-100, 2, 3, 4, 5, -100, 22, 23, 24]
    assert batch["labels"][1].tolist() == [-100, 12, 13] + [-100] * 6
    assert int(batch[REAL_TOKENS_KEY]) == 12 and int(batch[SEQUENCES_KEY]) == 3
    # the loss terms the Trainer counts (labels[..., 1:] != -100) equal the padded batch's
    padded = PaddingCollator(0)(feats)
    assert int((batch["labels"][..., 1:] != -100).sum()) == int((padded["labels"][..., 1:] != -100).sum()) == 9
    assert int(padded[SEQUENCES_KEY]) == 3


@pytest.mark.parametrize("attn", ["flash_attention_2", "flex_attention"])
def test_packing_collator_flat(attn: str) -> None:
    rows = [
        {"input_ids": torch.arange(1, 8), "position_ids": torch.tensor([0, 1, 2, 0, 1, 2, 3])},
        {"input_ids": torch.arange(20, 25), "position_ids": torch.arange(5)},
    ]
    batch = PackingCollator(seq_len=8, attn=attn)(rows)
    assert batch["input_ids"].shape == (1, 12) and "attention_mask" not in batch
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4]
    assert (batch["labels"][0] == -100).nonzero().reshape(-1).tolist() == [0, 3, 7]
    assert batch["use_cache"] is False
    assert int(batch[SEQUENCES_KEY]) == 3  # a feature that is already packed counts its sequences
    assert pop_counts(batch).real_tokens == 12 and SEQUENCES_KEY not in batch


def test_collators_and_dataset_pickle() -> None:
    td = build_train_data(
        Workload(model="m", seq_len=64, lengths="uniform:5-40"),
        Candidate(micro_batch=2, packing=True),
        num_optimizer_steps=2,
        vocab_size=50,
        pad_token_id=0,
        mask_dtype=torch.bfloat16,
    )
    ds2, col2 = pickle.loads(pickle.dumps((td.dataset, td.collator)))
    b1 = td.collator([td.dataset[0], td.dataset[1]])
    b2 = col2([ds2[0], ds2[1]])
    assert b1.keys() == b2.keys() and all(torch.equal(b1[k], b2[k]) for k in b1)
    assert b2["attention_mask"].dtype == torch.bfloat16


# ------------------------------------------------------------------ build_train_data


@pytest.mark.parametrize("packing", [False, True])
def test_build_item_count_and_determinism(packing: bool) -> None:
    wl = Workload(model="m", seq_len=128, lengths="lognormal:3.5,1.0", seed=3)
    cand = Candidate(micro_batch=3, grad_accum=2, packing=packing)
    kw = {"num_optimizer_steps": 4, "vocab_size": 97, "pad_token_id": 0, "world_size": 2}
    td = build_train_data(wl, cand, **kw)
    assert len(td.dataset) == td.num_items == 4 * 2 * 3 * 2
    assert td.items_per_step == 12 and td.token_slots_per_step == 12 * 128
    td2 = build_train_data(wl, cand, **kw)
    for i in (0, 5, len(td.dataset) - 1):
        assert all(torch.equal(td.dataset[i][k], td2.dataset[i][k]) for k in td.dataset[i])
    ids = torch.cat([td.dataset[i]["input_ids"] for i in range(len(td.dataset))])
    assert ids.min() >= 0 and ids.max() < 97
    assert td.real_tokens_total == ids.numel()
    other = build_train_data(
        Workload(model="m", seq_len=128, lengths="lognormal:3.5,1.0", seed=4), cand, **kw
    )
    assert not torch.equal(other.dataset[3]["input_ids"], td.dataset[3]["input_ids"])
    assert td.mode == ("packing" if packing else "padding")
    by_candidate = build_train_data(
        wl, Candidate(micro_batch=3, world_size=2), num_optimizer_steps=1, vocab_size=9, pad_token_id=0
    )
    assert by_candidate.num_items == 6  # world_size defaults to candidate.world_size


def test_padding_worst_case_first() -> None:
    td = build_train_data(
        Workload(model="m", seq_len=96, lengths="uniform:4-40"),
        Candidate(micro_batch=2, grad_accum=2),
        num_optimizer_steps=3,
        vocab_size=50,
        pad_token_id=0,
        world_size=2,
    )
    assert [len(td.dataset[i]["input_ids"]) for i in range(4)] == [40] * 4  # mb x world_size
    assert all(len(td.dataset[i]["input_ids"]) <= 40 for i in range(len(td.dataset)))
    td = build_train_data(
        Workload(model="m", seq_len=96, lengths="uniform:4-40"),
        Candidate(micro_batch=2),
        num_optimizer_steps=3,
        vocab_size=50,
        pad_token_id=0,
        worst_case_first=False,
    )
    assert len(td.dataset[0]["input_ids"]) < 40


@pytest.mark.parametrize("spec", ["lognormal:3.5,1.0", "uniform:1-64", "fixed", "uniform:30-34"])
@pytest.mark.parametrize("attn", ["sdpa", "flash_attention_2"])
def test_packing_keeps_micro_batch_sequences_whole(spec: str, attn: str) -> None:
    """micro_batch counts sequences when packing: each micro-batch holds exactly its sequences, whole."""
    seq_len, mb = 64, 4
    wl = Workload(model="m", seq_len=seq_len, lengths=spec, seed=11)
    kw = {"num_optimizer_steps": 3, "vocab_size": 101, "pad_token_id": 0}
    td = build_train_data(wl, Candidate(micro_batch=mb, grad_accum=2, packing=True, attn=attn), **kw)
    padded = build_train_data(wl, Candidate(micro_batch=mb, grad_accum=2), **kw)
    order = td.dataset.order(td.num_items)
    assert order == padded.dataset.order(padded.num_items)  # the same sequences as unpacked
    src = td.dataset.source
    for i in range(0, td.num_items, mb):
        ids = order[i : i + mb]
        feats = [td.dataset[j] for j in ids]
        batch = td.collator(feats)
        assert int(batch[SEQUENCES_KEY]) == mb
        assert int(batch[REAL_TOKENS_KEY]) == sum(src.length(j) for j in ids)
        lens = [src.length(j) for j in ids]
        layout = pack_first_fit(lens, seq_len=seq_len) if attn == "sdpa" else [list(range(len(ids)))]
        assert batch["input_ids"].shape[0] == len(layout)
        segments: list[list[int]] = []
        for r, members in enumerate(layout):
            n = sum(lens[k] for k in members)
            assert n <= (seq_len if attn == "sdpa" else seq_len * mb)
            pos = batch["position_ids"][r, :n].tolist()
            starts = [k for k, p in enumerate(pos) if p == 0]
            for s, e in zip(starts, [*starts[1:], n], strict=True):
                segments.append(batch["input_ids"][r, s:e].tolist())
        # every sequence of the micro-batch appears once, whole
        assert sorted(segments) == sorted(src.get(j).tolist() for j in ids)
        if attn == "sdpa":
            assert batch["input_ids"].shape[1] <= seq_len
        else:
            assert batch["input_ids"].shape == (1, sum(src.length(j) for j in ids))
    if spec == "fixed":
        assert td.info["rows_per_micro_batch"] == (mb if attn == "sdpa" else 1)


def test_pack_first_fit_decreasing() -> None:
    assert pack_first_fit([5, 5, 8, 2, 10, 1, 9, 3], seq_len=10) == [[4], [6, 5], [2, 3], [0, 1], [7]]
    assert pack_first_fit([3, 3, 3], seq_len=10) == [[0, 1, 2]]
    assert pack_first_fit([], seq_len=10) == []
    with pytest.raises(ValueError, match="> seq_len"):
        pack_first_fit([11], seq_len=10)


def test_a_lognormal_draw_past_a_floats_range_is_clipped_not_an_error() -> None:
    assert set(sample_lengths("lognormal:5,1000", 200, 512, 0)) <= {16, 512}
    assert set(sample_lengths("lognormal:710,0", 3, 512, 0)) == {512}


def test_batch_layout_is_what_the_collators_make() -> None:
    lens = [5, 9, 2, 2, 7]
    assert batch_layout(lens, micro_batch=2, mode="padding", seq_len=10) == [(2, 9), (2, 2), (1, 7)]
    assert batch_layout(lens, micro_batch=2, mode="packing", seq_len=10) == [(2, 9), (1, 4), (1, 7)]
    assert batch_layout(lens, micro_batch=2, mode="packing_flat", seq_len=10) == [(1, 14), (1, 4), (1, 7)]
    with pytest.raises(ValueError, match="layout mode"):
        batch_layout(lens, micro_batch=2, mode="ragged", seq_len=10)


def test_build_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_optimizer_steps"):
        build_train_data(
            Workload(model="m"), Candidate(), num_optimizer_steps=0, vocab_size=10, pad_token_id=0
        )
    with pytest.raises(SpecError, match="unknown kind"):
        build_train_data(
            Workload(model="m", lengths="zipf:1"),
            Candidate(),
            num_optimizer_steps=1,
            vocab_size=10,
            pad_token_id=0,
        )


# ------------------------------------------------------------------ isolation (packing is exact)


def _tiny_llama(attn: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(  # a fresh config per model: from_config mutates it
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_sequences_are_isolated(attn: str) -> None:
    model = _tiny_llama(attn)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 128, (n,), generator=g) for n in (11, 7, 5)]
    feats = [{"input_ids": x} for x in seqs]
    # the 4D-mask mode (sdpa/eager: 11 + 7 share a row of 20, 5 opens another) and the flattened
    # position_ids mode (what FA2/flex get)
    for collator in (
        PackingCollator(seq_len=20, attn=attn),
        PackingCollator(seq_len=20, attn="flash_attention_2"),
    ):
        batch = collator(feats)
        pop_counts(batch)
        batch.pop("labels")
        with torch.no_grad():
            packed = model(**batch).logits
            alone = [model(input_ids=s[None]).logits[0] for s in seqs]
        if collator.flatten:
            assert packed.shape == (1, 23, 128)
            got = [packed[0, :11], packed[0, 11:18], packed[0, 18:23]]
        else:
            got = [packed[0, :11], packed[0, 11:18], packed[1, :5]]
        for x, y in zip(got, alone, strict=True):
            assert (x - y).abs().max().item() < 1e-4


def test_trainer_dataloader_with_a_worker_and_a_training_step(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    from autotune.probe.collate import measured_trainer_class

    model = _tiny_llama("sdpa").train()
    td = build_train_data(
        Workload(model="m", seq_len=32, lengths="uniform:3-20"),
        Candidate(micro_batch=2, grad_accum=1, packing=True, attn="sdpa"),
        num_optimizer_steps=2,
        vocab_size=128,
        pad_token_id=0,
    )
    seen: list[int] = []

    class ProbeTrainer(measured_trainer_class()):  # type: ignore[misc]
        def training_step(self, model, inputs, num_items_in_batch=None):  # type: ignore[no-untyped-def]
            assert REAL_TOKENS_KEY not in inputs and SEQUENCES_KEY not in inputs  # popped per step
            seen.append(int(inputs["input_ids"].shape[0]))
            return super().training_step(model, inputs, num_items_in_batch)

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        max_steps=2,
        dataloader_num_workers=1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        remove_unused_columns=False,
    )
    trainer = ProbeTrainer(model=model, args=args, train_dataset=td.dataset, data_collator=td.collator)
    batches = list(trainer.get_train_dataloader())  # the dataset's sampler + a worker process
    order = td.dataset.order(4)
    assert len(batches) == 2
    assert all(b["attention_mask"].dim() == 4 for b in batches)
    assert [int(b[REAL_TOKENS_KEY]) for b in batches] == [
        sum(td.dataset.source.length(j) for j in order[0:2]),
        sum(td.dataset.source.length(j) for j in order[2:4]),
    ]
    assert [int(b[SEQUENCES_KEY]) for b in batches] == [2, 2]
    trainer.train()
    assert [c[1] for c in trainer.step_counts] == [2, 2]  # sequences per optimizer step
    assert sum(c[0] for c in trainer.step_counts) == td.real_tokens_total
    assert len(seen) == 2


# ------------------------------------------------------------------ datasets


def _make_tokenizer(dirpath: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[BOS]"])
    tok.train_from_iterator(["the cat sat on the mat", "a dog ate my homework", "hello world"], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]"
    )
    fast.save_pretrained(dirpath)
    return dirpath


def _jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def tokdir(tmp_path: Path) -> Path:
    return _make_tokenizer(tmp_path / "tok")


def test_jsonl_text_with_tokenizer_then_cache_hit(
    tmp_path: Path, tokdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = _jsonl(
        tmp_path / "d.jsonl", [{"text": "the cat sat on the mat"}, {"text": "hello world"}, {"text": ""}]
    )
    cache = tmp_path / "cache"
    first = load_token_sequences(ds, seq_len=4, tokenizer=str(tokdir), cache_dir=cache)
    assert not first.cache_hit and first.column == "text"
    seqs = first.sequences.to_lists()
    assert [len(s) for s in seqs] == [4, 2]  # truncated to seq_len; the empty record dropped
    assert first.num_truncated == 1 and first.num_empty == 1 and first.num_records == 3
    assert all(0 <= t < 20 for s in seqs for t in s)
    assert list(cache.glob("*.npz")) and not list(cache.glob("*.tmp"))

    def boom(path: str, **kw: object) -> None:
        raise AssertionError("re-tokenized although cached")

    monkeypatch.setattr(tokenize_cache, "load_tokenizer", boom)
    second = load_token_sequences(ds, seq_len=4, tokenizer=str(tokdir), cache_dir=cache)
    assert second.cache_hit and second.sequences.to_lists() == seqs
    # another seq_len is another cache entry (and would need the tokenizer)
    with pytest.raises(AssertionError, match="re-tokenized"):
        load_token_sequences(ds, seq_len=5, tokenizer=str(tokdir), cache_dir=cache)


def test_default_cache_dir_and_model_dir_tokenizer(tmp_path: Path, tokdir: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "c"))
    assert D.default_cache_dir() == tmp_path / "c" / "datasets"
    assert D.find_tokenizer(Workload(model="m", model_path=str(tokdir))) == str(tokdir)
    assert D.find_tokenizer(Workload(model="m", model_path=str(tmp_path), tokenizer="X")) == "X"
    assert D.find_tokenizer(Workload(model="m", model_path=str(tmp_path))) is None
    ds = _jsonl(tmp_path / "d.jsonl", [{"text": "a dog ate my homework"}] * 3)
    td = build_train_data(
        Workload(model="m", model_path=str(tokdir), seq_len=16, dataset=str(ds)),
        Candidate(micro_batch=2),
        num_optimizer_steps=2,
        vocab_size=32,
        pad_token_id=0,
    )
    assert td.info["column"] == "text" and (tmp_path / "c" / "datasets").is_dir()
    assert len(td.dataset) == 3 and td.num_items == 4
    assert all(len(td.dataset[i]["input_ids"]) == 5 for i in td.dataset.order(td.num_items))


def test_jsonl_input_ids_build(tmp_path: Path) -> None:
    recs = [{"input_ids": list(range(1, n + 1))} for n in (3, 9, 4, 12, 6)]
    ds = _jsonl(tmp_path / "ids.jsonl", recs)
    wl = Workload(model="m", seq_len=10, dataset=str(ds), seed=5)
    kw = {"num_optimizer_steps": 3, "vocab_size": 20, "pad_token_id": 0, "cache_dir": tmp_path / "c"}
    td = build_train_data(wl, Candidate(micro_batch=2), **kw)
    assert len(td.dataset) == 5 and td.num_items == 6 and td.info["column"] == "input_ids"
    order = td.dataset.order(td.num_items)
    assert [len(td.dataset[i]["input_ids"]) for i in order[:2]] == [10, 9]  # longest first (12 truncated)
    assert sorted(order[:5]) == list(range(5))  # moved to the front: each sequence once per epoch
    for i in range(len(td.dataset)):
        n = len(td.dataset[i]["input_ids"])
        assert td.dataset[i]["input_ids"].tolist() == list(range(1, n + 1))
    tp = build_train_data(wl, Candidate(micro_batch=2, packing=True), **kw)
    assert tp.dataset.order(tp.num_items) == order  # packing reads the same sequences
    assert tp.collator([tp.dataset[i] for i in order[:2]])["input_ids"].shape == (2, 10)  # 10 + 9 > 10
    with pytest.raises(DatasetError, match="token id 10 but the model's vocabulary has 8"):
        build_train_data(wl, Candidate(), **{**kw, "vocab_size": 8})


def test_parquet_input_ids(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2, 3], [4, 5], list(range(40))], "x": [1, 2, 3]}), f)
    loaded = load_token_sequences(f, seq_len=32, cache_dir=tmp_path / "c")
    assert loaded.column == "input_ids" and loaded.sequences.to_lists()[:2] == [[1, 2, 3], [4, 5]]
    assert loaded.sequences.length(2) == 32


def test_parquet_without_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "d.parquet"
    f.write_bytes(b"PAR1....")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DatasetError, match=r"needs pyarrow: pip install 'autotune\[data\]'"):
        load_token_sequences(f, seq_len=8, use_cache=False)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("missing.jsonl", None, "does not exist; pass --dataset PATH"),
        ("d.csv", "text\nhi\n", "unknown extension '.csv'; use a .jsonl file"),
        ("empty.jsonl", "", r"is empty \(0 bytes\)"),
        ("blank.jsonl", "\n\n", "the dataset is empty"),
        ("bad.jsonl", '{"text": "ok"}\n{"text": oops}\n', "line 2 is not valid JSON"),
        ("list.jsonl", "[1, 2]\n", "line 1 is a JSON list"),
        (
            "nocol.jsonl",
            '{"prompt": "x"}\n',
            r"line 1: no usable column \(columns: \['prompt'\]\); rename a column to 'text'",
        ),
        ("later.jsonl", '{"text": "a"}\n{"body": "b"}\n', "line 2 has no 'text' key"),
        ("notstr.jsonl", '{"text": 5}\n', "line 1: 'text' must be a string"),
        ("badids.jsonl", '{"input_ids": [1, -2]}\n', "line 1: 'input_ids' must be a list of non-negative"),
        ("text.jsonl", '{"text": "hello world"}\n', "pass --tokenizer DIR .* or give an 'input_ids' column"),
        ("allempty.jsonl", '{"input_ids": []}\n', "all 1 records have no tokens"),
    ],
)
def test_dataset_errors(tmp_path: Path, name: str, content: str | None, match: str) -> None:
    path = tmp_path / name if content is None else _write(tmp_path / name, content)
    with pytest.raises(DatasetError, match=match):
        load_token_sequences(path, seq_len=8, cache_dir=tmp_path / "c")


def test_dataset_error_directory_and_bad_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not a dataset written by save_to_disk"):
        load_token_sequences(tmp_path, seq_len=8, use_cache=False)
    ds = _write(tmp_path / "t.jsonl", '{"text": "hi"}\n')
    (tmp_path / "notok").mkdir()
    with pytest.raises(DatasetError, match="cannot load a tokenizer from .*pass --tokenizer DIR"):
        load_token_sequences(ds, seq_len=8, tokenizer=str(tmp_path / "notok"), cache_dir=tmp_path / "c")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    pytest.importorskip("pyarrow")
    with pytest.raises(DatasetError, match="cannot read as parquet"):
        load_token_sequences(bad, seq_len=8, use_cache=False)
