"""``@request_lock``: hold a distributed lock while one view runs (sync or async views)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from .request_locks.frameworks import ninja_response
from .request_locks.holding import ahold_for_request, hold_for_request
from .request_locks.rules import SPECS_ATTR, LockSpec, view_specs

__all__ = ["SPECS_ATTR", "request_lock"]

V = TypeVar("V", bound=Callable[..., Any])


def request_lock(
    key: str,
    using: str = "default",
    ttl: float | None = None,
    timeout: float | None = 0,
    *,
    until_commit: bool = True,
    limit: int | None = None,
    idempotency: bool = False,
    limits: dict[str, int] | None = None,
) -> Callable[[V], V]:
    """Hold the lock ``key`` (filled from URL kwargs and ``user``) while the view runs.

    ``@request_lock("order:{order_id}")`` answers 409 (``REDLOCK_BUSY_STATUS``) with
    ``Retry-After`` when another request holds the lock, 503 when too few Redis nodes answer.
    ``request.lease`` is the lease while the view runs; FencedModel saves use its token. The lock
    is released once the response is built (a streaming response: once it is closed), also when
    the view raises. ``timeout`` is how long to wait for the lock (0: one attempt). Under
    ``ATOMIC_REQUESTS`` (or any open transaction) the release waits for the commit, unless
    ``until_commit=False``. ``limit=N`` takes one of N permits of ``key`` instead (at most N
    requests at once; over it the answer is 429 with ``Retry-After``). ``limits={template:
    permits}`` also takes a permit of each of these semaphores (names filled like the key), all
    or nothing, in one attempt once the key is held; one full: 429. ``idempotency=True``:
    a request with the ``REDLOCK_IDEMPOTENCY`` header (``Idempotency-Key``) runs under the
    lock ``key`` + the header's value, once: its response is kept and replayed to a retry
    (that lock, and keeping, wait for the commit whatever ``until_commit`` says;
    docs/effects.md). On Django REST framework views put it under ``@api_view`` or on the
    view's method; on a django-ninja operation right under its decorator: keys are then scoped
    to the user the framework authenticated (docs/api-frameworks.md).
    """
    spec = LockSpec.build(
        key,
        using,
        ttl,
        timeout,
        where=f"request_lock({key!r})",
        until_commit=until_commit,
        limit=limit,
        idempotency=idempotency,
        limits=limits,
    )

    def decorator(view: V) -> V:
        # Two wrappers so an async view stays a coroutine function; both hand the view on, the
        # request found (a method's first argument is its view instance) and a django-ninja
        # operation's data turned into its response.
        @functools.wraps(view)
        def sync_wrapper(*args: Any, **kwargs: Any) -> HttpResponseBase:
            request = _request_in(args, view)

            def call() -> HttpResponseBase:
                return ninja_response(sync_wrapper, request, view(*args, **kwargs), kwargs)

            return hold_for_request(spec, request, kwargs, call)

        @functools.wraps(view)
        async def async_wrapper(*args: Any, **kwargs: Any) -> HttpResponseBase:
            request = _request_in(args, view)

            async def call() -> HttpResponseBase:
                return ninja_response(async_wrapper, request, await view(*args, **kwargs), kwargs)

            return await ahold_for_request(spec, request, kwargs, call)

        wrapper = async_wrapper if iscoroutinefunction(view) else sync_wrapper
        setattr(wrapper, SPECS_ATTR, (*view_specs(view), spec))
        signature = _resolved_signature(view)
        if signature is not None:
            setattr(wrapper, "__signature__", signature)  # noqa: B010
        return cast(V, wrapper)

    return decorator


def _resolved_signature(view: Callable[..., Any]) -> inspect.Signature | None:
    """The view's signature with its annotations evaluated where the view was written, for
    frameworks that read the wrapper's (django-ninja reads a parameter's type from it, and
    would look a string annotation up in this module, ``from __future__ import annotations``);
    None where they cannot be evaluated."""
    try:
        hints = typing.get_type_hints(view)
        signature = inspect.signature(view)
    except Exception:  # an annotation that names something unknown: left as written
        return None
    parameters = [
        parameter.replace(annotation=hints.get(parameter.name, parameter.annotation))
        for parameter in signature.parameters.values()
    ]
    return signature.replace(
        parameters=parameters,
        return_annotation=hints.get("return", signature.return_annotation),
    )


def _request_in(args: tuple[Any, ...], view: Callable[..., Any]) -> HttpRequest:
    """The request among a view's positional arguments: the first, or the second of a method
    decorated directly (its first is the view instance: ``APIView``, ``ViewSet``, ``View``)."""
    for arg in args[:2]:
        if hasattr(arg, "META") and hasattr(arg, "method"):
            request: HttpRequest = arg
            return request
    raise TypeError(
        f"@request_lock on {getattr(view, '__qualname__', view)!r}: no request among its first "
        "two arguments (a view takes the request first, a view method right after self)."
    )
