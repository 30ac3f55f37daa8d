"""Redis Cluster nodes: a cluster used as one lock node, on the master of one hash slot.

A ``{"CLUSTER": [seed urls]}`` node needs a ``KEY_PREFIX`` with a hash tag (``"{lock}:"``):
every key the alias writes (locks, waiters, wake-ups, the fence hash) then hashes to that tag's
slot, so each script's keys share a slot, the fence counter is one key, and every primitive
works (``lock_many`` included). Each new connection asks the seeds (``CLUSTER SLOTS``) which
master serves the slot (:mod:`.located`). A ``MOVED`` reply (the slot was migrated) or a
closed connection (the master failed) makes the engine connect again, to the new owner; a
master promoted by a failover has another ``run_id`` and is quarantined like a restarted node.
Locks of one alias live on one master; aliases with different tags spread over the masters.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
from redis.crc import key_slot

from .engine import as_text
from .located import Address, Locator

#: Redis Cluster's number of hash slots.
SLOTS = 16384


def slot_of(prefix: str) -> int:
    """The slot every key starting with ``prefix`` (which holds a hash tag) hashes to."""
    return int(key_slot(prefix.encode()))


class ClusterSlot(Locator):
    """The seeds of one cluster, asked which master serves ``slot``; also remembers the
    cluster's masters and how many slots they cover (for ``redlock nodes`` and the admin)."""

    def __init__(self, urls: Sequence[str], slot: int, timeout: float) -> None:
        super().__init__(urls, timeout)
        self.slot = slot
        self.what = f"no cluster seed names a master for slot {slot}"
        self.masters: list[Address] = []
        self.covered = 0

    def ask(self, client: redis.Redis) -> Address | None:
        ranges = client.execute_command("CLUSTER SLOTS")
        found: Address | None = None
        masters: set[Address] = set()
        covered = 0
        for entry in ranges:
            start, end, master = int(entry[0]), int(entry[1]), entry[2]
            address = (as_text(master[0]), int(master[1]))
            masters.add(address)
            covered += end - start + 1
            if start <= self.slot <= end:
                found = address
        self.masters, self.covered = sorted(masters), covered
        return found

    def describe(self) -> str:
        """``slot S on host:port; N masters, C/16384 slots covered``."""
        where = f"{self.last[0]}:{self.last[1]}" if self.last else "?"
        return (
            f"slot {self.slot} on {where}; {len(self.masters)} masters, "
            f"{self.covered}/{SLOTS} slots covered"
        )
