"""Redis Sentinel nodes: the master a set of sentinels names, found again on every connect.

A ``{"SENTINELS": [...], "SERVICE": ...}`` node is one lock node whose address moves: each new
connection first asks the sentinels (in order, the last one that answered first) which server
is the master of the service, then connects to it (:mod:`.located`). A sentinel's answer is
followed only when it passes redis-py's checks (``Sentinel.check_master_state``): it reports
the service's master with the ``master`` flag, neither ``s_down`` nor ``o_down``, and knows
enough other sentinels (:func:`min_other_sentinels`). So a sentinel that was cut off across a
failover, and still names the old master, which it sees down, is passed over for one that
names the promoted replica.

After a failover the engine's connections to the old master break (Sentinel kills the clients
of a demoted master; a killed master closes them; a ``READONLY`` reply drops them), and the
next connect finds the promoted replica. That replica has another ``run_id``, so the engine
treats it as a restarted node (docs/algorithm.md, ``engine/trust.py``): it votes only after the
quarantine, and tokens never go back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.sentinel import Sentinel

from ..engine import as_text
from .located import Address, Declined, Locator


def min_other_sentinels(listed: int) -> int:
    """How many other sentinels a sentinel must know for its answer to count: with itself, a
    majority of the ``listed`` ones (0 for one sentinel, 1 for two or three, 2 for five). A
    sentinel that knows fewer was just started without its state, or watches another master
    under the same service name, or cannot hear the others."""
    return listed // 2


class Sentinels(Locator):
    """The sentinels of one service, asked for its master's ``(host, port)``."""

    def __init__(self, urls: Sequence[str], service: str, timeout: float) -> None:
        super().__init__(urls, timeout)
        self.service = service
        self.what = f"no sentinel names a master for service {service!r}"
        # Only its ``check_master_state`` is used: with no addresses it opens no connection.
        self.checks = Sentinel([], min_other_sentinels=min_other_sentinels(len(self.urls)))

    def ask(self, client: redis.Redis) -> Address | None:
        state = client.sentinel_master(self.service)
        if not isinstance(state, dict):
            raise Declined(f"answered SENTINEL MASTER with {state!r}")
        if not self.checks.check_master_state(state, self.service):
            raise Declined(_refusal(state))
        return as_text(state["ip"]), int(state["port"])


def _refusal(state: dict[str, Any]) -> str:
    """Why a sentinel's view of the master is not followed, e.g.
    ``sees 127.0.0.1:7000 as s_down,master (2 other sentinels)``."""
    flags = state.get("flags", "")
    shown = flags if isinstance(flags, str) else ",".join(sorted(as_text(f) for f in flags))
    where = f"{as_text(state.get('ip', '?'))}:{state.get('port', '?')}"
    others = state.get("num-other-sentinels", "?")
    return f"sees {where} as {shown} ({others} other sentinels)"
