"""The README's and docs' Python examples: each one is valid Python as written (indented
blocks dedented), and every name it imports from ``django_redlock`` exists, so an example
that names a moved or renamed API fails here, not in a user's project."""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)


def _examples() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", textwrap.dedent(match.group(2))))
    return found


EXAMPLES = _examples()


def test_the_docs_have_examples() -> None:
    assert len(EXAMPLES) >= 50  # a change to the pattern above must not find none


@pytest.mark.parametrize(("where", "code"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_an_example_is_valid_python_and_its_imports_exist(where: str, code: str) -> None:
    tree = ast.parse(code, where, type_comments=False, feature_version=(3, 11))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("django_redlock"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name) or _submodule(node.module, alias.name), (
                    f"{where}: {node.module} has no {alias.name}"
                )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("django_redlock"):
                    importlib.import_module(alias.name)


def _submodule(module: str | None, name: str) -> bool:
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True
