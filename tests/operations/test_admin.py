"""The "Locks" admin page with the test client: permissions, CSRF, force release, LogEntry."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from django_redlock import inspection as inspect
from django_redlock import locks
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_redlock_lock_changelist"
RELEASE = "admin:django_redlock_lock_release"


def owner_of(lease: object) -> str:
    owner: str = lease.record.owner  # type: ignore[attr-defined]
    return owner


def staff(django_user_model: Any, username: str, *perms: str) -> Any:
    user = django_user_model.objects.create_user(username, password="pw", is_staff=True)
    for perm in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_redlock", codename=perm)
        )
    return user


def selected(alias: str, name: str) -> str:
    info, _ = inspect.get_lock(alias, name)
    assert info is not None
    return json.dumps([alias, name, info.token, info.lease_id])


@pytest.fixture
def held(unique_name: str) -> Any:
    lease = locks["multi"].acquire(unique_name, ttl=30, timeout=0)
    yield lease
    lease.release()


def test_anonymous_is_sent_to_login(client: Client, held: Any) -> None:
    response = client.get(reverse(CHANGELIST))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    response = client.post(reverse(RELEASE), {"selected": selected("multi", held.name)})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert inspect.get_lock("multi", held.name)[0] is not None


def test_staff_without_permission_sees_nothing(
    client: Client, django_user_model: Any, held: Any
) -> None:
    client.force_login(staff(django_user_model, "nobody"))
    assert client.get(reverse(CHANGELIST)).status_code == 403
    assert b"django_redlock/lock" not in client.get(reverse("admin:index")).content
    client.force_login(staff(django_user_model, "deleter", "delete_lock"))
    assert client.get(reverse(CHANGELIST)).status_code == 403


def test_non_staff_user_is_refused(client: Client, django_user_model: Any, held: Any) -> None:
    user = django_user_model.objects.create_superuser("boss", password="pw")
    user.is_staff = False
    user.save()
    client.force_login(user)
    assert client.get(reverse(CHANGELIST)).status_code == 302


def test_viewer_lists_but_cannot_release(
    client: Client, django_user_model: Any, held: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client.force_login(staff(django_user_model, "viewer", "view_lock"))
    index = client.get(reverse("admin:index")).content.decode()
    assert reverse(CHANGELIST) in index
    response = client.get(reverse(CHANGELIST), {"q": held.name})
    assert response.status_code == 200
    html = response.content.decode()
    assert held.name in html and 'name="_selected_action"' not in html
    assert 'name="action"' not in html
    with caplog.at_level(logging.WARNING, logger="django_redlock"):
        response = client.post(
            reverse(RELEASE), {"selected": selected("multi", held.name), "post": "yes"}
        )
    assert response.status_code == 403
    assert "Force release denied" in caplog.text and held.name in caplog.text
    assert inspect.get_lock("multi", held.name)[0] is not None
    assert not LogEntry.objects.exists()


def test_superuser_sees_locks_and_nodes(admin_client: Client, held: Any) -> None:
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert reverse(CHANGELIST) in index and "Locks" in index
    response = admin_client.get(reverse(CHANGELIST), {"q": held.name})
    assert response.status_code == 200
    html = response.content.decode()
    info, _ = inspect.get_lock("multi", held.name)
    assert info is not None
    assert held.name in html and "3/3" in html and str(info.token) in html
    assert owner_of(held)[:4] + "…" in html and owner_of(held) not in html
    assert html.count('class="up"') == 9 and 'class="down"' not in html
    assert "site-name" in html  # rendered inside the admin's own layout
    assert info.acquired_at is not None
    assert info.acquired_at.strftime("%Y-%m-%d %H:%M:%S") in html  # UTC, not TIME_ZONE
    other = admin_client.get(reverse(CHANGELIST), {"q": held.name + "-nothing"})
    assert f'field-name">{held.name}<' in html
    assert "No locks are held with a name starting with" in other.content.decode()


def test_pagination(admin_client: Client, unique_name: str, settings: Any) -> None:
    from django_redlock.admin import LockAdmin

    leases = [locks["default"].acquire(f"{unique_name}:{i}", ttl=30, timeout=0) for i in range(5)]
    try:
        seen = []
        for page in (1, 2, 3):
            LockAdmin.list_per_page = 2
            html = admin_client.get(reverse(CHANGELIST), {"q": unique_name, "p": page})
            text = html.content.decode()
            seen += re.findall(rf"field-name\">({re.escape(unique_name)}:\d)<", text)
            assert ("next &rsaquo;" in text) == (page < 3)
            assert ("&lsaquo; previous" in text) == (page > 1)
        assert sorted(seen) == sorted(lease.name for lease in leases)
    finally:
        LockAdmin.list_per_page = 50
        for lease in leases:
            lease.release()


def test_get_never_releases(admin_client: Client, held: Any) -> None:
    response = admin_client.get(
        reverse(RELEASE), {"selected": selected("multi", held.name), "post": "yes"}
    )
    assert response.status_code == 405
    assert inspect.get_lock("multi", held.name)[0] is not None


def test_force_release_with_confirmation(admin_client: Client, held: Any) -> None:
    value = selected("multi", held.name)
    page = admin_client.post(reverse(RELEASE), {"selected": value})
    assert page.status_code == 200
    html = page.content.decode()
    assert "Yes, release" in html and held.name in html and "3/3" in html
    assert owner_of(held) not in html
    assert inspect.get_lock("multi", held.name)[0] is not None  # not yet
    done = admin_client.post(reverse(RELEASE), {"selected": value, "post": "yes"}, follow=True)
    assert done.redirect_chain[-1][0] == reverse(CHANGELIST)
    assert "Force-released lock" in done.content.decode()
    assert inspect.get_lock("multi", held.name) == (None, [])
    entry = LogEntry.objects.get()
    assert entry.action_flag == DELETION and entry.object_id == f"multi:{held.name}"
    assert "on 3 of 3 nodes" in entry.change_message and owner_of(held) not in entry.change_message
    again = locks["multi"].acquire(held.name, ttl=30, timeout=0)
    assert again.token > held.token
    assert held.release() is False
    again.release()


def test_new_holder_is_never_released(admin_client: Client, held: Any) -> None:
    """The form names the lease listed; if the lock changed hands it is left alone."""
    value = selected("multi", held.name)
    held.release()
    newer = locks["multi"].acquire(held.name, ttl=30, timeout=0)
    try:
        page = admin_client.post(reverse(RELEASE), {"selected": value}).content.decode()
        assert "now held by another lease" in page
        done = admin_client.post(reverse(RELEASE), {"selected": value, "post": "yes"}, follow=True)
        assert "Not released" in done.content.decode()
        info, _ = inspect.get_lock("multi", held.name)
        assert info is not None and info.lease_id == inspect.lease_id(owner_of(newer))
        assert not LogEntry.objects.exists()
    finally:
        newer.release()


def test_csrf_is_enforced(admin_user: Any, held: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    value = selected("multi", held.name)
    response = client.post(reverse(RELEASE), {"selected": value, "post": "yes"})
    assert response.status_code == 403
    assert inspect.get_lock("multi", held.name)[0] is not None
    client.get(reverse(CHANGELIST))
    token = client.cookies["csrftoken"].value
    response = client.post(
        reverse(RELEASE), {"selected": value, "post": "yes", "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302
    assert inspect.get_lock("multi", held.name)[0] is None


def test_node_down_shows_in_the_panel(
    admin_client: Client, redis_nodes: RedisNodes, redlock_alias: Callable[..., LockManager]
) -> None:
    manager = redlock_alias(redis_nodes)
    lease = manager.acquire("panel", ttl=30, timeout=0)
    redis_nodes[0].kill()
    html = admin_client.get(reverse(CHANGELIST), {"q": "panel"}).content.decode()
    assert 'class="down"' in html and "(1 down)" in html
    assert "2/3" in html and "unreachable" in html
    assert lease.validity > 0


def test_force_release_fences_the_evicted_holder(admin_client: Client, unique_name: str) -> None:
    """After a force release the next lease has a larger token, and once it has written the
    row, the evicted holder's save is rejected by the database."""
    from django_redlock.exceptions import StaleTokenError
    from testproject.inventory.models import Product

    product = Product.objects.create(name="widget", stock=10)
    name = f"product:{product.pk}:{unique_name}"
    old = locks["multi"].acquire(name, ttl=30, timeout=0)
    stale_copy = Product.objects.get(pk=product.pk)
    stale_copy.stock = 9
    stale_copy.save(fence_token=old.token)
    response = admin_client.post(
        reverse(RELEASE), {"selected": selected("multi", name), "post": "yes"}
    )
    assert response.status_code == 302
    new = locks["multi"].acquire(name, ttl=30, timeout=0)
    try:
        assert new.token > old.token
        fresh = Product.objects.get(pk=product.pk)
        fresh.stock = 5
        fresh.save(fence_token=new.token)
        stale_copy.stock = 8
        with pytest.raises(StaleTokenError), transaction.atomic():
            stale_copy.save(fence_token=old.token)
        assert Product.objects.get(pk=product.pk).stock == 5
        assert old.release() is False
    finally:
        new.release()


def test_force_release_is_a_django_admin_action(admin_client: Client, held: Any) -> None:
    """Django's action machinery: the ``_selected_action`` checkboxes, the select-all box and
    the counter of ``actions.js``, the action form posted to the changelist, the same
    confirmation page and LogEntry."""
    html = admin_client.get(reverse(CHANGELIST), {"q": held.name}).content.decode()
    value = selected("multi", held.name)
    assert f'name="{ACTION_CHECKBOX_NAME}" value="{escape(value)}" class="action-select"' in html
    assert 'id="action-toggle"' in html and 'class="action-counter"' in html
    assert "0 of 1 selected" in html and "admin/js/actions" in html
    assert re.findall(r'<option value="(\w*)"', html) == ["", "force_release"]
    assert 'name="select_across"' in html and 'name="index"' in html
    assert 'action="/' not in html.split('id="changelist-form"')[1].split(">")[0]
    url = reverse(CHANGELIST) + f"?q={held.name}"
    page = admin_client.post(
        url, {"action": "force_release", "index": "0", ACTION_CHECKBOX_NAME: value}
    )
    assert page.status_code == 200 and "Yes, release" in page.content.decode()
    assert 'name="action" value="force_release"' in page.content.decode()
    assert inspect.get_lock("multi", held.name)[0] is not None  # not yet
    done = admin_client.post(
        url, {"action": "force_release", ACTION_CHECKBOX_NAME: value, "post": "yes"}
    )
    assert done.status_code == 302 and done["Location"] == url
    assert inspect.get_lock("multi", held.name) == (None, [])
    entry = LogEntry.objects.get()
    assert entry.action_flag == DELETION and entry.object_id == f"multi:{held.name}"


def test_action_needs_a_choice_and_a_selection(admin_client: Client, held: Any) -> None:
    """Go without an action, or without ticked locks: Django's warnings, nothing released."""
    value = selected("multi", held.name)
    for data, warning in (
        ({"action": "", "index": "0", ACTION_CHECKBOX_NAME: value}, "No action selected"),
        ({"action": "force_release", "index": "0"}, "Items must be selected"),
        ({"action": "delete_selected", "index": "0", ACTION_CHECKBOX_NAME: value}, "No action"),
    ):
        done = admin_client.post(reverse(CHANGELIST), data, follow=True)
        assert warning in done.content.decode()
    assert inspect.get_lock("multi", held.name)[0] is not None
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("via", ["release-url", "action"])
def test_tampered_values_never_give_500(admin_client: Client, held: Any, via: str) -> None:
    """An unknown alias is refused with a message on both POSTs; malformed values (not
    JSON, wrong shape, reserved or invalid names) are dropped: never a 500."""

    def post(values: list[str], **extra: str) -> Any:
        if via == "release-url":
            return admin_client.post(reverse(RELEASE), {"selected": values, **extra})
        data = {ACTION_CHECKBOX_NAME: values, "action": "force_release", **extra}
        return admin_client.post(reverse(CHANGELIST), data)

    unknown = json.dumps(["nope", "order:1", 1, "0" * 16])
    page = post([unknown])
    assert page.status_code == 200 and "unknown alias &#x27;nope&#x27;" in page.content.decode()
    done = post([unknown], post="yes")
    assert done.status_code == 302
    text = admin_client.get(done["Location"]).content.decode()
    assert "Not released: unknown alias &#x27;nope&#x27;." in text
    malformed = ["not json", "[1, 2]", json.dumps(["multi", held.name, "1", "x"])]
    malformed += [json.dumps(["multi", name, 1, "x"]) for name in ("__fence__", "", "\ud800")]
    for extra in ({}, {"post": "yes"}):
        assert post(malformed, **extra).status_code == 302
    assert inspect.get_lock("multi", held.name)[0] is not None
    assert not LogEntry.objects.exists()
