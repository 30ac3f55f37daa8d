"""Redis Sentinel nodes: the master a set of sentinels names, found again on every connect.

A ``{"SENTINELS": [...], "SERVICE": ...}`` node is one lock node whose address moves: each new
connection first asks the sentinels (in order, the last one that answered first) which server
is the master of the service, then connects to it (:mod:`.located`). After a failover the
engine's connections to the old master break (Sentinel kills the clients of a demoted master;
a killed master closes them; a ``READONLY`` reply drops them), and the next connect finds the
promoted replica. That replica has another ``run_id``, so the engine treats it as a restarted
node (SPEC 4, ``engine/trust.py``): it votes only after the quarantine, and tokens never go
back.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from .engine import as_text
from .located import Address, Locator


class Sentinels(Locator):
    """The sentinels of one service, asked for its master's ``(host, port)``."""

    def __init__(self, urls: Sequence[str], service: str, timeout: float) -> None:
        super().__init__(urls, timeout)
        self.service = service
        self.what = f"no sentinel names a master for service {service!r}"

    def ask(self, client: redis.Redis) -> Address | None:
        reply = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        if not reply:
            return None
        return as_text(reply[0]), int(reply[1])
