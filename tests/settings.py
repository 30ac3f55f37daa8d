"""Settings for the project's own test suite.

PostgreSQL when ``DATABASE_URL`` is set (``postgres://user@host:port/db``), SQLite otherwise.
The ``REDLOCK`` aliases are filled in by ``tests/conftest.py`` from real redis-server processes.
"""

from __future__ import annotations

import os

from testproject import settings as demo_settings

SECRET_KEY = "django-redlock-tests-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "testproject.urls"

# django-tasks (the backport of django.tasks) with its database backend: @lock under @task is
# tested with real db_worker processes (tests/jobs/test_django_tasks.py).
# tests.api_app: DRF and django-ninja views (tests/request_locks/test_api_frameworks*.py).
# tests.fencing_app: FencedModels with unique keys (tests/fencing/test_fenced_tombstones.py).
# tests.docs_app: the models the docs' examples assume; tests.docs_examples: the app of the models
# an example defines (tests/test_doc_examples_run.py runs them, in an isolated registry).
INSTALLED_APPS = [
    *demo_settings.INSTALLED_APPS,
    "django_tasks",
    "django_tasks_db",
    "tests.fencing_app",
    "tests.docs_app",
    "tests.docs_examples",
    "rest_framework",
    "rest_framework.authtoken",
    "tests.api_app.apps.ApiAppConfig",
]
# djangorestframework-simplejwt signs with SECRET_KEY unless told; PyJWT wants 32 bytes or more
SIMPLE_JWT = {"SIGNING_KEY": "django-redlock-tests-only-jwt-signing-key-32-bytes-at-least"}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
MIDDLEWARE = demo_settings.MIDDLEWARE
STATIC_URL = "/static/"
TEMPLATES = demo_settings.TEMPLATES


DATABASES = {"default": demo_settings.database_from_url(os.environ.get("DATABASE_URL"))}

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# The lock-order checker (docs/production.md, Ordering locks) is off for the suite: its tests
# take names in both orders on purpose (tests/composition, tests/seams), and records shared
# through the session's nodes would join unrelated tests into inversions. Its own tests turn
# it on with override_settings (tests/locking/test_lock_order*.py).
REDLOCK_CHECK_ORDER = False

# Replaced per session by tests/conftest.py with real nodes.
REDLOCK: dict[str, dict[str, object]] = {"default": {}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {"django_redlock": {"handlers": ["null"], "level": "DEBUG"}},
}
