"""Admin permission matrix: what ``tests/operations/test_admin.py`` does not already cover.

Every user kind x every way of asking for a force release: only a staff user with both
``view_lock`` and ``delete_lock`` (or a superuser) releases, only with a POST carrying
``post=yes`` and a CSRF token; every refusal leaves the lock held and every attempt by a
logged-in staff user is audited (a LogEntry for a release done, a ``django_redlock`` log
record for a denied or refused one).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils.http import urlencode

from django_redlock import inspection as inspect
from django_redlock import locks

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_redlock_lock_changelist"
RELEASE = "admin:django_redlock_lock_release"

USERS = {
    "staff-no-perm": (True, ()),
    "staff-view": (True, ("view_lock",)),
    "staff-delete-only": (True, ("delete_lock",)),
    "non-staff-both": (False, ("view_lock", "delete_lock")),
    "staff-both": (True, ("view_lock", "delete_lock")),
}


def make_user(django_user_model: Any, kind: str) -> Any:
    is_staff, perms = USERS[kind]
    user = django_user_model.objects.create_user(kind, password="pw", is_staff=is_staff)
    for perm in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_redlock", codename=perm)
        )
    return user


def selected(name: str) -> str:
    info, _ = inspect.get_lock("multi", name)
    assert info is not None
    return json.dumps(["multi", name, info.token, info.lease_id])


@pytest.fixture
def held(unique_name: str) -> Any:
    lease = locks["multi"].acquire(unique_name, ttl=30, timeout=0)
    yield lease
    lease.release()


def confirmed(via: str, value: str, token: str) -> tuple[str, dict[str, str]]:
    """URL and form of a confirmed force release: the admin action posted to the changelist,
    or the release view (kept for forms posting ``selected``)."""
    if via == "action":
        data = {ACTION_CHECKBOX_NAME: value, "action": "force_release", "post": "yes"}
        return reverse(CHANGELIST), {**data, "csrfmiddlewaretoken": token}
    return reverse(RELEASE), {"selected": value, "post": "yes", "csrfmiddlewaretoken": token}


@pytest.mark.parametrize("via", ["action", "release-url"])
@pytest.mark.parametrize("kind", list(USERS))
def test_force_release_matrix(
    kind: str, via: str, django_user_model: Any, held: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Each kind of user POSTs a confirmed force release (with a valid CSRF token), as the
    admin action or to the release view: only staff with view+delete releases it (and a
    LogEntry records it); the others get 403 or the login redirect, the lock stays held, no
    LogEntry is written, and staff refusals are logged as ``Force release denied``."""
    user = make_user(django_user_model, kind)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get(reverse("admin:index"))
    if "csrftoken" not in client.cookies:  # a non-staff user is shown the login form
        client.get(reverse("admin:login"))
    token = client.cookies["csrftoken"].value
    url, data = confirmed(via, selected(held.name), token)
    with caplog.at_level(logging.WARNING, logger="django_redlock"):
        response = client.post(url, data)
    records = [r for r in caplog.records if r.name == "django_redlock"]
    if kind == "staff-both":
        assert response.status_code == 302
        assert inspect.get_lock("multi", held.name)[0] is None
        entry = LogEntry.objects.get()
        assert entry.user_id == user.pk and held.name in entry.object_id
        assert any("Force-released" in r.getMessage() for r in records)
        return
    if kind == "non-staff-both":  # the admin site sends non-staff users to its login page
        assert response.status_code == 302 and "/login/" in response["Location"]
    else:
        assert response.status_code == 403
        assert any("Force release denied" in r.getMessage() for r in records), caplog.text
        assert any(held.name in r.getMessage() for r in records)
    assert inspect.get_lock("multi", held.name)[0] is not None
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("method", ["get", "head", "put", "delete", "options"])
def test_only_post_can_release(method: str, admin_client: Client, held: Any) -> None:
    """Any method but POST on the release view (even with ``post=yes``) is refused with 405,
    a POST to the list page that is not an action too, and the action's fields in the list
    page's query string do nothing: the lock stays held, nothing is audited."""
    value = selected(held.name)
    response = getattr(admin_client, method)(
        reverse(RELEASE) + f"?post=yes&selected={value}", {"selected": value, "post": "yes"}
    )
    assert response.status_code == 405
    response = admin_client.post(reverse(CHANGELIST), {"selected": value, "post": "yes"})
    assert response.status_code == 405  # not an action: no _selected_action nor index
    action = {ACTION_CHECKBOX_NAME: value, "action": "force_release", "post": "yes"}
    response = getattr(admin_client, method)(reverse(CHANGELIST) + "?" + urlencode(action))
    assert response.status_code == (200 if method in ("get", "head") else 405)
    assert inspect.get_lock("multi", held.name)[0] is not None
    assert not LogEntry.objects.exists()


def test_csrf_also_guards_the_confirmation_step(admin_user: Any, held: Any) -> None:
    """Without a CSRF token even the confirmation page (the first POST) is refused, as an
    action or at the release view; the lock stays held and nothing is audited."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    response = client.post(reverse(RELEASE), {"selected": selected(held.name)})
    assert response.status_code == 403
    action = {ACTION_CHECKBOX_NAME: selected(held.name), "action": "force_release", "index": 0}
    assert client.post(reverse(CHANGELIST), action).status_code == 403
    assert inspect.get_lock("multi", held.name)[0] is not None
    assert not LogEntry.objects.exists()


def test_changed_owner_refusal_is_logged(
    admin_client: Client, held: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The lock changed hands between listing and the confirmed POST: the release is refused,
    the new holder keeps it, no LogEntry is written, and the refusal is a ``django_redlock``
    warning naming the user (the audit of a refused attempt)."""
    value = selected(held.name)
    held.release()
    newer = locks["multi"].acquire(held.name, ttl=30, timeout=0)
    try:
        with caplog.at_level(logging.WARNING, logger="django_redlock"):
            admin_client.post(reverse(RELEASE), {"selected": value, "post": "yes"})
        info, _ = inspect.get_lock("multi", held.name)
        assert info is not None and info.token == newer.token
        assert not LogEntry.objects.exists()
        refused = [r for r in caplog.records if "refused" in r.getMessage()]
        assert refused and "admin" in refused[0].getMessage()
    finally:
        newer.release()
