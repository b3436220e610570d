"""The layers hold (docs/design.md §2 and §9): logkit's modules import each other at
module level without a circle, and the only imports that reach upwards are the ones
the design names — the broker's thin hand-offs to the servers above it (inside the
method that starts them) and imports made only for type annotations."""

from __future__ import annotations

import ast
from pathlib import Path

import logkit

PACKAGE = Path(logkit.__file__).parent

# Imports made inside a function, named (importer, imported): each is a hand-off to a
# layer above, or a lazy import of a heavy module below, and each is listed here so a
# new one is a decision, not an accident.
DEFERRED_ALLOWED = {
    ("logkit.broker", "logkit.protocol"),                  # broker.serve()
    ("logkit.broker", "logkit.registry_http"),             # broker.serve_schema_registry()
    ("logkit.broker", "logkit.replication.tcp_server"),    # broker.serve_replication()
    ("logkit.broker", "logkit.replication.objectstore"),   # broker.ship()
}


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


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(module-level imports, imports inside functions) of one module, as logkit module
    names; imports under `if TYPE_CHECKING:` are left out (annotations only)."""
    importer = module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    deferred: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.dump(child.test):
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
                    (deferred if in_function else top).add(target)
            visit(child, in_function)

    visit(tree, False)
    return top, deferred


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


def test_the_checker_sees_a_circle_when_there_is_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(edges.get(node, ()))
    return False


def test_upward_imports_are_the_named_hand_offs_only():
    """A deferred import is upward when the module it imports reaches the importer
    through module-level imports (made at module level, it would close a circle)."""
    top, deferred = graph()
    upward = {(importer, target) for importer, targets in deferred.items()
              for target in targets if reaches(top, target, importer)}
    assert upward - DEFERRED_ALLOWED == set()
    assert upward, "the broker's hand-offs are upward imports; the check sees none"
