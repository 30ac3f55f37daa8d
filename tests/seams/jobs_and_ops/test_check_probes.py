"""Probes of the startup checks (docs/checks.md): E019 on templates that differ only in their
field names vs templates that really differ, and W009 on every documented REDLOCK setting."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_redlock import checks
from django_redlock.request_locks.checks import check_request_locks

MIDDLEWARE_PATH = "django_redlock.middleware.RequestLockMiddleware"


def e019(settings: Any, *entries: dict[str, Any]) -> list[str]:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.REDLOCK_REQUEST_LOCKS = list(entries)
    return [m.msg for m in check_request_locks() if m.id == "django_redlock.E019"]


def rule(key: str, groups: str, **extra: Any) -> dict[str, Any]:
    path = "".join(f"(?P<{g}>[0-9]+)/" for g in groups.split())
    return {"PATH": rf"^/p{len(path)}/{path}", "KEY": key, **extra}


SHARED = {
    "field names": (rule("doc:{a}", "a"), rule("doc:{b}", "b", LIMIT=3)),
    "two fields": (rule("{a}:{b}", "a b"), rule("{x}:{y}", "x y", LIMIT=2)),
    "explicit default alias": (
        rule("doc:{a}", "a"),
        rule("doc:{b}", "b", LIMIT=3, USING="default"),
    ),
    "two limits": (rule("doc:{a}", "a", LIMIT=2), rule("doc:{b}", "b", LIMIT=3)),
    "no fields": (rule("static", "a"), rule("static", "b", LIMIT=3)),
}
DIFFERENT = {
    "other text": (rule("doc:{a}", "a"), rule("doc-x:{b}", "b", LIMIT=3)),
    "same limit": (rule("doc:{a}", "a", LIMIT=3), rule("doc:{b}", "b", LIMIT=3)),
    "other alias": (rule("doc:{a}", "a"), rule("doc:{b}", "b", LIMIT=3, USING="multi")),
    "two locks": (rule("doc:{a}", "a"), rule("doc:{b}", "b")),
    "longer": (rule("doc:{a}", "a"), rule("doc:{a}:x", "a", LIMIT=3)),
    "more fields": (rule("doc:{a}", "a"), rule("doc:{a}{b}", "a b", LIMIT=3)),
}


@pytest.mark.parametrize("case", list(SHARED))
def test_e019_on_templates_that_differ_only_in_field_names(settings: Any, case: str) -> None:
    """A lock and a LIMIT (or two different LIMITs) on one template, field names aside, on
    one alias: E019 once."""
    assert len(e019(settings, *SHARED[case])) == 1


@pytest.mark.parametrize("case", list(DIFFERENT))
def test_no_e019_on_templates_that_really_differ(settings: Any, case: str) -> None:
    """Other text, the same LIMIT, another alias, two locks: no E019 (no false refusal)."""
    assert e019(settings, *DIFFERENT[case]) == []


def test_no_w009_for_every_documented_setting() -> None:
    """REDLOCK, REDLOCK_BUSY_POLL, REDLOCK_BUSY_STATUS and REDLOCK_REQUEST_LOCKS set to valid
    values: no W009 (no false positive); a misspelt one next to them is warned about once."""
    valid = {
        "REDLOCK_BUSY_POLL": 0.005,
        "REDLOCK_BUSY_STATUS": 423,
        "REDLOCK_REQUEST_LOCKS": [rule("doc:{a}", "a")],
    }
    with override_settings(**valid):
        assert [m for m in checks.check_settings() if m.id == "django_redlock.W009"] == []
    with override_settings(**valid, REDLOCK_BUSYPOLL=0):
        found = [m for m in checks.check_settings() if m.id == "django_redlock.W009"]
        assert len(found) == 1 and "REDLOCK_BUSY_POLL" in (found[0].hint or "")
