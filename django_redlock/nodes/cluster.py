"""Redis Cluster nodes: a cluster used as one lock node.

An alias with a ``{"CLUSTER": [seed urls]}`` node and a ``KEY_PREFIX`` without braces
(``"lock:"``) is **spread**: it runs as :data:`SHARDS` shards, each with the prefix plus a hash
tag of its own (``"lock:{s3}:"``), whose slots lie evenly over the slot range, so the shards'
masters are all the cluster's masters. A name belongs to one shard (:func:`shard_of`, by the
name's own hash tag if it has one), so each lock's keys share a slot and there are
:data:`SHARDS` fence counters, whatever the number of names. A ``KEY_PREFIX`` with a hash tag
(``"{lock}:"``) keeps every key of the alias in that tag's slot instead (one master, one fence
counter, ``lock_many`` over any names).

Each new connection asks the seeds (``CLUSTER SHARDS``, or ``CLUSTER SLOTS`` before Redis 7;
:mod:`.cluster_replies`) which master serves its shard's slot (:mod:`.located`), the address a
seed announces passed through the node's ``ADDRESS_REMAP``. A ``MOVED`` reply (the slot was
migrated) or a closed connection (the master failed) makes the engine connect again, to the new
owner; a master promoted by a failover has another ``run_id`` and is quarantined like a
restarted node, shard by shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import redis
from redis.crc import key_slot

from .cluster_replies import Range, from_shards, from_slots, remapped
from .located import Address, Declined, Locator

#: Redis Cluster's number of hash slots.
SLOTS = 16384
#: Shards of a spread cluster alias: enough to reach every master of a cluster of a dozen
#: or so (each shard's slot lies in its own sixteenth of the slot range), few enough that
#: a process keeps few connections.
SHARDS = 16


def _shard_tag(index: int, count: int) -> str:
    """The first of ``s<index>``, ``s<index>.1``, ... whose slot lies in the ``index``-th of
    ``count`` equal parts of the slot range."""
    width = SLOTS // count
    attempt = 0
    while True:
        tag = f"s{index}" if attempt == 0 else f"s{index}.{attempt}"
        if int(key_slot(tag.encode())) // width == index:
            return tag
        attempt += 1


def shard_prefixes(prefix: str, count: int = SHARDS) -> tuple[str, ...]:
    """The key prefixes of a spread alias's shards: ``prefix`` (without braces) and a hash
    tag per shard, e.g. ``"lock:{s0}:"``."""
    return tuple(f"{prefix}{{{_shard_tag(i, count)}}}:" for i in range(count))


def shard_of(name: str, count: int) -> int:
    """The shard of lock ``name``: by its slot, so names with one hash tag (``"{cart:7}a"``,
    ``"{cart:7}b"``) share a shard (and may be taken together by ``lock_many``)."""
    return int(key_slot(name.encode())) % count


def slot_of(prefix: str) -> int:
    """The slot every key starting with ``prefix`` (which holds a hash tag) hashes to."""
    return int(key_slot(prefix.encode()))


class ClusterSlot(Locator):
    """The seeds of one cluster, asked which master serves ``slot``; also remembers the
    cluster's masters and how many slots they cover (for ``redlock nodes`` and the admin).
    ``remap``: the node's ``ADDRESS_REMAP`` (announced ``(host, port)`` to the one to use)."""

    def __init__(
        self,
        urls: Sequence[str],
        slot: int,
        timeout: float,
        remap: Callable[[str, int], Address] | None = None,
    ) -> None:
        super().__init__(urls, timeout)
        self.slot = slot
        self.remap = remap
        self.what = f"no cluster seed names a master for slot {slot}"
        self.masters: list[Address] = []
        self.covered = 0
        #: False once a seed refused ``CLUSTER SHARDS`` and answered ``CLUSTER SLOTS``
        self.shards = True

    def ranges(self, client: redis.Redis) -> list[Range]:
        """The seed's slot ranges and their masters, as announced (an empty host is the
        seed's own)."""
        pool = client.connection_pool
        seed_host = str(pool.connection_kwargs.get("host") or "")
        if self.shards:
            try:
                reply = client.execute_command("CLUSTER", "SHARDS")
            except redis.ResponseError:  # before Redis 7, or an ACL without cluster|shards
                ranges = from_slots(client.execute_command("CLUSTER", "SLOTS"), seed_host)
                self.shards = False
                return ranges
            return from_shards(
                reply, seed_host, issubclass(pool.connection_class, redis.SSLConnection)
            )
        return from_slots(client.execute_command("CLUSTER", "SLOTS"), seed_host)

    def ask(self, client: redis.Redis) -> Address | None:
        try:
            ranges = remapped(self.ranges(client), self.remap)
        except ValueError as exc:
            raise Declined(str(exc)) from exc
        found: Address | None = None
        masters: set[Address] = set()
        covered = 0
        for start, end, address in ranges:
            masters.add(address)
            covered += end - start + 1
            if start <= self.slot <= end:
                found = address
        self.masters, self.covered = sorted(masters), covered
        return found

    def describe_spread(self, shards: int) -> str:
        """``N shards over M masters, C/16384 slots covered`` (a spread alias)."""
        return (
            f"{shards} shards over {len(self.masters)} masters, "
            f"{self.covered}/{SLOTS} slots covered"
        )

    def describe(self) -> str:
        """``slot S on host:port; N masters, C/16384 slots covered``."""
        where = f"{self.last[0]}:{self.last[1]}" if self.last else "?"
        return (
            f"slot {self.slot} on {where}; {len(self.masters)} masters, "
            f"{self.covered}/{SLOTS} slots covered"
        )
