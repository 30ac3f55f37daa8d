"""Releasing after the transaction commits (docs/production.md "Transactions").

A lock block, an ``@lock`` function or a request lock that ends inside ``transaction.atomic()``
on the default database must not release its lease yet: the next holder would read rows this
one wrote but has not committed. The release then runs from ``transaction.on_commit``, or at
once when the transaction (or the savepoint the block ended in) rolls back. Django has no
rollback hook; but a rollback discards the pending ``on_commit`` callback, and CPython frees
it at that moment, so a ``weakref.finalize`` on the callback runs the release right then.

Atomic blocks opened by Django's ``TestCase`` (they never commit) do not count, so users' own
tests see locks released where they would be without them.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import DEFAULT_DB_ALIAS, transaction

from . import collected

if TYPE_CHECKING:
    from .lease import Lease

# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")


def in_transaction(using: str = DEFAULT_DB_ALIAS) -> bool:
    """True inside an ``atomic()`` block that will commit (not only ``TestCase``'s own)."""
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        return False
    return any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


class _Release:
    """Releases a kept lease once: at the commit, at a rollback, or when a renewal finds its
    transaction over without either (whichever comes first)."""

    __slots__ = ("claimed", "lease")

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.claimed = False

    def claim(self) -> bool:
        """True for the first caller only (the commit hook, the finalizer or a renewal)."""
        with _CLAIMS:
            if self.claimed:
                return False
            self.claimed = True
            return True

    def now(self) -> None:
        if self.lease.open_blocks > 0:  # re-entered by a block still open: that block lets go
            return
        if self.claim():
            _release_quietly(self.lease)


_CLAIMS = threading.Lock()


class _ReleaseAtCommit:
    """The ``on_commit`` callback; its finalizer releases on rollback (callback discarded)."""

    __slots__ = ("__weakref__", "release")

    def __init__(self, release: _Release) -> None:
        self.release = release

    def __call__(self) -> None:
        self.release.now()


def _release_quietly(lease: Lease) -> None:
    try:
        lease.release()
    except Exception:  # the lease then runs out on its TTL; the transaction's outcome stands
        logger.warning("Could not release lock %r after its transaction", lease.name, exc_info=True)


def release_after_commit(
    lease: Lease, max_hold: float | None, using: str = DEFAULT_DB_ALIAS
) -> Callable[[], bool]:
    """Release ``lease`` once the transaction commits, or at once if it rolls back; renew it
    meanwhile (within ``max_hold``) if nothing renews it yet.

    Returns ``pending()``: True while the release still waits for this transaction (this
    thread's connection still holds the callback), for re-entering the lease inside it.
    Django has no rollback hook: on CPython the discarded callback is freed at the rollback
    and its finalizer releases; wherever it is not freed at once (PyPy, a traceback keeping
    the list of callbacks alive), the next renewal finds the callback gone and releases."""
    release = _Release(lease)
    callback = _ReleaseAtCommit(release)
    # on rollback: discarded, freed, released (by a collection: in a thread of its own)
    weakref.finalize(callback, collected.outside_collection, release.now)
    connection = transaction.get_connection(using)
    transaction.on_commit(callback, using=using)
    ref = weakref.ref(callback)

    def pending() -> bool:
        registered = ref()
        return (
            registered is not None
            and not release.claimed
            and any(hook[1] is registered for hook in connection.run_on_commit)
        )

    def ended() -> bool:
        return not pending() and lease.open_blocks == 0 and release.claim()

    lease.transaction_ended = ended
    lease.commit_pending = pending
    lease.keep_alive(max_hold, longer=False)
    return pending
