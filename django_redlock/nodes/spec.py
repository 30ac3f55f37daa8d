"""A ``NODES`` entry once parsed (:class:`NodeSpec`), and how node URLs are shown
(:func:`mask_url`, the one function that hides passwords) and identified
(:func:`url_identity`). No Django, no connections: every module of the topology may use it."""

from __future__ import annotations

import ipaddress
import os.path
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, unquote_plus, urlsplit

from redis.connection import parse_url


@dataclass(frozen=True, repr=False)
class NodeSpec:
    """One Redis node: a URL, the alias of a Redis cache whose pool is reused, or the master
    that a set of sentinels names (``sentinels``, ``service``; ``db`` and credentials are the
    master's)."""

    url: str | None = None
    cache: str | None = None
    sentinels: tuple[str, ...] = ()
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    #: a Redis Cluster used as one node: its seed URLs, and the ``KEY_PREFIX`` whose hash tag
    #: puts every key of the alias in one slot (set by ``parse_alias``)
    cluster: tuple[str, ...] = ()
    hash_tag_of: str = ""
    #: a cluster node's ``ADDRESS_REMAP``: announced ``(host, port)`` to the one to use
    address_remap: Callable[[str, int], tuple[str, int]] | None = None

    def __repr__(self) -> str:  # also in AliasConfig's repr: tracebacks show it
        return f"NodeSpec({self.label!r})"

    @property
    def label(self) -> str:
        """A printable name with any password masked."""
        if self.cache is not None:
            return f"cache:{self.cache}"
        if self.service is not None:
            hosts = ",".join(_sentinel_host(url) for url in self.sentinels)
            return f"sentinel:{self.service}@{hosts}/{self.db}"
        if self.cluster:
            return f"cluster:{','.join(_sentinel_host(url) for url in self.cluster)}"
        return mask_url(self.url or "")

    @property
    def address(self) -> str | None:
        """The server (see :func:`url_identity`), used to spot duplicate nodes (None for caches
        and sentinel nodes, whose server is known only at run time)."""
        return None if self.url is None else url_identity(self.url)[0]


def _sentinel_host(url: str) -> str:
    """``host:port`` of a sentinel URL (never its credentials)."""
    try:
        return url_identity(url)[0]
    except ValueError:
        return "?"


def _secret_spans(url: str) -> list[tuple[int, int]]:
    """Where ``url`` carries a password: after the first ``:`` of the userinfo (``user:pw@``,
    ``unix://:pw@``) and in the value of every query parameter named like one (``password``,
    ``ssl_password``). Found by position, not by parsing, so malformed URLs are masked too."""
    spans: list[tuple[int, int]] = []
    start = url.find("://") + 3
    if start < 3:
        return spans
    ends = [i for i in (url.find(m, start) for m in "/?#") if i >= 0]
    at = url.rfind("@", start, min(ends, default=len(url)))
    colon = url.find(":", start, at) if at >= 0 else -1
    if colon >= 0:
        spans.append((colon + 1, at))
    query = url.find("?", start)
    if query >= 0:
        stop = url.find("#", query)
        pos = query + 1
        for part in url[pos : len(url) if stop < 0 else stop].split("&"):
            name, eq, _ = part.partition("=")
            if eq and unquote_plus(name).lower().endswith("password"):
                spans.append((pos + len(name) + 1, pos + len(part)))
            pos += len(part) + 1
    return spans


def mask_url(url: str) -> str:
    """Return ``url`` with every password (userinfo and ``?password=``) replaced by ``***``."""
    for begin, end in reversed(_secret_spans(url)):
        url = f"{url[:begin]}***{url[end:]}"
    return url


def mask_secrets(text: str, url: str) -> str:
    """``text`` (say, a redis-py error about ``url``) without ``url``'s passwords."""
    for begin, end in _secret_spans(url):
        for secret in {url[begin:end], unquote(url[begin:end])} - {""}:
            text = text.replace(secret, "***")
    return text


def url_identity(url: str) -> tuple[str, int]:
    """``(server, db)`` of a node URL as redis-py reads it: the server is ``host:port``, with
    every loopback name (``localhost``, ``127.0.0.1``, ``::1``) spelled ``localhost``, or the
    normalised socket path; the db is redis-py's (``?db=`` wins over the path; default 0)."""
    parts = urlsplit(url)
    try:
        db = int(parse_url(url).get("db", 0))
    except ValueError:
        db = 0
    if parts.scheme == "unix":
        return os.path.normpath(unquote(parts.path)), db
    return f"{_server_host(parts.hostname or '')}:{parts.port or 6379}", db


def _server_host(host: str) -> str:
    """``localhost`` for the names a local server answers on by default (``localhost``,
    ``127.0.0.1``, ``::1``); other hosts lowercased, IPs in their canonical form."""
    try:
        ip: Any = ipaddress.ip_address(host)
    except ValueError:
        return host.lower().rstrip(".")
    ip = getattr(ip, "ipv4_mapped", None) or ip
    if str(ip) in ("127.0.0.1", "::1"):
        return "localhost"
    return f"[{ip}]" if ip.version == 6 else str(ip)


class AliasNodes(Protocol):
    """What the topology reads of an alias's settings (``conf.AliasConfig`` has it): the
    topology never imports ``conf``, which imports it to validate node URLs."""

    @property
    def alias(self) -> str: ...

    @property
    def nodes(self) -> Sequence[NodeSpec]: ...

    @property
    def node_timeout(self) -> float: ...
