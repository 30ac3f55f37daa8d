"""Settings of the ``runserver`` process of ``tests/observability/test_debug_toolbar_browser.py``:
the test
project with django-debug-toolbar and ``LocksPanel``, on the test's nodes (``REDLOCK`` as
JSON in ``REDLOCK_TEST_ALIASES``) and an SQLite file of its own (``TOOLBAR_SQLITE``)."""

from __future__ import annotations

import json
import os

from debug_toolbar.settings import PANELS_DEFAULTS

from tests.settings import *  # noqa: F403

DEBUG = True
INTERNAL_IPS = ["127.0.0.1"]
INSTALLED_APPS = [*INSTALLED_APPS, "debug_toolbar"]  # noqa: F405
MIDDLEWARE = ["debug_toolbar.middleware.DebugToolbarMiddleware", *MIDDLEWARE]  # noqa: F405
ROOT_URLCONF = "tests.support.toolbar_urls"
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["TOOLBAR_SQLITE"]}
}
REDLOCK = json.loads(os.environ["REDLOCK_TEST_ALIASES"])
DEBUG_TOOLBAR_PANELS = [*PANELS_DEFAULTS, "django_redlock.contrib.debug_toolbar.LocksPanel"]
DEBUG_TOOLBAR_CONFIG = {"SHOW_TOOLBAR_CALLBACK": "tests.support.toolbar_urls.always"}
