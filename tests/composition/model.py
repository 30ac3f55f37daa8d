"""The oracle of the composition machine: what the machine knows of every lease, and the rules
every state must keep (one holder at a time, tokens that only grow, nothing left on the nodes
that nobody can release, no stale write accepted).

Validity near its end is never decisive: a lease with less than :data:`MARGIN` seconds left
counts as neither valid nor expired, and "expired" needs the model's own upper bound of when
its keys end on the nodes to have passed (the machine sleeps well past short TTLs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Seconds of validity below which a lease counts as neither valid nor invalid.
MARGIN = 0.05
#: The names of one example (short names; the machine prefixes them with its run id).
LOCK_NAMES = ("a", "b", "c")
RW_NAME = "r"
SEM_NAME = "s"
PERMITS = 2
#: the second semaphore (limits() sets pair it with SEM_NAME); its permits are drawn per example
SEM2_NAME = "t"
SEM_NAMES = (SEM_NAME, SEM2_NAME)
ALL_NAMES = (*LOCK_NAMES, RW_NAME, *SEM_NAMES)


class Violation(AssertionError):
    """A broken promise of the library, with what the machine saw."""


def kind_of(name: str) -> str:
    """The lock kind a name of the example is used as: ``lock``, ``rw`` or ``sem``."""
    if name == RW_NAME:
        return "rw"
    if name in SEM_NAMES:
        return "sem"
    return "lock"


@dataclass(eq=False)
class Holding:
    """One lease the machine knows of (a re-entered lease stays one holding)."""

    hid: int
    #: "lock", "read", "write" or "sem"
    kind: str
    #: the short name ("a", "r", "s")
    name: str
    #: "main", "thread", "peer", "gen" or "async"
    who: str
    token: int
    ttl: float
    lease: Any = None
    peer_id: int | None = None
    #: peer: a lower bound of when its validity ends (monotonic, this process)
    valid_until: float = 0.0
    #: peer: a timer releases it at about this moment
    pending_release: float | None = None
    #: how many things should keep it renewed (auto_extend, kept until commit, inner blocks)
    renewers: int = 0
    released: bool = False
    #: force-released by the operator (stale: the client does not know)
    forced: bool = False
    #: upper bound of when its keys end on the nodes, while nothing renews it
    node_end: float = 0.0
    #: >0: kept until the commit of the atomic block at this depth
    kept_level: int = 0
    #: the longest TTL it was given (acquire, extend, re-entry)
    longest_ttl: float = 0.0
    #: something renews it only until a max_hold (a re-entry's auto_extend may reuse that)
    bounded: bool = False
    #: open blocks of this lease (lock/read/write/semaphore/lock_many blocks, generators,
    #: re-entries included): the last one to end lets it go
    blocks: int = 0

    def __repr__(self) -> str:
        state = "released" if self.released else ("forced" if self.forced else "held")
        return (
            f"<H{self.hid} {self.who} {self.kind} {self.name!r} token={self.token} "
            f"ttl={self.ttl} {state} renewers={self.renewers} kept={self.kept_level} "
            f"blocks={self.blocks}>"
        )

    @property
    def local(self) -> bool:
        return self.lease is not None

    def validity(self, now: float) -> float:
        """The validity the holder believes it has (peer: a lower bound)."""
        if self.released:
            return 0.0
        if self.local:
            return float(self.lease.validity)
        end = self.valid_until
        if self.pending_release is not None:
            end = min(end, self.pending_release)
        return max(0.0, end - now)

    def surely_valid(self, now: float) -> bool:
        """Held and valid, and the operator did not take it away."""
        return not self.released and not self.forced and self.validity(now) > MARGIN

    def renewed_by_nodes(self, now: float) -> None:
        """A renewal or extend just ended (or renewals stopped): its keys end by now + TTL."""
        self.node_end = max(self.node_end, now + self.longest_ttl + MARGIN)


@dataclass
class Model:
    """Every lease of one example, the tokens handed out and the rows' fence tokens."""

    holdings: list[Holding] = field(default_factory=list)
    #: every token granted per name: (kind, token), in grant order
    grants: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    #: the highest token of a lock, write or permit grant of the alias so far
    alias_high: int = 0
    #: every token granted so far, and to which lease
    issued: dict[int, str] = field(default_factory=dict)
    #: the token each row (one per name) was last written with, as the database has it
    row_tokens: dict[str, int] = field(default_factory=dict)
    #: snapshots of row_tokens at each open atomic block (restored on rollback)
    row_snapshots: list[dict[str, int]] = field(default_factory=list)
    #: the effect ledger (lease.once): the token of each key's last begin (committed at once)
    effect_begun: dict[str, int] = field(default_factory=dict)
    #: the keys done and their tokens, as the main thread's transaction sees them
    effect_done: dict[str, int] = field(default_factory=dict)
    #: snapshots of effect_done at each open atomic block (restored on rollback)
    effect_snapshots: list[dict[str, int]] = field(default_factory=list)
    #: asks the peer process whether one of its leases was released (a timer may have)
    peer_released: Callable[[int], bool] | None = None
    next_hid: int = 0
    #: the permits of each semaphore of the example (one name, one N)
    permits: dict[str, int] = field(default_factory=lambda: {SEM_NAME: PERMITS, SEM2_NAME: 1})

    # -- grants ------------------------------------------------------------------------------
    def grant(
        self, kind: str, name: str, who: str, token: int, ttl: float, **fields: Any
    ) -> Holding:
        """Record a new lease and check its token against every earlier grant."""
        self.check_token(kind, name, token, who)
        self.next_hid += 1
        holding = Holding(self.next_hid, kind, name, who, token, ttl, longest_ttl=ttl, **fields)
        holding.renewed_by_nodes(time.monotonic())
        self.holdings.append(holding)
        return holding

    def check_token(self, kind: str, name: str, token: int, who: str) -> None:
        given = self.issued.get(token)
        if given is not None:
            raise Violation(
                f"{kind} lease of {name!r} ({who}) got token {token}, already given to {given}: "
                "no two leases of the alias share a token, whatever their names and kinds"
            )
        self.issued[token] = f"the {kind or 'lock'} lease of {name!r} ({who})"
        earlier = self.grants.setdefault(name, [])
        exclusive = [t for k, t in earlier if k != "read"]
        reads = [t for k, t in earlier if k == "read"]
        if kind == "read":
            if exclusive and token <= max(exclusive):
                raise Violation(
                    f"read lease of {name!r} ({who}) got token {token}, not above the earlier "
                    f"write/lock token {max(exclusive)}"
                )
            if reads and token < max(reads):
                raise Violation(
                    f"read lease of {name!r} ({who}) got token {token}, below an earlier "
                    f"read token {max(reads)}"
                )
        else:
            if earlier and token <= max(t for _, t in earlier):
                raise Violation(
                    f"{kind} lease of {name!r} ({who}) got token {token}, not above the "
                    f"earlier token {max(t for _, t in earlier)} of that name: {earlier}"
                )
            if token <= self.alias_high:
                raise Violation(
                    f"{kind} lease of {name!r} ({who}) got token {token}, not above the "
                    f"alias's earlier token {self.alias_high} (grants are sequential here)"
                )
            self.alias_high = token
        earlier.append((kind, token))

    # -- what holds what -----------------------------------------------------------------------
    def of(self, name: str) -> list[Holding]:
        return [h for h in self.holdings if h.name == name and not h.released]

    def gone(self, holding: Holding, now: float) -> bool:
        """True when the holding's keys are surely gone from the nodes."""
        if holding.released or holding.forced:
            return True
        asked = self.peer_released
        if (
            holding.pending_release is not None
            and now > holding.pending_release + 0.2
            and asked is not None
            and holding.peer_id is not None
            and asked(holding.peer_id)
        ):
            holding.released = True
            return True
        return holding.renewers == 0 and holding.node_end < now

    def conflicts(self, name: str, kind: str, now: float, *, exclude: Any = ()) -> list[Holding]:
        """Holdings surely valid now that a new ``kind`` lease of ``name`` must wait for
        (a semaphore: every valid permit, when they fill it)."""
        valid = [h for h in self.of(name) if h not in exclude and h.surely_valid(now)]
        if kind == "read":
            return [h for h in valid if h.kind != "read"]
        if kind == "sem":
            return valid if len(valid) >= self.permits[name] else []
        return valid

    def free_for(self, name: str, kind: str, now: float, *, exclude: Any = ()) -> bool:
        """True when a new ``kind`` lease of ``name`` surely finds room."""
        left = [h for h in self.of(name) if h not in exclude and not self.gone(h, now)]
        if kind == "read":
            return all(h.kind == "read" for h in left)
        if kind == "sem":
            return len(left) < self.permits[name]
        return not left

    def check_exclusion(self, now: float) -> None:
        """At most one valid holder of a lock name; readers xor one writer; at most N valid
        permits of a semaphore of N."""
        for name in ALL_NAMES:
            valid = [h for h in self.of(name) if h.surely_valid(now)]
            if not valid:
                continue
            kind = kind_of(name)
            permits = self.permits.get(name, 0)
            if kind == "sem" and len(valid) > permits:
                raise Violation(f"{len(valid)} valid permits of {name!r} (of {permits}): {valid}")
            writers = [h for h in valid if h.kind in ("lock", "write")]
            if writers and len(valid) > 1:
                raise Violation(f"two valid holders of {name!r} at once: {valid}")

    # -- rows --------------------------------------------------------------------------------
    def row_written(self, name: str, token: int) -> None:
        self.row_tokens[name] = token

    def atomic_entered(self) -> None:
        self.row_snapshots.append(dict(self.row_tokens))
        self.effect_snapshots.append(dict(self.effect_done))

    def atomic_left(self, rolled_back: bool) -> None:
        snapshot = self.row_snapshots.pop()
        done = self.effect_snapshots.pop()
        if rolled_back:
            self.row_tokens = snapshot
            self.effect_done = done  # the begins stay: they were committed on their own

    # -- the effect ledger -------------------------------------------------------------------
    def effect_begin(self, key: str, token: int) -> str:
        """What a begin of ``key`` under ``token`` must find: "done", "stale", "interrupted"
        or "pending" (the model records the begin)."""
        if key in self.effect_done:
            return "done"
        last = self.effect_begun.get(key)
        if last is not None and last > token:
            return "stale"
        self.effect_begun[key] = token
        return "pending" if last is None else "interrupted"
