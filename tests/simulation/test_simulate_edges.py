"""``simulate()`` at its edges, found by an outside attack (the aliases' nodes are traps:
nothing may connect): the metrics refresher, ``redlock order``, busy globs read exactly as
Redis's ``SCAN MATCH`` reads them, and bad ``REDLOCK_SIMULATE`` values."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_redlock import locks
from django_redlock.exceptions import LockNotAcquired
from django_redlock.locking import ordering
from django_redlock.testing import simulate
from django_redlock.testing.simulation import ENVIRONMENT_VARIABLE, simulation_from_environment

pytestmark = pytest.mark.usefixtures("traps")


def test_the_metrics_refresher_probes_no_simulated_node() -> None:
    """The Prometheus refresher's node probe skips the aliases a simulation covers (it used
    to PING the real nodes every 5 s during a simulation)."""
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry

    from django_redlock.contrib.prometheus.metrics import RedlockMetrics

    metrics = RedlockMetrics(CollectorRegistry(), waiters_interval=3600, nodes_interval=3600)
    with simulate():
        with locks["default"].lock("sim:metrics"):
            pass
        assert all(manager.simulated for manager in locks.all())
        metrics.refresher.refresh()  # the traps fixture fails the test on any connection
    assert not any(manager.simulated for manager in locks.all())


def test_redlock_order_reads_the_simulations_records() -> None:
    """``redlock order --check`` under ``simulate`` reads the records kept in memory and exits
    3 on an inversion (it used to refuse: "does not run without real nodes"); with one alias
    simulated and another real, it still refuses rather than reach the real nodes."""
    manager = locks["default"]
    with override_settings(REDLOCK_CHECK_ORDER=True), simulate():
        ordering.reset()
        try:
            with manager.lock("sim:a:1"), manager.lock("sim:b:1"):
                pass

            def inverted() -> None:
                with pytest.warns(RuntimeWarning), manager.lock("sim:b:2"), manager.lock("sim:a:2"):
                    pass

            thread = threading.Thread(target=inverted)
            thread.start()
            thread.join()
            with pytest.raises(CommandError) as raised:
                call_command("redlock", "order", "--check", "--using", "default")
            assert raised.value.returncode == 3
            call_command("redlock", "order", "--clear")
            call_command("redlock", "order", "--check")  # cleared: nothing inverted
        finally:
            ordering.reset()
    with simulate(using="default"), pytest.raises(CommandError, match="simulated"):
        call_command("redlock", "order")


def _busy(globs: list[str], names: list[str]) -> list[str]:
    found = []
    with simulate(busy=globs):
        for name in names:
            try:
                locks["default"].acquire(name, timeout=0).release()
            except LockNotAcquired:
                found.append(name)
    return found


NAMES = ["xa", "xb", "xc", "x[ab", "[", "\\", "b", "y]", "yb", "ya", "é", "éa", "a-c"]


@pytest.mark.parametrize(
    ("glob", "busy"),
    [
        ("x[ab", ["xa", "xb"]),  # a set left open ends with the glob
        ("[", []),  # an empty set matches nothing
        ("[]", []),
        ("[^]", ["[", "\\", "b"]),  # any one byte
        ("[c-a]", ["b"]),  # a reversed range
        ("y[^a]", ["y]", "yb"]),
        ("\\", ["\\"]),  # a last backslash is itself
        ("?", ["[", "\\", "b"]),  # one byte: "é" is two
        ("??", ["xa", "xb", "xc", "y]", "yb", "ya", "é"]),
        ("é?", ["éa"]),
    ],
)
def test_busy_globs_read_as_redis_scan_match(glob: str, busy: list[str]) -> None:
    """Each expected list is what a real ``SCAN MATCH`` answered for these names (Redis 7):
    the edges used to differ (an open ``[`` was literal, ``[c-a]`` and ``[^]`` raised
    ``re.error``, ``?`` matched a whole non-ASCII character)."""
    assert _busy([glob], NAMES) == busy


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    yield monkeypatch


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ('{"busy": "n*"}', "list of globs"),
        ('{"busy": 5}', "list of globs"),
        ('{"unavailable": "yes"}', "True or False"),
        ('{"using": "nope"}', "'nope' is not an alias"),
        ('{"using": 3}', "an alias"),
        ('{"lost_after": -1}', "seconds >= 0"),  # the variable was not named
        ('{"lost_after": true}', "seconds \\(a number\\)"),
    ],
)
def test_bad_environment_values_are_one_line_errors(
    environment: pytest.MonkeyPatch, raw: str, says: str
) -> None:
    """A wrong type or an unknown alias in ``REDLOCK_SIMULATE`` is a ``ValueError`` naming the
    variable, which ``manage.py redlock`` prints as one ``CommandError`` line (it used to be
    a TypeError traceback, or a ValueError raised after the command began)."""
    environment.setenv(ENVIRONMENT_VARIABLE, raw)
    with pytest.raises(ValueError, match=says) as raised:
        simulation_from_environment()
    assert ENVIRONMENT_VARIABLE in str(raised.value)
    with pytest.raises(CommandError, match=ENVIRONMENT_VARIABLE):
        call_command("redlock", "list")
