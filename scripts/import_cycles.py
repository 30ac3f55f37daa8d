#!/usr/bin/env python3
"""Print the import circles among django_redlock's modules (type-only imports included) and
the imports that cross a layer the wrong way (the engine imports nothing of the package
outside it; the node topology imports neither ``conf`` nor the lock API); exit 1 if there is
one. Standard library only: ``python3 scripts/import_cycles.py``."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_redlock"


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports (a name imported from a package counts as
    its submodule when there is one, else as the package)."""
    name = module_of(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


#: (importer prefix, forbidden prefixes): the layering rules
RULES = (
    (f"{PACKAGE}.engine", (f"{PACKAGE}.",), (f"{PACKAGE}.engine",)),
    (f"{PACKAGE}.nodes", (f"{PACKAGE}.conf", f"{PACKAGE}.locking"), ()),
)


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports that break :data:`RULES`."""
    found = []
    for name, deps in sorted(graph.items()):
        for prefix, forbidden, allowed in RULES:
            if name != prefix and not name.startswith(prefix + "."):
                continue
            for dep in sorted(deps):
                if any(dep == f or dep.startswith(f) for f in forbidden) and not any(
                    dep == a or dep.startswith(a + ".") for a in allowed
                ):
                    found.append(f"{name} imports {dep}")
    return found


def main() -> int:
    paths = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_of(p) for p in paths}
    # a package's __init__ importing its own submodules is not a circle of the package
    graph = {module_of(p): imports_of(p, modules) for p in paths}
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not (name.startswith(d + ".") and d in modules)}
    found = cycles(graph)
    for component in found:
        print("import circle:", " <-> ".join(component))
    crossed = crossings(graph)
    for line in crossed:
        print("layer crossed:", line)
    print(
        f"{len(found)} import circle(s), {len(crossed)} layer crossing(s), {len(modules)} modules"
    )
    return 1 if found or crossed else 0


if __name__ == "__main__":
    sys.exit(main())
