"""What the observability apps share: observing the four lock signals at once."""

from __future__ import annotations

from typing import Any

from .. import signals


class LockObserver:
    """Observes ``lock_acquired``, ``lock_failed``, ``lock_released`` and ``lock_lost`` with
    its ``on_acquired``/``on_failed``/``on_released``/``on_lost`` methods (``signals.observe``:
    called directly, without Django's dispatch)."""

    on_acquired: Any
    on_failed: Any
    on_released: Any
    on_lost: Any

    def observers(self) -> list[tuple[Any, Any]]:
        """(signal, observer) pairs, as :meth:`connect` registers them."""
        return [
            (signals.lock_acquired, self.on_acquired),
            (signals.lock_failed, self.on_failed),
            (signals.lock_released, self.on_released),
            (signals.lock_lost, self.on_lost),
        ]

    def connect(self) -> None:
        """Observe the lock signals."""
        for signal, observer in self.observers():
            signals.observe(signal, observer)

    def disconnect(self) -> None:
        for signal, observer in self.observers():
            signals.unobserve(signal, observer)
