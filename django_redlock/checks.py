"""System checks for ``REDLOCK``. Network checks run only under ``manage.py check --deploy``.

``conf`` reads and validates the settings; these checks only attach ids to its errors, and
add the checks that span aliases or need the network. ``apps.ready()`` registers them under
the tag :data:`TAG`. Every id is listed in ``docs/checks.md``; ``tests/test_checks.py`` keeps
the ids unique.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import (
    DEFAULTS,
    SETTING_NAMES,
    AliasConfig,
    NodeSpec,
    busy_poll_setting,
    check_order_setting,
    mask_secrets,
    parse_alias,
    redlock_settings,
    url_identity,
)
from .nodes.cluster_checks import cluster_checks
from .nodes.probe import UNKNOWN, probe_alias
from .schedules.entries import schedule_setting
from .validation import check_ttl

#: ``manage.py check --tag django_redlock`` runs only these checks (and the request-lock ones).
TAG = "django_redlock"

CHECK_IDS = {
    "E001": "REDLOCK is not a dict of aliases.",
    "E002": "An alias's settings are invalid (unknown key, wrong type, bad URL, ...).",
    "E003": "Two aliases share a node and one's KEY_PREFIX starts with the other's.",
    "E004": "REDLOCK_BUSY_POLL is not a number of seconds from 0 to 0.01.",
    "E005": "Two aliases with the same KEY_PREFIX share some but not all of their nodes.",
    "E006": "REDLOCK_CHECK_ORDER is not True, False or None.",
    "W001": "A Redlock alias has 2 nodes or an even number of nodes (deploy).",
    "W002": "Two nodes of one alias point at the same host:port or socket (deploy).",
    "W003": "Plaintext redis:// to a host that is not loopback (deploy).",
    "W004": "A node's maxmemory-policy can evict lock keys (deploy).",
    "W005": "A node cannot be reached (deploy).",
    "W006": "A node answered but its maxmemory-policy could not be read (deploy).",
    "W007": "A node is a replica (deploy).",
    "W008": "A cluster node shares a server with another node of its Redlock set (deploy).",
    "W009": "A REDLOCK* setting that django-redlock does not know (a misspelt name).",
}


def valid_aliases() -> tuple[list[AliasConfig], list[checks.CheckMessage]]:
    """Parse every alias, turning errors into check messages."""
    try:
        raw = redlock_settings()
    except ImproperlyConfigured as exc:
        return [], [checks.Error(str(exc), id="django_redlock.E001")]
    configs: list[AliasConfig] = []
    errors: list[checks.CheckMessage] = []
    for alias, value in raw.items():
        try:
            configs.append(parse_alias(alias, value))
        except ImproperlyConfigured as exc:
            errors.append(
                checks.Error(
                    str(exc),
                    hint="See the settings table in docs/index.md.",
                    id="django_redlock.E002",
                )
            )
    return configs, errors


def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    configs, errors = valid_aliases()
    try:
        busy_poll_setting()
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), id="django_redlock.E004"))
    try:
        check_order_setting()
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), id="django_redlock.E006"))
    return errors + _shared_node_prefixes(configs) + _unknown_settings() + _schedule(configs)


def schedule_errors() -> list[checks.CheckMessage]:
    """The check errors of ``REDLOCK_SCHEDULE`` (E040-E042): ``redlock scheduler`` refuses to
    start with any."""
    return _schedule(valid_aliases()[0])


def _schedule(configs: list[AliasConfig]) -> list[checks.CheckMessage]:
    """``REDLOCK_SCHEDULE``: well-formed entries (E040), on known aliases (E041), whose
    ``CALL`` imports as a callable (E042); docs/schedules.md."""
    try:
        entries = schedule_setting()
    except (TypeError, ValueError) as exc:
        return [checks.Error(str(exc), id="django_redlock.E040")]
    by_alias = {config.alias: config for config in configs}
    messages: list[checks.CheckMessage] = []
    for entry in entries:
        where = f"REDLOCK_SCHEDULE[{entry.name!r}]"
        config = by_alias.get(entry.using)
        if config is None:
            messages.append(
                checks.Error(
                    f"{where}['USING'] is {entry.using!r}, not an alias of REDLOCK.",
                    id="django_redlock.E041",
                )
            )
        elif entry.ttl is not None:
            try:  # what the entry's lease will be asked for
                check_ttl(entry.ttl, config.drift_factor)
            except ValueError as exc:
                messages.append(checks.Error(f"{where}['TTL']: {exc}", id="django_redlock.E040"))
        try:
            entry.function()
        except (ImportError, TypeError, ValueError) as exc:
            messages.append(
                checks.Error(
                    f"{where}['CALL'] {entry.call!r} does not import as a callable: {exc}",
                    id="django_redlock.E042",
                )
            )
    return messages


def _unknown_settings() -> list[checks.CheckMessage]:
    """A ``REDLOCK*`` setting the app never reads: Django ignores a misspelt name silently
    (``REDLOCK_REQUEST_LOCK`` would leave every rule unapplied). The hint names the closest
    known setting, or says where an alias's key such as ``TTL`` goes."""
    messages: list[checks.CheckMessage] = []
    for name in sorted(dir(settings)):
        if not name.startswith("REDLOCK") or not name.isupper() or name in SETTING_NAMES:
            continue
        key = name.removeprefix("REDLOCK").lstrip("_")
        if key in DEFAULTS:
            hint = (
                f"{key} is a key of each alias: REDLOCK = {{'default': {{{key!r}: ...}}}} "
                "(docs/index.md)."
            )
        else:
            closest = difflib.get_close_matches(name, SETTING_NAMES, n=1, cutoff=0.0)[0]
            hint = (
                f"Did you mean {closest}? django-redlock reads {', '.join(SETTING_NAMES)}; "
                "silence django_redlock.W009 for a setting of your own."
            )
        messages.append(
            checks.Warning(
                f"Setting {name} is not one django-redlock reads: it has no effect.",
                hint=hint,
                id="django_redlock.W009",
            )
        )
    return messages


def _node_id(node: NodeSpec) -> str:
    """The key space a node writes to: server and db (see ``conf.url_identity``), so one server
    named ``localhost`` and ``127.0.0.1`` is one node and two dbs of it are two. A CACHE node
    is the primary its ``LOCATION`` names (first of a list, or of a comma or semicolon list)."""
    url = node.url
    if node.service is not None or node.cluster:  # the server moves: the service or the
        return node.label  # cluster's seeds are the node
    if url is None:
        cache = getattr(settings, "CACHES", {}).get(node.cache)
        location = cache.get("LOCATION") if isinstance(cache, dict) else None
        if isinstance(location, str):
            location = re.split("[;,]", location)  # Django's RedisCache splits on both
        if isinstance(location, list | tuple) and location and isinstance(location[0], str):
            url = location[0].strip()
    if url is None or not url.startswith(("redis://", "rediss://", "unix://")):
        return f"cache:{node.cache}"
    try:
        server, db = url_identity(url)
    except ValueError:  # a malformed cache LOCATION: django-redis will say so
        return f"cache:{node.cache}"
    return f"{server}/{db}"


def _node_ids(config: AliasConfig) -> set[str]:
    return {_node_id(node) for node in config.nodes}


def _shared_node_prefixes(configs: list[AliasConfig]) -> list[checks.CheckMessage]:
    """Aliases that share a node: nested prefixes would list and clear each other's keys
    (E003). The same prefix on the same node set is one cluster seen twice (e.g. with other
    timeouts); on node sets that only overlap, the aliases would share lock keys and fence
    counters on the common nodes, and one's fence markers would quarantine the other's fresh
    nodes (E005)."""
    messages: list[checks.CheckMessage] = []
    for i, first in enumerate(configs):
        for second in configs[i + 1 :]:
            ids_a, ids_b = _node_ids(first), _node_ids(second)
            if not ids_a & ids_b:
                continue
            if first.key_prefix == second.key_prefix:
                if ids_a != ids_b:
                    messages.append(
                        checks.Error(
                            f"REDLOCK[{first.alias!r}] and REDLOCK[{second.alias!r}] share "
                            f"KEY_PREFIX {first.key_prefix!r} and some, but not all, nodes: "
                            "they would share lock keys and fencing counters on the common "
                            "nodes.",
                            hint="Give each alias its own KEY_PREFIX, or the same node list.",
                            id="django_redlock.E005",
                        )
                    )
                continue
            for outer, inner in ((first, second), (second, first)):
                if inner.key_prefix.startswith(outer.key_prefix):
                    messages.append(
                        checks.Error(
                            f"REDLOCK[{outer.alias!r}]['KEY_PREFIX'] {outer.key_prefix!r} is a "
                            f"prefix of REDLOCK[{inner.alias!r}]['KEY_PREFIX'] "
                            f"{inner.key_prefix!r} on a shared node: the first alias would "
                            "list and clear the second's locks.",
                            hint="Give aliases that share nodes prefixes that do not start "
                            "with each other, e.g. 'app:' and 'jobs:'.",
                            id="django_redlock.E003",
                        )
                    )
    return messages


def check_deployment(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    configs, _ = valid_aliases()
    messages: list[checks.CheckMessage] = []
    for config in configs:
        messages += _topology(config)
        messages += _nodes_health(config)
        messages += cluster_checks(config)
    return messages


def _is_loopback(host: str | None) -> bool:
    if host is None or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _topology(config: AliasConfig) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    count = len(config.nodes)
    if count > 1 and count % 2 == 0:
        messages.append(
            checks.Warning(
                f"REDLOCK[{config.alias!r}] has {count} nodes: an even count tolerates no more "
                f"failures than {count - 1} nodes.",
                hint="Use 1 node (single-node mode) or an odd number >= 3 (Redlock).",
                id="django_redlock.W001",
            )
        )
    addresses = Counter(node.address for node in config.nodes if node.address is not None)
    for address, seen in addresses.items():
        if seen > 1:
            messages.append(
                checks.Warning(
                    f"REDLOCK[{config.alias!r}] lists {address} {seen} times: its votes are not "
                    "independent.",
                    hint="Each node must be a separate Redis server.",
                    id="django_redlock.W002",
                )
            )
    for node in config.nodes:
        if node.url is None:
            continue
        parts = urlsplit(node.url)
        if parts.scheme == "redis" and not _is_loopback(parts.hostname):
            messages.append(
                checks.Warning(
                    f"REDLOCK[{config.alias!r}] node {node.label} is reached over plaintext "
                    "redis:// on a non-loopback host.",
                    hint="Use rediss:// (TLS) so lock owners and passwords are not sniffable.",
                    id="django_redlock.W003",
                )
            )
    return messages


def _nodes_health(config: AliasConfig) -> list[checks.CheckMessage]:
    """W005-W007 from one reading of every node of the alias at once (see
    :mod:`.nodes.probe`): the policy from ``INFO memory``, which the ACL user of
    docs/algorithm.md may run (``CONFIG GET`` only when it is refused), the role from ``INFO
    replication``. A sentinel node is probed on the master the sentinels name now."""
    messages: list[checks.CheckMessage] = []
    for node, health in zip(config.nodes, probe_alias(config), strict=True):
        where = f"REDLOCK[{config.alias!r}] node {node.label}"
        if not health.up:
            messages.append(
                checks.Warning(
                    f"{where} cannot be reached: {mask_secrets(health.error, node.url or '')}",
                    hint="Start the node or fix its URL; locks need a quorum of nodes.",
                    id="django_redlock.W005",
                )
            )
            continue
        if health.maxmemory_policy == UNKNOWN:
            messages.append(
                checks.Warning(
                    f"{where} answered, but neither INFO memory nor CONFIG GET gave its "
                    f"maxmemory-policy: {mask_secrets(health.error, node.url or '')}",
                    hint="Grant the lock user +info (as docs/algorithm.md does), or make sure "
                    "the node runs with maxmemory-policy noeviction.",
                    id="django_redlock.W006",
                )
            )
        if health.evicts:
            messages.append(
                checks.Warning(
                    f"{where} has maxmemory-policy {health.maxmemory_policy!r}, which can "
                    "evict lock keys and fence counters.",
                    hint="Set maxmemory-policy noeviction on lock nodes.",
                    id="django_redlock.W004",
                )
            )
        if health.replica:
            messages.append(
                checks.Warning(
                    f"{where} is a replica: it refuses the lock scripts' writes (READONLY), "
                    "or, if writable, keeps locks its master never sees.",
                    hint="Point the node at the master, or use a sentinel node "
                    '({"SENTINELS": [...], "SERVICE": ...}) that follows failovers.',
                    id="django_redlock.W007",
                )
            )
    return messages
