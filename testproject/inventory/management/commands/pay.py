"""``manage.py pay``: a client retrying payments over a flaky network, with and without an
Idempotency-Key.

This process serves the demo project over real HTTP (Django's threaded WSGI server on a free
loopback port) and runs a client against ``POST /inventory/pay/<id>/``. The payment provider
behind the view is slow on every other payment's first call: that answer comes after the
client gave up (its read timeout), which is what a dropped response looks like to a client.
The client then sends the payment again, as any careful client does, until it gets an answer.

- ``--no-key``: the retries carry no Idempotency-Key. Each one that reaches the view charges
  again: a payment whose first answer was lost is charged two or three times.
- default: every attempt of one payment carries the same Idempotency-Key. A retry while the
  first attempt still runs gets 409 (and is sent again after a pause); a retry after it gets
  the stored answer (``Idempotent-Replayed: true``). Each payment is charged once.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from argparse import ArgumentParser
from dataclasses import dataclass, field
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.core.wsgi import get_wsgi_application

from testproject.inventory.demo_run import add_json_option, emit_result
from testproject.inventory.models import Charge


class QuietHandler(WSGIRequestHandler):
    """The request handler without the access log (the demo prints its own table)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Tally:
    """What the client saw over one run."""

    attempts: int = 0
    timeouts: int = 0
    busy: int = 0
    replayed: int = 0
    answered: int = 0
    failed: list[str] = field(default_factory=list)


def serve() -> tuple[ThreadedWSGIServer, str]:
    """The demo project on a free loopback port, served from a daemon thread."""
    server = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler, allow_reuse_address=False)
    server.set_app(get_wsgi_application())
    threading.Thread(target=server.serve_forever, daemon=True, name="pay-demo-server").start()
    host, port = server.server_address[:2]
    return server, f"{host}:{port}"


def pay_once(
    address: str,
    payment: str,
    slow: bool,
    body: bytes,
    key: str | None,
    options: dict[str, Any],
    tally: Tally,
) -> None:
    """Send one payment until an answer arrives (or ``--attempts`` run out)."""
    host, port = address.split(":")
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    patience = options["client_timeout"]
    for attempt in range(options["attempts"]):
        # the provider is slow on every other payment's first call: its answer comes after the
        # client gave up (1.5x its patience); it is quick otherwise (0.2x)
        late = attempt == 0 and slow
        headers["X-Provider-Latency"] = f"{(1.5 if late else 0.2) * patience:.3f}"
        tally.attempts += 1
        client = http.client.HTTPConnection(host, int(port), timeout=options["client_timeout"])
        try:
            client.request("POST", f"/inventory/pay/{payment}/", body=body, headers=headers)
            response = client.getresponse()
            response.read()
        except TimeoutError:
            tally.timeouts += 1  # the answer is lost to this client: send it again
            continue
        finally:
            client.close()
        if response.status == 409:  # the first attempt still runs: wait, then ask again
            tally.busy += 1
            time.sleep(options["client_timeout"] / 2)
            continue
        if response.status == 201:
            tally.answered += 1
            tally.replayed += response.getheader("Idempotent-Replayed") == "true"
            return
        tally.failed.append(f"{payment}: HTTP {response.status}")
        return
    tally.failed.append(f"{payment}: no answer after {options['attempts']} attempts")


class Command(BaseCommand):
    help = "A client retrying payments over a flaky network, with and without Idempotency-Key."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--no-key", action="store_true", help="Retry without the header.")
        parser.add_argument("--payments", type=int, default=12, help="Payments to make (12).")
        parser.add_argument(
            "--client-timeout",
            type=float,
            default=0.3,
            help="Seconds the client waits for an answer before sending again (0.3).",
        )
        parser.add_argument(
            "--attempts", type=int, default=20, help="Attempts per payment at most (20)."
        )
        add_json_option(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["payments"] < 1 or options["attempts"] < 1:
            raise CommandError("--payments and --attempts must be at least 1")
        if not 0.05 <= options["client_timeout"] <= 5:
            raise CommandError("--client-timeout must be from 0.05 to 5 seconds")
        use_key = not options["no_key"]
        run = uuid.uuid4().hex[:8]
        timeout = options["client_timeout"]
        server, address = serve()
        tally = Tally()
        started = time.monotonic()
        try:
            for number in range(options["payments"]):
                payment = f"{run}-{number}"
                body = json.dumps({"amount_cents": 1999}).encode()
                key = f"pay-{payment}" if use_key else None
                pay_once(address, payment, number % 2 == 0, body, key, options, tally)
            time.sleep(2 * timeout)  # answers nobody waits for any more still charge
        finally:
            server.shutdown()
            server.server_close()
        seconds = time.monotonic() - started
        charges = Charge.objects.filter(payment__startswith=f"{run}-")
        counts = [charges.filter(payment=f"{run}-{n}").count() for n in range(options["payments"])]
        result = {
            "idempotency_key": use_key,
            "payments": options["payments"],
            "attempts": tally.attempts,
            "client_timeouts": tally.timeouts,
            "busy_409": tally.busy,
            "replayed": tally.replayed,
            "charges": sum(counts),
            "charged_more_than_once": sum(1 for c in counts if c > 1),
            "not_charged": sum(1 for c in counts if c == 0),
            "failed": tally.failed,
            "seconds": round(seconds, 2),
        }
        label = "with Idempotency-Key" if use_key else "without Idempotency-Key"
        line = (
            f"pay, {label}: {options['payments']} payments, {tally.attempts} attempts "
            f"({tally.timeouts} answers lost to the client, {tally.busy} x 409, "
            f"{tally.replayed} replayed): {result['charges']} charges, "
            f"{result['charged_more_than_once']} payment(s) charged more than once"
        )
        emit_result(self, line, result, options["json"])
