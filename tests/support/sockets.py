"""This process's open TCP connections, counted on the client's side."""

from __future__ import annotations

import os
from pathlib import Path

#: ``/proc/net/tcp``'s state of a socket whose peer has closed its end (CLOSE_WAIT)
_CLOSE_WAIT = "08"


def open_sockets_to(port: int) -> int:
    """How many sockets of this process are connected to ``port`` (``/proc/self/fd`` matched
    with ``/proc/self/net/tcp``): a socket the process closed is gone from there at once.

    A socket whose peer closed it (CLOSE_WAIT) is not counted: it is no connection to the
    server on ``port`` now. It may be one to an earlier server on the same port (a test's
    node whose port a new node drew again), kept by an idle pooled connection that is closed
    at its next use or by the idle closer, and it would count against the new node.

    Sockets are counted once each, by inode: the kernel writes the table a page per read
    and walks it again from where it stopped, so while other processes open and close
    sockets a line can come twice (6 counted where this process had 2, under a parallel
    run)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    matched: set[str] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                int(fields[2].rpartition(":")[2], 16) == port
                and fields[9] in inodes
                and fields[3] != _CLOSE_WAIT
            ):
                matched.add(fields[9])
    return len(matched)
