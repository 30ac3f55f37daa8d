"""Settings of the server processes of tests/request_locks/test_api_frameworks_live.py: those
of ``live_server_settings`` (the test's database and nodes), with the API app's URLs."""

from __future__ import annotations

from tests.support.live_server_settings import *  # noqa: F403

ROOT_URLCONF = "tests.api_app.urls"
