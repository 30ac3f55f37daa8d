"""What idempotent requests cost (docs/middleware.md): prints a table.

Django's test client sends POSTs to four views in one process, on a one-node alias and on a
three-node Redlock set (real redis-server processes on free loopback ports, stopped at the
end), in interleaved rounds:

1. ``no lock``: the view alone (no ``@request_lock``): the floor of the test client;
2. ``plain lock``: ``@request_lock(..., idempotency=True)`` without the header: the plain
   request lock (acquire + release), as before idempotency;
3. ``first run``: the same view with a new ``Idempotency-Key`` each time: the key's lock, the
   record read (none), the plain lock, the view, the response kept, both released;
4. ``replay``: the same key again: the key's lock, the record read, the kept response
   rebuilt; the view does not run.

Each row gives p50 and p99 of one request's latency (ms) and the ratio of its p50 to
``plain lock``'s. ``--body`` sets the view's response size (bytes, default 200).

    .venv/bin/python benchmarks/idempotency.py [--requests 400] [--rounds 5] [--body 200]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import percentile, quiet_logging  # noqa: E402

BODY = {"size": 200}


def _payload() -> bytes:
    return b"x" * BODY["size"]


def _views() -> list[Any]:
    from django.http import HttpRequest, HttpResponse
    from django.urls import path

    from django_redlock.decorators import request_lock

    def bare(request: HttpRequest, pk: int) -> HttpResponse:
        return HttpResponse(_payload(), status=201, content_type="application/json")

    once_one = request_lock("bench-idem:{pk}", using="one", idempotency=True)(bare)
    once_three = request_lock("bench-idem:{pk}", using="three", idempotency=True)(bare)
    return [
        path("bare/<int:pk>/", bare),
        path("one/<int:pk>/", once_one),
        path("three/<int:pk>/", once_three),
    ]


urlpatterns: list[Any] = []


def setup(url1: str, urls3: list[str]) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django_redlock"],
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["testserver"],
        MIDDLEWARE=[],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        REDLOCK={
            "one": {"NODES": [url1], "KEY_PREFIX": "bench-idem:"},
            "three": {"NODES": urls3, "KEY_PREFIX": "bench-idem:"},
        },
    )
    django.setup()
    urlpatterns.extend(_views())


def timed(send: Callable[[], Any], count: int, samples: list[float]) -> None:
    for _ in range(count):
        started = time.perf_counter()
        response = send()
        samples.append(time.perf_counter() - started)
        if response.status_code != 201:
            raise SystemExit(f"unexpected status {response.status_code}: {response.content!r}")


def cases(client: Any, prefix: str) -> dict[str, Callable[[], Any]]:
    replay_key = str(uuid.uuid4())
    counter = iter(range(10**9))

    def post(url: str, key: str | None) -> Any:
        headers = {"Idempotency-Key": key} if key else {}
        return client.post(url, b"{}", content_type="application/json", headers=headers)

    post(f"/{prefix}/1/", replay_key)  # the first run, so every later one replays
    return {
        "plain lock": lambda: post(f"/{prefix}/{next(counter)}/", None),
        "first run": lambda: post(f"/{prefix}/{next(counter)}/", str(uuid.uuid4())),
        "replay": lambda: post(f"/{prefix}/1/", replay_key),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="per case and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--body", type=int, default=200, help="response body, bytes")
    args = parser.parse_args()
    BODY["size"] = args.body
    quiet_logging("django_redlock")
    from django_redlock.testing import RedisNodes

    with RedisNodes.start(4) as nodes:
        setup(nodes[0].url, [n.url for n in nodes[1:]])
        from django.test import Client

        client = Client()
        table: dict[tuple[str, str], list[float]] = {}
        runs: dict[str, dict[str, Callable[[], Any]]] = {
            "1 node": cases(client, "one"),
            "3 nodes": cases(client, "three"),
        }
        bare = lambda: client.post("/bare/1/", b"{}", content_type="application/json")  # noqa: E731
        for send in [bare, *runs["1 node"].values(), *runs["3 nodes"].values()]:
            timed(send, 50, [])  # warm up: connections, scripts, imports
        for _ in range(args.rounds):
            timed(bare, args.requests, table.setdefault(("-", "no lock"), []))
            for alias, sends in runs.items():
                for case, send in sends.items():
                    timed(send, args.requests, table.setdefault((alias, case), []))
    print(
        f"\nidempotent requests: Django test client, {args.rounds} rounds x {args.requests} "
        f"requests per case, {args.body}-byte responses\n"
    )
    print(f"{'alias':8} {'case':12} {'p50 ms':>8} {'p99 ms':>8} {'p50 / plain lock':>17}")
    for (alias, case), samples in table.items():
        p50, p99 = percentile(samples, 50), percentile(samples, 99)
        assert p50 is not None and p99 is not None
        base = percentile(table.get((alias, "plain lock"), samples), 50) or p50
        print(f"{alias:8} {case:12} {p50 * 1e3:8.3f} {p99 * 1e3:8.3f} {p50 / base:16.2f}x")


if __name__ == "__main__":
    main()
