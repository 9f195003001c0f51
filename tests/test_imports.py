"""The import graph of `fuser` has no cycles, counting imports inside functions too: a
deferred import hides a cycle, it does not break it (STYLE.md 12). Lazy imports stay only
for optional heavy dependencies outside fuser (torch._dynamo, cuda.core): an import of a
fuser module inside a function must be on DEFERRED below with the dependency it defers."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "fuser"

# (importing module, imported fuser module) -> the heavy optional dependency outside fuser
# that importing it at the top would load on `import fuser`. Empty: every fuser-internal
# import is at its module's top.
DEFERRED: dict[tuple[str, str], str] = {}


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


def _targets(node: ast.AST, mod: str, is_pkg: bool, files: dict) -> list[str]:
    """The fuser modules an import statement in module `mod` imports (none for any other
    node). `from a import b` names a.b when that is a module, else a."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            pkg = mod.split(".")
            pkg = pkg if is_pkg else pkg[:-1]
            pkg = pkg[: len(pkg) - node.level + 1]
            base = ".".join(pkg + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
    found = []
    for t in names:
        while t and t not in files:  # fuser.x.y.attr -> fuser.x.y
            t = t.rpartition(".")[0]
        if t and t != mod:
            found.append(t)
    return found


def _modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in root.rglob("*.py")}


def import_graph(root: Path = PACKAGE) -> nx.DiGraph:
    """Module -> module it imports (anywhere in its file), fuser modules only."""
    files = _modules(root)
    g = nx.DiGraph()
    g.add_nodes_from(files)
    for mod, path in files.items():
        for node in _runtime_nodes(ast.parse(path.read_text())):
            for t in _targets(node, mod, path.name == "__init__.py", files):
                g.add_edge(mod, t)
    return g


def deferred_imports(root: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """(module, line, imported fuser module) for each import of a fuser module inside a
    function or method body, sorted."""
    files = _modules(root)
    found = []
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            # a nested function is walked again as its own fn: the set drops the repeat
            for node in ast.walk(fn):
                found += [(mod, node.lineno, t) for t in _targets(node, mod, is_pkg, files)]
    return sorted(set(found))


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


def test_deferred_imports_defer_a_heavy_dependency():
    """An import of a fuser module inside a function defers a heavy optional dependency
    named on DEFERRED; any other belongs at the module's top (STYLE.md 12)."""
    found = deferred_imports()
    unlisted = [f"  {m}:{line} imports {t}" for m, line, t in found if (m, t) not in DEFERRED]
    assert not unlisted, (
        "fuser-internal imports inside functions: move them to the module's top, or add "
        "(module, imported module) to DEFERRED with the heavy dependency they defer:\n"
        + "\n".join(unlisted)
    )
    stale = sorted(set(DEFERRED) - {(m, t) for m, _, t in found})
    assert not stale, f"DEFERRED lists imports that are no longer deferred: {stale}"


def test_the_checker_sees_deferred_imports(tmp_path):
    """Absolute, relative and nested-function imports of a fuser module are found; imports
    of other packages and at the module's top are not."""
    pkg = tmp_path / "fuser"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import math\nfrom fuser.sub import b\n")
    (pkg / "sub" / "b.py").write_text("X = 1\n")
    (pkg / "sub" / "c.py").write_text(
        "class K:\n"
        "    def m(self):\n"
        "        import json\n"
        "        from .b import X\n"
        "        def inner():\n"
        "            import fuser.a\n"
        "        return X\n"
    )
    assert deferred_imports(pkg) == [
        ("fuser.sub.c", 4, "fuser.sub.b"),
        ("fuser.sub.c", 6, "fuser.a"),
    ]
