"""``@request_lock``: hold a distributed lock while one view runs (sync or async views)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

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
    docs/effects.md).
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
        # Two wrappers so an async view stays a coroutine function; both only hand the view on.
        @functools.wraps(view)
        def sync_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return hold_for_request(spec, request, kwargs, lambda: view(request, *args, **kwargs))

        @functools.wraps(view)
        async def async_wrapper(
            request: HttpRequest, *args: Any, **kwargs: Any
        ) -> HttpResponseBase:
            return await ahold_for_request(
                spec, request, kwargs, lambda: view(request, *args, **kwargs)
            )

        wrapper = async_wrapper if iscoroutinefunction(view) else sync_wrapper
        setattr(wrapper, SPECS_ATTR, (*view_specs(view), spec))
        return cast(V, wrapper)

    return decorator
