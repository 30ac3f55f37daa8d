"""The README's and docs' Python examples: each one is valid Python as written (indented
blocks dedented), and every name it imports from ``django_redlock`` exists, so an example
that names a moved or renamed API fails here, not in a user's project (with no server:
tests/test_doc_examples_run.py runs them against real nodes)."""

from __future__ import annotations

import ast
import importlib

import pytest

from tests.support.doc_examples import examples

EXAMPLES = [(example.where, example.code) for example in examples()]


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
