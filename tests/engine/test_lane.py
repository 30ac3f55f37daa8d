"""The single-node lane against a real redis-server: it is the path a free lock takes, and
everything it does not settle itself (a busy name, a paused node, a connection the server
closed, scripts flushed) still comes out as the general path's would."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import pytest

from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.locking.manager import LockManager
from tests.support.waiting import until


def test_a_free_lock_takes_the_lane_and_a_busy_one_the_plan(
    one_node: tuple[Any, LockManager], plan_calls: dict[str, int]
) -> None:
    _, manager = one_node
    manager.acquire("warm", timeout=0).release()  # a new node joins through the plan's rejoin
    plan_calls.update(acquire=0, release=0)
    first = manager.acquire("lane", timeout=0)
    assert plan_calls == {"acquire": 0, "release": 0}
    with pytest.raises(LockNotAcquired):
        manager.acquire("lane", timeout=0)
    assert plan_calls["acquire"] == 1  # the busy reply is the plan's to decide
    assert first.release() is True
    second = manager.acquire("lane", timeout=0)
    assert second.token > first.token
    assert second.release() is True
    assert plan_calls == {"acquire": 1, "release": 0}


def test_a_paused_node_times_the_lane_out_and_its_late_grant_is_given_back(
    one_node: tuple[Any, LockManager],
) -> None:
    """The attempt times out (NODE_TIMEOUT), the plan sends the give-back behind it on the
    same connection, and once the node resumes it runs both: no key is left, and the next
    lock reads the replies in order and works."""
    nodes, manager = one_node
    held = manager.acquire("warm", timeout=0)
    held.release()
    nodes[0].pause()
    try:
        started = time.monotonic()
        with pytest.raises(NodesUnavailable):
            manager.acquire("paused", timeout=0)
        assert time.monotonic() - started < 5.0
    finally:
        nodes[0].resume()
    client = nodes[0].client()
    key = f"{manager.config.key_prefix}paused"
    until(lambda: client.exists(key) == 0, 5, "the late grant was given back")
    lease = manager.acquire("paused", timeout=0)
    assert lease.token > held.token + 1  # the late grant drew a token too
    assert lease.release() is True


def test_a_connection_the_server_closed_is_replaced(one_node: tuple[Any, LockManager]) -> None:
    nodes, manager = one_node
    manager.acquire("closed", timeout=0).release()
    killed = nodes[0].client().client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1
    lease = manager.acquire("closed", timeout=0)
    assert lease.release() is True


def test_flushed_scripts_are_sent_in_full(
    one_node: tuple[Any, LockManager], plan_calls: dict[str, int]
) -> None:
    nodes, manager = one_node
    manager.acquire("flushed", timeout=0).release()
    plan_calls.update(acquire=0, release=0)
    nodes[0].client().script_flush()
    lease = manager.acquire("flushed", timeout=0)  # NOSCRIPT, then EVAL
    nodes[0].client().script_flush()
    assert lease.release() is True
    assert plan_calls == {"acquire": 0, "release": 0}
    assert nodes[0].client().exists(f"{manager.config.key_prefix}flushed") == 0


class Interrupted(Exception):
    """What the tests' signal handler raises (as a worker timeout would)."""


@pytest.mark.parametrize("count", [1, 3], ids=["lane", "three nodes"])
def test_a_call_interrupted_as_it_is_written_never_shifts_the_replies(
    redis_node_factory: Any, redlock_alias: Any, count: int
) -> None:
    """CPython's sendall runs signal handlers once the bytes are out: a handler that raises
    there used to leave the call on the wire with no place for its reply, so every later call
    on that connection read the reply of the one before (a TypeError, another call's token, a
    lock granted twice). Now the connection is dropped: the next calls read their own."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, NODE_TIMEOUT=1.0, TTL=30)
    warm = manager.acquire("warm", timeout=0)
    link = warm.record.pinned.links[0]
    warm.release()
    real = link.output

    def write_then_raise(data: bytes) -> None:
        link.output = real
        real(data)
        raise Interrupted

    link.output = write_then_raise
    with pytest.raises(Interrupted):
        manager.acquire("x", timeout=0)
    tokens = []
    for name in ("y", "z", "w"):
        lease = manager.acquire(name, timeout=0)
        tokens.append(lease.token)
        assert lease.release() is True
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    client = nodes[0].client()
    prefix = manager.config.key_prefix
    assert [client.exists(f"{prefix}{name}") for name in ("y", "z", "w")] == [0, 0, 0]


@pytest.mark.parametrize("count", [1, 3], ids=["lane", "three nodes"])
def test_a_call_interrupted_while_it_waits_gives_its_grant_back(
    redis_node_factory: Any, redlock_alias: Any, count: int
) -> None:
    """A signal handler raises while the attempt waits for a paused node: the give-back goes
    out behind the attempt on the same connection, so once the node resumes no key is left,
    and the calls after it read their own replies."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, NODE_TIMEOUT=5.0, TTL=30)
    before = manager.acquire("warm", timeout=0)
    before.release()

    def alarm(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, alarm)
    for node in nodes:
        node.pause()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted):
            manager.acquire("x", timeout=0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for node in nodes:
            node.resume()
    key = f"{manager.config.key_prefix}x"
    until(lambda: all(node.client().exists(key) == 0 for node in nodes), 5, "the grant given back")
    lease = manager.acquire("x", timeout=0)
    assert lease.token > before.token
    assert lease.release() is True


class _InterruptingSocket:
    """A socket whose next ``recv_into`` raises once it has read bytes: what CPython does when
    a signal handler raises at the check right after the call returned."""

    def __init__(self, real: Any) -> None:
        self.real, self.armed = real, True

    def recv_into(self, buffer: Any, *args: Any) -> int:
        count: int = self.real.recv_into(buffer, *args)
        if self.armed and count > 0:
            self.armed = False
            raise Interrupted
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.parametrize("count", [1, 3], ids=["lane", "three nodes"])
def test_a_reply_interrupted_as_it_is_read_drops_the_connection(
    redis_node_factory: Any, redlock_alias: Any, count: int
) -> None:
    """An interrupt between reading a reply's bytes and handing them to the parser used to
    lose them and keep the connection: every later reply then answered the call before (on
    one node no call succeeded again). Now the connection is dropped and the next call
    connects afresh."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, NODE_TIMEOUT=0.5, TTL=20)
    other = redlock_alias(nodes, NODE_TIMEOUT=0.5, TTL=20, KEY_PREFIX=manager.config.key_prefix)
    held = other.acquire("held", timeout=0)
    warm = manager.acquire("warm", timeout=0)
    channel = warm.record.pinned
    warm.release()
    for link in channel.links:
        link._sock = _InterruptingSocket(link._sock)
    with pytest.raises(Interrupted):
        manager.acquire("x", timeout=0)
    for link in channel.links:
        if isinstance(link._sock, _InterruptingSocket):
            link._sock = link._sock.real
    for i in range(3):
        with pytest.raises(LockNotAcquired):
            manager.acquire("held", timeout=0)
        lease = manager.acquire(f"n{i}", timeout=0)
        assert lease.release() is True
    assert held.release() is True


def test_no_number_reaches_hiredis_packing(
    one_node: tuple[Any, LockManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    """hiredis turns numbers to text itself and crashes the process (SIGSEGV) when a signal
    handler raises during that conversion: every command is packed from text only (lock,
    lane, waits piped behind a BLPOP, lock_many, semaphores, read-write, extend)."""
    import hiredis

    real = hiredis.pack_command
    seen: list[tuple[Any, ...]] = []

    def checked(command: tuple[Any, ...]) -> bytes:
        # redis-py's own connection handshake (HELLO 3, CLIENT SETINFO) is its business
        if str(command[0]).strip("b'").upper() not in ("HELLO", "CLIENT", "AUTH", "SELECT"):
            seen.append(command)
            assert all(type(a) in (str, bytes) for a in command), command
        return real(command)

    monkeypatch.setattr(hiredis, "pack_command", checked)
    _, manager = one_node
    lease = manager.acquire("n", timeout=0)
    lease.extend()
    woken = threading.Timer(0.2, lease.release)
    woken.start()
    manager.acquire("n", timeout=2).release()  # waits: BLPOP piped with its attempt
    woken.join()
    with manager.lock_many(["a", "b"], timeout=0):
        pass
    with manager.semaphore("s", 2, timeout=0), manager.read_lock("r", timeout=0):
        pass
    assert len(seen) > 8


def test_an_interrupt_while_packing_raises_instead_of_crashing(tmp_path: Any) -> None:
    """A storm of raising SIGALRM handlers while the transport packs a lock call: the
    process gets the handler's exceptions, never a crash (hiredis packing numbers itself
    dies with SIGSEGV here)."""
    import subprocess

    script = tmp_path / "storm.py"
    script.write_text(
        "import signal\n"
        "from django_redlock.engine.replies import Call\n"
        "from django_redlock.engine.scripts import ACQUIRE\n"
        "from django_redlock.engine.transport.base import pack\n"
        "class Boom(BaseException): pass\n"
        "armed = False\n"
        "def handler(signum, frame):\n"
        "    global armed\n"
        "    if armed:\n"
        "        armed = False\n"
        "        raise Boom\n"
        "signal.signal(signal.SIGALRM, handler)\n"
        "call = Call(ACQUIRE, ('k', 'f', 'w', 'h'), ('o', 30000, 'r', '|1|h|1', 1000, '0', ''))\n"
        "caught = 0\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.0001)\n"
        "for _ in range(300000):\n"
        "    try:\n"
        "        armed = True  # the handler raises once, and only in here\n"
        "        pack(call.packed_args(by_sha=True))\n"
        "        armed = False\n"
        "    except Boom:\n"
        "        caught += 1\n"
        "signal.setitimer(signal.ITIMER_REAL, 0)\n"
        "print(caught)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    assert int(done.stdout) > 0  # the storm did interrupt it


def test_a_second_reconnect_keeps_the_first_connection(
    redis_node_factory: Any, redlock_alias: Any
) -> None:
    """A dropped link is reconnected inline (``revive``) and in the background (``usable``),
    one after the other under the link's mutex. The second used to connect again and replace
    the first connection without closing it: its socket was left to the garbage collector (an
    unclosed-socket warning in whatever test ran then). Now it finds the link connected."""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, NODE_TIMEOUT=1.0)
    warm = manager.acquire("warm", timeout=0)
    link = warm.record.pinned.links[0]
    warm.release()
    link._drop()
    assert link.connect_detached() is True
    first = link._sock
    assert link.connect_detached() is True
    assert link._sock is first
    assert first.fileno() != -1
    manager.acquire("after", timeout=0).release()
