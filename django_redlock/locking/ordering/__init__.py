"""The lock-order checker (``REDLOCK_CHECK_ORDER``; docs/production.md, Ordering locks).

``shapes`` names what is ordered (a template, or a masked name), ``checker`` records edges and
warns, ``shared`` keeps them on the alias's nodes for the other processes of a run, ``stacks``
captures where. The manager calls :func:`taking` (:func:`ataking` in asyncio) before each
acquisition when the checker is on, and :func:`mark` on the lease it got; callers that fill a
template announce it with :func:`expect` (a set: :func:`expect_all`) first.
"""

from __future__ import annotations

from .checker import RECORDER, ataking, mark, taking
from .shapes import expect, expect_all, masked, templated

__all__ = ["RECORDER", "ataking", "expect", "expect_all", "mark", "masked", "taking", "templated"]


def reset() -> None:
    """Forget this process's records (tests; the nodes keep theirs)."""
    RECORDER.reset()
