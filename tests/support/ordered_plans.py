"""Plans run against real redis-server nodes, their calls executed there one by one in an
order a test chooses: the order in which each node runs concurrent callers' calls (what
callers on separate connections produce). Nothing of the nodes' answers is made up."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import redis

from django_redlock.engine.replies import NodeFailure, Request


class OrderedCaller:
    """One caller's plan, its calls run on the nodes when told to."""

    def __init__(self, plan: Generator[Request, Any, Any], clients: list[redis.Redis]) -> None:
        self._plan, self._clients = plan, clients
        self._replies: dict[int, Any] = {}
        self.request: Request | None = next(plan)
        self.result: Any = None

    def run_on(self, i: int) -> None:
        """Node ``i`` runs this caller's call of the current request."""
        assert self.request is not None
        call = self.request.calls[i]
        if call is None:
            self._replies[i] = NodeFailure("no call", sent=False)
            return
        try:
            self._replies[i] = self._clients[i].execute_command(
                "EVAL", call.script.source, len(call.keys), *call.keys, *call.args
            )
        except redis.RedisError as exc:
            self._replies[i] = NodeFailure(str(exc))

    def answer(self) -> None:
        """The nodes not told yet run the call now; the plan gets the replies."""
        request = self.request
        assert request is not None
        for i in range(len(self._clients)):
            if i not in self._replies:
                self.run_on(i)
        replies = [self._replies[i] if request.wait else None for i in range(len(self._clients))]
        self._replies = {}
        try:
            self.request = self._plan.send(replies)
        except StopIteration as done:
            self.request, self.result = None, done.value

    def finish(self) -> None:
        while self.request is not None:
            self.answer()
