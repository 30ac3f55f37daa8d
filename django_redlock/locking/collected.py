"""What the garbage collector finalizes. A collection runs in whichever thread happened to
allocate, at whatever point it was, perhaps inside the library with one of its own locks held
(a pool's, while it picks a connection). An abandoned ``@lock`` generator is closed there (its
body's ``finally`` runs in place, its leases still held), but the releases of its blocks,
which may need those locks, are made in a thread of their own, started with the
interpreter's low-level call (which takes none of :mod:`threading`'s locks either)."""

from __future__ import annotations

import _thread
import gc
import logging
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .lease import Lease

logger = logging.getLogger("django_redlock")

#: the thread a collection runs in now (None: none runs)
_collecting: int | None = None


def _track(phase: str, info: dict[str, Any]) -> None:
    global _collecting
    _collecting = threading.get_ident() if phase == "start" else None


gc.callbacks.append(_track)


def in_collection() -> bool:
    """True while the garbage collector runs in this thread (its finalizers included)."""
    return _collecting == threading.get_ident()


def run_elsewhere(job: Callable[[], object]) -> None:
    """Run ``job`` in a new thread, now (its result dropped). In this thread when the
    interpreter is exiting (its last collection: no library code is running in this thread
    then, and a thread started now could be cut off before the release is sent) or no thread
    can be started (a process at its thread limit: rather than a lease kept to its TTL)."""
    if sys.is_finalizing():
        job()
        return
    try:
        _thread.start_new_thread(job, ())
    except RuntimeError:
        job()


def outside_collection(job: Callable[[], object]) -> None:
    """Run ``job`` now, or in a thread of its own when the garbage collector runs in this
    thread (a finalizer that releases: see the module's docstring)."""
    if in_collection():
        run_elsewhere(job)
    else:
        job()


def release_elsewhere(lease: Lease) -> None:
    """Release ``lease`` (a block the collector's close left) in a thread of its own."""

    def release() -> None:
        try:
            lease.release()
        except Exception as exc:  # its keys expire with their TTL; no traceback to print
            logger.warning(
                "Could not release lock %r of a collected generator: %s", lease.name, exc
            )

    run_elsewhere(release)
