"""Celery tasks that run under a lock: :class:`LockedTask` (needs the ``celery`` extra).

::

    @app.task(base=LockedTask, lock_name="report:{day}", lock_on_busy="retry", max_retries=None)
    def build_report(day): ...

The task body runs inside ``locks[lock_using].lock(name, ...)``: one attempt, auto-extended
until the body returns (at most the task's hard time limit), so its FencedModel writes carry
the lease's fencing token. A worker process that dies (SIGKILL, OOM) renews nothing, and the
name is free again within one TTL.

Task options (class attributes, or keyword arguments of ``@app.task``):

* ``lock_name``: a template over the task's arguments, as for ``@lock``: ``"report:{0}"`` or
  ``"report:{day}"`` (default: the task's name, one run at a time whatever the arguments);
* ``lock_using``: the ``REDLOCK`` alias (``"default"``);
* ``lock_ttl``: the lease TTL in seconds (default: the alias's ``TTL``);
* ``lock_on_busy``: ``"skip"`` (the run returns None without calling the body, logged at INFO),
  ``"retry"`` (``self.retry()`` with a countdown of the holder's remaining TTL; retries count
  against ``max_retries``, so set ``max_retries=None`` to wait for as long as it takes) or
  ``"raise"`` (the task fails with ``LockNotAcquired``). ``NodesUnavailable`` always fails it;
* ``lock_min_hold``: after a run that ends without an exception, the name stays taken until
  that many seconds after the run started, so a copy of the same run (two beat schedulers, a
  redelivered message) is busy, even once the first run has finished;
* ``lock_enqueue_once``: ``apply_async()``/``delay()`` send nothing and return None while an
  earlier message for the same name is queued and not started yet (a marker lock
  ``"<name>:enqueued"`` held for at most ``lock_enqueue_ttl`` seconds, and never past the
  message's ``expires``, released by the worker when the task starts, before the lock of the
  run is taken, or when it discards the message as revoked or expired). Such a task cannot be
  a member of a group, chord or chain: sending it there raises ValueError;
* ``lock_limits``: ``{template: permits}``, e.g. ``{"api:global": 20, "api:tenant:{tenant}":
  2}``: the run also takes one permit of each semaphore (templates filled from the task's
  arguments as ``lock_name`` is), all or nothing (``limits()``), auto-extended like the lock.
  A full semaphore makes the run busy: ``lock_on_busy`` applies. Without ``lock_name`` such a
  task takes no lock (only the permits), so runs go on side by side up to the limits.

A redelivered message (``delivery_info["redelivered"]``: its run died before acknowledging it,
with ``acks_late``) that finds the name busy waits up to the holder's remaining TTL (at most
one lease TTL) before ``lock_on_busy`` applies: the holder is most likely the run that died,
whose lease nobody renews. A full ``lock_limits`` semaphore is waited for the same way.
In eager mode (``apply()``, ``task_always_eager``) ``"retry"``
raises LockNotAcquired: Celery's eager retry would run the task again at once, recursing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from celery import Task
from celery.signals import task_revoked

from ..exceptions import LockError, LockNotAcquired
from ..locking import context
from ..locking.manager import LockManager
from ..locking.registry import locks
from ..locking.templates import CallTemplate
from ..validation import check_name
from .celery_checks import (
    ON_BUSY_CHOICES,
    canvas_message,
    check_options,
    members,
    seconds_to_expiry,
)

__all__ = ["ENQUEUED_HEADER", "ON_BUSY_CHOICES", "LockedTask"]

#: The message header that carries the enqueue marker's name and owner to the worker.
ENQUEUED_HEADER = "redlock_enqueued"
#: Suffix of the marker lock that ``lock_enqueue_once`` holds while a message is queued.
ENQUEUED_SUFFIX = ":enqueued"
#: A redelivered run waits this much longer than the holder's remaining TTL (the round trips
#: of its attempts, the nodes' expiry cycle), so the attempt after the expiry is made.
REDELIVERY_SLACK = 0.5

logger = logging.getLogger("django_redlock")  # docs/index.md: one logger name
#: what taking the permits of ``lock_limits`` returns when the run may go on
_HELD = object()


class LockedTask(Task):  # type: ignore[misc]  # celery ships no type hints
    """A Celery task base whose body runs while it holds a lock (see the module docstring).

    Options are checked when the task class is created (``@app.task`` or a subclass), before
    any network call."""

    #: lock name template over the task's arguments; None: the task's name
    lock_name: str | None = None
    #: the ``REDLOCK`` alias
    lock_using: str = "default"
    #: lease TTL in seconds; None: the alias's ``TTL``
    lock_ttl: float | None = None
    #: what a run does when the name is busy: ``"skip"``, ``"retry"`` or ``"raise"``
    lock_on_busy: str = "skip"
    #: keep the name taken this many seconds after a run started (once per schedule tick)
    lock_min_hold: float | None = None
    #: do not send a message while an earlier one for the same name is queued, not started
    lock_enqueue_once: bool = False
    #: how long the enqueue marker may outlive a message that never starts, seconds
    lock_enqueue_ttl: float = 3600.0
    #: ``{template: permits}``: a permit of each semaphore too (see the module docstring)
    lock_limits: dict[str, int] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_options(cls)

    # -- the worker side -------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the body under the lock (Celery's worker calls this when it is overridden)."""
        self._release_enqueue_marker(self.request)
        manager = locks[self.lock_using]
        # Run by a worker (or apply()), the request is pushed already and the body is run();
        # called like a function, Celery's own __call__ pushes a request around run().
        body = self.run if self.request_stack.top is not None else super().__call__
        if self.lock_limits and self.lock_name is None:  # permits only, no lock
            with contextlib.ExitStack() as stack:
                busy = self._enter_limits(stack, manager, args, kwargs)
                return busy if busy is not _HELD else body(*args, **kwargs)
        name = self._lock_template().fill(args, kwargs)
        with contextlib.ExitStack() as stack:
            held = self._enter(
                stack,
                manager,
                lambda timeout: self._block(manager, name, timeout),
                "lock %r (alias %r) is held, most likely by its run that died",
            )
            if held is not _HELD:
                return held
            if self.lock_limits:
                busy = self._enter_limits(stack, manager, args, kwargs)
                if busy is not _HELD:
                    return busy
            return body(*args, **kwargs)

    def _enter_limits(
        self, stack: contextlib.ExitStack, manager: LockManager, args: Any, kwargs: Any
    ) -> Any:
        """Take a permit of each ``lock_limits`` semaphore into ``stack`` (one attempt; a
        redelivered run waits for a dead run's permits as for its lock): :data:`_HELD`, or
        what a busy run returns (``lock_on_busy``)."""
        templates = {
            CallTemplate(template, self.run).fill(args, kwargs): template
            for template in self.lock_limits or {}
        }
        limits = {name: (self.lock_limits or {})[template] for name, template in templates.items()}

        def block(timeout: float) -> Any:
            made = manager.limits(limits, timeout=timeout, **self._held_until_time_limit())
            made.order_templates = templates  # the lock-order checker's shapes
            return made

        return self._enter(
            stack,
            manager,
            block,
            "semaphore %r (alias %r) is full, most likely with a permit of its run that died",
        )

    def _enter(
        self,
        stack: contextlib.ExitStack,
        manager: LockManager,
        block: Callable[[float], Any],
        why: str,
    ) -> Any:
        """Enter ``block(timeout)`` into ``stack`` in one attempt; a redelivered run whose
        dead run may still hold what it needs waits for that to expire (``why``: what is
        busy, with the name and alias to fill). :data:`_HELD`, or what a busy run returns."""
        try:
            stack.enter_context(block(0))
        except LockNotAcquired as exc:
            wait = self._redelivery_wait(manager, exc)
            if wait is None:
                return self._busy(manager, exc.name, exc)
            logger.info(
                "Task %s[%s] was redelivered and " + why + ": waiting up to %.1f s for it to "
                "expire",
                self.name,
                self.request.id,
                exc.name,
                manager.alias,
                wait,
            )
            try:
                stack.enter_context(block(wait))
            except LockNotAcquired as again:
                return self._busy(manager, again.name, again)
        return _HELD

    def _block(self, manager: LockManager, name: str, timeout: float) -> Any:
        """The lock block of one run."""
        block = manager.lock(
            name, timeout=timeout, min_hold=self.lock_min_hold, **self._held_until_time_limit()
        )
        block.order_template = self._lock_template().template  # the lock-order checker's shape
        return block

    def _held_until_time_limit(self) -> dict[str, Any]:
        """What every run's block shares: its TTL, auto-extended until the hard time limit."""
        return {"ttl": self.lock_ttl, "auto_extend": True, "max_hold": self._hard_time_limit()}

    def _lease_ttl(self, manager: LockManager) -> float:
        return manager.config.ttl if self.lock_ttl is None else self.lock_ttl

    def _redelivery_wait(self, manager: LockManager, exc: LockNotAcquired) -> float | None:
        """How long a busy run waits before ``lock_on_busy`` applies: None (not at all), or,
        for a redelivered message, the holder's remaining TTL plus a little.

        A message is redelivered when the run that had it did not acknowledge it (its worker
        died: ``acks_late`` with ``reject_on_worker_lost``, or a broker's visibility timeout).
        That run may have died holding the name, and its lease (renewed by nobody) expires
        within its remaining TTL; a live holder renews its lease, so the wait ends without it
        and the run is busy as usual. Usually one TTL is left at most, but a body that
        re-entered its lock asking a longer ``ttl`` left a longer lease: the wait covers
        whatever is left. With ``lock_min_hold``, a holder with more than one TTL left may be
        the hold of a run that finished (its acknowledgement lost): running again would run
        the job twice, so that case is busy as usual (logged at WARNING)."""
        if self.request.is_eager or not (self.request.delivery_info or {}).get("redelivered"):
            return None
        ttl = self._lease_ttl(manager)
        left = ttl if exc.retry_after is None else exc.retry_after
        if left > ttl and self.lock_min_hold is not None:
            logger.warning(
                "Task %s[%s] was redelivered and its lock is held for %.1f s more, longer than "
                "its lock_ttl: a lock_min_hold of a finished run, or a run that died after "
                "re-entering its lock with a longer ttl; not waiting (lock_on_busy applies)",
                self.name,
                self.request.id,
                left,
            )
            return None
        return left + REDELIVERY_SLACK

    def _busy(self, manager: LockManager, name: str, exc: LockNotAcquired) -> Any:
        """The name is busy: skip (None), retry after the holder's TTL, or raise."""
        if self.lock_on_busy == "raise":
            raise exc
        if self.lock_on_busy == "retry":
            if self.request.is_eager:
                # Celery's eager retry runs the task again at once (no countdown): each busy
                # attempt would call the next one until RecursionError.
                raise exc
            countdown = self._lease_ttl(manager) if exc.retry_after is None else exc.retry_after
            raise self.retry(countdown=countdown, exc=exc)
        left = "" if exc.retry_after is None else f" (its holder has {exc.retry_after:.1f} s left)"
        logger.info(
            "Skipped task %s[%s]: lock %r (alias %r) is busy%s",
            self.name,
            self.request.id,
            name,
            manager.alias,
            left,
        )
        return None

    def _hard_time_limit(self) -> float | None:
        """The hard time limit of this run (the worker kills the process then): renewals stop
        there. Celery sends ``timelimit`` as ``(hard, soft)``."""
        hard, _soft = self.request.timelimit or (None, None)
        limit = hard or self.time_limit or self.app.conf.task_time_limit
        return float(limit) if limit else None

    def _lock_template(self) -> CallTemplate:
        template: CallTemplate | None = self.__dict__.get("_redlock_template")
        if template is None:
            text = self.lock_name
            if text is None:  # the task's name, literally
                text = str(self.name).replace("{", "{{").replace("}", "}}")
            template = CallTemplate(text, self.run)
            self.__dict__["_redlock_template"] = template
        return template

    # -- enqueue-time de-duplication -------------------------------------------------------
    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send the task; with ``lock_enqueue_once``, return None without sending while an
        earlier message for the same lock name is queued and not started yet."""
        headers = options.get("headers")
        if headers and ENQUEUED_HEADER in headers:  # a retry copies the first message's
            options["headers"] = {k: v for k, v in headers.items() if k != ENQUEUED_HEADER}
        if options.get("retries"):  # a retry of a message that was accepted
            return super().apply_async(args, kwargs, **options)
        self._refuse_canvas(options)
        if not self.lock_enqueue_once:
            return super().apply_async(args, kwargs, **options)
        name = self._lock_template().fill(tuple(args or ()), dict(kwargs or {})) + ENQUEUED_SUFFIX
        manager = locks[self.lock_using]
        ttl = self.lock_enqueue_ttl
        expires = seconds_to_expiry(options.get("expires", self.expires), self.app.now())
        if expires is not None:  # a message that expired can never start: nothing to wait for
            ttl = max(MIN_MARKER_TTL, min(ttl, expires))
        try:
            marker = manager.acquire(name, ttl=ttl, timeout=0)
        except LockNotAcquired:
            logger.info(
                "Not sending task %s: lock %r (alias %r) says an earlier message is still queued",
                self.name,
                name,
                manager.alias,
            )
            return None
        context.deactivate(marker)  # the marker fences none of the sender's writes
        # The worker releases the marker with its owner value (compare-and-delete, as the
        # sender's release would): whoever reads the message can release this marker, and
        # nothing else.
        value = [marker.name, marker.record.owner]
        options["headers"] = {**(options.get("headers") or {}), ENQUEUED_HEADER: value}
        try:
            return super().apply_async(args, kwargs, **options)
        except BaseException:
            with contextlib.suppress(LockError):  # not sent: the next send may go at once
                marker.release()
            raise

    def _refuse_canvas(self, options: dict[str, Any]) -> None:
        """Raise ValueError when a ``lock_enqueue_once`` task is sent as a member of a group,
        chord or chain, or when this task is the first of a chain (or a chord header member)
        whose later members include one, before anything is sent.

        A suppressed member would send nothing, so the canvas would wait for its result
        forever. A group or chord header member carries ``group_id``; a chain member carries
        ``chain`` (its later members, possibly none); a chord header member carries
        ``chord`` (the body)."""
        if self.lock_enqueue_once:
            if options.get("group_id") or options.get("chord"):
                role = "group or chord"
            elif "chain" in options:
                role = "chain"
            else:
                return
            raise ValueError(canvas_message(str(self.name), role))
        later = [*(options.get("chain") or ()), options.get("chord")]
        for member in members(later):
            task = self.app.tasks.get(str(member.get("task")))
            if getattr(task, "lock_enqueue_once", False) is True:
                raise ValueError(canvas_message(str(member.get("task")), "chain or chord"))

    def _release_enqueue_marker(self, request: Any) -> None:
        """Release the marker of ``lock_enqueue_once`` that came with this message (``request``:
        its Celery request), so the next message is accepted as soon as this run starts or
        the worker discards this one."""
        value = (getattr(request, "headers", None) or {}).get(ENQUEUED_HEADER) or getattr(
            request, ENQUEUED_HEADER, None
        )
        if not value:
            return
        try:
            name, owner = check_name(value[0]), str(value[1])
        except (TypeError, ValueError, IndexError, KeyError):
            logger.warning(
                "Task %s[%s]: malformed %s header", self.name, request.id, ENQUEUED_HEADER
            )
            return
        try:  # compare-and-delete: only a marker of that owner
            locks[self.lock_using].release_owned(name, owner)
        except (LockError, OSError) as exc:  # it expires on its own after lock_enqueue_ttl
            logger.warning(
                "Task %s[%s]: enqueue marker %r not released: %s", self.name, request.id, name, exc
            )


#: The shortest marker TTL (a message sent with an ``expires`` already past).
MIN_MARKER_TTL = 0.01


def _release_marker_of_discarded(sender: Any = None, request: Any = None, **_: Any) -> None:
    """The worker discarded a message (revoked, or expired before it started): release its
    ``lock_enqueue_once`` marker, which no run will release. Compare-and-delete with the
    message's owner value, so it is harmless for a message whose run had started."""
    if isinstance(sender, LockedTask) and request is not None:
        sender._release_enqueue_marker(request)


task_revoked.connect(
    _release_marker_of_discarded, weak=False, dispatch_uid="django_redlock.contrib.celery.revoked"
)
