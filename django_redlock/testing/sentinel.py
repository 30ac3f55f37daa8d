"""``SentinelGroup``: a master, its replica and three ``--sentinel`` processes on loopback.

Every process is a :class:`~.node.RedisNode` (a sentinel is one started with a config file and
``--sentinel``), so each is started and stopped by PID and stopped at exit like any node.
``kill_master()`` SIGKILLs the master; ``wait_failover()`` waits until the sentinels name the
promoted replica and it accepts writes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from django_redlock.testing.node import RedisNode, RedisNodeError, StopOnExit
from django_redlock.testing.wire import HOST, chosen_ports

_CONFIG_NAME = "sentinel.conf"


class SentinelProcess(RedisNode):
    """One ``redis-server --sentinel`` watching ``service`` on ``master_port``."""

    def __init__(
        self,
        master_port: int,
        service: str,
        *,
        quorum: int,
        down_after_ms: int,
        failover_timeout_ms: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.master_port = master_port
        self.service = service
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    @property
    def sentinel_url(self) -> str:
        """The URL to list under ``SENTINELS`` (no database: sentinels have none)."""
        return f"redis://{HOST}:{self.port}"

    def _command(self) -> list[str]:
        config = self.data_dir / _CONFIG_NAME
        if not config.exists():  # a sentinel rewrites its config; a restart keeps what it learnt
            s = self.service
            config.write_text(
                f"port {self.port}\nbind {HOST}\nprotected-mode no\ndaemonize no\n"
                f'dir "{self.data_dir}"\nlogfile ""\n'
                f"sentinel monitor {s} {HOST} {self.master_port} {self.quorum}\n"
                f"sentinel down-after-milliseconds {s} {self.down_after_ms}\n"
                f"sentinel failover-timeout {s} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {s} 1\n"
            )
        return [self.server, str(config), "--sentinel", *self.extra_args]


class SentinelGroup(StopOnExit):
    """A master, ``replicas`` replicas and ``sentinels`` sentinels of one service."""

    def __init__(
        self, master: RedisNode, replicas: list[RedisNode], sentinels: list[SentinelProcess]
    ) -> None:
        self.service = sentinels[0].service
        self.servers = [master, *replicas]
        self.sentinels = sentinels

    @classmethod
    def start(
        cls,
        *,
        service: str = "mymaster",
        replicas: int = 1,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 4000,
        extra_args: Iterable[str] = (),
        server: str | None = None,
        timeout: float = 20.0,
        ports: Sequence[int] | None = None,
    ) -> SentinelGroup:
        """Start the master, its replicas (in sync), then the sentinels, and wait until every
        sentinel knows the replicas and the other sentinels (so a failover can be elected).

        ``ports``: the ports to use, master first, then the replicas, then the sentinels
        (``1 + replicas + sentinels`` of them; default: free ports). A wrong count is a
        ``ValueError`` and a port in use an ``OSError``, before anything starts."""
        what = f"1 master, {replicas} replicas, {sentinels} sentinels"
        fixed: list[int | None] = [None] * (1 + replicas + sentinels)
        if ports is not None:
            fixed = list(chosen_ports(ports, len(fixed), what))
        started: list[RedisNode] = []
        try:
            master = RedisNode(port=fixed[0], extra_args=extra_args, server=server).start()
            started.append(master)
            copies = []
            for i in range(replicas):
                follow = ["--replicaof", HOST, str(master.port), *extra_args]
                copies.append(
                    RedisNode(port=fixed[1 + i], extra_args=follow, server=server).start()
                )
                started.append(copies[-1])
            assert master.port is not None
            watchers: list[SentinelProcess] = []
            for i in range(sentinels):
                watcher = SentinelProcess(
                    master.port,
                    service,
                    quorum=sentinels // 2 + 1,
                    down_after_ms=down_after_ms,
                    failover_timeout_ms=failover_timeout_ms,
                    server=server,
                    port=fixed[1 + replicas + i],
                )
                watcher.start()
                watchers.append(watcher)
                started.append(watcher)
            group = cls(master, copies, watchers)
            group._wait_ready(timeout)
            return group
        except BaseException:
            for node in started:
                node.stop()
            raise

    # -- what tests use

    @property
    def sentinel_urls(self) -> list[str]:
        return [s.sentinel_url for s in self.sentinels]

    def node_setting(self, **extra: Any) -> dict[str, Any]:
        """The ``NODES`` entry of this service: ``{"SENTINELS": [...], "SERVICE": ...}``."""
        return {"SENTINELS": self.sentinel_urls, "SERVICE": self.service, **extra}

    def master_address(self) -> tuple[str, int] | None:
        """What the first answering sentinel names as the master (``SENTINEL MASTER``, as
        redis-py and the lock engine read it), or None. During a failover the leader's
        ``GET-MASTER-ADDR-BY-NAME`` names the promoted replica a moment before that view
        switches to it; this waits for the switch."""
        for watcher in self.sentinels:
            if not watcher.is_running or watcher.is_paused:
                continue
            try:
                state = watcher.client(decode_responses=True).sentinel_master(self.service)
            except Exception:  # a sentinel that is down: ask the next
                continue
            if isinstance(state, dict):
                return str(state["ip"]), int(state["port"])
        return None

    @property
    def master(self) -> RedisNode:
        """The server the sentinels name as master now."""
        address = self.master_address()
        for node in self.servers:
            if address is not None and node.port == address[1]:
                return node
        raise RedisNodeError(f"no server of the group is the master the sentinels name: {address}")

    def wait_replicated(self, timeout: float = 5.0) -> None:
        """Block until every replica has acknowledged every write the master has taken so far
        (``WAIT``). A replica reported "online" may still not be streaming: Redis starts the
        command stream after the replica's first ``REPLCONF ACK``, up to a second later."""
        replicas = len(self.servers) - 1
        client = self.master.client()
        try:
            acked = client.execute_command("WAIT", replicas, int(timeout * 1000))
        finally:
            client.close()
        if int(acked) < replicas:
            raise RedisNodeError(f"{acked} of {replicas} replicas acknowledged within {timeout} s")

    def kill_master(self) -> RedisNode:
        """SIGKILL the current master; returns it (it stays down until restarted)."""
        node = self.master
        node.kill()
        return node

    def wait_failover(self, old: RedisNode, timeout: float = 30.0) -> RedisNode:
        """Wait until the sentinels name another server than ``old`` and it is a writable
        master; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            address = self.master_address()
            if address is not None and address[1] != old.port:
                node = self.master
                if node.client(decode_responses=True).info("replication")["role"] == "master":
                    return node
            time.sleep(0.05)
        raise RedisNodeError(f"no failover away from {old!r} within {timeout} s")

    def stop(self) -> None:
        for node in [*self.sentinels, *self.servers]:
            node.stop()

    def __enter__(self) -> SentinelGroup:
        return self

    # -- internals

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        replicas, others = len(self.servers) - 1, len(self.sentinels) - 1
        while time.monotonic() < deadline:
            if self._in_sync(replicas) and all(
                self._knows(watcher, replicas, others) for watcher in self.sentinels
            ):
                self.wait_replicated(max(0.1, deadline - time.monotonic()))
                return
            time.sleep(0.1)
        raise RedisNodeError(f"the sentinel group did not settle within {timeout} s")

    def _in_sync(self, replicas: int) -> bool:
        info = self.servers[0].client(decode_responses=True).info("replication")
        online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return len([r for r in online if r.get("state") == "online"]) >= replicas

    def _knows(self, watcher: SentinelProcess, replicas: int, others: int) -> bool:
        try:
            state = watcher.client(decode_responses=True).execute_command(
                "SENTINEL", "MASTER", self.service
            )
        except Exception:
            return False
        if isinstance(state, list):  # RESP2: a flat list of names and values
            state = dict(zip(state[::2], state[1::2], strict=False))
        fields = state
        return (
            int(fields.get("num-slaves", 0)) >= replicas
            and int(fields.get("num-other-sentinels", 0)) >= others
        )
