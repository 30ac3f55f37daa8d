"""One reading of a node's health, used by every report of it: the deploy checks, the admin's
node panel, ``manage.py redlock nodes``, the health view and the metrics.

A node answers ``PING`` (its latency) and then one pipelined round trip of ``INFO server``
(run id, uptime), ``INFO memory`` (``maxmemory_policy``, memory used) and ``INFO replication``
(role), plus the alias's fence hash when asked. ``INFO`` is in the ACL that docs/algorithm.md
recommends and ``CONFIG`` is not (managed services often disable it), so the eviction policy
comes from ``INFO memory``; ``CONFIG GET`` is asked only when ``INFO memory`` is refused.

All the nodes of one probe are read at the same time, one thread each: paused or unreachable
nodes cost one socket timeout together, not one each.

It imports only :mod:`..connections` and the engine's error formatter (never the settings or
the lock API), so ``checks`` and ``inspection`` both use it without an import circle.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from ..engine import describe
from .connections import client_factory, current_master

if TYPE_CHECKING:  # settings are read by conf; this module only reads what it is given
    from .spec import AliasNodes

#: The policy under which Redis never evicts keys (a lock key lives until its TTL).
NO_EVICTION = "noeviction"
#: What :attr:`NodeHealth.maxmemory_policy` says when neither ``INFO memory`` nor
#: ``CONFIG GET`` gave the policy (an ACL user denied both).
UNKNOWN = "unknown"
#: The most threads one probe starts (nodes beyond it wait for a free thread).
MAX_THREADS = 64


@dataclass(frozen=True)
class NodeHealth:
    """What one node says about itself; ``up`` False when it did not answer (``error`` says
    why). An ``up`` node's ``error`` names the ``INFO`` sections it refused, if any."""

    alias: str
    index: int
    node: str
    up: bool
    latency_ms: float | None = None
    run_id: str | None = None
    uptime_s: int | None = None
    maxmemory_policy: str | None = None
    used_memory: int | None = None
    used_memory_human: str | None = None
    error: str = ""
    #: ``master`` or ``slave`` (a replica), from ``INFO replication``
    role: str | None = None
    #: a sentinel node's master now (``host:port``), or a cluster node's slot, master and
    #: coverage (None for other nodes)
    master: str | None = None

    @property
    def evicts(self) -> bool:
        """The node answered with a policy that can evict lock keys and fence counters."""
        return self.up and self.maxmemory_policy not in (None, NO_EVICTION, UNKNOWN)

    @property
    def replica(self) -> bool:
        """The node answered as a replica: it refuses the lock scripts' writes."""
        return self.up and self.role == "slave"

    @property
    def shown(self) -> str:
        """The node's label, with where a sentinel or cluster node was found."""
        if self.master is None:
            return self.node
        return f"{self.node} [{'' if self.master.startswith('slot') else 'master '}{self.master}]"

    @property
    def policy_shown(self) -> str:
        """The policy as the admin and ``redlock nodes`` print it, flagged when it evicts."""
        policy = self.maxmemory_policy or ""
        return f"{policy} (evicts lock keys)" if self.evicts else policy

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "evicts": self.evicts}


@dataclass(frozen=True)
class Reading:
    """One node's :class:`NodeHealth` and, when the probe was given a fence hash, that hash's
    mark: the ``run_id`` it was (re)initialised under ('' if none) and the longest TTL it has
    granted, ms (None: not asked, or not read)."""

    health: NodeHealth
    fence_mark: tuple[str, int] | None = None


@dataclass(frozen=True)
class Target:
    """The nodes of one alias (or one shard of a spread cluster alias) to probe.

    ``shards``: how many shards the alias is spread over (how a cluster node is described);
    ``fence``: the fence hash key whose mark to read as well (None: do not read it);
    ``factories``: a client factory per node (default: :func:`~..connections.client_factory`).
    """

    config: AliasNodes
    shards: int = 1
    fence: str | None = None
    factories: Sequence[Callable[[], redis.Redis]] | None = None


def probe(targets: Sequence[Target]) -> list[list[Reading]]:
    """Per target, per node, its :class:`Reading`; every node of every target at once."""
    jobs = [(target, index) for target in targets for index in range(len(target.config.nodes))]
    if len(jobs) == 1:
        readings = [read_node(*jobs[0])]
    elif jobs:
        workers = min(len(jobs), MAX_THREADS)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="redlock-probe") as pool:
            readings = list(pool.map(lambda job: read_node(*job), jobs))
    else:
        readings = []
    result: list[list[Reading]] = []
    start = 0
    for target in targets:
        count = len(target.config.nodes)
        result.append(readings[start : start + count])
        start += count
    return result


def probe_alias(config: AliasNodes, shards: int = 1) -> list[NodeHealth]:
    """The health of every node of one alias, read at the same time."""
    return [reading.health for reading in probe([Target(config, shards)])[0]]


def read_node(target: Target, index: int) -> Reading:
    """Read node ``index`` of ``target`` with a client of its own (closed before returning);
    a node that fails to answer, or whose client cannot even be built, is ``up`` False
    (``error`` says why), never an exception."""
    config = target.config
    spec = config.nodes[index]
    try:
        factory = (
            client_factory(spec, config) if target.factories is None else target.factories[index]
        )
        client = factory()
    except Exception as exc:  # a broken CACHE node, say: reported, never raised
        return Reading(NodeHealth(config.alias, index, spec.label, False, error=one_line(exc)))
    try:
        started = time.perf_counter()
        client.ping()
        latency = round((time.perf_counter() - started) * 1000, 3)
        pipe = client.pipeline(transaction=False)
        pipe.info("server")
        pipe.info("memory")
        pipe.info("replication")
        if target.fence is not None:
            pipe.hmget(target.fence, ["run_id", "max_ttl"])
        replies = pipe.execute(raise_on_error=False)
        server, memory, replication = (_section(reply) for reply in replies[:3])
        policy = memory.get("maxmemory_policy")
        if policy is None:  # INFO memory refused: CONFIG GET may still be allowed
            policy = _config_policy(client)
        refused = [
            (name, reply)
            for name, reply in zip(("server", "memory", "replication"), replies, strict=False)
            if isinstance(reply, Exception)
        ]
        error = (
            f"INFO {', '.join(name for name, _ in refused)} refused: {one_line(refused[0][1])}"
            if refused
            else ""
        )
        health = NodeHealth(
            config.alias,
            index,
            spec.label,
            True,
            latency_ms=latency,
            run_id=_text(server.get("run_id")),
            uptime_s=maybe_int(server.get("uptime_in_seconds")),
            maxmemory_policy=UNKNOWN if policy is None else str(policy),
            used_memory=maybe_int(memory.get("used_memory")),
            used_memory_human=_text(memory.get("used_memory_human")),
            error=error,
            role=_text(replication.get("role")),
            master=current_master(spec, config, target.shards),
        )
        mark = _fence_mark(replies[3]) if target.fence is not None else None
        return Reading(health, mark)
    except Exception as exc:  # any failure of the probe means the node cannot vote
        return Reading(NodeHealth(config.alias, index, spec.label, False, error=one_line(exc)))
    finally:
        client.close()
        client.connection_pool.disconnect()


def eviction_policy(client: redis.Redis) -> str | None:
    """The node's ``maxmemory-policy``: from ``INFO memory``, else ``CONFIG GET``; None when
    both are refused. Connection errors propagate."""
    try:
        policy = client.info("memory").get("maxmemory_policy")
    except redis.ResponseError:
        policy = None
    return _config_policy(client) if policy is None else str(policy)


def run_id(client: redis.Redis) -> str:
    """The node's current ``run_id`` from ``INFO server`` ('' if it has none)."""
    return str(client.info("server").get("run_id", ""))


#: ``ExceptionName: message`` on one line: the engine's formatter, so every report reads alike
one_line = describe


def _config_policy(client: redis.Redis) -> str | None:
    try:
        config = client.config_get("maxmemory-policy")
    except redis.ResponseError:  # NOPERM, or CONFIG renamed away by the provider
        return None
    reply: dict[Any, Any] = dict(config)
    return _text(reply.get("maxmemory-policy", reply.get(b"maxmemory-policy")))


def _section(reply: Any) -> dict[str, Any]:
    """An ``INFO`` reply's fields; empty when the node refused the section."""
    return reply if isinstance(reply, dict) else {}


def _fence_mark(reply: Any) -> tuple[str, int] | None:
    if not isinstance(reply, list):
        return None
    raw_run_id, longest = reply
    text = _text(longest) or ""
    return (_text(raw_run_id) or ""), int(text) if text.isdigit() else 0


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text or None


def maybe_int(value: Any) -> int | None:
    """An ``INFO`` field (or any reply) as an int, or None when it is not one."""
    if value is None or isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return None
