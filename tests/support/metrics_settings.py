"""Settings of the gunicorn server of ``tests/observability/test_prometheus_scrape.py``: the demo
with
django-prometheus and ``django_redlock.contrib.prometheus`` (as ``REDLOCK_DEMO_METRICS=1``
makes it), on the test's database and nodes (passed as JSON, as for
``live_server_settings``)."""

from __future__ import annotations

from tests.support.live_server_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "django_prometheus", "django_redlock.contrib.prometheus"]  # noqa: F405
