"""URLconf of the debug-toolbar browser test: ``/checkout/`` takes three locks (one after
waiting for a thread of its own to release it) and fails to take one the test holds. The
thread's own acquisition is not the request's: the panel must not list it."""

from __future__ import annotations

import contextlib
import threading
import time

from debug_toolbar.toolbar import debug_toolbar_urls
from django.http import HttpRequest, HttpResponse
from django.urls import path

from django_redlock import locks
from django_redlock.exceptions import LockNotAcquired


def always(request: HttpRequest) -> bool:
    return True


def _hold_briefly(taken: threading.Event) -> None:
    lease = locks["multi"].acquire("toolbar:side", timeout=5)
    taken.set()
    time.sleep(0.15)
    lease.release()


def checkout(request: HttpRequest) -> HttpResponse:
    manager = locks["multi"]
    with manager.lock("toolbar:cart", timeout=1):
        time.sleep(0.02)
    taken = threading.Event()
    threading.Thread(target=_hold_briefly, args=(taken,)).start()
    taken.wait(5)
    with manager.lock("toolbar:side", timeout=5):  # waits for the thread's release
        pass
    with contextlib.suppress(LockNotAcquired):  # the test holds it: a "busy" row
        manager.acquire("toolbar:held-by-test", timeout=0)
    with locks["default"].lock("toolbar:receipt", timeout=1):
        return HttpResponse("<!DOCTYPE html><html><body><h1>Checkout done</h1></body></html>")


urlpatterns = [
    path("checkout/", checkout),
    path("ok/", lambda request: HttpResponse("ok")),
    *debug_toolbar_urls(),
]
