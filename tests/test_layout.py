"""Layout rules (CONVENTIONS; issue 17): no module reaches into another package's private modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "autotune"


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def test_no_private_module_of_another_package_is_imported() -> None:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        own = rel.parts[1] if len(rel.parts) > 2 else None  # autotune/<pkg>/<module>: its package
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] != "autotune" or len(parts) < 3:
                continue
            pkg, mod = parts[1], parts[2]
            if mod.startswith("_") and not mod.startswith("__") and pkg != own:
                bad.append(f"{rel}.py:{line} imports {name}")
    assert not bad, "\n".join(bad)
