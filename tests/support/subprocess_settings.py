"""Test settings for ``manage.py`` run in a subprocess by the tests (``redlock``, task workers):
``REDLOCK`` comes as JSON from the ``REDLOCK_JSON`` environment variable (the parent test's real
nodes), the database name from ``TEST_DATABASE_NAME``."""

from __future__ import annotations

import json
import os

from tests.settings import *  # noqa: F403

REDLOCK = json.loads(os.environ.get("REDLOCK_JSON", '{"default": {}}'))
# A scheduler process of a test (tests/schedules) runs that test's entries.
if os.environ.get("REDLOCK_SCHEDULE_JSON"):
    REDLOCK_SCHEDULE = json.loads(os.environ["REDLOCK_SCHEDULE_JSON"])

# A worker process of a test (tests/jobs) uses that test's database.
if os.environ.get("TEST_DATABASE_NAME"):
    DATABASES["default"]["NAME"] = os.environ["TEST_DATABASE_NAME"]  # noqa: F405
