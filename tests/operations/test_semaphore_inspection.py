"""Semaphores in ``manage.py redlock list/show/release/clear`` and on the admin Locks page, on
real nodes (1 and 5): one row per name with its kind, permits and holders (owners masked),
force-released permit by permit (docs/admin-and-cli.md and 12)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import DELETION, LogEntry
from django.core.management import CommandError
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from django_redlock import inspection, locks
from django_redlock.exceptions import LockLost, LockNotAcquired
from django_redlock.locking.lease import Lease
from tests.operations.test_admin import staff
from tests.operations.test_command import owner_of, run

pytestmark = pytest.mark.django_db
CHANGELIST = "admin:django_redlock_lock_changelist"
ALIASES = ["default", "five"]
HOLDER_KEYS = {"slot", "token", "owner", "lease_id", "ttl_ms", "nodes_held"}


def slot_of(lease: Lease) -> int:
    """The slot a permit holds, from its key ``<prefix>__permit__:<k>:<name>``."""
    return int(lease.record.key.split("__permit__:", 1)[1].split(":", 1)[0])


def node_clients(alias: str) -> list[redis.Redis]:
    return [redis.Redis.from_url(url) for url in settings.REDLOCK[alias]["NODES"]]


class Held:
    """Two of three permits of a semaphore and a lock, both names under one prefix."""

    def __init__(self, alias: str, prefix: str) -> None:
        self.alias, self.manager = alias, locks[alias]
        self.name, self.lock_name = f"{prefix}:sem", f"{prefix}:lock"
        self.permits = [
            self.manager.acquire(self.name, ttl=30, timeout=0, permits=3) for _ in range(2)
        ]
        self.lock = self.manager.acquire(self.lock_name, ttl=30, timeout=0)
        self.nodes = len(self.manager.config.nodes)

    def leases(self) -> list[Lease]:
        return [*self.permits, self.lock]

    def close(self) -> None:
        for lease in self.leases():
            if not lease.released:
                lease.release()


@pytest.fixture(params=ALIASES)
def held(request: pytest.FixtureRequest, unique_name: str) -> Iterator[Held]:
    state = Held(request.param, unique_name)
    yield state
    state.close()


def assert_semaphore_released(held: Held) -> None:
    """Both permits are gone (their leases are refused), the name is free for any kind, and
    the semaphore grants three permits again, with larger tokens."""
    assert inspection.get_lock(held.alias, held.name) == (None, [])
    for client in node_clients(held.alias):  # no slot and no marker left on any node
        keys = client.scan_iter(match=f"*{held.name}", count=500)
        assert [k for k in keys if b"__waiters__" not in k and b"__wake__" not in k] == []
    with pytest.raises(LockLost):
        held.permits[0].extend()
    assert [lease.release() for lease in held.permits] == [False, False]
    held.manager.acquire(held.name, ttl=5, timeout=0).release()  # a lock now: no marker
    again = [held.manager.acquire(held.name, ttl=5, timeout=0, permits=3) for _ in range(3)]
    try:
        assert min(p.token for p in again) > max(p.token for p in held.permits)
        with pytest.raises(LockNotAcquired):
            held.manager.acquire(held.name, ttl=5, timeout=0, permits=3)
    finally:
        for lease in again:
            assert lease.release() is True


# -- manage.py redlock ---------------------------------------------------------------------


def test_list_json_one_row_per_semaphore_with_its_holders(held: Held) -> None:
    prefix = held.name[:-5]  # a name prefix finds the semaphore by its marker
    out = run("list", "--using", held.alias, "--prefix", prefix, "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert sorted(rows) == sorted([held.name, held.lock_name])  # no row for the slot keys
    sem, lock = rows[held.name], rows[held.lock_name]
    assert (sem["alias"], sem["kind"], sem["permits"]) == (held.alias, "semaphore", 3)
    assert (sem["nodes_held"], sem["nodes_total"]) == (held.nodes, held.nodes)
    assert type(sem["ttl_ms"]) is int and type(sem["token"]) is int
    holders = sorted(sem["holders"], key=lambda h: h["token"])
    assert [set(h) for h in holders] == [HOLDER_KEYS, HOLDER_KEYS]
    for holder, lease in zip(holders, sorted(held.permits, key=lambda p: p.token), strict=True):
        assert holder["token"] == lease.token and holder["slot"] == slot_of(lease)
        assert holder["owner"] == owner_of(lease)[:4] + "…"
        assert holder["lease_id"] == inspection.lease_id(owner_of(lease))
        assert holder["nodes_held"] == held.nodes and 25_000 < holder["ttl_ms"] <= 30_000
    assert sorted(h["slot"] for h in holders) == [0, 1]
    assert sem["token"] == max(p.token for p in held.permits)
    assert sem["ttl_ms"] == max(h["ttl_ms"] for h in holders)
    assert sem["owner"] == holders[-1]["owner"] and sem["lease_id"] == holders[-1]["lease_id"]
    # a lock row keeps every field, and its holders list has the same shape
    assert (lock["kind"], lock["permits"], lock["token"]) == ("lock", None, held.lock.token)
    assert (lock["nodes_held"], lock["nodes_total"]) == (held.nodes, held.nodes)
    assert [set(h) for h in lock["holders"]] == [HOLDER_KEYS]
    assert lock["holders"][0]["slot"] is None
    assert lock["holders"][0]["token"] == held.lock.token == lock["token"]
    assert lock["holders"][0]["owner"] == lock["owner"] == owner_of(held.lock)[:4] + "…"
    text = run("list", "--using", held.alias, "--prefix", prefix)
    assert "KIND" in text and "semaphore 2/3 permits" in text
    sem_line = next(line for line in text.splitlines() if f" {held.name} " in line)
    assert f"{held.nodes}/{held.nodes}" in sem_line and str(sem["token"]) in sem_line
    for output in (out, text):
        for lease in held.leases():
            assert owner_of(lease) not in output  # owners are secrets


def test_show_text_and_json(held: Held) -> None:
    doc = json.loads(run("show", held.name, "--using", held.alias, "--json"))
    assert (doc["kind"], doc["permits"], len(doc["holders"])) == ("semaphore", 3, 2)
    assert sorted(h["token"] for h in doc["holders"]) == sorted(p.token for p in held.permits)
    text = run("show", held.name, "--using", held.alias)
    assert "semaphore 2/3 permits" in text and "HOLDERS (2):" in text
    holder_lines = text.split("HOLDERS (2):", 1)[1].strip().splitlines()
    assert holder_lines[0].split() == ["SLOT", "TOKEN", "OWNER", "LEASE", "TTL", "NODES"]
    for lease in held.permits:
        line = next(line for line in holder_lines if str(lease.token) in line)
        cells = line.split()
        assert cells[0] == str(slot_of(lease)) and cells[2] == owner_of(lease)[:4] + "…"
        assert cells[-1] == f"{held.nodes}/{held.nodes}"
    lock_text = run("show", held.lock_name, "--using", held.alias)
    assert "HOLDERS (1):" in lock_text and str(held.lock.token) in lock_text.split("HOLDERS")[1]
    for output in (text, lock_text, json.dumps(doc)):
        for lease in held.leases():
            assert owner_of(lease) not in output


def test_release_frees_every_permit_and_the_marker(held: Held) -> None:
    out = run("release", held.name, "--using", held.alias)
    assert f"Released semaphore {held.name!r}" in out and "2 permits of 3" in out
    assert f"on {held.nodes}/{held.nodes} nodes" in out
    assert inspection.get_lock(held.alias, held.lock_name)[0] is not None  # the lock stays
    assert_semaphore_released(held)
    with pytest.raises(CommandError, match="not held"):
        run("release", held.name, "--using", held.alias)


def test_release_with_a_stale_token_releases_nothing(held: Held) -> None:
    oldest = min(p.token for p in held.permits)
    with pytest.raises(CommandError, match="another newest permit"):
        run("release", held.name, "--using", held.alias, "--token", str(oldest))
    info, _ = inspection.get_lock(held.alias, held.name)
    assert info is not None and len(info.holders) == 2
    newest = str(max(p.token for p in held.permits))
    assert "Released semaphore" in run(
        "release", held.name, "--using", held.alias, "--token", newest
    )
    assert_semaphore_released(held)


def test_release_wakes_a_waiter(held: Held) -> None:
    third = held.manager.acquire(held.name, ttl=30, timeout=0, permits=3)
    held.permits.append(third)
    got: list[Lease] = []
    waiter = threading.Thread(
        target=lambda: got.append(held.manager.acquire(held.name, ttl=5, timeout=20, permits=3))
    )
    waiter.start()
    deadline = time.monotonic() + 10
    while True:
        info, _ = inspection.get_lock(held.alias, held.name)
        assert info is not None and time.monotonic() < deadline
        if info.waiters == 1:
            break
        time.sleep(0.02)
    assert info.kind_label == "semaphore 3/3 permits"
    assert json.loads(run("show", held.name, "--using", held.alias, "--json"))["waiters"] == 1
    started = time.monotonic()
    run("release", held.name, "--using", held.alias)
    waiter.join(15)
    assert got and time.monotonic() - started < 5  # woken, not the 20 s timeout
    assert got[0].token > third.token
    assert got[0].release() is True
    assert [lease.release() for lease in held.permits] == [False, False, False]


def test_clear_prefix_releases_semaphores_and_locks(held: Held, unique_name: str) -> None:
    keep = held.manager.acquire(f"{unique_name}-keep", ttl=30, timeout=0, permits=2)
    try:
        with pytest.raises(CommandError, match="--yes"):
            run("clear", "--prefix", f"{unique_name}:", "--using", held.alias)
        assert inspection.get_lock(held.alias, held.name)[0] is not None
        out = run("clear", "--prefix", f"{unique_name}:", "--using", held.alias, "--yes")
        assert "Released 2 lock(s)." in out  # the semaphore (both permits) and the lock
        assert held.lock.release() is False
        assert_semaphore_released(held)
        rows = json.loads(run("list", "--using", held.alias, "--prefix", unique_name, "--json"))
        assert [(r["name"], r["kind"], len(r["holders"])) for r in rows] == [
            (keep.name, "semaphore", 1)
        ]
    finally:
        assert keep.release() is True


# -- inspection: paging and the nodes rule ---------------------------------------------------


def test_pages_count_a_semaphore_once(held: Held, unique_name: str) -> None:
    seen = []
    for offset in range(3):
        page = inspection.list_locks([held.alias], f"{unique_name}:", offset, 1)
        seen += [(info.name, info.kind) for info in page.locks]
        assert page.has_more == (offset == 0)
    assert sorted(seen) == sorted([(held.name, "semaphore"), (held.lock_name, "lock")])


def test_five_nodes_row_counts_its_best_replicated_permit(unique_name: str) -> None:
    """Per permit, ``nodes_held`` counts the nodes where its slot key holds its value; the
    row shows the best-replicated permit's count (and its TTL the longest a permit has)."""
    held = Held("five", unique_name)
    try:
        damaged, intact = sorted(held.permits, key=lambda p: p.token)
        for client in node_clients("five")[:2]:
            assert client.delete(damaged.record.key) == 1
        info, errors = inspection.get_lock("five", held.name)
        assert info is not None and not errors
        by_token = {h["token"]: h for h in info.holders}
        assert by_token[damaged.token]["nodes_held"] == 3
        assert by_token[intact.token]["nodes_held"] == 5
        assert (info.nodes_held, info.nodes_total, info.quorum_held) == (5, 5, True)
        for client in node_clients("five")[2:4]:
            assert client.delete(intact.record.key) == 1
        info, _ = inspection.get_lock("five", held.name)
        assert info is not None
        assert sorted(h["nodes_held"] for h in info.holders) == [3, 3]
        assert info.nodes_held == 3
    finally:
        held.close()


# -- the admin page --------------------------------------------------------------------------


def test_admin_changelist_shows_the_kind_and_permits(
    client: Client, django_user_model: Any, held: Held
) -> None:
    client.force_login(staff(django_user_model, "viewer", "view_lock"))
    html = client.get(reverse(CHANGELIST), {"q": held.name[:-4]}).content.decode()
    assert '<th scope="col">Kind</th>' in html
    assert html.count('class="field-name"') == 2
    assert f'field-name">{held.name}<' in html and f'field-name">{held.lock_name}<' in html
    assert 'field-kind">semaphore 2/3 permits<' in html and 'field-kind">lock<' in html
    assert str(max(p.token for p in held.permits)) in html
    newest = max(held.permits, key=lambda p: p.token)
    assert owner_of(newest)[:4] + "…" in html
    for lease in held.leases():
        assert owner_of(lease) not in html
    assert 'name="_selected_action"' not in html  # viewing only: no action


def test_admin_action_force_releases_every_permit(
    client: Client, django_user_model: Any, held: Held
) -> None:
    url = reverse(CHANGELIST)
    client.force_login(staff(django_user_model, "viewer", "view_lock"))
    info, _ = inspection.get_lock(held.alias, held.name)
    assert info is not None
    value = json.dumps([held.alias, held.name, info.token, info.lease_id])
    refused = client.post(
        url, {"action": "force_release", ACTION_CHECKBOX_NAME: value, "post": "yes"}
    )
    assert refused.status_code == 403  # needs delete_lock
    assert inspection.get_lock(held.alias, held.name)[0] is not None

    client.force_login(staff(django_user_model, "ops", "view_lock", "delete_lock"))
    html = client.get(url, {"q": held.name}).content.decode()
    assert f'value="{escape(value)}" class="action-select"' in html
    assert 'name="_selected_action"' in html and 'field-kind">semaphore 2/3 permits<' in html
    page = client.post(url, {"action": "force_release", "index": "0", ACTION_CHECKBOX_NAME: value})
    assert page.status_code == 200
    confirm = page.content.decode()
    assert "Yes, release" in confirm and "semaphore 2/3 permits" in confirm
    assert "every permit will be released" in confirm
    for lease in held.permits:
        assert f"slot {slot_of(lease)}: token {lease.token}" in confirm
        assert owner_of(lease) not in confirm
    assert inspection.get_lock(held.alias, held.name)[0] is not None  # not yet
    assert not LogEntry.objects.exists()

    done = client.post(
        url, {"action": "force_release", ACTION_CHECKBOX_NAME: value, "post": "yes"}, follow=True
    )
    assert done.status_code == 200
    assert escape(f"Force-released semaphore {held.name!r}") in done.content.decode()
    entry = LogEntry.objects.get()
    assert entry.action_flag == DELETION and entry.object_id == f"{held.alias}:{held.name}"
    assert "2 of 3 permits" in entry.change_message
    assert f"on {held.nodes} of {held.nodes} nodes" in entry.change_message
    for lease in held.permits:
        assert owner_of(lease) not in entry.change_message
    assert inspection.get_lock(held.alias, held.lock_name)[0] is not None  # not selected
    assert_semaphore_released(held)
