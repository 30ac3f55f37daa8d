"""The drivers of the engine's renewal policy for held leases: one daemon thread for a lease or
a ``lock_many`` set, or an asyncio task per lease."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Sequence
from typing import Protocol, cast

from ..engine import LeaseRecord, Renew, RenewalBound, Stepper, renewal_policy


class Renewable(Protocol):
    """What the drivers need of a lease (:class:`~.lease.Lease`)."""

    record: LeaseRecord
    renewal_bound: RenewalBound | None
    renewal_wakeup: asyncio.Event | None

    @property
    def ttl(self) -> float: ...

    @property
    def name(self) -> str: ...

    def renew_once(self) -> str: ...

    async def arenew_once(self) -> str: ...

    def renewals_ended(self, why: str | None) -> None: ...


class RenewalThread(threading.Thread):
    """Runs :func:`~.engine.policy.renewal_policy` for each of its leases until the policy
    ends or the lease's renewals are stopped; the thread ends with its last lease."""

    def __init__(self, leases: Sequence[Renewable]) -> None:
        names = leases[0].name if len(leases) == 1 else f"{leases[0].name} +{len(leases) - 1}"
        super().__init__(name=f"redlock-renew {names}", daemon=True)
        self._runs = {
            lease: Stepper(renewal_policy(lease.record, cast(RenewalBound, lease.renewal_bound)))
            for lease in leases
        }
        #: held while a renewal runs: a lease stopped meanwhile is renewed no more after stop()
        #: (re-entrant: a lock_lost receiver may release the lease from this very thread)
        self._renewing = threading.RLock()
        self._stopped: set[Renewable] = set()
        #: leases whose TTL was shortened: their pause is cut to a third of the new TTL
        self._hastened: set[Renewable] = set()
        #: wake-ups of the thread's pause: a queue, whose put is one C call, where an Event's
        #: set takes a condition's lock in Python code (a signal handler raising in the main
        #: thread as that lock was taken left it held, and the next set() hung for good)
        self._wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()

    def hasten(self, lease: Renewable) -> None:
        """Cut ``lease``'s current pause to a third of its (new, shorter) TTL."""
        with self._renewing:
            self._hastened.add(lease)
        self._wakeups.put(None)

    def stop(self, lease: Renewable) -> None:
        """No renewal of ``lease`` starts after this returns; the last lease stopped also waits
        for the thread to end."""
        with self._renewing:
            self._stopped.add(lease)
            last = len(self._stopped) == len(self._runs)
        if last:
            self._wakeups.put(None)
            if self is not threading.current_thread():
                # RuntimeError: its start() was interrupted before the thread said it runs;
                # it ends on its own (it sees every lease stopped before it renews)
                with contextlib.suppress(RuntimeError):
                    self.join()

    def run(self) -> None:
        due: dict[Renewable, float] = {}  # when each lease's pause ends
        for lease in self._runs:
            self._advance(lease, due)
        while due:
            pause = min(due.values()) - time.monotonic()
            if self._woken(min(max(0.0, pause), threading.TIMEOUT_MAX)):
                with self._renewing:
                    if len(self._stopped) == len(self._runs):
                        return  # every lease was stopped
                    hastened, self._hastened = self._hastened, set()
                for lease in hastened & due.keys():
                    due[lease] = min(due[lease], time.monotonic() + lease.ttl / 3)
            now = time.monotonic()
            for lease in [lease for lease, until in due.items() if until <= now]:
                self._runs[lease].send(None)
                self._advance(lease, due)

    def _woken(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a wake-up; True (and every wake-up taken) if
        one came."""
        try:
            self._wakeups.get(timeout=timeout)
        except queue.Empty:
            return False
        with contextlib.suppress(queue.Empty):
            while True:
                self._wakeups.get_nowait()
        return True

    def _advance(self, lease: Renewable, due: dict[Renewable, float]) -> None:
        """Run ``lease``'s renewals up to its policy's next pause and note when it ends; forget
        the lease once it is stopped or its policy has ended."""
        run = self._runs[lease]
        while isinstance(run.step, Renew):
            with self._renewing:
                if lease in self._stopped:
                    due.pop(lease, None)
                    return
                run.send(lease.renew_once())
        if run.step is None:
            due.pop(lease, None)
            if lease not in self._stopped:
                lease.renewals_ended(run.result)
        else:
            due[lease] = time.monotonic() + run.step.seconds


async def renew_in_task(lease: Renewable, bound: RenewalBound) -> None:
    """The asyncio driver of the renewal policy (cancelling the task stops it)."""
    run = Stepper(renewal_policy(lease.record, bound))
    while run.step is not None:
        if isinstance(run.step, Renew):
            run.send(await lease.arenew_once())
        else:
            await _pause(lease, run.step.seconds)
            run.send(None)
    lease.renewals_ended(run.result)


async def _pause(lease: Renewable, seconds: float) -> None:
    """Sleep ``seconds``, cut to a third of the TTL whenever an extend shortens it."""
    wakeup = cast(asyncio.Event, lease.renewal_wakeup)
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        try:
            await asyncio.wait_for(wakeup.wait(), left)
        except TimeoutError:
            return
        wakeup.clear()
        until = min(until, time.monotonic() + lease.ttl / 3)
