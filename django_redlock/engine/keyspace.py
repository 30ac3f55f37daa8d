"""Where every fact about the keys an alias writes lives: names, limits, the lock value format.

Keys an alias writes (all start with its ``KEY_PREFIX``; lock names may not start with
:data:`RESERVED_MARK`, so a lock never collides with the bookkeeping keys):

* ``<prefix><name>``: one lock; the value is :class:`LockValue` (``owner|token|ms|host|pid``).
* ``<prefix>__waiters__:<name>``: who waits for the name: a sorted set of waiter ids, each
  scored with the moment (ms on the node's own clock) its registration lapses.
* ``<prefix>__wake__:<name>``: the wake-up list waiters block on.
* ``<prefix>__handoff__:<name>``: a short reservation for the waiter a release woke.
* ``<prefix>__fence__``: the alias's permanent fence hash (counter, run_id, longest TTL).
* ``<prefix>__record__:<name>``: a fenced record beside the lock ``name`` (a hash: the token
  that wrote it, and its fields), e.g. an idempotent request's response.
* ``<prefix>__permit__:<k>:<name>``: slot ``k`` of the semaphore ``name`` (a lock value); the
  semaphore's marker, ``semaphore|<permits>``, is at ``<prefix><name>``.
* ``<prefix>__readers__:<name>`` and ``<prefix>__writers__:<name>``: the read leases and the
  waiting writers of the read-write lock ``name``; while readers hold it, ``<prefix><name>``
  holds the marker ``rwlock|readers`` (a writer holds it like a lock, its value ending with
  :data:`WRITE_MARK`).

``engine/scripts/`` explains what each script does with them.
"""

from __future__ import annotations

import os
import random
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

#: Keys of the alias's own bookkeeping start with this after the prefix; lock names may not.
RESERVED_MARK = "__"
#: The longest lock name, not counting the alias's ``KEY_PREFIX``.
MAX_NAME_LENGTH = 512
#: Tokens (and TTLs in ms) stay below 2**53: exact in JavaScript, JSON and Lua doubles.
TOKEN_LIMIT = 2**53
#: Characters that ``SCAN MATCH`` treats as glob syntax (forbidden in ``KEY_PREFIX``).
GLOB_CHARACTERS = "*?[]\\"
#: Hex digits of an owner value (128 random bits).
OWNER_HEX_DIGITS = 32
#: The value at a semaphore's name: this, then its number of permits.
SEMAPHORE_MARKER = "semaphore|"
#: What ends the lock value of a read-write lock's write lease (after the pid, so older
#: readers of the format take it for part of the host).
WRITE_MARK = "|write"
_LOCK_VALUE = re.compile(rf"[0-9a-f]{{{OWNER_HEX_DIGITS}}}\|\d+\|")


def quorum(count: int) -> int:
    """How many of ``count`` nodes must agree: a strict majority."""
    return count // 2 + 1


def escape_glob(text: str) -> str:
    """``text`` with every glob character escaped for ``SCAN MATCH``."""
    return "".join(f"\\{ch}" if ch in GLOB_CHARACTERS else ch for ch in text)


def as_text(value: Any) -> str:
    """A reply (bytes or anything else) as ``str``; undecodable bytes are replaced."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def new_owner() -> str:
    """An unguessable owner value: whoever knows it can extend or release that lease."""
    # os.urandom is what secrets.token_hex reads, without its two Python calls in between
    return os.urandom(OWNER_HEX_DIGITS // 2).hex()


def new_waiter() -> str:
    """An id for one ``acquire()`` call that waits (its entry in the name's waiter set).

    Not a secret (it grants nothing), only unique: 64 bits from ``random``, which is cheaper
    than ``secrets`` and is reseeded in a forked child."""
    return f"{random.getrandbits(64):016x}"


def wake_node(name: str, count: int) -> int:
    """The node every waiter of ``name`` blocks on (and the only one releases push to)."""
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) % count


@dataclass(frozen=True)
class Keyspace:
    """The key names of one alias (one ``KEY_PREFIX``)."""

    prefix: str
    fence: str = field(init=False)

    #: what the lock, waiter-set, wake-up and hand-off keys put before a name (for the
    #: single-node lane, which joins them without a call; :meth:`lock` and the others stay
    #: the definition, and tests/engine/test_lane_plans.py checks the two agree)
    lock_prefix: str = field(init=False)
    waiters_prefix: str = field(init=False)
    wake_prefix: str = field(init=False)
    handoff_prefix: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fence", f"{self.prefix}{RESERVED_MARK}fence__")
        for kind in ("lock", "waiters", "wake", "handoff"):
            object.__setattr__(self, f"{kind}_prefix", getattr(self, kind)(""))

    def lock(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def waiters(self, name: str) -> str:
        # not ``__wait__``: older versions keep a string there, and a rolling upgrade must not
        # meet WRONGTYPE
        return f"{self.prefix}{RESERVED_MARK}waiters__:{name}"

    def wake(self, name: str) -> str:
        return f"{self.prefix}{RESERVED_MARK}wake__:{name}"

    def handoff(self, name: str) -> str:
        return f"{self.prefix}{RESERVED_MARK}handoff__:{name}"

    def readers(self, name: str) -> str:
        return f"{self.prefix}{RESERVED_MARK}readers__:{name}"

    def writers(self, name: str) -> str:
        return f"{self.prefix}{RESERVED_MARK}writers__:{name}"

    def record(self, name: str) -> str:
        """A fenced record kept beside the lock ``name`` (see ``scripts/records.py``)."""
        return f"{self.prefix}{RESERVED_MARK}record__:{name}"

    def permit(self, name: str, slot: int) -> str:
        return f"{self.prefix}{RESERVED_MARK}permit__:{slot}:{name}"

    def name_of(self, key: str) -> str | None:
        """The lock name of ``key``, or None for a bookkeeping key or another prefix's key."""
        if not key.startswith(self.prefix):
            return None
        name = key[len(self.prefix) :]
        return None if name.startswith(RESERVED_MARK) else name


@dataclass(frozen=True)
class LockValue:
    """The value of one lock key: ``<owner>|<token>|<acquired_ms>|<host>|<pid>``, and
    :data:`WRITE_MARK` after it for a write lease (``write``).

    ``ACQUIRE`` writes ``owner``, ``|``, the token and then :meth:`suffix`; inspection parses it
    back. ``owner`` is a secret: nothing outside the engine and inspection may show it.
    """

    owner: str = field(repr=False)
    token: int
    acquired_ms: int | None
    host: str
    pid: int | None
    raw: str = field(repr=False)
    write: bool = False

    @staticmethod
    def suffix(acquired_ms: int, host: str, pid: int) -> str:
        """What follows the token: ``|<acquired_ms>|<host>|<pid>``."""
        return f"|{acquired_ms}|{host}|{pid}"

    @staticmethod
    def looks_like_lock(raw: str) -> bool:
        """True for a value in this format (anything else under the prefix is not ours)."""
        return _LOCK_VALUE.match(raw) is not None

    @classmethod
    def parse(cls, raw: str) -> LockValue:
        """Parse a value; missing or malformed parts become empty (a host may contain ``|``;
        the pid before :data:`WRITE_MARK` is digits, so the mark is never part of a host)."""
        write = raw.endswith(WRITE_MARK)
        parts = raw.removesuffix(WRITE_MARK).split("|")
        owner = parts[0]
        token = _int(parts[1]) if len(parts) > 1 else None
        acquired = _int(parts[2]) if len(parts) > 2 else None
        pid = _int(parts[-1]) if len(parts) > 4 else None
        host = "|".join(parts[3:-1]) if len(parts) > 4 else "|".join(parts[3:])
        return cls(owner, token or 0, acquired, host, pid, raw, write)


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
