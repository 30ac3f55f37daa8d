"""Which master serves which slots, as a cluster seed says: ``CLUSTER SHARDS`` (Redis 7+; the
caller falls back to ``CLUSTER SLOTS``, deprecated since Redis 7, on older servers).

Both name a node by its preferred endpoint (``cluster-preferred-endpoint-type``). An empty or
missing endpoint means "the address you sent this command to" (the node of a one-node cluster
does not know its own IP); ``?`` means the endpoint is unknown, and that range is left out.
``remap`` (a cluster node's ``ADDRESS_REMAP``) then turns each announced address into the one
this process reaches (NAT, Docker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..engine import as_text

Address = tuple[str, int]
#: ``(first slot, last slot, master)``
Range = tuple[int, int, Address]


@dataclass(frozen=True)
class MappedAddresses:
    """``ADDRESS_REMAP`` given as a dict: announced ``(host, port)`` to the one to use; an
    address it does not list is used as announced."""

    pairs: tuple[tuple[Address, Address], ...]

    def __call__(self, host: str, port: int) -> Address:
        return dict(self.pairs).get((host, port), (host, port))


def endpoint(host: Any, port: Any, seed_host: str) -> Address | None:
    """The address of an announced endpoint: the seed's host for an empty one, None for an
    unknown one (``?``, or no port)."""
    text = "" if host is None else as_text(host)
    if text == "?" or port is None or int(port) <= 0:
        return None
    return (text or seed_host, int(port))


def _as_map(value: Any) -> dict[str, Any]:
    """A RESP3 map, or a RESP2 flat list of names and values, as a dict with text keys."""
    if isinstance(value, Mapping):
        return {as_text(k): v for k, v in value.items()}
    items = list(value)
    return {as_text(k): v for k, v in zip(items[::2], items[1::2], strict=False)}


def from_shards(reply: Iterable[Any], seed_host: str, tls: bool) -> list[Range]:
    """The ranges of a ``CLUSTER SHARDS`` reply: each shard's slot ranges and its master's
    endpoint (its TLS port when the seed was reached over TLS and one is announced)."""
    ranges: list[Range] = []
    for raw in reply:
        shard = _as_map(raw)
        masters = [
            node
            for node in map(_as_map, shard.get("nodes") or [])
            if as_text(node.get("role", "")) == "master"
        ]
        if not masters:
            continue
        masters.sort(key=lambda node: as_text(node.get("health", "")) != "online")
        node = masters[0]
        port = node.get("tls-port") if tls and node.get("tls-port") else node.get("port")
        address = endpoint(node.get("endpoint", node.get("ip")), port, seed_host)
        if address is None:
            continue
        bounds = [int(s) for s in shard.get("slots") or []]
        pairs = zip(bounds[::2], bounds[1::2], strict=False)
        ranges.extend((start, end, address) for start, end in pairs)
    return ranges


def from_slots(reply: Iterable[Any], seed_host: str) -> list[Range]:
    """The ranges of a ``CLUSTER SLOTS`` reply (the first node of each range is its master)."""
    ranges: list[Range] = []
    for entry in reply:
        master = entry[2]
        address = endpoint(master[0], master[1], seed_host)
        if address is not None:
            ranges.append((int(entry[0]), int(entry[1]), address))
    return ranges


def remapped(ranges: list[Range], remap: Callable[[str, int], Address] | None) -> list[Range]:
    """``ranges`` with each master's address passed through ``remap``. Raises ``ValueError``
    when ``remap`` fails or returns something else than ``(host, port)``."""
    if remap is None:
        return ranges
    out: list[Range] = []
    for start, end, (host, port) in ranges:
        try:
            new = remap(host, port)
        except Exception as exc:
            raise ValueError(f"ADDRESS_REMAP failed on {host}:{port}: {exc!r}") from exc
        if not (
            isinstance(new, tuple)
            and len(new) == 2
            and isinstance(new[0], str)
            and new[0]
            and isinstance(new[1], int)
            and 0 < new[1] <= 65535
        ):
            raise ValueError(f"ADDRESS_REMAP turned {host}:{port} into {new!r}, not (host, port)")
        out.append((start, end, new))
    return out
