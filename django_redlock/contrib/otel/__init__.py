"""OpenTelemetry spans of lock calls (docs/observability.md): add ``"django_redlock.contrib.otel"``
to
``INSTALLED_APPS`` (needs ``opentelemetry-api``, the ``otel`` extra).

Each acquire call becomes a ``redlock.acquire`` span and each held lease a ``redlock.hold``
span, children of the span current when the lock was taken (the request's, with
OpenTelemetry's Django instrumentation). Without a configured tracer provider the API's no-op
tracer is used and nothing is recorded or kept. See ``docs/observability.md``.
"""
