"""One ``NODES`` entry: :class:`NodeSpec`, its parsing and validation (a URL, a ``CACHE``, a
``SENTINELS`` or a ``CLUSTER`` entry), and how node URLs are shown and identified.

Errors are ``ImproperlyConfigured`` naming the alias and the key; URLs are shown only through
:func:`mask_url`, the one function that hides passwords. ``conf`` parses the rest of an alias.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .cluster_replies import MappedAddresses
from .connections import cache_backend_problem, url_problem
from .spec import NodeSpec, mask_secrets, mask_url, url_identity

URL_SCHEMES = ("redis", "rediss", "unix")


def setting_error(alias: str, key: str, message: str) -> ImproperlyConfigured:
    """``REDLOCK[alias][key]: message``."""
    return ImproperlyConfigured(f"REDLOCK[{alias!r}][{key!r}]: {message}")


def _url(alias: str, key: str, raw: str, schemes: tuple[str, ...] = URL_SCHEMES) -> str:
    """A node (or sentinel) URL redis-py reads as written, else ``ImproperlyConfigured``."""
    shown = repr(mask_url(raw))
    try:
        parts = urlsplit(raw)
    except ValueError as exc:
        raise setting_error(alias, key, f"{shown} is not a valid URL ({exc}).") from exc
    if parts.scheme not in schemes:
        *first, last = [f"{scheme}://" for scheme in schemes]
        names = f"{', '.join(first)} or {last}" if first else last
        raise setting_error(alias, key, f"{shown} is not a {names} URL.")
    try:
        port = parts.port
    except ValueError as exc:
        raise setting_error(alias, key, f"{shown} has a bad port.") from exc
    if port == 0 and parts.scheme != "unix":
        raise setting_error(
            alias, key, f"{shown} has port 0: redis-py would silently use port 6379 instead."
        )
    if parts.scheme == "unix" and not parts.path:
        raise setting_error(alias, key, f"{shown} names no socket path.")
    if parts.scheme != "unix" and not parts.hostname:
        raise setting_error(alias, key, f"{shown} names no host.")
    problem = url_problem(raw)
    if problem is not None:
        raise setting_error(alias, key, f"{shown} {mask_secrets(problem, raw)}")
    return raw


def parse_node(alias: str, index: int, raw: Any) -> NodeSpec:
    """``NODES[index]`` of ``alias``: a URL, or a ``CACHE``, ``SENTINELS`` or ``CLUSTER`` dict."""
    key = f"NODES[{index}]"
    if isinstance(raw, str):
        return NodeSpec(url=_url(alias, key, raw))
    if isinstance(raw, Mapping) and "SENTINELS" in raw:
        return _sentinel_node(alias, key, raw)
    if isinstance(raw, Mapping) and "CLUSTER" in raw:
        return _cluster_node(alias, key, raw)
    if isinstance(raw, Mapping):
        if set(raw) != {"CACHE"} or not isinstance(raw["CACHE"], str):
            raise setting_error(
                alias,
                key,
                'a node given as a dict must be {"CACHE": "<cache alias>"}, '
                '{"SENTINELS": [...], "SERVICE": "<name>"} or {"CLUSTER": [...]}.',
            )
        cache = raw["CACHE"]
        caches = getattr(settings, "CACHES", {})
        if cache not in caches:
            raise setting_error(alias, key, f"CACHES has no alias {cache!r}.")
        backend = caches[cache].get("BACKEND") if isinstance(caches[cache], Mapping) else None
        problem = cache_backend_problem(backend)
        if problem is not None:
            raise setting_error(alias, key, f"CACHES[{cache!r}] {problem}")
        return NodeSpec(cache=cache)
    raise setting_error(
        alias, key, f"must be a URL string or a {{'CACHE': alias}} dict, not {raw!r}."
    )


SENTINEL_KEYS = ("SENTINELS", "SERVICE", "DB", "USERNAME", "PASSWORD")


def _url_list(alias: str, key: str, urls: Any, what: str) -> tuple[str, ...]:
    """A non-empty list of redis:// or rediss:// URLs (of sentinels, or of cluster seeds)."""
    if isinstance(urls, str | bytes) or not isinstance(urls, list | tuple) or not urls:
        raise setting_error(alias, key, f"must be a non-empty list of {what} URLs.")
    for i, url in enumerate(urls):
        where = f"{key}[{i}]"
        if not isinstance(url, str):
            raise setting_error(alias, where, f"must be a redis:// or rediss:// URL, not {url!r}.")
        _url(alias, where, url, ("redis", "rediss"))
    return tuple(urls)


def _cluster_node(alias: str, key: str, raw: Mapping[str, Any]) -> NodeSpec:
    """``{"CLUSTER": [seed urls]}``: a Redis Cluster used as one node (credentials and TLS
    from the first seed's URL)."""
    if not set(raw) <= set(CLUSTER_KEYS):
        extra = sorted(set(raw) - set(CLUSTER_KEYS), key=str)[0]
        raise setting_error(
            alias, f"{key}.{extra}", "unknown key of a cluster node; only CLUSTER, ADDRESS_REMAP."
        )
    urls = _url_list(alias, f"{key}.CLUSTER", raw["CLUSTER"], "cluster node")
    for i, url in enumerate(urls):
        if url_identity(url)[1] != 0:
            raise setting_error(alias, f"{key}.CLUSTER[{i}]", "a cluster has only database 0.")
    remap = _address_remap(alias, f"{key}.ADDRESS_REMAP", raw.get("ADDRESS_REMAP"))
    return NodeSpec(cluster=urls, address_remap=remap)


CLUSTER_KEYS = ("CLUSTER", "ADDRESS_REMAP")


def _address_remap(alias: str, key: str, raw: Any) -> Callable[[str, int], tuple[str, int]] | None:
    """``ADDRESS_REMAP``: None, a callable ``(host, port) -> (host, port)``, or a dict of
    ``"host:port"`` to ``"host:port"`` (as :class:`~.cluster_replies.MappedAddresses`)."""
    if raw is None:
        return None
    if callable(raw):
        return cast(Callable[[str, int], tuple[str, int]], raw)
    if not isinstance(raw, Mapping) or not raw:
        raise setting_error(
            alias,
            key,
            'must be a callable (host, port) -> (host, port) or a non-empty dict of "host:port"'
            f' to "host:port", not {raw!r}.',
        )
    pairs = []
    for announced, used in raw.items():
        pairs.append((_host_port(alias, key, announced), _host_port(alias, key, used)))
    return MappedAddresses(tuple(sorted(pairs)))


def _host_port(alias: str, key: str, raw: Any) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) as ``(host, port)``."""
    host, sep, port = raw.rpartition(":") if isinstance(raw, str) else ("", "", "")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not (sep and host and port.isdigit() and 0 < int(port) <= 65535):
        raise setting_error(alias, key, f'needs "host:port" strings (port 1-65535), not {raw!r}.')
    return host, int(port)


def hash_tag(prefix: str) -> str | None:
    """The hash tag Redis Cluster hashes keys starting with ``prefix`` by: what lies between
    its first ``{`` and the next ``}`` (None when there is none, or it is empty)."""
    start = prefix.find("{")
    end = prefix.find("}", start + 1) if start >= 0 else -1
    return prefix[start + 1 : end] if end > start + 1 else None


def _sentinel_node(alias: str, key: str, raw: Mapping[str, Any]) -> NodeSpec:
    """``{"SENTINELS": [urls], "SERVICE": name}`` (optional ``DB``, ``USERNAME``,
    ``PASSWORD`` of the master; the sentinels' own credentials are in their URLs)."""
    unknown = sorted(set(raw) - set(SENTINEL_KEYS), key=str)
    if unknown:
        raise setting_error(
            alias,
            f"{key}.{unknown[0]}",
            f"unknown key of a sentinel node; known keys are {', '.join(SENTINEL_KEYS)}.",
        )
    urls = _url_list(alias, f"{key}.SENTINELS", raw["SENTINELS"], "sentinel")
    schemes = {urlsplit(url).scheme for url in urls}
    if len(schemes) > 1:
        raise setting_error(
            alias,
            f"{key}.SENTINELS",
            "mixes redis:// and rediss:// URLs: the master is reached over TLS when the "
            "sentinels are (rediss://), so they must all use one scheme.",
        )
    service = raw.get("SERVICE")
    if not isinstance(service, str) or not service:
        raise setting_error(alias, f"{key}.SERVICE", "must name the sentinels' master (a str).")
    db = raw.get("DB", 0)
    if isinstance(db, bool) or not isinstance(db, int) or db < 0:
        raise setting_error(alias, f"{key}.DB", f"must be a database number >= 0, not {db!r}.")
    credentials: dict[str, str | None] = {}
    for name in ("USERNAME", "PASSWORD"):
        value = raw.get(name)
        if value is not None and not isinstance(value, str):
            raise setting_error(
                alias, f"{key}.{name}", f"must be a str, not {type(value).__name__}."
            )
        credentials[name.lower()] = value
    return NodeSpec(
        sentinels=urls,
        service=service,
        db=db,
        username=credentials["username"],
        password=credentials["password"],
    )
