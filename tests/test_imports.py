"""The import graph of `fuser` has no cycles, counting imports inside functions too: a
deferred import hides a cycle, it does not break it (STYLE.md 12). Lazy imports stay only
for optional heavy dependencies outside fuser (torch._dynamo, cuda.core)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "fuser"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` except those under `if TYPE_CHECKING:` (annotations only:
    they never run, so they cannot take part in an import cycle)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
                stack += child.orelse
            else:
                stack.append(child)


def import_graph(root: Path = PACKAGE) -> nx.DiGraph:
    """Module -> module it imports (anywhere in its file), fuser modules only. `from a
    import b` is an edge to a.b when that is a module, else to a."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(files)
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in _runtime_nodes(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".")
                    pkg = pkg if is_pkg else pkg[:-1]
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            for t in targets:
                while t and t not in files:  # fuser.x.y.attr -> fuser.x.y
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    g.add_edge(mod, t)
    return g


def cycles(g: nx.DiGraph) -> list[list[str]]:
    """Each strongly connected group of more than one module, sorted."""
    return sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)


def test_no_import_cycles():
    found = cycles(import_graph())
    shown = "\n".join(f"  {len(c)} modules: {' <-> '.join(c)}" for c in found)
    assert not found, f"{len(found)} import cycle(s) inside fuser:\n{shown}"


def test_the_checker_sees_a_deferred_import(tmp_path):
    """A cycle hidden by an import inside a function is still a cycle."""
    pkg = tmp_path / "fuser"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from fuser.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from fuser import a\n    return a\n")
    assert cycles(import_graph(pkg)) == [["fuser.a", "fuser.b"]]
