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


P = PACKAGE
#: What is built on the lock API (``locking``), and what is built on the settings (``conf``).
ABOVE_LOCKING = (
    "jobs", "request_locks", "management", "admin", "schedules", "contrib", "cache", "testing"
)  # fmt: skip
ABOVE_CONF = ("locking", "effects", "inspection", "fencing", *ABOVE_LOCKING)
#: The layering rules (docs/architecture.md): (importers, importers exempt, forbidden, allowed).
#: A module is an importer when it is, or is inside, one of ``importers`` and not one of the
#: exempt; it may import nothing that is, or is inside, a forbidden prefix unless that is, or
#: is inside, an allowed one.
RULES: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    # the engine imports nothing of the package outside it
    ((f"{P}.engine",), (), (f"{P}",), (f"{P}.engine",)),
    # outside the engine, only its facade (django_redlock.engine), not its submodules
    ((f"{P}",), (f"{P}.engine",), (f"{P}.engine.",), ()),
    # the node topology imports neither the settings nor the lock API
    ((f"{P}.nodes",), (), (f"{P}.conf", f"{P}.locking"), ()),
    # the settings sit below everything that uses them
    ((f"{P}.conf",), (), tuple(f"{P}.{m}" for m in ABOVE_CONF), ()),
    # the lock API imports none of what is built on it
    ((f"{P}.locking",), (), tuple(f"{P}.{m}" for m in ABOVE_LOCKING), ()),
    # the test helpers are imported by tests and the pytest plugin, not by the product
    ((f"{P}",), (f"{P}.testing", f"{P}.pytest_plugin"), (f"{P}.testing",), ()),
)


def _within(name: str, prefix: str) -> bool:
    """``name`` is the module ``prefix`` or inside it (a prefix ending in "." is inside only)."""
    if prefix.endswith("."):
        return name.startswith(prefix)
    return name == prefix or name.startswith(prefix + ".")


def facade_modules() -> tuple[str, ...]:
    """The engine's submodules its facade exports by name (``__all__`` of
    ``django_redlock/engine/__init__.py``): importing them through it is importing the facade."""
    tree = ast.parse((ROOT / PACKAGE / "engine" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names = ast.literal_eval(node.value)
            return tuple(
                f"{P}.engine.{n}" for n in names if (ROOT / PACKAGE / "engine" / f"{n}.py").exists()
            )
    return ()


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports that break :data:`RULES` (the engine's modules its facade exports count as
    the facade)."""
    exported = set(facade_modules())
    found = []
    for name, deps in sorted(graph.items()):
        deps = {f"{P}.engine" if d in exported else d for d in deps}
        for importers, exempt, forbidden, allowed in RULES:
            if not any(_within(name, p) for p in importers) or any(
                _within(name, p) for p in exempt
            ):
                continue
            for dep in sorted(deps):
                if any(_within(dep, f) for f in forbidden) and not any(
                    _within(dep, a) for a in allowed
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
