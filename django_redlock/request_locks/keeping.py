"""An idempotent request's record: answering from it (replay, 409, 422) and keeping the
response of a request that ran (at once, or after its transaction commits)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from django.db import transaction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from ..conf import IdempotencyConfig
from ..engine import quorum
from ..exceptions import NodesUnavailable
from ..locking.transactions import in_transaction
from . import idempotency, records
from .responses import lock_error_response

if TYPE_CHECKING:
    from ..locking.manager import Lease

# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")

Read = Callable[["Lease"], Awaitable[records.Record | None]]
Store = Callable[["Lease", list[bytes | str], float], Awaitable[int]]


async def earlier_answer(
    read: Read, lease: Lease, request: HttpRequest, fingerprint: str, config: IdempotencyConfig
) -> HttpResponseBase | None:
    """The answer from the key's kept record (replay, 409, 422), 503 when too few nodes
    answered the read, or None: no record, the request runs."""
    try:
        record = await read(lease)
    except NodesUnavailable as exc:
        return lock_error_response(request, exc)
    if record is None:
        return None
    return idempotency.answer(request, record, fingerprint, config.header)


async def keep(
    store: Store,
    lease: Lease,
    response: HttpResponseBase,
    fingerprint: str,
    config: IdempotencyConfig,
) -> None:
    """Keep ``response`` (nothing for a 5xx or a lock's own 409/503). Inside a transaction
    the lease is released after the commit, and the response is kept then too (just before
    that release): a rollback keeps nothing, so a retry runs again. A failure to keep is
    logged; the response is sent either way."""
    if getattr(response, "redlock_lock_error", False):
        return  # the plain lock was busy (or a view's lock error): the request did not run
    values = idempotency.kept_values(response, fingerprint, config.max_bytes)
    if values is None:
        return
    if in_transaction():  # whatever until_commit says: that option is the plain lock's
        transaction.on_commit(functools.partial(_store_at_commit, lease, values, config.ttl))
        return
    try:
        stored = await store(lease, values, config.ttl)
    except Exception:
        logger.warning("Could not keep the response of %r", lease.name, exc_info=True)
        return
    _log_unkept(lease, stored)


def _store_at_commit(lease: Lease, values: list[bytes | str], ttl: float) -> None:
    """Keep a response from an on-commit hook (sync, under ASGI too)."""
    try:
        stored = records.store(lease, values, ttl)
    except Exception:
        logger.warning("Could not keep the response of %r", lease.name, exc_info=True)
        return
    _log_unkept(lease, stored)


def _log_unkept(lease: Lease, stored: int) -> None:
    """Warn when the response was kept nowhere, or on fewer nodes than a quorum (a replay,
    which reads a quorum, may then miss it)."""
    needed = quorum(records.node_count(lease))
    if stored == 0:
        logger.warning(
            "The response of %r was not kept on any node: its lease was lost or overtaken "
            "first, or the nodes failed the write (see the node errors logged with it); a "
            "retry runs the request again.",
            lease.name,
        )
    elif stored < needed:
        logger.warning(
            "The response of %r was kept on %d node(s), fewer than a quorum (%d): a retry may "
            "not find it and run the request again.",
            lease.name,
            stored,
            needed,
        )
