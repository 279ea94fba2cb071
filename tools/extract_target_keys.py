#!/usr/bin/env python
"""Write the config keys Axolotl and LLaMA-Factory accept into autotune/emit/schemas/*.json.

Neither library installs beside transformers 5.24 (see /work/shared/STACK-NOTES.md), so the emitted
axolotl.yaml / llamafactory.yaml are checked against the key names and type annotations declared in
their own sources, and ``autotune check`` / ``--write-back`` read the same files for the keys a
user's config may hold (``autotune.formats.known_keys``: the top-level section plus the plugins').
This script reads those sources (field names, pydantic aliases and annotation text only, through
``ast``; nothing is imported or executed) from a git checkout and records where they came from:

    python tools/extract_target_keys.py axolotl PATH/TO/axolotl.git
    python tools/extract_target_keys.py llamafactory PATH/TO/LLaMA-Factory.git

PATH is a git directory (a bare mirror works); the files are read at HEAD with ``git show``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "autotune" / "emit" / "schemas"

TARGETS = {
    "axolotl": {
        "repo": "axolotl-ai-cloud/axolotl",
        "files": [
            "src/axolotl/utils/schemas/config.py",
            "src/axolotl/utils/schemas/model.py",
            "src/axolotl/utils/schemas/peft.py",
            "src/axolotl/utils/schemas/training.py",
            "src/axolotl/utils/schemas/integrations.py",
            "src/axolotl/utils/schemas/multimodal.py",
            "src/axolotl/utils/schemas/deprecated.py",
            "src/axolotl/utils/schemas/fsdp.py",
            "src/axolotl/utils/schemas/datasets.py",
            "src/axolotl/utils/schemas/validation.py",
            "src/axolotl/integrations/liger/args.py",
        ],
        # top-level config class, and the nested sections autotune writes
        "sections": {
            "": "AxolotlInputConfig",
            "fsdp_config": "FSDPConfig",
            "datasets[]": "SFTDataset",
            "plugin:liger": "LigerArgs",
        },
    },
    "llamafactory": {
        "repo": "hiyouga/LLaMA-Factory",
        "files": [
            "src/llamafactory/hparams/model_args.py",
            "src/llamafactory/hparams/data_args.py",
            "src/llamafactory/hparams/finetuning_args.py",
            "src/llamafactory/hparams/training_args.py",
            "src/llamafactory/hparams/generating_args.py",
        ],
        # the parser merges these dataclasses (_TRAIN_ARGS in hparams/parser.py); TrainingArguments extends
        # transformers' Seq2SeqTrainingArguments, whose own fields come from the installed transformers
        "sections": {"": ["ModelArguments", "DataArguments", "FinetuningArguments", "TrainingArguments",
                          "GeneratingArguments"]},
    },
}


def _git(gitdir: str, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", gitdir, *args], check=True, capture_output=True, text=True
    ).stdout


def _classes(sources: dict[str, str]) -> dict[str, ast.ClassDef]:
    out: dict[str, ast.ClassDef] = {}
    for text in sources.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, node)
    return out


def _fields(name: str, classes: dict[str, ast.ClassDef], seen: set[str] | None = None) -> dict[str, str]:
    """Annotated class attributes of ``name`` and of its bases found in the same sources."""
    seen = set() if seen is None else seen
    if name in seen or name not in classes:
        return {}
    seen.add(name)
    node = classes[name]
    fields: dict[str, str] = {}
    for base in node.bases:
        bname = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        if bname:
            fields.update(_fields(bname, classes, seen))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name, annotation = stmt.target.id, ast.unparse(stmt.annotation)
            if name.startswith("_"):  # private attributes: not a config key
                continue
            if name != "model_config":  # pydantic's own settings, not a field
                fields[name] = annotation
            if isinstance(stmt.value, ast.Call):  # Field(alias="..."): the key a config file uses
                for kw in stmt.value.keywords:
                    if kw.arg == "alias" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        fields[kw.value.value] = annotation
    return fields


def main(target: str, gitdir: str) -> None:
    spec = TARGETS[target]
    commit = _git(gitdir, "rev-parse", "HEAD").strip()
    sources = {f: _git(gitdir, "show", f"HEAD:{f}") for f in spec["files"]}
    classes = _classes(sources)
    sections: dict[str, dict[str, str]] = {}
    for section, cls in spec["sections"].items():
        merged: dict[str, str] = {}
        for c in [cls] if isinstance(cls, str) else cls:
            if c not in classes:
                raise SystemExit(f"{target}: class {c} not found in {spec['files']}")
            merged.update(_fields(c, classes))
        sections[section] = dict(sorted(merged.items()))
    data = {
        "source": {
            "repo": spec["repo"],
            "commit": commit,
            "paths": spec["files"],
            "classes": spec["sections"],
        },
        "sections": sections,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{target}_keys.json"
    out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"{out}: {sum(len(s) for s in sections.values())} keys at {spec['repo']}@{commit[:12]}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in TARGETS:
        raise SystemExit(f"usage: {sys.argv[0]} {{{'|'.join(TARGETS)}}} GIT_DIR")
    main(sys.argv[1], sys.argv[2])
