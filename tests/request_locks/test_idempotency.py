"""Idempotent requests (``@request_lock(..., idempotency=True)``, ``"IDEMPOTENCY": True``)
through Django's test clients against real Redis nodes: replay, 409, 422, what is not kept,
bad keys, settings and checks."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client

from django_redlock import locks
from django_redlock.conf import idempotency_setting
from django_redlock.decorators import request_lock
from django_redlock.request_locks import records
from django_redlock.request_locks.checks import check_request_locks
from django_redlock.request_locks.idempotency import lock_name
from tests.support.idempotency_urls import ENTERED, GATE, RUNS

pytestmark = pytest.mark.urls("tests.support.idempotency_urls")
MIDDLEWARE_PATH = "django_redlock.middleware.RequestLockMiddleware"
JSON = {"Accept": "application/json"}


@pytest.fixture(autouse=True)
def _clear_runs() -> Iterator[None]:
    RUNS.clear()
    GATE.clear()
    ENTERED.clear()
    yield
    GATE.set()
    RUNS.clear()


def post(client: Client, url: str, key: str | None, body: str = "{}", **headers: str) -> Any:
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post(url, body, content_type="application/json", headers={**JSON, **headers})


# -- replay ----------------------------------------------------------------------------------
def test_a_retry_gets_the_kept_response_with_the_replayed_header(
    client: Client, item_id: int, key: str
) -> None:
    """The view runs once; the retry gets its status, body and headers, marked replayed."""
    first = post(client, f"/idem/{item_id}/", key, '{"amount": 5}')
    again = post(client, f"/idem/{item_id}/", key, '{"amount": 5}')
    assert first.status_code == again.status_code == 201
    assert RUNS["idem"] == 1
    assert again.content == first.content
    assert again["X-Order"] == first["X-Order"] == "order-1"
    assert again["Content-Type"] == first["Content-Type"]
    assert again["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first


def test_cookies_are_not_replayed(client: Client, item_id: int, key: str) -> None:
    """Set-Cookie belongs to the first request: a replay sets none."""
    first = post(client, f"/idem/{item_id}/", key)
    assert first.cookies["session_hint"].value == "cookie-1"
    fresh = Client()
    again = post(fresh, f"/idem/{item_id}/", key)
    assert again["Idempotent-Replayed"] == "true"
    assert "session_hint" not in again.cookies
    assert "Set-Cookie" not in again.headers


def test_4xx_is_kept_and_replayed(client: Client, item_id: int, key: str) -> None:
    """A client error is the request's answer: kept, replayed (only 5xx is not)."""
    first = post(client, f"/idem/{item_id}/?status=404", key)
    again = post(client, f"/idem/{item_id}/?status=404", key)
    assert first.status_code == again.status_code == 404
    assert RUNS["idem"] == 1 and again["Idempotent-Replayed"] == "true"


def test_without_the_header_the_view_runs_every_time(client: Client, item_id: int) -> None:
    """No header: the plain request lock, no replay, no header."""
    answers = [post(client, f"/idem/{item_id}/", None) for _ in range(2)]
    assert [a.status_code for a in answers] == [201, 201]
    assert RUNS["idem"] == 2
    assert all("Idempotent-Replayed" not in a for a in answers)


def test_another_key_runs_again(client: Client, item_id: int, key: str) -> None:
    post(client, f"/idem/{item_id}/", key)
    again = post(client, f"/idem/{item_id}/", str(uuid.uuid4()))
    assert RUNS["idem"] == 2 and "Idempotent-Replayed" not in again


def test_async_view_is_replayed(async_client: AsyncClient, item_id: int, key: str) -> None:
    async def both() -> tuple[Any, Any]:
        headers = {**JSON, "Idempotency-Key": key}
        first = await async_client.post(f"/aidem/{item_id}/", headers=headers)
        again = await async_client.post(f"/aidem/{item_id}/", headers=headers)
        return first, again

    first, again = asyncio.run(both())
    assert first.status_code == again.status_code == 201
    assert RUNS["aidem"] == 1
    assert again.json() == first.json() == {"run": 1}
    assert again["Idempotent-Replayed"] == "true"
    assert "session_hint" not in again.cookies


# -- conflicts -------------------------------------------------------------------------------
def test_another_body_with_the_same_key_is_422(client: Client, item_id: int, key: str) -> None:
    post(client, f"/idem/{item_id}/", key, '{"amount": 5}')
    other = post(client, f"/idem/{item_id}/", key, '{"amount": 6}')
    assert other.status_code == 422
    assert other.json()["error"] == "idempotency_key_reused"
    assert RUNS["idem"] == 1


def test_another_path_or_method_with_the_same_key_is_422(
    client: Client, item_id: int, key: str
) -> None:
    """The fingerprint holds the method and the path with its query string."""
    post(client, f"/idem/{item_id}/", key)
    assert post(client, f"/idem/{item_id}/?status=200", key).status_code == 422
    put = client.put(
        f"/idem/{item_id}/", "{}", content_type="application/json",
        headers={**JSON, "Idempotency-Key": key},
    )  # fmt: skip
    assert put.status_code == 422
    assert RUNS["idem"] == 1


def test_concurrent_duplicate_is_409(client: Client, item_id: int, key: str) -> None:
    """While the first request runs, the same key gets the busy response (409, Retry-After);
    once it is done, the replay."""
    with ThreadPoolExecutor(1) as other:
        first = other.submit(post, Client(), f"/blocking/{item_id}/", key)
        assert ENTERED.wait(5)
        busy = post(client, f"/blocking/{item_id}/", key)
        GATE.set()
        assert first.result(10).status_code == 201
    assert busy.status_code == 409
    assert busy.json()["error"] == "lock_busy" and int(busy["Retry-After"]) >= 1
    later = post(client, f"/blocking/{item_id}/", key)
    assert later.status_code == 201 and later["Idempotent-Replayed"] == "true"
    assert RUNS["blocking"] == 1


def test_another_key_waits_for_the_plain_lock(client: Client, item_id: int, key: str) -> None:
    """A request with another key (or none) on the same resource still meets the plain lock
    (``idem:<id>``) while the first runs: 409, and that busy answer is not kept."""
    with ThreadPoolExecutor(1) as other:
        first = other.submit(post, Client(), f"/blocking/{item_id}/", key)
        assert ENTERED.wait(5)
        second_key = str(uuid.uuid4())
        busy = post(client, f"/blocking/{item_id}/", second_key)
        no_key = post(client, f"/blocking/{item_id}/", None)
        GATE.set()
        assert first.result(10).status_code == 201
    assert busy.status_code == no_key.status_code == 409
    assert busy.json()["error"] == "lock_busy"
    retried = post(client, f"/blocking/{item_id}/", second_key)
    assert retried.status_code == 201 and "Idempotent-Replayed" not in retried
    assert RUNS["blocking"] == 2


def test_each_user_has_own_keys(
    client: Client, item_id: int, key: str, django_user_model: Any
) -> None:
    """One key value from two users: two requests, neither sees the other's response."""
    alice = django_user_model.objects.create_user("alice-idem")
    bob = django_user_model.objects.create_user("bob-idem")
    client.force_login(alice)
    mine = post(client, f"/idem/{item_id}/", key)
    other = Client()
    other.force_login(bob)
    theirs = post(other, f"/idem/{item_id}/", key)
    assert theirs.status_code == 201 and "Idempotent-Replayed" not in theirs
    assert mine.json()["user"] == str(alice.pk) and theirs.json()["user"] == str(bob.pk)
    assert RUNS["idem"] == 2


# -- what is not kept ------------------------------------------------------------------------
def test_a_view_that_raised_keeps_nothing(client: Client, item_id: int, key: str) -> None:
    client.raise_request_exception = False
    assert post(client, f"/boom/{item_id}/", key).status_code == 500
    assert post(client, f"/boom/{item_id}/", key).status_code == 500
    assert RUNS["boom"] == 2


def test_a_5xx_answer_keeps_nothing(client: Client, item_id: int, key: str) -> None:
    assert post(client, f"/idem/{item_id}/?status=503", key).status_code == 503
    again = post(client, f"/idem/{item_id}/?status=503", key)
    assert "Idempotent-Replayed" not in again
    assert RUNS["idem"] == 2


def test_an_oversize_body_is_not_kept_and_a_retry_gets_409(
    client: Client, item_id: int, key: str, settings: Any
) -> None:
    """Over MAX_BYTES (body, status and headers): the response is sent, only a marker is
    kept; a retry is not run again (409 idempotent_response_not_kept)."""
    settings.REDLOCK_IDEMPOTENCY = {"MAX_BYTES": 1000}
    first = post(client, f"/idem/{item_id}/?size=1001", key)
    assert first.status_code == 201 and len(first.content) == 1001
    again = post(client, f"/idem/{item_id}/?size=1001", key)
    assert again.status_code == 409
    assert again.json()["error"] == "idempotent_response_not_kept"
    assert RUNS["idem"] == 1
    fits = post(client, f"/idem/{item_id}/?size=800", str(uuid.uuid4()))  # + its headers
    assert (
        post(client, f"/idem/{item_id}/?size=800", fits.request["HTTP_IDEMPOTENCY_KEY"])[
            "Idempotent-Replayed"
        ]
        == "true"
    )


def test_a_streaming_response_is_not_kept(client: Client, item_id: int, key: str) -> None:
    first = post(client, f"/stream/{item_id}/", key)
    assert b"".join(first.streaming_content) == b"part"
    first.close()
    again = post(client, f"/stream/{item_id}/", key)
    assert again.status_code == 409
    assert again.json()["error"] == "idempotent_response_not_kept"
    assert RUNS["stream"] == 1


def test_a_view_that_outlived_its_lease_keeps_nothing(
    client: Client, item_id: int, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The store finds the key's lock gone (its lease expired during the view): nothing is
    kept, a warning says so, and the retry runs again."""
    with caplog.at_level("WARNING", logger="django_redlock"):
        assert post(client, f"/slow/{item_id}/", key).status_code == 201
    assert any("was not kept" in r.getMessage() for r in caplog.records)
    again = post(client, f"/slow/{item_id}/", key)
    assert "Idempotent-Replayed" not in again
    assert RUNS["slow"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_keeps_nothing(client: Client, item_id: int, key: str) -> None:
    """Inside atomic() the response is kept at the commit: a rollback keeps nothing, the retry
    runs again; after a commit it is replayed."""
    url = f"/rolled-back/{item_id}/"
    assert post(client, url + "?rollback=1", key).status_code == 201
    assert "Idempotent-Replayed" not in post(client, url + "?rollback=1", key)
    assert RUNS["rolled_back"] == 2
    other = str(uuid.uuid4())
    post(client, url, other)
    assert post(client, url, other)["Idempotent-Replayed"] == "true"
    assert RUNS["rolled_back"] == 3


# -- the header's value ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "why"),
    [(" ", "empty"), ("k" * 256, "longer than 255"), ("caf\u00e9", "outside printable ASCII")],
)
def test_a_bad_key_is_400(client: Client, item_id: int, value: str, why: str) -> None:
    response = client.post(
        f"/idem/{item_id}/", "{}", content_type="application/json",
        headers={**JSON, "Idempotency-Key": value},
    )  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_idempotency_key"
    assert why in response.json()["detail"]
    assert RUNS == {}


def test_a_control_character_is_400(client: Client, item_id: int) -> None:
    response = client.post(f"/idem/{item_id}/", HTTP_IDEMPOTENCY_KEY="a\x01b", headers=JSON)
    assert response.status_code == 400 and RUNS == {}


def test_255_characters_are_accepted(client: Client, item_id: int) -> None:
    assert post(client, f"/idem/{item_id}/", "k" * 255).status_code == 201


def test_the_header_name_is_a_setting(
    client: Client, item_id: int, key: str, settings: Any
) -> None:
    settings.REDLOCK_IDEMPOTENCY = {"HEADER": "X-Request-Once"}
    post(client, f"/idem/{item_id}/", None, **{"X-Request-Once": key})
    again = post(client, f"/idem/{item_id}/", None, **{"X-Request-Once": key})
    assert again["Idempotent-Replayed"] == "true" and RUNS["idem"] == 1


# -- the rule --------------------------------------------------------------------------------
def test_a_rule_with_idempotency(client: Client, item_id: int, key: str, settings: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.REDLOCK_REQUEST_LOCKS = [
        {"URL_NAME": "ruled", "KEY": "ruled:{item_id}", "IDEMPOTENCY": True}
    ]
    first = post(client, f"/ruled/{item_id}/", key)
    again = post(client, f"/ruled/{item_id}/", key)
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true" and RUNS["ruled"] == 1
    post(client, f"/ruled/{item_id}/", None)
    assert RUNS["ruled"] == 2


def test_idempotency_must_be_a_bool_and_not_a_limit() -> None:
    with pytest.raises(ImproperlyConfigured, match="idempotency must be True or False"):
        request_lock("x:{pk}", idempotency="yes")  # type: ignore[arg-type]
    with pytest.raises(ImproperlyConfigured, match="idempotency needs a lock, not a limit"):
        request_lock("x:{pk}", idempotency=True, limit=2)


# -- fencing: a late store never replaces a newer one ---------------------------------------
def test_a_lost_lease_stores_nothing_and_an_older_token_never_replaces_a_newer(
    unique_name: str,
) -> None:
    """STORE_RECORD writes only while the lease holds its lock, and never over a record of a
    newer token."""
    manager = locks["default"]
    old = manager.acquire(unique_name, ttl=5, timeout=0)
    old_values = ["fp", json.dumps({"kept": True}), b"old"]
    manager.force_release(unique_name)  # the old holder's lease is gone
    assert records.store(old, old_values, 60) == 0
    new = manager.acquire(unique_name, ttl=5, timeout=0)
    assert records.store(new, ["fp", "{}", b"new"], 60) == 1
    new.release()
    # the old holder takes the name again later (a lower token than the record's is
    # impossible through acquire, so forge it: same owner, the old token)
    newest = manager.acquire(unique_name, ttl=5, timeout=0)
    newest.record.token = old.token
    assert records.store(newest, old_values, 60) == 0
    found = records.read(newest)
    assert found is not None and found.body == b"new" and found.token == new.token
    newest.release()


def test_five_nodes_keep_the_record_on_every_node_the_lease_holds(
    client: Client, unique_name: str
) -> None:
    """On a 5-node alias the record is written on each node and read back with a quorum."""
    manager = locks["five"]
    lease = manager.acquire(unique_name, ttl=5, timeout=0)
    assert records.store(lease, ["fp", "{}", b"body"], 60) == 5
    found = records.read(lease)
    assert found is not None and found.body == b"body" and found.token == lease.token
    lease.release()


def test_lock_name_is_scoped_by_user_and_bounded() -> None:
    assert lock_name("idem:1", "k", None) != lock_name("idem:1", "k2", None)
    assert len(lock_name("x" * 512, "k", None)) <= 512


# -- settings and checks ---------------------------------------------------------------------
def test_defaults() -> None:
    config = idempotency_setting()
    assert (config.header, config.ttl, config.max_bytes) == ("Idempotency-Key", 86400.0, 1048576)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "must be a dict"),
        ({"HEADERS": "x"}, "unknown key"),
        ({"HEADER": ""}, "HTTP header name"),
        ({"HEADER": "Idempotency Key"}, "HTTP header name"),
        ({"TTL": "1d"}, "number of seconds"),
        ({"TTL": 0}, "from 1 to"),
        ({"TTL": float("inf")}, "from 1 to"),
        ({"MAX_BYTES": 1.5}, "must be an int"),
        ({"MAX_BYTES": True}, "must be an int"),
        ({"MAX_BYTES": -1}, "from 0 to"),
    ],
)
def test_bad_settings_are_reported(settings: Any, value: Any, message: str) -> None:
    settings.REDLOCK_IDEMPOTENCY = value
    with pytest.raises(ImproperlyConfigured, match=message):
        idempotency_setting()
    found = [m for m in check_request_locks() if m.id == "django_redlock.E030"]
    assert len(found) == 1 and message in found[0].msg


def test_valid_settings_pass_the_check(settings: Any) -> None:
    settings.REDLOCK_IDEMPOTENCY = {"HEADER": "X-Once", "TTL": 60, "MAX_BYTES": 0}
    assert [m for m in check_request_locks() if m.id == "django_redlock.E030"] == []
