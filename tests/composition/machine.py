"""A Hypothesis state machine that composes the public lock API against real redis-server
nodes and checks the oracle of :mod:`.model` after every step.

The machine's main thread opens and closes blocks in LIFO order (``lock``, ``read_lock``,
``write_lock``, ``semaphore``, ``lock_many``, ``limits``, ``transaction.atomic``), holds bare
``acquire()`` leases, iterates ``@lock`` generators, runs asyncio scenarios, lets short leases
expire, force-releases names, and writes FencedModel rows under current and stale tokens.
Another thread and a second process (:mod:`.peer`) are the other callers. Each example draws
the second semaphore's permits and whether the lock-order checker is on (it only warns: the
oracle is the same).

``KNOWN_OPEN`` names the known defects that are still open on this branch: the rules that
would keep hitting them are constrained while they are listed (their regression tests in
``test_regressions.py`` are ``xfail(strict=True)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import redis
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, transaction
from django.db.models import F
from django.test import override_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from django_redlock import locks
from django_redlock.effects import ledger
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired, StaleTokenError
from django_redlock.locking import context, ordering
from django_redlock.locking.ordering import shared
from django_redlock.models import Effect
from testproject.inventory.models import Product

from .model import (
    ALL_NAMES,
    LOCK_NAMES,
    MARGIN,
    PERMITS,
    RW_NAME,
    SEM2_NAME,
    SEM_NAME,
    SEM_NAMES,
    Holding,
    Model,
    Violation,
    kind_of,
)

#: Known defects still open on this branch (see the module docstring).
KNOWN_OPEN: set[str] = set()

SHORT = (0.2, 0.3)
#: TTL of short leases that something renews (a renewal every third of it)
RENEWED_SHORT = 0.4
LONG = 30.0
#: how long the machine sleeps to let short leases expire (well past SHORT and RENEWED_SHORT)
SLEEP = 0.6
ROOT = Path(__file__).resolve().parents[2]

ttls = st.sampled_from([*SHORT, LONG, None])
renewed_ttls = st.sampled_from([RENEWED_SHORT, LONG])
lock_names = st.sampled_from([*LOCK_NAMES, RW_NAME])
any_names = st.sampled_from(ALL_NAMES)
sem_names = st.sampled_from(SEM_NAMES)
#: the sets of a limits() block, in the order given
limit_sets = st.sampled_from(
    [(SEM_NAME,), (SEM2_NAME,), (SEM_NAME, SEM2_NAME), (SEM2_NAME, SEM_NAME)]
)
indexes = st.integers(0, 50)
#: a file that collects every failure the machine meets (shrinking included), for triage
FAILLOG = os.environ.get("REDLOCK_FAILLOG", "")
#: calls and seconds per rule (printed by the test, for tuning the budget)
STATS: dict[str, list[Any]] = {}
INVARIANTS = ("one_holder_at_a_time", "open_holders_still_hold", "nothing_left_on_the_nodes")
#: examples run with the lock-order checker on, and the edges and inverted pairs it recorded
#: (the test checks that the checker did work in those runs)
ORDER_STATS: dict[str, int] = {"examples": 0, "edges": 0, "warned": 0}
#: the most slots a semaphore of the example can have (a limits() with another N included)
MAX_SLOTS = PERMITS + 1


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
    #: the holdings whose context entry this block pushed (None: all of them)
    pushed: list[Holding] | None = None
    #: the block's max_hold (its renewals, and a keep-alive until the commit, stop after it)
    max_hold: float | None = None
    #: what entering it gave (a lock_many block: its HeldLocks)
    value: Any = None


@dataclass(eq=False)
class Gen:
    """A started ``@lock`` generator."""

    it: Any
    name: str
    holding: Holding | None
    #: its lease is an outer one of the main thread (re-entered)
    reentered: bool
    steps: int = 1
    #: the generator asked auto_extend (it keeps its lease renewed while it is open)
    renews: bool = False


@dataclass(eq=False)
class CtxEntry:
    """The model of one entry of the main thread's active leases
    (``django_redlock.locking.context``)."""

    holding: Holding
    enterable: bool


def step(guard: Callable[[Any], bool] | None) -> Callable[[Any], Any]:
    """A rule (or invariant) that is logged in the machine's step list and runs only when
    ``guard(machine)`` holds (a no-op otherwise: Hypothesis preconditions would make the
    choices depend on timing). A failure carries the steps that led to it."""

    def decorate(func: Any) -> Any:
        @functools.wraps(func)
        def run(self: Any, **kwargs: Any) -> Any:
            invariant_check = func.__name__ in INVARIANTS
            if not invariant_check:
                args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
                self.steps.append(f"{func.__name__}({args})")
            if guard is not None and not guard(self):
                if not invariant_check:
                    self.steps[-1] += "  # nothing to do"
                return None
            started = time.monotonic()
            try:
                return func(self, **kwargs)
            except BaseException as exc:
                if not getattr(exc, "_steps_noted", False):
                    steps = "steps of this example:\n  " + "\n  ".join(self.steps)
                    exc.add_note(steps)
                    exc._steps_noted = True  # type: ignore[attr-defined]
                    if FAILLOG:
                        with open(FAILLOG, "a") as log:
                            log.write(f"\n== {self.alias}: {type(exc).__name__}: {exc}\n{steps}\n")
                raise
            finally:
                spent = STATS.setdefault(func.__name__, [0, 0.0])
                spent[0] += 1
                spent[1] += time.monotonic() - started

        return run

    return decorate


def attempt(call: Any) -> tuple[str, Any]:
    """("ok", value), ("busy", LockNotAcquired), ("lost", LockLost) or ("lockerror", LockError)
    of ``call()``."""
    try:
        return "ok", call()
    except LockNotAcquired as exc:
        return "busy", exc
    except LockLost as exc:
        return "lost", exc
    except LockError as exc:
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
        #: what the example did so far (rule calls and notes), for failure reports
        self.steps: list[str] = []
        self.m = locks[self.alias]
        self.model = Model(peer_released=self._peer_released)
        self.stack: list[Open] = []
        self.free: list[Holding] = []  # bare acquire() leases of the main thread
        self.gens: list[Gen] = []
        self.ctx: list[CtxEntry] = []
        self.clients = [redis.Redis.from_url(url) for url in self.urls]
        self.rows: dict[str, int] = {}
        for name in ALL_NAMES:
            self.rows[name] = Product.objects.create(name=self.full(name), stock=0).pk
            self.model.row_tokens[name] = 0
        #: the lock-order checker's settings override, while it is on for this example
        self.order_on: Any = None

    @initialize(second=st.sampled_from([1, 2]), check_order=st.booleans())
    def choose_the_example(self, second: int, check_order: bool) -> None:
        """The second semaphore's permits, and whether the lock-order checker runs: it only
        warns, so every outcome the model predicts must be the same with it on."""
        self.steps.append(f"choose_the_example(second={second}, check_order={check_order})")
        self.model.permits[SEM2_NAME] = second
        if check_order:
            self.order_on = override_settings(REDLOCK_CHECK_ORDER=True)
            self.order_on.enable()
            self.forget_the_order()
            if not self.m.check_order:
                raise Violation("REDLOCK_CHECK_ORDER=True did not turn the checker on")

    def forget_the_order(self) -> None:
        """Clear the lock-order checker's records, here and on the alias's nodes."""
        ordering.reset()
        shared.clear(self.m.engine)

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

    def enterable(self, name: str, kind: str = "lock") -> tuple[Holding | None, bool]:
        """The lease a ``lock(name)`` (``read_lock``/``write_lock`` for ``kind`` "read"/"write")
        of the main thread must re-enter, and whether re-entry is only allowed, not promised
        (one kept for an asyncio task). A suspended generator's lease is never re-entered by
        its consumer: the name is busy for it, as for another thread."""
        for entry in reversed(self.stack):
            if entry.kind == kind and entry.holdings[0].name == name:
                return entry.holdings[0], False
            if entry.kind == "many" and kind == "lock":
                for h in entry.holdings:
                    if h.name == name and not h.released:
                        return h, False
        for h in self.model.holdings:
            if h.name == name and h.kept_level and not h.released and h.kind == kind:
                return h, h.who != "main"
        # a suspended generator's lease is not the consumer's: another holder
        return None, False

    def other_side(self, name: str, kind: str) -> list[Holding]:
        """The main thread's leases of the read-write lock ``name`` of the other kind (a
        ``write_lock`` under them, or the reverse, must raise LockError at once)."""
        other = {"read": "write", "write": "read"}.get(kind)
        mine = [
            h
            for h in self.main_holdings()
            if h.name == name and h.kind == other and h.who == "main"
        ]
        return [h for h in mine if h.kept_level == 0 or h.kept_level <= self.depth()]

    def gen_holds(self, name: str) -> bool:
        """True while a suspended generator of this thread holds ``name``."""
        return any(
            gen.holding is not None and gen.holding.name == name and not gen.holding.released
            for gen in self.gens
        )

    def constrained(self, defect: str, why: str) -> bool:
        """True (and noted) when a rule must step around a known open defect."""
        if known(defect):
            self.note(f"constrained: {defect} ({why})")
            return True
        return False

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
        self.note(f"granted {holding} validity={lease.validity:.3f}")
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

    def note(self, text: str) -> None:
        self.steps.append(f"  -> {text}")

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
        self.note(f"released H{holding.hid}")
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
        self,
        kind: str,
        name: str,
        ttl: float | None,
        auto_extend: bool,
        until_commit: bool,
        reentrant: bool = True,
        max_hold: float | None = None,
    ) -> Any:
        full = self.full(name)
        opts = {"ttl": ttl, "timeout": 0, "auto_extend": auto_extend, "until_commit": until_commit}
        if kind == "lock":
            return self.m.lock(full, reentrant=reentrant, max_hold=max_hold, **opts)
        if kind == "read":
            return self.m.read_lock(full, **opts)
        if kind == "write":
            return self.m.write_lock(full, **opts)
        return self.m.semaphore(full, self.model.permits[name], **opts)

    def mixed_kinds(self, name: str, kind: str) -> list[Holding]:
        """The main thread's leases of ``name`` of another kind family (a plain lock against
        a read or write lease): one name is one kind, so taking it must raise LockError. A
        suspended generator's leases are not among them: while it is suspended its consumer
        finds the name busy, whatever the kind (N1's rule)."""
        if kind == "sem":
            return []
        family = {"lock"} if kind == "lock" else {"read", "write"}
        return [
            h
            for h in self.main_holdings()
            if h.name == name and h.kind not in family and h.kind != "sem" and h.who != "gen"
        ]

    def _enter(
        self,
        kind: str,
        name: str,
        ttl: float | None,
        auto_extend: bool,
        until_commit: bool,
        reentrant: bool = True,
        max_hold: float | None = None,
    ) -> None:
        if auto_extend and ttl in SHORT:
            ttl = RENEWED_SHORT
        mixed = self.mixed_kinds(name, kind)
        cm = self._block(kind, name, ttl, auto_extend, until_commit, reentrant, max_hold)
        target, optional = self.enterable(name, kind) if kind != "sem" else (None, False)
        if not reentrant:
            target = None
        bounded = target is not None and auto_extend and target.bounded
        if bounded and self.constrained("N5", "its renewals are bounded by an outer max_hold"):
            return
        other = self.other_side(name, kind)
        before = self.expectation(name, kind)
        outcome, value = attempt(cm.__enter__)
        what = f"{kind}({name!r}, ttl={ttl}, auto_extend={auto_extend}, reentrant={reentrant})"
        self.note(f"{outcome} (expected {before}; re-entry target {target}, other side {other})")
        if other:
            # an upgrade or a downgrade: LockError at once, never a wait for itself
            if outcome != "lockerror":
                raise Violation(f"{what} under this thread's own {other}: {outcome} {value!r}")
            return
        if mixed:
            # a plain lock and a read/write lease of one name in one thread: one name is one
            # kind, LockError at once (never a wait for itself)
            if outcome != "lockerror":
                raise Violation(f"{what} with this thread's own {mixed}: {outcome} {value!r}")
            return
        if target is not None:
            self._reentry(
                what, kind, cm, target, optional, outcome, value, ttl, auto_extend, until_commit
            )
            if self.stack and self.stack[-1].cm is cm:
                self.stack[-1].max_hold = max_hold
                self.bounded(self.stack[-1], max_hold)
            return
        new_holding = None
        if outcome == "ok":
            new_holding = self.granted(kind, name, value)
            if auto_extend:
                new_holding.renewers += 1
        self.judge(what, before, outcome, name, kind, new=(new_holding,))
        if new_holding is None:
            return
        entry = Open(kind, cm, [new_holding], until_commit=until_commit, max_hold=max_hold)
        new_holding.blocks = 1
        if auto_extend:
            entry.renews.append(new_holding)
        self.bounded(entry, max_hold)
        self.stack.append(entry)
        self.ctx_push(new_holding, enterable=kind != "sem")

    def bounded(self, entry: Open, max_hold: float | None) -> None:
        """A block with ``max_hold``: its renewals stop after it, so the lease is not promised
        to stay alive (no renewer counted), but its keys may live up to max_hold + TTL."""
        if max_hold is None:
            return
        for holding in entry.renews:
            holding.renewers -= 1
            holding.bounded = True
            holding.node_end = max(
                holding.node_end, self.now() + max_hold + holding.longest_ttl + MARGIN
            )
        entry.renews = []

    def _reentry(
        self, what, kind, cm, target, optional, outcome, value, ttl, auto_extend, until_commit
    ) -> None:
        """Check a re-entry: the same lease and token; an inner ``ttl`` longer than the
        lease's TTL extends it to at least that; ``auto_extend`` keeps it renewed."""
        asked = target.longest_ttl
        if outcome == "lost":
            if target.surely_valid(self.now()):
                raise Violation(f"{what}: LockLost re-entering the valid {target}")
            return
        if outcome == "busy":
            if optional:
                return
            raise Violation(f"{what} waited for its own lease {target} (LockNotAcquired)")
        if outcome != "ok":
            raise Violation(f"{what}: {value!r} instead of re-entering {target}")
        if value is not target.lease:
            if optional and value.token > target.token:
                # a new lease: then the target must not have been valid
                holding = self.granted(kind, target.name, value)
                self.judge(what, "maybe", "ok", target.name, kind, new=(holding,))
                holding.blocks = 1
                entry = Open(kind, cm, [holding], until_commit=until_commit)
                self.stack.append(entry)
                self.ctx_push(holding, enterable=True)
                return
            raise Violation(f"{what} got {value!r}, not the held lease {target}")
        if value.token != target.token:
            raise Violation(f"{what}: the re-entered lease's token changed")
        entry = Open(kind, cm, [target], reentered=True, until_commit=until_commit)
        target.blocks += 1
        now = self.now()
        if ttl is not None and not target.forced:
            if ttl > target.longest_ttl:
                target.longest_ttl = ttl
            if ttl > asked and target.lease.validity < min(ttl * 0.5, ttl - 0.15):
                raise Violation(
                    f"{what}: re-entry kept validity {target.lease.validity:.3f}, "
                    f"below the inner ttl {ttl}"
                )
            target.renewed_by_nodes(now)
        if auto_extend:
            target.renewers += 1
            entry.renews.append(target)
        self.stack.append(entry)
        self.ctx_push(target, enterable=True)

    @rule(
        name=lock_names,
        ttl=ttls,
        auto_extend=st.booleans(),
        until_commit=st.booleans(),
        reentrant=st.sampled_from([True, True, False]),
        max_hold=st.sampled_from([None, None, 0.3]),
    )
    @step(lambda self: len(self.stack) < 8)
    def enter_lock(
        self,
        name: str,
        ttl: float | None,
        auto_extend: bool,
        until_commit: bool,
        reentrant: bool,
        max_hold: float | None,
    ) -> None:
        """``with lock(name)``: a new lease, or a re-entry of the thread's own
        (``reentrant=False``: another caller, busy while the thread holds it)."""
        if self.gen_holds(name) and self.constrained("N1", "a generator holds it"):
            return
        self._enter("lock", name, ttl, auto_extend, until_commit, reentrant, max_hold)

    @rule(mode=st.sampled_from(["read", "write"]), ttl=ttls, auto_extend=st.booleans())
    @step(lambda self: len(self.stack) < 8)
    def enter_rw(self, mode: str, ttl: float | None, auto_extend: bool) -> None:
        """``with read_lock(r)`` / ``with write_lock(r)``: re-enters the thread's own lease of
        the same kind; under its own lease of the other kind, LockError at once."""
        self._enter(mode, RW_NAME, ttl, auto_extend, True)

    @rule(name=sem_names, ttl=ttls, auto_extend=st.booleans())
    @step(lambda self: len(self.stack) < 8)
    def enter_semaphore(self, name: str, ttl: float | None, auto_extend: bool) -> None:
        """``with semaphore(s, 2)`` / ``semaphore(t, 1 or 2)`` (not re-entrant: a nested block
        takes another permit; the permits count with those of limits())."""
        self._enter("sem", name, ttl, auto_extend, True)

    def took_nothing(self, what: str, names: Iterable[str]) -> None:
        """After a refused set: no node holds more slots of a semaphore than the model has
        leases of it that may still be there (a refused set takes nothing, on any node). A
        node that granted gets its permits back without the caller waiting for the reply: the
        check looks again for up to a second before it calls a slot left over."""
        for _ in range(11):
            extra = self.extra_slots(names)
            if not extra:
                return
            time.sleep(0.1)
        raise Violation(f"{what} was refused, yet a node holds more permits: {extra}")

    def extra_slots(self, names: Iterable[str]) -> list[str]:
        """Nodes holding more slots of a semaphore of ``names`` than the model has leases of
        it that may still be there."""
        now, extra = self.now(), []
        for name in names:
            left = [h for h in self.model.of(name) if not self.model.gone(h, now)]
            full = self.full(name)
            keys = [f"{self.prefix}__permit__:{k}:{full}" for k in range(MAX_SLOTS)]
            for index, client in enumerate(self.clients):
                found = int(client.exists(*keys))
                if found > len(left):
                    extra.append(f"node {index}: {found} slots of {name!r}, leases {left}")
        return extra

    @rule(
        names=limit_sets,
        ttl=ttls,
        auto_extend=st.booleans(),
        until_commit=st.booleans(),
        max_hold=st.sampled_from([None, None, 0.3]),
    )
    @step(lambda self: len(self.stack) < 8)
    def enter_limits(
        self,
        names: tuple[str, ...],
        ttl: float | None,
        auto_extend: bool,
        until_commit: bool,
        max_hold: float | None,
    ) -> None:
        """``with limits({s: 2, t: N})``: a new permit of each semaphore, or none when one of
        them is full (nothing taken on any node); never re-enters (like ``semaphore()``), and
        its permits count with those of ``semaphore()``, ``acquire(permits=)`` and the peer's."""
        if auto_extend and ttl in SHORT:
            ttl = RENEWED_SHORT
        limits = {self.full(n): self.model.permits[n] for n in names}
        what = (
            f"limits({ {n: self.model.permits[n] for n in names} }, ttl={ttl}, "
            f"auto_extend={auto_extend}, until_commit={until_commit}, max_hold={max_hold})"
        )
        before = {n: self.expectation(n, "sem") for n in names}
        cm = self.m.limits(
            limits,
            ttl=ttl,
            timeout=0,
            auto_extend=auto_extend,
            until_commit=until_commit,
            max_hold=max_hold,
        )
        outcome, value = attempt(cm.__enter__)
        self.note(f"{outcome} (expected {before})")
        if outcome == "busy":
            if all(b == "ok" for b in before.values()):
                raise Violation(f"{what}: LockNotAcquired although every semaphore had room")
            busy = str(value.name).rsplit(":", 1)[1]
            if before.get(busy) == "ok":
                raise Violation(f"{what}: LockNotAcquired names {busy!r}, which had room")
            self.took_nothing(what, names)
            return
        if outcome != "ok":
            raise Violation(f"{what}: {outcome} {value!r}")
        held = value
        if list(held.leases) != list(limits):
            raise Violation(f"{what} holds {list(held.leases)}, not {list(limits)}")
        entry = Open("limits", cm, until_commit=until_commit, value=held)
        for name in names:
            lease = held.leases[self.full(name)]
            if self.holding_of(lease) is not None:
                raise Violation(f"{what} re-entered {self.holding_of(lease)}")
            holding = self.granted("sem", name, lease)
            if auto_extend:
                holding.renewers += 1
                entry.renews.append(holding)
            holding.blocks = 1
            entry.holdings.append(holding)
        new = tuple(entry.holdings)
        for holding in new:
            self.judge(what, "maybe", "ok", holding.name, "sem", new=new)
        tokens = [h.token for h in new]
        if tokens != list(range(tokens[0], tokens[0] + len(tokens))):
            raise Violation(f"{what}: tokens {tokens} are not consecutive in the set's order")
        entry.max_hold = max_hold
        self.bounded(entry, max_hold)
        self.stack.append(entry)
        for holding in new:
            self.ctx_push(holding, enterable=False)

    @rule(
        names=st.lists(lock_names, min_size=1, max_size=4),
        container=st.sampled_from(["list", "tuple", "set", "generator"]),
        ttl=ttls,
        auto_extend=st.booleans(),
    )
    @step(lambda self: len(self.stack) < 8)
    def enter_many(
        self, names: list[str], container: str, ttl: float | None, auto_extend: bool
    ) -> None:
        """``with lock_many(names)`` (one name, repeated names, overlapping sets)."""
        distinct = list(dict.fromkeys(names))
        if any(self.gen_holds(n) for n in distinct) and self.constrained("N1", "generator"):
            return
        if auto_extend and ttl in SHORT:
            ttl = RENEWED_SHORT
        owned = {n: self.enterable(n) for n in distinct}
        owned = {n: t for n, t in owned.items() if t[0] is not None}
        borrows_gen = any(t.who == "gen" and t.blocks > 0 for t, _ in owned.values())
        if borrows_gen and self.constrained("N4", "it would re-enter a generator's lease"):
            return
        bare = [  # held by a bare acquire() or as a read/write lease: LockError at once
            h
            for h in self.main_holdings()
            if h.name in distinct
            and h.name not in owned
            and h.who == "main"
            and (h in self.free or h.kind in ("read", "write"))
        ]
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
        if bare:
            # a name this thread holds with acquire(): LockError at once (never a self-wait);
            # LockLost first if a name it re-enters is lost
            if outcome == "lost" and not all(t.surely_valid(self.now()) for t, _ in owned.values()):
                return
            if outcome != "lockerror":
                raise Violation(f"{what} with this thread's bare {bare}: {outcome} {value!r}")
            return
        if outcome == "lost":
            if all(t.surely_valid(self.now()) for t, _ in owned.values()):
                raise Violation(f"{what}: LockLost although the re-entered {owned} are valid")
            return
        if outcome == "busy" and owned:
            others_free = all(before[n] == "ok" for n in distinct if n not in owned)
            if others_free and any(not optional for _, optional in owned.values()):
                raise Violation(f"{what} waited for the thread's own {owned} (LockNotAcquired)")
            return
        if outcome != "ok":
            if outcome == "lockerror" or all(b == "ok" for b in before.values()):
                self.judge(what, "ok", outcome, distinct[0], "lock")
            return
        held = value
        order = list(dict.fromkeys(fulls if container == "generator" else arg))
        if list(held.leases) != order:
            raise Violation(f"{what} holds {list(held.leases)}, not {order}")
        entry = Open("many", cm, until_commit=True)
        new: list[Holding] = []
        for full, lease in held.leases.items():
            name = full.rsplit(":", 1)[1]
            target, optional = owned.get(name, (None, False))
            if target is not None and lease is target.lease:
                entry.borrowed.append(target)
                entry.holdings.append(target)
                target.blocks += 1
                continue
            if target is not None and not optional:
                raise Violation(f"{what} took a new lease of {name!r}, not the held {target}")
            holding = self.granted("lock", name, lease)
            if auto_extend:
                holding.renewers += 1
                entry.renews.append(holding)
            holding.blocks = 1
            new.append(holding)
            entry.holdings.append(holding)
        for holding in new:
            self.judge(what, "maybe", "ok", holding.name, "lock", new=tuple(new))
        # every name of the set, re-entered ones too (a lock block's, a suspended generator's,
        # one kept for the commit), is pushed in the set's order: inside the block the last
        # name is the innermost active lease and guards plain writes (N8, f62f261; like a
        # re-entered lock() block, docs/production.md "Nested locks")
        entry.pushed = None
        entry.value = held
        self.stack.append(entry)
        for holding in entry.holdings:
            self.ctx_push(holding, enterable=True)

    @rule()
    @step(lambda self: len(self.stack) < 8)
    def enter_atomic(self) -> None:
        """``with transaction.atomic()`` (a savepoint when nested)."""
        cm = transaction.atomic()
        cm.__enter__()
        self.model.atomic_entered()
        self.stack.append(Open("atomic", cm))

    @rule(raising=st.booleans())
    @step(lambda self: bool(self.stack))
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
        what = f"leaving {entry.kind} block of {[h.name for h in entry.holdings]}"
        verdicts = [self.lost_verdict(h) for h in entry.holdings]
        must = "no" if all(v == "no" for v in verdicts) else "maybe"
        if "yes" in verdicts:
            must = "yes"
            kept = entry.until_commit and self.depth() > 0
            if entry.kind == "many" and kept and self.constrained("N7", "kept set, lost lease"):
                must = "maybe"
        try:
            entry.cm.__exit__(*exc)
            raised = None
        except LockLost as lost:
            raised = lost
        self.note(f"LockLost: {raised}" if raised else "left")
        if raising and raised is not None:
            raise Violation(f"{what} with an exception raised LockLost over it")
        if not raising:
            if raised is not None and must == "no":
                raise Violation(f"{what}: LockLost although the lease was valid: {raised}")
            if raised is None and must == "yes":
                raise Violation(f"{what}: the lease was lost, yet no LockLost")
        for holding in entry.renews:
            self.stop_renewing(holding)
        for holding in entry.holdings:
            if entry.pushed is None or holding in entry.pushed:
                self.ctx_pop(holding)
            self.left_block(holding, entry.until_commit, what, entry.max_hold)

    def lost_verdict(self, holding: Holding) -> str:
        """Must leaving a block of ``holding`` raise LockLost: "yes", "no" or "maybe". The last
        open block of a lease that is released learns it from the release (a force-released
        key is gone); any other exit only looks at the client's own view."""
        last = holding.blocks == 1
        releases = last and not (self.depth() > 0)
        if releases:
            return self.lost_at_exit(holding)
        if holding.forced:
            return "maybe"  # only a renewal can have told the client
        if holding.renewers == 0 and holding.node_end < self.now():
            return "yes"
        return "no" if holding.lease.validity > MARGIN else "maybe"

    def left_block(
        self, holding: Holding, until_commit: bool, what: str, max_hold: float | None = None
    ) -> None:
        """One block of ``holding`` ended: the last one releases it, or keeps it until the
        commit inside a transaction; until then it stays held."""
        holding.blocks -= 1
        if holding.blocks > 0:
            if holding.lease.released:
                raise Violation(f"{what} released {holding}, which another open block holds")
            return
        if until_commit and self.depth() > 0:
            if holding.lease.released:
                raise Violation(f"{what} inside a transaction released {holding} before the commit")
            if not holding.kept_level:
                holding.kept_level = self.depth()
                if max_hold is not None:
                    holding.bounded = True
                    now = self.now()
                    holding.node_end = max(
                        holding.node_end, now + max_hold + holding.longest_ttl + MARGIN
                    )
                elif holding.surely_valid(self.now()):
                    holding.renewers += 1  # kept alive until the commit (a lost one stays lost)
            self.ctx_drop(holding)
            return
        if not holding.lease.released:
            raise Violation(f"{what}: the last block ended, but {holding} is not released")
        self.released(holding)

    def _exit_atomic(self, rollback: bool) -> None:
        level = self.depth()
        entry = self.stack.pop()
        if rollback:
            entry.cm.__exit__(RuntimeError, RuntimeError("roll back"), None)
        else:
            entry.cm.__exit__(None, None, None)
        self.model.atomic_left(rolled_back=rollback)
        how = "rollback" if rollback else "commit"
        for holding in self.model.holdings:
            if not holding.kept_level or holding.released:
                continue
            ends = level == 1 or (rollback and holding.kept_level >= level)
            if ends and holding.blocks > 0:
                # a block re-entered the kept lease and is still open: that block lets go
                if holding.lease.released:
                    raise Violation(f"the {how} released {holding} under its open block")
                holding.kept_level = 0
                holding.renewers -= 1
            elif ends:
                if not holding.lease.released:
                    raise Violation(f"the {how} of atomic level {level} left {holding} held")
                self.released(holding)
            elif holding.kept_level == level:
                holding.kept_level = level - 1

    # -- bare leases -----------------------------------------------------------------------------
    @rule(
        name=any_names, ttl=ttls, auto_extend=st.booleans(), mode=st.sampled_from(["read", "write"])
    )
    @step(None)
    def acquire(self, name: str, ttl: float | None, auto_extend: bool, mode: str) -> None:
        """``lease = acquire(name)``: never re-entrant (busy while anyone holds it, this thread
        included)."""
        if auto_extend and ttl in SHORT:
            ttl = RENEWED_SHORT
        kind = {"lock": "lock", "sem": "sem", "rw": mode}[kind_of(name)]
        extra: dict[str, Any] = {}
        if kind == "sem":
            extra["permits"] = self.model.permits[name]
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
        if outcome == "lockerror" and (own_rw or self.mixed_kinds(name, kind)):
            return  # another kind of lease of the name in this thread: refused at once
        holding = None
        if outcome == "ok":
            holding = self.granted(kind, name, value)
            if auto_extend:
                holding.renewers += 1
            self.free.append(holding)
            self.ctx_push(holding, enterable=False)
        self.judge(what, before, outcome, name, kind, new=(holding,))

    @rule(index=indexes, where=st.sampled_from(["here", "here", "another thread"]))
    @step(lambda self: bool(self.free))
    def release(self, index: int, where: str) -> None:
        """``lease.release()`` of a bare lease (from this thread, or from another one: then it
        stops guarding this thread's writes at once): True if it was still held."""
        holding = self.free.pop(index % len(self.free))
        must = self.lost_at_exit(holding)
        if where == "here":
            held = holding.lease.release()
        else:
            result: list[bool] = []
            thread = threading.Thread(target=lambda: result.append(holding.lease.release()))
            thread.start()
            thread.join()
            held = result[0]
        if held and must == "yes":
            raise Violation(f"release() of {holding} said it was held, but it was lost")
        if not held and must == "no":
            raise Violation(f"release() of the valid {holding} said it was not held")
        self.released(holding)

    @rule(index=indexes, ttl=st.sampled_from([*SHORT, LONG]))
    @step(lambda self: bool(self.main_holdings()))
    def extend(self, index: int, ttl: float) -> None:
        """``lease.extend(ttl)`` of a lease of the main thread (bare, block or kept)."""
        holdings = [h for h in self.main_holdings() if h.who == "main"]
        if not holdings:
            return
        holding = holdings[index % len(holdings)]
        if holding.renewers and ttl < holding.lease.ttl and self.constrained("N2", "shorter"):
            return
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

    @rule(
        which=st.sampled_from(
            [
                "lock on the semaphore",
                "lock on the second semaphore",
                "semaphore on a lock",
                "limits on a lock",
                "limits with other permits",
            ]
        )
    )
    @step(None)
    def wrong_kind(self, which: str) -> None:
        """A lock of a name in use as a semaphore, a semaphore or a ``limits()`` set with a
        name held as a lock, or a ``limits()`` of a semaphore with another number of permits:
        LockError (never granted, never a plain busy; a refused set takes nothing)."""
        now = self.now()
        full_a, full_s = self.full(LOCK_NAMES[0]), self.full(SEM_NAME)
        taken: list[str] = []
        if which in ("lock on the semaphore", "lock on the second semaphore"):
            name, held_as = (SEM_NAME if which == "lock on the semaphore" else SEM2_NAME), "sem"
            call = functools.partial(self.m.acquire, self.full(name), ttl=LONG, timeout=0)
        elif which == "semaphore on a lock":
            name, held_as = LOCK_NAMES[0], "lock"
            call = functools.partial(self.m.acquire, full_a, ttl=LONG, timeout=0, permits=PERMITS)
        elif which == "limits on a lock":
            # the lock's name first: the set is refused for it whether or not s is full
            name, held_as, taken = LOCK_NAMES[0], "lock", [SEM_NAME]
            block = self.m.limits({full_a: PERMITS, full_s: PERMITS}, ttl=LONG, timeout=0)
            call = block.__enter__
        else:
            name, held_as, taken = SEM_NAME, "sem", [SEM_NAME]
            block = self.m.limits({full_s: PERMITS + 1}, ttl=LONG, timeout=0)
            call = block.__enter__
        if not any(h.kind == held_as and h.surely_valid(now) for h in self.model.of(name)):
            self.note("nothing to do: the name is not surely held as its kind")
            return
        outcome, value = attempt(call)
        self.note(f"{outcome}")
        if outcome == "ok":
            if taken:
                block.__exit__(None, None, None)
            else:
                value.release()
            raise Violation(f"{which}: granted ({value!r})")
        if outcome != "lockerror":
            raise Violation(f"{which}: {value!r} instead of LockError")
        self.took_nothing(which, taken)

    # -- other callers ---------------------------------------------------------------------------
    @rule(name=any_names, mode=st.sampled_from(["read", "write"]))
    @step(None)
    def other_thread(self, name: str, mode: str) -> None:
        """Another thread tries the name once (timeout 0) and lets go at once: it must fail
        while a conflicting lease (the main thread's too) is valid."""
        kind = {"lock": "lock", "sem": "sem", "rw": mode}[kind_of(name)]
        extra: dict[str, Any] = {"permits": self.model.permits[name]} if kind == "sem" else {}
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
            self.model.grant(kind, name, "thread", token, LONG, released=True)
        self.judge(f"another thread's acquire({name!r}, {kind})", before, outcome, name, kind)

    @rule(
        name=any_names, ttl=st.sampled_from([*SHORT, LONG]), mode=st.sampled_from(["read", "write"])
    )
    @step(None)
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
            cmd["permits"] = self.model.permits[name]
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
            self.note(f"peer granted {holding}")
        else:
            outcome = {"LockNotAcquired": "busy"}.get(answer["error"], "lockerror")
            self.note(f"peer: {answer['error']} (expected {before})")
        self.judge(
            f"the peer's acquire({name!r}, {kind})", before, outcome, name, kind, new=(holding,)
        )

    @rule(names=limit_sets, ttl=st.sampled_from([*SHORT, LONG]))
    @step(None)
    def peer_limits(self, names: tuple[str, ...], ttl: float) -> None:
        """The second process takes a ``limits()`` set (timeout 0) and keeps its permits
        (``peer_release`` lets go of them one by one)."""
        assert self.peer is not None
        limits = {self.full(n): self.model.permits[n] for n in names}
        what = f"the peer's limits({names!r}, ttl={ttl})"
        before = {n: self.expectation(n, "sem") for n in names}
        sent = self.now()
        answer = self.peer.ask(
            {"op": "acquire_limits", "alias": self.alias, "limits": limits, "ttl": ttl}
        )
        if not answer["ok"]:
            self.note(f"peer: {answer['error']} (expected {before})")
            if answer["error"] != "LockNotAcquired":
                raise Violation(f"{what}: {answer}")
            if all(b == "ok" for b in before.values()):
                raise Violation(f"{what}: LockNotAcquired although every semaphore had room")
            self.took_nothing(what, names)
            return
        got = [item["name"] for item in answer["leases"]]
        if got != list(limits):
            raise Violation(f"{what} holds {got}, not {list(limits)}")
        new = []
        for item in answer["leases"]:
            holding = self.model.grant(
                "sem",
                item["name"].rsplit(":", 1)[1],
                "peer",
                item["token"],
                ttl,
                peer_id=item["id"],
                valid_until=sent + item["validity"],
            )
            new.append(holding)
        self.note(f"peer granted {new}")
        for holding in new:
            self.judge(what, "maybe", "ok", holding.name, "sem", new=tuple(new))

    @rule(index=indexes)
    @step(lambda self: any(h.who == "peer" and not h.released for h in self.model.holdings))
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
    @step(None)
    def force_release(self, name: str) -> None:
        """The operator force-releases the name: every holder of it becomes stale."""
        self.m.force_release(self.full(name))
        for holding in self.model.of(name):
            holding.forced = True

    @rule(
        size=st.integers(4, 64),
        names=st.sampled_from([1, 3, 64]),
        how=st.sampled_from(["asyncio", "threads"]),
    )
    @step(None)
    def burst(self, size: int, names: int, how: str) -> None:
        """A burst of callers (asyncio tasks on one loop, or threads), often more than the
        connection budget, on names of its own beside whatever the example holds: never two
        holders of a name at once, and nothing of the burst left on the nodes once it ends."""
        inside: dict[str, int] = {}
        faults: list[str] = []
        guard = threading.Lock()

        def enter(name: str) -> None:
            with guard:
                inside[name] = inside.get(name, 0) + 1
                if inside[name] > 1:
                    faults.append(f"two holders of {name!r}")

        def leave(name: str) -> None:
            with guard:
                inside[name] -= 1

        def one(i: int) -> None:
            name = self.full(f"burst:{i % names}")
            with contextlib.suppress(LockNotAcquired), self.m.lock(name, ttl=5, timeout=5):
                enter(name)
                time.sleep(0.001)
                leave(name)

        async def aone(i: int) -> None:
            name = self.full(f"burst:{i % names}")
            with contextlib.suppress(LockNotAcquired):
                async with self.m.lock(name, ttl=5, timeout=5):
                    enter(name)
                    await asyncio.sleep(0.001)
                    leave(name)

        async def tasks() -> None:
            await asyncio.gather(*(aone(i) for i in range(size)))

        def run(target: Callable[[], Any]) -> None:
            try:
                target()
            except BaseException as exc:  # reported below: never a silent thread death
                with guard:
                    faults.append(f"{type(exc).__name__}: {exc}")

        if how == "asyncio":
            workers = [threading.Thread(target=run, args=(lambda: asyncio.run(tasks()),))]
        else:
            workers = [
                threading.Thread(target=run, args=(functools.partial(one, i),)) for i in range(size)
            ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                raise Violation(f"burst of {size} ({how}): a caller still runs after 30 s")
        if faults:
            raise Violation(f"burst of {size} ({how}) on {names} names: {faults[:3]}")
        pattern = f"{self.prefix}*cx:{self.rid}:burst:*"
        deadline = time.monotonic() + 2.5
        while True:
            left = [key for client in self.clients for key in client.scan_iter(match=pattern)]
            if not left:
                return
            if time.monotonic() > deadline:
                raise Violation(f"burst of {size} ({how}): keys left 2.5 s after it: {left[:5]}")
            time.sleep(0.05)

    # -- time ----------------------------------------------------------------------------------
    def _short_lived(self) -> bool:
        now = self.now()
        return any(
            not h.released and (h.renewers > 0 or (h.node_end > now and h.longest_ttl < 1))
            for h in self.model.holdings
        )

    @rule()
    @step(lambda self: self._short_lived())
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
    @rule(index=indexes, how=st.sampled_from(["update", "save"]))
    @step(lambda self: any(h.who != "thread" for h in self.model.holdings))
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

    @rule()
    @step(lambda self: any(entry.kind in ("many", "limits") for entry in self.stack))
    def claim_many_and_save(self) -> None:
        """The lock_many recipe (a limits() set's permits too): ``claim_many({pk:
        held.leases[name].token})`` then ``row.save()`` of each row: all rows or none, each
        saved with its own name's token."""
        entry = [e for e in self.stack if e.kind in ("many", "limits")][-1]
        held = entry.value
        by_name = {h.name: h for h in entry.holdings}
        tokens = {self.rows[n]: held.leases[self.full(n)].token for n in by_name}
        expected = all(h.token >= self.model.row_tokens[n] for n, h in by_name.items())
        try:
            with transaction.atomic():
                rows = Product.objects.claim_many(tokens)
                for row in rows.values():
                    row.stock += 1
                    row.save()
            done = True
        except StaleTokenError:
            done = False
        written = {n: Product.objects.get(pk=self.rows[n]).fence_token for n in by_name}
        self.note(f"claim_many {'done' if done else 'refused'}: {written}")
        if done != expected:
            raise Violation(
                f"claim_many of {tokens} {'succeeded' if done else 'was refused'}; row tokens "
                f"{ {n: self.model.row_tokens[n] for n in by_name} }"
            )
        for name, holding in by_name.items():
            want = holding.token if done else self.model.row_tokens[name]
            if written[name] != want:
                raise Violation(f"row {name!r} has token {written[name]}, not {want}")
            self.model.row_written(name, want)

    @rule(index=indexes, key=st.sampled_from(["charge", "mail"]), raising=st.booleans())
    @step(
        lambda self: (
            any(h.who != "thread" and h.kind in ("lock", "write") for h in self.model.holdings)
            and (connection.vendor != "sqlite" or self.depth() == 0)
        )
    )
    def run_effect(self, index: int, key: str, raising: bool) -> None:
        """The effect ledger's begin and completion (``lease.once``'s two writes) under a
        lease's token, current or stale, inside the machine's open transactions: a stale begin
        is refused, a done effect is found done, a rollback undoes "done" and keeps the begin.
        (SQLite: only outside a transaction, where its one writer allows the begin.)"""
        holdings = [
            h for h in self.model.holdings if h.who != "thread" and h.kind in ("lock", "write")
        ]
        holding = holdings[index % len(holdings)]
        full = f"cx:{self.rid}:effect:{key}"
        holder = ledger.Holder(self.alias, self.full(holding.name), holding.token)
        row = Effect.objects.filter(key=full).first()
        done, begun = self.model.effect_done.get(full), self.model.effect_begun.get(full)
        expected = None if begun is None else ("begun", begun) if done is None else ("done", done)
        if (row and (row.state, row.token)) != expected:  # e.g. after a rollback
            raise Violation(f"effect {key!r} is {row and (row.state, row.token)}, not {expected}")
        want = self.model.effect_begin(full, holding.token)
        try:
            begun = ledger.begin(full, holder, "default")
            got = "done" if begun.done else "interrupted" if begun.interrupted else "pending"
        except StaleTokenError:
            got = "stale"
        if got != want:
            raise Violation(f"effect {key!r} under {holding}: begin found {got}, not {want}")
        if got in ("stale", "done") or raising:
            return
        ledger.complete(full, holder, "default")  # in the open transaction, if any
        self.model.effect_done[full] = holding.token
        row = Effect.objects.get(key=full)
        if (row.state, row.token) != ("done", holding.token):
            raise Violation(f"effect {key!r} completed as {row.state} {row.token}")

    def _innermost(self) -> Holding | None:
        for entry in reversed(self.ctx):
            if not entry.holding.released:
                return entry.holding
        return None

    @rule(name=any_names)
    @step(lambda self: not self.gens)
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
    def _generator(
        self, name: str, ttl: float | None, skip: bool, nested: bool, auto_extend: bool
    ) -> Any:
        m, alias, full = self.m, self.alias, self.full(name)

        @m.lock(
            f"cx:{self.rid}:{{0}}",
            ttl=ttl,
            timeout=0,
            on_busy="skip" if skip else "raise",
            auto_extend=auto_extend,
        )
        def rows(short: str) -> Any:
            for step in range(3):
                found = context.find(alias, full)
                inner = None
                if nested and step == 0:
                    with m.lock(full, timeout=0) as lease:
                        inner = lease
                yield found, inner

        return rows(name)

    @rule(
        name=lock_names,
        ttl=ttls,
        skip=st.booleans(),
        nested=st.booleans(),
        auto_extend=st.booleans(),
    )
    @step(lambda self: len(self.gens) < 3)
    def start_generator(
        self, name: str, ttl: float | None, skip: bool, nested: bool, auto_extend: bool
    ) -> None:
        """An ``@lock`` generator function: the lease is held from the first iteration until
        it finishes or is closed; ``on_busy="skip"`` yields nothing when busy."""
        if known("A2"):
            return
        target, _optional = self.enterable(name)
        if target is not None and self.constrained("N1", "this thread holds it"):
            return
        mixed = self.mixed_kinds(name, "lock")
        if auto_extend and ttl in SHORT:
            ttl = RENEWED_SHORT
        it = self._generator(name, ttl, skip, nested, auto_extend)
        before = self.expectation(name, "lock")
        what = f"@lock generator of {name!r} (skip={skip}, nested={nested})"
        try:
            found, inner = next(it)
            outcome = "ok"
        except StopIteration:
            outcome = "skipped"
        except LockNotAcquired:
            outcome = "busy"
        except LockLost:
            outcome = "lost"  # re-entering a lost lease of the thread
        except LockError:
            outcome = "lockerror"
        self.note(f"{outcome} (expected {before}; re-entry target {target})")
        if (outcome == "lockerror") != bool(mixed):
            raise Violation(f"{what}: {outcome} with this thread's own {mixed}")
        if mixed:
            return
        if outcome == "lost":
            if target is None or target.surely_valid(self.now()):
                raise Violation(f"{what}: LockLost, re-entering {target}")
            return
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
            holding.blocks = 1
        elif target is None:
            raise Violation(f"{what} re-entered {holding}, which this thread does not hold")
        else:
            holding.blocks += 1
            if ttl is not None and ttl > holding.longest_ttl:
                holding.longest_ttl = ttl
                holding.renewed_by_nodes(self.now())
        if auto_extend:
            holding.renewers += 1
        self.gens.append(Gen(it, name, holding, reentered, renews=auto_extend))

    def _gen_done(self, gen: Gen, how: str) -> None:
        self.gens.remove(gen)
        if gen.holding is not None:
            if gen.renews:
                self.stop_renewing(gen.holding)
            self.left_block(gen.holding, True, f"a generator {how}")

    @rule(index=indexes)
    @step(lambda self: bool(self.gens))
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

    @rule(index=indexes)
    @step(lambda self: bool(self.gens))
    def close_generator(self, index: int) -> None:
        """``close()`` of a started generator releases its lease (or keeps it to the commit)."""
        gen = self.gens[index % len(self.gens)]
        gen.it.close()
        self._gen_done(gen, "closed")

    # -- asyncio ---------------------------------------------------------------------------------
    @rule(
        name=lock_names,
        variant=st.sampled_from(["alock", "alock_many", "agen", "cancel"]),
        ttl=ttls,
        inner_ttl=ttls,
        inner_auto=st.booleans(),
        runner=st.sampled_from(["asyncio.run", "async_to_sync"]),
    )
    @step(None)
    def asyncio_scenario(
        self,
        name: str,
        variant: str,
        ttl: float | None,
        inner_ttl: float | None,
        inner_auto: bool,
        runner: str,
    ) -> None:
        """An asyncio task (its own caller, run by ``asyncio.run`` or asgiref's
        ``async_to_sync``): alock / alock_many / an async @lock generator, with a re-entry in
        the same task; a child task, ``aacquire()`` and a ``sync_to_async`` service must not
        get in."""
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

            def service() -> str:
                try:
                    with m.lock(full, timeout=0):
                        return "got it"
                except LockNotAcquired:
                    return "busy"
                except LockLost:
                    return "lost"
                except LockError:
                    return "lockerror"

            obs["sync_to_async"] = await sync_to_async(service)()

        async def scenario() -> None:
            try:
                if variant == "alock":
                    async with m.alock(full, ttl=ttl, timeout=0) as outer:
                        await inner_checks(outer)
                elif variant == "cancel":
                    obs["cancel"] = "not cancelled"
                    loop = asyncio.get_running_loop()
                    try:
                        async with m.alock(
                            full, ttl=RENEWED_SHORT, timeout=0, auto_extend=True, on_lost="cancel"
                        ) as outer:
                            await inner_checks(outer)
                            await loop.run_in_executor(None, m.force_release, full)
                            await asyncio.sleep(2.0)
                    except LockLost:
                        obs["cancel"] = "LockLost"
                elif variant == "alock_many":
                    async with m.alock_many([full], ttl=ttl, timeout=0) as held:
                        await inner_checks(held.leases[full])
                else:

                    @m.lock(f"cx:{self.rid}:{{0}}", ttl=ttl, timeout=0)
                    async def agen(short: str) -> Any:
                        found = context.find(alias, full)
                        if found is None:
                            obs["agen"] = "no lease in the body"
                        else:  # the body's own re-entries, child task, services
                            await inner_checks(found)
                        yield found

                    async for _ in agen(name):
                        # suspended: its lease is not the consumer's (one holder)
                        try:
                            async with m.alock(full, timeout=0):
                                obs["consumer"] = "re-entered the suspended generator's lease"
                        except LockNotAcquired:
                            obs["consumer"] = "busy"
                obs["outcome"] = "ok"
            except LockNotAcquired:
                obs["outcome"] = "busy"

        if runner == "asyncio.run":
            asyncio.run(scenario())
        else:
            async_to_sync(scenario)()
        what = f"asyncio {variant}({name!r})"
        if obs.get("agen"):
            raise Violation(f"{what}: the async generator's body runs without its lease (A2)")
        if obs.get("consumer", "busy") != "busy":
            raise Violation(f"{what}: the consumer {obs['consumer']} (one holder at a time)")
        outcome = obs["outcome"]
        if outcome != "ok" or "outer" not in obs:
            self.judge(what, before, outcome, name, "lock")
            return
        lease = obs["outer"]
        holding = self.granted("lock", name, lease, who="async")
        if variant == "cancel":
            for other in self.model.of(name):
                other.forced = True  # the scenario force-released the name
            if obs["cancel"] != "LockLost":
                raise Violation(f"{what}: the task was not cancelled when its lease was lost")
        self.judge(what, before, "ok", name, "lock", new=(holding,))
        if obs["reentered"] is not True:
            raise Violation(f"{what}: a nested alock in the same task: {obs['reentered']}")
        if inner_ttl is not None and obs["inner_validity"] < min(inner_ttl * 0.5, inner_ttl - 0.15):
            raise Violation(
                f"{what}: re-entry kept validity {obs['inner_validity']:.3f} < {inner_ttl}"
            )
        # Under async_to_sync, sync_to_async runs the service in this (the main) thread: a
        # lease of the name that thread still holds (force-released or run out: the scenario
        # could take the name) is re-entered there, or found lost
        mains = self.enterable(name)[0] if runner == "async_to_sync" else None
        service_may = {"busy"} if mains is None else {"got it", "lost"}
        if runner == "async_to_sync" and self.mixed_kinds(name, "lock"):
            service_may = {"lockerror"}  # the main thread reads or writes the name
        if obs["child"] != "busy" or obs["aacquire"] != "busy":
            raise Violation(f"{what}: another task / aacquire got the held name: {obs}")
        if obs["sync_to_async"] not in service_may:
            raise Violation(f"{what}: sync_to_async: {obs['sync_to_async']}, not {service_may}")
        # The event loop's code has its own database connection (Django keeps connections per
        # thread, and per context in a thread running a loop), so the sync code's atomic block
        # is not its transaction: released at the block's end.
        if not lease.released:
            raise Violation(f"{what} ended, but its lease is still held")
        self.released(holding)

    # -- waiting ---------------------------------------------------------------------------------
    def _free_lock_name(self) -> str | None:
        now = self.now()
        for name in LOCK_NAMES:
            if self.model.free_for(name, "lock", now) and self.enterable(name)[0] is None:
                return name
        return None

    @rule(holder=st.sampled_from(["releases", "expires"]))
    @step(lambda self: self._free_lock_name() is not None)
    def wait_for_the_peer(self, holder: str) -> None:
        """The peer holds a free name and lets go (a release after 0.4 s, or a 0.2 s TTL that
        runs out); a waiter with ttl 0.3 must get it within 3 s, and its lease must be valid
        (validity counts from the winning attempt, not from before its wait)."""
        if known("D3") and holder == "expires":
            return
        assert self.peer is not None
        name = self._free_lock_name()
        assert name is not None
        ttl = LONG if holder == "releases" else 0.2
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
        self.note(f"peer holds {peer_holding}")
        if holder == "releases":
            self.peer.ask({"op": "release_later", "id": answer["id"], "delay": 0.4})
            peer_holding.pending_release = sent + 0.4
        try:
            lease = self.m.acquire(self.full(name), ttl=0.3, timeout=3)
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

    @rule()
    @step(lambda self: self._free_lock_name() is not None and not known("D1"))
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
        self.note(f"peer holds {holding} for 1 s")

        @self.m.lock(self.full(name), on_busy="skip")
        def job() -> str:
            return "ran"

        result = job()
        if result is not None:
            raise Violation(f"on_busy='skip' ran the job on the busy name {name!r} (it waited)")

    # -- the oracle ------------------------------------------------------------------------------
    @invariant()
    @step(None)
    def one_holder_at_a_time(self) -> None:
        """At most one valid holder of a lock name, readers xor a writer, at most N permits."""
        self.model.check_exclusion(self.now())

    @invariant()
    @step(None)
    def open_holders_still_hold(self) -> None:
        """An open block's lease, and a suspended generator's, is never released under it."""
        for entry in self.stack:
            for holding in entry.holdings:
                if holding.lease.released:
                    raise Violation(f"the open {entry.kind} block's lease {holding} was released")
        for gen in self.gens:
            if gen.holding is not None and gen.holding.lease.released:
                raise Violation(f"a suspended generator's lease {gen.holding} was released")

    def key_names(self) -> list[str]:
        """Every key the alias can write for the names of this example (engine/keyspace.py)."""
        keys = []
        for name in ALL_NAMES:
            full = self.full(name)
            keys.append(f"{self.prefix}{full}")
            for mark in ("waiters", "wake", "handoff", "readers", "writers"):
                keys.append(f"{self.prefix}__{mark}__:{full}")
            keys.extend(f"{self.prefix}__permit__:{slot}:{full}" for slot in range(MAX_SLOTS))
        return keys

    def node_keys(self, scan: bool = False) -> list[tuple[int, str, int]]:
        """(node, key, pttl ms) of every key of this example on the alias's nodes: the known
        key names in one round trip per node, or (``scan``) every key a SCAN finds."""
        found = []
        for index, client in enumerate(self.clients):
            if scan:
                keys = [
                    key.decode()
                    for key in client.scan_iter(match=f"{self.prefix}*cx:{self.rid}:*", count=1000)
                ]
            else:
                keys = self.key_names()
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.pttl(key)
            for key, pttl in zip(keys, pipe.execute(), strict=True):
                if pttl != -2:
                    found.append((index, key, int(pttl)))
        return found

    def short_name_of(self, key: str) -> tuple[str, bool]:
        """The short name of a key and whether it holds a lease (a lock, a permit's slot, the
        readers); a semaphore's marker outlives its permits by design (up to one TTL)."""
        rest = key[len(self.prefix) :]
        name = key.rsplit(":", 1)[1]
        if name in SEM_NAMES and not rest.startswith("__"):
            return name, False
        holds = not rest.startswith("__") or rest.startswith(("__permit__", "__readers__"))
        return name, holds

    def bookkeeping_too_long(self, key: str, pttl: int) -> bool:
        """A bookkeeping key (waiters, wake-ups, a semaphore's marker) living longer than the
        longest TTL any lease of its name was given."""
        name, holds = self.short_name_of(key)
        longest = max((h.longest_ttl for h in self.model.holdings if h.name == name), default=0)
        return not holds and pttl > max(longest, 5.0) * 1000 + 200

    @invariant()
    @step(None)
    def nothing_left_on_the_nodes(self) -> None:
        """No key without a TTL; no lease key of a name that nobody holds any more (beyond
        the short tail of a lease that ran out)."""
        now = self.now()
        free: dict[str, bool] = {}
        for node, key, pttl in self.node_keys():
            if pttl == -1:
                raise Violation(f"node {node}: {key} has no TTL")
            name, holds = self.short_name_of(key)
            if self.bookkeeping_too_long(key, pttl):
                raise Violation(f"node {node}: {key} is kept {pttl} ms")
            if not holds or pttl <= 500:
                continue
            if name not in free:
                free[name] = self.model.free_for(name, "lock", now)
            if free[name]:
                raise Violation(
                    f"node {node}: {key} is left for {pttl} ms, but every lease of {name!r} was "
                    f"released or ran out: {[h for h in self.model.holdings if h.name == name]}"
                )

    # -- the end of an example ---------------------------------------------------------------------
    def teardown(self) -> None:
        """Leave every open block (each one, even when another's exit raises), close the
        generators, release every lease, then check that nothing is left on the nodes. An
        error of one step is raised after all of them ran: a failing example never leaves a
        transaction or a lease behind for the next example or test."""
        errors: list[BaseException] = []

        def attempt_each(calls: Iterable[Callable[[], object]]) -> None:
            for call in calls:
                try:
                    call()
                except LockLost:
                    pass
                except Exception as exc:  # reported once the teardown is done
                    errors.append(exc)

        try:
            stack, self.stack = self.stack[::-1], []
            attempt_each(
                functools.partial(entry.cm.__exit__, RuntimeError, RuntimeError("teardown"), None)
                for entry in stack
            )
            attempt_each(gen.it.close for gen in self.gens)
            attempt_each(holding.lease.release for holding in self.free)
            attempt_each(
                holding.lease.release
                for holding in self.model.holdings
                if holding.local and not holding.lease.released
            )
            if self.peer is not None:
                attempt_each([functools.partial(self.peer.ask, {"op": "release_all"})])
            if errors:
                raise errors[0]
            left = [
                (n, k, p)
                for n, k, p in self.node_keys(scan=True)
                if p == -1 or (p > 300 and self.short_name_of(k)[1])
            ]
            if left:
                raise Violation(f"left on the nodes after every lease was released: {left}")
        finally:
            for atomic in reversed(list(connection.atomic_blocks)):  # the last resort
                with contextlib.suppress(Exception):
                    atomic.__exit__(RuntimeError, RuntimeError("teardown"), None)
            context.clear()
            if self.order_on is not None:
                ORDER_STATS["examples"] += 1
                ORDER_STATS["edges"] += len(ordering.RECORDER.edges)
                ORDER_STATS["warned"] += len(ordering.RECORDER.warned)
                try:
                    self.forget_the_order()
                finally:
                    self.order_on.disable()
                    self.order_on = None
            for client in self.clients:
                client.close()
