"""The layers hold (docs/design.md §2 and §9): logkit's modules import each other without
a circle — counting imports made inside functions and imports made only for type
annotations too — so no import reaches upwards. The broker starts the servers above it
through a table the top of the package fills, not by importing them."""

from __future__ import annotations

import ast
from pathlib import Path

import logkit

PACKAGE = Path(logkit.__file__).parent

def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(importer: str, node: ast.ImportFrom, is_package: bool) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = importer.split(".")
        parts = parts if is_package else parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    names = [base]
    for alias in node.names:                 # `from . import x` may name a module
        names.append(f"{base}.{alias.name}")
    return names


def _visit(tree: ast.AST, importer: str, is_package: bool) -> tuple[set[str], set[str]]:
    """(module-level imports, imports inside functions or under `if TYPE_CHECKING:`) of
    one parsed module, as logkit module names."""
    top: set[str] = set()
    later: set[str] = set()

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.dump(child.test):
                visit(child, True)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, True)
                continue
            targets: list[str] = []
            if isinstance(child, ast.ImportFrom):
                targets = resolve(importer, child, is_package)
            elif isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            for target in targets:
                if target.startswith("logkit"):
                    (later if deferred else top).add(target)
            visit(child, deferred)

    visit(tree, False)
    return top, later


def imports(path: Path) -> tuple[set[str], set[str]]:
    return _visit(ast.parse(path.read_text()), module_name(path), path.name == "__init__.py")


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    top_edges, deferred_edges = {}, {}
    for name, path in modules.items():
        top, deferred = imports(path)
        # An ancestor package is imported before any module in it, so an import of it
        # (`from . import x`) is no edge; nor is a package importing its own parts.
        def edge(t: str, name: str = name) -> bool:
            return (t in modules and t != name and not name.startswith(t + ".")
                    and not t.startswith(name + "."))
        top_edges[name] = {t for t in top if edge(t)}
        deferred_edges[name] = {t for t in deferred if edge(t)}
    return top_edges, deferred_edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_module_level_imports_have_no_circle():
    top, _ = graph()
    assert find_cycle(top) is None, " -> ".join(find_cycle(top) or [])


def test_no_import_reaches_upwards_not_even_a_deferred_or_annotation_only_one():
    top, later = graph()
    every = {name: top[name] | later[name] for name in top}
    assert find_cycle(every) is None, " -> ".join(find_cycle(every) or [])


def test_the_checker_sees_a_circle_when_there_is_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_the_checker_reads_deferred_and_annotation_only_imports(tmp_path):
    source = tmp_path / "logkit_probe.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from logkit.broker import Broker\n"
                      "def f():\n    from logkit.protocol import serve\n")
    top, later = _visit(ast.parse(source.read_text()), "probe", False)
    assert top == set() and {"logkit.broker", "logkit.protocol"} <= later
