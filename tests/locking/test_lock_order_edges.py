"""The lock-order checker where features meet (found by an outside attack): a template and a
plain name of one lock are one shape; a cycle of three shapes fails ``redlock order --check``;
the records are bounded; a manager kept in a global follows the setting."""

from __future__ import annotations

import json
import warnings
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_redlock import lock, locks
from django_redlock.locking import ordering
from tests.locking.test_lock_order import _recorded, checker  # noqa: F401  (the fixture)


def test_template_and_plain_name_of_one_lock_are_one_shape(checker: str) -> None:  # noqa: F811
    """A view takes order:N then invoice:N by plain names; a job takes invoice then order
    through @lock templates: the same names, so the same shapes, and the inversion warns. A
    field filled with a slug keeps the template's field (one shape, not one per value)."""
    p = checker

    @lock(p + ":order:{pk}", timeout=1)
    def take_order(pk: int) -> None:
        pass

    @lock(p + ":invoice:{pk}", timeout=1)
    def job(pk: int) -> None:
        take_order(pk)

    with lock(f"{p}:order:5", timeout=1), lock(f"{p}:invoice:5", timeout=1):
        pass
    with pytest.warns(RuntimeWarning, match="Lock order inversion"):
        job(7)
    assert _recorded() == {
        (f"{p}:order:{{n}}", f"{p}:invoice:{{n}}"),
        (f"{p}:invoice:{{n}}", f"{p}:order:{{n}}"),
    }
    assert ordering.templated("cart:alice", "cart:{user.username}") == "cart:{user.username}"
    assert ordering.templated("a12", "{a}{b}") == "{a}{b}"  # cannot be split: as written


def _order(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("redlock", "order", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_cycle_of_three_shapes_fails_the_check(checker: str) -> None:  # noqa: F811
    """A -> B, B -> C, C -> A: no pair is inverted, but three callers deadlock. The text and
    JSON outputs name the cycle and --check exits with status 3."""
    p = checker
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no pair: no warning
        for first, second in (("a", "b"), ("b", "c"), ("c", "a")):
            with lock(f"{p}:{first}:1", timeout=1), lock(f"{p}:{second}:1", timeout=1):
                pass
    text, _ = _order()
    assert f"Cycle: {p}:a:{{n}} -> {p}:b:{{n}} -> {p}:c:{{n}} -> {p}:a:{{n}}" in text
    document = json.loads(_order("--json")[0])
    assert [[s["shape"] for s in cycle] for cycle in document["cycles"]] == [
        [f"{p}:a:{{n}}", f"{p}:b:{{n}}", f"{p}:c:{{n}}"]
    ]
    with pytest.raises(CommandError, match="1 lock order cycle") as raised:
        _order("--check")
    assert raised.value.returncode == 3


def test_records_are_bounded(checker: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Names whose varying part is not masked (slugs) make a new shape each: past the bound,
    this process records no new edge, and the nodes keep no more fields."""
    from django_redlock.engine import order_edges
    from django_redlock.locking.ordering import checker as checker_module

    p = checker
    monkeypatch.setattr(checker_module, "MAX_EDGES", 5)
    monkeypatch.setattr(order_edges, "MAX_FIELDS", 6)  # 3 edges on the nodes
    with lock(f"{p}:outer", timeout=1):
        for word in ("ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen"):
            with lock(f"{p}:user:{word}", timeout=1):
                pass
    assert len(ordering.RECORDER.edges) == 5
    assert len(_recorded()) == 3


def test_a_kept_manager_follows_the_setting_after_a_bad_value(checker: str) -> None:  # noqa: F811
    """``manager = locks["default"]`` kept in a global: after a bad value dropped the
    registry's managers, it still follows the setting (off: no records; on: records)."""
    p = checker
    kept = locks["default"]
    with override_settings(REDLOCK_CHECK_ORDER="bad"):
        pass
    with (
        override_settings(REDLOCK_CHECK_ORDER=False),
        kept.lock(f"{p}:a:1", timeout=1),
        kept.lock(f"{p}:b:1", timeout=1),
    ):
        pass
    assert _recorded() == set()
    with (
        override_settings(REDLOCK_CHECK_ORDER=True),
        kept.lock(f"{p}:c:1", timeout=1),
        kept.lock(f"{p}:d:1", timeout=1),
    ):
        pass
    assert _recorded() == {(f"{p}:c:{{n}}", f"{p}:d:{{n}}")}


def test_the_documented_acl_user_shares_the_records(
    checker: str,  # noqa: F811
    redis_node_factory: Any,
) -> None:
    """An ACL user with the commands of docs/algorithm.md (tests/support/redis_acl.py) writes
    the checker's records and reads them back: another process would see its edges."""
    from django_redlock.locking.ordering import shared
    from tests.support.redis_acl import acl_user_urls

    p = checker
    nodes = redis_node_factory(1)
    urls = acl_user_urls(nodes, "locker", "pw", "acl:")
    with override_settings(REDLOCK={"default": {"NODES": urls, "KEY_PREFIX": "acl:"}}):
        with lock(f"{p}:a:1", timeout=1), lock(f"{p}:b:1", timeout=1):
            pass
        edges, errors = shared.read_all(locks["default"].engine)
        assert errors == {}
        assert {(r.edge[0][1], r.edge[1][1]) for r in edges} == {(f"{p}:a:{{n}}", f"{p}:b:{{n}}")}
