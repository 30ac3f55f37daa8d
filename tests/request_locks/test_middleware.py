"""Per-request locks: ``@request_lock`` and ``RequestLockMiddleware`` through Django's test
clients (sync and ``AsyncClient``) against real Redis nodes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client

from django_redlock import locks
from django_redlock.conf import MAX_NAME_LENGTH
from django_redlock.locking.manager import Lease
from tests.support.request_lock_urls import SEEN

pytestmark = pytest.mark.urls("tests.support.request_lock_urls")
MIDDLEWARE_PATH = "django_redlock.middleware.RequestLockMiddleware"
JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def item_id() -> int:
    """An id no other test locks (the session's Redis nodes are shared)."""
    return uuid.uuid4().int % 10**12


@pytest.fixture(autouse=True)
def _clear_seen() -> Iterator[None]:
    SEEN.clear()
    yield
    SEEN.clear()


@pytest.fixture
def with_middleware(settings: Any) -> Callable[..., None]:
    """``with_middleware(*rules)``: install RequestLockMiddleware (after auth) with rules."""

    def install(*rules: dict[str, Any]) -> None:
        settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
        settings.REDLOCK_REQUEST_LOCKS = list(rules)

    return install


def is_free(name: str, using: str = "default") -> bool:
    """True if ``name`` can be taken right now (and gives it back)."""
    try:
        lease = locks[using].acquire(name, timeout=0)
    except Exception:
        return False
    lease.release()
    return True


@pytest.fixture
def hold() -> Iterator[Callable[..., Lease]]:
    """``hold(name)``: take a lock for the test, released at teardown. Taken and released in
    another thread, as another request would: the test's own requests never re-enter it."""
    held: list[Lease] = []
    with ThreadPoolExecutor(1) as other:

        def take(name: str, using: str = "default") -> Lease:
            lease = other.submit(locks[using].acquire, name, ttl=3, timeout=0).result()
            held.append(lease)
            return lease

        yield take
        for lease in held:
            other.submit(lease.release).result()


# -- the decorator, sync -------------------------------------------------------------------
def test_view_runs_with_request_lease_and_active_token(client: Client, item_id: int) -> None:
    """request.lease is the lease while the view runs, its token is the active fencing token,
    and the lock is free again once the response is returned."""
    response = client.get(f"/item/{item_id}/")
    assert response.status_code == 200
    lease = SEEN["lease"]
    assert lease.name == f"item:{item_id}"
    assert SEEN["token"] == lease.token == response.json()["token"]
    assert lease.released
    assert is_free(f"item:{item_id}")


def test_busy_gives_409_json_with_retry_after(client: Client, item_id: int, hold: Any) -> None:
    """A held lock answers 409 with a whole-second Retry-After >= 1 and a JSON body; the view
    does not run."""
    hold(f"item:{item_id}")
    response = client.post(f"/item/{item_id}/", headers=JSON)
    assert response.status_code == 409
    assert response["Content-Type"] == "application/json"
    retry = response["Retry-After"]
    assert retry.isdigit() and 1 <= int(retry) <= 3
    body = response.json()
    assert body["error"] == "lock_busy" and body["retry_after"] == int(retry)
    assert "lease" not in SEEN


def test_busy_gives_html_to_browsers(client: Client, item_id: int, hold: Any) -> None:
    """A browser's Accept header gets a small HTML page instead of JSON."""
    hold(f"item:{item_id}")
    response = client.post(f"/item/{item_id}/", headers=HTML)
    assert response.status_code == 409
    assert response["Content-Type"].startswith("text/html")
    assert b"409 Conflict" in response.content
    assert f"item:{item_id}".encode() not in response.content  # the key is not leaked


def test_busy_status_is_configurable(
    client: Client, item_id: int, hold: Any, settings: Any
) -> None:
    """REDLOCK_BUSY_STATUS replaces 409 (here 423 Locked)."""
    settings.REDLOCK_BUSY_STATUS = 423
    hold(f"item:{item_id}")
    response = client.post(f"/item/{item_id}/", headers=HTML)
    assert response.status_code == 423
    assert b"423 Locked" in response.content


def test_view_raising_releases_the_lock(client: Client, item_id: int) -> None:
    """The lease is released (and request.lease cleared) when the view raises."""
    with pytest.raises(RuntimeError):
        client.get(f"/boom/{item_id}/")
    assert SEEN["lease"].released
    assert is_free(f"item:{item_id}")


def test_streaming_response_releases_at_close(client: Client, item_id: int) -> None:
    """A streaming response keeps the lock until the stream is consumed and closed."""
    response = client.get(f"/stream/{item_id}/")
    assert response.status_code == 200
    assert not is_free(f"item:{item_id}")
    assert b"".join(response.streaming_content) == b"ab"  # type: ignore[attr-defined]
    assert is_free(f"item:{item_id}")


def test_user_key_uses_request_user(client: Client, django_user_model: Any) -> None:
    """``{user.pk}`` is filled from request.user (AuthenticationMiddleware)."""
    user = django_user_model.objects.create_user(f"u{uuid.uuid4().hex[:8]}", password="x")
    client.force_login(user)
    response = client.post("/checkout/")
    assert response.status_code == 200
    assert response.json()["name"] == f"checkout:{user.pk}"


def test_stacked_decorators_hold_both_and_restore_request_lease(
    client: Client, item_id: int
) -> None:
    """Two request locks on one view are both held; the innermost is request.lease."""
    response = client.get(f"/nested/{item_id}/")
    assert response.json()["name"] == f"inner:{item_id}"
    assert is_free(f"inner:{item_id}") and is_free(f"outer:{item_id}")


def test_missing_template_field_is_a_configuration_error(client: Client) -> None:
    """A template field the URL does not pass is ImproperlyConfigured on first use, naming the
    field and what the URL provides (the system check reports it at startup: E014)."""
    with pytest.raises(ImproperlyConfigured, match=r"item_id.*\['item'\]"):
        client.get("/wrong/3/")


# -- the decorator, async ------------------------------------------------------------------
def test_async_view_runs_with_lease(async_client: AsyncClient, item_id: int) -> None:
    """An async view gets request.lease and the active token; released afterwards."""
    response = run(async_client.get(f"/aitem/{item_id}/"))
    assert response.status_code == 200
    assert SEEN["token"] == SEEN["lease"].token
    assert SEEN["lease"].released
    assert is_free(f"item:{item_id}")


def test_async_busy_gives_409(async_client: AsyncClient, item_id: int, hold: Any) -> None:
    """An async view whose lock is held answers 409 with Retry-After."""
    hold(f"item:{item_id}")
    response = run(async_client.post(f"/aitem/{item_id}/", headers=JSON))
    assert response.status_code == 409
    assert int(response["Retry-After"]) >= 1


def test_async_view_raising_releases(async_client: AsyncClient, item_id: int) -> None:
    """An async view that raises still releases its lock."""
    with pytest.raises(RuntimeError):
        run(async_client.get(f"/aboom/{item_id}/"))
    assert is_free(f"item:{item_id}")


def test_async_streaming_releases_at_close(async_client: AsyncClient, item_id: int) -> None:
    """An async streaming response holds the lock until it is consumed and closed."""

    async def scenario() -> tuple[bool, bytes]:
        response = await async_client.get(f"/astream/{item_id}/")
        held_while_open = not is_free(f"item:{item_id}")
        stream: Any = response.streaming_content  # type: ignore[attr-defined]
        content = b"".join([chunk async for chunk in stream])
        return held_while_open, content

    held_while_open, content = run(scenario())
    assert held_while_open
    assert content == b"ab"
    assert is_free(f"item:{item_id}")


# -- nodes unavailable -----------------------------------------------------------------------
@pytest.fixture
def paused_default(redis_nodes: Any, settings: Any) -> None:
    """Point the ``default`` alias at three fresh nodes, all paused (SIGSTOP)."""
    settings.REDLOCK = {**settings.REDLOCK, "default": {"NODES": redis_nodes.urls, "TTL": 5.0}}
    for node in redis_nodes:
        node.pause()


@pytest.mark.usefixtures("paused_default")
def test_all_nodes_paused_gives_503(client: Client, async_client: AsyncClient) -> None:
    """With every node paused the sync and async views answer 503 + Retry-After, never 500."""
    response = client.post("/item/1/", headers=JSON)
    assert response.status_code == 503
    assert response.json()["error"] == "lock_unavailable"
    assert int(response["Retry-After"]) >= 1
    response = run(async_client.post("/aitem/1/"))
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1


@pytest.mark.usefixtures("paused_default")
def test_all_nodes_paused_gives_503_through_middleware_rule(
    client: Client, with_middleware: Callable[..., None]
) -> None:
    """A middleware rule on paused nodes also answers 503, as HTML for browsers."""
    with_middleware({"URL_NAME": "order-pay", "KEY": "order:{order_id}"})
    response = client.post("/orders/5/pay/", headers=HTML)
    assert response.status_code == 503
    assert b"503 Service Unavailable" in response.content


# -- the middleware ------------------------------------------------------------------------
def test_rule_by_url_name_locks_matching_methods_only(
    client: Client, item_id: int, hold: Any, with_middleware: Callable[..., None]
) -> None:
    """A URL_NAME rule locks its METHODS; other methods pass through unlocked."""
    with_middleware({"URL_NAME": "order-pay", "KEY": "order:{order_id}", "METHODS": ["POST"]})
    response = client.post(f"/orders/{item_id}/pay/")
    assert response.status_code == 200
    assert response.json()["name"] == f"order:{item_id}"
    assert SEEN["token"] == SEEN["lease"].token
    assert is_free(f"order:{item_id}")
    hold(f"order:{item_id}")
    assert client.post(f"/orders/{item_id}/pay/").status_code == 409
    get = client.get(f"/orders/{item_id}/pay/")
    assert get.status_code == 200 and get.json()["name"] is None


def test_rule_by_path_regex(
    client: Client, hold: Any, with_middleware: Callable[..., None]
) -> None:
    """A PATH rule fills the key from the regex's named groups."""
    cart = uuid.uuid4().hex
    with_middleware({"PATH": r"^/carts/(?P<cart>[\w-]+)/$", "KEY": "cart:{cart}"})
    assert client.delete(f"/carts/{cart}/").json()["name"] == f"cart:{cart}"
    hold(f"cart:{cart}")
    assert client.put(f"/carts/{cart}/").status_code == 409
    assert client.get(f"/carts/{cart}/").status_code == 200  # GET is not in the defaults


def test_first_matching_rule_wins(client: Client, with_middleware: Callable[..., None]) -> None:
    """Rules are tried in order; only the first match locks."""
    with_middleware(
        {"URL_NAME": "order-pay", "KEY": "first:{order_id}"},
        {"PATH": r"^/orders/", "KEY": "second"},
    )
    assert client.post("/orders/9/pay/").json()["name"] == "first:9"


def test_rule_and_decorator_on_same_key_do_not_deadlock(
    client: Client, item_id: int, with_middleware: Callable[..., None]
) -> None:
    """A rule and @request_lock naming the same lock: the request takes it once."""
    with_middleware({"URL_NAME": "item", "KEY": "item:{item_id}", "METHODS": ["GET"]})
    response = client.get(f"/item/{item_id}/")
    assert response.status_code == 200
    assert is_free(f"item:{item_id}")


def test_async_middleware_rule(
    async_client: AsyncClient, item_id: int, hold: Any, with_middleware: Callable[..., None]
) -> None:
    """Under ASGI the middleware runs in async mode with the same rules."""
    with_middleware({"URL_NAME": "aorder-pay", "KEY": "order:{order_id}"})
    response = run(async_client.post(f"/aorders/{item_id}/pay/"))
    assert response.json()["name"] == f"order:{item_id}"
    assert is_free(f"order:{item_id}")
    hold(f"order:{item_id}")
    assert run(async_client.post(f"/aorders/{item_id}/pay/")).status_code == 409


def test_async_middleware_with_sync_view(
    async_client: AsyncClient, item_id: int, with_middleware: Callable[..., None]
) -> None:
    """An async middleware in front of a sync view: the sync view still sees the lease."""
    with_middleware({"URL_NAME": "order-pay", "KEY": "order:{order_id}"})
    response = run(async_client.post(f"/orders/{item_id}/pay/"))
    assert response.json()["name"] == f"order:{item_id}"
    assert SEEN["token"] == SEEN["lease"].token


def test_middleware_turns_lock_errors_from_views_into_409(
    client: Client, hold: Any, with_middleware: Callable[..., None]
) -> None:
    """A view's own LockNotAcquired becomes 409, not 500, once the middleware is installed."""
    with_middleware()
    name = f"inner-{uuid.uuid4().hex}"
    hold(name)
    response = client.get(f"/inner-busy/{name}/", headers=JSON)
    assert response.status_code == 409
    assert json.loads(response.content)["error"] == "lock_busy"


def test_invalid_rules_fail_when_the_middleware_loads(
    client: Client, with_middleware: Callable[..., None]
) -> None:
    """An invalid rule is ImproperlyConfigured when the middleware is built (startup)."""
    with_middleware({"URL_NAME": "order-pay", "KEY": "order:{"})
    with pytest.raises(ImproperlyConfigured, match=r"REDLOCK_REQUEST_LOCKS\[0\]"):
        client.post("/orders/1/pay/")


# -- key templates: any URL value gives a valid, distinct name ---------------------------------
TRICKY = ["__fence__", "__x", "_", "_a", "{slug}", "%", "%25", "%-", "a:b", "a%3Ab", "x" * 600]


@pytest.fixture(params=["wsgi", "asgi"])
def post(request: Any, client: Client, async_client: AsyncClient) -> Callable[[str], Any]:
    """``post("/bare/x/")`` through WSGI, or through ASGI to the async view ``/abare/x/``."""
    if request.param == "asgi":
        return lambda path: run(async_client.post(f"/a{path[1:]}"))
    return client.post


def lock_name(response: Any) -> str:
    """The request's lock name, checked to be a valid name outside the reserved ``__`` keys."""
    assert response.status_code == 200, response.content[:300]
    name: str = response.json()["name"]
    assert name and not name.startswith("__") and len(name) <= MAX_NAME_LENGTH
    assert name.encode("utf-8")  # no lone surrogates
    return name


def test_template_starting_with_a_field_takes_any_value(
    post: Callable[[str], Any], with_middleware: Callable[..., None]
) -> None:
    """``"{slug}"`` (decorator) and a ``PATH`` rule ``"{number}"``: values starting with ``__``,
    empty, over-long or looking like a template all answer 200 with distinct valid names."""
    with_middleware({"PATH": r"^/a?rule/(?P<number>[^/]*)/$", "KEY": "{number}"})
    bare = {value: lock_name(post(f"/bare/{quote(value, safe='')}/")) for value in TRICKY}
    rule = {v: lock_name(post(f"/rule/{quote(v, safe='')}/")) for v in [*TRICKY, "", "{number}"]}
    assert len(set(bare.values())) == len(bare) and len(set(rule.values())) == len(rule)
    assert rule[""] != "{number}"  # an empty value does not give the template itself
    assert bare["a:b"] == "a:b" and bare["_a"] != "_a"  # readable unless ambiguous
    surrogates = lock_name(post("/rawbare/%ED%A0%80/"))  # the view gets lone surrogates
    assert surrogates not in bare.values()


def test_crafted_values_do_not_take_another_values_lock(
    post: Callable[[str], Any],
    client: Client,
    async_client: AsyncClient,
    django_user_model: Any,
    hold: Any,
) -> None:
    """Neither the hashed name of a long value (nor its old ``name[:447] + "#" + sha256``
    form), nor a value holding the template's separator, gives another request's lock name:
    holding one does not make the other busy."""
    victim = f"{uuid.uuid4().hex}{'x' * 600}"
    name = lock_name(post(f"/bare/{victim}/"))
    hold(name)
    old_style = victim[:447] + "#" + hashlib.sha256(victim.encode()).hexdigest()
    for crafted in (name, old_style, name[: MAX_NAME_LENGTH - 1]):
        assert lock_name(post(f"/bare/{quote(crafted, safe='')}/")) != name
    slug = uuid.uuid4().hex
    for username, path in ((f"c{slug}", f"/doc/{slug}:b/"), (f"b:c{slug}", f"/doc/{slug}/")):
        user = django_user_model.objects.create_user(username, password="x")
        client.force_login(user)
        async_client.force_login(user)
        name = lock_name(post(path))  # both were "doc:<slug>:b:c<slug>" before the fix
        hold(name)
    assert name.startswith(f"doc:{slug}:")
