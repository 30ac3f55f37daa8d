"""``manage.py redlock`` against real nodes, via ``call_command`` and once as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from django_redlock import inspection as inspect
from django_redlock import locks
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> str:
    out, err = StringIO(), StringIO()
    call_command("redlock", *args, stdout=out, stderr=err)
    assert err.getvalue() == ""
    return out.getvalue()


def owner_of(lease: object) -> str:
    owner: str = lease.record.owner  # type: ignore[attr-defined]
    return owner


def test_list_json_and_table(unique_name: str) -> None:
    lease = locks["multi"].acquire(unique_name, ttl=30, timeout=0)
    try:
        rows = json.loads(run("list", "--prefix", unique_name, "--json"))
        assert isinstance(rows, list) and len(rows) == 1
        row = rows[0]
        assert (row["alias"], row["name"], row["nodes_held"], row["nodes_total"]) == (
            "multi",
            unique_name,
            3,
            3,
        )
        assert type(row["ttl_ms"]) is int and 0 < row["ttl_ms"] <= 30_000
        assert type(row["token"]) is int and abs(row["token"] - lease.token) < 1000
        text = run("list", "--prefix", unique_name)
        assert "NAME" in text and unique_name in text and "3/3" in text
        both = run("list", "--prefix", unique_name, "--using", "multi", "--json")
        assert [r["name"] for r in json.loads(both)] == [unique_name]
        assert json.loads(run("list", "--prefix", unique_name, "--using", "five", "--json")) == []
        for output in (text, both):
            assert owner_of(lease) not in output
    finally:
        lease.release()
    assert "No locks are held." in run("list", "--prefix", unique_name)


def test_list_limit_prints_the_first_locks(unique_name: str) -> None:
    leases = [locks["multi"].acquire(f"{unique_name}:{i}", ttl=30, timeout=0) for i in range(5)]
    try:
        rows = json.loads(run("list", "--prefix", unique_name, "--limit", "3", "--json"))
        assert len(rows) == 3 and len({row["name"] for row in rows}) == 3
        assert all(row["name"].startswith(f"{unique_name}:") for row in rows)
        for args in ((), ("--limit", "5"), ("--limit", "50")):
            assert len(json.loads(run("list", "--prefix", unique_name, "--json", *args))) == 5
        assert run("list", "--prefix", unique_name, "--limit", "2").count(f"{unique_name}:") == 2
        for bad in ("0", "-1", "x"):
            with pytest.raises(CommandError, match="--limit"):
                run("list", "--limit", bad)
    finally:
        for lease in leases:
            lease.release()


def test_show(unique_name: str) -> None:
    with locks["default"].lock(unique_name, ttl=30, timeout=0) as lease:
        doc = json.loads(run("show", unique_name, "--json"))
        assert doc["name"] == unique_name and doc["nodes_held"] == 1
        assert doc["owner"] == owner_of(lease)[:4] + "…"
        text = run("show", unique_name)
        assert unique_name in text and "TOKEN" in text and owner_of(lease) not in text
        with pytest.raises(CommandError, match="not held on alias 'multi'"):
            run("show", unique_name, "--using", "multi")
    with pytest.raises(CommandError, match="not held"):
        run("show", unique_name)


def test_release_advances_the_fence(unique_name: str) -> None:
    lease = locks["multi"].acquire(unique_name, ttl=30, timeout=0)
    out = run("release", unique_name, "--using", "multi")
    assert "Released" in out and "3/3" in out
    assert inspect.get_lock("multi", unique_name) == (None, [])
    again = locks["multi"].acquire(unique_name, ttl=30, timeout=0)
    assert again.token > lease.token
    assert lease.release() is False
    with pytest.raises(CommandError, match="now held by another lease"):
        run("release", unique_name, "--using", "multi", "--token", "1")
    again.release()
    with pytest.raises(CommandError, match="not held"):
        run("release", unique_name, "--using", "multi")


def test_clear_needs_yes_and_respects_prefix(unique_name: str) -> None:
    keep = locks["five"].acquire(f"{unique_name}-keep", ttl=30, timeout=0)
    gone = [
        locks[a].acquire(f"{unique_name}:x{i}", ttl=30, timeout=0)
        for a in ("default", "five")
        for i in range(3)
    ]
    with pytest.raises(CommandError, match="--yes"):
        run("clear", "--prefix", f"{unique_name}:")
    assert len(json.loads(run("list", "--prefix", f"{unique_name}:", "--json"))) == 6
    assert "Released 3 lock(s)." in run(
        "clear", "--prefix", f"{unique_name}:", "--using", "five", "--yes"
    )
    assert "Released 3 lock(s)." in run("clear", "--prefix", f"{unique_name}:", "--yes")
    assert json.loads(run("list", "--prefix", unique_name, "--json"))[0]["name"] == keep.name
    assert all(lease.release() is False for lease in gone)
    keep.release()


def test_nodes(unique_name: str) -> None:
    doc = json.loads(run("nodes", "--json"))
    assert [n["alias"] for n in doc] == ["default"] + ["multi"] * 3 + ["five"] * 5
    assert all(n["up"] and n["run_id"] and n["maxmemory_policy"] for n in doc)
    assert all(isinstance(n["latency_ms"], float) and n["uptime_s"] >= 0 for n in doc)
    text = run("nodes", "--using", "multi")
    assert text.count(" up ") == 3 and "noeviction" in text


def test_unknown_alias() -> None:
    with pytest.raises(CommandError, match="no alias 'nope'"):
        run("list", "--using", "nope")


def test_node_down_is_an_error_after_the_output(
    redis_nodes: RedisNodes, redlock_alias: Callable[..., LockManager]
) -> None:
    manager = redlock_alias(redis_nodes)
    lease = manager.acquire("job", ttl=30, timeout=0)
    redis_nodes[1].kill()
    for args in (("list", "--json"), ("nodes",), ("show", "job")):
        out, err = StringIO(), StringIO()
        with pytest.raises(CommandError, match="unreachable") as excinfo:
            call_command("redlock", *args, "--using", manager.alias, stdout=out, stderr=err)
        assert "\n" not in str(excinfo.value)
        assert manager.config.nodes[1].label in str(excinfo.value)
        assert out.getvalue()  # the readable part was printed first
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("redlock", "list", "--json", "--using", manager.alias, stdout=out)
    [row] = json.loads(out.getvalue())
    assert (row["name"], row["nodes_held"], row["nodes_total"]) == ("job", 2, 3)
    assert lease.validity > 0


def test_real_subprocess(
    redis_nodes: RedisNodes, redlock_alias: Callable[..., LockManager]
) -> None:
    """``python -m django redlock`` prints JSON (exit 0); with a node down, one stderr line
    and exit status 1."""
    manager = redlock_alias(redis_nodes)
    lease = manager.acquire("sub:job", ttl=30, timeout=0)
    env = {
        **os.environ,
        "REDLOCK_JSON": json.dumps({manager.alias: settings.REDLOCK[manager.alias]}),
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "django", "redlock", "list", "--json"]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert (row["alias"], row["name"], row["nodes_held"]) == (manager.alias, "sub:job", 3)
    assert owner_of(lease) not in done.stdout
    redis_nodes[2].kill()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unreachable" in lines[0], done.stderr
    assert json.loads(done.stdout)[0]["nodes_held"] == 2


def failing(*args: str) -> tuple[str, CommandError]:
    """Run a command that must fail: its stdout and its one-line error."""
    out = StringIO()
    with pytest.raises(CommandError) as excinfo:
        call_command("redlock", *args, stdout=out, stderr=StringIO())
    assert "\n" not in str(excinfo.value)
    return out.getvalue(), excinfo.value


def test_broken_alias_is_one_line_after_the_others(unique_name: str, settings: Any) -> None:
    """An alias with invalid settings is an error line (no traceback); the other aliases are
    still listed first, and ``--using`` that alias gives the JSON error document."""
    settings.REDLOCK = {**settings.REDLOCK, "broken": {**settings.REDLOCK["default"], "TTL": -1}}
    with locks["default"].lock(unique_name, ttl=30, timeout=0):
        out, error = failing("list", "--prefix", unique_name, "--json")
        assert "alias 'broken': invalid settings" in str(error) and "TTL" in str(error)
        assert [row["name"] for row in json.loads(out)] == [unique_name]
        for args in (("list",), ("show", unique_name), ("nodes",)):
            out, error = failing(*args, "--using", "broken", "--json")
            assert json.loads(out) == {"error": str(error), "code": "bad_settings"}
        out, error = failing("nodes")
        assert "broken" in str(error) and out.count(" up ") == 9


def test_json_errors_print_an_error_document(unique_name: str) -> None:
    """With ``--json`` an error that comes before the result prints ``{"error", "code"}``."""
    out, error = failing("show", unique_name, "--json")
    assert json.loads(out) == {"error": str(error), "code": "not_held"}
    out, error = failing("list", "--using", "nope", "--json")
    assert json.loads(out) == {"error": str(error), "code": "unknown_alias"}


def test_release_on_unreachable_nodes_says_unreachable(
    redis_nodes: RedisNodes, redlock_alias: Callable[..., LockManager]
) -> None:
    """With no node answering, ``release`` (and ``show``) say the nodes are unreachable, not
    that the lock is not held."""
    manager = redlock_alias(redis_nodes)
    for node in redis_nodes:
        node.kill()
    _, error = failing("release", "anything", "--using", manager.alias)
    assert "unreachable" in str(error) and "not held on alias" not in str(error)
    assert "nothing was released" in str(error)
    out, error = failing("show", "anything", "--using", manager.alias, "--json")
    assert json.loads(out)["code"] == "unreachable" and "unreachable" in str(error)


def test_broken_settings_in_a_subprocess(redis_nodes: RedisNodes) -> None:
    """Broken settings: ``redlock list`` with TTL -1 prints one stderr line, exit 1."""
    broken = {"default": {"NODES": redis_nodes.urls[:1], "TTL": -1}}
    env = {
        **os.environ,
        "REDLOCK_JSON": json.dumps(broken),
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "PYTHONPATH": str(ROOT),
    }
    for args, stdout in ((["list"], ""), (["list", "--using", "default", "--json"], "{")):
        command = [sys.executable, "-m", "django", "redlock", *args]
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "invalid settings" in lines[0], done.stderr
        assert done.stdout.startswith(stdout)
