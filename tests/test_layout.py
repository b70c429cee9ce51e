"""The import graph shows the flow: no import cycles (module- or function-level, type-checking imports
included), and the planning core never imports the trainers (the CLI combines them)."""

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    mods = {}
    for package in ("budgetplan", "trainers"):
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _targets(node: ast.AST, module: str, is_package: bool, mods: dict) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        parts = parts[:len(parts) - node.level + (1 if is_package else 0)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """Every import, at module level, inside a function or for type checking only; ``from package import
    name`` where the name is not a submodule depends on the package itself."""
    mods = _modules()
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for module, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            for target in _targets(node, module, path.name == "__init__.py", mods):
                if target in mods and target != module:
                    edges[module].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert _cycles(import_graph()) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_never_imports_the_trainers():
    edges = import_graph()
    core = {m for m in edges if m.startswith("budgetplan") and not m.startswith("budgetplan.cli")}
    assert sorted((m, t) for m in core for t in edges[m] if t.startswith("trainers")) == []
    assert any(t.startswith("trainers") for m in edges if m.startswith("budgetplan.cli") for t in edges[m])
