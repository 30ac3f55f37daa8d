"""What a request locks: :class:`LockSpec`, the ``REDLOCK_REQUEST_LOCKS`` rules, matching one.

::

    REDLOCK_REQUEST_LOCKS = [
        {"URL_NAME": "order-pay", "KEY": "order:{order_id}", "METHODS": ["POST"]},
        {"PATH": r"^/api/carts/(?P<cart>\\w+)/", "KEY": "cart:{cart}", "TIMEOUT": 2},
    ]

The first rule that matches a request's method and URL name (or path regex) locks it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest
from django.urls import Resolver404, ResolverMatch, get_resolver

from ..conf import request_locks_setting
from ..validation import check_permits, check_timeout, check_ttl
from .keys import KeyTemplate

SETTING = "REDLOCK_REQUEST_LOCKS"
RULE_KEYS = frozenset(
    {
        "URL_NAME",
        "PATH",
        "KEY",
        "METHODS",
        "USING",
        "TTL",
        "TIMEOUT",
        "UNTIL_COMMIT",
        "LIMIT",
        "LIMITS",
        "IDEMPOTENCY",
    }
)
DEFAULT_METHODS = ("POST", "PUT", "PATCH", "DELETE")
_METHOD = re.compile(r"^[A-Z]+$")

SPECS_ATTR = "redlock_request_locks"
"""Attribute on a decorated view: the tuple of its :class:`LockSpec`, read by system checks."""


@dataclass(frozen=True)
class LockSpec:
    """What to lock for a request: key template, alias, lease TTL and how long to wait."""

    key: KeyTemplate
    using: str = "default"
    ttl: float | None = None
    timeout: float | None = 0
    #: inside a transaction (``ATOMIC_REQUESTS``), release after it commits
    until_commit: bool = True
    #: take one of this many permits of the key (a semaphore; over it: 429) instead of a lock
    limit: int | None = None
    #: a request with the idempotency header runs once per header value; its response is kept
    #: and replayed (see :mod:`.idempotency`)
    idempotency: bool = False
    #: a permit of each of these semaphores too (name template, permits), all or nothing
    #: (``limits()``); one full: 429
    limits: tuple[tuple[KeyTemplate, int], ...] = ()

    @functools.cached_property
    def plain(self) -> LockSpec:
        """This spec without idempotency: the lock an idempotent request also holds."""
        return dataclasses.replace(self, idempotency=False)

    @functools.cached_property
    def keyed(self) -> LockSpec:
        """The spec of an idempotent request's key lock: inside a transaction it is released,
        and the response kept, after the commit whatever ``until_commit`` says (that option is
        the plain lock's), so a rolled-back request keeps nothing."""
        return dataclasses.replace(self, until_commit=True)

    @classmethod
    def build(
        cls,
        key: Any,
        using: Any,
        ttl: Any,
        timeout: Any,
        where: str,
        until_commit: Any = True,
        limit: Any = None,
        idempotency: Any = False,
        limits: Any = None,
    ) -> LockSpec:
        """Validate every part, raising ``ImproperlyConfigured`` that names ``where``."""
        template = KeyTemplate(key, where)
        semaphores = _limits(limits, where)
        try:
            limit = None if limit is None else check_permits(limit)
        except (TypeError, ValueError) as exc:
            message = str(exc).replace("permits", "limit")
            raise LimitError(
                f"{where}: {message} (the most requests holding the key at once)"
            ) from None
        if not isinstance(using, str) or not using:
            raise ImproperlyConfigured(f"{where}: using must be a REDLOCK alias name (str).")
        if not isinstance(until_commit, bool):
            raise ImproperlyConfigured(f"{where}: until_commit must be True or False.")
        if not isinstance(idempotency, bool):
            raise ImproperlyConfigured(f"{where}: idempotency must be True or False.")
        if idempotency and limit is not None:
            raise ImproperlyConfigured(
                f"{where}: idempotency needs a lock, not a limit: drop limit (LIMIT) or "
                "idempotency (IDEMPOTENCY); a kept response is written by the lock's one holder."
            )
        try:
            ttl = None if ttl is None else check_ttl(ttl)
            timeout = check_timeout(timeout)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"{where}: {exc}") from exc
        return cls(template, using, ttl, timeout, until_commit, limit, idempotency, semaphores)

    @property
    def uses_user(self) -> bool:
        """The key or a semaphore's name is filled from ``request.user``."""
        return self.key.uses_user or any(t.uses_user for t, _ in self.limits)


def _limits(limits: Any, where: str) -> tuple[tuple[KeyTemplate, int], ...]:
    """``limits=`` (``LIMITS``): a dict of name templates to permits, or None."""
    if limits is None:
        return ()
    if not isinstance(limits, Mapping) or not limits:
        raise LimitError(
            f"{where}: limits must be a non-empty dict of name templates to permits, e.g. "
            '{"api:global": 20, "api:tenant:{tenant}": 2}.'
        )
    checked = []
    for text, permits in limits.items():
        try:
            checked.append((KeyTemplate(text, where), check_permits(permits)))
        except (TypeError, ValueError, ImproperlyConfigured) as exc:
            raise LimitError(f"{where}: limits[{text!r}]: {exc}") from None
    return tuple(checked)


def view_specs(view: Any) -> tuple[LockSpec, ...]:
    """The specs ``@request_lock`` put on ``view`` (outermost last), or ``()``."""
    specs: tuple[LockSpec, ...] = getattr(view, SPECS_ATTR, ())
    return specs


class LimitError(ImproperlyConfigured):
    """A bad ``LIMIT`` (``limit=``): not an int from 1 to 1024; or bad ``LIMITS``."""


class RuleError(ImproperlyConfigured):
    """An invalid ``REDLOCK_REQUEST_LOCKS`` entry; ``check_id`` is its system-check id."""

    def __init__(self, message: str, check_id: str) -> None:
        super().__init__(message)
        self.check_id = check_id


@dataclass(frozen=True)
class LockRule:
    """One validated ``REDLOCK_REQUEST_LOCKS`` entry."""

    index: int
    spec: LockSpec
    methods: frozenset[str]
    url_name: str | None
    path: re.Pattern[str] | None

    def kwargs_for(
        self, request: HttpRequest, resolve: Callable[[], ResolverMatch | None]
    ) -> Mapping[str, Any] | None:
        """The values for the key template if this rule applies to ``request``, else None."""
        if request.method not in self.methods:
            return None
        if self.path is not None:
            found = self.path.search(request.path_info)
            return None if found is None else found.groupdict()
        match = resolve()
        if match is None or match.view_name != self.url_name:
            return None
        return match.kwargs


def parse_rule(index: int, raw: Any) -> LockRule:
    """Validate one entry; raises :class:`RuleError` naming ``REDLOCK_REQUEST_LOCKS[index]``."""
    where = f"{SETTING}[{index}]"
    if not isinstance(raw, Mapping):
        raise RuleError(f"{where} must be a dict, not {type(raw).__name__}.", "E010")
    unknown = sorted(set(raw) - RULE_KEYS)
    if unknown:
        raise RuleError(
            f"{where} has unknown key(s) {', '.join(map(str, unknown))}; allowed: "
            f"{', '.join(sorted(RULE_KEYS))}.",
            "E010",
        )
    url_name, path = raw.get("URL_NAME"), raw.get("PATH")
    if (url_name is None) == (path is None):
        raise RuleError(f"{where} needs exactly one of URL_NAME or PATH.", "E010")
    if url_name is not None and (not isinstance(url_name, str) or not url_name):
        raise RuleError(f"{where}['URL_NAME'] must be a non-empty str.", "E010")
    methods = raw.get("METHODS", DEFAULT_METHODS)
    if isinstance(methods, str) or not isinstance(methods, list | tuple) or not methods:
        raise RuleError(f"{where}['METHODS'] must be a non-empty list of HTTP methods.", "E010")
    if not all(isinstance(m, str) and _METHOD.match(m.upper()) for m in methods):
        raise RuleError(f"{where}['METHODS'] must hold method names like 'POST'.", "E010")
    if "KEY" not in raw:
        raise RuleError(f"{where} needs a KEY template such as 'order:{{order_id}}'.", "E010")
    try:
        KeyTemplate(raw["KEY"], where)
    except ImproperlyConfigured as exc:
        raise RuleError(str(exc), "E011") from exc
    compiled: re.Pattern[str] | None = None
    if path is not None:
        if not isinstance(path, str):
            raise RuleError(f"{where}['PATH'] must be a regular expression str.", "E012")
        try:
            compiled = re.compile(path)
        except re.error as exc:
            raise RuleError(
                f"{where}['PATH'] {path!r} is not a valid regex: {exc}.", "E012"
            ) from exc
    try:
        spec = LockSpec.build(
            raw["KEY"],
            raw.get("USING", "default"),
            raw.get("TTL"),
            raw.get("TIMEOUT", 0),
            where,
            raw.get("UNTIL_COMMIT", True),
            raw.get("LIMIT"),
            raw.get("IDEMPOTENCY", False),
            raw.get("LIMITS"),
        )
    except LimitError as exc:
        raise RuleError(str(exc), "E018") from exc
    except ImproperlyConfigured as exc:  # USING, TTL, TIMEOUT, UNTIL_COMMIT or IDEMPOTENCY
        raise RuleError(str(exc), "E010") from exc
    return LockRule(index, spec, frozenset(m.upper() for m in methods), url_name, compiled)


def read_rules() -> tuple[list[LockRule], list[RuleError]]:
    """``REDLOCK_REQUEST_LOCKS`` parsed: its valid rules, and one error per invalid entry."""
    try:
        entries = request_locks_setting()
    except ImproperlyConfigured as exc:  # not a list
        return [], [RuleError(str(exc), "E010")]
    rules: list[LockRule] = []
    errors: list[RuleError] = []
    for index, entry in enumerate(entries):
        try:
            rules.append(parse_rule(index, entry))
        except RuleError as exc:
            errors.append(exc)
    return rules, errors


@functools.cache
def request_rules() -> tuple[LockRule, ...]:
    """The parsed ``REDLOCK_REQUEST_LOCKS`` (cached; reset when the setting changes).

    Raises the first entry's :class:`RuleError` if any entry is invalid.
    """
    rules, errors = read_rules()
    if errors:
        raise errors[0]
    return tuple(rules)


@receiver(setting_changed)
def _reset_rules(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING:
        request_rules.cache_clear()


def _resolver_for(request: HttpRequest) -> Callable[[], ResolverMatch | None]:
    """Resolve the request's path at most once, only if a URL_NAME rule needs it."""
    found: list[ResolverMatch | None] = []

    def resolve() -> ResolverMatch | None:
        if not found:
            try:
                found.append(
                    get_resolver(getattr(request, "urlconf", None)).resolve(request.path_info)
                )
            except Resolver404:
                found.append(None)
        return found[0]

    return resolve


def match_rule(request: HttpRequest) -> tuple[LockSpec, Mapping[str, Any]] | None:
    """The first rule that applies to ``request`` and its template values, or None."""
    resolve = _resolver_for(request)
    for rule in request_rules():
        kwargs = rule.kwargs_for(request, resolve)
        if kwargs is not None:
            return rule.spec, kwargs
    return None
