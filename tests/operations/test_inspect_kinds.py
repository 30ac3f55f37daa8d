"""Semaphores and read-write locks in ``manage.py redlock`` and the admin page:
listed with their kind and holders (owners masked), released permit by permit."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from django_redlock import inspection as inspect
from django_redlock import locks
from django_redlock.exceptions import LockNotAcquired

pytestmark = pytest.mark.django_db
CHANGELIST = "admin:django_redlock_lock_changelist"
RELEASE = "admin:django_redlock_lock_release"


def run(*args: str) -> str:
    out = StringIO()
    call_command("redlock", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def owner_of(lease: object) -> str:
    owner: str = lease.record.owner  # type: ignore[attr-defined]
    return owner


@pytest.mark.parametrize("alias", ["default", "five"])
def test_list_show_and_release_a_semaphore(alias: str, unique_name: str) -> None:
    manager = locks[alias]
    permits = [manager.acquire(unique_name, ttl=30, timeout=0, permits=3) for _ in range(2)]
    lock = manager.acquire(f"{unique_name}-lock", ttl=30, timeout=0)
    rows = json.loads(run("list", "--using", alias, "--prefix", unique_name, "--json"))
    by_name = {row["name"]: row for row in rows}
    sem, plain = by_name[unique_name], by_name[f"{unique_name}-lock"]
    assert (sem["kind"], sem["permits"], len(sem["holders"])) == ("semaphore", 3, 2)
    assert sorted(h["token"] for h in sem["holders"]) == sorted(p.token for p in permits)
    assert sem["token"] == max(p.token for p in permits)
    assert all(h["nodes_held"] == len(manager.config.nodes) for h in sem["holders"])
    text = json.dumps(rows)
    for lease in (*permits, lock):
        assert owner_of(lease) not in text  # masked
    assert (plain["kind"], plain["permits"], len(plain["holders"])) == ("lock", None, 1)
    assert "semaphore 2/3 permits" in run("show", unique_name, "--using", alias)
    run("release", unique_name, "--using", alias)
    assert [p.release() for p in permits] == [False, False]  # both were force-released
    again = [manager.acquire(unique_name, ttl=5, timeout=0, permits=3) for _ in range(3)]
    assert min(p.token for p in again) > max(p.token for p in permits)
    for lease in (*again, lock):
        lease.release()
    with pytest.raises(CommandError):
        run("release", unique_name, "--using", alias)  # not held


def test_read_leases_are_listed_with_their_holders(unique_name: str) -> None:
    """A read-write lock's readers are one row of kind ``read``, each reader a holder
    (released by an operator in tests/operations/test_force_release_kinds.py)."""
    manager = locks["five"]
    readers = [manager.acquire(unique_name, ttl=30, timeout=0, rw="read") for _ in range(3)]
    info, _ = inspect.get_lock("five", unique_name)
    assert info is not None
    assert (info.kind, len(info.holders), info.kind_label) == ("read", 3, "read: 3 readers")
    assert all(h["nodes_held"] == 5 and 0 < h["ttl_ms"] <= 30_000 for h in info.holders)
    with pytest.raises(LockNotAcquired):
        manager.acquire(unique_name, timeout=0, rw="write")
    for lease in readers:
        assert lease.release() is True
    assert inspect.get_lock("five", unique_name)[0] is None


def test_admin_lists_kinds_and_force_releases_a_semaphore(
    client: Client, django_user_model: Any, unique_name: str
) -> None:
    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    for codename in ("view_lock", "delete_lock"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_redlock", codename=codename)
        )
    client.force_login(user)
    permits = [locks["multi"].acquire(unique_name, ttl=30, timeout=0, permits=2) for _ in range(2)]
    page = client.get(reverse(CHANGELIST), {"q": unique_name}).content.decode()
    assert "semaphore 2/2 permits" in page
    info, _ = inspect.get_lock("multi", unique_name)
    assert info is not None
    selected = json.dumps(["multi", unique_name, info.token, info.lease_id])
    response = client.post(reverse(RELEASE), {"selected": selected, "post": "yes"})
    assert response.status_code == 302
    assert [p.release() for p in permits] == [False, False]
    locks["multi"].acquire(unique_name, timeout=0).release()  # free for any kind again
