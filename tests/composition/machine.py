"""A Hypothesis state machine that composes the public lock API against real redis-server
nodes and checks the oracle of :mod:`.model` after every step.

The machine's main thread opens and closes blocks in LIFO order (``lock``, ``read_lock``,
``write_lock``, ``semaphore``, ``lock_many``, ``transaction.atomic``), holds bare ``acquire()``
leases, iterates ``@lock`` generators, runs asyncio scenarios, lets short leases expire,
force-releases names, and writes FencedModel rows under current and stale tokens. Another
thread and a second process (:mod:`.peer`) are the other callers.

``KNOWN_OPEN`` names the known defects that are still open on this branch: the rules that
would keep hitting them are constrained while they are listed (their regression tests in
``test_regressions.py`` are ``xfail(strict=True)``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import redis
from django.db import transaction
from django.db.models import F
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from django_redlock import context, locks
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired, StaleTokenError
from testproject.inventory.models import Product

from .model import (
    LOCK_NAMES,
    MARGIN,
    PERMITS,
    RW_NAME,
    SEM_NAME,
    Holding,
    Model,
    Violation,
    kind_of,
)

#: Known defects still open on this branch (see the module docstring).
KNOWN_OPEN: set[str] = set()

SHORT = (0.3, 0.4)
#: TTL of short leases that something renews (a renewal every third of it)
RENEWED_SHORT = 0.5
LONG = 30.0
#: how long the machine sleeps to let short leases expire (well past SHORT and RENEWED_SHORT)
SLEEP = 0.8
ROOT = Path(__file__).resolve().parents[2]

ttls = st.sampled_from([*SHORT, LONG, None])
renewed_ttls = st.sampled_from([RENEWED_SHORT, LONG])
lock_names = st.sampled_from(LOCK_NAMES)
any_names = st.sampled_from([*LOCK_NAMES, RW_NAME, SEM_NAME])
indexes = st.integers(0, 50)


def known(defect: str) -> bool:
    """True while ``defect`` is listed in :data:`KNOWN_OPEN`."""
    return defect in KNOWN_OPEN


class PeerProcess:
    """The second process (:mod:`.peer`), one per test, driven over a pipe."""

    def __init__(self, redlock: dict[str, Any]) -> None:
        env = {**os.environ, "REDLOCK_JSON": json.dumps(redlock), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.composition.peer"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env,
            text=True,
        )
        assert self.ask({"op": "ping"}, ready=True)["ok"]

    def ask(self, cmd: dict[str, Any], *, ready: bool = False) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if not ready:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer process ended (rc {self.proc.poll()})")
        answer: dict[str, Any] = json.loads(line)
        if answer.get("error") == "Crash":
            raise RuntimeError(f"the peer process failed: {answer['message']}")
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


@dataclass(eq=False)
class Open:
    """A block the main thread has entered and not left yet (the machine's stack is LIFO)."""

    kind: str  # "lock", "read", "write", "sem", "many" or "atomic"
    cm: Any
    holdings: list[Holding] = field(default_factory=list)
    #: a lock block that re-entered an outer lease
    reentered: bool = False
    until_commit: bool = True
    #: holdings this entry keeps renewed while it is open (auto_extend)
    renews: list[Holding] = field(default_factory=list)
    #: lock_many: the holdings it re-entered (held before it, not its own)
    borrowed: list[Holding] = field(default_factory=list)


@dataclass(eq=False)
class Gen:
    """A started ``@lock`` generator."""

    it: Any
    name: str
    holding: Holding | None
    #: its lease is an outer one of the main thread (re-entered)
    reentered: bool
    steps: int = 1


@dataclass(eq=False)
class CtxEntry:
    """The model of one entry of the main thread's active leases (``django_redlock.context``)."""

    holding: Holding
    enterable: bool


def attempt(call: Any) -> tuple[str, Any]:
    """("ok", value), ("busy", LockNotAcquired) or ("lockerror", LockError) of ``call()``."""
    try:
        return "ok", call()
    except LockNotAcquired as exc:
        return "busy", exc
    except LockError as exc:
        if isinstance(exc, LockLost):
            raise
        return "lockerror", exc


class CompositionMachine(RuleBasedStateMachine):
    """The machine; a test binds ``alias``, ``urls``, ``prefix`` and ``peer`` on a subclass."""

    alias: ClassVar[str] = "default"
    urls: ClassVar[list[str]] = []
    prefix: ClassVar[str] = ""
    peer: ClassVar[PeerProcess | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.rid = uuid.uuid4().hex[:8]
        self.m = locks[self.alias]
        self.model = Model(peer_released=self._peer_released)
        self.stack: list[Open] = []
        self.free: list[Holding] = []  # bare acquire() leases of the main thread
        self.gens: list[Gen] = []
        self.ctx: list[CtxEntry] = []
        self.clients = [redis.Redis.from_url(url) for url in self.urls]
        self.rows: dict[str, int] = {}
        for name in (*LOCK_NAMES, RW_NAME, SEM_NAME):
            self.rows[name] = Product.objects.create(name=self.full(name), stock=0).pk
            self.model.row_tokens[name] = 0

    # -- helpers -------------------------------------------------------------------------------
    def full(self, name: str) -> str:
        return f"cx:{self.rid}:{name}"

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def depth(self) -> int:
        return sum(1 for entry in self.stack if entry.kind == "atomic")

    def _peer_released(self, peer_id: int) -> bool:
        assert self.peer is not None
        return bool(self.peer.ask({"op": "status", "id": peer_id})["released"])

    def holding_of(self, lease: Any) -> Holding | None:
        for holding in self.model.holdings:
            if holding.lease is lease:
                return holding
        return None

    def main_holdings(self) -> list[Holding]:
        """Leases of the main thread that are not released (blocks, bare, kept, generators)."""
        return [
            h
            for h in self.model.holdings
            if h.local and h.who in ("main", "gen") and not h.released
        ]

    def enterable(self, name: str) -> tuple[Holding | None, bool]:
        """The lease a ``lock(name)`` of the main thread must re-enter, and whether re-entry
        is only allowed, not promised (a suspended generator's or an asyncio task's)."""
        for entry in reversed(self.stack):
            if entry.kind == "lock" and entry.holdings[0].name == name:
                return entry.holdings[0], False
            if entry.kind == "many":
                for h in entry.holdings:
                    if h.name == name and not h.released:
                        return h, known("B8")
        for h in self.model.holdings:
            if h.name == name and h.kept_level and not h.released and h.kind == "lock":
                if h.who == "main":
                    return h, known("B6")
                return h, True  # kept for an asyncio task of this thread: either is fine
        for gen in self.gens:
            if gen.holding is not None and gen.holding.name == name and not gen.holding.released:
                return gen.holding, True
        return None, False

    def claim(self, holding: Holding) -> None:
        """A new main-thread lease stamps its name's row (so older leases become stale)."""
        pk = self.rows[holding.name]
        expected = holding.token >= self.model.row_tokens[holding.name]
        try:
            with transaction.atomic():
                Product.objects.claim(pk=pk, token=holding.token)
            done = True
        except StaleTokenError:
            done = False
        if done != expected:
            raise Violation(
                f"claim of row {holding.name!r} with the new token {holding.token} "
                f"{'succeeded' if done else 'was refused'}; row token "
                f"{self.model.row_tokens[holding.name]}"
            )
        if done:
            self.model.row_written(holding.name, holding.token)

    def granted(
        self, kind: str, name: str, lease: Any, who: str = "main", **fields: Any
    ) -> Holding:
        holding = self.model.grant(kind, name, who, lease.token, lease.ttl, lease=lease, **fields)
        if who == "main":
            self.claim(holding)
        return holding

    def expectation(self, name: str, kind: str, *, own_ok: bool = False) -> str:
        """What a new, non-reentrant attempt (timeout 0) of ``kind`` on ``name`` must give,
        judged before the attempt: "ok" when it surely finds room, else "maybe" (the attempt
        is judged "busy" afterwards if a conflicting holder was valid throughout)."""
        return "ok" if self.model.free_for(name, kind, self.now()) else "maybe"

    def judge(
        self, what: str, before: str, outcome: str, name: str, kind: str, new: Any = ()
    ) -> None:
        """Check an attempt's outcome: "ok" expected must succeed; a conflicting holder that is
        still valid after the attempt (so it was valid throughout) means it must have failed."""
        blockers = self.model.conflicts(name, kind, self.now(), exclude=new)
        if outcome == "ok" and blockers:
            raise Violation(f"{what}: granted while {blockers} held {name!r}")
        if outcome == "busy" and before == "ok":
            raise Violation(
                f"{what}: LockNotAcquired although {name!r} was free: "
                f"{[h for h in self.model.holdings if h.name == name]}"
            )
        if outcome == "lockerror":
            raise Violation(f"{what}: unexpected LockError")

    def ctx_push(self, holding: Holding, enterable: bool) -> None:
        self.ctx.append(CtxEntry(holding, enterable))

    def ctx_pop(self, holding: Holding) -> None:
        for i in range(len(self.ctx) - 1, -1, -1):
            if self.ctx[i].holding is holding and self.ctx[i].enterable:
                del self.ctx[i]
                return

    def ctx_drop(self, holding: Holding) -> None:
        self.ctx = [entry for entry in self.ctx if entry.holding is not holding]

    def released(self, holding: Holding) -> None:
        holding.released = True
        holding.renewers = 0
        holding.kept_level = 0
        self.ctx_drop(holding)

    def stop_renewing(self, holding: Holding) -> None:
        holding.renewers -= 1
        if holding.renewers == 0:
            holding.renewed_by_nodes(self.now())

    def lost_at_exit(self, holding: Holding) -> str:
        """Whether leaving a block of ``holding`` must report it lost: "yes", "no" or "maybe"."""
        if holding.forced:
            return "yes"
        now = self.now()
        if holding.renewers == 0 and holding.node_end < now:
            return "yes"
        if holding.lease.validity > MARGIN:
            return "no"
        return "maybe"

    # -- blocks ------------------------------------------------------------------------------
    def _block(
        self, kind: str, name: str, ttl: float | None, auto_extend: bool, until_commit: bool
    ) -> Any:
        full = self.full(name)
        opts = {"ttl": ttl, "timeout": 0, "auto_extend": auto_extend, "until_commit": until_commit}
        if kind == "lock":
            return self.m.lock(full, **opts)
        if kind == "read":
            return self.m.read_lock(full, **opts)
        if kind == "write":
            return self.m.write_lock(full, **opts)
        return self.m.semaphore(full, PERMITS, **opts)

    def _enter(
        self, kind: str, name: str, ttl: float | None, auto_extend: bool, until_commit: bool
    ) -> None:
        if auto_extend and ttl in SHORT:
            ttl = RENEWED_SHORT
        cm = self._block(kind, name, ttl, auto_extend, until_commit)
        target, optional = self.enterable(name) if kind == "lock" else (None, False)
        own_rw = [h for h in self.main_holdings() if h.name == name and h.kind in ("read", "write")]
        before = self.expectation(name, "lock" if kind == "lock" else kind)
        outcome, value = attempt(cm.__enter__)
        what = f"{kind}({name!r}, ttl={ttl}, auto_extend={auto_extend})"
        if target is not None:
            self._reentry(
                what, cm, target, optional, outcome, value, ttl, auto_extend, until_commit
            )
            return
        if (kind == "write" and own_rw) or (
            kind == "read" and any(h.kind == "write" for h in own_rw)
        ):
            # upgrade, downgrade or a nested writer: never wait for itself
            if outcome == "busy":
                raise Violation(f"{what} waited for its own {own_rw} (LockNotAcquired)")
            if outcome == "ok":
                if (
                    kind == "write"
                    and own_rw
                    and own_rw[0].kind == "write"
                    and value is own_rw[0].lease
                ):
                    self.stack.append(Open(kind, cm, [own_rw[0]], reentered=True))
                    return
                raise Violation(f"{what} granted while this thread holds {own_rw}")
            return
        new_holding = None
        if outcome == "ok":
            new_holding = self.granted(kind, name, value)
            if auto_extend:
                new_holding.renewers += 1
        self.judge(what, before, outcome, name, kind, new=(new_holding,))
        if new_holding is None:
            return
        entry = Open(kind, cm, [new_holding], until_commit=until_commit)
        if auto_extend:
            entry.renews.append(new_holding)
        self.stack.append(entry)
        self.ctx_push(new_holding, enterable=kind == "lock")

    def _reentry(
        self, what, cm, target, optional, outcome, value, ttl, auto_extend, until_commit
    ) -> None:
        if outcome == "busy":
            if optional:
                return
            raise Violation(f"{what} waited for its own lease {target} (LockNotAcquired)")
        if outcome != "ok":
            raise Violation(f"{what}: {value!r} instead of re-entering {target}")
        if value is not target.lease:
            if optional and value.token > target.token:
                # a new lease: then the target must not have been valid
                holding = self.granted("lock", target.name, value)
                self.judge(what, "maybe", "ok", target.name, "lock", new=(holding,))
                entry = Open("lock", cm, [holding], until_commit=until_commit)
                self.stack.append(entry)
                self.ctx_push(holding, enterable=True)
                return
            raise Violation(f"{what} got {value!r}, not the held lease {target}")
        if value.token != target.token:
            raise Violation(f"{what}: the re-entered lease's token changed")
        entry = Open("lock", cm, [target], reentered=True, until_commit=until_commit)
        if not known("A3"):
            now = self.now()
            if ttl is not None and ttl > target.longest_ttl:
                target.longest_ttl = ttl
            if ttl is not None and not target.forced:
                if target.lease.validity < min(ttl * 0.5, ttl - 0.15):
                    raise Violation(
                        f"{what}: re-entry kept validity {target.lease.validity:.3f}, "
                        f"below the inner ttl {ttl}"
                    )
                target.renewed_by_nodes(now)
            if auto_extend:
                target.renewers += 1
                entry.renews.append(target)
        self.stack.append(entry)

    @precondition(lambda self: len(self.stack) < 8)
    @rule(name=lock_names, ttl=ttls, auto_extend=st.booleans(), until_commit=st.booleans())
    def enter_lock(
        self, name: str, ttl: float | None, auto_extend: bool, until_commit: bool
    ) -> None:
        """``with lock(name)``: a new lease, or a re-entry of the thread's own."""
        if known("A3") and self.enterable(name)[0] is not None:
            ttl, auto_extend = None, False
        self._enter("lock", name, ttl, auto_extend, until_commit)

    @precondition(lambda self: len(self.stack) < 8)
    @rule(mode=st.sampled_from(["read", "write"]), ttl=ttls, auto_extend=st.booleans())
    def enter_rw(self, mode: str, ttl: float | None, auto_extend: bool) -> None:
        """``with read_lock(r)`` / ``with write_lock(r)``."""
        own = [h for h in self.main_holdings() if h.name == RW_NAME]
        if known("B5") and own:
            return
        self._enter(mode, RW_NAME, ttl, auto_extend, True)

    @precondition(lambda self: len(self.stack) < 8)
    @rule(ttl=ttls, auto_extend=st.booleans())
    def enter_semaphore(self, ttl: float | None, auto_extend: bool) -> None:
        """``with semaphore(s, 2)`` (not re-entrant: a nested block takes another permit)."""
        self._enter("sem", SEM_NAME, ttl, auto_extend, True)

    @precondition(lambda self: len(self.stack) < 8)
    @rule(
        names=st.lists(lock_names, min_size=1, max_size=4),
        container=st.sampled_from(["list", "tuple", "set", "generator"]),
        ttl=ttls,
        auto_extend=st.booleans(),
    )
    def enter_many(
        self, names: list[str], container: str, ttl: float | None, auto_extend: bool
    ) -> None:
        """``with lock_many(names)`` (one name, repeated names, overlapping sets)."""
        distinct = list(dict.fromkeys(names))
        if known("A1") and len(distinct) == 1:
            return
        if known("SPEC15-repeat") and len(distinct) != len(names):
            return
        if auto_extend and ttl in SHORT:
            ttl = RENEWED_SHORT
        owned = {n: self.enterable(n) for n in distinct}
        owned = {n: t for n, t in owned.items() if t[0] is not None}
        if known("B8") and owned:
            return
        fulls = [self.full(n) for n in names]
        arg: Any = {
            "list": fulls,
            "tuple": tuple(fulls),
            "set": set(fulls),
            "generator": (n for n in fulls),
        }[container]
        what = f"lock_many({names!r} as {container}, ttl={ttl}, auto_extend={auto_extend})"
        before = {n: self.expectation(n, "lock") for n in distinct}
        try:
            cm = self.m.lock_many(arg, ttl=ttl, timeout=0, auto_extend=auto_extend)
            outcome, value = attempt(cm.__enter__)
        except (ValueError, TypeError) as exc:
            raise Violation(f"{what} refused its names: {exc!r}") from exc
        if owned:
            if outcome == "busy" and not all(optional for _, optional in owned.values()):
                raise Violation(f"{what} waited for the thread's own {owned} (LockNotAcquired)")
            if outcome != "ok":
                return
        elif outcome != "ok":
            if all(b == "ok" for b in before.values()):
                self.judge(what, "ok", outcome, distinct[0], "lock")
            return
        held = value
        if sorted(held.leases) != sorted(self.full(n) for n in distinct):
            raise Violation(f"{what} holds {sorted(held.leases)}")
        entry = Open("many", cm, until_commit=True)
        new: list[Holding] = []
        for full, lease in held.leases.items():
            name = full.rsplit(":", 1)[1]
            target = owned.get(name, (None, False))[0]
            if target is not None and lease is target.lease:
                entry.borrowed.append(target)
                entry.holdings.append(target)
                continue
            holding = self.granted("lock", name, lease)
            if auto_extend:
                holding.renewers += 1
                entry.renews.append(holding)
            new.append(holding)
            entry.holdings.append(holding)
        for holding in new:
            self.judge(what, "maybe", "ok", holding.name, "lock", new=tuple(new))
        self.stack.append(entry)
        for holding in new:
            self.ctx_push(holding, enterable=False)

    @precondition(lambda self: len(self.stack) < 8)
    @rule()
    def enter_atomic(self) -> None:
        """``with transaction.atomic()`` (a savepoint when nested)."""
        cm = transaction.atomic()
        cm.__enter__()
        self.model.atomic_entered()
        self.stack.append(Open("atomic", cm))

    @precondition(lambda self: bool(self.stack))
    @rule(raising=st.booleans())
    def exit_block(self, raising: bool) -> None:
        """Leave the innermost block, normally or with an exception (a rollback for atomic)."""
        entry = self.stack[-1]
        if entry.kind == "atomic":
            self._exit_atomic(raising)
            return
        self.stack.pop()
        exc = (
            (RuntimeError, RuntimeError("the block raised"), None)
            if raising
            else (None, None, None)
        )
        kept = entry.until_commit and self.depth() > 0
        what = f"leaving {entry.kind} block of {[h.name for h in entry.holdings]}"
        if entry.reentered:
            must = "maybe"
            holding = entry.holdings[0]
            if holding.renewers == 0 and holding.node_end < self.now() and not holding.forced:
                must = "yes"
            elif holding.lease.validity > MARGIN:
                must = "no"
        else:
            verdicts = [self.lost_at_exit(h) for h in entry.holdings if h not in entry.borrowed]
            must = (
                "yes"
                if "yes" in verdicts
                else ("no" if all(v == "no" for v in verdicts) else "maybe")
            )
            if kept:
                # only the client-side view is checked at a kept exit
                must = "maybe" if must == "yes" else must
        try:
            entry.cm.__exit__(*exc)
            raised = None
        except LockLost as lost:
            raised = lost
        if raising and raised is not None:
            raise Violation(f"{what} with an exception raised LockLost over it")
        if not raising:
            if raised is not None and must == "no":
                raise Violation(f"{what}: LockLost although the lease was valid: {raised}")
            if raised is None and must == "yes" and not entry.reentered and not kept:
                raise Violation(f"{what}: the lease was lost, yet no LockLost")
        for holding in entry.renews:
            self.stop_renewing(holding)
        if entry.reentered:
            return
        for holding in entry.holdings:
            if holding in entry.borrowed:
                if holding.lease.released:
                    raise Violation(f"{what} released the outer lease it re-entered: {holding}")
                continue
            if kept:
                holding.kept_level = self.depth()
                holding.renewers += 1
                self.ctx_drop(holding)
                if holding.lease.released:
                    raise Violation(f"{what} inside a transaction released it before the commit")
            else:
                if not holding.lease.released:
                    raise Violation(f"{what}: the lease is not released: {holding}")
                self.released(holding)

    def _exit_atomic(self, rollback: bool) -> None:
        level = self.depth()
        entry = self.stack.pop()
        if rollback:
            entry.cm.__exit__(RuntimeError, RuntimeError("roll back"), None)
        else:
            entry.cm.__exit__(None, None, None)
        self.model.atomic_left(rolled_back=rollback)
        for holding in self.model.holdings:
            if not holding.kept_level or holding.released:
                continue
            ends = level == 1 or (rollback and holding.kept_level >= level)
            if ends:
                if not holding.lease.released:
                    how = "rollback" if rollback else "commit"
                    raise Violation(f"the {how} of atomic level {level} left {holding} held")
                self.released(holding)
            elif holding.kept_level == level:
                holding.kept_level = level - 1

    # -- bare leases -----------------------------------------------------------------------------
    @rule(
        name=any_names, ttl=ttls, auto_extend=st.booleans(), mode=st.sampled_from(["read", "write"])
    )
    def acquire(self, name: str, ttl: float | None, auto_extend: bool, mode: str) -> None:
        """``lease = acquire(name)``: never re-entrant (busy while anyone holds it, this thread
        included)."""
        if auto_extend and ttl in SHORT:
            ttl = RENEWED_SHORT
        kind = {"lock": "lock", "sem": "sem", "rw": mode}[kind_of(name)]
        extra: dict[str, Any] = {}
        if kind == "sem":
            extra["permits"] = PERMITS
        elif kind in ("read", "write"):
            extra["rw"] = kind
        before = self.expectation(name, kind)
        own_rw = [h for h in self.main_holdings() if h.name == name and h.kind in ("read", "write")]
        outcome, value = attempt(
            lambda: self.m.acquire(
                self.full(name), ttl=ttl, timeout=0, auto_extend=auto_extend, **extra
            )
        )
        what = f"acquire({name!r}, {kind}, ttl={ttl}, auto_extend={auto_extend})"
        if outcome == "lockerror" and own_rw and kind == "write":
            return  # refusing an upgrade at once is fine
        holding = None
        if outcome == "ok":
            holding = self.granted(kind, name, value)
            if auto_extend:
                holding.renewers += 1
            self.free.append(holding)
            self.ctx_push(holding, enterable=False)
        self.judge(what, before, outcome, name, kind, new=(holding,))

    @precondition(lambda self: bool(self.free))
    @rule(index=indexes)
    def release(self, index: int) -> None:
        """``lease.release()`` of a bare lease: True if it was still held."""
        holding = self.free.pop(index % len(self.free))
        must = self.lost_at_exit(holding)
        held = holding.lease.release()
        if held and must == "yes":
            raise Violation(f"release() of {holding} said it was held, but it was lost")
        if not held and must == "no":
            raise Violation(f"release() of the valid {holding} said it was not held")
        self.released(holding)

    @precondition(lambda self: bool(self.main_holdings()))
    @rule(index=indexes, ttl=st.sampled_from([*SHORT, LONG]))
    def extend(self, index: int, ttl: float) -> None:
        """``lease.extend(ttl)`` of a lease of the main thread (bare, block or kept)."""
        holdings = [h for h in self.main_holdings() if h.who == "main"]
        if not holdings:
            return
        holding = holdings[index % len(holdings)]
        must = self.lost_at_exit(holding)
        try:
            holding.lease.extend(ttl=ttl)
            lost = False
        except LockLost:
            lost = True
        if lost and must == "no":
            raise Violation(f"extend() of the valid {holding} raised LockLost")
        if not lost and must == "yes":
            raise Violation(f"extend() of the lost {holding} succeeded")
        if not lost:
            holding.longest_ttl = max(holding.longest_ttl, ttl)
            holding.renewed_by_nodes(self.now())

    # -- other callers ---------------------------------------------------------------------------
    @rule(name=any_names, mode=st.sampled_from(["read", "write"]))
    def other_thread(self, name: str, mode: str) -> None:
        """Another thread tries the name once (timeout 0) and lets go at once: it must fail
        while a conflicting lease (the main thread's too) is valid."""
        kind = {"lock": "lock", "sem": "sem", "rw": mode}[kind_of(name)]
        extra: dict[str, Any] = {"permits": PERMITS} if kind == "sem" else {}
        if kind in ("read", "write"):
            extra["rw"] = kind
        before = self.expectation(name, kind)
        result: list[tuple[str, Any]] = []

        def run() -> None:
            outcome, value = attempt(
                lambda: self.m.acquire(self.full(name), ttl=LONG, timeout=0, **extra)
            )
            token = None
            if outcome == "ok":
                token = value.token
                value.release()
            result.append((outcome, token))

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        outcome, token = result[0]
        if outcome == "ok":
            self.model.check_token(kind, name, token, "thread")
        self.judge(f"another thread's acquire({name!r}, {kind})", before, outcome, name, kind)

    @rule(
        name=any_names, ttl=st.sampled_from([*SHORT, LONG]), mode=st.sampled_from(["read", "write"])
    )
    def peer_acquire(self, name: str, ttl: float, mode: str) -> None:
        """The second process takes the name (timeout 0) and keeps it."""
        assert self.peer is not None
        kind = {"lock": "lock", "sem": "sem", "rw": mode}[kind_of(name)]
        cmd: dict[str, Any] = {
            "op": "acquire",
            "alias": self.alias,
            "name": self.full(name),
            "ttl": ttl,
        }
        if kind == "sem":
            cmd["permits"] = PERMITS
        elif kind in ("read", "write"):
            cmd["rw"] = kind
        before = self.expectation(name, kind)
        sent = self.now()
        answer = self.peer.ask(cmd)
        holding = None
        if answer["ok"]:
            holding = self.model.grant(
                kind,
                name,
                "peer",
                answer["token"],
                ttl,
                peer_id=answer["id"],
                valid_until=sent + answer["validity"],
            )
            outcome = "ok"
        else:
            outcome = {"LockNotAcquired": "busy"}.get(answer["error"], "lockerror")
        self.judge(
            f"the peer's acquire({name!r}, {kind})", before, outcome, name, kind, new=(holding,)
        )

    @precondition(lambda self: any(h.who == "peer" and not h.released for h in self.model.holdings))
    @rule(index=indexes)
    def peer_release(self, index: int) -> None:
        """The second process releases one of its leases."""
        assert self.peer is not None
        held = [h for h in self.model.holdings if h.who == "peer" and not h.released]
        holding = held[index % len(held)]
        if holding.pending_release is not None:
            return
        answer = self.peer.ask({"op": "release", "id": holding.peer_id})
        if holding.forced and answer["held"]:
            raise Violation(f"the peer's release of the force-released {holding} said held")
        self.released(holding)

    @rule(name=st.sampled_from([*LOCK_NAMES, RW_NAME]))
    def force_release(self, name: str) -> None:
        """The operator force-releases the name: every holder of it becomes stale."""
        self.m.force_release(self.full(name))
        for holding in self.model.of(name):
            holding.forced = True

    # -- time ----------------------------------------------------------------------------------
    def _short_lived(self) -> bool:
        now = self.now()
        return any(
            not h.released and (h.renewers > 0 or (h.node_end > now and h.longest_ttl < 1))
            for h in self.model.holdings
        )

    @precondition(lambda self: self._short_lived())
    @rule()
    def sleep_past_short_ttls(self) -> None:
        """Sleep well past every short TTL: unrenewed short leases expire, renewed ones (auto
        extend, kept until the commit, re-entered with auto_extend) must still be held."""
        time.sleep(SLEEP)
        for holding in self.model.holdings:
            if holding.released or holding.forced or holding.renewers == 0 or not holding.local:
                continue
            if holding.lease.lost or holding.lease.validity <= 0:
                raise Violation(f"{holding} should be kept alive, but it was lost")

    # -- FencedModel -----------------------------------------------------------------------------
    @precondition(lambda self: any(h.who != "thread" for h in self.model.holdings))
    @rule(index=indexes, how=st.sampled_from(["update", "save"]))
    def write_with_token(self, index: int, how: str) -> None:
        """Write the name's row with a lease's token (current or stale): refused exactly when a
        newer token wrote the row (a stale lease whose name was re-taken is always refused)."""
        holdings = [h for h in self.model.holdings if h.who != "thread"]
        holding = holdings[index % len(holdings)]
        pk, token = self.rows[holding.name], holding.token
        row_token = self.model.row_tokens[holding.name]
        refused = False
        try:
            with transaction.atomic():
                if how == "update":
                    count = Product.objects.fenced(token).filter(pk=pk).update(stock=F("stock") + 1)
                    refused = count == 0
                else:
                    product = Product.objects.get(pk=pk)
                    product.stock += 1
                    product.save(fence_token=token)
        except StaleTokenError:
            refused = True
        if refused != (token < row_token):
            raise Violation(
                f"a write to row {holding.name!r} with token {token} of {holding} was "
                f"{'refused' if refused else 'accepted'}; the row's token was {row_token}"
            )
        if not refused:
            self.model.row_written(holding.name, token)

    def _innermost(self) -> Holding | None:
        for entry in reversed(self.ctx):
            if not entry.holding.released:
                return entry.holding
        return None

    @precondition(lambda self: not self.gens)
    @rule(name=any_names)
    def write_under_context(self, name: str) -> None:
        """A plain ``update()`` of a row: guarded by the innermost active lease of the thread
        (bare leases until released, blocks until they end), else unguarded."""
        lease_holding = self._innermost()
        if lease_holding is not None:
            name = lease_holding.name
        pk = self.rows[name]
        row_token = self.model.row_tokens[name]
        with transaction.atomic():
            count = Product.objects.filter(pk=pk).update(stock=F("stock") + 1)
            written = Product.objects.get(pk=pk).fence_token
        if lease_holding is None:
            if count != 1 or written != row_token:
                raise Violation(
                    f"an unguarded update of {name!r} gave {count} rows, token {written}"
                )
            return
        accepted = lease_holding.token >= row_token
        if count != int(accepted) or (accepted and written != lease_holding.token):
            raise Violation(
                f"an update of row {name!r} inside {lease_holding} (row token {row_token}) "
                f"updated {count} rows and left token {written}"
            )
        if accepted:
            self.model.row_written(name, lease_holding.token)

    # -- generators --------------------------------------------------------------------------------
    def _generator(self, name: str, ttl: float | None, skip: bool, nested: bool) -> Any:
        m, alias, full = self.m, self.alias, self.full(name)

        @m.lock(f"cx:{self.rid}:{{0}}", ttl=ttl, timeout=0, on_busy="skip" if skip else "raise")
        def rows(short: str) -> Any:
            for step in range(3):
                found = context.find(alias, full)
                inner = None
                if nested and step == 0:
                    with m.lock(full, timeout=0) as lease:
                        inner = lease
                yield found, inner

        return rows(name)

    @precondition(lambda self: len(self.gens) < 3)
    @rule(name=lock_names, ttl=ttls, skip=st.booleans(), nested=st.booleans())
    def start_generator(self, name: str, ttl: float | None, skip: bool, nested: bool) -> None:
        """An ``@lock`` generator function: the lease is held from the first iteration until
        it finishes or is closed; ``on_busy="skip"`` yields nothing when busy."""
        if known("A2"):
            return
        it = self._generator(name, ttl, skip, nested)
        target, _optional = self.enterable(name)
        before = self.expectation(name, "lock")
        what = f"@lock generator of {name!r} (skip={skip}, nested={nested})"
        try:
            found, inner = next(it)
            outcome = "ok"
        except StopIteration:
            outcome = "skipped"
        except LockNotAcquired:
            outcome = "busy"
        if outcome == "skipped" and not skip:
            raise Violation(f"{what} yielded nothing")
        if outcome != "ok":
            if target is not None and target.surely_valid(self.now()):
                return  # another caller's view of the thread's lease is allowed
            self.judge(what, before, "busy", name, "lock")
            return
        if found is None:
            it.close()
            raise Violation(f"{what}: the body runs without its lease (A2)")
        if nested and inner is not found:
            raise Violation(f"{what}: lock() inside the body did not re-enter ({inner} vs {found})")
        holding = self.holding_of(found)
        reentered = holding is not None
        if holding is None:
            holding = self.granted("lock", name, found, who="gen")
            self.judge(what, before, "ok", name, "lock", new=(holding,))
        elif target is None:
            raise Violation(f"{what} re-entered {holding}, which this thread does not hold")
        self.gens.append(Gen(it, name, holding, reentered))

    def _gen_done(self, gen: Gen, how: str) -> None:
        self.gens.remove(gen)
        holding = gen.holding
        if holding is None or gen.reentered:
            return
        if self.depth() > 0:
            if holding.lease.released:
                raise Violation(
                    f"a generator {how} inside a transaction released before the commit"
                )
            holding.kept_level = self.depth()
            holding.renewers += 1
            return
        if not holding.lease.released:
            raise Violation(f"a generator {how}, but its lease {holding} is still held")
        self.released(holding)

    @precondition(lambda self: bool(self.gens))
    @rule(index=indexes)
    def advance_generator(self, index: int) -> None:
        """``next()`` of a started generator: the same lease, until it finishes."""
        gen = self.gens[index % len(self.gens)]
        must = "maybe" if gen.holding is None else self.lost_at_exit(gen.holding)
        try:
            found, _inner = next(gen.it)
        except StopIteration:
            self._gen_done(gen, "finished")
            return
        except LockLost:
            if must == "no":
                raise
            self._gen_done(gen, "finished (lost)")
            return
        if gen.holding is not None and found is not gen.holding.lease:
            raise Violation(f"a generator's body now sees {found}, not its lease {gen.holding}")

    @precondition(lambda self: bool(self.gens))
    @rule(index=indexes)
    def close_generator(self, index: int) -> None:
        """``close()`` of a started generator releases its lease (or keeps it to the commit)."""
        gen = self.gens[index % len(self.gens)]
        gen.it.close()
        self._gen_done(gen, "closed")

    # -- asyncio ---------------------------------------------------------------------------------
    @rule(
        name=lock_names,
        variant=st.sampled_from(["alock", "alock_many", "agen"]),
        ttl=ttls,
        inner_ttl=ttls,
        inner_auto=st.booleans(),
    )
    def asyncio_scenario(
        self, name: str, variant: str, ttl: float | None, inner_ttl: float | None, inner_auto: bool
    ) -> None:
        """An asyncio task (its own caller): alock / alock_many / an async @lock generator,
        with a re-entry in the same task, a child task and aacquire() that must not get in."""
        if variant == "agen" and known("A2"):
            return
        if variant == "alock_many" and known("A1"):
            return
        if known("A3"):
            inner_ttl, inner_auto = None, False
        if inner_auto and inner_ttl in SHORT:
            inner_ttl = RENEWED_SHORT
        full, m, alias = self.full(name), self.m, self.alias
        before = self.expectation(name, "lock")
        obs: dict[str, Any] = {}

        async def inner_checks(outer: Any) -> None:
            obs["outer"] = outer
            try:
                async with m.alock(full, ttl=inner_ttl, timeout=0, auto_extend=inner_auto) as inner:
                    obs["reentered"] = inner is outer
                    obs["inner_validity"] = inner.validity
            except LockNotAcquired:
                obs["reentered"] = "waited for itself"

            async def child() -> str:
                try:
                    async with m.alock(full, timeout=0):
                        return "got it"
                except LockNotAcquired:
                    return "busy"

            obs["child"] = await asyncio.get_running_loop().create_task(child())
            try:
                lease = await m.aacquire(full, timeout=0)
                await lease.arelease()
                obs["aacquire"] = "got it"
            except LockNotAcquired:
                obs["aacquire"] = "busy"

        async def scenario() -> None:
            try:
                if variant == "alock":
                    async with m.alock(full, ttl=ttl, timeout=0) as outer:
                        await inner_checks(outer)
                elif variant == "alock_many":
                    async with m.alock_many([full], ttl=ttl, timeout=0) as held:
                        await inner_checks(held.leases[full])
                else:

                    @m.lock(f"cx:{self.rid}:{{0}}", ttl=ttl, timeout=0)
                    async def agen(short: str) -> Any:
                        yield context.find(alias, full)

                    async for found in agen(name):
                        if found is None:
                            obs["agen"] = "no lease in the body"
                        else:
                            await inner_checks(found)
                obs["outcome"] = "ok"
            except LockNotAcquired:
                obs["outcome"] = "busy"

        asyncio.run(scenario())
        what = f"asyncio {variant}({name!r})"
        if obs.get("agen"):
            raise Violation(f"{what}: the async generator's body runs without its lease (A2)")
        outcome = obs["outcome"]
        if outcome != "ok":
            self.judge(what, before, outcome, name, "lock")
            return
        lease = obs["outer"]
        holding = self.granted("lock", name, lease, who="async")
        self.judge(what, before, "ok", name, "lock", new=(holding,))
        if obs["reentered"] is not True:
            raise Violation(f"{what}: a nested alock in the same task: {obs['reentered']}")
        if inner_ttl is not None and obs["inner_validity"] < min(inner_ttl * 0.5, inner_ttl - 0.15):
            raise Violation(
                f"{what}: re-entry kept validity {obs['inner_validity']:.3f} < {inner_ttl}"
            )
        if obs["child"] != "busy" or obs["aacquire"] != "busy":
            raise Violation(f"{what}: another task / aacquire got the held name: {obs}")
        if self.depth() > 0 and variant != "agen":
            if lease.released:
                raise Violation(f"{what} ended inside a transaction and released before the commit")
            holding.kept_level = self.depth()
            holding.renewers += 1
        elif not lease.released:
            if self.depth() == 0:
                raise Violation(f"{what} ended, but its lease is still held")
            holding.kept_level = self.depth()
            holding.renewers += 1
        else:
            self.released(holding)

    # -- waiting ---------------------------------------------------------------------------------
    def _free_lock_name(self) -> str | None:
        now = self.now()
        for name in LOCK_NAMES:
            if self.model.free_for(name, "lock", now) and self.enterable(name)[0] is None:
                return name
        return None

    @precondition(lambda self: self._free_lock_name() is not None)
    @rule(holder=st.sampled_from(["releases", "expires"]))
    def wait_for_the_peer(self, holder: str) -> None:
        """The peer holds a free name and lets go (a release after 0.6 s, or a 0.3 s TTL that
        runs out); a waiter with ttl 0.5 must get it within 3 s, and its lease must be valid
        (validity counts from the winning attempt)."""
        if known("D3") and holder == "expires":
            return
        assert self.peer is not None
        name = self._free_lock_name()
        assert name is not None
        ttl = LONG if holder == "releases" else 0.3
        sent = self.now()
        answer = self.peer.ask(
            {"op": "acquire", "alias": self.alias, "name": self.full(name), "ttl": ttl}
        )
        if not answer["ok"]:
            raise Violation(f"the peer could not take the free name {name!r}: {answer}")
        peer_holding = self.model.grant(
            "lock",
            name,
            "peer",
            answer["token"],
            ttl,
            peer_id=answer["id"],
            valid_until=sent + answer["validity"],
        )
        if holder == "releases":
            self.peer.ask({"op": "release_later", "id": answer["id"], "delay": 0.6})
            peer_holding.pending_release = sent + 0.6
        try:
            lease = self.m.acquire(self.full(name), ttl=0.5, timeout=3)
        except LockNotAcquired as exc:
            raise Violation(
                f"a waiter did not get {name!r} within 3 s after its holder {holder}"
            ) from exc
        valid = lease.validity
        if holder == "releases":
            if not self._peer_released(answer["id"]):
                raise Violation(f"the waiter got {name!r} before the peer released it")
            self.released(peer_holding)
        else:
            peer_holding.node_end = 0.0  # it ran out: the waiter got it
        holding = self.granted("lock", name, lease)
        self.free.append(holding)
        self.ctx_push(holding, enterable=False)
        if lease.lost or valid <= 0:
            raise Violation(
                f"a woken waiter's fresh lease of {name!r} is already lost (validity {valid:.3f})"
            )

    @precondition(lambda self: self._free_lock_name() is not None and not known("D1"))
    @rule()
    def skip_when_busy(self) -> None:
        """``@lock(..., on_busy="skip")`` (no timeout given) on a busy name makes one attempt
        and skips, although the holder lets go a second later."""
        assert self.peer is not None
        name = self._free_lock_name()
        assert name is not None
        sent = self.now()
        answer = self.peer.ask(
            {"op": "acquire", "alias": self.alias, "name": self.full(name), "ttl": LONG}
        )
        holding = self.model.grant(
            "lock",
            name,
            "peer",
            answer["token"],
            LONG,
            peer_id=answer["id"],
            valid_until=sent + answer["validity"],
        )
        self.peer.ask({"op": "release_later", "id": answer["id"], "delay": 1.0})
        holding.pending_release = sent + 1.0

        @self.m.lock(self.full(name), on_busy="skip")
        def job() -> str:
            return "ran"

        result = job()
        if result is not None:
            raise Violation(f"on_busy='skip' ran the job on the busy name {name!r} (it waited)")

    # -- the oracle ------------------------------------------------------------------------------
    @invariant()
    def one_holder_at_a_time(self) -> None:
        """At most one valid holder of a lock name, readers xor a writer, at most N permits."""
        self.model.check_exclusion(self.now())

    @invariant()
    def open_holders_still_hold(self) -> None:
        """An open block's lease, and a suspended generator's, is never released under it."""
        for entry in self.stack:
            for holding in entry.holdings:
                if holding.lease.released:
                    raise Violation(f"the open {entry.kind} block's lease {holding} was released")
        for gen in self.gens:
            if gen.holding is not None and gen.holding.lease.released:
                raise Violation(f"a suspended generator's lease {gen.holding} was released")

    def node_keys(self) -> list[tuple[int, str, int]]:
        """(node, key, pttl ms) of every key of this example on the alias's nodes."""
        found = []
        for index, client in enumerate(self.clients):
            for key in client.scan_iter(match=f"{self.prefix}*cx:{self.rid}:*", count=1000):
                found.append((index, key.decode(), int(client.pttl(key))))
        return found

    def short_name_of(self, key: str) -> tuple[str, bool]:
        """The short name of a key and whether it holds a lease (name, permit, readers)."""
        rest = key[len(self.prefix) :]
        holds = not rest.startswith("__") or rest.startswith(("__permit__", "__readers__"))
        return key.rsplit(":", 1)[1], holds

    @invariant()
    def nothing_left_on_the_nodes(self) -> None:
        """No key without a TTL; no lease key of a name that nobody holds any more (beyond
        the short tail of a lease that ran out)."""
        now = self.now()
        for node, key, pttl in self.node_keys():
            if pttl == -1:
                raise Violation(f"node {node}: {key} has no TTL")
            name, holds = self.short_name_of(key)
            if holds and pttl > 500 and self.model.free_for(name, "lock", now):
                raise Violation(
                    f"node {node}: {key} is left for {pttl} ms, but every lease of {name!r} was "
                    f"released or ran out: {[h for h in self.model.holdings if h.name == name]}"
                )

    # -- the end of an example ---------------------------------------------------------------------
    def teardown(self) -> None:
        try:
            while self.stack:
                entry = self.stack.pop()
                try:
                    entry.cm.__exit__(RuntimeError, RuntimeError("teardown"), None)
                except LockLost:
                    pass
            for gen in self.gens:
                gen.it.close()
            for holding in self.free:
                holding.lease.release()
            for holding in self.model.holdings:
                if holding.local and not holding.lease.released and not holding.forced:
                    if holding.who not in ("thread",):
                        holding.lease.release()
            if self.peer is not None:
                self.peer.ask({"op": "release_all"})
            left = [
                (n, k, p)
                for n, k, p in self.node_keys()
                if p == -1 or (p > 300 and self.short_name_of(k)[1])
            ]
            if left:
                raise Violation(f"left on the nodes after every lease was released: {left}")
        finally:
            context.clear()
            for client in self.clients:
                client.close()
