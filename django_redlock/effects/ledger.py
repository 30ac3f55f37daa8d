"""The ledger's two writes: :func:`begin` (committed at once) and :func:`complete` (in the
caller's transaction, fenced by the token)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.models import F
from django.utils import timezone

from ..exceptions import LockError, StaleTokenError
from . import committer
from .model import BEGUN, DONE, Effect


@dataclass(frozen=True)
class Holder:
    """What the ledger records of the lease running an effect."""

    alias: str
    name: str
    token: int


@dataclass(frozen=True)
class Begun:
    """What :func:`begin` found: ``done`` (nothing to do), or begun now, after an earlier
    holder's unfinished begin (``interrupted``); ``attempts`` counts this one."""

    done: bool
    interrupted: bool
    attempts: int


def stored_name(name: str) -> str:
    """A lock name as the ledger stores it: NUL (which PostgreSQL cannot store) escaped."""
    return name.replace("\x00", "\\x00")[:512]


def _here() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:255]


def stale(key: str, holder: Holder, row_token: int | None, what: str) -> StaleTokenError:
    """The refusal of a stale holder's begin or completion of ``key``."""
    if row_token == holder.token:
        why = (
            f"another block under this same lease (token {row_token}) has begun or done it "
            "since (one block per effect and lease at a time)"
        )
    else:
        why = (
            f"a newer lease (token {row_token}) has begun or done it since. This holder's "
            "lease was lost; its work must not count"
        )
    return StaleTokenError(
        Effect,
        key,
        row_token=row_token,
        token=holder.token,
        message=f"Effect {key!r}: {what} with fencing token {holder.token} refused, nothing "
        f"was written: {why}.",
    )


def _other_alias(key: str, row: Effect, holder: Holder) -> LockError:
    return LockError(
        f"Effect {key!r} belongs to alias {row.alias!r}, and this lease is of alias "
        f"{holder.alias!r}: tokens of two aliases are not comparable, so one effect key must "
        "be run under leases of one alias."
    )


def _create(key: str, holder: Holder, using: str, state: str) -> None:
    now = timezone.now()
    Effect.objects.using(using).create(
        key=key,
        alias=holder.alias,
        state=state,
        token=holder.token,
        lock_name=stored_name(holder.name),
        began_at=now,
        began_by=_here(),
        done_at=now if state == DONE else None,
    )


def _begin_here(key: str, holder: Holder, using: str) -> Begun:
    """Begin ``key`` on this thread's connection, in autocommit mode (committed on return):
    a done key costs one SELECT, a new one a SELECT and an INSERT."""
    rows = Effect.objects.using(using)
    row = rows.filter(key=key).first()
    if row is None:
        try:
            _create(key, holder, using, BEGUN)
            return Begun(done=False, interrupted=False, attempts=1)
        except IntegrityError:  # another holder created it first: read it
            row = rows.get(key=key)
    if row.alias != holder.alias:
        raise _other_alias(key, row, holder)
    if row.state == DONE:
        return Begun(done=True, interrupted=False, attempts=row.attempts)
    with transaction.atomic(using=using):  # the write first: SQLite waits for its lock
        updated = rows.filter(key=key, state=BEGUN, token__lte=holder.token).update(
            token=holder.token,
            lock_name=stored_name(holder.name),
            attempts=F("attempts") + 1,
            began_at=timezone.now(),
            began_by=_here(),
        )
        row = rows.get(key=key)
    if updated:
        return Begun(done=False, interrupted=True, attempts=row.attempts)
    if row.state == DONE:  # done meanwhile
        return Begun(done=True, interrupted=False, attempts=row.attempts)
    raise stale(key, holder, row.token, "begin")


def _begin_elsewhere(key: str, holder: Holder, using: str, wait: float) -> Begun:
    """:func:`_begin_here` on the committer thread's connection; on PostgreSQL its waits for
    row locks end after ``wait`` seconds: the lock may be held by the caller's own open
    transaction (or by one that waits for it), a cycle PostgreSQL cannot see."""
    if connections[using].vendor == "postgresql":
        with connections[using].cursor() as cursor:
            cursor.execute(f"SET lock_timeout = {max(1, int(wait * 1000))}")
    return _begin_here(key, holder, using)


def _row_locked(exc: OperationalError) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) == "55P03"  # lock_not_available


def begin(key: str, holder: Holder, using: str, wait: float = 10.0) -> Begun:
    """Record that ``holder`` begins ``key``, committed before this returns: inside the
    caller's transaction (or with autocommit off) it is written on a connection of its own,
    so a process killed later, or a rollback, still leaves it begun (the next holder sees
    ``interrupted``)."""
    connection = connections[using]
    if connection.get_autocommit():
        return _begin_here(key, holder, using)
    if connection.vendor != "sqlite":  # (on SQLite this read would block the begin's commit)
        # done earlier in this very transaction: its row lock would make the begin's own
        # connection wait for this transaction, which waits for the begin
        row = Effect.objects.using(using).filter(key=key).first()
        if row is not None and row.state == DONE:
            if row.alias != holder.alias:
                raise _other_alias(key, row, holder)
            return Begun(done=True, interrupted=False, attempts=row.attempts)
    try:
        return committer.run(lambda: _begin_elsewhere(key, holder, using, wait))
    except OperationalError as exc:
        if _row_locked(exc):
            raise LockError(
                f"Effect {key!r}: its begin waited {wait:g} s for the effect's row, which an "
                "open transaction has written and not committed: this caller's own (through "
                "another lease), or one that waits for this caller's. Nothing was begun. Run "
                "each effect in a transaction of its own, or commit before the next one "
                "(docs/effects.md)."
            ) from exc
        if connection.vendor != "sqlite" or "locked" not in str(exc):
            raise
        raise LockError(
            f"Effect {key!r}: its begin could not be committed beside the open transaction "
            f"on database {using!r}: SQLite lets one connection write at a time, and an open "
            "transaction (this caller's, or another connection's) holds the database. Open "
            "lease.once() before the transaction's first query, or outside it "
            "(docs/effects.md)."
        ) from exc


def complete(key: str, holder: Holder, using: str) -> None:
    """Mark ``key`` done under ``holder``'s token, in the caller's transaction (or at once
    outside one); a newer holder's begin or completion makes it :class:`StaleTokenError`."""
    rows = Effect.objects.using(using)
    updated = rows.filter(key=key, state=BEGUN, token__lte=holder.token).update(
        state=DONE, token=holder.token, lock_name=stored_name(holder.name), done_at=timezone.now()
    )
    if updated:
        return
    row = rows.filter(key=key).first()
    if row is None:  # deleted while it ran (an operator): it was done all the same
        _create(key, holder, using, DONE)
        return
    raise stale(key, holder, row.token, "completion")
