"""Signals sent by lock managers.

All are sent with ``sender`` = the :class:`~django_redlock.manager.LockManager` and the keyword
arguments ``alias`` and ``name``, plus ``lease`` (acquired, released, lost) or ``reason``
(failed: ``"busy"``, ``"timeout"`` or ``"unavailable"``). ``lock_acquired`` also gets
``waited`` (seconds the acquire call took) and ``attempts``; ``lock_failed`` gets ``waited``,
``attempts`` and ``votes`` (the nodes that granted the last attempt).

They are sent with :func:`emit`: a receiver that raises (a metrics backend that is down) is
logged and skipped, and never changes what the lock call does; in particular an acquisition
whose ``lock_acquired`` receiver raises still hands out its lease, so no lock is left behind.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

lock_acquired = Signal()
lock_released = Signal()
lock_failed = Signal()
lock_lost = Signal()

logger = logging.getLogger("django_redlock")  # SPEC 3: one logger name (records carry .module)


def emit(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` to every receiver; log (ERROR, with traceback) the ones that raise."""
    if not signal.receivers:  # the common case costs one attribute check
        return
    for receiver, result in signal.send_robust(sender=sender, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "A receiver of a django_redlock signal raised (%r); the lock call went on.",
                receiver,
                exc_info=result,
            )
