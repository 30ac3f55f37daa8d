"""Settings of the demo project.

``DATABASE_URL`` (postgres://...) selects PostgreSQL, else SQLite in ``demo.sqlite3``.
``REDLOCK_NODES`` is a comma-separated list of node URLs; it defaults to the three nodes that
README's demo command starts on ports 7001-7003. ``REDLOCK_DEMO_METRICS=1`` adds
django-prometheus and ``django_redlock.contrib.prometheus`` (``/metrics``; needs the
``prometheus`` extra and django-prometheus; set ``PROMETHEUS_MULTIPROC_DIR`` for gunicorn).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-redlock-demo-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "testproject.urls"
WSGI_APPLICATION = "testproject.wsgi.application"
ASGI_APPLICATION = "testproject.asgi.application"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redlock",
    "testproject.inventory",
]
if os.environ.get("REDLOCK_DEMO_METRICS") == "1":
    INSTALLED_APPS += ["django_prometheus", "django_redlock.contrib.prometheus"]
# `manage.py nightly --scheduler` gives its scheduler processes their schedule (JSON)
if os.environ.get("DEMO_SCHEDULE"):
    REDLOCK_SCHEDULE = json.loads(os.environ["DEMO_SCHEDULE"])
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"


def database_from_url(url: str | None) -> dict[str, object]:
    """A ``DATABASES['default']`` dict from a ``postgres://`` URL, or SQLite when None."""
    if not url:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SQLITE_PATH", "test-redlock.sqlite3"),
            "TEST": {"NAME": os.environ.get("SQLITE_TEST_PATH", "test-redlock-test.sqlite3")},
            "OPTIONS": {"timeout": 30},
        }
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must be a postgres:// URL, got scheme {parts.scheme!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "test",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "TEST": {"NAME": os.environ.get("PG_TEST_NAME", "test_django_redlock")},
    }


_db = database_from_url(os.environ.get("DATABASE_URL"))
if _db["ENGINE"] == "django.db.backends.sqlite3":
    _db["NAME"] = os.environ.get("DEMO_SQLITE_PATH") or str(BASE_DIR / "demo.sqlite3")
DATABASES = {"default": _db}

NODE_URLS = [
    url.strip()
    for url in os.environ.get(
        "REDLOCK_NODES",
        "redis://127.0.0.1:7001/0,redis://127.0.0.1:7002/0,redis://127.0.0.1:7003/0",
    ).split(",")
    if url.strip()
]
REDLOCK = {"default": {"NODES": NODE_URLS, "TTL": 10.0, "TIMEOUT": 5.0}}

# ``manage.py stampede``: a Redis cache on the first lock node (its own key prefix), which many
# processes miss at once.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "demo": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": NODE_URLS[0],
        "KEY_PREFIX": "demo-cache",
    },
}
