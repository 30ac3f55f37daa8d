"""The suite's own rules (docs/testing.md, "Legs and groups"): the ``database`` and ``wire``
marks that choose CI's PostgreSQL and Valkey legs, and the xdist groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import DATABASE_FIXTURES, OFF_THE_WIRE, group_of

ROOT = Path(__file__).resolve().parent.parent


def test_a_query_without_a_database_fixture_fails_on_any_leg() -> None:
    """What makes the ``database`` mark complete: a test that touches the database without
    ``django_db`` or a fixture of ``DATABASE_FIXTURES`` is refused by pytest-django, so it
    fails on the SQLite leg too instead of silently missing the PostgreSQL one."""
    from testproject.inventory.models import Product

    with pytest.raises(RuntimeError, match="Database access not allowed"):
        Product.objects.count()


def test_the_database_mark_follows_the_fixtures(request: pytest.FixtureRequest, db: None) -> None:
    assert "db" in DATABASE_FIXTURES
    assert request.node.get_closest_marker("database") is not None


def test_a_test_without_the_database_is_not_marked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("database") is None
    assert request.node.get_closest_marker("wire") is not None  # this file is on the wire


@pytest.mark.parametrize("prefix", sorted(OFF_THE_WIRE))
def test_each_off_the_wire_entry_names_test_files(prefix: str) -> None:
    """A renamed module would otherwise fall back on the Valkey leg unnoticed; a stale entry
    would silently exclude nothing."""
    matches = [
        path
        for path in ROOT.glob("tests/**/test_*.py")
        if str(path.relative_to(ROOT)).startswith(prefix)
    ]
    assert matches, f"OFF_THE_WIRE entry {prefix!r} matches no test module"


@pytest.fixture(scope="module")
def shared_thing() -> str:
    """Stands for a module's node group or process pool."""
    return "shared"


def _group(request: pytest.FixtureRequest, name: str) -> str | None:
    (item,) = [i for i in request.session.items if i.name == name]
    return group_of(item)


def test_sharing_one(shared_thing: str) -> None:
    assert shared_thing == "shared"


def test_sharing_two(shared_thing: str) -> None:
    assert shared_thing == "shared"


def test_tests_sharing_a_module_fixture_run_on_one_worker(request: pytest.FixtureRequest) -> None:
    """Both users of ``shared_thing`` carry one ``xdist_group`` (``--dist loadgroup`` runs
    them on one worker, so the fixture starts once); a test that shares nothing has none."""
    one = _group(request, "test_sharing_one")
    assert one is not None and one.endswith(":shared_thing")
    assert _group(request, "test_sharing_two") == one
    assert _group(request, "test_tests_sharing_a_module_fixture_run_on_one_worker") is None
