"""What request locks need to know of the API frameworks that authenticate inside the view:
Django REST framework (DRF) and django-ninja. Both are optional; neither is imported unless the
project has it installed.

- :func:`django_request`: the Django ``HttpRequest`` behind a DRF ``Request``.
- :func:`principal`: who a request's idempotency key and ``{user}`` fields belong to: the user
  DRF authenticated, the value django-ninja's ``auth=`` returned, else ``request.user``.
- :func:`unresolved_credentials`: the credentials a request carries that nobody has resolved
  yet (a lock that runs before the framework's authentication must not scope by
  ``request.user`` then: see ``docs/api-frameworks.md``, "Fail closed").
- :func:`finalized`: a DRF ``Response`` made renderable before it is kept.
- :func:`ninja_response`: a django-ninja operation's return value turned into its response.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator
from typing import Any, cast

from django.http import HttpRequest
from django.http.response import HttpResponseBase

#: The header every HTTP authentication scheme uses (Basic, Bearer, Token, JWT, Api-Key).
AUTHORIZATION = "Authorization"
#: The attribute django-ninja sets on the request to what ``auth=`` returned.
NINJA_AUTH_ATTR = "auth"
#: The attribute django-ninja sets on a registered operation function.
NINJA_OPERATION_ATTR = "_ninja_operation"


def is_drf_request(request: Any) -> bool:
    """Whether ``request`` is a DRF ``Request`` (the decorator under ``@api_view``, or on an
    ``APIView``/``ViewSet`` method): DRF has authenticated it before the handler runs."""
    module = sys.modules.get("rest_framework.request")
    return module is not None and isinstance(request, module.Request)


def django_request(request: Any) -> HttpRequest:
    """The Django ``HttpRequest`` itself (behind a DRF ``Request``, its ``_request``)."""
    if is_drf_request(request):
        inner: HttpRequest = request._request
        return inner
    plain: HttpRequest = request
    return plain


def ninja_authenticated(request: Any) -> bool:
    """Whether django-ninja's ``auth=`` accepted this request (it sets ``request.auth``)."""
    return getattr(django_request(request), NINJA_AUTH_ATTR, None) is not None


def resolved_by_framework(request: Any) -> bool:
    """Whether a framework authenticated ``request`` before the lock runs: a DRF ``Request``,
    or a request django-ninja's ``auth=`` accepted."""
    return is_drf_request(request) or ninja_authenticated(request)


def principal(request: Any) -> Any:
    """Who the request's key belongs to: ``request.auth`` where django-ninja's ``auth=`` set it
    (the user, or whatever the auth callable returned), else ``request.user`` (DRF's
    authenticated user on a DRF ``Request``; Django's on a plain request)."""
    plain = django_request(request)
    auth = getattr(plain, NINJA_AUTH_ATTR, None)
    if auth is not None and not is_drf_request(request):
        return auth
    return request.user


def _user_model() -> type[Any] | None:
    try:
        from django.contrib.auth import get_user_model

        return get_user_model()
    except Exception:  # no auth app installed
        return None


def principal_id(who: Any) -> str:
    """The id a key and a fingerprint are scoped to: an authenticated user's pk (as before:
    kept records stay valid; also a user-like object without a model, such as simplejwt's
    ``TokenUser``, which stands for the user of that pk); for another principal (what a DRF
    authentication class put in ``request.user``, or django-ninja's ``auth=`` returned) a
    tagged id: ``auth:app.model:pk`` for a model instance that is not a user, so an API client
    of pk 1 never shares the key space of user 1, ``auth:str:...`` for a string or a number;
    ``''`` for nobody (anonymous). Anything else cannot be told apart reliably:
    ``ImproperlyConfigured``."""
    from django.core.exceptions import ImproperlyConfigured

    if who is None or who is False:
        return ""
    model = _user_model()
    meta = getattr(who, "_meta", None)
    is_user = model is not None and isinstance(who, model)
    if is_user or (meta is None and hasattr(who, "is_authenticated")):
        if not getattr(who, "is_authenticated", False):
            return ""
        return str(getattr(who, "pk", ""))
    if meta is not None and getattr(who, "pk", None) is not None:
        return f"auth:{meta.label_lower}:{who.pk}"
    if isinstance(who, str | int | bytes) and not isinstance(who, bool):
        text = who.decode("utf-8", "surrogateescape") if isinstance(who, bytes) else str(who)
        return f"auth:{type(who).__name__}:{text}"
    raise ImproperlyConfigured(
        f"An idempotent or per-user request lock cannot tell who made this request: the "
        f"request's principal (request.user, or django-ninja's request.auth) is a "
        f"{type(who).__name__}. Have the authentication return the user, or a model instance, "
        "a string or an int that identifies the caller; see docs/api-frameworks.md."
    )


def unresolved_credentials(request: Any) -> list[str]:
    """The credentials ``request`` carries that no middleware resolved into ``request.user``
    while nothing has authenticated it yet: an ``Authorization`` header, and the API-key
    header, cookie or query parameter a django-ninja operation of the matched URL names.
    Empty where a framework authenticated the request, or ``request.user`` is a signed-in
    user."""
    if resolved_by_framework(request):
        return []
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return []
    found = []
    if request.headers.get(AUTHORIZATION) is not None:
        found.append(f"it carries the {AUTHORIZATION} header")
    view = matched_view(request)
    for where, name in _ninja_key_params(view):
        source = {"header": request.headers, "cookie": request.COOKIES, "query": request.GET}
        if source[where].get(name) is not None:
            found.append(f"it carries the {name} {where}")
    framework = authenticates_inside(view, request.method)
    if framework is not None and not found:
        # its credentials may be anywhere (a custom header): the view authenticates inside,
        # after this lock, so nothing tells a client with credentials from one without
        found.append(f"{framework} authenticates this view inside it, after the lock")
    return found


def matched_view(request: Any) -> Any:
    """The view the request's URL resolves to: ``request.resolver_match``'s, or resolved here
    when the caller runs before Django resolved it (a middleware's ``__call__``)."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        from django.urls import Resolver404, resolve

        try:
            match = resolve(request.path_info)
        except Resolver404:
            return None
    return match.func


def _ninja_key_params(view: Any) -> Iterator[tuple[str, str]]:
    """(``header``/``cookie``/``query``, name) of each API key the view's django-ninja
    operations authenticate with."""
    for operation in ninja_operations(view):
        for callback in getattr(operation, "auth_callbacks", ()):
            where = _ninja_key_source(callback)
            if where is not None:
                yield where, str(callback.param_name)


def _ninja_key_source(callback: Any) -> str | None:
    module = sys.modules.get("ninja.security.apikey")
    if module is None:
        return None
    for kind, where in (("APIKeyHeader", "header"), ("APIKeyCookie", "cookie")):
        if isinstance(callback, getattr(module, kind)):
            return where
    return "query" if isinstance(callback, module.APIKeyQuery) else None


def ninja_operations(view: Any) -> list[Any]:
    """The django-ninja operations behind a URL's view (``[]`` for any other view)."""
    module = sys.modules.get("ninja.operation")
    if module is None or view is None:
        return []
    for cell in getattr(view, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, module.PathView):
            return list(value.operations)
    return []


def drf_view_class(view: Any) -> type[Any] | None:
    """The DRF ``APIView`` subclass behind a URL's view (``api_view``, ``as_view()``), or
    None."""
    module = sys.modules.get("rest_framework.views")
    cls = getattr(view, "cls", None)
    if module is None or not isinstance(cls, type) or not issubclass(cls, module.APIView):
        return None
    return cls


def view_label(view: Any) -> str:
    """A readable name for a URL's view: its DRF view class, else its own qualified name."""
    cls = drf_view_class(view)
    named = cls or view
    module = getattr(named, "__module__", None)
    # api_view names its class after the function (__name__ only)
    qualname = getattr(named, "__name__" if cls else "__qualname__", None) or repr(named)
    return f"{module}.{qualname}" if module else qualname


def authenticates_inside(view: Any, method: str | None = None) -> str | None:
    """What authenticates inside ``view`` (a URL's callback) other than Django's session, so
    that a middleware in front of it sees no user: ``"Django REST framework"``,
    ``"django-ninja"``, or None. ``method``: only the django-ninja operations of that HTTP
    method count."""
    cls = drf_view_class(view)
    if cls is not None:
        session = sys.modules["rest_framework.authentication"].SessionAuthentication
        classes = cls.authentication_classes
        if not all(isinstance(c, type) and issubclass(c, session) for c in classes):
            return "Django REST framework"
        return None
    ninja_session = getattr(sys.modules.get("ninja.security.session"), "SessionAuth", None)
    for operation in ninja_operations(view):
        if method is not None and method not in getattr(operation, "methods", (method,)):
            continue
        for callback in getattr(operation, "auth_callbacks", ()):
            if ninja_session is None or not isinstance(callback, ninja_session):
                return "django-ninja"
    return None


def finalized(request: Any, response: HttpResponseBase) -> HttpResponseBase:
    """A DRF ``Response`` returned by a handler, finalized by its view as DRF's dispatch
    would (renderer chosen, renderer context set), so it can be rendered and kept now;
    anything else unchanged."""
    if not is_drf_request(request) or getattr(response, "accepted_renderer", None) is not None:
        return response
    module = sys.modules.get("rest_framework.response")
    if module is None or not isinstance(response, module.Response):
        return response
    context = getattr(request, "parser_context", None) or {}
    view = context.get("view")
    if view is None:
        return cast(HttpResponseBase, response)
    args, kwargs = context.get("args", ()), context.get("kwargs", {})
    return cast(HttpResponseBase, view.finalize_response(request, response, *args, **kwargs))


def ninja_response(
    wrapper: Any, request: HttpRequest, result: Any, kwargs: dict[str, Any]
) -> HttpResponseBase:
    """A django-ninja operation's return value (data, a schema, ``(status, data)``) as the
    response the operation will send; a response passes through. ``wrapper``: the function
    registered as the operation (django-ninja marks it); ``kwargs``: what the operation was
    called with (a ``response: HttpResponse`` parameter's headers and cookies are kept)."""
    if isinstance(result, HttpResponseBase):
        return result
    operation = _ninja_operation_of(wrapper, request)
    if operation is None:
        hint = (
            " (on a django-ninja operation, put @request_lock right under its @api.post/"
            "@router.post decorator; see docs/api-frameworks.md)"
            if "ninja" in sys.modules
            else ""
        )
        raise TypeError(
            f"A view under @request_lock returned {type(result).__name__}, not an HttpResponse"
            f"{hint}: return a response, as any Django view must."
        )
    given = [value for value in kwargs.values() if isinstance(value, HttpResponseBase)]
    temporal = given[0] if given else operation.api.create_temporal_response(request)
    response = operation._result_to_response(request, result, temporal)
    return cast(HttpResponseBase, response)


def _ninja_operation_of(wrapper: Any, request: HttpRequest) -> Any:
    """The django-ninja operation serving ``request`` whose function is ``wrapper`` (the one
    mounted on the API: django-ninja mounts copies of a router's operations), or None."""
    match = getattr(request, "resolver_match", None)
    for operation in ninja_operations(getattr(match, "func", None)):
        if operation.view_func is wrapper and operation.api is not None:
            return operation
    operation = getattr(wrapper, NINJA_OPERATION_ATTR, None)
    return operation if getattr(operation, "api", None) is not None else None


def inner_views(view: Any) -> Iterator[tuple[Any, frozenset[str]]]:
    """The functions inside a URL's DRF or django-ninja view that may carry
    ``@request_lock`` (a DRF handler, an ``APIView``/``ViewSet`` method, a django-ninja
    operation), each with the keyword arguments it gets beyond the URL's (a django-ninja
    operation's own parameters)."""
    cls = drf_view_class(view)
    if cls is not None:
        actions = getattr(view, "actions", None) or {}
        names = set(actions.values()) or set(getattr(cls, "http_method_names", ()))
        for name in sorted(names):
            handler = getattr(cls, name, None)
            if not callable(handler):
                continue
            yield handler, frozenset()
            for cell in getattr(handler, "__closure__", None) or ():  # api_view's handler
                with contextlib.suppress(ValueError):
                    if callable(cell.cell_contents):
                        yield cell.cell_contents, frozenset()
    for operation in ninja_operations(view):
        function = getattr(operation, "view_func", None)
        if function is not None:
            try:
                params = frozenset(inspect.signature(function).parameters)
            except (TypeError, ValueError):
                params = frozenset()
            yield function, params
