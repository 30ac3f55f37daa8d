"""scripts/import_cycles.py, the layering rules CI runs (docs/architecture.md): a wrong-way
import is caught, and the package has none."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "import_cycles.py"


@pytest.fixture(scope="module")
def rules() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("django_redlock.engine.core", "django_redlock.conf"),  # the engine knows no Django
        ("django_redlock.locking.lease", "django_redlock.engine.keyspace"),  # past the facade
        ("django_redlock.nodes.spec", "django_redlock.locking.manager"),
        ("django_redlock.conf", "django_redlock.locking.validation"),
        ("django_redlock.locking.block", "django_redlock.jobs.templates"),
        ("django_redlock.management.commands.redlock", "django_redlock.testing.simulation"),
    ],
)
def test_a_wrong_way_import_is_a_crossing(rules: ModuleType, importer: str, imported: str) -> None:
    assert rules.crossings({importer: {imported}}) == [f"{importer} imports {imported}"]


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("django_redlock.locking.lease", "django_redlock.engine"),  # the facade
        ("django_redlock.locking.lease", "django_redlock.engine.handoff"),  # exported by it
        ("django_redlock.engine.core", "django_redlock.engine.keyspace"),
        ("django_redlock.pytest_plugin", "django_redlock.testing.nodes"),
        ("django_redlock.jobs.runner", "django_redlock.locking.templates"),
    ],
)
def test_an_import_with_the_grain_is_not(rules: ModuleType, importer: str, imported: str) -> None:
    assert rules.crossings({importer: {imported}}) == []


def test_the_package_has_no_circle_and_no_crossing(
    rules: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = sys.argv
    try:
        assert rules.main() == 0
    finally:
        sys.argv = argv
    assert "0 import circle(s), 0 layer crossing(s)" in capsys.readouterr().out
