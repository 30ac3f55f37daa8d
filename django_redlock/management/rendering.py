"""What ``manage.py redlock`` prints as text: terminal-safe names, tables of locks, holders
and nodes, and what a release released."""

from __future__ import annotations

from collections.abc import Sequence

from ..inspection import LockInfo, NodeHealth


def printable(text: str) -> str:
    """``text`` safe to write to a terminal: every character ``repr()`` would escape (C0
    controls such as ESC, CR, LF and BEL; DEL; C1 controls; bidi embeddings, overrides and
    isolates; line and paragraph separators) as its ``repr()`` escape (``\\x1b``, ``\\n``,
    ``\\u202e``), and a backslash doubled, so no two names print alike. Lock names come
    from HTTP clients (request-lock keys are filled from URL values)."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escaped(ch) for ch in text)


def _escaped(ch: str) -> str:
    """One character of :func:`printable`: ASCII controls as ``repr()`` writes them, other
    code points as ``\\uXXXX`` (never ``\\xHH`` above 0x7f, which bash's ``$'...'`` would
    read as a raw byte rather than the character)."""
    if ch == "\\":
        return "\\\\"
    if ch.isprintable():
        return ch
    code = ord(ch)
    if code < 0x80:
        return repr(ch)[1:-1]
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; every cell :func:`printable`."""
    cells = [
        [str(h) for h in headers],
        *[["" if c is None else printable(str(c)) for c in r] for r in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def lock_row(info: LockInfo) -> list[object]:
    held = f"{info.nodes_held}/{info.nodes_total}"
    if info.nodes_other:
        held += f" (+{info.nodes_other} other)"
    return [
        info.alias,
        info.name,
        held,
        f"{info.ttl_ms} ms" if info.ttl_ms >= 0 else "none",
        info.token,
        info.owner,
        info.acquired_at.strftime("%Y-%m-%d %H:%M:%S") if info.acquired_at else "",
        f"{info.host} ({info.pid})" if info.pid else info.host,
        info.waiters,
        info.kind_label,
    ]


def holder_rows(info: LockInfo) -> list[list[object]]:
    """``show``'s lines under HOLDERS: each lease holding the name (a semaphore's permits)."""
    return [
        [
            "" if holder["slot"] is None else holder["slot"],
            "" if holder["token"] is None else holder["token"],
            holder["owner"],
            holder["lease_id"],
            f"{holder['ttl_ms']} ms" if holder["ttl_ms"] >= 0 else "none",
            f"{holder['nodes_held']}/{info.nodes_total}",
        ]
        for holder in info.holders
    ]


def released_what(info: LockInfo) -> str:
    """What ``release`` says it released, by kind."""
    where = f"{info.name!r} on alias {info.alias!r}"
    count = len(info.holders)
    if info.kind == "semaphore":  # every permit; the token is the newest permit's
        return (
            f"semaphore {where} ({count} permit{'s' if count != 1 else ''} of "
            f"{info.permits}, newest token {info.token})"
        )
    if info.kind == "read":  # every read lease
        return f"the {count} read lease{'s' if count != 1 else ''} of {where}"
    if info.kind == "write":
        return f"write lease {where} (token {info.token})"
    return f"{where} (token {info.token})"


HOLDER_HEADERS = ("SLOT", "TOKEN", "OWNER", "LEASE", "TTL", "NODES")

LOCK_HEADERS = (
    "ALIAS",
    "NAME",
    "NODES",
    "TTL",
    "TOKEN",
    "OWNER",
    "ACQUIRED (UTC)",
    "HOLDER",
    "WAITERS",
    "KIND",
)

NODE_HEADERS = ("ALIAS", "NODE", "STATUS", "LATENCY", "RUN_ID", "UPTIME", "POLICY", "MEMORY")


def node_row(node: NodeHealth) -> list[object]:
    if not node.up:
        return [node.alias, node.node, "down", "", "", "", "", node.error]
    return [
        node.alias,
        node.shown,
        "up (replica)" if node.replica else "up",
        f"{node.latency_ms:.2f} ms",
        node.run_id,
        f"{node.uptime_s} s",
        node.policy_shown,
        node.used_memory_human or node.used_memory,
    ]
