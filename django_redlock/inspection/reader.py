"""Plain redis-py clients to one alias's nodes for one inspection: SCAN for names, one
pipelined ``GET``/``PTTL`` (and waiter count) round trip per node for a page of values, and
node health."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import redis

from ..checks import valid_aliases
from ..conf import AliasConfig
from ..engine import SEMAPHORE_MARKER, WAITING, Keyspace, LockValue, as_text, escape_glob, quorum
from ..locking.manager import LockManager
from ..nodes.connections import client_factory
from ..nodes.probe import NodeHealth, Target, maybe_int, one_line, probe, run_id
from .records import LockInfo, NodeError, merge, merge_readers, merge_semaphore

# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")
T = TypeVar("T")

#: ``COUNT`` hint of a node's first ``SCAN`` call; each next call asks for twice as many...
SCAN_COUNT = 500
#: ...up to this (a call over 2,000 keys kept a node of the 2-core benchmark VM busy 1.6 ms).
SCAN_COUNT_MAX = 2000
#: A node holding at most this many keys (all kinds, ``DBSIZE``) is scanned to its end, so a
#: listing of such nodes is in name order: pages stay stable while other keys come and go (a
#: resize of the node's hash table reorders SCAN, which repeated a name across two pages).
#: Beyond it, a first page must not read the whole keyspace: names come in SCAN order.
SORTED_LISTING_MAX_KEYS = 20_000
#: What other kinds keep at a name's own key (a semaphore's size, a rwlock's readers).
KIND_MARKERS = (SEMAPHORE_MARKER, "rwlock|")


class AliasInspector:
    """Plain clients to one alias's nodes for one inspection; a node that fails once is
    treated as down for the rest of it (no repeated timeouts). ``shard``: which shard of a
    spread cluster alias (see :mod:`..cluster`); the first one reports the nodes' health."""

    def __init__(self, manager: LockManager, shard: int = 0) -> None:
        self.config: AliasConfig = manager.config.shard_configs[shard]
        self.manager = manager
        self.engine = manager.shards[shard]
        #: set by :meth:`scan_names`: whether the names it gave are in name order
        self.in_name_order = True
        self._factories = [client_factory(node, self.config) for node in self.config.nodes]
        self._clients: dict[int, redis.Redis] = {}
        self.failures: dict[int, str] = {}
        self.keys = Keyspace(self.config.key_prefix)
        # other aliases whose prefix extends ours: their keys match our SCAN, never list them
        prefix = self.config.key_prefix
        self._foreign = tuple(
            other.key_prefix
            for other in valid_aliases()[0]
            if other.key_prefix != prefix and other.key_prefix.startswith(prefix)
        )

    @property
    def alias(self) -> str:
        return self.config.alias

    @property
    def total(self) -> int:
        return len(self.config.nodes)

    @property
    def errors(self) -> list[NodeError]:
        return [
            NodeError(self.alias, self.config.nodes[i].label, message)
            for i, message in sorted(self.failures.items())
        ]

    def __enter__(self) -> AliasInspector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()
            client.connection_pool.disconnect()

    def _call(self, index: int, func: Callable[[redis.Redis], T]) -> T | None:
        """``func(client)`` on node ``index``; None (and the node marked down) on failure."""
        if index in self.failures:
            return None
        client = self._clients.get(index)
        if client is None:
            client = self._clients[index] = self._factories[index]()
        try:
            return func(client)
        except (redis.RedisError, OSError) as exc:
            self.failures[index] = one_line(exc)
            logger.info(
                "Inspection of alias %r: node %s failed: %s",
                self.alias,
                self.config.nodes[index].label,
                self.failures[index],
            )
            return None

    # -- locks -----------------------------------------------------------------------------
    def _lock_name(self, key: str) -> str | None:
        """The lock name of ``key``; None for our own bookkeeping keys and for keys of an
        alias whose prefix extends ours."""
        return None if key.startswith(self._foreign) else self.keys.name_of(key)

    def scan_names(self, name_prefix: str = "", need: int | None = None) -> list[str]:
        """Lock names starting with ``name_prefix``, until ``need`` are known.

        The nodes are scanned all at the same time (one thread each, so the cost is that of
        the slowest node, not the sum). A page (``need`` given) reads every node, each until
        it has seen ``need`` names or reached its end; so names held only on some nodes (say,
        the first node is down) are still found. A whole listing (``need`` None) reads only
        as many *trusted* nodes as :meth:`cover_of` says: enough that every name held on a
        quorum shows up (the names are then read from every node, so their node counts stay
        exact). Nodes of at most :data:`SORTED_LISTING_MAX_KEYS` keys are read to their end
        and the names sorted. Otherwise the names come in node order, each node's in SCAN
        order, and the nodes still scanning stop once the nodes before them already give
        ``need`` names. ``COUNT`` starts at :data:`SCAN_COUNT` (a first page takes one call)
        and doubles up to :data:`SCAN_COUNT_MAX` (fewer round trips through a large keyspace,
        each call still short).
        """
        match = escape_glob(self.keys.lock(name_prefix)) + "*"
        settled = threading.Event()
        large: set[int] = set()  # nodes over SORTED_LISTING_MAX_KEYS

        def scan(client: redis.Redis, index: int) -> list[str]:
            found: dict[str, None] = {}
            cursor, count = 0, SCAN_COUNT
            enough = None
            if _key_count(client) > SORTED_LISTING_MAX_KEYS:
                large.add(index)
                enough = need
            while not (enough is not None and settled.is_set()):
                cursor, keys = client.scan(cursor, match=match, count=count)
                for raw in keys:
                    name = self._lock_name(as_text(raw))
                    if name is not None:
                        found.setdefault(name, None)
                if cursor == 0 or (enough is not None and len(found) >= enough):
                    break
                count = min(count * 2, SCAN_COUNT_MAX)
            return list(found)

        per_node: dict[int, list[str]] = {}
        order, cover = self.cover_of() if need is None else (list(range(self.total)), self.total)
        skipped = set(order[cover:])  # left out while the nodes scanned answer

        def merged() -> list[str]:
            """Names of the nodes done so far, in node order, up to the first still running."""
            names: dict[str, None] = {}
            for index in range(self.total):
                if index in skipped:
                    continue
                if index not in per_node:
                    break
                names.update(dict.fromkeys(per_node[index]))
            return list(names)

        def scan_node(index: int) -> list[str]:
            return self._call(index, lambda client: scan(client, index)) or []

        if cover == 1 and not skipped:
            per_node[order[0]] = scan_node(order[0])
        else:
            with ThreadPoolExecutor(max_workers=self.total) as pool:
                running = {pool.submit(scan_node, i): i for i in order[:cover]}
                spare = order[cover:]
                while running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        index = running.pop(future)
                        per_node[index] = future.result()
                        if index in self.failures and spare:  # scan another in its place
                            stand_in = spare.pop(0)
                            skipped.discard(stand_in)
                            running[pool.submit(scan_node, stand_in)] = stand_in
                    if need is not None and len(merged()) >= need:
                        settled.set()  # later nodes' names would be cut off: stop them
        self.in_name_order = not large
        names = merged() if large else sorted(merged())
        return names if need is None else names[:need]

    def cover_of(self) -> tuple[list[int], int]:
        """Which nodes a whole listing scans: ``(order, count)``, scan ``order[:count]`` and
        put the next one in place of each that fails.

        A lease counts only when a quorum of nodes granted it, so ``N - quorum + 1`` nodes
        share at least one node with any quorum: scanning that many finds every held name.
        Only while those nodes kept their keys, though: a node that restarted or was wiped
        since (its fence hash lacks its current ``run_id``: the restart quarantine) may have
        lost a valid lease's key, so the count is ``N - quorum + 1`` *trusted* nodes (their
        keys are intact), untrusted ones (and nodes that did not answer) last: the fence marks
        of :meth:`fence_marks` against each node's ``INFO server``. With fewer trusted nodes,
        every node is read.
        """
        every = list(range(self.total))
        if self.total < 3:
            return every, self.total
        marks = self.fence_marks()

        trusted = [
            i
            for i, mark in enumerate(marks)
            if mark is not None and mark[0] and mark[0] == self._call(i, run_id)
        ]
        others = [i for i in every if i not in trusted]
        cover = self.total - quorum(self.total) + 1
        if len(trusted) < cover:
            return every, self.total
        return trusted + others, cover

    def read_values(self, names: Sequence[str]) -> list[list[tuple[LockValue, int] | None]]:
        """Per name, per node: the parsed value and PTTL, or None (not held or node down)."""
        return self.read_page(names)[0]

    def read_page(
        self, names: Sequence[str]
    ) -> tuple[list[list[tuple[LockValue, int] | None]], list[int], list[str | None]]:
        """What :meth:`read_values` returns, per name how many callers wait for it (the
        largest count over the nodes) and the kind marker found at its key (a semaphore's
        ``semaphore|N`` or a read-write lock's ``rwlock|readers``; None for a lock), in the
        same round trip per node."""
        waiting = [0] * len(names)

        def waiters(pipe: Any) -> None:
            # the waiter sets' registrations still ahead, on the node's own clock
            pipe.eval(WAITING.source, len(names), *(self.keys.waiters(name) for name in names))

        def counted(counts: Any) -> None:
            nonlocal waiting
            if isinstance(counts, list):  # not an error (say, an ACL user without EVAL)
                waiting = [max(w, int(c)) for w, c in zip(waiting, counts, strict=True)]

        keys = [self.keys.lock(name) for name in names]
        values, markers = self._read_values(keys, waiters, counted)
        return values, waiting, markers

    def _read_values(
        self,
        keys: Sequence[str],
        more: Callable[[Any], None] | None = None,
        took: Callable[[Any], None] | None = None,
    ) -> tuple[list[list[tuple[LockValue, int] | None]], list[str | None]]:
        """Per key, per node: the parsed lock value and PTTL, or None (not held, not a lock
        value, or node down); and per key a kind marker found there. One pipelined round trip
        per node; ``more(pipe)`` may queue one more command, whose reply goes to ``took``."""
        result: list[list[tuple[LockValue, int] | None]] = [[None] * self.total for _ in keys]
        markers: list[str | None] = [None] * len(keys)

        def fetch(client: redis.Redis) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
            if more is not None:
                more(pipe)
            # a key of another alias whose prefix extends ours may be a hash (WRONGTYPE)
            return pipe.execute(raise_on_error=False)

        for index in range(self.total):
            replies = self._call(index, fetch) if keys else []
            if not replies:
                continue
            for i in range(len(keys)):
                raw, pttl = replies[2 * i], replies[2 * i + 1]
                if isinstance(raw, bytes | str) and isinstance(pttl, int) and pttl != -2:
                    text = as_text(raw)
                    if LockValue.looks_like_lock(text):  # skip anything that is not a lock
                        result[i][index] = (LockValue.parse(text), int(pttl))
                    elif text.startswith(KIND_MARKERS):
                        markers[i] = text
            if took is not None:
                took(replies[2 * len(keys)])
        return result, markers

    def lock_infos(self, names: Sequence[str]) -> list[LockInfo]:
        """Merged :class:`LockInfo` of ``names`` that are still held, in the same order."""
        infos = []
        values, waiting, markers = self.read_page(names)
        for name, per_node, waiters, marker in zip(names, values, waiting, markers, strict=True):
            if marker is not None and marker.startswith(SEMAPHORE_MARKER):
                permits = maybe_int(marker[len(SEMAPHORE_MARKER) :]) or 0
                slots = self.read_slots(name, permits)
                info = merge_semaphore(self.alias, name, self.total, permits, slots, waiters)
            elif marker is not None:
                info = merge_readers(self.alias, name, self.total, self.read_readers(name), waiters)
            else:
                info = merge(self.alias, name, self.total, per_node, waiters)
            if info is not None:
                infos.append(info)
        return infos

    def read_slots(self, name: str, permits: int) -> list[list[tuple[LockValue, int] | None]]:
        """Per slot of the semaphore ``name``, per node: the parsed value and PTTL, or None."""
        return self._read_values([self.keys.permit(name, k) for k in range(permits)])[0]

    def read_readers(self, name: str) -> list[dict[str, int] | None]:
        """Per node, the read leases of the read-write lock ``name``: owner -> ms left (on
        the node's own clock); None for a node that could not be read."""
        key = self.keys.readers(name)

        def fetch(client: redis.Redis) -> dict[str, int]:
            pipe = client.pipeline(transaction=False)
            pipe.time()
            pipe.zrange(key, 0, -1, withscores=True)
            (seconds, micros), members = pipe.execute()
            now = seconds * 1000 + micros // 1000
            return {as_text(m): int(score) - now for m, score in members if score > now}

        return [self._call(index, fetch) for index in range(self.total)]

    # -- health ----------------------------------------------------------------------------
    def fence_marks(self) -> list[tuple[str, int] | None]:
        """Per node, what its fence hash says: the ``run_id`` it was (re)initialised under
        ('' if none) and the longest TTL it has granted, ms (0: it never granted a lease);
        None for a node that could not be read. A node whose mark differs from its current
        ``run_id`` is in the restart quarantine (see ``engine/trust.py``)."""
        fence = self.keys.fence

        def fetch(client: redis.Redis) -> tuple[str, int]:
            marked, longest = client.hmget(fence, ["run_id", "max_ttl"])
            text = "" if longest is None else as_text(longest)
            return ("" if marked is None else as_text(marked)), int(text) if text.isdigit() else 0

        return [self._call(index, fetch) for index in range(self.total)]

    def health(self) -> list[NodeHealth]:
        """Every node's health, all read at the same time (see :mod:`..nodes.probe`); a
        node that did not answer counts as failed for the rest of the inspection."""
        target = Target(self.config, len(self.manager.shards), factories=self._factories)
        report = [reading.health for reading in probe([target])[0]]
        for node in report:
            if not node.up:
                self.failures.setdefault(node.index, node.error)
        return report


def _key_count(client: redis.Redis) -> int:
    """How many keys the client's database holds, from ``INFO keyspace`` (``INFO`` is in
    the documented ACL; ``DBSIZE`` is not); "too many to sort" when it cannot be read."""
    try:
        keyspace = client.info("keyspace")
    except redis.ResponseError:
        return SORTED_LISTING_MAX_KEYS + 1
    db = client.connection_pool.connection_kwargs.get("db", 0)
    entry = keyspace.get(f"db{db}", {})
    return int(entry.get("keys", 0)) if isinstance(entry, dict) else SORTED_LISTING_MAX_KEYS + 1


# -- the API the admin and the command use -------------------------------------------------
