"""Making a won attempt's fencing tokens its own: the write-back to winners that are behind.

Each granting node hands out the next tokens of its own counter, so the winners may disagree.
A token is the caller's once, on a quorum of winners, the caller itself moved the counter onto
it (by its grant or by a raise). A node's counter moves onto a value once and any two quorums
share a node, so no two leases of the alias, whatever their names and kinds, own one token.
And it exceeds every earlier token of the name: that one was on a quorum's counters before
its lease ended, and one of those nodes granted this caller after, from above it.

So the attempt takes the highest first token (a set's tokens follow it) that a quorum of its
winners handed out: its grants own it, with nothing to write back. Two callers whose grants
interleave on the nodes (A then B on one node, B then A on another) each own a token that
way. Failing that, it takes the highest of all, and raises the winners that gave less
strictly: only while their counter is still below the first token (``RAISE``). Winners below
the token are raised in both cases, so that they catch up.

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
#: than 1,024 per millisecond (the clock floor of docs/algorithm.md), and margins feed on each
#: other (a racer's skip is the next one's overrun); a node far ahead, such as one that
#: rejoined with a high floor, is no measure of how fast counters move.
MAX_MARGIN = 16


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
    held: Callable[[int], tuple[tuple[str, int], ...]],
    enough: Callable[[Collection[int]], bool],
    owner: str,
) -> Plan[OwnedTokens]:
    """Make the tokens of a won attempt the caller's own. ``given``: per winner, the first
    token it handed out; ``count``: tokens per attempt (a set's size); ``held(i)``: the keys
    the caller must still hold on winner ``i``, each with its token's offset from the first
    (a raise writes the token into the key's value, for inspection); ``enough(confirmed)``:
    whether those winners make the tokens the caller's (a quorum; per semaphore for a set).
    Winners behind are raised even when the others are enough already, so that they catch
    up."""
    first = _owned_by_enough(given, enough)
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
        if not raced or round_ == RAISE_ROUNDS - 1:
            break
        # fresh tokens above every counter seen, on every winner that may still hold, with a
        # margin for the counters that keep moving meanwhile: what racers passed the first
        # token by during one round, doubling with each round
        passed = wrote.passed or 0
        margin = min((passed - first + 1) * 2**round_, MAX_MARGIN)
        first = max(passed, first + count - 1) + 1 + margin
        behind = [i for i in given if i not in wrote.lost]
        confirmed = set()
    return OwnedTokens(first, frozenset(confirmed), raced)


def _owned_by_enough(given: Mapping[int, int], enough: Callable[[Collection[int]], bool]) -> int:
    """The highest first token that enough winners handed out (the caller moved their
    counters onto it by its grants: it needs no write-back), else the highest of all."""
    for token in sorted(set(given.values()), reverse=True):
        if enough([i for i, given_token in given.items() if given_token == token]):
            return token
    return max(given.values())


class _Raised(NamedTuple):
    held: set[int]  # moved onto the tokens, every key still held
    lost: set[int]  # a key lost, or the node untrusted: no use asking it again
    passed: int | None  # the highest counter found at or past the first token


def _raise(
    state: AliasState,
    nodes: Sequence[NodeView],
    behind: Sequence[int],
    tokens: tuple[int, int],
    held: Callable[[int], tuple[tuple[str, int], ...]],
    owner: str,
    enough: Callable[[set[int]], bool],
) -> Plan[_Raised]:
    """One ``RAISE`` round on the winners ``behind``; settles once ``enough`` confirmed."""
    first, last = tokens
    calls: list[Call | None] = [None] * len(nodes)
    for i in behind:
        run_id = nodes[i].run_id
        if run_id is not None:
            keys = held(i)
            args: tuple[str | int, ...] = (first, last, run_id, owner)
            args += tuple(offset for _, offset in keys)
            calls[i] = Call(scripts.RAISE, (state.keys.fence, *(key for key, _ in keys)), args)

    def settled(slots: list[Slot]) -> bool:
        return enough({i for i, s in enumerate(slots) if s.done and s.value == scripts.STILL_HELD})

    replies = yield Request(calls, state.node_timeout, settled)
    passed = [c for i in behind if (c := scripts.passed_counter(replies[i])) is not None]
    return _Raised(
        {i for i in behind if replies[i] == scripts.STILL_HELD},
        {i for i in behind if replies[i] in (scripts.NOT_HELD, scripts.UNTRUSTED)},
        max(passed) if passed else None,
    )
