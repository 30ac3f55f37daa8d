"""The shape of a lock name: what the lock-order checker records edges between.

A lock taken from a template (``@lock("order:{pk}")``, a request lock's key, a ``LockedTask``'s
``lock_name``) has the template as its shape, as written. Any other name is masked, in this
order (docs/production.md#ordering-locks):

1. a UUID written with dashes (``8-4-4-4-12`` hex digits, any case) becomes ``{uuid}``;
2. a run of 16 or more hex digits holding at least one decimal digit (a digest, a UUID
   without dashes) becomes ``{hex}``;
3. every other run of decimal digits becomes ``{n}``.

``order:42`` and ``order:7`` are both ``order:{n}``; ``v2:cart:0b7e...-...`` is
``v{n}:cart:{uuid}``. Two names of one shape count as one lock for ordering, so the checker
finds ``order:{n}`` then ``invoice:{n}`` in one place and the other order elsewhere, whatever
the ids were.
"""

from __future__ import annotations

import contextvars
import functools
import re

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX = re.compile(r"(?<![0-9a-zA-Z])(?=[a-fA-F]*[0-9])[0-9a-fA-F]{16,}(?![0-9a-zA-Z])")
_DIGITS = re.compile(r"[0-9]+")

#: The template of the name this thread or task is about to take: ``(name, template)``, set by
#: the callers that fill a template (see :func:`expect`), read and cleared by :func:`shape`.
_EXPECTED: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "django_redlock_expected_shape", default=None
)


@functools.lru_cache(maxsize=4096)
def masked(name: str) -> str:
    """``name`` with its UUIDs, long hex runs and digit runs masked (see the module doc)."""
    name = _UUID.sub("{uuid}", name)
    name = _HEX.sub("{hex}", name)
    return _DIGITS.sub("{n}", name)


def expect(name: str, template: str) -> None:
    """The next lock this thread or task takes, if it is ``name``, came from ``template``."""
    _EXPECTED.set((name, template))


def shape(name: str) -> str:
    """The shape of ``name``, about to be taken: its template if :func:`expect` announced it,
    else the masked name."""
    expected = _EXPECTED.get()
    if expected is not None:
        _EXPECTED.set(None)
        if expected[0] == name:
            return expected[1]
    return masked(name)
