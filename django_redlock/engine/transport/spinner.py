"""How long a call busy-polls for its replies before it sleeps (``REDLOCK_BUSY_POLL``): the
blocking channels' calls and the asyncio lane's (docs/algorithm.md, "Busy polling")."""

from __future__ import annotations


class Spinner:
    """How long a channel busy-polls for replies before it sleeps in ``poll()``.

    Sleeping and being woken costs more than a fast node's whole answer on loopback or a
    local network (on the 2-core VM of docs/benchmarks.md, ~40 % of a single-node
    acquire+release). So a call first spins on non-blocking reads for up to ``limit``
    seconds, yielding the CPU between reads. When replies keep arriving later than that (a
    remote or loaded node), the spinning stopped paying and is skipped for the next
    :attr:`PAUSE` calls, then tried again.
    """

    #: Calls without spinning after :attr:`MISSES` calls in a row spun in vain.
    PAUSE = 64
    MISSES = 4

    __slots__ = ("_limit", "_misses", "_skip")

    def __init__(self, limit: float) -> None:
        self._limit = limit
        self._misses = 0
        self._skip = 0

    @property
    def active(self) -> bool:
        """True when the next call will spin."""
        return self._limit > 0 and not self._skip

    def budget(self) -> float:
        """Seconds to spin on the next call (0: go straight to ``poll()``)."""
        if self._skip:
            self._skip -= 1
            return 0.0
        return self._limit

    def settled(self, in_time: bool) -> None:
        """Report whether the call spun with a budget settled before the budget ran out."""
        if in_time:
            self._misses = 0
            return
        self._misses += 1
        if self._misses >= self.MISSES:
            self._misses = 0
            self._skip = self.PAUSE
