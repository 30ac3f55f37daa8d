"""Oracles for the attack probes: keys left on the nodes, and one attempt from elsewhere."""

from __future__ import annotations

import threading

import redis
from django.conf import settings

from django_redlock import locks
from tests.support.attempts import free_elsewhere

__all__ = ["free_elsewhere", "keys_left", "take_elsewhere"]


def keys_left(name: str, alias: str = "default") -> list[tuple[str, bytes]]:
    """Every key on every node of ``alias`` whose key mentions ``name``."""
    found: list[tuple[str, bytes]] = []
    pattern = "".join("\\" + ch if ch in "[]*?\\" else ch for ch in name)
    prefix = settings.REDLOCK[alias]["KEY_PREFIX"]
    for url in settings.REDLOCK[alias]["NODES"]:
        client = redis.Redis.from_url(url)
        try:
            for key in client.scan_iter(match=f"{prefix}*{pattern}*", count=1000):
                found.append((url, key))
        finally:
            client.close()
    return found


def take_elsewhere(name: str, alias: str = "default", ttl: float = 5.0) -> list[object]:
    """Acquire ``name`` in another thread (one attempt) and return [lease] or [exception]."""
    outcome: list[object] = []

    def attempt() -> None:
        try:
            outcome.append(locks[alias].acquire(name, ttl=ttl, timeout=0))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join(30)
    assert outcome, "the attempt from another thread hung"
    return outcome
