"""The in-memory state of a simulation (``django_redlock.testing.simulate``): who holds which
name, the faults asked for, fenced records and notes. No I/O, no Django, no engine: the
simulated engine (:mod:`.simulated_engine`) turns its answers into leases and failures.

One :class:`SimulatedLocks` per simulation, shared by the threads and tasks of the process
under a mutex; a :class:`threading.Condition` on it wakes blocked acquire calls when a name
is released.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine import TOKEN_LIMIT

#: LeaseRecord.kind values (kept in step with ``engine/kinds.py``).
LOCK, PERMIT, READ, WRITE = "", "permit", "read", "write"


def glob_pattern(glob: str) -> re.Pattern[bytes]:
    """``glob`` with Redis's ``MATCH`` syntax as a regex over a name's UTF-8 bytes, read as
    Redis reads it (``stringmatchlen``): ``*``, ``?`` (one byte), ``\\`` escaping the next
    character (a last ``\\`` is itself), and sets ``[abc]``, ``[^a]``, ``[a-z]`` where a
    reversed range counts (``[c-a]`` is ``[a-c]``), a set left open ends with the glob and
    ``[]`` matches nothing (``[^]`` any one byte)."""
    if not isinstance(glob, str) or not glob:
        raise ValueError(f"A busy glob must be a non-empty string, not {glob!r}.")
    raw = glob.encode("utf-8", "surrogateescape")
    out, i = [], 0
    while i < len(raw):
        byte = raw[i]
        if byte == ord("\\") and i + 1 < len(raw):
            out.append(_byte(raw[i + 1]))
            i += 2
        elif byte == ord("*"):
            out.append(b".*")
            i += 1
        elif byte == ord("?"):
            out.append(b".")
            i += 1
        elif byte == ord("["):
            part, i = _byte_set(raw, i + 1)
            out.append(part)
        else:
            out.append(_byte(byte))
            i += 1
    return re.compile(b"".join(out), re.DOTALL)


def _byte(value: int) -> bytes:
    return b"\\x%02x" % value


def _byte_range(first: int, last: int) -> bytes:
    """The range ``first-last`` as Redis compares it: bytes as signed chars (0x80-0xFF come
    before 0x00), either end first."""
    low, high = sorted(value - 256 if value > 127 else value for value in (first, last))
    if low < 0 <= high:  # it wraps: 0x80.. up to 0xFF, then 0x00 up to high
        return _byte(low & 0xFF) + b"-" + _byte(0xFF) + _byte(0) + b"-" + _byte(high)
    return _byte(low & 0xFF) + b"-" + _byte(high & 0xFF)


def _byte_set(raw: bytes, i: int) -> tuple[bytes, int]:
    """The set that starts at ``raw[i]`` (just after its ``[``) as a regex, and the index
    after it."""
    negate = i < len(raw) and raw[i] == ord("^")
    i += negate
    items: list[bytes] = []
    while i < len(raw) and raw[i] != ord("]"):
        if raw[i] == ord("\\") and i + 1 < len(raw):
            items.append(_byte(raw[i + 1]))
            i += 2
        elif i + 2 < len(raw) and raw[i + 1] == ord("-"):
            items.append(_byte_range(raw[i], raw[i + 2]))
            i += 3
        else:
            items.append(_byte(raw[i]))
            i += 1
    i += 1  # the closing ], or past the end of a set left open
    if not items:
        return (b"." if negate else b"(?!)"), i
    return b"[" + (b"^" if negate else b"") + b"".join(items) + b"]", i


@dataclass(frozen=True)
class Faults:
    """What a simulation makes go wrong (see ``simulate``)."""

    busy: tuple[str, ...] = ()
    unavailable: bool = False
    lost_after: float | None = None
    patterns: tuple[re.Pattern[bytes], ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def of(cls, busy: Iterable[str], unavailable: bool, lost_after: float | None) -> Faults:
        """Checked faults: a clear error for bad arguments, before anything is changed."""
        if isinstance(busy, str):
            raise TypeError(f"busy must be a list of globs, not the string {busy!r}: ({busy!r},)")
        if isinstance(busy, bytes | bytearray):
            raise TypeError(f"busy must be a list of globs (strings), not {busy!r}.")
        try:
            globs = tuple(busy)
        except TypeError:
            raise TypeError(f"busy must be a list of globs, not {busy!r}.") from None
        if not isinstance(unavailable, bool):
            raise TypeError(f"unavailable must be True or False, not {unavailable!r}.")
        if lost_after is not None and (
            isinstance(lost_after, bool) or not isinstance(lost_after, int | float)
        ):
            raise TypeError(f"lost_after must be None or seconds (a number), not {lost_after!r}.")
        if lost_after is not None and not (math.isfinite(lost_after) and lost_after >= 0):
            raise ValueError(f"lost_after must be None or seconds >= 0, not {lost_after!r}.")
        return cls(globs, unavailable, lost_after, tuple(glob_pattern(g) for g in globs))

    def is_busy(self, name: str) -> bool:
        """True if ``name`` matches a busy glob (held elsewhere)."""
        if not self.patterns:
            return False
        raw = name.encode("utf-8", "surrogateescape")
        return any(pattern.fullmatch(raw) for pattern in self.patterns)


_token_mutex = threading.Lock()
_last_token = 0


def next_token() -> int:
    """A fencing token above every one this process handed out, and at least the time in
    microseconds: a later simulation (or a later test run on the same database) never hands
    out a token lower than rows an earlier one wrote. Below ``TOKEN_LIMIT`` until 2255."""
    global _last_token
    with _token_mutex:
        _last_token = max(_last_token + 1, int(time.time() * 1_000_000))
        if _last_token >= TOKEN_LIMIT:  # pragma: no cover - the year 2255
            raise OverflowError("Simulated fencing tokens reached TOKEN_LIMIT.")
        return _last_token


#: one permit count for every name, or one per name
Permits = int | Sequence[int]


@dataclass
class Hold:
    """One lease held in memory."""

    owner: str
    kind: str
    permits: int
    token: int
    #: when it runs out (monotonic): its TTL, or ``lost_after`` when that comes first
    expires: float
    #: when ``lost_after`` makes it lost (monotonic), or None
    lost_at: float | None

    @property
    def family(self) -> str:
        """Leases of one family may share a name (permits of one size, read and write)."""
        if self.kind == PERMIT:
            return f"permit:{self.permits}"
        return "rw" if self.kind in (READ, WRITE) else "lock"


@dataclass(frozen=True)
class Refused:
    """Why names could not be taken: ``busy`` or ``other_kind``, and which name."""

    reason: str
    name: str


def family_of(kind: str, permits: int) -> str:
    return Hold("", kind, permits, 0, 0.0, None).family


class SimulatedLocks:
    """The names held in memory by one simulation, its records and notes."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self._mutex = threading.Lock()
        #: notified on every release: blocked acquire calls try again
        self.released = threading.Condition(self._mutex)
        self._holds: dict[str, list[Hold]] = {}
        self._records: dict[str, tuple[int, tuple[bytes, ...], float]] = {}
        self._notes: dict[str, tuple[str, float]] = {}
        #: the lock-order checker's records (``engine.plans.order_edges``): field -> value
        self._order: dict[str, bytes] = {}

    # -- leases ------------------------------------------------------------------------
    def _live(self, name: str, now: float) -> list[Hold]:
        holds = [h for h in self._holds.get(name, ()) if h.expires > now]
        if holds:
            self._holds[name] = holds
        else:
            self._holds.pop(name, None)
        return holds

    def _refusal(self, name: str, kind: str, permits: int, now: float) -> Refused | None:
        holds = self._live(name, now)
        if not holds:
            return None
        if holds[0].family != family_of(kind, permits):
            return Refused("other_kind", name)
        if kind == PERMIT and len(holds) < permits:
            return None
        if kind == READ and all(h.kind == READ for h in holds):
            return None
        return Refused("busy", name)

    def take(
        self, names: Sequence[str], owner: str, ttl: float, kind: str, permits: Permits
    ) -> list[Hold] | Refused:
        """Hold every name of ``names`` for ``owner`` (all or none), or say why not;
        ``permits``: one count for every name, or one per name (``limits()``)."""
        counts = [permits] * len(names) if isinstance(permits, int) else list(permits)
        with self._mutex:
            now = time.monotonic()
            for name, count in zip(names, counts, strict=True):
                refused = self._refusal(name, kind, count, now)
                if refused is not None:
                    return refused
            lost_after = self.faults.lost_after
            lost_at = None if lost_after is None else now + lost_after
            taken = []
            for name, count in zip(names, counts, strict=True):
                expires = now + ttl if lost_at is None else min(now + ttl, lost_at)
                hold = Hold(owner, kind, count, next_token(), expires, lost_at)
                self._holds.setdefault(name, []).append(hold)
                taken.append(hold)
            return taken

    def _find(self, name: str, owner: str, now: float) -> Hold | None:
        return next((h for h in self._live(name, now) if h.owner == owner), None)

    def extend(self, name: str, owner: str, ttl: float) -> Hold | None:
        """Renew ``owner``'s lease of ``name`` to ``ttl`` (never past its ``lost_at``); None
        when it is no longer held (lost)."""
        with self._mutex:
            now = time.monotonic()
            hold = self._find(name, owner, now)
            if hold is not None:
                until = now + ttl
                hold.expires = until if hold.lost_at is None else min(until, hold.lost_at)
                if hold.expires <= now:
                    return None
            return hold

    def release(self, name: str, owner: str) -> bool:
        """Let ``owner``'s lease of ``name`` go; True if it was still held."""
        with self._mutex:
            hold = self._find(name, owner, time.monotonic())
            if hold is not None:
                self._holds[name].remove(hold)
                self.released.notify_all()
            return hold is not None

    def force_release(self, name: str, expected: str = "") -> bool:
        """Drop ``name``'s leases (only ``expected``'s owner's, if given); True if any was."""
        with self._mutex:
            holds = self._live(name, time.monotonic())
            gone = [h for h in holds if not expected or h.owner == expected]
            for hold in gone:
                holds.remove(hold)
            self.released.notify_all()
            return bool(gone)

    def wait(self, seconds: float) -> None:
        """Block until a release (or ``seconds``)."""
        with self._mutex:
            self.released.wait(seconds)

    def held(self) -> list[tuple[str, Hold]]:
        """Every live lease, by name."""
        with self._mutex:
            now = time.monotonic()
            return [(name, hold) for name in sorted(self._holds) for hold in self._live(name, now)]

    # -- fenced records and notes --------------------------------------------------------
    def store_record(
        self, name: str, owner: str, token: int, values: tuple[bytes, ...], ttl: float
    ) -> bool:
        """Keep ``values`` for ``name`` while ``owner`` holds it and no newer token's are kept."""
        with self._mutex:
            now = time.monotonic()
            kept = self._records.get(name)
            if self._find(name, owner, now) is None:
                return False
            if kept is not None and kept[2] > now and kept[0] > token:
                return False
            self._records[name] = (token, values, now + ttl)
            return True

    def read_record(self, name: str) -> tuple[int, tuple[bytes, ...]] | None:
        with self._mutex:
            kept = self._records.get(name)
            if kept is None or kept[2] <= time.monotonic():
                return None
            return kept[0], kept[1]

    def note(self, name: str, op: str, expected: str, value: str, ttl: float) -> bytes | int | None:
        """One note operation, as ``engine.plans.notes.NOTE`` does it on a node."""
        with self._mutex:
            now = time.monotonic()
            kept = self._notes.get(name)
            current = kept[0] if kept is not None and kept[1] > now else None
            if op == "get":
                return None if current is None else current.encode()
            if op == "set" or (op == "replace" and current is None):
                self._notes[name] = (value, now + max(ttl, 0.001))
                return 1
            if current is None or current.partition("|")[2] != expected:
                return 0
            if op == "replace":
                self._notes[name] = (value, now + max(ttl, 0.001))
            elif op == "delete":
                del self._notes[name]
            return 1

    def order(self, args: Sequence[str | int]) -> Any:
        """One operation on the lock-order checker's records, as ``engine.plans.order_edges.ORDER``
        does it on a node."""
        op = args[0]
        with self._mutex:
            if op == "add":
                edge, stack, reverse = str(args[1]), str(args[2]), str(args[3])
                bound = int(args[5]) if len(args) > 5 else 0
                if bound and f"s|{edge}" not in self._order and len(self._order) >= bound:
                    return self._order.get(f"s|{reverse}")
                self._order.setdefault(f"s|{edge}", stack.encode())
                count = int(self._order.get(f"n|{edge}", b"0")) + 1
                self._order[f"n|{edge}"] = str(count).encode()
                return self._order.get(f"s|{reverse}")
            if op == "get":
                return self._order.get(f"s|{args[1]}")
            if op == "all":
                return [x for field, value in self._order.items() for x in (field.encode(), value)]
            if op == "clear":
                had = int(bool(self._order))
                self._order.clear()
                return had
        raise ValueError(f"unknown order operation {op!r}")
