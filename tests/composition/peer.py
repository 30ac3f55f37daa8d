"""A second process for the composition machine: takes and releases names on command.

Run as ``python -m tests.composition.peer`` with ``REDLOCK_JSON`` (the test's ``REDLOCK``
setting) in the environment. One JSON object per line on stdin, one answer per line on stdout:

* ``{"op": "acquire", "alias", "name", "ttl", "permits": null, "rw": null}`` ->
  ``{"ok": true, "id", "token", "validity"}`` or ``{"ok": false, "error": <class name>}``
* ``{"op": "acquire_limits", "alias", "limits": {name: permits}, "ttl"}`` ->
  ``{"ok": true, "leases": [{"id", "name", "token", "validity"}, ...]}`` (one id per permit,
  each released on its own) or ``{"ok": false, "error": <class name>}``
* ``{"op": "release", "id"}`` -> ``{"ok": true, "held": bool}``
* ``{"op": "release_later", "id", "delay"}`` -> ``{"ok": true}`` (a timer releases it)
* ``{"op": "status", "id"}`` -> ``{"ok": true, "released": bool}``
* ``{"op": "release_all"}`` -> ``{"ok": true}``; ``{"op": "ping"}`` -> ``{"ok": true}``
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any


def _setup() -> None:
    """A bare Django with the parent test's ``REDLOCK`` aliases (no database)."""
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django_redlock"],
        REDLOCK=json.loads(os.environ["REDLOCK_JSON"]),
        USE_TZ=True,
        DATABASES={},
        LOGGING_CONFIG=None,
    )
    django.setup()


class Peer:
    """The leases this process holds, by id."""

    def __init__(self) -> None:
        from django_redlock.locking.lease import Lease

        self.leases: dict[int, Lease] = {}
        self.next_id = 0
        self.mutex = threading.Lock()

    def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from django_redlock import locks
        from django_redlock.exceptions import LockError

        op = cmd["op"]
        if op == "ping":
            return {"ok": True}
        if op == "acquire":
            try:
                lease = locks[cmd["alias"]].acquire(
                    cmd["name"],
                    ttl=cmd["ttl"],
                    timeout=cmd.get("timeout", 0),
                    permits=cmd.get("permits"),
                    rw=cmd.get("rw"),
                )
            except LockError as exc:
                return {"ok": False, "error": type(exc).__name__, "message": str(exc)}
            with self.mutex:
                self.next_id += 1
                self.leases[self.next_id] = lease
                return {
                    "ok": True,
                    "id": self.next_id,
                    "token": lease.token,
                    "validity": lease.validity,
                }
        if op == "acquire_limits":
            try:
                held = locks[cmd["alias"]].acquire_limits(cmd["limits"], ttl=cmd["ttl"], timeout=0)
            except LockError as exc:
                return {"ok": False, "error": type(exc).__name__, "message": str(exc)}
            answers = []
            with self.mutex:
                for name, lease in held.leases.items():
                    self.next_id += 1
                    self.leases[self.next_id] = lease
                    answers.append(
                        {
                            "id": self.next_id,
                            "name": name,
                            "token": lease.token,
                            "validity": lease.validity,
                        }
                    )
            return {"ok": True, "leases": answers}
        if op == "release":
            return {"ok": True, "held": self.leases[cmd["id"]].release()}
        if op == "release_later":
            lease = self.leases[cmd["id"]]
            timer = threading.Timer(cmd["delay"], lease.release)
            timer.daemon = True
            timer.start()
            return {"ok": True}
        if op == "status":
            return {"ok": True, "released": self.leases[cmd["id"]].released}
        if op == "release_all":
            for lease in list(self.leases.values()):
                lease.release()
            self.leases.clear()
            return {"ok": True}
        return {"ok": False, "error": "UnknownOp", "message": op}


def main() -> None:
    _setup()
    peer = Peer()
    print(json.dumps({"ok": True, "ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            answer = peer.handle(cmd)
        except Exception as exc:  # reported to the machine, which fails with it
            answer = {"ok": False, "error": "Crash", "message": repr(exc)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
