"""Per-request lock configuration: key templates and rules as built, and the system checks (each
id django_redlock.E010-E019 / W010 fires when it should and stays quiet on a valid
configuration)."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_redlock.conf import MAX_NAME_LENGTH
from django_redlock.middleware import parse_rule, request_rules
from django_redlock.request_locks.checks import CHECK_IDS, check_request_locks
from django_redlock.request_locks.keys import KeyTemplate
from django_redlock.validation import check_name

pytestmark = pytest.mark.urls("tests.support.request_lock_urls")
MIDDLEWARE_PATH = "django_redlock.middleware.RequestLockMiddleware"
AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"


# -- key templates ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("order:{", "not a valid format string"),
        ("order:{}", "positional"),
        ("order:{0}", "positional"),
        ("order:{id:{width}}", "nests"),
        ("", "non-empty"),
        ("__x:{id}", "reserved"),
        ("__", "reserved"),
        ("x\ud800:{id}", "surrogate"),
    ],
)
def test_bad_templates_are_rejected(template: str, message: str) -> None:
    """Broken templates are rejected when built, with a message saying why."""
    with pytest.raises(ImproperlyConfigured, match=message):
        KeyTemplate(template, "here")


def test_long_keys_are_hashed_within_the_name_limit() -> None:
    """A key longer than 512 characters keeps a prefix and a SHA-256 tail (no ValueError)."""
    template = KeyTemplate("doc:{slug}", "here")
    name = template.fill({"slug": "x" * 2000})
    other = template.fill({"slug": "x" * 1999 + "y"})
    assert len(name) == MAX_NAME_LENGTH and name.startswith("doc:xxx")
    assert name != other


VALUES = ["", "_", "__", "_a", "%", "%2", "%25", "%-", "%.", "%#", ":", "a:b", "a%3Ab", "a", "b"]
VALUES += ["ab", "b:c", "{a}", "\ud800", "%ED%A0%80", "x" * 600, "x" * 505, "\u00e9", "E9"]


@pytest.mark.parametrize(
    "template",
    ["{a}", "doc:{a}:{b}", "{a}{b}", "{a}%{b}", "{a}%25{b}", "_{a}", "{a}__{b}", "x{a}x{b}"],
)
def test_fill_is_injective_and_always_valid(template: str) -> None:
    """Every combination of awkward values gives a valid name (no reserved ``__`` start, no
    lone surrogate, at most 512 characters) and no two combinations give the same name."""
    key = KeyTemplate(template, "here")
    names: dict[str, tuple[str, ...]] = {}
    for combo in itertools.product(VALUES, repeat=len(key.fields)):
        name = key.fill(dict(zip(sorted(key.fields), combo, strict=True)))
        assert check_name(name) == name and name.encode("utf-8")
        assert names.setdefault(name, combo) == combo, (name, combo, names[name])


def test_reported_collisions_are_gone() -> None:
    """The reported collisions: a crafted value equal to a long value's hashed name (or to its old
    ``name[:447] + "#" + sha256`` form) and a separator in a value no longer collide; an empty
    value does not give the template itself."""
    order = KeyTemplate("order:{order_id}", "here")
    victim = "x" * 600
    name = order.fill({"order_id": victim})
    old = f"order:{victim}"[:447] + "#" + hashlib.sha256(f"order:{victim}".encode()).hexdigest()
    for crafted in (name[len("order:") :], old[len("order:") :]):
        assert order.fill({"order_id": crafted}) != name
    doc = KeyTemplate("doc:{slug}:{user.username}", "here")

    class User:
        def __init__(self, username: str) -> None:
            self.username = username

    assert doc.fill({"slug": "a:b"}, User("c")) != doc.fill({"slug": "a"}, User("b:c"))
    rule = KeyTemplate("{number}", "here")
    assert rule.fill({"number": ""}) != "{number}" == rule.fill({"number": "{number}"})


def test_ordinary_values_stay_readable() -> None:
    """Only what could be ambiguous is escaped: ids, slugs and user pks read as they are."""
    assert KeyTemplate("order:{order_id}", "here").fill({"order_id": 42}) == "order:42"
    assert KeyTemplate("{slug}", "here").fill({"slug": "a:b-c"}) == "a:b-c"
    doc = KeyTemplate("doc:{slug}:{n:03d}", "here")
    assert doc.fill({"slug": "my-doc", "n": 7}) == "doc:my-doc:007"
    assert doc.fill({"slug": "a:b", "n": 7}) == "doc:a%3Ab:007"
    assert KeyTemplate("{slug}", "here").fill({"slug": "__fence__"}) == "%5F_fence__"
    assert KeyTemplate("{slug}", "here").fill({"slug": "x" * 511}) == "x" * 511
    hashed = KeyTemplate("{slug}", "here").fill({"slug": "x" * 512})
    assert len(hashed) == MAX_NAME_LENGTH and hashed.startswith("x" * 446 + "%#")


# -- rules -----------------------------------------------------------------------------------
def test_rule_defaults_and_normalisation() -> None:
    """METHODS default to the unsafe methods and are upper-cased; TIMEOUT defaults to 0."""
    rule = parse_rule(0, {"URL_NAME": "x", "KEY": "k"})
    assert rule.methods == {"POST", "PUT", "PATCH", "DELETE"}
    assert rule.spec.timeout == 0 and rule.spec.using == "default"
    assert parse_rule(0, {"PATH": "^/", "KEY": "k", "METHODS": ["get"]}).methods == {"GET"}


def test_rules_cache_follows_setting_changes(settings: Any) -> None:
    """request_rules() is re-read when REDLOCK_REQUEST_LOCKS changes."""
    settings.REDLOCK_REQUEST_LOCKS = [{"URL_NAME": "a", "KEY": "a"}]
    assert [r.url_name for r in request_rules()] == ["a"]
    settings.REDLOCK_REQUEST_LOCKS = [{"URL_NAME": "b", "KEY": "b"}]
    assert [r.url_name for r in request_rules()] == ["b"]


# -- system checks ------------------------------------------------------------------------------
def ids(*, skip_views: bool = True) -> list[str]:
    """The ids reported now; the test URLconf's deliberately broken view (E014) is skipped."""
    return [
        m.id.removeprefix("django_redlock.")
        for m in check_request_locks()
        if not (skip_views and "wrong-field" in m.msg)
        if m.id
    ]


@pytest.fixture
def rules(settings: Any) -> Any:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]

    def set_rules(*entries: Any) -> None:
        settings.REDLOCK_REQUEST_LOCKS = list(entries)

    return set_rules


def test_valid_configuration_is_quiet(rules: Any) -> None:
    """URL_NAME and PATH rules whose fields the URLs provide, with user keys: no messages."""
    rules(
        {"URL_NAME": "order-pay", "KEY": "order:{order_id}", "METHODS": ["POST"]},
        {"PATH": r"^/carts/(?P<cart>\w+)/", "KEY": "cart:{cart}:{user.pk}", "USING": "multi"},
        {"URL_NAME": "checkout", "KEY": "checkout:{user.pk}", "TTL": 5, "TIMEOUT": 1.5},
    )
    assert ids() == []


def test_decorated_view_with_missing_field_is_e014() -> None:
    """@request_lock on a URL that does not pass the template's field is reported at startup."""
    messages = [m for m in check_request_locks() if m.id == "django_redlock.E014"]
    assert len(messages) == 1
    assert "item_id" in messages[0].msg and "wrong-field" in messages[0].msg


@pytest.mark.parametrize(
    ("entry", "check_id"),
    [
        ("not a dict", "E010"),
        ({"URL_NAME": "order-pay", "KEY": "k", "COLOUR": 1}, "E010"),
        ({"KEY": "k"}, "E010"),
        ({"URL_NAME": "order-pay", "PATH": "^/", "KEY": "k"}, "E010"),
        ({"URL_NAME": "order-pay"}, "E010"),
        ({"URL_NAME": "order-pay", "KEY": "k", "METHODS": "POST"}, "E010"),
        ({"URL_NAME": "order-pay", "KEY": "k", "METHODS": ["P O S T"]}, "E010"),
        ({"URL_NAME": "order-pay", "KEY": "k", "TTL": 0}, "E010"),
        ({"URL_NAME": "order-pay", "KEY": "k", "TIMEOUT": "soon"}, "E010"),
        ({"URL_NAME": "order-pay", "KEY": "order:{0}"}, "E011"),
        ({"URL_NAME": "order-pay", "KEY": "order:{"}, "E011"),
        ({"URL_NAME": "order-pay", "KEY": "__order:{order_id}"}, "E011"),
        ({"PATH": "^/(unclosed", "KEY": "k"}, "E012"),
        ({"URL_NAME": "no-such-url", "KEY": "k"}, "E013"),
        ({"URL_NAME": "order-pay", "KEY": "order:{id}"}, "E014"),
        ({"PATH": r"^/carts/(?P<cart>\w+)/", "KEY": "cart:{basket}"}, "E014"),
        ({"URL_NAME": "order-pay", "KEY": "o:{order_id}", "LIMITS": {"api:{id}": 2}}, "E014"),
        ({"URL_NAME": "order-pay", "KEY": "k", "USING": "nope"}, "E015"),
    ],
)
def test_bad_rules(rules: Any, entry: Any, check_id: str) -> None:
    """Each malformed rule is reported once with its id."""
    rules(entry)
    assert ids() == [check_id]


def test_setting_not_a_list_is_e010(settings: Any) -> None:
    settings.REDLOCK_REQUEST_LOCKS = {"URL_NAME": "order-pay"}
    assert ids() == ["E010"]


@pytest.mark.parametrize("status", [200, 600, "409", True])
def test_bad_busy_status_is_e016(settings: Any, status: Any) -> None:
    """REDLOCK_BUSY_STATUS must be an int from 400 to 599."""
    settings.REDLOCK_BUSY_STATUS = status
    assert ids() == ["E016"]


def test_user_key_before_auth_middleware_is_e017(settings: Any) -> None:
    """A {user} key needs AuthenticationMiddleware before RequestLockMiddleware."""
    settings.MIDDLEWARE = [MIDDLEWARE_PATH, *settings.MIDDLEWARE]
    settings.REDLOCK_REQUEST_LOCKS = [{"URL_NAME": "checkout", "KEY": "c:{user.pk}"}]
    assert ids() == ["E017"]


def test_decorated_user_key_without_auth_middleware_is_e017(settings: Any) -> None:
    """@request_lock('checkout:{user.pk}') without AuthenticationMiddleware is reported."""
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != AUTH]
    assert set(ids()) == {"E017"}  # one per decorated view using {user...}


def test_rules_without_middleware_is_w010(settings: Any) -> None:
    settings.REDLOCK_REQUEST_LOCKS = [{"URL_NAME": "order-pay", "KEY": "order:{order_id}"}]
    assert ids() == ["W010"]


def test_ids_are_documented_and_registered() -> None:
    """Every id is in docs/middleware.md, and `manage.py check` runs the check."""
    docs = (Path(__file__).parents[2] / "docs" / "middleware.md").read_text()
    for check_id in CHECK_IDS:
        assert f"django_redlock.{check_id}" in docs
    with pytest.raises(SystemCheckError, match=r"django_redlock\.E014"):
        call_command("check")  # the test URLconf's deliberately broken view


@pytest.mark.parametrize(
    "entries",
    [
        # a lock rule on the template of the URLconf's @request_lock(..., limit=2) views
        [{"URL_NAME": "order-pay", "KEY": "limited:{order_id}"}],
        # a LIMIT rule on the template of its plain @request_lock views ("item:{item_id}")
        [{"URL_NAME": "order-pay", "KEY": "item:{order_id}", "LIMIT": 3}],
        # a lock rule and a LIMIT rule
        [
            {"URL_NAME": "order-pay", "KEY": "order:{order_id}"},
            {"URL_NAME": "aorder-pay", "KEY": "order:{order_id}", "LIMIT": 2, "METHODS": ["GET"]},
        ],
        # two LIMIT rules with different limits: "in use with other permits"
        [
            {"URL_NAME": "order-pay", "KEY": "order:{order_id}", "LIMIT": 2},
            {"URL_NAME": "aorder-pay", "KEY": "order:{order_id}", "LIMIT": 5},
        ],
        # a LIMITS name on another rule's lock KEY
        [
            {"URL_NAME": "order-pay", "KEY": "o:{order_id}", "LIMITS": {"api:{order_id}": 2}},
            {"URL_NAME": "aorder-pay", "KEY": "api:{order_id}"},
        ],
        # one LIMITS name with two sizes
        [
            {"URL_NAME": "order-pay", "KEY": "o:{order_id}", "LIMITS": {"api:global": 2}},
            {"URL_NAME": "aorder-pay", "KEY": "p:{order_id}", "LIMITS": {"api:global": 3}},
        ],
    ],
)
def test_a_lock_and_a_limit_on_one_key_template_is_e019(rules: Any, entries: Any) -> None:
    """A lock rule or view and a LIMIT rule or view (or two different LIMITs) on one key
    template and alias would answer HTTP 500 ("in use as another kind") to whichever request
    comes second: reported at startup, once, naming both."""
    rules(*entries)
    messages = [m for m in check_request_locks() if m.id == "django_redlock.E019"]
    assert len(messages) == 1 and [i for i in ids() if i != "E019"] == []
    assert "REDLOCK_REQUEST_LOCKS[0]" in messages[0].msg


def test_one_kind_per_key_template_is_quiet(rules: Any) -> None:
    """Locks sharing a template, LIMITs sharing a template and limit, and a lock and a LIMIT
    on one template of two different aliases are fine."""
    rules(
        {"URL_NAME": "order-pay", "KEY": "item:{order_id}"},
        {"URL_NAME": "order-pay", "KEY": "limited:{order_id}", "LIMIT": 2},
        {"URL_NAME": "aorder-pay", "KEY": "limited:{order_id}", "LIMIT": 2},
        {"URL_NAME": "aorder-pay", "KEY": "item:{order_id}", "LIMIT": 4, "USING": "multi"},
    )
    assert ids() == []
