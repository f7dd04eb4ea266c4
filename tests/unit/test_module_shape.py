"""The shape of the code: no module of ``include/rebalance`` above 600 lines and no import
cycle among the ``rebalance`` modules (read statically with ``ast``; imports inside
functions count too: a cycle deferred to call time is still a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "rebalance"
MAX_LINES = 600
#: Modules above the limit, with why they still are (each one is a known debt): none.
OVERSIZED: set[str] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path],
             unresolved: list[str] | None = None) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
                if base not in modules and unresolved is not None:
                    unresolved.append(f"{name}:{node.lineno}: from {'.' * node.level}"
                                      f"{node.module or ''} -> {base}")
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def test_no_module_exceeds_600_lines():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
             for p in _modules().values()}
    over = {m: n for m, n in sizes.items() if n > MAX_LINES and m not in OVERSIZED}
    assert over == {}, f"modules above {MAX_LINES} lines: {over}"
    assert all(sizes[m] > MAX_LINES for m in OVERSIZED), "an OVERSIZED module shrank: drop it"


def test_every_relative_import_names_a_module():
    """A relative import inside a function fails only when it runs: check them all here."""
    modules = _modules()
    unresolved: list[str] = []
    for name, path in modules.items():
        _imports(name, path, modules, unresolved)
    assert unresolved == []


def test_no_import_cycle_among_rebalance_modules():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # Tarjan's strongly connected components: any component of two or more is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_two_test_modules_share_a_name():
    """tests/ has no __init__.py: two test files with one basename stop pytest's collection
    of the whole suite ("import file mismatch")."""
    tests = Path(__file__).resolve().parents[1]
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
