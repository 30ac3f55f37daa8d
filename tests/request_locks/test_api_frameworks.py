"""Request locks on the APIs teams write: Django REST framework (token and JWT auth) and
django-ninja (bearer and API-key ``auth=``), which authenticate inside the view. Real Redis
nodes, Django's test clients; the effect is a payment row, counted here (tests.api_app)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from rest_framework.authtoken.models import Token
from rest_framework_simplejwt.tokens import AccessToken

from django_redlock import locks
from django_redlock.request_locks.checks import check_request_locks
from tests.api_app.models import ApiClient, Payment

pytestmark = [pytest.mark.urls("tests.api_app.urls"), pytest.mark.django_db]
JSON = {"Accept": "application/json"}
MIDDLEWARE_PATH = "django_redlock.middleware.RequestLockMiddleware"


@pytest.fixture
def users() -> dict[str, Any]:
    model = get_user_model()
    return {name: model.objects.create_user(name, password="pw") for name in ("alice", "bob")}


def token(user: Any) -> str:
    return f"Token {Token.objects.get_or_create(user=user)[0].key}"


def jwt(user: Any) -> str:
    return f"Bearer {AccessToken.for_user(user)}"


def post(
    url: str, key: str | None, auth: str | None = None, body: str = "{}", **headers: str
) -> Any:
    if key is not None:
        headers["Idempotency-Key"] = key
    if auth is not None:
        headers["Authorization"] = auth
    client = Client(raise_request_exception=False)
    return client.post(url, body, content_type="application/json", headers={**JSON, **headers})


def order() -> str:
    return uuid.uuid4().hex[:12]


# -- DRF, each placement -----------------------------------------------------------------------
@pytest.mark.parametrize("how", [token, jwt], ids=["token", "jwt"])
@pytest.mark.parametrize(
    "path",
    ["drf/under/{o}/", "drf/method-decorator/{o}/", "drf/method/{o}/", "drf/orders/{o}/settle/"],
    ids=["under_api_view", "method_decorator", "method", "action"],
)
def test_two_users_with_one_key_and_body_never_see_each_others_response(
    users: dict[str, Any], how: Any, path: str
) -> None:
    """Alice pays; Bob sends the same key and body: his own payment (not Alice's replay); each
    retry replays its own user's response; a client without credentials gets 401 or 403,
    never a kept response."""
    url, key = "/" + path.format(o=order()), str(uuid.uuid4())
    alice, bob = how(users["alice"]), how(users["bob"])
    first = post(url, key, alice)
    assert first.status_code == 201, first.content
    assert first.json()["user"] == "alice"
    other = post(url, key, bob)
    assert other.status_code == 201, other.content
    assert other.json()["user"] == "bob"
    assert "Idempotent-Replayed" not in other
    again = post(url, key, alice)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    anonymous = post(url, key)
    assert anonymous.status_code in (401, 403)
    assert "Idempotent-Replayed" not in anonymous
    assert (
        Payment.objects.filter(
            order=url.split("/")[-2] if "settle" not in url else url.split("/")[-3]
        ).count()
        == 2
    )


def test_the_decorator_under_api_view_keeps_the_rendered_drf_response(
    users: dict[str, Any],
) -> None:
    """Placed under ``@api_view``, the decorator used to answer 500 ("accepted_renderer not set
    on Response"); now the DRF Response is rendered as DRF would and kept whole."""
    url, key = f"/drf/under/{order()}/", str(uuid.uuid4())
    first = post(url, key, token(users["alice"]))
    again = post(url, key, token(users["alice"]))
    assert first.status_code == again.status_code == 201
    assert first["Content-Type"] == again["Content-Type"] == "application/json"
    assert again.content == first.content
    assert Payment.objects.filter(via="under_api_view").count() == 1


def test_a_viewset_method_takes_its_lock(users: dict[str, Any]) -> None:
    url, key = f"/drf/orders/{order()}/", str(uuid.uuid4())
    client = Client()
    headers = {**JSON, "Idempotency-Key": key, "Authorization": token(users["alice"])}
    first = client.put(url, "{}", content_type="application/json", headers=headers)
    again = client.put(url, "{}", content_type="application/json", headers=headers)
    assert first.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert Payment.objects.filter(via="viewset").count() == 1


def test_a_user_pk_key_is_per_drf_user(users: dict[str, Any]) -> None:
    """``{user.pk}`` is the DRF-authenticated user: Alice holding her lock does not keep Bob
    out, and a second request of Alice's is refused 409 while hers runs."""
    o = order()
    lease = locks["default"].acquire(f"user-pay:{users['alice'].pk}:{o}", ttl=10)
    try:
        busy = post(f"/drf/per-user/{o}/", None, token(users["alice"]))
        assert busy.status_code == 409
        assert busy.json()["error"] == "lock_busy"
        assert post(f"/drf/per-user/{o}/", None, token(users["bob"])).status_code == 201
    finally:
        lease.release()
    assert post(f"/drf/per-user/{o}/", None, token(users["alice"])).status_code == 201


def test_drf_answers_409_422_and_400_as_json(users: dict[str, Any]) -> None:
    """Every answer of the lock is a response DRF returns as is."""
    url, key, alice = f"/drf/under/{order()}/", str(uuid.uuid4()), token(users["alice"])
    assert post(url, key, alice, '{"a": 1}').status_code == 201
    mismatch = post(url, key, alice, '{"a": 2}')
    assert mismatch.status_code == 422
    assert mismatch.json()["error"] == "idempotency_key_reused"
    bad = post(url, "\t", alice)
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_idempotency_key"


def test_a_decorator_above_api_view_refuses_a_request_with_credentials(
    users: dict[str, Any],
) -> None:
    """Above ``@api_view`` the lock runs before DRF authenticates: with an Authorization header
    the request is refused (ImproperlyConfigured, a 500), never scoped to nobody, and the view
    does not run; Bob never gets Alice's response."""
    url, key = f"/drf/above/{order()}/", str(uuid.uuid4())
    client = Client(raise_request_exception=True)
    headers = {**JSON, "Idempotency-Key": key, "Authorization": token(users["alice"])}
    with pytest.raises(ImproperlyConfigured, match="under @api_view"):
        client.post(url, "{}", content_type="application/json", headers=headers)
    assert Payment.objects.count() == 0
    assert post(url, key, token(users["bob"])).status_code == 500


# -- django-ninja ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bearer", "key", "async"])
def test_ninja_operations_are_scoped_to_the_authenticated_principal(
    users: dict[str, Any], kind: str
) -> None:
    url, key = f"/ninja/{kind}/{order()}", str(uuid.uuid4())
    if kind == "key":
        creds = {"X-API-Key": "key-alice"}, {"X-API-Key": "key-bob"}
    else:
        creds = {"Authorization": "Bearer token-alice"}, {"Authorization": "Bearer token-bob"}
    alice, bob = creds
    first = post(url, key, body='{"amount": 2}', **alice)
    assert first.status_code == 201, first.content
    assert "alice" in first.json()["principal"]
    other = post(url, key, body='{"amount": 2}', **bob)
    assert other.status_code == 201 and "bob" in other.json()["principal"]
    again = post(url, key, body='{"amount": 2}', **alice)
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert post(url, key, body='{"amount": 2}').status_code == 401
    assert Payment.objects.filter(order=url.rsplit("/", 1)[1]).count() == 2
    assert json.loads(first.content)["order"] == url.rsplit("/", 1)[1]


# -- checks ------------------------------------------------------------------------------------
def _ids(messages: list[Any]) -> list[tuple[str, str]]:
    return [(m.id, m.msg) for m in messages]


def test_check_e014_sees_inside_drf_and_ninja_views() -> None:
    """A template field no URL kwarg (or django-ninja parameter) provides is reported at
    startup for a DRF handler and a django-ninja operation too (it was, for plain views
    only: the mistake surfaced as a 500 on the first request)."""
    with override_settings(ROOT_URLCONF="tests.api_app.urls_e014"):
        found = [msg for id_, msg in _ids(check_request_locks()) if id_ == "django_redlock.E014"]
    assert len(found) == 2, found
    assert any("drf_lacks" in msg for msg in found) and any("ninja" in msg for msg in found)
    clean = [msg for id_, msg in _ids(check_request_locks()) if id_ == "django_redlock.E014"]
    assert clean == []  # every placement in tests.api_app.urls provides its fields


def test_check_e032_names_a_decorator_above_api_view() -> None:
    found = [msg for id_, msg in _ids(check_request_locks()) if id_ == "django_redlock.E032"]
    assert len(found) == 1, found
    assert "above_api_view" in found[0] and "Django REST framework" in found[0]


@pytest.mark.parametrize("url_name", ["drf-under", "ninja-api:ninja-bearer"])
def test_check_e031_names_an_idempotency_rule_in_front_of_an_api_view(url_name: str) -> None:
    rule = {"URL_NAME": url_name, "KEY": "rule:{order}", "IDEMPOTENCY": True}
    with override_settings(
        REDLOCK_REQUEST_LOCKS=[rule], MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    ):
        found = [msg for id_, msg in _ids(check_request_locks()) if id_ == "django_redlock.E031"]
    assert len(found) == 1, found


def test_a_rule_in_front_of_a_drf_view_refuses_a_request_with_credentials(
    users: dict[str, Any],
) -> None:
    """At run time too: the middleware sees no user while the request carries a token."""
    rule = {"URL_NAME": "drf-under", "KEY": "rule:{order}", "IDEMPOTENCY": True}
    middleware = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    with override_settings(REDLOCK_REQUEST_LOCKS=[rule], MIDDLEWARE=middleware):
        url, key = f"/drf/under/{order()}/", str(uuid.uuid4())
        assert post(url, key, token(users["alice"])).status_code == 500
        assert post(url, key, token(users["bob"])).status_code == 500
        assert Payment.objects.count() == 0
        assert post(url, None, token(users["alice"])).status_code == 201  # no key: no scope


# -- found by attacking it (each failed before its fix) ----------------------------------------
def test_an_api_client_never_shares_the_key_space_of_the_user_with_its_pk(
    users: dict[str, Any],
) -> None:
    """A DRF authentication class puts an API client (a model that is not the user model) in
    ``request.user``; its pk equals Alice's. Same key, same body: each gets its own payment
    (the client used to get Alice's kept response: both were scoped to "pk 1")."""
    alice = users["alice"]
    ApiClient.objects.create(pk=alice.pk, name="robot")
    url, key = f"/drf/clients/{order()}/", str(uuid.uuid4())
    first = post(url, key, token(alice))
    other = post(url, key, None, **{"X-Client": "robot"})
    assert first.status_code == other.status_code == 201
    assert first.json()["user"] == "alice"
    assert other.json()["user"] == "client:robot"
    assert "Idempotent-Replayed" not in other
    assert Payment.objects.filter(via="users_and_clients").count() == 2


@pytest.mark.parametrize(
    ("rule", "url", "headers"),
    [
        ({"URL_NAME": "ninja-api:ninja-key"}, "/ninja/key/{o}", {"X-API-Key": "key-alice"}),
        ({"URL_NAME": "ninja-api:ninja-key"}, "/ninja/key/{o}", {}),
        ({"PATH": r"^/drf/clients-only/"}, "/drf/clients-only/{o}/", {"X-Client": "robot"}),
        ({"PATH": r"^/drf/clients-only/"}, "/drf/clients-only/{o}/", {}),
    ],
    ids=["ninja-key", "ninja-no-key", "drf-custom-header", "drf-no-header"],
)
def test_a_rule_in_front_of_an_api_view_refuses_what_it_cannot_scope(
    users: dict[str, Any], rule: dict[str, Any], url: str, headers: dict[str, str]
) -> None:
    """An IDEMPOTENCY rule (the middleware, before any authentication) in front of a view that
    authenticates inside (a django-ninja API key, a DRF class reading its own header) refuses
    every request it would scope to nobody, with or without credentials: nothing the
    middleware sees tells them apart. They used to run, and replay one client's response to
    the next, and to clients without credentials."""
    ApiClient.objects.create(name="robot")
    middleware = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    rule = {**rule, "KEY": "rule:{order}" if "URL_NAME" in rule else "rule", "IDEMPOTENCY": True}
    with override_settings(REDLOCK_REQUEST_LOCKS=[rule], MIDDLEWARE=middleware):
        key = str(uuid.uuid4())
        answer = post(url.format(o=order()), key, None, body='{"amount": 2}', **headers)
        assert answer.status_code == 500
    assert Payment.objects.count() == 0


def test_a_put_multipart_body_is_part_of_the_fingerprint(users: dict[str, Any]) -> None:
    """The same key with another multipart PUT body is 422, not the first one's replay
    (Django parses multipart POST bodies only; a PUT's was not in the fingerprint)."""
    url, key = f"/drf/orders/{order()}/", str(uuid.uuid4())
    client = Client()
    headers = {**JSON, "Idempotency-Key": key, "Authorization": token(users["alice"])}

    def put(amount: str) -> Any:
        body = encode_multipart(BOUNDARY, {"amount": amount})
        return client.put(url, body, content_type=MULTIPART_CONTENT, headers=headers)

    assert put("1").status_code == 201
    assert put("1")["Idempotent-Replayed"] == "true"
    assert put("2").status_code == 422
