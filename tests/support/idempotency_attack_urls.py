"""Test-only URLconf for ``tests/request_locks/test_idempotency_attack.py``: the views of the
outside attack on idempotent requests (template responses, raising and rolled-back views under
rules, CSRF-protected and upload views)."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import Group
from django.db import transaction
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotModified,
    JsonResponse,
)
from django.template import engines
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from django_redlock.decorators import request_lock

RUNS: dict[str, int] = {}
"""How many times each view body ran, by view name."""


def _ran(name: str) -> int:
    RUNS[name] = RUNS.get(name, 0) + 1
    return RUNS[name]


def _template(request: HttpRequest, run: int, status: int) -> TemplateResponse:
    template = engines["django"].from_string("run={{ run }}")
    return TemplateResponse(request, template, {"run": run}, status=status)


def ruled(request: HttpRequest, item_id: int) -> HttpResponse:
    """Made idempotent by a rule; answers with the user it saw."""
    return JsonResponse({"run": _ran("ruled"), "user": str(request.user.pk)}, status=201)


@csrf_exempt
@request_lock("atk:{item_id}", ttl=5, idempotency=True)
def template(request: HttpRequest, item_id: int) -> HttpResponse:
    return _template(request, _ran("template"), 201)


@request_lock("atk:{item_id}", ttl=5, idempotency=True)
async def atemplate(request: HttpRequest, item_id: int) -> HttpResponse:
    return _template(request, _ran("atemplate"), 201)


@csrf_exempt
@request_lock("atk:{item_id}", ttl=5, idempotency=True)
def bad_template(request: HttpRequest, item_id: int) -> HttpResponse:
    """A TemplateResponse whose rendering fails."""
    _ran("bad_template")
    broken = engines["django"].from_string("{% if run.boom %}x{% endif %}")

    class Boom:
        @property
        def boom(self) -> bool:
            raise RuntimeError("rendering failed")

    return TemplateResponse(request, broken, {"run": Boom()}, status=201)


@method_decorator(csrf_exempt, name="dispatch")
@method_decorator(request_lock("cbv:{item_id}", ttl=5, idempotency=True), name="dispatch")
class FormView(View):
    def post(self, request: HttpRequest, item_id: int) -> HttpResponse:
        return _template(request, _ran("cbv"), 400)


@csrf_exempt
def rolled_back(request: HttpRequest, item_id: int) -> HttpResponse:
    """Writes a row, then rolls its (ATOMIC_REQUESTS) transaction back, answering 201."""
    run = _ran("rolled_back")
    Group.objects.create(name=f"g-{item_id}-{run}")
    if request.GET.get("rollback"):
        transaction.set_rollback(True)
    return JsonResponse({"run": run}, status=201)


@csrf_exempt
def missing(request: HttpRequest, item_id: int) -> HttpResponse:
    _ran("missing")
    raise Http404("no such item")


def csrf_protected(request: HttpRequest, item_id: int) -> HttpResponse:
    return JsonResponse({"run": _ran("csrf")}, status=201)


@csrf_exempt
@request_lock("size:{item_id}", ttl=5, idempotency=True)
def sized(request: HttpRequest, item_id: int) -> HttpResponse:
    """Answers ``size`` bytes (and ``headers`` extra 100-byte headers)."""
    _ran("sized")
    response = HttpResponse(b"x" * int(request.GET.get("size", 0)))
    for number in range(int(request.GET.get("headers", 0))):
        response[f"X-Extra-{number}"] = "h" * 100
    return response


@request_lock("size:{item_id}", ttl=5, idempotency=True)
async def asized(request: HttpRequest, item_id: int) -> HttpResponse:
    _ran("asized")
    return HttpResponse(b"x" * int(request.GET.get("size", 0)))


@csrf_exempt
@request_lock("upload:{item_id}", ttl=5, idempotency=True)
def upload(request: HttpRequest, item_id: int) -> HttpResponse:
    """Answers the uploaded file's size and content type."""
    upload = request.FILES["f"]
    return JsonResponse({"run": _ran("upload"), "size": upload.size, "type": upload.content_type})


class ReadPost:
    """A middleware that parses ``request.POST`` before the view (as CsrfViewMiddleware)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(self, request: HttpRequest, *args: object) -> None:
        request.POST  # noqa: B018


@csrf_exempt
@request_lock("bare:{item_id}", ttl=5, idempotency=True)
def bare(request: HttpRequest, item_id: int) -> HttpResponse:
    """Answers without a Content-Type: a 304, or a body whose header was removed."""
    _ran("bare")
    if request.GET.get("kind") == "304":
        response: HttpResponse = HttpResponseNotModified()
        response["ETag"] = '"v1"'
        return response
    response = HttpResponse(b"raw")
    del response["Content-Type"]
    return response


@csrf_exempt
@transaction.atomic
@request_lock("early:{item_id}", ttl=5, idempotency=True, until_commit=False)
def early_release(request: HttpRequest, item_id: int) -> HttpResponse:
    """Releases its plain lock as soon as it returns, inside a transaction it may roll back."""
    run = _ran("early_release")
    if request.GET.get("rollback"):
        transaction.set_rollback(True)
    return JsonResponse({"run": run}, status=201)


urlpatterns = [
    path("early-release/<int:item_id>/", early_release, name="early-release"),
    path("bare/<int:item_id>/", bare, name="bare"),
    path("upload/<int:item_id>/", upload, name="upload"),
    path("sized/<int:item_id>/", sized, name="sized"),
    path("asized/<int:item_id>/", asized, name="asized"),
    path("ruled/<int:item_id>/", ruled, name="ruled"),
    path("template/<int:item_id>/", template, name="template"),
    path("atemplate/<int:item_id>/", atemplate, name="atemplate"),
    path("bad-template/<int:item_id>/", bad_template, name="bad-template"),
    path("cbv/<int:item_id>/", FormView.as_view(), name="cbv"),
    path("rolled-back/<int:item_id>/", rolled_back, name="rolled-back"),
    path("missing/<int:item_id>/", missing, name="missing"),
    path("csrf/<int:item_id>/", csrf_protected, name="csrf"),
]
