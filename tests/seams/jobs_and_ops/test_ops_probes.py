"""Probes of the operator's tools (docs/admin-and-cli.md, docs/production.md "Managed Redis"):
force-releasing read leases whose holder keeps renewing, ``redlock clear`` while readers come
and go, ``redlock list``/``show`` with hostile names, and the health view on a mixed set of
bad nodes. Real redis-server nodes throughout."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from django_redlock import locks
from django_redlock.exceptions import LockError, LockLost
from django_redlock.locking.manager import LockManager
from django_redlock.management.rendering import printable
from django_redlock.testing import RedisNodes
from tests.seams.helpers import keys_left
from tests.support.redis_acl import ACL_COMMANDS, acl_user_urls


def redlock(*args: str, fail_ok: bool = False) -> str:
    """``manage.py redlock ARGS``'s stdout (with ``fail_ok``, also when it exits 1)."""
    out = StringIO()
    try:
        call_command("redlock", *args, stdout=out, stderr=StringIO())
    except CommandError:
        if not fail_ok:
            raise
    return out.getvalue()


def held_keys(name: str, alias: str) -> list[tuple[str, bytes]]:
    """The keys that hold ``name`` (its own key, its readers or permits), not wake-up lists."""
    return [
        (url, key)
        for url, key in keys_left(name, alias)
        if b"__wake__" not in key and b"__waiters__" not in key
    ]


# -- force-releasing read leases ------------------------------------------------------------
@pytest.mark.parametrize("alias", ["default", "multi"])
def test_force_released_reader_that_keeps_renewing_gets_lock_lost(
    alias: str, unique_name: str
) -> None:
    """A reader renewing its read lease (auto_extend, ttl=1) is force-released with
    ``redlock release``: its renewals must not bring the name back ("it can never mark the
    name 'readers' again"), a writer gets the name at once, and the reader's block ends with
    LockLost."""
    manager = locks[alias]
    entered, stop = threading.Event(), threading.Event()
    outcome: list[object] = []

    def reader() -> None:
        try:
            with manager.read_lock(unique_name, ttl=1.0, timeout=5, auto_extend=True):
                entered.set()
                stop.wait(10)
            outcome.append("clean exit")
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    assert entered.wait(10)
    try:
        text = redlock("release", unique_name, "--using", alias)
        assert "read lease" in text, text
        for _ in range(15):  # 1.5 s: several renewal periods of a 1 s lease
            assert not held_keys(unique_name, alias), "the reader's renewal resurrected its lease"
            time.sleep(0.1)
        writer = manager.acquire(unique_name, rw="write", ttl=2, timeout=0)
        writer.release()
    finally:
        stop.set()
        thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], LockLost), outcome


def test_extend_of_a_force_released_read_lease_raises_lock_lost(unique_name: str) -> None:
    """acquire(rw="read"), then ``redlock release``: the holder's extend() raises LockLost and
    writes nothing; a writer takes the name."""
    manager = locks["multi"]
    lease = manager.acquire(unique_name, rw="read", ttl=5, timeout=0)
    other = manager.acquire(unique_name, rw="read", ttl=5, timeout=0)
    redlock("release", unique_name, "--using", "multi")
    with pytest.raises(LockLost):
        lease.extend()
    with pytest.raises(LockLost):
        other.extend(10)
    assert not held_keys(unique_name, "multi")
    manager.acquire(unique_name, rw="write", ttl=2, timeout=0).release()
    assert lease.release() is False


def test_clear_while_readers_churn(unique_name: str) -> None:
    """Four threads take and drop read leases of three names in a loop while ``redlock clear
    --prefix`` runs over and over: clear never fails, readers only ever see LockLost (a read
    lease cleared under them) or LockNotAcquired, never another error; once they stop nothing
    is left and a writer takes every name."""
    manager = locks["multi"]
    prefix = f"churn-{uuid.uuid4().hex[:6]}:"
    names = [f"{prefix}{i}" for i in range(3)]
    stop = threading.Event()
    bad: list[BaseException] = []
    counts = {"ok": 0, "lost": 0}

    def churn(seed: int) -> None:
        i = seed
        while not stop.is_set():
            name = names[i % len(names)]
            i += 1
            try:
                with manager.read_lock(name, ttl=2.0, timeout=0.5):
                    time.sleep(0.005)
                counts["ok"] += 1
            except LockLost:
                counts["lost"] += 1
            except LockError as exc:
                if type(exc).__name__ != "LockNotAcquired":
                    bad.append(exc)
            except BaseException as exc:
                bad.append(exc)

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    cleared: list[str] = []
    try:
        for _ in range(15):
            try:
                cleared.append(redlock("clear", "--prefix", prefix, "--using", "multi", "--yes"))
            except CommandError as exc:
                bad.append(exc)
            time.sleep(0.02)
    finally:
        stop.set()
        for thread in threads:
            thread.join(20)
    assert not bad, bad[:5]
    assert counts["ok"] > 0
    print(cleared)
    assert all(text.startswith("Released") for text in cleared), cleared
    final = redlock("clear", "--prefix", prefix, "--using", "multi", "--yes")
    assert "Left" not in final, final
    for name in names:
        assert not held_keys(name, "multi"), name
        manager.acquire(name, rw="write", ttl=1, timeout=0).release()


# -- hostile names in list/show -------------------------------------------------------------
HOSTILE = (
    [chr(c) for c in range(0x00, 0x20)]
    + ["\x7f"]
    + [chr(c) for c in range(0x80, 0xA0)]
    + ["\u200e", "\u200f", "\u061c", "\u2028", "\u2029", "\u00ad", "\u200b", "\ufeff"]
    + [chr(c) for c in range(0x202A, 0x202F)]
    + [chr(c) for c in range(0x2066, 0x206A)]
    + ["\U000e0001", "\U000e0041", "\\"]
)


def _unprintable(text: str) -> list[str]:
    return sorted({repr(ch) for ch in text if ch != "\n" and not ch.isprintable()})


def test_list_and_show_escape_every_control_and_bidi_character() -> None:
    """A lock per hostile character (C0, DEL, C1, bidi marks/embeddings/isolates, separators,
    soft hyphen, zero-width, BOM, tag characters, backslash) plus a 512-character name: `list`
    prints one line per lock and no character repr() would escape; `show` likewise; `list
    --json` gives back every exact name."""
    run = uuid.uuid4().hex[:6]
    prefix = f"evil{run}:"
    names = [f"{prefix}{i:03d}:a{ch}b" for i, ch in enumerate(HOSTILE)]
    long_name = f"{prefix}999:" + "\u202e\x1b[2J" * 10
    long_name += "x" * (512 - len(long_name))
    names.append(long_name)
    manager = locks["default"]
    leases = [manager.acquire(name, ttl=30, timeout=0) for name in names]
    try:
        table = redlock("list", "--using", "default", "--prefix", prefix)
        assert _unprintable(table) == []
        lines = [line for line in table.splitlines() if line.strip()]
        assert len(lines) == len(names) + 1, lines[:3]
        for name in names:  # (that the escapes read back is test_escaped_name_read_back_...)
            escaped = printable(name)
            assert escaped.encode("ascii").decode("unicode_escape") == name
            assert sum(escaped in line for line in lines) >= 1, escaped
        listed = json.loads(redlock("list", "--using", "default", "--prefix", prefix, "--json"))
        assert sorted(row["name"] for row in listed) == sorted(names)
        for name in names:
            shown = redlock("show", name, "--using", "default")
            assert _unprintable(shown) == [], (repr(name), _unprintable(shown))
            doc = json.loads(redlock("show", name, "--using", "default", "--json"))
            assert doc["name"] == name
    finally:
        for lease in leases:
            lease.release()


def test_release_and_error_lines_quote_hostile_names(capsys: pytest.CaptureFixture[str]) -> None:
    """`release` of a hostile name and the "not held" error print it with repr(): no raw
    escape reaches stdout or stderr."""
    name = f"rel{uuid.uuid4().hex[:6]}:\x1b]0;pwned\x07\u202e\r\n"
    locks["default"].acquire(name, ttl=30, timeout=0)
    out, err = StringIO(), StringIO()
    call_command("redlock", "release", name, stdout=out, stderr=err)
    assert _unprintable(out.getvalue() + err.getvalue()) == []
    with pytest.raises(CommandError) as error:
        call_command("redlock", "release", name, stdout=out, stderr=err)
    assert _unprintable(str(error.value)) == []


# -- the health view over a mix of bad nodes ---------------------------------------------------
@pytest.mark.django_db
@pytest.mark.urls("tests.support.health_urls")
def test_health_with_evicting_replica_paused_and_info_refusing_nodes(
    client: Client,
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """Five nodes behind the documented ACL user: one fine, one allkeys-lru, one replica, one
    paused (SIGSTOP), one whose user is refused INFO. At most two can vote, so 503, and every
    bad node is named; the view answers (no 500, no hang), and so does `redlock nodes`."""
    good = redis_node_factory(2)
    evicting = redis_node_factory(1, extra_args=("--maxmemory-policy", "allkeys-lru"))
    rest = redis_node_factory(2)
    nodes = RedisNodes([good[0], evicting[0], good[1], rest[0], rest[1]])
    urls = acl_user_urls(nodes, "locker", "pa55word", "mix:")
    # node 4: the same user without +info (a managed service that disables INFO)
    rest[1].client().execute_command("ACL", "SETUSER", "locker", "-info")
    manager = redlock_alias(urls, KEY_PREFIX="mix:", NODE_TIMEOUT=0.05)
    good[1].client().replicaof("127.0.0.1", good[0].port)
    rest[0].pause()
    try:
        response = client.get("/health/", {"alias": manager.alias})
        assert response.status_code == 503, response.content
        body = response.json()["aliases"][0]
        problems = body["problems"]
        assert "node 1 has maxmemory-policy allkeys-lru" in problems, problems
        assert "node 2 is a replica" in problems, problems
        assert "node 3 unreachable" in problems, problems
        assert any(p.startswith("node 4") for p in problems), problems
        assert body["voting"] <= 1, body
        rows = json.loads(redlock("nodes", "--using", manager.alias, "--json", fail_ok=True))
        assert [r["up"] for r in rows] == [True, True, True, False, True], rows
        assert rows[1]["evicts"] is True and rows[2]["role"] == "slave"
    finally:
        rest[0].resume()


@pytest.mark.django_db
@pytest.mark.urls("tests.support.health_urls")
def test_health_with_a_quorum_left_is_200_and_names_the_rest(
    client: Client,
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """Three good nodes of five (after a lock, so run ids are marked), one allkeys-lru behind
    the ACL user, one paused: 200 (a quorum votes), problems name the two others."""
    good = redis_node_factory(3)
    evicting = redis_node_factory(1, extra_args=("--maxmemory-policy", "allkeys-lru"))
    paused = redis_node_factory(1)
    nodes = RedisNodes([good[0], evicting[0], good[1], paused[0], good[2]])
    manager = redlock_alias(
        acl_user_urls(nodes, "locker", "pa55word", "q:"), KEY_PREFIX="q:", NODE_TIMEOUT=0.05
    )
    manager.acquire("warm", ttl=1, timeout=1).release()
    paused[0].pause()
    try:
        response = client.get("/health/", {"alias": manager.alias})
        body = response.json()["aliases"][0]
        assert response.status_code == 200, body
        assert body["voting"] == 3
        assert body["problems"] == [
            "node 1 has maxmemory-policy allkeys-lru",
            "node 3 unreachable",
        ]
    finally:
        paused[0].resume()


def test_a_user_without_info_locks_and_health_agree(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """One node whose user has every documented command but INFO (and CONFIG): records
    whether locking works and what the health reading says; they must not contradict each
    other silently (a lock that works on a node the health check calls unusable, or the
    reverse, is reported by this probe)."""
    from django_redlock.contrib.health.report import statuses

    nodes = redis_node_factory(1)
    commands = " ".join(c for c in ACL_COMMANDS.split() if c != "+info")
    manager = redlock_alias(acl_user_urls(nodes, "noinfo", "pw", "ni:", commands), KEY_PREFIX="ni:")
    try:
        manager.acquire("x", ttl=2, timeout=0).release()
        locked: object = "ok"
    except Exception as exc:
        locked = exc
    (status,) = statuses([manager.alias])
    print("lock:", repr(locked), "healthy:", status.healthy, status.problems())
    assert (locked == "ok") == status.healthy, (locked, status.problems())


def test_a_node_refusing_info_is_not_called_unreachable(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """A node that answers but whose user is refused INFO: `redlock nodes` reads it as up
    (with the refusal in ``error``) and check --deploy warns W006, not W005 ("cannot be
    reached"); the health report must not name it "unreachable", which docs/production.md
    keeps for a node that "does not answer within the probe's socket timeout"."""
    from django_redlock.contrib.health.report import statuses

    nodes = redis_node_factory(1)
    commands = " ".join(c for c in ACL_COMMANDS.split() if c != "+info")
    manager = redlock_alias(acl_user_urls(nodes, "noinfo", "pw", "ni:", commands), KEY_PREFIX="ni:")
    rows = json.loads(redlock("nodes", "--using", manager.alias, "--json", fail_ok=True))
    print(rows)
    (status,) = statuses([manager.alias])
    print(status.problems())
    assert not status.healthy
    assert rows[0]["up"] is True
    assert all("unreachable" not in p for p in status.problems()), (status.problems(), rows)


@pytest.mark.parametrize(
    "char",
    ["\x1b", "\x07", "\x7f", "\u202e", "\u2028", "\x9b", "\x85", "\xa0", "\xad"],
    ids=["ESC", "BEL", "DEL", "RLO", "LSEP", "CSI-C1", "NEL-C1", "NBSP", "SHY"],
)
def test_escaped_name_read_back_by_bash_names_the_same_lock(char: str) -> None:
    """docs/admin-and-cli.md: "The escaped text is what bash's $'...' quoting reads back:
    redlock show $'order:\\x1b]0;...'". The name as `redlock list` prints it, pasted into
    bash's $'...' and run as `manage.py redlock show`, shows that lock (exit 0)."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    from tests.jobs.test_celery import ROOT

    prefix = f"bash{uuid.uuid4().hex[:6]}:"
    name = f"{prefix}a{char}b"
    lease = locks["default"].acquire(name, ttl=60, timeout=0)
    try:
        table = redlock("list", "--using", "default", "--prefix", prefix)
        [row] = [line for line in table.splitlines()[1:] if line.strip()]
        printed = row.split()[1]
        assert printed.startswith(prefix), row
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
            "REDLOCK_JSON": json.dumps(settings.REDLOCK),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }
        script = f"exec {sys.executable} manage.py redlock show $'{printed}' --json"
        done = subprocess.run(
            ["bash", "-c", script], env=env, cwd=ROOT, capture_output=True, timeout=60
        )
        assert done.returncode == 0, (printed, done.stdout[-300:], done.stderr[-300:])
        assert json.loads(done.stdout)["name"] == name
    finally:
        lease.release()


@pytest.mark.parametrize(
    "args",
    [
        ("show", "x\udc9b"),
        ("show", "x\udc9b", "--json"),
        ("release", "x\udc9b"),
        ("list", "--prefix", "x\udc9b"),
        ("clear", "--prefix", "x\udc9b", "--yes"),
    ],
    ids=["show", "show-json", "release", "list-prefix", "clear-prefix"],
)
def test_a_name_that_is_not_utf8_is_one_error_line(args: tuple[str, ...]) -> None:
    """A command-line name with bytes that are not UTF-8 (Python's argv gives lone surrogates:
    `redlock show $'x\\x9b'`) is refused like any bad name: a CommandError (one line, exit
    status 1), not a UnicodeEncodeError traceback from the Redis client."""
    try:
        redlock(*args, "--using", "default")
    except CommandError as exc:
        assert "\n" not in str(exc).strip()
    except Exception as exc:
        pytest.fail(f"redlock {args[0]} raised {type(exc).__name__}: {exc}")
