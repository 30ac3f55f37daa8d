"""System checks for per-request locks (``REDLOCK_REQUEST_LOCKS``, ``@request_lock`` views).

Every id is listed in ``docs/middleware.md``. The settings are validated by
``django_redlock.conf`` and ``rules``; this module attaches ids to their errors. The URLconf is
walked once per check run, so a key template field that a URL does not provide is reported at
startup instead of on a request. Registered by the app (no ``@register`` here).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.urls import URLPattern, URLResolver, get_resolver

from ..conf import busy_status_setting, idempotency_setting, redlock_settings
from . import frameworks
from .rules import SETTING, LockRule, LockSpec, read_rules, view_specs

CHECK_IDS = {
    "E010": "A REDLOCK_REQUEST_LOCKS entry is malformed (not a dict, unknown key, bad type).",
    "E011": "A lock KEY template is not a valid template (or starts with the reserved '__').",
    "E012": "A rule's PATH is not a valid regular expression.",
    "E013": "A rule's URL_NAME matches no URL pattern.",
    "E014": "A KEY template field is not provided by the URL (kwargs, regex groups, user).",
    "E015": "A rule or @request_lock view uses an alias that is not in REDLOCK.",
    "E016": "REDLOCK_BUSY_STATUS is not an int from 400 to 599.",
    "E017": "A KEY uses {user}, or an IDEMPOTENCY rule runs, but AuthenticationMiddleware does "
    "not run before it.",
    "E018": "A rule's LIMIT is not an int from 1 to 1024, or its LIMITS not a dict of such.",
    "E019": "A lock and a LIMIT (or two different LIMITs) share a key template and alias.",
    "E031": "An IDEMPOTENCY rule, or a rule whose KEY uses {user}, names a URL whose view "
    "authenticates inside (Django REST framework, django-ninja auth=).",
    "E032": "@request_lock with idempotency=True or a {user} key wraps a DRF or django-ninja "
    "view from outside, before the framework authenticates.",
    "E030": "REDLOCK_IDEMPOTENCY is invalid (not a dict, unknown key, bad HEADER, TTL or "
    "MAX_BYTES).",
    "W010": "REDLOCK_REQUEST_LOCKS has rules but RequestLockMiddleware is not in MIDDLEWARE.",
}
MIDDLEWARE_PATH = "django_redlock.middleware.RequestLockMiddleware"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"
DOCS_HINT = "See docs/middleware.md."


def _error(message: str, check_id: str, hint: str = DOCS_HINT) -> checks.CheckMessage:
    return checks.Error(message, hint=hint, id=f"django_redlock.{check_id}")


def iter_url_patterns(
    patterns: Sequence[Any],
    inherited: frozenset[str] = frozenset(),
    namespaces: tuple[str, ...] = (),
) -> Iterator[tuple[URLPattern, frozenset[str], str | None]]:
    """Every URL pattern with the keyword arguments it passes and its namespaced view name."""
    for entry in patterns:
        names = inherited | frozenset(entry.pattern.regex.groupindex)
        if isinstance(entry, URLResolver):
            names |= frozenset(entry.default_kwargs)
            spaces = (*namespaces, entry.namespace) if entry.namespace else namespaces
            yield from iter_url_patterns(entry.url_patterns, names, spaces)
        elif isinstance(entry, URLPattern):
            names |= frozenset(entry.default_args)
            view_name = ":".join((*namespaces, entry.name)) if entry.name else None
            yield entry, names, view_name


def _url_patterns() -> list[tuple[URLPattern, frozenset[str], str | None]]:
    try:
        return list(iter_url_patterns(get_resolver().url_patterns))
    except Exception:  # Django's own URL checks report a broken URLconf
        return []


def _alias_exists(alias: str) -> bool:
    try:
        return alias in redlock_settings()
    except ImproperlyConfigured:  # reported as django_redlock.E001
        return True


def _auth_before(position: int | None) -> bool:
    middleware = list(settings.MIDDLEWARE)
    if AUTH_MIDDLEWARE not in middleware:
        return False
    return position is None or middleware.index(AUTH_MIDDLEWARE) < position


def _spec_messages(spec: LockSpec, where: str, middleware_position: int | None) -> list[Any]:
    messages: list[checks.CheckMessage] = []
    if not _alias_exists(spec.using):
        messages.append(
            _error(f"{where} uses REDLOCK alias {spec.using!r}, which is not configured.", "E015")
        )
    if spec.key.uses_user and not _auth_before(middleware_position):
        messages.append(
            _error(
                f"{where}: key {spec.key.template!r} uses {{user}}, but {AUTH_MIDDLEWARE} "
                "does not run before it.",
                "E017",
                hint=f"Add {AUTH_MIDDLEWARE} to MIDDLEWARE, before {MIDDLEWARE_PATH}.",
            )
        )
    return messages


def _idempotency_before_auth(spec: LockSpec, where: str, position: int | None) -> list[Any]:
    """E017 for an IDEMPOTENCY rule whose middleware runs before AuthenticationMiddleware: the
    request has no user yet, so every user would share one key space (and get each other's
    kept responses). A decorated view (``position`` None) runs after every middleware."""
    middleware = list(settings.MIDDLEWARE)
    if not spec.idempotency or position is None or AUTH_MIDDLEWARE not in middleware:
        return []
    if middleware.index(AUTH_MIDDLEWARE) < position:
        return []
    return [
        _error(
            f"{where}: IDEMPOTENCY scopes keys by user, but {MIDDLEWARE_PATH} runs before "
            f"{AUTH_MIDDLEWARE}: the request has no user yet, so one user's key would replay "
            "another user's response (such requests are refused with ImproperlyConfigured).",
            "E017",
            hint=f"Move {MIDDLEWARE_PATH} after {AUTH_MIDDLEWARE} in MIDDLEWARE.",
        )
    ]


def _missing_fields(spec: LockSpec, where: str, url: str, provided: frozenset[str]) -> list[Any]:
    """E014 for the key template and each ``LIMITS`` name template."""
    templates = [("key", spec.key), *(("limits name", template) for template, _ in spec.limits)]
    messages = []
    for what, template in templates:
        missing = template.missing(provided)
        if missing:
            messages.append(
                _error(
                    f"{where}: {what} {template.template!r} needs {', '.join(missing)}, but "
                    f"URL {url!r} passes only {sorted(provided) or 'no keyword arguments'}.",
                    "E014",
                    hint="Name the template fields after the URL's converters (or use {user...}).",
                )
            )
    return messages


def _needs_principal(spec: LockSpec) -> bool:
    return spec.idempotency or spec.key.uses_user


def _before_framework_auth(spec: LockSpec, where: str, view: Any, check_id: str) -> list[Any]:
    """E031 (a rule) / E032 (a decorator outside the framework's view) where a lock scoped to
    the user runs before an API framework authenticates ``view``: it would see nobody, and
    requests with credentials are refused at run time."""
    framework = frameworks.authenticates_inside(view)
    if framework is None or not _needs_principal(spec):
        return []
    what = "IDEMPOTENCY" if spec.idempotency else f"key {spec.key.template!r} ({{user}})"
    return [
        _error(
            f"{where}: {what} is scoped to the user, but it runs before {framework} "
            f"authenticates the view {frameworks.view_label(view)!r}, so it sees no "
            "user; requests that carry credentials are refused (HTTP 500).",
            check_id,
            hint="Put @request_lock under @api_view (or on the APIView/ViewSet method), or right "
            "under a django-ninja operation's decorator. See docs/api-frameworks.md.",
        )
    ]


def _rule_messages(rule: LockRule, patterns: list[Any], position: int | None) -> list[Any]:
    where = f"{SETTING}[{rule.index}]"
    messages = _spec_messages(rule.spec, where, position)
    messages += _idempotency_before_auth(rule.spec, where, position)
    if rule.path is not None:
        messages += _missing_fields(
            rule.spec, where, rule.path.pattern, frozenset(rule.path.groupindex)
        )
        return messages
    matching = [(p, names) for p, names, view_name in patterns if view_name == rule.url_name]
    if not matching:
        messages.append(
            _error(f"{where}: URL_NAME {rule.url_name!r} matches no URL pattern.", "E013")
        )
    for pattern, names in matching:
        messages += _missing_fields(rule.spec, where, str(pattern.pattern), names)
        messages += _before_framework_auth(rule.spec, where, pattern.callback, "E031")
    return messages


def check_request_locks(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Validate ``REDLOCK_REQUEST_LOCKS``, ``REDLOCK_BUSY_STATUS``, ``REDLOCK_IDEMPOTENCY`` and
    ``@request_lock`` views."""
    messages: list[checks.CheckMessage] = []
    try:
        busy_status_setting()
    except ImproperlyConfigured as exc:
        messages.append(_error(str(exc), "E016"))
    try:
        idempotency_setting()
    except ImproperlyConfigured as exc:
        messages.append(_error(str(exc), "E030", hint="See docs/effects.md."))
    rules, errors = read_rules()
    messages += [_error(str(exc), exc.check_id) for exc in errors]
    middleware = list(settings.MIDDLEWARE)
    position = middleware.index(MIDDLEWARE_PATH) if MIDDLEWARE_PATH in middleware else None
    if rules and position is None:
        messages.append(
            checks.Warning(
                f"{SETTING} has rules, but {MIDDLEWARE_PATH} is not in MIDDLEWARE: they do "
                "nothing.",
                hint=f"Add {MIDDLEWARE_PATH} to MIDDLEWARE, after {AUTH_MIDDLEWARE}.",
                id="django_redlock.W010",
            )
        )
    patterns = _url_patterns()
    sites = [(f"{SETTING}[{rule.index}]", rule.spec) for rule in rules]
    for rule in rules:
        messages += _rule_messages(rule, patterns, position)
    decorated: dict[int, None] = {}  # a view reachable by several URLs is one site
    for pattern, names, view_name in patterns:
        label = view_name or frameworks.view_label(pattern.callback)
        for spec in view_specs(pattern.callback):
            where = f"@request_lock({spec.key.template!r}) on view {label!r}"
            messages += _spec_messages(spec, where, None)
            messages += _missing_fields(spec, where, str(pattern.pattern), names)
            messages += _before_framework_auth(spec, where, pattern.callback, "E032")
            if id(spec) not in decorated:
                decorated[id(spec)] = None
                sites.append((where, spec))
        for inner, extra in frameworks.inner_views(pattern.callback):
            for spec in view_specs(inner):
                if id(spec) in decorated:
                    continue
                where = f"@request_lock({spec.key.template!r}) in view {label!r}"
                messages += _spec_messages(spec, where, None)
                messages += _missing_fields(spec, where, str(pattern.pattern), names | extra)
                decorated[id(spec)] = None
                sites.append((where, spec))
        for operation in frameworks.ninja_operations(pattern.callback):
            # decorate_view(request_lock(...)) wraps the operation's run(), auth and all
            for spec in view_specs(operation.run):
                where = f"@request_lock({spec.key.template!r}) on operation {label!r}"
                if _ninja_auth(operation):
                    messages += _before_framework_auth(spec, where, pattern.callback, "E032")
    return messages + _kind_clashes(sites)


def _ninja_auth(operation: Any) -> bool:
    return bool(getattr(operation, "auth_callbacks", ()))


def _kind_clashes(sites: list[tuple[str, LockSpec]]) -> list[checks.CheckMessage]:
    """E019: rules and decorated views whose name templates have one shape (see
    ``KeyTemplate.shape``) on one alias, some taking a lock and some a LIMIT (a ``KEY`` with
    ``LIMIT``, or a ``LIMITS`` name), or LIMITs of different sizes. The names they fill are
    shared, and the engine refuses a name in use as another kind (or with other permits), so
    whichever request comes second would fail with HTTP 500."""
    groups: dict[tuple[str, str], list[tuple[str, str, int | None]]] = {}
    for where, spec in sites:
        uses = [(spec.key.template, spec.key.shape, spec.limit)]
        uses += [(template.template, template.shape, n) for template, n in spec.limits]
        for text, shape, limit in uses:
            groups.setdefault((spec.using, shape), []).append((where, text, limit))
    messages: list[checks.CheckMessage] = []
    for (using, shape), members in groups.items():
        if len({limit for _, _, limit in members}) < 2:
            continue
        described = "; ".join(
            f"{where}: {'a lock' if limit is None else f'LIMIT {limit}'} on {text!r}"
            for where, text, limit in members
        )
        messages.append(
            _error(
                f"Request locks on alias {using!r} share the key template {shape!r} as "
                f"different kinds ({described}): a request would get HTTP 500 (the name is in "
                "use as another kind) whenever the other one holds the same name.",
                "E019",
                hint="Give the lock and the LIMIT different key texts (e.g. 'order:{order_id}' "
                "and 'order-limit:{order_id}'), or the same LIMIT everywhere.",
            )
        )
    return messages
