"""@lock for jobs (docs/jobs.md): names filled from the call's arguments bound to the signature,
on_busy="skip", sync and async functions, against the session's real redis-server nodes."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from django_redlock import lock, locks, signals
from django_redlock.exceptions import LockNotAcquired


def test_template_fields_name_parameters_however_they_are_passed(unique_name: str) -> None:
    """{day} and {0} are filled whether the caller passes the argument by position or by
    keyword, and defaults count (before: "{day}" failed for a positional call)."""
    seen: list[str] = []

    @lock(unique_name + ":{day}:{kind}:{0}", timeout=0)
    def report(day: str, kind: str = "daily") -> None:
        held = locks["default"].acquire
        with pytest.raises(LockNotAcquired):
            held(f"{unique_name}:{day}:{kind}:{day}", timeout=0)
        seen.append(f"{day}/{kind}")

    report("mon")
    report(day="tue")
    report("wed", kind="weekly")
    assert seen == ["mon/daily", "tue/daily", "wed/weekly"]


def test_template_with_attributes_varargs_and_kwargs(unique_name: str) -> None:
    """Attribute access and format specs work; *args spread positionally, **kwargs by name."""
    names: list[str] = []

    class Tenant:
        pk = 7

    @lock(unique_name + ":{tenant.pk}:{1:03d}:{region}", timeout=0)
    def export(tenant: Tenant, *parts: int, **options: str) -> None:
        names.append(_active())

    export(Tenant(), 5, region="eu")
    assert names == [f"{unique_name}:7:005:eu"]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("job:{missing}", "has no parameter 'missing'"),
        ("job:{2}", r"has no positional parameter \{2\}"),
        ("job:{", "is not a valid format string"),
    ],
)
def test_a_template_the_function_cannot_fill_is_refused_when_decorating(
    template: str, message: str
) -> None:
    """The error comes at import time (decoration), naming the function: not at 3 a.m."""
    with pytest.raises(ValueError, match=message) as info:

        @lock(template)
        def job(day: str, kind: str = "x") -> None: ...

    assert "job" in str(info.value)


def test_a_value_that_cannot_fill_the_template_is_a_clear_error(unique_name: str) -> None:
    @lock(unique_name + ":{user.pk}", timeout=0)
    def job(user: object) -> None: ...

    with pytest.raises(ValueError, match="cannot be filled from the arguments of"):
        job(None)


def test_on_busy_skip_returns_none_logs_and_signals(
    unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A busy name: the function does not run, the call returns None, INFO log, lock_failed."""
    runs: list[int] = []
    failed: list[dict[str, Any]] = []

    @lock(unique_name + ":{0}", timeout=0, on_busy="skip")
    def job(n: int) -> str:
        runs.append(n)
        return "ran"

    def on_failed(sender: object, **kwargs: Any) -> None:
        failed.append(kwargs)

    holder = _in_thread(lambda: locks["default"].acquire(f"{unique_name}:1", timeout=0))
    signals.lock_failed.connect(on_failed)
    try:
        caplog.set_level(logging.INFO, logger="django_redlock")
        assert job(1) is None
        _in_thread(holder.release)
        assert job(1) == "ran"
    finally:
        signals.lock_failed.disconnect(on_failed)
    assert runs == [1]
    assert [f["reason"] for f in failed] == ["busy"]
    skipped = [r for r in caplog.records if r.levelno == logging.INFO and "Skipped" in r.message]
    assert len(skipped) == 1 and f"{unique_name}:1" in skipped[0].message


def test_on_busy_skip_does_not_swallow_the_jobs_own_lock_errors(unique_name: str) -> None:
    """Only the decorator's own acquisition is skipped: a LockNotAcquired raised by the body
    (another lock it takes) propagates."""

    @lock(unique_name + ":outer", timeout=0, on_busy="skip")
    def job() -> None:
        locks["default"].acquire(unique_name + ":inner", timeout=0)

    with locks["default"].lock(unique_name + ":inner"), pytest.raises(LockNotAcquired):
        job()


def test_on_busy_skip_in_concurrent_threads_runs_the_job_once(unique_name: str) -> None:
    """Eight threads start the same job at once: exactly one runs it, seven skip."""
    runs: list[int] = []
    barrier = threading.Barrier(8)
    gate = threading.Event()

    @lock(unique_name, timeout=0, on_busy="skip", reentrant=False)
    def nightly() -> int:
        runs.append(1)
        gate.wait(5)
        return 1

    results: list[int | None] = []

    def start() -> None:
        barrier.wait()
        results.append(nightly())

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    while len(results) < 7:
        threading.Event().wait(0.01)
    gate.set()
    for t in threads:
        t.join(10)
    assert runs == [1] and sorted(results, key=str) == [1] + [None] * 7


def test_on_busy_skip_is_refused_for_a_with_block(unique_name: str) -> None:
    with pytest.raises(ValueError, match="cannot be skipped"), lock(unique_name, on_busy="skip"):
        pass
    with pytest.raises(ValueError, match="on_busy must be 'raise' or 'skip'"):
        lock(unique_name, on_busy="wait")


def test_async_job_skips_and_runs(unique_name: str) -> None:
    """A coroutine job; reentrant=False, since here the busy holder is the same task."""

    @locks["default"].alock(unique_name + ":{job_id}", timeout=0, on_busy="skip", reentrant=False)
    async def job(job_id: int) -> int:
        await asyncio.sleep(0)
        return job_id

    async def main() -> tuple[int | None, int | None]:
        async with locks["default"].alock(f"{unique_name}:4"):
            busy = await job(4)
        return busy, await job(4)

    assert asyncio.run(main()) == (None, 4)


def test_decorated_function_keeps_its_identity() -> None:
    """functools.wraps: task queues that import a function by its path find the wrapper."""

    @lock("x:{0}")
    def nightly_report(day: str) -> None:
        """Docstring."""

    assert nightly_report.__name__ == "nightly_report"
    assert nightly_report.__doc__ == "Docstring."
    assert nightly_report.__wrapped__ is not None  # type: ignore[attr-defined]


def _in_thread(call: Any) -> Any:
    """Run ``call`` in another thread (its lease is then not re-entrant from this one)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    thread.join(10)
    return out[0]


def _active() -> str:
    from django_redlock.locking import context

    lease = context.current_lease()
    assert lease is not None
    return str(lease.name)  # type: ignore[attr-defined]


def test_min_hold_skips_duplicates_that_arrive_after_the_run(unique_name: str) -> None:
    """min_hold: a run that ended keeps the name taken until min_hold after its start, so the
    copy another scheduler sent for the same tick is skipped even when it comes later; a run
    that raised releases at once (another server may retry it)."""
    runs: list[str] = []

    @lock(unique_name + ":{0}", ttl=5, timeout=0, on_busy="skip", min_hold=1.0)
    def tick(n: str, fail: bool = False) -> str:
        runs.append(n)
        if fail:
            raise RuntimeError("job failed")
        return n

    assert tick("a") == "a"
    assert _in_thread(lambda: tick("a")) is None  # later, same tick: skipped
    ttl = locks["default"].acquire
    with pytest.raises(LockNotAcquired) as info:
        ttl(f"{unique_name}:a", timeout=0)
    assert info.value.retry_after is not None and info.value.retry_after <= 1.0
    threading.Event().wait(1.1)
    assert tick("a") == "a"  # the next tick runs
    with pytest.raises(RuntimeError):
        tick("b", fail=True)
    assert tick("b") == "b"  # the failed run did not hold the name
    assert runs == ["a", "a", "b", "b"]


def test_min_hold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="min_hold must be > 0"):
        lock("x", min_hold=0)
    with pytest.raises(TypeError, match="min_hold must be a number"):
        lock("x", min_hold="60")
