"""Scale benchmarks: how the cost grows with held locks, names ever locked, processes
and nodes. Prints Markdown tables; ``--plot`` writes a chart.

1. **Held locks**: ``--held`` (100,000) locks acquired *through the library* (4 spawned
   processes, one ``acquire()`` per name, TTL 1 h, never released) on 5 nodes. Then a fresh
   process set up like a site (admin, auth, sessions; SQLite under ``/tmp/scale/``) times,
   median of 7 runs each: ``redlock list --limit 50`` (the first page),
   ``redlock list --json --prefix P`` (P matches 100 names), ``redlock show NAME`` (all three
   with ``call_command``, in-process: no interpreter start-up) and the admin changelist's first
   page (Django's test ``Client``, a logged-in superuser); ``redlock list`` (every lock) once.
   Memory per held lock on each node: ``INFO memory`` ``used_memory`` after - before, divided
   by the locks held.
2. **Churn**: ``--churn`` (1,000,000) distinct names, each acquired and released once, on one
   node, by 4 processes; ``used_memory`` and ``DBSIZE`` before and after (fence counters and
   wake-up keys must not grow with names).
3. **Throughput**: 1, 2, 4 and 8 processes, each on its own name, acquire+release pairs/s in
   all, against raw redis-py with as many processes: ``SET NX PX`` + ``EVALSHA``
   compare-and-delete on 1 node, and on 5 nodes a raw fan-out (each call written to all five
   connections, then the five replies read, in one thread). At 8 processes also ours with
   ``REDLOCK_BUSY_POLL = 0``, and CPU per pair (the workers' and the nodes' process times).
4. **Node count**: acquire p50/p99 on 3, 5, 7 and 9 nodes (one process, interleaved rounds),
   with the raw fan-out's beside it.

    .venv/bin/python benchmarks/scale.py                       # full: 7.5-9.5 minutes here
    .venv/bin/python benchmarks/scale.py --quick               # ~40 s
    .venv/bin/python benchmarks/scale.py --plot docs/img/scale.png --markdown /tmp/scale.md

Starts its own redis-server processes on free loopback ports (``django_redlock.testing``) and
stops them, by PID, at the end. Numbers are same-run ratios: see ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import multiprocessing
import os
import platform
import secrets
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo, for benchmarks.*

from benchmarks.common import HEALTHY_SOCKET_TIMEOUT, TTL, percentile, redis_client
from benchmarks.contenders import RELEASE_LUA, ours_pair, raw_pair
from benchmarks.loops import SyncPair, pair_loop

#: Where the admin timing keeps its SQLite database.
SITE_DIR = Path("/tmp/scale")
#: TTL of the held locks, seconds: they must outlive the run.
HELD_TTL = 3600
#: Each listing operation must answer within this, seconds.
LISTING_TARGET = 0.2
PAGE = 50
NODE_COUNTS = (3, 5, 7, 9)


@dataclass(frozen=True)
class Plan:
    held: int  # locks held on the 5 nodes
    hold_procs: int  # processes acquiring them
    repeat: int  # timings of each listing operation (median reported)
    churn: int  # names locked and released once on 1 node
    churn_procs: int
    procs: tuple[int, ...]  # process counts of the throughput part
    seconds: float  # length of one throughput run
    rounds: int  # interleaved throughput and latency rounds
    pairs: int  # acquire+release pairs per node count and latency round

    @classmethod
    def full(cls) -> Plan:
        return cls(100_000, 4, 7, 1_000_000, 4, (1, 2, 4, 8), 1.5, 5, 800)

    @classmethod
    def quick(cls) -> Plan:
        return cls(5_000, 2, 3, 20_000, 2, (1, 8), 1.0, 1, 500)


# -- Django in the worker processes ------------------------------------------------------------
def configure(redlock: dict[str, Any], site: bool = False) -> None:
    """Set Django up in this process: ``django_redlock`` with ``redlock``; with ``site``, also
    the admin and what it needs, on SQLite under :data:`SITE_DIR`."""
    import django
    from django.conf import settings

    extra: dict[str, Any] = {"INSTALLED_APPS": ["django_redlock"]}
    if site:
        extra = {
            "INSTALLED_APPS": [
                "django.contrib.admin",
                "django.contrib.auth",
                "django.contrib.contenttypes",
                "django.contrib.sessions",
                "django.contrib.messages",
                "django_redlock",
            ],
            "MIDDLEWARE": [
                "django.contrib.sessions.middleware.SessionMiddleware",
                "django.middleware.common.CommonMiddleware",
                "django.middleware.csrf.CsrfViewMiddleware",
                "django.contrib.auth.middleware.AuthenticationMiddleware",
                "django.contrib.messages.middleware.MessageMiddleware",
            ],
            "TEMPLATES": [
                {
                    "BACKEND": "django.template.backends.django.DjangoTemplates",
                    "APP_DIRS": True,
                    "OPTIONS": {
                        "context_processors": [
                            "django.template.context_processors.request",
                            "django.contrib.auth.context_processors.auth",
                            "django.contrib.messages.context_processors.messages",
                        ]
                    },
                }
            ],
            "ROOT_URLCONF": "benchmarks.scale_urls",
            "DATABASES": {
                "default": {
                    "ENGINE": "django.db.backends.sqlite3",
                    "NAME": str(SITE_DIR / f"admin-{os.getpid()}.sqlite3"),
                }
            },
            "SECRET_KEY": "scale-benchmark-not-secret",
            "ALLOWED_HOSTS": ["testserver"],
            "USE_TZ": True,
            "DEFAULT_AUTO_FIELD": "django.db.models.BigAutoField",
            "PASSWORD_HASHERS": ["django.contrib.auth.hashers.MD5PasswordHasher"],
        }
    settings.configure(REDLOCK=redlock, **extra)
    django.setup()


def _ready(_: int) -> int:
    time.sleep(0.2)  # long enough for the other idle workers to take the other tasks
    return os.getpid()


def warm_pool(pool: Any, count: int) -> None:
    """Return once ``count`` distinct workers have run their initializer."""
    for _ in range(10):
        if len(set(pool.map(_ready, range(count), chunksize=1))) == count:
            return


def wait_until(start: float) -> bool:
    """Sleep until ``time.monotonic()`` reaches ``start``; True when it had already passed."""
    late = time.monotonic() > start
    while time.monotonic() < start:
        time.sleep(min(0.01, max(0.0, start - time.monotonic())))
    return late


# -- 1. held locks ----------------------------------------------------------------------------
def held_name(index: int) -> str:
    return f"held:{index:06d}"


def query_names(held: int) -> tuple[str, str]:
    """A name prefix matching (up to) 100 held names, and one held name under it."""
    block = (held // 100) // 2
    return f"held:{block:04d}", held_name(min(held - 1, block * 100 + 42))


def hold_worker(first: int, stop: int) -> int:
    """Acquire ``held_name(first)``..``held_name(stop - 1)`` (never released); how many held."""
    from django_redlock import locks
    from django_redlock.exceptions import LockNotAcquired, NodesUnavailable

    manager = locks["default"]
    held = 0
    for index in range(first, stop):
        for _ in range(3):  # a node that missed its deadline on this loaded machine: again
            try:
                manager.acquire(held_name(index), ttl=HELD_TTL, timeout=0)
            except (LockNotAcquired, NodesUnavailable):
                continue
            held += 1
            break
    return held


def held_measure(urls: Sequence[str], held: int, repeat: int) -> list[dict[str, Any]]:
    """In a fresh process set up like a site: time each listing operation ``repeat`` times."""
    configure({"default": {"NODES": list(urls)}}, site=True)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_superuser("scale", "scale@example.invalid", "x")
    client = Client()
    client.force_login(user)
    prefix, name = query_names(held)

    def command(*args: str) -> int:
        out = io.StringIO()
        call_command("redlock", *args, stdout=out)
        text = out.getvalue()
        if "--json" in args:
            return len(json.loads(text))
        return text.count("held:")

    def admin_page() -> int:
        response = client.get("/admin/django_redlock/lock/")
        if response.status_code != 200:
            raise RuntimeError(f"admin changelist answered {response.status_code}")
        return response.content.count(b'name="_selected_action"')

    # (label, call, timings, held to the 200 ms target)
    cases: list[tuple[str, Callable[[], int], int, bool]] = [
        (
            f"`redlock list --limit {PAGE}`",
            lambda: command("list", "--limit", str(PAGE)),
            repeat,
            True,
        ),
        (
            f"`redlock list --json --prefix {prefix}`",
            lambda: command("list", "--json", "--prefix", prefix),
            repeat,
            True,
        ),
        (f"`redlock show {name}`", lambda: command("show", name), repeat, True),
        ("admin changelist, first page", admin_page, repeat, True),
        (f"`redlock list` (all {held:,} locks)", lambda: command("list"), 1, False),
    ]
    results = []
    for label, call, runs, target in cases:
        rows = call() if target else 0  # warm: imports, templates, the first connections
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            rows = call()
            times.append(time.perf_counter() - started)
        results.append(
            {
                "label": label,
                "rows": rows,
                "median": statistics.median(times),
                "max": max(times),
                "target": target,
            }
        )
    return results


@dataclass
class HeldResult:
    held: int = 0
    create_seconds: float = 0.0
    timings: list[dict[str, Any]] = field(default_factory=list)
    memory: list[tuple[int, int, int]] = field(default_factory=list)  # before, after, keys


def held_phase(nodes: Any, plan: Plan, ctx: Any) -> HeldResult:
    result = HeldResult()
    clients = [node.client(socket_timeout=5.0) for node in nodes]
    urls = list(nodes.urls)
    try:
        before = [int(c.info("memory")["used_memory"]) for c in clients]
        redlock = {"default": {"NODES": urls, "NODE_TIMEOUT": 1.0}}
        bounds = [plan.held * k // plan.hold_procs for k in range(plan.hold_procs + 1)]
        with ctx.Pool(plan.hold_procs, initializer=configure, initargs=(redlock,)) as pool:
            warm_pool(pool, plan.hold_procs)
            started = time.perf_counter()
            counts = pool.starmap(hold_worker, list(itertools.pairwise(bounds)), chunksize=1)
            result.create_seconds = time.perf_counter() - started
        result.held = sum(counts)
        after = [int(c.info("memory")["used_memory"]) for c in clients]
        keys = [int(c.dbsize()) for c in clients]
        result.memory = list(zip(before, after, keys, strict=True))
        step(f"{result.held:,} locks held ({result.create_seconds:.0f} s); timing the listings")
        with ctx.Pool(1) as pool:
            result.timings = pool.apply(held_measure, (urls, plan.held, plan.repeat))
    finally:
        for c in clients:
            c.close()
    return result


# -- 2. churn ---------------------------------------------------------------------------------
def churn_worker(worker: int, count: int, start: float) -> tuple[int, float]:
    """Acquire and release ``count`` distinct names once each; (pairs done, seconds)."""
    from django_redlock import locks
    from django_redlock.exceptions import LockNotAcquired, NodesUnavailable

    manager = locks["default"]
    wait_until(start)
    started = time.perf_counter()
    done = 0
    for index in range(count):
        try:
            manager.acquire(f"churn:{worker}:{index}", ttl=TTL, timeout=0).release()
        except (LockNotAcquired, NodesUnavailable):
            continue
        done += 1
    return done, time.perf_counter() - started


@dataclass
class ChurnResult:
    names: int = 0
    done: int = 0
    seconds: float = 0.0
    memory_before: int = 0
    memory_after: int = 0
    keys_before: int = 0
    keys_after: int = 0
    left: list[str] = field(default_factory=list)


def churn_phase(node: Any, plan: Plan, ctx: Any) -> ChurnResult:
    client = node.client(socket_timeout=5.0)
    redlock = {"default": {"NODES": [node.url]}}
    result = ChurnResult(names=plan.churn)
    per = plan.churn // plan.churn_procs
    try:
        with ctx.Pool(plan.churn_procs, initializer=configure, initargs=(redlock,)) as pool:
            warm_pool(pool, plan.churn_procs)
            # the alias's fence hash and its scripts exist before the "before" reading
            pool.starmap(churn_worker, [(-1 - w, 100, 0.0) for w in range(plan.churn_procs)])
            time.sleep(0.5)
            step("churn: workers ready")
            result.memory_before = int(client.info("memory")["used_memory"])
            result.keys_before = int(client.dbsize())
            start = time.monotonic() + 0.3
            args = [(w, per, start) for w in range(plan.churn_procs)]
            runs = pool.starmap(churn_worker, args, chunksize=1)
        time.sleep(1.0)  # the workers' connections are closed; 10 ms hand-off keys expired
        result.done = sum(done for done, _ in runs)
        result.seconds = max(seconds for _, seconds in runs)
        result.memory_after = int(client.info("memory")["used_memory"])
        result.keys_after = int(client.dbsize())
        result.left = sorted(k.decode() for k in client.scan_iter(count=1000))[:10]
    finally:
        client.close()
    return result


# -- 3. throughput ----------------------------------------------------------------------------
def raw_fanout_pair(urls: Sequence[str], name: str) -> SyncPair:
    """Raw redis-py over N nodes in one thread: each command written to every connection
    first, then every reply read; held when a majority said OK, undone otherwise."""
    clients = [redis_client(url, HEALTHY_SOCKET_TIMEOUT) for url in urls]
    sha = ""
    for client in clients:
        sha = client.script_load(RELEASE_LUA)
    conns = [client.connection_pool.get_connection() for client in clients]
    majority = len(conns) // 2 + 1

    def release(owner: str) -> object:
        for conn in conns:
            conn.send_command("EVALSHA", sha, 1, name, owner)
        return [conn.read_response() for conn in conns]

    def acquire() -> str | None:
        owner = secrets.token_hex(16)
        for conn in conns:
            conn.send_command("SET", name, owner, "NX", "PX", TTL * 1000)
        if sum(conn.read_response() is not None for conn in conns) >= majority:
            return owner
        release(owner)
        return None

    return acquire, release


_pairs: dict[str, SyncPair] = {}


def pair_of(case: str, urls: Sequence[str]) -> SyncPair:
    """This process's pair for ``case`` (connections made once per process)."""
    if case not in _pairs:
        name = f"tp:{case}:{os.getpid()}"
        nodes = 1 if case.endswith("-1") else 5
        if case.startswith("raw"):
            _pairs[case] = raw_pair(urls[0], name) if nodes == 1 else raw_fanout_pair(urls, name)
        elif case.startswith("nospin"):
            _pairs[case] = ours_pair(f"nospin-{nodes}", name, busy_poll=0.0)
        elif case.startswith("quorum"):
            _pairs[case] = ours_pair(case, name)
        else:
            _pairs[case] = ours_pair(f"ours-{nodes}", name)
    return _pairs[case]


def pairs_worker(
    case: str, urls: Sequence[str], start: float, seconds: float
) -> tuple[int, int, float]:
    """Acquire+release back to back from ``start`` for ``seconds``; (pid, pairs, CPU seconds
    this process used meanwhile)."""
    acquire, release = pair_of(case, urls)
    late = wait_until(start)
    cpu = time.process_time()
    end, done = start + seconds, 0
    clock = time.monotonic
    while clock() < end:
        handle = acquire()
        if handle:
            release(handle)
            done += 1
    return (-1 if late else os.getpid()), done, time.process_time() - cpu


#: ours / raw on 1 and 5 nodes at every process count; ours without busy polling at the most
CASES = ("ours-1", "raw-1", "ours-5", "raw-5")
#: measured at the largest process count only: busy polling off, and quorum-first on 5 nodes
NOSPIN_CASES = ("nospin-1", "nospin-5", "quorum-5")


def cpu_seconds(pids: Sequence[int | None]) -> float:
    """User + system CPU time the processes ``pids`` have used (Linux ``/proc``), seconds."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class Throughput:
    rate: dict[tuple[str, int], float] = field(default_factory=dict)  # median pairs/s
    client_cpu: dict[tuple[str, int], float] = field(default_factory=dict)  # s per pair
    server_cpu: dict[tuple[str, int], float] = field(default_factory=dict)  # s per pair


def throughput_phase(nodes: Any, plan: Plan, ctx: Any) -> Throughput:
    """Median pairs/s over the rounds per (case, processes), and CPU per pair."""
    urls = list(nodes.urls)[:5]
    # one KEY_PREFIX per alias: aliases sharing a node and a prefix would share its fence hash
    redlock: dict[str, dict[str, Any]] = {
        f"{kind}-{n}": {"NODES": urls[:n], "KEY_PREFIX": f"{kind}{n}:"}
        for kind in ("ours", "nospin")
        for n in (1, 5)
    }
    redlock["quorum-5"] = {"NODES": urls, "KEY_PREFIX": "quorum5:", "FAN_OUT": "quorum"}
    most = max(plan.procs)
    runs_of: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    result = Throughput()
    with ctx.Pool(most, initializer=configure, initargs=(redlock,)) as pool:
        warm_pool(pool, most)
        step("throughput: workers ready")
        for case in CASES + NOSPIN_CASES:  # connect, load scripts
            pool.starmap(pairs_worker, [(case, urls, time.monotonic(), 0.2)] * most, chunksize=1)
        for _ in range(plan.rounds):
            for procs in plan.procs:
                for case in CASES + (NOSPIN_CASES if procs == most else ()):
                    servers = nodes.pids[: 1 if case.endswith("-1") else 5]
                    start = time.monotonic() + 0.2
                    before = cpu_seconds(servers)
                    args = [(case, urls, start, plan.seconds)] * procs
                    runs = pool.starmap(pairs_worker, args, chunksize=1)
                    server = cpu_seconds(servers) - before
                    pids = {pid for pid, _, _ in runs}
                    if len(pids) != procs or -1 in pids:
                        step(f"{case} x{procs}: a worker started late or ran twice")
                    done = sum(pairs for _, pairs, _ in runs)
                    client = sum(cpu for _, _, cpu in runs)
                    runs_of.setdefault((case, procs), []).append(
                        (done / plan.seconds, client / max(done, 1), server / max(done, 1))
                    )
    for key, values in runs_of.items():
        result.rate[key] = statistics.median(v[0] for v in values)
        result.client_cpu[key] = statistics.median(v[1] for v in values)
        result.server_cpu[key] = statistics.median(v[2] for v in values)
    return result


# -- 4. node count ----------------------------------------------------------------------------
def latency_measure(urls: Sequence[str], plan: Plan) -> dict[int, dict[str, float | None]]:
    """Acquire p50/p99 for ours and the raw fan-out on each node count, interleaved rounds."""
    configure({f"n{n}": {"NODES": list(urls[:n]), "KEY_PREFIX": f"n{n}:"} for n in NODE_COUNTS})
    pairs = {
        (kind, n): ours_pair(f"n{n}", f"lat:{n}")
        if kind == "ours"
        else raw_fanout_pair(urls[:n], f"lat:raw:{n}")
        for n in NODE_COUNTS
        for kind in ("ours", "raw")
    }
    for pair in pairs.values():
        pair_loop(pair, 30.0, 200)  # warm up
    latencies: dict[tuple[str, int], list[float]] = {key: [] for key in pairs}
    for _ in range(plan.rounds):
        for key, pair in pairs.items():
            latencies[key].extend(pair_loop(pair, 60.0, plan.pairs).acquire_s)
    return {
        n: {
            f"{kind} {q}": percentile(latencies[(kind, n)], q)
            for kind in ("ours", "raw")
            for q in (50, 99)
        }
        for n in NODE_COUNTS
    }


# -- report -----------------------------------------------------------------------------------
@dataclass
class Report:
    plan: Plan
    mode: str
    held: HeldResult | None = None
    churn: ChurnResult | None = None
    throughput: Throughput | None = None
    latency: dict[int, dict[str, float | None]] = field(default_factory=dict)
    seconds: float = 0.0
    targets: list[tuple[str, str, bool]] = field(default_factory=list)


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 10:
        return f"{seconds:.1f} s"
    return f"{seconds * 1e6:.0f} µs" if seconds < 0.001 else f"{seconds * 1000:.1f} ms"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> str:
    from django_redlock.testing import server_version

    try:
        redis_version = ".".join(str(part) for part in server_version())
    except Exception:
        redis_version = "?"
    return (
        f"{os.cpu_count()} cores, loopback, Python {platform.python_version()}, "
        f"redis-server {redis_version}"
    )


def markdown(report: Report) -> str:
    parts = [f"{machine()}; mode: {report.mode}; run took {report.seconds:.0f} s."]
    target = report.targets.append
    held = report.held
    if held is not None:
        rate = held.held / held.create_seconds if held.create_seconds else 0
        parts.append(
            f"**{held.held:,} held locks on 5 nodes** (acquired through the library by "
            f"{report.plan.hold_procs} processes in {held.create_seconds:.0f} s, "
            f"{rate:,.0f} acquires/s; median of {report.plan.repeat} runs, in-process)"
        )
        rows = []
        for timing in held.timings:
            met = timing["median"] < LISTING_TARGET
            verdict = ("met" if met else "NOT met") if timing["target"] else "(no target)"
            rows.append(
                [
                    timing["label"],
                    f"{timing['rows']:,}",
                    ms(timing["median"]),
                    ms(timing["max"]),
                    verdict,
                ]
            )
            if timing["target"]:
                label = f"{held.held:,} held: {timing['label']} < 200 ms"
                target((label, ms(timing["median"]), met))
        parts.append(table(["operation", "rows", "median", "slowest", "< 200 ms"], rows))
        rows = []
        for index, (before, after, keys) in enumerate(held.memory):
            per = (after - before) / held.held if held.held else 0
            rows.append([index, f"{keys:,}", f"{before:,}", f"{after:,}", f"{per:.0f}"])
        parts.append(
            table(["node", "keys", "used_memory before", "after", "bytes per held lock"], rows)
        )
    churn = report.churn
    if churn is not None:
        delta = churn.memory_after - churn.memory_before
        rate = churn.done / churn.seconds if churn.seconds else 0
        parts.append(
            f"**{churn.names:,} distinct names locked and released on 1 node** "
            f"({report.plan.churn_procs} processes)"
        )
        parts.append(
            table(
                [
                    "pairs",
                    "time",
                    "pairs/s",
                    "used_memory before",
                    "after",
                    "change",
                    "DBSIZE before",
                    "after",
                    "keys left",
                ],
                [
                    [
                        f"{churn.done:,}",
                        f"{churn.seconds:.0f} s",
                        f"{rate:,.0f}",
                        f"{churn.memory_before:,}",
                        f"{churn.memory_after:,}",
                        f"{delta:+,} B",
                        churn.keys_before,
                        churn.keys_after,
                        ", ".join(f"`{k}`" for k in churn.left) or "none",
                    ]
                ],
            )
        )
        target(
            (
                f"{churn.names:,} names: used_memory within 1 MB of before",
                f"{delta:+,} B",
                abs(delta) <= 1_000_000,
            )
        )
    if report.throughput is not None:
        rows = []
        tp = report.throughput
        rate = tp.rate
        for procs in report.plan.procs:
            o1, r1 = rate[("ours-1", procs)], rate[("raw-1", procs)]
            o5, r5 = rate[("ours-5", procs)], rate[("raw-5", procs)]
            rows.append(
                [
                    procs,
                    f"{o1:,.0f}",
                    f"{r1:,.0f}",
                    f"{o1 / r1:.2f}x",
                    f"{o5:,.0f}",
                    f"{r5:,.0f}",
                    f"{o5 / r5:.2f}x",
                ]
            )
        parts.append(
            "**Processes on distinct names: acquire+release pairs/s in all** "
            f"(median of {report.plan.rounds} rounds of {report.plan.seconds:g} s)"
        )
        parts.append(
            table(
                [
                    "processes",
                    "ours, 1 node",
                    "raw redis-py",
                    "ratio",
                    "ours, 5 nodes",
                    "raw fan-out",
                    "ratio",
                ],
                rows,
            )
        )
        most = max(report.plan.procs)
        rows = []
        for nodes in (1, 5):
            raw = rate[(f"raw-{nodes}", most)]
            raw_cpu = tp.client_cpu[(f"raw-{nodes}", most)] + tp.server_cpu[(f"raw-{nodes}", most)]
            for case, label in (
                (f"ours-{nodes}", "django-redlock"),
                (f"nospin-{nodes}", "django-redlock, REDLOCK_BUSY_POLL = 0"),
                (f"quorum-{nodes}", 'django-redlock, FAN_OUT = "quorum"'),
                (f"raw-{nodes}", "raw redis-py" if nodes == 1 else "raw fan-out"),
            ):
                key = (case, most)
                if key not in rate:
                    continue  # quorum-first: 5 nodes only
                rows.append(
                    [
                        nodes,
                        label,
                        f"{rate[key]:,.0f}",
                        f"{rate[key] / raw:.2f}x",
                        f"{tp.client_cpu[key] * 1e6:.0f} µs",
                        f"{tp.server_cpu[key] * 1e6:.0f} µs",
                        f"{(tp.client_cpu[key] + tp.server_cpu[key]) * 1e6:.0f} µs",
                        f"{raw_cpu / (tp.client_cpu[key] + tp.server_cpu[key]):.2f}x",
                    ]
                )
        parts.append(
            f"**{most} processes: CPU per acquire+release pair** (the clients' process time, "
            "and the redis-server processes' from /proc; medians of the rounds). With the cores "
            "saturated, pairs/s follow the last column, whatever else runs on the machine"
        )
        parts.append(
            table(
                [
                    "nodes",
                    "client",
                    "pairs/s",
                    "vs raw",
                    "client CPU",
                    "servers' CPU",
                    "total",
                    "raw's total / this",
                ],
                rows,
            )
        )
        for nodes, raw in ((1, "raw redis-py"), (5, "raw fan-out")):
            ratio = rate[(f"ours-{nodes}", most)] / rate[(f"raw-{nodes}", most)]
            label = f"{most} processes, {nodes} node(s): >= 0.8x {raw}"
            target((label, f"{ratio:.2f}x", ratio >= 0.8))
    if report.latency:
        lat = report.latency
        base = lat[NODE_COUNTS[0]]["ours 50"] or 1.0
        rows = [
            [
                n,
                ms(lat[n]["ours 50"]),
                ms(lat[n]["ours 99"]),
                f"{(lat[n]['ours 50'] or 0) / base:.2f}x",
                ms(lat[n]["raw 50"]),
                ms(lat[n]["raw 99"]),
            ]
            for n in NODE_COUNTS
        ]
        parts.append(
            f"**Acquire latency by node count** (one process, {report.plan.rounds} x "
            f"{report.plan.pairs} pairs per count, interleaved)"
        )
        parts.append(
            table(
                ["nodes", "ours p50", "ours p99", "p50 vs 3 nodes", "raw fan-out p50", "p99"],
                rows,
            )
        )
        last = NODE_COUNTS[-1]
        ratio = (lat[last]["ours 50"] or 0) / base
        target((f"{last} nodes: acquire p50 <= 1.3x 3 nodes", f"{ratio:.2f}x", ratio <= 1.3))
    parts.append("**Targets**")
    parts.append(
        table(
            ["target", "measured", "verdict"],
            [[name, value, "met" if met else "NOT met"] for name, value, met in report.targets],
        )
    )
    return "\n\n".join(parts) + "\n"


def plot(report: Report, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    if report.latency:
        counts = list(NODE_COUNTS)
        for key, label, style in (
            ("ours 50", "django-redlock p50", "o-"),
            ("ours 99", "django-redlock p99", "o--"),
            ("raw 50", "raw fan-out p50", "s-"),
            ("raw 99", "raw fan-out p99", "s--"),
        ):
            values = [(report.latency[n][key] or 0) * 1e6 for n in counts]
            left.plot(counts, values, style, label=label)
        left.set_xticks(counts)
        left.set_xlabel("nodes")
        left.set_yscale("log")  # p99 is 5-10x p50
        left.set_ylabel("acquire latency (µs, log scale)")
        left.set_title("Acquire latency by node count")
        left.legend(fontsize=8)
    if report.throughput is not None:
        procs = list(report.plan.procs)
        for case, label, style in (
            ("ours-1", "django-redlock, 1 node", "o-"),
            ("raw-1", "raw redis-py, 1 node", "s--"),
            ("ours-5", "django-redlock, 5 nodes", "o-"),
            ("raw-5", "raw fan-out, 5 nodes", "s--"),
        ):
            rates = [report.throughput.rate[(case, p)] for p in procs]
            right.plot(procs, rates, style, label=label)
        right.set_xticks(procs)
        right.set_xlabel("processes (distinct names)")
        right.set_ylabel("acquire+release pairs/s, all processes")
        right.set_title("Throughput by process count")
        right.set_ylim(bottom=0)
        right.legend(fontsize=8)
    fig.suptitle(f"django-redlock at scale ({machine()})", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main -------------------------------------------------------------------------------------
_STARTED = time.monotonic()


def step(text: str) -> None:
    print(f"... {time.monotonic() - _STARTED:5.0f} s  {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts: about 40 s")
    parser.add_argument("--held", type=int, help="locks held on 5 nodes")
    parser.add_argument("--churn", type=int, help="names locked and released on 1 node")
    parser.add_argument("--seconds", type=float, help="length of one throughput run")
    parser.add_argument("--procs", help="process counts of the throughput part, e.g. 1,8")
    parser.add_argument("--pairs", type=int, help="pairs per node count and latency round")
    parser.add_argument(
        "--only", help="comma-separated parts to run: held, churn, throughput, latency"
    )
    parser.add_argument("--plot", metavar="PATH", help="write a PNG chart")
    parser.add_argument("--markdown", metavar="PATH", help="write the tables as Markdown")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan.full()
    overrides: dict[str, Any] = {
        "held": args.held,
        "churn": args.churn,
        "seconds": args.seconds,
        "pairs": args.pairs,
        "procs": tuple(int(p) for p in args.procs.split(",")) if args.procs else None,
    }
    plan = Plan(**{**plan.__dict__, **{k: v for k, v in overrides.items() if v is not None}})
    parts = set((args.only or "held,churn,throughput,latency").split(","))
    report = run(plan, "quick" if args.quick else "full", parts)
    text = markdown(report)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8")
    if args.plot:
        plot(report, args.plot)
    return 0


def run(plan: Plan, mode: str, parts: set[str]) -> Report:
    from django_redlock.testing import RedisNodes

    started = time.perf_counter()
    report = Report(plan, mode)
    ctx = multiprocessing.get_context("spawn")
    shutil.rmtree(SITE_DIR, ignore_errors=True)
    SITE_DIR.mkdir(parents=True)
    if "held" in parts:
        step(f"held: acquiring {plan.held:,} locks on 5 nodes")
        with RedisNodes.start(5) as nodes:
            report.held = held_phase(nodes, plan, ctx)
    if "churn" in parts:
        step(f"churn: {plan.churn:,} names on 1 node")
        with RedisNodes.start(1) as nodes:
            report.churn = churn_phase(nodes[0], plan, ctx)
    if parts & {"throughput", "latency"}:
        with RedisNodes.start(max(NODE_COUNTS)) as nodes:
            urls = list(nodes.urls)
            if "throughput" in parts:
                step(f"throughput: {plan.procs} processes")
                report.throughput = throughput_phase(nodes, plan, ctx)
            if "latency" in parts:
                step(f"latency: {NODE_COUNTS} nodes")
                with ctx.Pool(1) as pool:
                    report.latency = pool.apply(latency_measure, (urls, plan))
    report.seconds = time.perf_counter() - started
    return report


if __name__ == "__main__":
    sys.exit(main())
