"""``RedisNode``: one ``redis-server`` process on a loopback port or a unix socket.

It starts without persistence unless asked, and can be paused (SIGSTOP), resumed, killed
(SIGKILL), restarted on the same address and stopped; :mod:`.processes` stops it at exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from django_redlock.testing.processes import death_signal_hook, register, unregister
from django_redlock.testing.server import PERSISTENCE_MODES, find_redis_server, server_command
from django_redlock.testing.wire import HOST, free_port, raw_command, wait_port_free

if TYPE_CHECKING:
    import redis

START_TIMEOUT = 10.0
STOP_GRACE = 5.0
_LOG_NAME = "redis.log"
_SOCKET_NAME = "redis.sock"
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on macOS


class RedisNodeError(RuntimeError):
    """A node did not start, or was used in a state that does not allow it."""


class StopOnExit:
    """``with`` support: ``__exit__`` calls ``stop()``."""

    def stop(self) -> None:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class RedisNode(StopOnExit):
    """One ``redis-server`` process on a loopback port or a unix socket."""

    def __init__(
        self,
        *,
        port: int | None = None,
        unix: bool = False,
        persistence: str | None = None,
        extra_args: Iterable[str] = (),
        base_dir: str | os.PathLike[str] | None = None,
        server: str | None = None,
        choose_port: Callable[[], int] = free_port,
    ) -> None:
        """``choose_port``: how a node without a fixed ``port`` picks one (again on a clash at
        its first start): a free loopback port by default."""
        if persistence not in PERSISTENCE_MODES:
            raise ValueError(f"persistence must be None, 'aof' or 'rdb', not {persistence!r}")
        if unix and port is not None:
            raise ValueError("a unix-socket node has no TCP port")
        self.persistence = persistence
        self.extra_args = tuple(extra_args)
        self.server = server or find_redis_server()
        self._fixed_port = port is not None
        self._choose_port = choose_port
        self.port: int | None = port
        if base_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="redlock-node-"))
            self._own_dirs = [self.data_dir]
        else:
            Path(base_dir).mkdir(parents=True, exist_ok=True)
            self.data_dir = Path(tempfile.mkdtemp(prefix="node-", dir=base_dir))
            self._own_dirs = []
        self.unix_socket: str | None = None
        if unix:
            sock_path = self.data_dir / _SOCKET_NAME
            if len(str(sock_path)) > _MAX_SOCKET_PATH:
                short = Path(tempfile.mkdtemp(prefix="redlock-sock-"))
                self._own_dirs.append(short)
                sock_path = short / _SOCKET_NAME
            self.unix_socket = str(sock_path)
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._started_once = False
        self._log_offset = 0

    # -- properties

    @property
    def url(self) -> str:
        """The node's redis-py URL (database 0)."""
        if self.unix_socket is not None:
            return f"unix://{self.unix_socket}?db=0"
        if self.port is None:
            raise RedisNodeError("the node has no port yet; start() it first")
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """PID of the running server process, or None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        """True while the process exists (paused counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def is_paused(self) -> bool:
        """True between pause() and resume()."""
        return self.is_running and self._paused

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return self.data_dir / _LOG_NAME

    def __repr__(self) -> str:
        state = "paused" if self.is_paused else "running" if self.is_running else "stopped"
        where = self.url if (self.port or self.unix_socket) else "unstarted"
        return f"<RedisNode {where} pid={self.pid} {state}>"

    # -- lifecycle

    def start(self, timeout: float = START_TIMEOUT) -> RedisNode:
        """Spawn the server and wait until it answers PING."""
        self.spawn()
        self.wait_started(timeout)
        return self

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): connections hang, keys keep expiring on resume."""
        self._send(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """Continue a paused process (SIGCONT)."""
        self._send(signal.SIGCONT)
        self._paused = False

    def kill(self) -> None:
        """Crash the node (SIGKILL) and reap it; data not yet on disk is lost."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
        self.reap(None)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Shut the node down (SIGTERM, SIGKILL after ``grace`` seconds) and remove temp dirs."""
        if self._proc is not None:
            self.signal_stop()
            self.reap(grace)
        for directory in self._own_dirs:
            shutil.rmtree(directory, ignore_errors=True)
        self._own_dirs = []

    def restart(self, keep_data: bool = False, timeout: float = START_TIMEOUT) -> RedisNode:
        """Kill the node if running and start it again on the same address.

        Without ``keep_data`` the data files are deleted first, so it comes back empty (as a
        node that lost its disk); with it, whatever the persistence mode had written survives.
        """
        if not self._started_once:
            raise RedisNodeError("restart() needs a node that was started before")
        self.kill()
        if not keep_data:
            self.wipe_data()
        if self.port is not None:  # wait out a TIME_WAIT or a late listener on the same port
            wait_port_free(self.port, 3.0)
        return self.start(timeout)

    def wipe_data(self) -> None:
        """Delete the node's data files (RDB, AOF); the node must not be running."""
        if self.is_running:
            raise RedisNodeError("wipe_data() on a running node; kill() or stop() it first")
        for entry in self.data_dir.iterdir():
            if entry.name in (_LOG_NAME, _SOCKET_NAME):
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def client(
        self, *, decode_responses: bool = False, socket_timeout: float = 1.0, **kwargs: Any
    ) -> redis.Redis:
        """A redis-py client for this node: short timeouts, no retries (override via kwargs)."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # redis-py >= 6 retries a timed-out call 3 times with backoff by default; a test that
        # pauses a node wants the first timeout to surface.
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        kwargs.setdefault("socket_connect_timeout", socket_timeout)
        if self.unix_socket is not None:
            kwargs.setdefault("unix_socket_path", self.unix_socket)
        else:
            kwargs.setdefault("host", HOST)
            kwargs.setdefault("port", self.port)
        client = redis.Redis(
            decode_responses=decode_responses, socket_timeout=socket_timeout, **kwargs
        )
        # redis-py 8 keeps its connections in reference cycles (event listeners): a client
        # dropped unclosed left its socket to the garbage collector, which may free it before
        # the connection closes it (a ResourceWarning at a random later moment). Its sockets
        # are closed the moment the client itself is dropped.
        weakref.finalize(client, client.connection_pool.disconnect)
        return client

    def ping(self, timeout: float = 0.5) -> bool:
        """True if the node answers PING within ``timeout`` seconds (raw socket, no redis-py)."""
        return self._raw_ping(timeout) == b"+PONG"

    def __enter__(self) -> RedisNode:
        if not self.is_running:
            self.start()
        return self

    # -- internals

    def _command(self) -> list[str]:
        return server_command(
            self.server,
            data_dir=self.data_dir,
            port=self.port,
            unix_socket=self.unix_socket,
            persistence=self.persistence,
            extra_args=self.extra_args,
        )

    def spawn(self) -> None:
        """Start the process without waiting for it (:meth:`start` is this, then
        :meth:`wait_started`; a group spawns all its nodes first)."""
        if self.is_running:
            raise RedisNodeError(f"{self!r} is already running")
        if self._proc is not None:
            self.reap(None)
        if self.unix_socket is None and self.port is None:
            self.port = self._choose_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)  # stop() removed it; start() again
        if self.unix_socket is not None:
            Path(self.unix_socket).parent.mkdir(parents=True, exist_ok=True)
            Path(self.unix_socket).unlink(missing_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                preexec_fn=death_signal_hook(),
                start_new_session=True,  # a terminal's Ctrl-C reaches us, not the nodes directly
            )
        self._paused = False
        register(self, self._proc.pid)

    def wait_started(self, timeout: float) -> None:
        """Wait for PING; on a port clash at first start, retry on a new free port."""
        for attempt in range(5):
            try:
                self._wait_ready(timeout)
            except RedisNodeError as exc:
                retry = (
                    not self._started_once
                    and not self._fixed_port
                    and self.unix_socket is None
                    and "Address already in use" in str(exc)
                    and attempt < 4
                )
                if not retry:
                    raise
                self.port = None
                self.spawn()
            else:
                self._started_once = True
                return

    def _wait_ready(self, timeout: float) -> None:
        """Poll until our own process (checked by its PID, not just any server) answers."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        last = b""
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.reap(None)
                raise RedisNodeError(
                    f"redis-server ({self.server}) exited with status {code} while starting on "
                    f"{self.url}.\n{self._log_tail()}"
                )
            last = self._raw_ping(0.5)
            if last == b"+PONG":
                info = self._raw_command(b"INFO", b"server", timeout=0.5)
                if f"process_id:{self._proc.pid}\r\n".encode() in info:
                    return
                last = b"PONG from another process"
            time.sleep(0.01)
        self.kill()
        raise RedisNodeError(
            f"redis-server ({self.server}) did not answer PING on {self.url} within {timeout} s "
            f"(last reply {last!r}).\n{self._log_tail()}"
        )

    def _raw_ping(self, timeout: float) -> bytes:
        return self._raw_command(b"PING", timeout=timeout).strip()

    def _raw_command(self, *args: bytes, timeout: float) -> bytes:
        """Send one command over a fresh socket; the raw reply, or b"" on any socket error."""
        if self.unix_socket is not None:
            return raw_command(self.unix_socket, *args, timeout=timeout)
        return raw_command((HOST, self.port or 0), *args, timeout=timeout)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return "(no server log)"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"Last lines of {self.log_path}:\n{tail}" if tail else "(server log is empty)"

    def _send(self, signum: int) -> None:
        if not self.is_running or self._proc is None:
            raise RedisNodeError(f"{self!r} is not running")
        self._proc.send_signal(signum)

    def signal_stop(self) -> None:
        """Ask a running process to exit (SIGCONT first if paused)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._paused:
                proc.send_signal(signal.SIGCONT)
            proc.terminate()

    def reap(self, grace: float | None) -> None:
        """Wait for the process (SIGKILL after ``grace`` seconds; None: kill now) and forget it."""
        proc = self._proc
        if proc is None:
            return
        if grace is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            grace = STOP_GRACE
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        self._paused = False
        unregister(proc.pid)
        self._proc = None
