"""A process running one effect under a lock (tests/effects/test_ledger_processes.py).

``python -m tests.support.effect_worker MODE NAME KEY FLAG``, with the subprocess settings:
``hang`` takes the lock (TTL 1 s), begins the effect, writes FLAG and sleeps (to be killed);
``run`` takes the lock, prints the effect's state as JSON, and leaves the block (done).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import django


def main(mode: str, name: str, key: str, flag: str) -> None:
    django.setup()
    from django_redlock import lock

    ttl = 1 if mode == "hang" else 10
    with lock(name, ttl=ttl, timeout=30) as lease, lease.once(key) as effect:
        if mode == "hang":
            # written aside and renamed: the test, which reads it once it exists (and then
            # kills this process), never finds it empty
            written = Path(f"{flag}.part")
            written.write_text(str(lease.token))
            written.replace(flag)
            time.sleep(600)
        state = {
            "done": effect.done,
            "pending": effect.pending,
            "interrupted": effect.interrupted,
            "attempts": effect.attempts,
            "token": lease.token,
        }
    print(json.dumps(state))


if __name__ == "__main__":
    main(*sys.argv[1:5])
