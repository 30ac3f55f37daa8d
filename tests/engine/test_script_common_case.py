"""The scripts that grant or release in their common case first (before defining the Lua
functions their other paths share) answer and write exactly what the same script without
that case does, on a real node, for any state of the keys they touch.

Each example writes a random state (the fence hash trusted or not, with or without a longest
TTL; the name free, held by another owner or by us, a semaphore's or the readers' marker; a
hand-off reservation; waiter sets, readers and waiting writers with live and lapsed entries;
a wake-up list), runs the script without the common case on it, reads every key back, writes
the same state again and runs the script as shipped: the replies must be equal and so must
every key (type, value, TTL and sorted-set scores, the last two within the time the two runs
were apart). No mock: ``redis-server`` runs the Lua.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from django_redlock.engine.scripts import Script, lock, primitives
from django_redlock.engine.scripts.fragments import RELEASE_LUA, TAKE_LUA
from django_redlock.engine.scripts.script import taking
from django_redlock.pytest_plugin import RedisNodeFactory

#: Without the common case: the trust check, then the rest as it always ran.
REFERENCE = {
    "acquire": taking(
        "acquire",
        TAKE_LUA,
        "local present = redis.call('EXISTS', KEYS[1], KEYS[4])\n" + lock.ACQUIRE_BODY,
        fence=2,
    ),
    "release": Script("release", RELEASE_LUA + lock.RELEASE_BODY),
    "read": taking("read", primitives.RW_LUA, primitives.READ_BODY),
    "write": taking("write", primitives.RW_LUA, primitives.WRITE_BODY),
    "read_release": Script(
        "read_release",
        "local mine = nil\n"
        + RELEASE_LUA
        + primitives.FIT_READERS_LUA
        + primitives.READ_RELEASE_BODY,
    ),
    "permit_release": Script("permit_release", RELEASE_LUA + primitives.PERMIT_RELEASE_BODY),
    "permit": taking(
        "permit",
        TAKE_LUA,
        "local marker = 'semaphore|' .. ARGV[8]\n"
        "local found = redis.call('GET', KEYS[4])\n"
        "local full = nil\n" + primitives.PERMIT_BODY,
    ),
}
SHIPPED = {
    "acquire": lock.ACQUIRE,
    "release": lock.RELEASE,
    "read": primitives.READ,
    "write": primitives.WRITE,
    "permit": primitives.PERMIT,
    "read_release": primitives.READ_RELEASE,
    "permit_release": primitives.RELEASE_PERMIT,
}
#: Each script's keys, by role (KEYS order).
KEYS = {
    "acquire": ("lock", "fence", "waiters", "handoff"),
    "release": ("lock", "waiters", "wake", "handoff"),
    "read": ("fence", "readers", "lock", "waiters", "handoff", "writers"),
    "write": ("fence", "readers", "lock", "waiters", "handoff", "writers"),
    "permit": ("fence", "waiters", "handoff", "marker", "slot0", "slot1", "slot2"),
    "read_release": ("readers", "lock", "waiters", "wake", "handoff"),
    "permit_release": ("waiters", "wake", "handoff", "slot0", "slot1", "slot2"),
}
RUN_ID, OWNER, WAITER = "run-1", "me", "w1"
#: Slack for TTLs and clock-based scores between the two runs of one example (ms): a loaded
#: machine (the suite in parallel) may stall a run for a few hundred; every TTL and score a
#: state holds is further than this from lapsing.
SLACK = 1_000

ttls = st.sampled_from([None, 4_000, 40_000])  # none lapses between the two runs
offsets = st.sampled_from([-5_000, -1, 5_000, 60_000])  # a sorted-set score, from now (ms)
members = st.sampled_from([OWNER, WAITER, "w2", "other"])


def _zset() -> st.SearchStrategy[dict[str, int] | None]:
    entries = st.dictionaries(members, offsets, min_size=1, max_size=3)
    alone = st.fixed_dictionaries({OWNER: offsets})  # the last reader's release
    return st.one_of(st.none(), st.none(), alone, entries)  # absent more often: the common case


def _fence(run_id: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"run_id": st.just(run_id), "token": st.integers(0, 10**6)},
        optional={"max_ttl": st.sampled_from([0, 3_000, 30_000, 90_000])},
    )


ROLE_STATES: dict[str, st.SearchStrategy[Any]] = {
    # trusted more often than not: the common case is tried on a trusted node only
    "fence": st.one_of(st.none(), _fence("run-0"), _fence(RUN_ID), _fence(RUN_ID)),
    "lock": st.none()
    | st.tuples(
        st.sampled_from(
            [
                f"{OWNER}|7|1|host|1",
                f"{OWNER}|7|1|host|1|write",
                "other|7|1|host|1",
                "semaphore|3",
                "rwlock|readers",
                "rwlock|readers",
            ]
        ),
        ttls,
    ),
    "handoff": st.one_of(st.none(), st.none(), st.tuples(st.sampled_from(["1", "2"]), ttls)),
    "wake": st.none() | st.integers(1, 3),
    "marker": st.none()
    | st.tuples(
        st.sampled_from(["semaphore|3", "semaphore|3", "semaphore|5", "other|7|1|host|1"]), ttls
    ),
    **{
        f"slot{k}": st.none()
        | st.tuples(st.sampled_from([f"{OWNER}|7|1|host|1", "other|7|1|host|1"]), ttls)
        for k in range(3)
    },
    "waiters": _zset(),
    "readers": _zset(),
    "writers": _zset(),
}
ARGS = {
    # owner, ttl_ms, run_id, suffix, registration ms, woken, waiter id
    "acquire": st.tuples(
        st.just(OWNER),
        st.sampled_from(["4000", "30000", "70000"]),  # none lapses during an example
        st.just(RUN_ID),
        st.just("|12|host|9"),
        st.sampled_from(["0", "3000"]),
        st.sampled_from(["0", "1"]),
        st.sampled_from(["", WAITER]),
    ),
    # owner, wake-up ms, reservation ms, wakes, registration ms, waiter id, kind
    "release": st.tuples(
        st.just(OWNER),
        st.just("1000"),
        st.just("50"),
        st.sampled_from(["0", "1"]),
        st.sampled_from(["0", "3000"]),
        st.sampled_from(["", WAITER]),
        st.sampled_from(["0", "2"]),
    ),
}
ARGS["read"] = ARGS["write"] = ARGS["acquire"]
ARGS["read_release"] = ARGS["release"]
ARGS["permit_release"] = ARGS["release"].map(lambda args: (*args[:6], "1"))  # a permit's
ARGS["permit"] = ARGS["acquire"].map(lambda args: (*args, "3"))  # and the semaphore's size


@pytest.fixture(scope="module")
def client(redis_node_factory_session: RedisNodeFactory) -> Iterator[Any]:
    node = redis_node_factory_session(1)[0]
    redis = node.client()
    yield redis
    redis.flushall()
    redis.close()


def _write(client: Any, keys: dict[str, str], state: dict[str, Any]) -> None:
    client.flushall()
    now = _now_ms(client)
    for role, shape in state.items():
        key = keys[role]
        if shape is None:
            continue
        if role == "fence":
            client.hset(key, mapping=shape)
        elif role in ("lock", "handoff", "marker") or role.startswith("slot"):
            value, ttl = shape
            client.set(key, value, px=ttl)
        elif role == "wake":
            client.rpush(key, *["1"] * shape)
        else:
            client.zadd(key, {member: now + offset for member, offset in shape.items()})


def _now_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _read(client: Any) -> dict[str, Any]:
    """Every key: its type, value and TTL (``None`` when it has none)."""
    found = {}
    for raw in client.keys("*"):
        key = raw.decode()
        kind = client.type(key).decode()
        if kind == "string":
            value: Any = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "zset":
            value = dict(client.zrange(key, 0, -1, withscores=True))
        else:
            value = client.lrange(key, 0, -1)
        ttl = client.pttl(key)
        found[key] = (kind, value, None if ttl < 0 else ttl)
    return found


def _same_reply(reference: Any, shipped: Any) -> bool:
    """Equal, but a "busy" reply's wait (a PTTL, the third item) within :data:`SLACK`."""
    if isinstance(reference, list) and isinstance(shipped, list) and len(reference) >= 3:
        busy = reference[0] == 0 and shipped[0] == 0
        if busy and reference[:2] == shipped[:2] and reference[3:] == shipped[3:]:
            return bool(abs(reference[2] - shipped[2]) <= SLACK)
    return bool(reference == shipped)


def _same(reference: dict[str, Any], shipped: dict[str, Any]) -> bool:
    if reference.keys() != shipped.keys():
        return False
    for key, (kind, value, ttl) in reference.items():
        other_kind, other_value, other_ttl = shipped[key]
        if kind != other_kind or (ttl is None) != (other_ttl is None):
            return False
        if ttl is not None and abs(ttl - other_ttl) > SLACK:
            return False
        if kind == "zset":
            if value.keys() != other_value.keys():
                return False
            if any(abs(value[m] - other_value[m]) > SLACK for m in value):
                return False
        elif value != other_value:
            return False
    return True


_TRUSTED = {"run_id": RUN_ID, "token": 41, "max_ttl": 3_000}
_TAKE = (OWNER, "30000", RUN_ID, "|12|host|9", "0", "0", "")
_GIVE = (OWNER, "1000", "50", "1", "0", "", "0")
#: Each script's common case, always among the examples (random states reach some of them
#: only now and then): nothing else on the keys but what the case needs.
COMMON: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "acquire": ({"fence": _TRUSTED}, _TAKE),
    "release": ({"lock": (f"{OWNER}|7|1|host|1", 40_000)}, _GIVE),
    "read": ({"fence": _TRUSTED, "lock": ("rwlock|readers", 4_000)}, _TAKE),
    "write": ({"fence": _TRUSTED}, _TAKE),
    "permit": ({"fence": _TRUSTED, "slot0": ("other|7|1|host|1", 40_000)}, (*_TAKE, "3")),
    "read_release": (
        {"readers": {OWNER: 60_000}, "lock": ("rwlock|readers", 40_000)},
        _GIVE,
    ),
    "permit_release": ({"slot1": (f"{OWNER}|7|1|host|1", 40_000)}, (*_GIVE[:6], "1")),
}


@pytest.mark.parametrize("script", sorted(SHIPPED))
def test_the_common_case_first_changes_nothing(client: Any, script: str) -> None:
    keys = {role: f"{role}:n" for role in KEYS[script]}
    roles = {role: ROLE_STATES[role] for role in KEYS[script]}

    @settings(
        max_examples=400,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(state=st.fixed_dictionaries(roles), args=ARGS[script])
    def check(state: dict[str, Any], args: tuple[str, ...]) -> None:
        names = [keys[role] for role in KEYS[script]]
        _write(client, keys, state)
        expected = client.eval(REFERENCE[script].source, len(names), *names, *args)
        wrote = _read(client)
        _write(client, keys, state)
        got = client.eval(SHIPPED[script].source, len(names), *names, *args)
        assert _same_reply(expected, got), (state, args, expected, got)
        assert _same(wrote, _read(client)), (state, args, wrote, _read(client))

    common, args = COMMON[script]
    example(state={role: common.get(role) for role in KEYS[script]}, args=args)(check)()


def test_the_reference_differs_from_the_shipped_script() -> None:
    """The test compares two scripts, not one with itself."""
    for name, script in SHIPPED.items():
        assert REFERENCE[name].source != script.source, name
