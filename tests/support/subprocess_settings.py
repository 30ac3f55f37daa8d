"""Test settings for ``manage.py`` run in a subprocess by ``tests/test_command.py``: ``REDLOCK``
comes as JSON from the ``REDLOCK_JSON`` environment variable (the parent test's real nodes)."""

from __future__ import annotations

import json
import os

from tests.settings import *  # noqa: F403

REDLOCK = json.loads(os.environ.get("REDLOCK_JSON", '{"default": {}}'))
