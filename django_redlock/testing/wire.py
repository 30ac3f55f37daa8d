"""Loopback sockets without redis-py: free TCP ports, and one raw RESP command."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Sequence

HOST = "127.0.0.1"

Address = str | tuple[str, int]  # a unix socket path, or (host, port)


#: Ports :func:`free_port` hands out: below Linux's ephemeral range (32768-60999 by default),
#: which outgoing connections draw their local ports from, so a port chosen now is not taken
#: by some client's connection before the server that was given it binds it.
FREE_PORTS = range(20000, 32768)


def free_port() -> int:
    """A TCP port on :data:`HOST` that nothing listens on right now (see :data:`FREE_PORTS`;
    one the kernel picks when none of a hundred tries there is free)."""
    for _ in range(100):
        port = random.choice(FREE_PORTS)
        if port_free(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """True if ``port`` on :data:`HOST` can be bound now (with ``SO_REUSEADDR``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def chosen_ports(ports: Sequence[int], needed: int, what: str, bus_offset: int = 0) -> list[int]:
    """The ``ports=`` a group was given, checked before anything starts: ``needed`` distinct
    ports (1-65535), each free now (and its ``port + bus_offset`` too, for a cluster's bus,
    which must not be another of the ports).
    Raises ``ValueError`` (wrong count or value) or ``OSError`` (a port in use)."""
    chosen = list(ports)
    if len(chosen) != needed:
        raise ValueError(f"ports= needs {needed} ports ({what}), got {len(chosen)}: {chosen}")
    top = 65535 - bus_offset
    for port in chosen:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= top:
            raise ValueError(f"ports= takes ports from 1 to {top}, not {port!r}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"ports= repeats a port: {chosen}")
    if bus_offset:
        for port in chosen:
            if port + bus_offset in chosen:
                raise ValueError(
                    f"ports= gives port {port + bus_offset} twice: to a node, and as the "
                    f"cluster bus of port {port} (port + {bus_offset}): {chosen}"
                )
    for port in chosen:
        for busy in (port, port + bus_offset) if bus_offset else (port,):
            if not port_free(busy):
                also = f" (the cluster bus of port {port})" if busy != port else ""
                raise OSError(f"port {busy}{also} on {HOST} is in use; pass other ports=")
    return chosen


def wait_port_free(port: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for :func:`port_free`; return either way."""
    deadline = time.monotonic() + timeout
    while not port_free(port) and time.monotonic() < deadline:
        time.sleep(0.05)


def reply_complete(reply: bytes) -> bool:
    """True once ``reply`` holds a whole simple, error or bulk RESP reply."""
    head, sep, rest = reply.partition(b"\r\n")
    if not sep:
        return False
    if head[:1] != b"$":
        return True
    size = int(head[1:] or b"-1")
    return size < 0 or len(rest) >= size + 2


def raw_command(address: Address, *args: bytes, timeout: float) -> bytes:
    """Send one command over a fresh socket; the raw reply, or b"" on any socket error."""
    request = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(address)
            sock.sendall(request)
            reply = b""
            while not reply_complete(reply):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
            return reply
    except OSError:
        return b""
