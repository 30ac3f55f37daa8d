"""Aliases whose nodes are traps: loopback listeners that count every connection and never
answer. A test under ``simulate`` points its aliases at them to prove nothing reaches Redis
(``connections == 0``), and without ``simulate`` the same code fails (it connects, then times
out as unavailable)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.test import override_settings

from django_redlock import locks


class Trap:
    """A listener on a free loopback port; ``connections`` counts what connected."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(0.05)
        self._stop = threading.Event()
        self.port = self._socket.getsockname()[1]
        self.connections = 0
        self._accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._accepted.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close()
        for conn in self._accepted:
            conn.close()


@contextmanager
def offline_aliases() -> Iterator[list[Trap]]:
    """``REDLOCK`` with ``default`` on one trap and ``multi`` on three (short timeouts); yields
    the traps. Asserting nothing connected is the caller's job (``connected(traps)``)."""
    traps = [Trap() for _ in range(4)]
    fast = {"TTL": 5.0, "TIMEOUT": 0.3, "NODE_TIMEOUT": 0.1}
    aliases = {
        "default": {"NODES": [traps[0].url], "KEY_PREFIX": "off1:", **fast},
        "multi": {"NODES": [t.url for t in traps[1:]], "KEY_PREFIX": "off3:", **fast},
    }
    try:
        with override_settings(REDLOCK=aliases):
            yield traps
    finally:
        locks.reset()
        for trap in traps:
            trap.close()


def connected(traps: list[Trap]) -> int:
    """How many connections reached the traps."""
    return sum(trap.connections for trap in traps)
