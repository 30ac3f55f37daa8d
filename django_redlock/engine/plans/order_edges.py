"""The lock-order checker's shared records (see ``django_redlock.locking.ordering``): one hash
per alias on every node, at ``<prefix>__order__`` (a bookkeeping key: lock names cannot start
with ``__``), so the processes of one test run (or one development server and its workers) see
each other's edges.

Each edge ``A -> B`` (shape B taken while shape A was held) has two fields: ``s|<edge>`` keeps
the stack of the process that recorded it first (``HSETNX``), ``n|<edge>`` counts the processes
that recorded it. One Lua call per node adds an edge and reads back its reverse. The hash
expires :data:`ORDER_TTL` seconds after its last new edge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..keyspace import RESERVED_MARK
from ..replies import Call, Request
from ..scripts.script import Script
from ..state import AliasState, NodeView, Plan

#: A day: records of a long-gone run stop warning by themselves (``redlock order --clear``
#: forgets them at once).
ORDER_TTL = 86400.0

#: At most this many fields (two per edge) per hash: names whose varying part is not masked
#: (slugs, e-mail addresses) make a shape each, and the records must not grow without bound.
MAX_FIELDS = 20000

#: ``ARGV[1]`` the operation: ``add`` (``ARGV[2]`` the edge, ``ARGV[3]`` its first stack,
#: ``ARGV[4]`` the reverse edge, ``ARGV[5]`` the lifetime in ms, ``ARGV[6]`` the most fields:
#: a new edge past it is not kept; returns the reverse's stack or false), ``get`` (``ARGV[2]``
#: an edge; its stack or false), ``all`` (every field, as HGETALL) or ``clear`` (deletes the
#: hash; 1 if it existed).
ORDER = Script(
    "order",
    """
local op = ARGV[1]
if op == 'add' then
  local field = 's|' .. ARGV[2]
  if redis.call('HEXISTS', KEYS[1], field) == 1
      or redis.call('HLEN', KEYS[1]) < tonumber(ARGV[6]) then
    redis.call('HSETNX', KEYS[1], field, ARGV[3])
    redis.call('HINCRBY', KEYS[1], 'n|' .. ARGV[2], 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
  end
  return redis.call('HGET', KEYS[1], 's|' .. ARGV[4])
elseif op == 'get' then
  return redis.call('HGET', KEYS[1], 's|' .. ARGV[2])
elseif op == 'all' then
  return redis.call('HGETALL', KEYS[1])
elseif op == 'clear' then
  return redis.call('DEL', KEYS[1])
end
return redis.error_reply('unknown order operation')
""",
)


def order_key(state: AliasState) -> str:
    """The key of the alias's order records."""
    return f"{state.keys.prefix}{RESERVED_MARK}order__"


def order_plan(
    state: AliasState, args: Sequence[str | int]
) -> Callable[[Sequence[NodeView]], Plan[list[Any]]]:
    """The plan of one order operation on every node (its replies, one per node; waits at
    most four node timeouts). ``Engine.order`` runs it."""
    key = order_key(state)
    timeout = state.node_timeout * 4

    def plan(nodes: Sequence[NodeView]) -> Plan[list[Any]]:
        calls: list[Call | None] = [
            None if node.run_id is None else Call(ORDER, (key,), tuple(args)) for node in nodes
        ]
        replies = yield Request(calls, timeout, None)
        return replies

    return plan
