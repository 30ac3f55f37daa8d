"""A process campaigning for a leadership (tests/leaders/test_leader_processes.py).

``python -m tests.support.leader_worker NAME LOG TTL CODE [asyncio]``, with the subprocess
settings: campaigns for NAME (``leader``, or ``aleader`` on an event loop); once elected,
writes the ``Coupon`` row CODE under its term every 20 ms while it is the leader, and appends
one line per event to LOG (``elected``, ``wrote``, ``demoted``,
``late-refused``/``late-accepted``: a write tried after the demotion), each ``EVENT PID TERM
TIME``. SIGTERM ends it (exit 0).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any


def main(name: str, log_path: str, ttl: str, code: str, mode: str = "sync") -> None:
    import django

    django.setup()
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(event: str, term: int | None) -> None:
        os.write(log, f"{event} {os.getpid()} {term} {time.time():.6f}\n".encode())

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if mode == "asyncio":
        asyncio.run(_campaign_on_a_loop(name, float(ttl), code, note))
    else:
        _campaign(name, float(ttl), code, note)


def _campaign(name: str, ttl: float, code: str, note: Any) -> None:
    from django_redlock import locks
    from django_redlock.exceptions import LockError, StaleTokenError
    from tests.fencing_app.models import Coupon

    with locks["default"].leader(
        name, ttl=ttl, on_demoted=lambda lead: note("demoted", lead.term)
    ) as lead:
        note("elected", lead.term)
        while lead.is_leader:
            try:
                coupon = Coupon.objects.claim(pk=Coupon.objects.get(code=code).pk)
                coupon.amount += 1  # the term itself is the row's fence_token
                coupon.save()
            except (StaleTokenError, LockError):
                pass  # demoted meanwhile: the loop's check says so
            else:
                note("wrote", lead.term)
            time.sleep(0.02)
        lead.wait_demoted(60)
        try:  # what a deposed leader that did not look would do: write under its term
            coupon = Coupon.objects.claim(pk=Coupon.objects.get(code=code).pk, token=lead.term)
            coupon.amount = -1
            coupon.save()
        except StaleTokenError:
            note("late-refused", lead.term)
        else:
            note("late-accepted", lead.term)
        while True:  # stay, as a process would, until told to stop
            time.sleep(1)


async def _campaign_on_a_loop(name: str, ttl: float, code: str, note: Any) -> None:
    from django_redlock import locks
    from django_redlock.exceptions import LockError, StaleTokenError
    from tests.fencing_app.models import Coupon

    async with locks["default"].aleader(
        name, ttl=ttl, on_demoted=lambda lead: note("demoted", lead.term)
    ) as lead:
        note("elected", lead.term)
        while lead.is_leader:
            try:
                pk = (await Coupon.objects.aget(code=code)).pk
                coupon = await Coupon.objects.aclaim(pk)
                coupon.amount += 1  # the term itself is the row's fence_token
                await coupon.asave()
            except (StaleTokenError, LockError):
                pass
            else:
                note("wrote", lead.term)
            await asyncio.sleep(0.02)
        while not lead.demoted:
            await asyncio.sleep(0.01)
        try:
            pk = (await Coupon.objects.aget(code=code)).pk
            coupon = await Coupon.objects.aclaim(pk, token=lead.term)
            coupon.amount = -1
            await coupon.asave()
        except StaleTokenError:
            note("late-refused", lead.term)
        else:
            note("late-accepted", lead.term)
        while True:
            await asyncio.sleep(1)


if __name__ == "__main__":
    main(*sys.argv[1:6])
