"""One wrapper for what a lock decorator wraps: a function, a coroutine function, a generator
function or an async generator function, each call run inside a block entered for that call
(``lock``, ``alock``, ``limits``: :mod:`.block`, :mod:`.limits`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from . import context
from .entries import suspending

F = TypeVar("F", bound=Callable[..., Any])

#: Enters one call's block on the stack (with that call's arguments); False: the call is
#: skipped (it returns None, or yields nothing).
Enter = Callable[[contextlib.ExitStack[Any], tuple[Any, ...], dict[str, Any]], bool]
AEnter = Callable[
    [contextlib.AsyncExitStack[Any], tuple[Any, ...], dict[str, Any]], Awaitable[bool]
]


def wrap_held(
    func: F, entered: Enter, aentered: AEnter, sync_allowed: Callable[[], None] = lambda: None
) -> F:
    """``func`` wrapped so that each call runs inside its block: a generator's (sync or
    async) from its first iteration until it ends, raises or is closed (an abandoned one is
    closed, and so let go, when it is collected); between iterations its leases are not its
    caller's (:class:`.context.Suspensions`). ``sync_allowed`` raises for a block that must
    not be entered blocking (``alock()`` on a plain function)."""
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            async with contextlib.AsyncExitStack() as stack:
                if await aentered(stack, args, kwargs):
                    return await func(*args, **kwargs)
                return None

        return async_wrapper  # type: ignore[return-value]
    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def async_gen_wrapper(*args: Any, **kwargs: Any) -> Any:
            suspensions = context.Suspensions()  # before the block: its lease is the body's
            async with contextlib.AsyncExitStack() as stack:
                stack.callback(suspensions.end_visits)  # resumed by another task
                if not await aentered(stack, args, kwargs):
                    return
                body = await stack.enter_async_context(contextlib.aclosing(func(*args, **kwargs)))
                async for item in body:
                    suspensions.suspend()  # the caller's writes are the caller's
                    try:
                        yield item
                    finally:
                        suspensions.resume()

        return async_gen_wrapper  # type: ignore[return-value]
    sync_allowed()
    if inspect.isgeneratorfunction(func):

        @functools.wraps(func)
        def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
            suspensions = context.Suspensions()  # before the block: its lease is the body's
            with contextlib.ExitStack() as stack:
                if entered(stack, args, kwargs):
                    return (yield from suspending(func(*args, **kwargs), suspensions))
                return None

        return gen_wrapper  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            if entered(stack, args, kwargs):
                return func(*args, **kwargs)
            return None

    return wrapper  # type: ignore[return-value]
