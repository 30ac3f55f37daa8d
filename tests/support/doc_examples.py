"""The README's and docs' Python examples, and what runs them as written.

An example runs in a namespace holding the names it takes from the reader's project without
defining them (``tenant``, ``run_export``, ``Product``, ``app``...): :data:`STAND_INS` makes
each. A block that cannot run here says why in a comment on the line before its fence::

    <!-- example: not run: python-redis-lock's code (the "before" of a migration) -->

A stand-in may end an example that would otherwise run forever (a consumer loop): it raises
:class:`Ended`, which the runner accepts as the end of the example.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from django.utils.module_loading import import_string

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
NOT_RUN = re.compile(r"<!-- example: not run: (.+?) -->\s*$")


@dataclass(frozen=True)
class Example:
    where: str
    code: str
    #: why it does not run here ("" when it runs)
    not_run: str


def examples() -> list[Example]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = NOT_RUN.search(before)
            found.append(
                Example(
                    f"{page.relative_to(ROOT)}:{line}",
                    textwrap.dedent(match.group(2)),
                    marker.group(1) if marker else "",
                )
            )
    return found


class Ended(Exception):
    """Raised by a stand-in to end an example that would run on (see the module's text)."""


class Calls:
    """A function of the reader's project: records each call's arguments, returns ``value``
    (or raises :class:`Ended` once called ``end_after`` times)."""

    def __init__(self, value: Any = None, end_after: int | None = None) -> None:
        self.value, self.end_after = value, end_after
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        if self.end_after is not None and len(self.calls) > self.end_after:
            raise Ended
        return self.value


class AsyncCalls(Calls):
    async def __call__(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().__call__(*args, **kwargs)


def _django(path: str) -> Callable[[], Any]:
    return lambda: import_string(path)


def _model(name: str) -> Callable[[], Any]:
    return _django(f"tests.docs_app.models.{name}")


def _product() -> Any:
    from tests.docs_app.models import Product

    return Product.objects.create(stock=10)


def _pk() -> int:
    """The primary key of a product and of an invoice (an example claims one of them)."""
    from tests.docs_app.models import Invoice

    pk: int = _product().pk
    Invoice.objects.create(pk=pk, total=0)
    return pk


def _celery_app() -> Any:
    """A Celery app of the example's own: its tasks are not shared with other apps (Celery
    shares a task with every app by default, and the suite's own apps would get them)."""
    from celery import Celery

    class ExampleApp(Celery):  # type: ignore[misc]
        def task(self, *args: Any, **options: Any) -> Any:
            options.setdefault("shared", False)
            return super().task(*args, **options)

    return ExampleApp("doc_examples", set_as_current=False)


def _debug_toolbar() -> Any:
    import debug_toolbar.settings

    return debug_toolbar


def _rq_queue() -> Any:
    import rq
    from django.conf import settings
    from redis import Redis

    return rq.Queue(
        "doc-examples", connection=Redis.from_url(settings.REDLOCK["default"]["NODES"][0])
    )


#: The reader's functions an example calls: each a :class:`Calls` returning None.
_FUNCTIONS = (
    "run_export",
    "call_the_api",
    "serve_from_cache",
    "rebuild_cache",
    "build_report",
    "do_rebuild",
    "handle",
    "stop_consuming",
    "load_prices",
)

#: How to make each name an example may take from the reader's project.
STAND_INS: dict[str, Callable[[], Any]] = {
    # the reader's functions and objects
    **dict.fromkeys(_FUNCTIONS, Calls),
    "compute_total": lambda: Calls(100),
    "build": lambda: Calls("the report"),
    "expensive_query": lambda: Calls({"rows": 3}),
    "fetch_report": lambda: AsyncCalls({"rows": 3}),
    "next_message": lambda: Calls("a message", end_after=3),
    "tenant": lambda: SimpleNamespace(pk=7),
    "provider": lambda: SimpleNamespace(has_charge=Calls(False), charge=Calls()),
    "app": _celery_app,
    "queue": _rq_queue,
    # the reader's models (tests/docs_app) and rows
    "Product": _model("Product"),
    "Order": _model("Order"),
    "Invoice": _model("Invoice"),
    "Report": _model("Report"),
    "Export": _model("Export"),
    "product": _product,
    "pk": _pk,
    "cart": lambda: [_product().pk, _product().pk],
    # imports an example leaves out because the page's text names them
    "locks": _django("django_redlock.locks"),
    "request_lock": _django("django_redlock.decorators.request_lock"),
    "LockedTask": _django("django_redlock.contrib.celery.LockedTask"),
    "StaleTokenError": _django("django_redlock.exceptions.StaleTokenError"),
    "transaction": _django("django.db.transaction"),
    "models": _django("django.db.models"),
    "path": _django("django.urls.path"),
    "include": _django("django.urls.include"),
    "JsonResponse": _django("django.http.JsonResponse"),
    "csrf_exempt": _django("django.views.decorators.csrf.csrf_exempt"),
    "require_POST": _django("django.views.decorators.http.require_POST"),
    "override_settings": _django("django.test.override_settings"),
    "User": _django("django.contrib.auth.models.User"),
    "debug_toolbar": _debug_toolbar,
}
