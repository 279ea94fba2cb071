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
            pkg = parts[1]
            private = [p for p in parts[2:] if p.startswith("_") and not p.startswith("__")]
            if private and pkg != own:  # a private module, or a private name of a public one
                bad.append(f"{rel}.py:{line} imports {name}")
    assert not bad, "\n".join(bad)


def _unit(parts: tuple[str, ...] | list[str]) -> str | None:
    """The layout unit of a dotted module path under autotune: its package, or its top-level module."""
    if len(parts) < 2 or parts[0] != "autotune":
        return None
    return parts[1] if parts[1] != "__init__" else None


def package_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> {imported unit: [where]} over every import (module-level or deferred) under autotune/."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        own = _unit(rel.parts)
        if own is None:  # autotune/__init__.py: the public face, re-exports only
            continue
        for line, name in _imports(path):
            other = _unit(name.split("."))
            if other is None or other == own:
                continue
            if not (ROOT / other).is_dir() and not (ROOT / f"{other}.py").is_file():
                continue  # `from autotune.x import name`: the name itself, not a unit
            graph.setdefault(own, {}).setdefault(other, []).append(f"{rel}.py:{line}")
    return graph


def _cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Strongly connected components with more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}, "d": {"a": ["w"]}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": ["x"]}}) == []


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    assert "search" in graph and "spec" in graph["search"]  # the walk sees real imports
    bad = []
    for comp in _cycles(graph):
        edges = [f"  {a} -> {b} ({graph[a][b][0]})" for a in comp for b in comp if b in graph.get(a, {})]
        bad.append(" <-> ".join(comp) + "\n" + "\n".join(edges))
    assert not bad, "package import cycles:\n" + "\n".join(bad)


def test_the_layout_map_names_every_package_and_top_level_module() -> None:
    layout = (ROOT.parent / "docs" / "layout.md").read_text(encoding="utf-8")
    block = layout.split("```", 2)[1]
    named = {line.split()[0] for line in block.splitlines() if line.startswith("  ") and line.split()}
    units = {f"{p.name}/" for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.name for p in ROOT.glob("*.py") if p.name != "__init__.py"}
    assert units - named == set(), f"docs/layout.md's map misses {sorted(units - named)}"


# ------------------------------------------------------------------------------ function size

MAX_LINES, MAX_PARAMS = 80, 12


def _is_cli_command(path: Path, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A typer command: its options are its parameters, so only its body is held to the length."""
    return path.parent.name == "cli" and fn.name == "command"


def _oversized(path: Path, root: Path = ROOT.parent) -> list[str]:
    out = []
    for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = fn.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
                  *([a.kwarg] if a.kwarg else [])]
        params = [p for p in params if p.arg not in ("self", "cls")]
        command = _is_cli_command(path, fn)
        start = fn.body[0].lineno if command else fn.lineno
        lines = (fn.end_lineno or fn.lineno) - start + 1
        where = f"{path.relative_to(root)}:{fn.lineno} {fn.name}"
        if lines > MAX_LINES:
            out.append(f"{where}: {lines} lines{' (body)' if command else ''}")
        if len(params) > MAX_PARAMS and not command:
            out.append(f"{where}: {len(params)} parameters (group them into a typed object)")
    return out


def test_no_function_is_over_80_lines_or_takes_over_12_parameters() -> None:
    """A function a reader takes in at once; a typer command's options are its parameters (exempt)."""
    found = [m for path in sorted(ROOT.rglob("*.py")) for m in _oversized(path)]
    assert found == [], "\n".join(found)


def test_the_size_rule_sees_a_long_function_and_a_long_signature(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    wide = "def g(" + ", ".join(f"a{i}" for i in range(MAX_PARAMS + 1)) + "):\n    pass\n"
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n\n\n{wide}")
    found = _oversized(tmp_path / "m.py", root=tmp_path)
    assert found == [f"m.py:1 f: {MAX_LINES + 1} lines",
                     f"m.py:{MAX_LINES + 4} g: {MAX_PARAMS + 1} parameters (group them into a typed object)"]


def test_every_planted_bug_still_applies_to_the_code() -> None:
    """tests/mutants.py plants each bug by replacing one exact text; a refactor that changes that text leaves
    the mutant unable to run (it did once, unnoticed): each original must still occur exactly once."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("planted_bugs", ROOT.parent / "tests" / "mutants.py")
    mutants = importlib.util.module_from_spec(spec)
    sys.modules["planted_bugs"] = mutants  # its dataclasses look their module up
    try:
        spec.loader.exec_module(mutants)
    finally:
        del sys.modules["planted_bugs"]
    problems = {m.id: p for m in mutants.MUTANTS if (p := mutants.mutation_problem(m, ROOT.parent))}
    assert not problems, problems
