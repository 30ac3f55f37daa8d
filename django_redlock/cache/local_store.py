"""Fenced reads and writes on Django's ``LocMemCache``, the usual cache of a project's tests.

``LocMemCache`` lives inside one process, so what is fenced here is that process's copy: the
value at the key, and beside it a record ``(token, fresh until)`` at ``redlock:fence:<key>``,
read and written together under one lock of the process. The fill's lease still comes from the
``REDLOCK`` alias (Redis nodes, or ``testing.simulate()``), so threads and tasks of a process
compute a missing value once; other processes have caches of their own and compute their own
(docs/effects.md, "Stampede-proof cache fill").
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .fenced import FencedStore, Found, record_key

_MISSING = object()


class LocalStore(FencedStore):
    """:class:`~.fenced.FencedStore` for ``LocMemCache``: its own API, its keys as given."""

    _lock = threading.Lock()

    def full_key(self, key: str) -> str:
        return key

    def read(self, full_key: str, grace_ms: int) -> Found | None:
        with LocalStore._lock:
            value = self.backend.get(full_key, _MISSING)
            record = self.backend.get(record_key(full_key))
        if value is _MISSING:
            return None
        fresh_until = record[1] if isinstance(record, tuple) else None
        if fresh_until is None:
            return Found(value, False)
        now = time.monotonic()
        if now < fresh_until:
            return Found(value, False)
        if now < fresh_until + grace_ms / 1000:
            return Found(value, True)
        return None

    def write(self, full_key: str, value: Any, token: int, fresh_ms: int, grace_ms: int) -> bool:
        life = None if fresh_ms == 0 else (fresh_ms + grace_ms) / 1000
        fresh_until = None if fresh_ms == 0 else time.monotonic() + fresh_ms / 1000
        with LocalStore._lock:
            record = self.backend.get(record_key(full_key))
            if isinstance(record, tuple) and record[0] >= token:
                return False  # a newer lease stored its value
            self.backend.set(full_key, value, life)
            self.backend.set(record_key(full_key), (token, fresh_until), life)
        return True
