"""DRF and django-ninja views under request locks, for tests/request_locks/test_api_frameworks*.py:
every placement of ``@request_lock`` the docs name (docs/api-frameworks.md), and the wrong ones
the app refuses. Its URLs are not in the suite's root URLconf (checks would report the wrong
placements): tests use ``tests.api_app.urls`` through ``pytest.mark.urls`` or a server's
settings."""
