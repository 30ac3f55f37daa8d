"""Node names fit for metrics and traces: ``host:port/db`` or a socket path, never a user
name or password (labels end up in dashboards and in every scrape)."""

from __future__ import annotations

from urllib.parse import urlsplit

from ..conf import NodeSpec, url_identity


def public_label(node: NodeSpec) -> str:
    """``cache:<alias>``, ``host:port/db``, ``unix:<path>/db``, or a sentinel or cluster
    node's label (``sentinel:<service>@<hosts>/<db>``, ``cluster:<hosts>``): no credentials."""
    if node.cache is not None:
        return f"cache:{node.cache}"
    if node.url is None:
        return node.label
    server, db = url_identity(node.url)
    if urlsplit(node.url).scheme == "unix":
        return f"unix:{server}/{db}"
    return f"{server}/{db}"
