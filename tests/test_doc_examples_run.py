"""Every Python example of the README and the docs runs as written, against the session's real
nodes and the test database (``tests/support/doc_examples.py`` says how): each top-level
statement in turn, a model it defines gets a table, and a ``test_...`` function it defines is
called with its fixtures. A block that cannot run here says why before its fence; the
README's quick start also runs in a new project on the installed wheel (``.ci/package_smoke.py``).
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import inspect
import sys
import types
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Model
from django.test import override_settings
from django.test.utils import isolate_apps

from tests.support.doc_examples import STAND_INS, Ended, Example, examples

EXAMPLES = examples()
#: the module an example runs as (its models' app is tests.docs_examples)
MODULE = "tests.docs_examples.example"
RUN = [example for example in EXAMPLES if not example.not_run]


def test_most_examples_run() -> None:
    """A block is left out only with a reason, and most blocks run."""
    assert len(RUN) >= 0.75 * len(EXAMPLES), [e.where for e in EXAMPLES if e.not_run]


def _free_names(tree: ast.Module) -> set[str]:
    """Names the example reads without defining or importing them."""
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read - bound - set(dir(builtins))


def _run(statement: ast.stmt, where: str, namespace: dict[str, Any]) -> None:
    code = compile(ast.Module([statement], []), where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:  # a top-level await: the example is asyncio
        asyncio.run(eval(code, namespace))
    else:
        exec(code, namespace)


def _call_tests(namespace: dict[str, Any], request: pytest.FixtureRequest) -> None:
    """Call each ``test_...`` function the example defined, its arguments from the stand-ins
    or this suite's fixtures."""
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    for test in tests:
        arguments = {
            name: STAND_INS[name]() if name in STAND_INS else request.getfixturevalue(name)
            for name in inspect.signature(test).parameters
        }
        test(**arguments)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("example", RUN, ids=[example.where for example in RUN])
def test_an_example_runs_as_written(example: Example, request: pytest.FixtureRequest) -> None:
    tree = ast.parse(example.code, example.where)
    free = _free_names(tree)
    missing = sorted(free - STAND_INS.keys())
    assert not missing, f"{example.where} reads {missing}: add stand-ins (tests/support)"
    # a module of its own: what it defines can be imported by path (a task queue does so)
    module = types.ModuleType(MODULE)
    namespace: dict[str, Any] = module.__dict__
    namespace.update({name: STAND_INS[name]() for name in sorted(free)})
    redis_cache = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": settings.REDLOCK["default"]["NODES"][0],
        "KEY_PREFIX": "doc-examples",
    }
    tables: list[type[Model]] = []
    with (
        mock.patch.dict(sys.modules, {MODULE: module}),
        isolate_apps("tests.docs_examples"),
        override_settings(CACHES={**settings.CACHES, "redis": redis_cache}),
    ):
        try:
            for statement in tree.body:
                _run(statement, example.where, namespace)
                made = namespace.get(getattr(statement, "name", ""))
                if isinstance(made, type) and issubclass(made, Model):
                    with connection.schema_editor() as editor:
                        editor.create_model(made)
                    tables.append(made)
            _call_tests(namespace, request)
        except Ended:
            pass  # a stand-in ended an example that would run on (a consumer loop)
        finally:
            for model in reversed(tables):
                with connection.schema_editor() as editor:
                    editor.delete_model(model)
