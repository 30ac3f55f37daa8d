"""The I/O of a request's hold (:mod:`.holding`): blocking calls for sync views, asyncio calls
for async ones, behind one Protocol, so the hold itself is written once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.template.response import SimpleTemplateResponse

from ..locking import ordering
from ..locking.registry import locks
from . import commits, frameworks, records
from .rules import LockSpec

if TYPE_CHECKING:
    from ..locking.manager import Lease

#: a request's semaphores: each filled name -> (its template, permits)
Limits = dict[str, tuple[str, int]]


class HoldIO(Protocol):
    """The calls the hold awaits; the only part that differs between sync and async views."""

    async def user(self, spec: LockSpec, request: HttpRequest) -> Any: ...

    async def acquire(self, spec: LockSpec, name: str) -> Lease: ...

    async def acquire_limits(self, spec: LockSpec, limits: Limits) -> list[Lease]: ...

    async def release(self, lease: Lease) -> None: ...

    async def read(self, lease: Lease) -> records.Record | None: ...

    async def store(self, lease: Lease, values: list[bytes | str], ttl: float) -> int: ...

    async def render(self, response: SimpleTemplateResponse) -> None: ...

    async def watch(self, watch: commits.CommitWatch) -> None: ...

    async def unwatch(self, watch: commits.CommitWatch) -> None: ...


def checked_principal(spec: LockSpec, request: Any, who: Any) -> Any:
    """``who`` (the request's principal), unless it is nobody while the request carries
    credentials nothing has resolved yet: the lock runs before the API framework authenticates
    (the decorator above ``@api_view``, a rule in front of a DRF or django-ninja view), and
    scoping it to nobody would share one key space among every client. Then
    ``ImproperlyConfigured``: a 500, and the view does not run."""
    if frameworks.principal_id(who) == "":
        found = frameworks.unresolved_credentials(request)
        if found:
            raise ImproperlyConfigured(
                f"{spec.key.where}: the lock runs before anything authenticated the request "
                f"({'; '.join(found)}): request.user is anonymous, so its "
                f"{'idempotency key' if spec.idempotency else 'lock key'} would be shared with "
                "every other client. Put @request_lock under @api_view (or on the APIView/"
                "ViewSet method), or right under a django-ninja operation's decorator with "
                "auth=; a REDLOCK_REQUEST_LOCKS rule cannot see that user (django_redlock.E031). "
                "A view with no authentication of its own should not receive credentials "
                "(strip them at the proxy). See docs/api-frameworks.md."
            )
    return who


def _request_user(spec: LockSpec, request: HttpRequest) -> Any:
    if frameworks.resolved_by_framework(request):
        return frameworks.principal(request)
    if not hasattr(request, "user"):
        raise ImproperlyConfigured(
            f"{spec.key.where}: lock key template {spec.key.template!r} uses {{user}}, but the "
            "request has no user. Add django.contrib.auth.middleware.AuthenticationMiddleware "
            "before RequestLockMiddleware in MIDDLEWARE (see django_redlock.E017)."
        )
    return request.user


def _evaluated(user: Any) -> Any:
    """Force a lazy ``request.user`` in a worker thread (Django < 5.0 has no ``auser``)."""
    getattr(user, "pk", None)
    return user


def _permits(spec: LockSpec, limits: Limits) -> dict[str, int]:
    """Each semaphore's permits; with the lock-order checker on, each name's shape is its
    template (``api:tenant:{tenant}``), as the key's is, not one shape per filled value."""
    if locks[spec.using].check_order:
        ordering.expect_all({name: template for name, (template, _) in limits.items()})
    return {name: permits for name, (_, permits) in limits.items()}


class BlockingIO:
    """Blocking calls: every await of the hold returns without suspending."""

    async def user(self, spec: LockSpec, request: HttpRequest) -> Any:
        return checked_principal(spec, request, _request_user(spec, request))

    async def acquire(self, spec: LockSpec, name: str) -> Lease:
        manager = locks[spec.using]
        if manager.check_order:  # the lock-order checker's shape: the key template
            ordering.expect(name, spec.key.template)
        return manager.acquire(name, ttl=spec.ttl, timeout=spec.timeout, permits=spec.limit)

    async def acquire_limits(self, spec: LockSpec, limits: Limits) -> list[Lease]:
        # one attempt: it never waits for permits while it holds the key's lease
        held = locks[spec.using].acquire_limits(_permits(spec, limits), ttl=spec.ttl, timeout=0)
        return list(held.leases.values())

    async def release(self, lease: Lease) -> None:
        lease.release()

    async def read(self, lease: Lease) -> records.Record | None:
        return records.read(lease)

    async def store(self, lease: Lease, values: list[bytes | str], ttl: float) -> int:
        return records.store(lease, values, ttl)

    async def render(self, response: SimpleTemplateResponse) -> None:
        response.render()

    async def watch(self, watch: commits.CommitWatch) -> None:
        watch.install()

    async def unwatch(self, watch: commits.CommitWatch) -> None:
        watch.remove()


class AsyncIO:
    """asyncio calls; the user is loaded without a sync DB query in the event loop."""

    async def user(self, spec: LockSpec, request: HttpRequest) -> Any:
        if frameworks.is_drf_request(request):  # DRF's user property may query the database
            who = await sync_to_async(_request_user)(spec, request)
        elif frameworks.ninja_authenticated(request):
            who = frameworks.principal(request)
        elif (auser := getattr(request, "auser", None)) is not None:  # Django >= 5.0
            who = await auser()
        else:
            who = await sync_to_async(_evaluated)(_request_user(spec, request))
        return checked_principal(spec, request, who)

    async def acquire(self, spec: LockSpec, name: str) -> Lease:
        manager = locks[spec.using]
        if manager.check_order:  # the lock-order checker's shape: the key template
            ordering.expect(name, spec.key.template)
        return await manager.aacquire(name, ttl=spec.ttl, timeout=spec.timeout, permits=spec.limit)

    async def acquire_limits(self, spec: LockSpec, limits: Limits) -> list[Lease]:
        permits = _permits(spec, limits)
        held = await locks[spec.using].aacquire_limits(permits, ttl=spec.ttl, timeout=0)
        return list(held.leases.values())

    async def release(self, lease: Lease) -> None:
        await lease.arelease()

    async def read(self, lease: Lease) -> records.Record | None:
        return await records.aread(lease)

    async def store(self, lease: Lease, values: list[bytes | str], ttl: float) -> int:
        return await records.astore(lease, values, ttl)

    async def render(self, response: SimpleTemplateResponse) -> None:
        await sync_to_async(response.render)()  # templates may query the database

    # in the thread that runs the request's sync code (the view, under ATOMIC_REQUESTS)
    async def watch(self, watch: commits.CommitWatch) -> None:
        await sync_to_async(watch.install)()

    async def unwatch(self, watch: commits.CommitWatch) -> None:
        await sync_to_async(watch.remove)()


BLOCKING = BlockingIO()
ASYNC = AsyncIO()
