"""Fork detection: a counter that every child process bumps right after ``os.fork()``.

Connections, wake-up connections and locks of a process must never be used by its forked
children (gunicorn ``--preload``, Celery prefork, ``multiprocessing`` with fork): a child
would read replies meant for its parent. The engine compares its own generation with this
counter on every call (an integer comparison) and starts afresh in a child; a lease taken
before the fork knows it belongs to the parent.
"""

from __future__ import annotations

import os

#: Bumped in every child process right after a fork (read as ``forks.current`` on the hot
#: path: an attribute, not a call).
current = 0


def _forked() -> None:
    global current
    current += 1


def generation() -> int:
    """Bumped in every child process right after a fork."""
    return current


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork to survive
    os.register_at_fork(after_in_child=_forked)
