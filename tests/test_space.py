"""Search-space YAML -> SearchSpace: every shipped file validates; bad files list every problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import SpecError
from autotune.spec.probe_request import Candidate
from autotune.spec.space import DIMENSIONS, SearchSpace, available_spaces, load_space, parse_space, space_dirs

REPO = Path(__file__).resolve().parent.parent
ALL_YAML = sorted((REPO / "search_spaces").rglob("*.y*ml"))


def test_the_named_spaces_ship_from_one_copy() -> None:
    assert {"default", "lora", "cpu", "multi-gpu"} <= set(available_spaces())
    assert space_dirs()[0] == REPO / "search_spaces"
    # the package's folder is a link to the top-level one (a wheel build copies through it), not a second copy
    packaged = REPO / "autotune" / "search_spaces"
    assert packaged.is_symlink() and packaged.resolve() == (REPO / "search_spaces").resolve()


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: p.name)
def test_every_yaml_validates_and_opens_with_its_command(path: Path) -> None:
    space = load_space(path)
    assert space.size() >= 1
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# autotune run "), f"{path.name} must open with the command that uses it"
    assert f"--space {path.stem}" in first


def test_load_by_name_equals_load_by_path() -> None:
    assert load_space("cpu").to_dict() == load_space(REPO / "search_spaces" / "cpu.yaml").to_dict()


def test_cpu_space_is_what_this_box_needs() -> None:
    s = load_space("cpu")
    assert set(s.precision) == {"fp32", "bf16"}
    assert set(s.attn) == {"eager", "sdpa"}
    assert s.micro_batch == (1, 2, 4, 8, 16)
    assert set(s.grad_ckpt) == {True, False} and set(s.packing) == {True, False}
    assert set(s.workers) == {0, 1}


def test_omitted_knobs_take_the_candidate_default_and_scalars_are_one_choice() -> None:
    s = parse_space({"micro_batch": [1, 2], "precision": "fp32"})
    assert s.precision == ("fp32",)
    assert s.attn == (Candidate().attn,)
    assert s.gpus_per_trial == (1,)
    assert s.size() == 2
    # the user's guide names the values an omitted knob is held at where autotune's default is not the HF one
    from autotune.spec.levers import LEVERS

    guide = " ".join((REPO / "docs" / "search.md").read_text().split())
    for name, words in (("precision", "precision {} (HF: {}"), ("optim", "optimizer {} (HF: {})")):
        assert words.format(LEVERS[name].default, LEVERS[name].hf_default) in guide, name


def test_all_problems_in_one_error() -> None:
    bad = {
        "micro_batch": [0, "4", True],
        "grad_ckpt": [],
        "attn": ["sdpa", "flash_attention_3"],
        "precision": ["bf16", "bf16"],
        "workers": [-1],
        "offload": ["optimizer"],
        "zero_stage": [0],
        "colour": ["blue"],
    }
    with pytest.raises(SpecError, match="unknown key") as info:
        parse_space(bad, name="bad")
    msg = str(info.value)
    problems = info.value.problems
    assert len(problems) >= 8, problems
    for needle in ("colour", "micro_batch: choices must be >= 1; got 0", "micro_batch: choices must be integers; got '4'",
                   "micro_batch: choices must be integers; got True", "grad_ckpt: needs at least one choice",
                   "flash_attention_3", "duplicate choice(s) 'bf16'", "workers: choices must be >= 0",
                   "offload 'optimizer' acts only with zero_stage 1, 2 or 3 among the choices"):
        assert needle in msg, needle


def test_contradictions() -> None:
    with pytest.raises(SpecError, match="offload 'params' needs zero_stage 3"):
        parse_space({"zero_stage": [0, 2], "offload": ["none", "params"]})
    with pytest.raises(SpecError, match="sharding 'fsdp' acts only with zero_stage 1, 2 or 3 among the choices"):
        parse_space({"sharding": ["fsdp"]})
    with pytest.raises(SpecError, match=r"sharding 'fsdp' needs zero_stage 2 or 3 among the choices \(FSDP has no"):
        parse_space({"zero_stage": [1], "sharding": ["fsdp"]})
    with pytest.raises(SpecError, match="zero_stage: choices must be 0, 1, 2 or 3"):
        parse_space({"zero_stage": [4]})
    ok = parse_space({"zero_stage": [0, 3], "offload": ["none", "params"], "sharding": ["deepspeed", "fsdp"]})
    assert ok.offload == ("none", "params")


def test_not_a_mapping() -> None:
    with pytest.raises(SpecError, match="must be a mapping"):
        parse_space([1, 2])


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(SpecError, match=r"unknown search space 'nope'; known: .*cpu.*default"):
        load_space("nope")


def test_missing_path_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        load_space(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("micro_batch: [1, 2\nattn: sdpa\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_space(broken)
    twice = tmp_path / "twice.yaml"  # the second list had replaced the first without a word
    twice.write_text("micro_batch: [1, 2]\nattn: [sdpa]\nmicro_batch: [8]\n")
    with pytest.raises(SpecError, match=r"key 'micro_batch' is set 2 times \(lines 1, 3\)"):
        load_space(twice)


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    evil = tmp_path / "evil.yaml"
    evil.write_text("micro_batch: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_space(evil)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text("micro_batch: [1, 2]\nattn: [sdpa, warp]\n")
    with pytest.raises(SpecError, match=r"mine.yaml: attn: choices must be among"):
        load_space(f)


def test_fingerprint_depends_on_the_dimensions_only() -> None:
    a = parse_space({"micro_batch": [1, 2]}, name="a", source="x")
    b = parse_space({"micro_batch": [1, 2]}, name="b", source="y")
    c = parse_space({"micro_batch": [1, 4]})
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert set(a.to_dict()) == set(DIMENSIONS)


def test_default_space_is_a_dataclass_default() -> None:
    assert SearchSpace().size() == 1
