"""Making a won attempt's fencing tokens its own: the write-back to winners that are behind.

Each granting node hands out the next tokens of its own counter, so the winners may disagree.
The attempt takes the highest first token among them (a set's tokens follow it). A winner that
gave a lower one is raised to the attempt's last token, strictly: only while its counter is
still below the first (``RAISE``). A token is the caller's once, on enough winners, the caller
itself moved the counter onto it (by its grant or by a raise). A node's counter moves onto a
value once and any two quorums share a node, so no two leases of the alias, whatever their
names and kinds, confirm one token.

A winner whose counter a racer already moved past the first token answers that counter. The
attempt then draws fresh tokens above every counter it saw, with a margin for the counters
that keep moving meanwhile, and raises every winner that may still hold to them: up to
:data:`RAISE_ROUNDS` rounds in all, within the lease's validity (checked by the caller). It
keeps its grants meanwhile: nobody else can take the names. A margin skips at most
:data:`MAX_MARGIN` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import NamedTuple

from .. import scripts
from ..keyspace import TOKEN_LIMIT
from ..replies import Call, Request, Slot
from ..state import AliasState, NodeView, Plan

#: Write-back rounds an attempt makes at most: the raise of the winners behind, then fresh
#: tokens when a racer passed those (a race lost this often is the policy's to retry).
RAISE_ROUNDS = 3


#: The most tokens a fresh draw skips as its margin. Counters must keep growing far slower
#: than 1,024 per millisecond (the clock floor of docs/algorithm.md); a node far ahead, such
#: as one that rejoined with a high floor, is no measure of how fast counters move.
MAX_MARGIN = 256


class OwnedTokens(NamedTuple):
    """What :func:`own_tokens` got: the first token (a set's follow it), the winners on which
    the caller moved the counter onto its tokens, and whether a racer passed them on a winner
    in the last round (a lost race, not a lost lock: the policy tries again at once)."""

    first: int
    confirmed: frozenset[int]
    raced: bool


def own_tokens(
    state: AliasState,
    nodes: Sequence[NodeView],
    given: Mapping[int, int],
    count: int,
    held: Callable[[int], tuple[str, ...]],
    enough: Callable[[Collection[int]], bool],
    owner: str,
) -> Plan[OwnedTokens]:
    """Make the tokens of a won attempt the caller's own. ``given``: per winner, the first
    token it handed out; ``count``: tokens per attempt (a set's size); ``held(i)``: the keys
    the caller must still hold on winner ``i``; ``enough(confirmed)``: whether those winners
    make the tokens the caller's (a quorum; per semaphore for a set). Winners behind are raised
    even when the others are enough already, so that they catch up."""
    first = max(given.values())
    confirmed = {i for i, token in given.items() if token == first}
    behind = [i for i, token in given.items() if token < first]
    raced = False
    for round_ in range(RAISE_ROUNDS):
        if not behind or first + count - 1 >= TOKEN_LIMIT:
            raced = False  # no tokens left to draw: no use trying again at once
            break
        done = frozenset(confirmed)

        def enough_with(ok: set[int], done: frozenset[int] = done) -> bool:
            return enough(done | ok)

        wrote = yield from _raise(
            state, nodes, behind, (first, first + count - 1), held, owner, enough_with
        )
        confirmed |= wrote.held
        raced = wrote.passed is not None and not enough(confirmed)
        if not raced:
            break
        # fresh tokens above every counter seen, on every winner that may still hold, with a
        # margin for the counters that keep moving meanwhile: four times what racers passed
        # the first token by during one round, doubling with each round
        passed = wrote.passed or 0
        margin = min((passed - first + 1) * 2 ** (round_ + 2), MAX_MARGIN)
        first = max(passed, first + count - 1) + 1 + margin
        behind = [i for i in given if i not in wrote.lost]
        confirmed = set()
    return OwnedTokens(first, frozenset(confirmed), raced)


class _Raised(NamedTuple):
    held: set[int]  # moved onto the tokens, every key still held
    lost: set[int]  # a key lost, or the node untrusted: no use asking it again
    passed: int | None  # the highest counter found at or past the first token


def _raise(
    state: AliasState,
    nodes: Sequence[NodeView],
    behind: Sequence[int],
    tokens: tuple[int, int],
    held: Callable[[int], tuple[str, ...]],
    owner: str,
    enough: Callable[[set[int]], bool],
) -> Plan[_Raised]:
    """One ``RAISE`` round on the winners ``behind``; settles once ``enough`` confirmed."""
    first, last = tokens
    calls: list[Call | None] = [None] * len(nodes)
    for i in behind:
        run_id = nodes[i].run_id
        if run_id is not None:
            args = (first, last, run_id, owner)
            calls[i] = Call(scripts.RAISE, (state.keys.fence, *held(i)), args)

    def settled(slots: list[Slot]) -> bool:
        return enough({i for i, s in enumerate(slots) if s.done and s.value == scripts.STILL_HELD})

    replies = yield Request(calls, state.node_timeout, settled)
    passed = [c for i in behind if (c := scripts.passed_counter(replies[i])) is not None]
    return _Raised(
        {i for i in behind if replies[i] == scripts.STILL_HELD},
        {i for i in behind if replies[i] in (scripts.NOT_HELD, scripts.UNTRUSTED)},
        max(passed) if passed else None,
    )
