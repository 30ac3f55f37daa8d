"""Holding one lease around one request, for sync and async views alike.

While the view runs, ``request.lease`` is the lease and it is the innermost active lease
(``django_redlock.locking.context``), so FencedModel saves use its token. The lease is released
once the
response is built, when the view raises, or, for a streaming response, when the stream is closed.

The hold is written once, as the coroutine :func:`_hold` over three I/O calls (load the user,
acquire, release) and the view. :func:`ahold_for_request` awaits it with asyncio I/O;
:func:`hold_for_request` gives it blocking I/O, whose awaits never suspend, so a single
``send`` runs it to the end. The two paths differ only in those calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.template.response import SimpleTemplateResponse

from ..exceptions import LockNotAcquired, NodesUnavailable
from ..locking import context
from ..locking.transactions import in_transaction, release_after_commit
from . import commits, frameworks, idempotency, keeping, outcome
from .hold_io import ASYNC, BLOCKING, HoldIO, checked_principal
from .responses import lock_error_response
from .rules import LockSpec

if TYPE_CHECKING:
    from ..locking.manager import Lease

# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")

AcquireErrors = (LockNotAcquired, NodesUnavailable)
"""Acquisition errors answered with a 409/503 response; the view does not run."""

T = TypeVar("T")
_HELD_ATTR = "_redlock_request_leases"
_MISSING = object()


# -- the hold, written once (its I/O: .hold_io) ---------------------------------------------------
async def _hold(
    spec: LockSpec,
    request: HttpRequest,
    kwargs: Mapping[str, Any],
    call: Callable[[], Awaitable[HttpResponseBase]],
    io: HoldIO,
) -> HttpResponseBase:
    """Run ``call`` holding the lock (or one of ``spec.limit`` permits) for this request, or
    answer 409/429/503 without running it."""
    if spec.idempotency:
        return await _hold_once(spec, request, kwargs, call, io)
    user = await io.user(spec, request) if spec.uses_user else None
    name = spec.key.fill(kwargs, user)
    key = (spec.using, name)
    kind = "" if spec.limit is None else "permit"
    plain = frameworks.django_request(request)
    if key in plain.__dict__.get(_HELD_ATTR, {}) or context.find(*key, kind) is not None:
        return await call()  # re-entered: a rule and a decorator on one lock, or an outer lease
    # filled before anything is taken: a template that fails leaves nothing held
    filled = {template.fill(kwargs, user): (template.template, n) for template, n in spec.limits}
    try:
        lease = await io.acquire(spec, name)
    except AcquireErrors as exc:
        return lock_error_response(request, exc, limited=spec.limit is not None)
    held = [lease]
    if filled:  # taken before the key's lease is attached: that one guards the writes
        try:
            held += await io.acquire_limits(spec, filled)
        except AcquireErrors as exc:
            await _release(io, lease, spec)
            return lock_error_response(request, exc, limited=True)
    try:
        with _attached(plain, lease, key):
            response = await call()
    except BaseException:
        for each in held:
            await _release(io, each, spec)
        raise
    for each in held:
        await _let_go(io, each, spec, response)
    return response


async def _hold_once(
    spec: LockSpec,
    request: HttpRequest,
    kwargs: Mapping[str, Any],
    call: Callable[[], Awaitable[HttpResponseBase]],
    io: HoldIO,
) -> HttpResponseBase:
    """An idempotent request (see :mod:`.idempotency`): with the header, hold the lock of the
    key, answer from its kept record or run ``call`` under the plain lock too and keep the
    response; without it, the plain lock alone (as before)."""
    config = idempotency.config()
    plain = frameworks.django_request(request)
    try:
        value = idempotency.key_of(plain, config.header)
    except idempotency.BadKey as exc:
        return exc.response(plain)
    if value is None:
        return await _hold(spec.plain, request, kwargs, call, io)
    if (
        spec.key.uses_user
        or frameworks.resolved_by_framework(request)
        or idempotency.has_user(plain)
    ):
        user = await io.user(spec, request)
    else:  # no authentication at all: anonymous, unless it carries credentials (fail closed)
        user = checked_principal(spec, request, None)
    name = idempotency.lock_name(spec.key.fill(kwargs, user), value, user)
    key = (spec.using, name)
    if key in plain.__dict__.get(_HELD_ATTR, {}):  # a rule and a decorator, both idempotent
        return await _hold(spec.plain, request, kwargs, call, io)
    try:
        lease = await io.acquire(spec, name)
    except AcquireErrors as exc:  # a duplicate still running: 409
        return lock_error_response(request, exc)
    keyed = spec.keyed  # released after the commit, when in a transaction
    watch: commits.CommitWatch | None = None
    try:
        fingerprint = idempotency.fingerprint(plain, user)
        earlier = await keeping.earlier_answer(io.read, lease, plain, fingerprint, config)
        if earlier is None:
            with _attached(plain, lease, key):
                # the plain lock too: requests with other keys still wait for this one
                watch = await _watching(io)
                try:
                    response = await _hold(spec.plain, request, kwargs, call, io)
                finally:
                    if watch is not None:
                        await io.unwatch(watch)
    except BaseException:
        await _release(io, lease, keyed)
        raise
    if earlier is not None:
        await _release(io, lease, keyed)
        return earlier
    rolled_back = watch is not None and watch.rolled_back and not in_transaction()
    if rolled_back or outcome.not_the_views(plain):
        # a rule's view that raised, did not run (a middleware answered) or was rolled back by
        # its ATOMIC_REQUESTS transaction: not the request's answer, nothing to keep
        await _let_go(io, lease, keyed, response)
        return response
    try:
        response = frameworks.finalized(request, response)  # a DRF Response: renderable now
        if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
            await io.render(response)  # kept as sent: render it now, not after the hold
        await keeping.keep(io.store, lease, response, fingerprint, config)
    except BaseException:  # nothing kept: a retry runs at once, not after the lease's TTL
        await _release(io, lease, keyed)
        raise
    await _let_go(io, lease, keyed, response)
    return response


async def _watching(io: HoldIO) -> commits.CommitWatch | None:
    """Watch whether the view's ``ATOMIC_REQUESTS`` transaction commits, when one is on."""
    aliases = commits.atomic_aliases()
    if not aliases:
        return None
    watch = commits.CommitWatch(aliases)
    await io.watch(watch)
    return watch


async def _let_go(io: HoldIO, lease: Lease, spec: LockSpec, response: HttpResponseBase) -> None:
    """Release ``lease`` now, or once a streaming response is closed."""
    if response.streaming:
        # Django calls these from HttpResponseBase.close(), which every server calls once the
        # stream is sent or abandoned (WSGI and ASGI alike); request_finished follows.
        closers: list[Callable[[], None]] = response._resource_closers  # type: ignore[attr-defined]
        closers.append(functools.partial(_release_at_close, lease))
    else:
        await _release(io, lease, spec)


@contextlib.contextmanager
def _attached(request: HttpRequest, lease: Lease, key: tuple[str, str]) -> Iterator[None]:
    """Within the block, ``request.lease`` is ``lease`` and it is the innermost active lease."""
    previous = request.__dict__.get("lease", _MISSING)
    held: dict[tuple[str, str], Lease] = request.__dict__.setdefault(_HELD_ATTR, {})
    held[key] = lease
    request.lease = lease  # type: ignore[attr-defined]
    token = context.push(lease)
    lease.block_opened()  # a lock block re-entering it inside the view does not release it
    try:
        yield
    finally:
        lease.block_closed()
        context.pop(token)
        held.pop(key, None)
        if previous is _MISSING:
            request.__dict__.pop("lease", None)
        else:
            request.lease = previous  # type: ignore[attr-defined]


@contextlib.contextmanager
def _release_failure_logged(lease: Lease) -> Iterator[None]:
    """Log a failed release: the lease then runs out on its TTL, and the response stands."""
    try:
        yield
    except Exception:
        logger.warning("Could not release request lock %r", lease.name, exc_info=True)


async def _release(io: HoldIO, lease: Lease, spec: LockSpec) -> None:
    """Release now, or after the commit when the view ran in a transaction (docs/production.md:
    under
    ``ATOMIC_REQUESTS`` Django wraps a decorated view in ``atomic()``)."""
    if spec.until_commit and in_transaction():
        context.deactivate(lease)
        release_after_commit(lease, None)
        return
    with _release_failure_logged(lease):
        await io.release(lease)


def _release_at_close(lease: Lease) -> None:
    """Release from a streaming response's ``close()``, which is sync under ASGI too."""
    with _release_failure_logged(lease):
        lease.release()


def _run_to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (it awaits only blocking I/O) in this thread."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise RuntimeError("a blocking request-lock hold suspended")


def hold_for_request(
    spec: LockSpec,
    request: HttpRequest,
    kwargs: Mapping[str, Any],
    call: Callable[[], HttpResponseBase],
) -> HttpResponseBase:
    """Run the sync ``call`` holding the lock for this request, or answer 409/503 without it."""

    async def view() -> HttpResponseBase:
        return call()

    return _run_to_end(_hold(spec, request, kwargs, view, BLOCKING))


async def ahold_for_request(
    spec: LockSpec,
    request: HttpRequest,
    kwargs: Mapping[str, Any],
    call: Callable[[], Awaitable[HttpResponseBase]],
) -> HttpResponseBase:
    """:func:`hold_for_request` for an async ``call``. An idempotent request (it carries the
    key's header) is shielded from cancellation (a client that disconnects: Django's ASGI
    handler cancels the view): once it holds its key it runs to the end, and its response is
    kept for the retry, which never runs the view a second time."""
    hold = _hold(spec, request, kwargs, call, ASYNC)
    if not (spec.idempotency and _carries_key(request)):
        return await hold
    task = asyncio.ensure_future(hold)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():  # runs on: keep it referenced, and report what it raises
            _LEFT_BEHIND.add(task)
            task.add_done_callback(_left_behind_done)
        raise


#: Idempotent holds running on after their caller was cancelled (kept referenced till done).
_LEFT_BEHIND: set[asyncio.Future[HttpResponseBase]] = set()


def _left_behind_done(task: asyncio.Future[HttpResponseBase]) -> None:
    _LEFT_BEHIND.discard(task)
    error = None if task.cancelled() else task.exception()
    if error is not None:  # nobody else will see it: its client has gone
        logger.error("An idempotent request failed after its client left", exc_info=error)


def _carries_key(request: Any) -> bool:
    try:
        header = idempotency.config().header
    except ImproperlyConfigured:  # answered by the hold itself
        return False
    return frameworks.django_request(request).headers.get(header) is not None
