"""Regenerate autotune/formats/keys.json: the top-level keys Axolotl and LLaMA-Factory accept.

Neither project co-installs with autotune's stack (see the README), so their key sets are read from
their published sources: the field names (and pydantic aliases) of Axolotl's ``AxolotlInputConfig``
and its bases, and of LLaMA-Factory's training argument dataclasses (``_TRAIN_ARGS`` in
``hparams/parser.py``), found by parsing the source with ``ast``. TrainingArguments' own fields are
not listed: autotune reads them from the installed transformers.

    python tools/format_keys.py --axolotl PATH/TO/axolotl.git --llamafactory PATH/TO/LLaMA-Factory.git

Each path is a git directory (or a work tree); HEAD is read and its commit recorded.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from pathlib import Path


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir" if repo.endswith(".git") or repo.endswith("/repo") else "-C", repo,
                           *args], check=True, capture_output=True, text=True).stdout


def _classes(repo: str, folder: str) -> dict[str, ast.ClassDef]:
    out: dict[str, ast.ClassDef] = {}
    for path in _git(repo, "ls-tree", "-r", "--name-only", "HEAD", folder).split():
        if path.endswith(".py"):
            tree = ast.parse(_git(repo, "show", f"HEAD:{path}"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, node)
    return out


def _fields(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
            if name.startswith("_") or name == "model_config":
                continue
            names.add(name)
            if isinstance(stmt.value, ast.Call):  # pydantic Field(alias="...")
                for kw in stmt.value.keywords:
                    if kw.arg == "alias" and isinstance(kw.value, ast.Constant):
                        names.add(str(kw.value.value))
    return names


def _collect(root: str, classes: dict[str, ast.ClassDef], seen: set[str] | None = None) -> set[str]:
    seen = set() if seen is None else seen
    if root in seen or root not in classes:
        return set()
    seen.add(root)
    keys = _fields(classes[root])
    for base in classes[root].bases:
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        keys |= _collect(name, classes, seen)
    return keys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--axolotl", required=True)
    ap.add_argument("--llamafactory", required=True)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "autotune/formats/keys.json"))
    a = ap.parse_args()

    ax_dir = "src/axolotl/utils/schemas"
    ax = _collect("AxolotlInputConfig", _classes(a.axolotl, ax_dir))
    lf_dir = "src/llamafactory/hparams"
    lf_classes = _classes(a.llamafactory, lf_dir)
    lf_roots = ("ModelArguments", "DataArguments", "TrainingArguments", "FinetuningArguments", "GeneratingArguments")
    lf: set[str] = set()
    for root in lf_roots:
        lf |= _collect(root, lf_classes)
    data = {
        "axolotl": {
            "source": {"repo": "axolotl-ai-cloud/axolotl", "path": ax_dir, "class": "AxolotlInputConfig and bases",
                       "commit": _git(a.axolotl, "rev-parse", "HEAD").strip()},
            "keys": sorted(ax),
        },
        "llamafactory": {
            "source": {"repo": "hiyouga/LLaMA-Factory", "path": lf_dir, "class": ", ".join(lf_roots) + " and bases "
                       "(plus the installed transformers' Seq2SeqTrainingArguments fields)",
                       "commit": _git(a.llamafactory, "rev-parse", "HEAD").strip()},
            "keys": sorted(lf),
        },
    }
    Path(a.out).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {a.out}: axolotl {len(ax)} keys, llamafactory {len(lf)} keys")


if __name__ == "__main__":
    main()
