"""Imported once by the tests' fork server (``tests/support/processes.py``), never by a test:
the libraries every worker process needs, none of which reads Django settings when imported."""

from __future__ import annotations

import django
import django.db.models
import django.http
import django.urls
import redis
import redis.asyncio

import django_redlock.engine
import django_redlock.locking.registry

__all__ = ["django", "django_redlock", "redis"]
