"""Settings of the real server processes started by ``tests/test_demo_buy_endpoint.py``.

The test passes its (already created) test database and its ``REDLOCK`` aliases as JSON in
``REDLOCK_TEST_DATABASE`` / ``REDLOCK_TEST_ALIASES``, so server and test share both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from django.http import HttpRequest
from django.http.response import HttpResponseBase

from tests.settings import *  # noqa: F403

DATABASES = {"default": json.loads(os.environ["REDLOCK_TEST_DATABASE"])}
REDLOCK = json.loads(os.environ["REDLOCK_TEST_ALIASES"])
MIDDLEWARE = ["tests.support.live_server_settings.worker_pid", *MIDDLEWARE]  # noqa: F405


def worker_pid(
    get_response: Callable[[HttpRequest], HttpResponseBase],
) -> Callable[[HttpRequest], HttpResponseBase]:
    """Tag each response with the serving process id, so the test can count the workers."""

    def middleware(request: HttpRequest) -> HttpResponseBase:
        response = get_response(request)
        response["X-Worker-Pid"] = str(os.getpid())
        return response

    return middleware
