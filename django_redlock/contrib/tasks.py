"""Unique tasks of Django's task framework (``django.tasks`` on Django >= 6, else the
``django-tasks`` backport): :func:`unique_task`.

::

    @unique_task("report:{day}", until="finished")
    @task()
    def build_report(day): ...

    build_report.enqueue("2026-11-24")  # sends a task, or returns the queued one's TaskResult

``unique_task`` goes over ``@task()`` and returns the same task (a copy of the task's class
whose ``enqueue``/``aenqueue`` are unique): workers run it, ``using()``, ``call()`` and
``get_result()`` work as before. See docs/effects.md ("Unique tasks") for what it guarantees.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import logging
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from ..engine import RESERVED_MARK
from ..jobs.unique import (
    DEFAULT_ENQUEUE_TIMEOUT,
    DEFAULT_QUEUED_TTL,
    OVER,
    QUEUED,
    RUNNING,
    UNTIL_CHOICES,
    Found,
    UniqueRule,
)
from ..locking.templates import CallTemplate


def _framework(module: str) -> Any:
    """A module of Django's task framework: ``django.tasks`` (Django >= 6), else the
    ``django-tasks`` backport's twin."""
    try:
        return importlib.import_module(f"django.{module}")
    except ImportError:
        return importlib.import_module(f"django_{module}")


Task: Any = _framework("tasks.base").Task
TaskResultStatus: Any = _framework("tasks.base").TaskResultStatus
TaskResultDoesNotExist: Any = _framework("tasks.exceptions").TaskResultDoesNotExist
_signals = _framework("tasks.signals")
ImmediateBackend: Any = _framework("tasks.backends.immediate").ImmediateBackend
BaseTaskBackend: Any = _framework("tasks.backends.base").BaseTaskBackend
logger = logging.getLogger("django_redlock")  # docs/index.md: one logger name


def _normalizer() -> Any:
    """The framework's own ``normalize_json`` (what backends apply to a task's arguments)."""
    try:
        return importlib.import_module("django.utils.json").normalize_json
    except (ImportError, AttributeError):
        return importlib.import_module("django_tasks.utils").normalize_json


_normalize_json: Any = _normalizer()

__all__ = ["UNTIL_CHOICES", "UniqueTask", "unique_task"]

_CLASSES: dict[type, type] = {}


def unique_task(
    template: str,
    until: str = "started",
    using: str = "default",
    *,
    queued_ttl: float = DEFAULT_QUEUED_TTL,
    ttl: float | None = None,
    timeout: float | None = DEFAULT_ENQUEUE_TIMEOUT,
) -> Any:
    """Make ``.enqueue(...)`` of a task send nothing while a task of the same key (``template``
    filled from the enqueue's arguments, as ``@lock`` fills names) is queued, or running with
    ``until="finished"``; it returns that task's ``TaskResult`` then.

    ``using``: the ``REDLOCK`` alias of the marker; ``queued_ttl``: how long a queued task
    holds its key without a worker starting it; ``ttl``: the running marker's lease TTL
    (``until="finished"``; default: the alias's ``TTL``); ``timeout``: how long an enqueue
    waits for another process's enqueue of the same key. Options are checked here."""
    if not isinstance(template, str):
        raise TypeError(f"unique_task needs a key template (str), not {type(template).__name__}.")
    if template.startswith(RESERVED_MARK):
        raise ValueError(
            f"The key template {template[:40]!r} starts with {RESERVED_MARK!r}, which is "
            f"reserved for django-redlock's own keys; choose another template."
        )
    rule = UniqueRule(until, using, queued_ttl, ttl, timeout)

    def wrap(task: Any) -> Any:
        if not isinstance(task, Task):
            raise TypeError(
                f"unique_task goes over a task of Django's task framework (@task()), not "
                f"{type(task).__name__}: write @unique_task(...) above @task()."
            )
        if isinstance(task, UniqueTask):
            raise TypeError("This task is a unique task already: apply unique_task once.")
        keys = CallTemplate(template, _enqueue_signature(task))
        fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.init}
        return _unique_class(type(task))(**fields, unique=_Unique(rule, keys))

    return wrap


@dataclasses.dataclass(frozen=True)
class _Unique:
    """A unique task's rule and key template."""

    rule: UniqueRule
    keys: CallTemplate

    def key(self, args: Any, kwargs: Any) -> str:
        return self.keys.fill(tuple(args), dict(kwargs))


class UniqueTask:
    """The methods a unique task's class adds to its task class (see :func:`unique_task`)."""

    unique: _Unique

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        """Send the task, or return the ``TaskResult`` of the one that holds its key."""
        key = self.unique.key(_as_stored(args), _as_stored(kwargs))
        parent: Any = super()

        _check_backend(self.get_backend())  # type: ignore[attr-defined]

        def send() -> tuple[str | None, Any]:
            result = parent.enqueue(*args, **kwargs)
            if result.is_finished:  # it ran inside the enqueue (ImmediateBackend): no marker
                return None, result
            return str(result.id), result

        return self.unique.rule.enqueue_once(key, self._lookup, send)

    async def aenqueue(self, *args: Any, **kwargs: Any) -> Any:
        """Asyncio twin of :meth:`enqueue` (the enqueue runs in a thread)."""
        return await sync_to_async(self.enqueue)(*args, **kwargs)

    def _lookup(self, ident: str) -> Found[Any]:
        try:
            result = self.get_backend().get_result(ident)  # type: ignore[attr-defined]
        except TaskResultDoesNotExist:
            return Found(OVER)
        except NotImplementedError:  # ImmediateBackend: the marker is another backend's task
            return Found(OVER)
        if result.status == TaskResultStatus.READY:
            return Found(QUEUED, result)
        if result.status == TaskResultStatus.RUNNING:
            started = result.started_at or result.last_attempted_at
            ago = None if started is None else (datetime.now(UTC) - started)
            return Found(RUNNING, result, None if ago is None else ago.total_seconds())
        return Found(OVER, result)


def _check_backend(backend: Any) -> None:
    """Refuse, before sending, a backend whose tasks a later enqueue could not find by id
    (every enqueue after the first would fail for ``queued_ttl``); ImmediateBackend runs the
    task inside the enqueue, so nothing is queued and no marker written."""
    if isinstance(backend, ImmediateBackend) or backend.supports_get_result:
        return
    if type(backend).get_result is not BaseTaskBackend.get_result:  # DummyBackend
        return
    raise ImproperlyConfigured(
        f"unique_task needs a task backend that can find a task by its id (get_result): "
        f"{type(backend).__name__} (alias {backend.alias!r}) cannot, so an enqueue could not "
        f"tell whether the queued task still holds its key. Use a backend with results "
        f"(django-tasks' DatabaseBackend, ImmediateBackend), or a plain @task()."
    )


def _enqueue_signature(task: Any) -> Any:
    """What ``enqueue`` takes: the task function, without its context parameter when it takes
    one (the template names the enqueue's arguments)."""
    if not task.takes_context:
        return task.func
    signature = inspect.signature(task.func)

    def enqueued(*args: Any, **kwargs: Any) -> None:
        """Stands for the task function minus its context."""

    enqueued.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=list(signature.parameters.values())[1:]
    )
    enqueued.__qualname__ = task.func.__qualname__
    return enqueued


def _unique_class(base: type) -> type:
    """The unique twin of a task class (one per class): a dataclass with a ``unique`` field."""
    made = _CLASSES.get(base)
    if made is None:
        made = dataclasses.make_dataclass(
            f"Unique{base.__name__}",
            [("unique", _Unique)],
            bases=(UniqueTask, base),
            frozen=True,
            kw_only=True,
        )
        made.__module__ = __name__
        _CLASSES[base] = made
    return made


def _as_stored(value: Any) -> Any:
    """Arguments as the worker gets them back: the framework's ``normalize_json`` (bytes
    decoded, tuples as lists), then a JSON round trip as the backend's storage makes (an Enum
    member becomes its value, a ``True``/``None`` dict key ``"true"``/``"null"``), so the key
    the enqueue fills is the one the worker fills. Objects come back with their keys sorted:
    PostgreSQL's ``jsonb`` reorders them, so the order they were given in is lost. Raises what
    the framework raises for an argument it cannot store, before anything is sent."""
    stored = json.loads(json.dumps(_normalize_json(value)))  # every object key is text now
    return json.loads(json.dumps(stored, sort_keys=True))


def worker_key(task_result: Any) -> str:
    """The key a worker fills for ``task_result`` of a unique task: from its arguments as the
    backend stored them, normalised as the enqueue normalised them."""
    task: UniqueTask = task_result.task
    return task.unique.key(_as_stored(task_result.args), _as_stored(task_result.kwargs))


def _on_started(sender: Any = None, task_result: Any = None, **_: Any) -> None:
    _on_worker_event(task_result, "started")


def _on_finished(sender: Any = None, task_result: Any = None, **_: Any) -> None:
    _on_worker_event(task_result, "finished")


def _on_worker_event(task_result: Any, event: str) -> None:
    """Free or hold a unique task's key when a worker starts or ends it. Never raises (a
    raise here would fail the task, or end the worker): anything wrong is logged and the
    marker expires on its own."""
    task = getattr(task_result, "task", None)
    if not isinstance(task, UniqueTask):
        return
    try:
        unique = task.unique
        key = worker_key(task_result)
        change = unique.rule.started if event == "started" else unique.rule.finished
        change(key, str(task_result.id))
    except Exception:
        logger.exception(
            "Unique task %s: its marker was not changed when it %s", task_result.id, event
        )


_signals.task_started.connect(
    _on_started, weak=False, dispatch_uid="django_redlock.contrib.tasks.started"
)
_signals.task_finished.connect(
    _on_finished, weak=False, dispatch_uid="django_redlock.contrib.tasks.finished"
)
