"""Idempotent requests: regressions for the defects an outside attack found (a user's kept
response replayed to another user, template responses, rolled-back and raising views under
rules, CSRF rejections, oversize records), through Django's test clients against real Redis
nodes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connections
from django.test import AsyncClient, Client

from django_redlock.request_locks.checks import check_request_locks
from tests.support.idempotency_attack_urls import RUNS

URLS = "tests.support.idempotency_attack_urls"
pytestmark = pytest.mark.urls(URLS)
MIDDLEWARE_PATH = "django_redlock.middleware.RequestLockMiddleware"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"
JSON = {"Accept": "application/json"}


@pytest.fixture(autouse=True)
def _clear_runs() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()


def post(client: Client, url: str, key: str, body: str = "{}", **headers: str) -> Any:
    return client.post(
        url,
        body,
        content_type="application/json",
        headers={**JSON, "Idempotency-Key": key, **headers},
    )


# -- a rule placed before AuthenticationMiddleware ----------------------------------------------
def test_an_idempotent_rule_before_authentication_is_refused(
    client: Client, settings: Any, item_id: int, key: str, django_user_model: Any
) -> None:
    """Before AuthenticationMiddleware the request has no user: every user would share one key
    space and Bob would get Alice's kept response. The check reports it (E017) and the request
    is refused before the view runs, instead of replaying across users."""
    middleware = list(settings.MIDDLEWARE)
    middleware.insert(middleware.index(AUTH_MIDDLEWARE), MIDDLEWARE_PATH)
    settings.MIDDLEWARE = middleware
    settings.REDLOCK_REQUEST_LOCKS = [
        {"URL_NAME": "ruled", "KEY": "ruled:{item_id}", "IDEMPOTENCY": True}
    ]
    ids = [message.id for message in check_request_locks()]
    assert ids == ["django_redlock.E017"]
    client.force_login(django_user_model.objects.create_user(f"alice-{item_id}"))
    with pytest.raises(ImproperlyConfigured, match="AuthenticationMiddleware"):
        post(client, f"/ruled/{item_id}/", key)
    assert RUNS == {}


def test_an_idempotent_rule_after_authentication_scopes_keys_by_user(
    settings: Any, item_id: int, key: str, django_user_model: Any
) -> None:
    """In the right order, two users sending one key are two requests."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.REDLOCK_REQUEST_LOCKS = [
        {"URL_NAME": "ruled", "KEY": "ruled:{item_id}", "IDEMPOTENCY": True}
    ]
    assert check_request_locks() == []
    alice, bob = Client(), Client()
    alice.force_login(django_user_model.objects.create_user(f"alice-{item_id}"))
    bob_user = django_user_model.objects.create_user(f"bob-{item_id}")
    bob.force_login(bob_user)
    assert post(alice, f"/ruled/{item_id}/", key).status_code == 201
    answer = post(bob, f"/ruled/{item_id}/", key)
    assert "Idempotent-Replayed" not in answer
    assert answer.json()["user"] == str(bob_user.pk)


# -- template responses ----------------------------------------------------------------------
@pytest.mark.parametrize("url", ["/template/{}/", "/cbv/{}/"])
def test_a_template_response_is_rendered_kept_and_replayed(
    client: Client, item_id: int, key: str, url: str
) -> None:
    """A TemplateResponse (a function view, or a class-based view under method_decorator) is
    rendered before it is kept: the first request gets it, the retry its replay."""
    first = post(client, url.format(item_id), key)
    again = post(client, url.format(item_id), key)
    assert first.content == again.content == b"run=1"
    assert first.status_code == again.status_code
    assert again["Idempotent-Replayed"] == "true"
    assert sum(RUNS.values()) == 1


def test_an_async_template_response_is_kept(item_id: int, key: str) -> None:
    async def twice() -> list[Any]:
        client = AsyncClient()
        url, headers = f"/atemplate/{item_id}/", {**JSON, "Idempotency-Key": key}
        return [await client.post(url, headers=headers) for _ in range(2)]

    first, again = async_to_sync(twice)()
    assert first.status_code == again.status_code == 201
    assert first.content == again.content == b"run=1"
    assert again["Idempotent-Replayed"] == "true"
    assert RUNS == {"atemplate": 1}


def test_a_template_that_fails_to_render_releases_the_lock(
    client: Client, item_id: int, key: str
) -> None:
    """A failure while keeping (here rendering) keeps nothing and releases the key's lock: the
    retry runs again at once (not 409 for the lease's TTL)."""
    for _ in range(2):
        with pytest.raises(RuntimeError, match="rendering failed"):
            post(client, f"/bad-template/{item_id}/", key)
    assert RUNS == {"bad_template": 2}


# -- MAX_BYTES bounded by what the engine's transport writes and reads reliably -----------------
def test_max_bytes_over_one_mib_is_refused(settings: Any) -> None:
    """Raised to 64 MB, an 8 MB record failed to write (EAGAIN on the engine's non-blocking
    socket, counted as a node down) or took longer than NODE_TIMEOUT to read back (503 for the
    record's whole TTL). MAX_BYTES is capped at 1 MiB, with E030 saying why."""
    settings.REDLOCK_IDEMPOTENCY = {"MAX_BYTES": 64 * 1024 * 1024}
    [message] = check_request_locks()
    assert message.id == "django_redlock.E030"
    assert "1048576" in message.msg and "transport" in message.msg
    settings.REDLOCK_IDEMPOTENCY = {"MAX_BYTES": 1024 * 1024}
    assert check_request_locks() == []


def test_a_record_near_the_cap_is_kept_and_replayed(client: Client, item_id: int, key: str) -> None:
    """A body just under the 1 MiB cap is written and read back, sync and async."""
    url = f"/sized/{item_id}/?size=1000000"
    answers = [post(client, url, key) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[1]["Idempotent-Replayed"] == "true"
    assert len(answers[1].content) == 1_000_000

    async def twice() -> list[Any]:
        client = AsyncClient()
        url = f"/asized/{item_id}/?size=1000000"
        headers = {**JSON, "Idempotency-Key": f"async-{key}"}
        return [await client.post(url, headers=headers) for _ in range(2)]

    answers = async_to_sync(twice)()
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[1]["Idempotent-Replayed"] == "true"
    assert RUNS == {"sized": 1, "asized": 1}


# -- a rule's view rolled back by ATOMIC_REQUESTS ------------------------------------------------
@pytest.fixture
def atomic_requests() -> Iterator[None]:
    connections["default"].settings_dict["ATOMIC_REQUESTS"] = True
    yield
    connections["default"].settings_dict["ATOMIC_REQUESTS"] = False


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("atomic_requests")
def test_a_rule_keeps_nothing_when_atomic_requests_rolled_back(
    client: Client, settings: Any, item_id: int, key: str
) -> None:
    """Under ATOMIC_REQUESTS the view's transaction ends before the middleware keeps the
    response: a view that wrote and then rolled back (set_rollback) answered 201, which was
    kept and replayed although its row never existed. Now nothing is kept and the retry runs;
    a committed one is kept and replayed."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.REDLOCK_REQUEST_LOCKS = [
        {"URL_NAME": "rolled-back", "KEY": "rb:{item_id}", "IDEMPOTENCY": True}
    ]
    url = f"/rolled-back/{item_id}/"
    post(client, f"{url}?rollback=1", key)
    again = post(client, f"{url}?rollback=1", key)
    assert "Idempotent-Replayed" not in again
    assert RUNS == {"rolled_back": 2}
    assert not Group.objects.exists()
    committed = f"committed-{key}"
    post(client, url, committed)
    assert post(client, url, committed)["Idempotent-Replayed"] == "true"
    assert RUNS == {"rolled_back": 3}
    assert Group.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("atomic_requests")
def test_a_rule_keeps_nothing_when_atomic_requests_rolled_back_under_asgi(
    settings: Any, item_id: int, key: str
) -> None:
    """The same under ASGI: the middleware is async, the sync view runs in a worker thread."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.REDLOCK_REQUEST_LOCKS = [
        {"URL_NAME": "rolled-back", "KEY": "rb:{item_id}", "IDEMPOTENCY": True}
    ]

    async def send(query: str, value: str) -> Any:
        headers = {**JSON, "Idempotency-Key": value}
        return await AsyncClient().post(f"/rolled-back/{item_id}/{query}", headers=headers)

    async def scenario() -> list[Any]:
        return [
            await send("?rollback=1", key),
            await send("?rollback=1", key),
            await send("", f"committed-{key}"),
            await send("", f"committed-{key}"),
        ]

    answers = async_to_sync(scenario)()
    assert [a.get("Idempotent-Replayed") for a in answers] == [None, None, None, "true"]
    assert RUNS == {"rolled_back": 3}


# -- answers the view did not produce ---------------------------------------------------------
def test_a_rule_keeps_nothing_when_the_view_raised(
    client: Client, settings: Any, item_id: int, key: str
) -> None:
    """Http404 raised by a rule's view is turned into a 404 inside the middleware: it was kept
    and replayed, unlike a decorated view's raise. Now nothing is kept: the retry runs."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.REDLOCK_REQUEST_LOCKS = [
        {"URL_NAME": "missing", "KEY": "missing:{item_id}", "IDEMPOTENCY": True}
    ]
    answers = [post(client, f"/missing/{item_id}/", key) for _ in range(2)]
    assert [a.status_code for a in answers] == [404, 404]
    assert "Idempotent-Replayed" not in answers[1]
    assert RUNS == {"missing": 2}


def test_a_csrf_rejection_is_not_kept(settings: Any, item_id: int, key: str) -> None:
    """CsrfViewMiddleware's 403 (the view never ran) was kept and replayed for the whole TTL,
    so the retry with a valid token still got 403. Now the retry runs the view."""
    from django.middleware.csrf import _get_new_csrf_string, _mask_cipher_secret

    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.REDLOCK_REQUEST_LOCKS = [
        {"URL_NAME": "csrf", "KEY": "csrf:{item_id}", "IDEMPOTENCY": True}
    ]
    client = Client(enforce_csrf_checks=True)
    assert post(client, f"/csrf/{item_id}/", key).status_code == 403
    secret = _get_new_csrf_string()
    client.cookies["csrftoken"] = secret
    retry = post(client, f"/csrf/{item_id}/", key, **{"X-CSRFToken": _mask_cipher_secret(secret)})
    assert retry.status_code == 201
    assert "Idempotent-Replayed" not in retry
    assert RUNS == {"csrf": 1}


# -- multipart uploads -------------------------------------------------------------------------
def _upload(client: Client, item_id: int, key: str, content: bytes, kind: str) -> Any:
    data = {"f": SimpleUploadedFile("a.bin", content, content_type=kind)}
    headers = {**JSON, "Idempotency-Key": key}
    return client.post(f"/upload/{item_id}/", data, headers=headers)


def test_an_upload_over_the_memory_limit_is_fingerprinted_from_its_files(
    client: Client, item_id: int, key: str
) -> None:
    """A 3 MB upload (over DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB) with a key was a 400: the
    fingerprint read request.body. A multipart body is now hashed from its parsed fields and
    files (streamed), so it runs once and is replayed."""
    content = b"z" * (3 * 1024 * 1024)
    first = _upload(client, item_id, key, content, "application/octet-stream")
    again = _upload(client, item_id, key, content, "application/octet-stream")
    assert first.status_code == again.status_code == 200
    assert first.json()["size"] == len(content)
    assert again["Idempotent-Replayed"] == "true"
    shorter = _upload(client, item_id, key, content[:-1], "application/octet-stream")
    assert shorter.status_code == 422
    assert RUNS == {"upload": 1}


@pytest.mark.parametrize("parsed_first", [False, True])
def test_a_file_with_another_content_type_is_another_request(
    client: Client, settings: Any, item_id: int, key: str, parsed_first: bool
) -> None:
    """The same bytes sent as another content type is a different request (422), also when a
    middleware parsed the body before the view."""
    if parsed_first:
        settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{URLS}.ReadPost"]
    assert _upload(client, item_id, key, b"1", "text/plain").status_code == 200
    assert _upload(client, item_id, key, b"1", "image/png").status_code == 422


# -- a replay is the response as it was ---------------------------------------------------------
@pytest.mark.parametrize("query", ["?kind=304", ""])
def test_a_replay_adds_no_content_type(client: Client, item_id: int, key: str, query: str) -> None:
    """A response without a Content-Type (a 304, or one whose header the view removed) was
    replayed with Django's default text/html."""
    first = post(client, f"/bare/{item_id}/{query}", key)
    again = post(client, f"/bare/{item_id}/{query}", key)
    assert again["Idempotent-Replayed"] == "true"
    assert "Content-Type" not in first
    assert "Content-Type" not in again
    assert again.status_code == first.status_code
    assert RUNS == {"bare": 1}


# -- MAX_BYTES bounds the whole record --------------------------------------------------------
def test_max_bytes_counts_the_headers_too(
    client: Client, settings: Any, item_id: int, key: str
) -> None:
    """MAX_BYTES bounded only the body: 30 KB of headers were kept under MAX_BYTES=1000. Now
    the record (body, status and headers) is bounded: over it only the marker is kept."""
    settings.REDLOCK_IDEMPOTENCY = {"MAX_BYTES": 1000}
    url = f"/sized/{item_id}/?size=10&headers=300"
    assert post(client, url, key).status_code == 200
    again = post(client, url, key)
    assert again.status_code == 409
    assert again.json()["error"] == "idempotent_response_not_kept"
    assert RUNS == {"sized": 1}


@pytest.mark.django_db(transaction=True)
def test_until_commit_false_still_keeps_nothing_on_rollback(
    client: Client, item_id: int, key: str
) -> None:
    """until_commit=False releases the plain lock when the view returns; the response was also
    kept at once, so a rolled-back request was replayed. The key's lock and its record now
    always wait for the commit."""
    url = f"/early-release/{item_id}/"
    post(client, f"{url}?rollback=1", key)
    again = post(client, f"{url}?rollback=1", key)
    assert "Idempotent-Replayed" not in again
    assert RUNS == {"early_release": 2}
    post(client, url, f"committed-{key}")
    assert post(client, url, f"committed-{key}")["Idempotent-Replayed"] == "true"
    assert RUNS == {"early_release": 3}
