"""The client side of ``tests/observability/test_prometheus_scrape.py``: a process of a few threads
that
POST to the demo's buy endpoint; returns what each request answered."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def post(url: str) -> tuple[int, str]:
    """(status, the JSON body's ``error``/``code``, or '')."""
    request = urllib.request.Request(
        url, data=b"", method="POST", headers={"Accept": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status, ""
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
        except ValueError:
            body = {}
        return exc.code, str(body.get("error") or body.get("code") or "")


def shopper_process(url: str, threads: int, requests: int) -> list[tuple[int, str]]:
    """``threads`` threads, ``requests`` POSTs each, all to ``url``."""
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(post, [url] * (threads * requests)))
