"""A small TCP proxy in front of one Redis node, for per-client network faults.

``tc netem`` does not exist on the test machines, so a client gets its own partition by
pointing an alias's ``NODES`` at proxies (``proxy.url``) instead of at the nodes. Each proxy
runs an asyncio loop in a daemon thread, listens on a free loopback port and forwards to one
node. Its mode can be switched at runtime (``proxy.set(mode, delay_ms=...)``):

- ``pass``: forward both ways;
- ``delay``: forward both ways, each chunk ``delay_ms`` late (order kept), so a round trip
  costs twice that;
- ``blackhole``: accept connections and data but forward nothing while it lasts (a partition
  that drops packets: the client only learns by timing out). Like TCP retransmission after a
  partition heals, what was held back is delivered, in order, once the mode changes;
- ``reset``: abort every open connection (RST) and every new one at once;
- ``drop-replies``: forward requests to the node but swallow its replies (the node executes
  the command, the client never hears of it). TCP never loses bytes on a live connection, so
  when the mode changes again every connection that lost a reply is aborted (as a real stack
  does once retransmissions give up); keeping it would pair later replies with lost ones.

Counters (``forwarded``, ``swallowed``, ``resets``) let a test assert that its fault bit.

The proxy runs in a child process (started with ``spawn``) and is steered over a pipe, so its
sockets never live in the test process: an asyncio socket that the interpreter tears down
late would otherwise surface there as an unraisable ``ResourceWarning`` in some later test.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from tests.support.processes import PROCESSES

MODES = ("pass", "delay", "blackhole", "reset", "drop-replies")


@dataclass
class Counters:
    connections: int = 0
    forwarded: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    swallowed: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    resets: int = 0


class Proxy:
    """Forwards ``127.0.0.1:<port>`` to ``host:upstream_port``; see the module docstring."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.port = 0
        self._pipe: Connection | None = None
        self._process: BaseProcess | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> Proxy:
        context = PROCESSES
        self._pipe, child_end = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(self.upstream_port, self.host, child_end), daemon=True,
            name=f"proxy->{self.upstream_port}",
        )  # fmt: skip
        self._process.start()
        child_end.close()
        self.port = self._ask(("start",))
        return self

    def close(self) -> None:
        if self._process is None or self._pipe is None:
            return
        with contextlib.suppress(Exception):
            self._ask(("stop",), timeout=10.0)
        self._pipe.close()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._process = self._pipe = None

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def counters(self) -> Counters:
        """A snapshot of the proxy's counters."""
        counters: Counters = self._ask(("counters",))
        return counters

    def set(self, mode: str, delay_ms: float = 0.0) -> None:
        """Switch mode; ``reset`` also aborts every open connection."""
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}; one of {MODES}")
        self._ask(("set", mode, delay_ms))

    def _ask(self, command: tuple[Any, ...], timeout: float = 10.0) -> Any:
        if self._pipe is None:
            raise RuntimeError("the proxy is not running")
        self._pipe.send(command)
        if not self._pipe.poll(timeout):
            raise TimeoutError(f"the proxy did not answer {command[0]!r} in {timeout} s")
        return self._pipe.recv()


def _serve(upstream_port: int, host: str, pipe: Connection) -> None:
    """The child process: run the forwarder until told to stop or the parent goes away."""
    asyncio.run(_Forwarder(upstream_port, host).serve(pipe))


class _Forwarder:
    """The proxy itself, in the child process's event loop."""

    def __init__(self, upstream_port: int, host: str) -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.mode = "pass"
        self.delay = 0.0
        self.counters = Counters()
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._lossy: set[asyncio.StreamWriter] = set()
        self._closing = False

    async def serve(self, pipe: Connection) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                command, *args = await loop.run_in_executor(None, pipe.recv)
            except (EOFError, OSError):  # the test process is gone
                await self._stop()
                return
            if command == "start":
                await self._start()
                pipe.send(self.port)
            elif command == "set":
                await self._set(*args)
                pipe.send(None)
            elif command == "counters":
                pipe.send(self.counters)
            elif command == "stop":
                await self._stop()
                pipe.send(None)
                return

    async def _set(self, mode: str, delay_ms: float) -> None:
        self.delay = delay_ms / 1000.0
        self.mode = mode
        if mode == "reset":
            await self._abort_all()
        elif mode != "drop-replies":
            await self._abort_lossy()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        """Close every socket and let each connection's task end (cancel what outlives 3 s)."""
        self._closing = True
        self.mode = "pass"  # a sender waiting out a blackhole lets go
        if self._server is not None:
            self._server.close()
        await self._abort_all(count=False)
        deadline = time.monotonic() + 3.0
        while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            if time.monotonic() >= deadline:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                break
            await asyncio.wait(tasks, timeout=deadline - time.monotonic())
            await self._abort_all(count=False)

    async def _abort_lossy(self) -> None:
        for writer in list(self._lossy):
            self.counters.resets += 1
            writer.transport.abort()
        self._lossy.clear()

    async def _abort_all(self, count: bool = True) -> None:
        for writer in list(self._writers):
            if count:
                self.counters.resets += 1
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counters.connections += 1
        if self._closing or self.mode == "reset":
            self.counters.resets += not self._closing
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        except asyncio.CancelledError:
            writer.transport.abort()
            raise
        if self._closing:
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer, "up", writer)),
            asyncio.ensure_future(self._pump(up_reader, writer, "down", writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the proxy shuts down and cancels this task: close both sockets
            for pump in pumps:
                pump.cancel()
            for w in (writer, up_writer):
                self._writers.discard(w)
                self._lossy.discard(w)
                w.transport.abort()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: str,
        client: asyncio.StreamWriter,
    ) -> None:
        """Copy chunks; each is judged by the mode when it arrives, and delayed or held chunks
        keep their order (a queue drained by one sender, which waits out a blackhole)."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def send() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                while self.mode == "blackhole":
                    await asyncio.sleep(0.01)
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(65536):
                if self.mode == "drop-replies" and direction == "down":
                    self.counters.swallowed[direction] += 1
                    self._lossy.add(client)
                    continue
                if self.mode == "blackhole":
                    self.counters.swallowed[direction] += 1  # held back, delivered on heal
                else:
                    self.counters.forwarded[direction] += 1
                delay = self.delay if self.mode == "delay" else 0.0
                queue.put_nowait((time.monotonic() + delay, data))
                if sender.done():
                    return
        except (OSError, asyncio.IncompleteReadError):
            return
        finally:
            queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sender, 1.0)
