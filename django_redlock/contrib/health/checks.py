"""A django-health-check (4.x) check of the lock nodes::

path("ht/", HealthCheckView.as_view(checks=[
    "health_check.checks.Database",
    "django_redlock.contrib.health.checks.Redlock",            # every alias
    ("django_redlock.contrib.health.checks.Redlock", {"alias": "default"}),
]))
"""

from __future__ import annotations

import dataclasses

from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable

from .report import statuses


@dataclasses.dataclass
class Redlock(HealthCheck):  # type: ignore[misc]  # health_check ships no type hints
    """Unavailable unless a quorum of the alias's nodes (every alias by default) can vote."""

    alias: str | None = None

    def run(self) -> None:  # sync: django-health-check runs it in an executor
        report = statuses(None if self.alias is None else [self.alias])
        failing = [status for status in report if not status.healthy]
        if failing:
            raise ServiceUnavailable(
                "; ".join(
                    f"alias {s.alias!r}: {s.voting}/{s.quorum} voting nodes "
                    f"({', '.join(s.problems())})"
                    for s in failing
                )
            )
