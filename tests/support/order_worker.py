"""A process of the lock-order checker's cross-process test (tests/locking/test_lock_order.py):
with the checker on, it holds ``argv[1]`` while it takes ``argv[2]`` (alias ``default``, the
parent test's nodes from ``REDLOCK_JSON``), then prints its pid."""

from __future__ import annotations

import os
import sys

import django


def child_takes_first_then_second(first: str, second: str) -> None:
    from django_redlock import lock

    with lock(first, timeout=2), lock(second, timeout=2):
        pass


if __name__ == "__main__":
    django.setup()
    from django.conf import settings

    settings.REDLOCK_CHECK_ORDER = True  # before the first lock call makes the manager
    child_takes_first_then_second(sys.argv[1], sys.argv[2])
    print(os.getpid())
