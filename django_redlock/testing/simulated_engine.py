"""An :class:`~django_redlock.engine.Engine` that opens no connection: the facade (acquire,
extend, release, force-release, records, notes; blocking and asyncio) answered from a
:class:`~.simulated_state.SimulatedLocks`. What ``simulate`` gives the lock managers.

To simulate a new kind of acquisition (several semaphores at once, say), add a method that
calls :meth:`SimulatedEngine._take` / :meth:`SimulatedEngine._atake` with its names
and kind, and a family rule in ``SimulatedLocks._refusal``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Generator, Sequence
from typing import Any, NoReturn, cast

from ..engine import (
    LOST,
    RENEWED,
    UNCONFIRMED,
    AcquireFailure,
    Engine,
    LeaseRecord,
    NoteReplies,
    Outcome,
    RecordRead,
    Renewal,
    Stepper,
    WaiterCount,
    forks,
)
from .simulated_state import PERMIT, Hold, Permits, Refused, SimulatedLocks

#: What an unavailable node says (``simulate(unavailable=True)``).
NO_ANSWER = "simulated: no answer (django_redlock.testing.simulate(unavailable=True))"
#: How often a blocked call looks again for leases that ran out (a release wakes it at once).
POLL = 0.01

Taken = list[LeaseRecord] | AcquireFailure


class SimulatedEngine(Engine):
    """Stands in for ``real`` (its alias's or shard's engine): same prefix and node labels,
    no connection. Thread-safe."""

    def __init__(self, locks: SimulatedLocks, real: Engine) -> None:
        # No Engine.__init__: no pools, no channels, no reaper thread.
        self.locks = locks
        self.real = real
        self.state = real.state
        self.labels = list(real.labels)
        self.waiters = WaiterCount()

    def __repr__(self) -> str:
        return f"<SimulatedEngine prefix={self.state.prefix!r} faults={self.locks.faults}>"

    # -- acquiring -------------------------------------------------------------------------
    def acquire(
        self, name: str, ttl: float, timeout: float | None, permits: int = 0, rw: str = ""
    ) -> Outcome:
        kind = PERMIT if permits else rw
        return _one(self._take((name,), ttl, timeout, kind, permits))

    def acquire_many(
        self, names: Sequence[str], ttl: float, timeout: float | None
    ) -> list[LeaseRecord] | AcquireFailure:
        return self._take(tuple(names), ttl, timeout, "", 0)

    async def aacquire(
        self, name: str, ttl: float, timeout: float | None, permits: int = 0, rw: str = ""
    ) -> Outcome:
        kind = PERMIT if permits else rw
        return _one(await self._atake((name,), ttl, timeout, kind, permits))

    async def aacquire_many(
        self, names: Sequence[str], ttl: float, timeout: float | None
    ) -> list[LeaseRecord] | AcquireFailure:
        return await self._atake(tuple(names), ttl, timeout, "", 0)

    def acquire_limits(
        self, names: Sequence[str], permits: Sequence[int], ttl: float, timeout: float | None
    ) -> list[LeaseRecord] | AcquireFailure:
        return self._take(tuple(names), ttl, timeout, PERMIT, tuple(permits))

    async def aacquire_limits(
        self, names: Sequence[str], permits: Sequence[int], ttl: float, timeout: float | None
    ) -> list[LeaseRecord] | AcquireFailure:
        return await self._atake(tuple(names), ttl, timeout, PERMIT, tuple(permits))

    def _attempts(
        self, names: tuple[str, ...], ttl: float, timeout: float | None, kind: str, permits: Permits
    ) -> Generator[float, None, Taken]:
        """Attempts until one wins or ``timeout`` runs out, yielding each pause between them
        (its driver waits it out); only a name held in this process is waited for (a busy
        glob or an outage fails at once)."""
        started, attempts = time.monotonic(), 0
        while True:
            attempts += 1
            outcome, waits = self._attempt(names, ttl, kind, permits)
            left = self._left(started, timeout)
            if not waits or left <= 0:
                return _done(outcome, started, attempts)
            yield min(left, POLL)

    def _take(
        self, names: tuple[str, ...], ttl: float, timeout: float | None, kind: str, permits: Permits
    ) -> Taken:
        run = Stepper(self._attempts(names, ttl, timeout, kind, permits))
        while run.step is not None:
            with self.waiters:
                self.locks.wait(run.step)
            run.send(None)
        return cast(Taken, run.result)

    async def _atake(
        self, names: tuple[str, ...], ttl: float, timeout: float | None, kind: str, permits: Permits
    ) -> Taken:
        run = Stepper(self._attempts(names, ttl, timeout, kind, permits))
        while run.step is not None:
            with self.waiters:
                await asyncio.sleep(run.step)
            run.send(None)
        return cast(Taken, run.result)

    @staticmethod
    def _left(started: float, timeout: float | None) -> float:
        return float("inf") if timeout is None else started + timeout - time.monotonic()

    def _attempt(
        self, names: tuple[str, ...], ttl: float, kind: str, permits: Permits
    ) -> tuple[Taken, bool]:
        """One attempt, and whether waiting could end its failure (a name held here)."""
        faults, count = self.locks.faults, self.node_count
        if faults.unavailable:
            errors = dict.fromkeys(self.labels, NO_ANSWER)
            return AcquireFailure("unavailable", 0, 0, errors), False
        busy = next((name for name in names if faults.is_busy(name)), None)
        if busy is not None:
            return AcquireFailure("busy", 0, count, {}, busy_name=busy), False
        owner = secrets.token_hex(16)
        taken = self.locks.take(names, owner, ttl, kind, permits)
        if isinstance(taken, Refused):
            failure = AcquireFailure(taken.reason, 0, count, {}, busy_name=taken.name)
            return failure, taken.reason == "busy"
        return [self._record(n, h, ttl) for n, h in zip(names, taken, strict=True)], False

    def _record(self, name: str, hold: Hold, ttl: float) -> LeaseRecord:
        now, count = time.monotonic(), self.node_count
        return LeaseRecord(
            name,
            self.state.keys.lock(name),
            hold.owner,
            token=hold.token,
            ttl=ttl,
            deadline=min(now + ttl - self.state.drift(ttl), hold.expires),
            reached=(True,) * count,
            generation=forks.current,
            kind=hold.kind,
            voters=tuple(range(count)),
            acquired_at=now,
        )

    # -- held leases -------------------------------------------------------------------------
    def extend(self, lease: LeaseRecord, ttl: float) -> Renewal:
        if self.locks.faults.unavailable:
            return Renewal(UNCONFIRMED, 0, dict.fromkeys(self.labels, NO_ANSWER))
        held = not (lease.lost or lease.released)
        hold = self.locks.extend(lease.name, lease.owner, ttl) if held else None
        if hold is None:
            lease.lost = True
            return Renewal(LOST, self.node_count)
        now = time.monotonic()
        lease.deadline = min(now + ttl - self.state.drift(ttl), hold.expires)
        lease.ttl = ttl
        return Renewal(RENEWED, self.node_count)

    async def aextend(self, lease: LeaseRecord, ttl: float) -> Renewal:
        return self.extend(lease, ttl)

    def release(self, lease: LeaseRecord) -> bool:
        if lease.released:
            return False
        lease.released = True
        held = self.locks.release(lease.name, lease.owner)
        return held and not lease.lost

    async def arelease(self, lease: LeaseRecord) -> bool:
        return self.release(lease)

    def release_unfinished(self, lease: LeaseRecord) -> None:
        self.locks.release(lease.name, lease.owner)  # in memory: nothing to send later

    def release_many(self, leases: Sequence[LeaseRecord]) -> list[bool]:
        return [self.release(lease) for lease in leases]

    async def arelease_many(self, leases: Sequence[LeaseRecord]) -> list[bool]:
        return self.release_many(leases)

    def force_release(self, name: str, expected: str = "", key: str = "") -> int:
        owner = expected.partition("|")[0]
        return self.node_count if self.locks.force_release(name, owner) else 0

    async def aforce_release(self, name: str, expected: str = "", key: str = "") -> int:
        return self.force_release(name, expected, key)

    # -- records and notes -------------------------------------------------------------------
    def store_record(
        self, lease: LeaseRecord, fields: Sequence[tuple[str, bytes | str]], ttl: float
    ) -> int:
        if self.locks.faults.unavailable:
            return 0
        values = tuple(v.encode() if isinstance(v, str) else bytes(v) for _, v in fields)
        stored = self.locks.store_record(lease.name, lease.owner, lease.token, values, ttl)
        return self.node_count if stored else 0

    async def astore_record(
        self, lease: LeaseRecord, fields: Sequence[tuple[str, bytes | str]], ttl: float
    ) -> int:
        return self.store_record(lease, fields, ttl)

    def read_record(self, name: str, fields: Sequence[str], pinned: Any = None) -> RecordRead:
        count = self.node_count
        if self.locks.faults.unavailable:
            return RecordRead(None, (), 0, count, dict.fromkeys(self.labels, NO_ANSWER))
        kept = self.locks.read_record(name)
        if kept is None:
            return RecordRead(None, (), count, count)
        return RecordRead(kept[0], kept[1][: len(fields)], count, count)

    async def aread_record(
        self, name: str, fields: Sequence[str], pinned: Any = None
    ) -> RecordRead:
        return self.read_record(name, fields, pinned)

    def note(
        self, name: str, op: str, expected: str = "", value: str = "", ttl: float = 0.0
    ) -> NoteReplies:
        if self.locks.faults.unavailable:
            return NoteReplies([None] * self.node_count, dict.fromkeys(self.labels, NO_ANSWER))
        return NoteReplies([self.locks.note(name, op, expected, value, ttl)] * self.node_count)

    def order(self, *args: str | int) -> NoteReplies:
        if self.locks.faults.unavailable:
            return NoteReplies([None] * self.node_count, dict.fromkeys(self.labels, NO_ANSWER))
        return NoteReplies([self.locks.order(args)] * self.node_count)

    async def aorder(self, *args: str | int) -> NoteReplies:
        return self.order(*args)

    # -- nothing else may run: every other path of Engine would open a connection -------------
    def wait_release(self, name: str, seconds: float, *, mark: Any = None) -> bool:
        self._no_io()

    async def await_release(self, name: str, seconds: float, *, mark: Any = None) -> bool:
        self._no_io()

    @property
    def pools(self) -> Any:  # type: ignore[override]
        """No connections: every path of :class:`Engine` that would use them ends here."""
        self._no_io()

    @property
    def waits(self) -> Any:  # type: ignore[override]
        self._no_io()

    def close(self) -> None:
        """Nothing to close."""

    @staticmethod
    def _no_io() -> NoReturn:
        raise RuntimeError(
            "A simulated engine (django_redlock.testing.simulate) was asked to reach Redis; "
            "this path is not simulated. Please report it."
        )


def _one(taken: Taken) -> Outcome:
    return taken[0] if isinstance(taken, list) else taken


def _done(taken: Taken, started: float, attempts: int) -> Taken:
    """Note how long the call took and its attempts, as the real drivers do."""
    waited = time.monotonic() - started
    if isinstance(taken, AcquireFailure):
        taken.waited, taken.attempts = waited, attempts
    else:
        for record in taken:
            record.waited, record.attempts = waited, attempts
    return taken
