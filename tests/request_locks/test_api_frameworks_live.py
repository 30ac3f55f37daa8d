"""DRF and django-ninja APIs under request locks on real servers: gunicorn (3 sync workers) and
uvicorn (2 workers), 50 concurrent clients of two users sharing idempotency keys, and clients
that disconnect under uvicorn. Effects are payment rows, counted in the database here."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token

from django_redlock.testing.wire import free_port
from tests.api_app.models import Payment
from tests.support.server_process import ROOT, post_json, server_aliases, server_process
from tests.support.waiting import until

CLIENTS = 50


def _env() -> dict[str, str]:
    database = dict(connection.settings_dict)
    if connection.vendor == "sqlite":
        database["NAME"] = str(Path(database["NAME"]).resolve())
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.api_server_settings",
        "REDLOCK_TEST_DATABASE": json.dumps(database, default=str),
        "REDLOCK_TEST_ALIASES": server_aliases(settings.REDLOCK),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


@pytest.fixture
def on_disk(transactional_db: None) -> None:
    if connection.vendor == "sqlite" and connection.is_in_memory_db():  # type: ignore[attr-defined]
        pytest.skip("the server processes need an on-disk test database")


@pytest.fixture
def gunicorn(on_disk: None, tmp_path: Path) -> Iterator[str]:
    """gunicorn, 3 sync worker processes, serving the API app."""
    port = free_port()
    command = [
        sys.executable, "-m", "gunicorn", "testproject.wsgi:application", "--workers", "3",
        "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with server_process(command, _env(), f"{base}/ready/", tmp_path / "gunicorn.log"):
        yield base


@pytest.fixture
def uvicorn(on_disk: None, tmp_path: Path) -> Iterator[str]:
    """uvicorn, 2 worker processes (one event loop each), serving the API app."""
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "testproject.asgi:application", "--workers", "2",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with server_process(command, _env(), f"{base}/ready/", tmp_path / "uvicorn.log"):
        yield base


@pytest.fixture
def tokens(on_disk: None) -> dict[str, str]:
    """DRF tokens of alice and bob (ninja's bearer tokens are ``token-<name>``)."""
    model = get_user_model()
    found = {}
    for name in ("alice", "bob"):
        user = model.objects.create_user(name, password="pw")
        found[name] = Token.objects.create(user=user).key
    return found


def _post(url: str, key: str, headers: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
    return post_json(url, key, b'{"amount": 1}', headers, timeout=20)


def _clients_of_two_users(url_of: Any, creds: dict[str, dict[str, str]], who_of: Any) -> None:
    """50 clients, alice's, bob's and anonymous ones, over 5 keys shared by all of them: each
    sends until it gets an answer that is not 409 (busy). Every 201 is its own user's; exactly
    one payment per (user, key); the anonymous never get one."""
    keys = [str(uuid.uuid4()) for _ in range(5)]
    orders = {key: uuid.uuid4().hex[:12] for key in keys}
    users = ["alice", "bob", "anonymous"]
    answers: list[tuple[str, str, int, Any, dict[str, str]]] = []
    start = threading.Barrier(CLIENTS)

    def client(index: int) -> None:
        user, key = users[index % 3], keys[index % len(keys)]
        start.wait(30)
        deadline = time.monotonic() + 60
        while True:
            status, body, headers = _post(url_of(orders[key]), key, creds.get(user, {}))
            if status != 409 or time.monotonic() > deadline:
                answers.append((user, key, status, body, headers))
                return
            time.sleep(0.02)

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    assert len(answers) == CLIENTS
    for user, _key, status, body, headers in answers:
        if user == "anonymous":
            assert status in (401, 403), (status, body)
            assert "Idempotent-Replayed" not in headers
        else:
            assert status == 201, (user, status, body)
            assert who_of(body) == user, (user, body)  # never another user's kept response
    paid = Counter(
        (who, order)
        for who, order in Payment.objects.filter(order__in=orders.values()).values_list(
            "principal", "order"
        )
    )
    expected = {
        (user, orders[key])
        for index in range(CLIENTS)
        for user, key in [(users[index % 3], keys[index % len(keys)])]
        if user != "anonymous"
    }
    ran = Counter(
        (answer_user, orders[key]) for answer_user, key, *_ in answers if answer_user != "anonymous"
    )
    assert set(ran) == expected
    assert sum(paid.values()) == len(expected), paid  # one effect per (user, key)


def _drf_creds(tokens: dict[str, str]) -> dict[str, dict[str, str]]:
    return {name: {"Authorization": f"Token {value}"} for name, value in tokens.items()}


def _ninja_creds() -> dict[str, dict[str, str]]:
    return {name: {"Authorization": f"Bearer token-{name}"} for name in ("alice", "bob")}


@pytest.mark.parametrize(
    ("server", "path", "auth"),
    [
        ("gunicorn", "drf/under/{}/", "drf"),
        ("gunicorn", "ninja/bearer/{}", "ninja"),
        ("uvicorn", "drf/method/{}/", "drf"),
        ("uvicorn", "ninja/async/{}", "ninja"),
    ],
    ids=["drf-gunicorn", "ninja-gunicorn", "drf-uvicorn", "async-ninja-uvicorn"],
)
def test_two_users_sharing_keys_never_get_each_others_response(
    request: pytest.FixtureRequest, tokens: dict[str, str], server: str, path: str, auth: str
) -> None:
    base = request.getfixturevalue(server)
    creds = _drf_creds(tokens) if auth == "drf" else _ninja_creds()
    who = "user" if auth == "drf" else "principal"
    _clients_of_two_users(lambda order: f"{base}/{path.format(order)}", creds, lambda b: b[who])


def _give_up_after(base: str, path: str, key: str, paid: Callable[[], bool]) -> None:
    """POST ``path`` with ``key`` and close the connection, unanswered, once ``paid()`` says
    the view made its effect (it goes on for a second after that)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        body = b'{"amount": 1}'
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nIdempotency-Key: {key}\r\n"
            "Accept: application/json\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        until(paid, 10.0, "the first run's payment")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


@pytest.mark.parametrize("view", ["pay", "pay-sync"], ids=["async_view", "sync_view"])
def test_a_client_that_disconnects_and_retries_pays_once(uvicorn: str, view: str) -> None:
    """The view pays, then takes 1 s more; the client gives up once it has paid and retries
    with its key until it is answered: the first run finished (shielded from the disconnect)
    and kept its response, the retry gets that replay; one payment. Before, an async view was
    cancelled after paying, nothing was kept, and the retry paid again."""
    order, key = uuid.uuid4().hex[:12], str(uuid.uuid4())
    path = f"/asgi/{view}/{order}/?after=1"
    _give_up_after(uvicorn, path, key, lambda: Payment.objects.filter(order=order).exists())
    deadline = time.monotonic() + 20
    while True:
        status, body, headers = _post(f"{uvicorn}{path}", key, {})
        if status != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 201, (status, body)
    assert headers.get("Idempotent-Replayed") == "true"
    time.sleep(0.5)  # a second run, if any, would have paid by now
    assert Payment.objects.filter(order=order).count() == 1
