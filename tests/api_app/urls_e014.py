"""URLs whose locks name a field nobody provides (check E014 inside DRF and ninja views)."""

from __future__ import annotations

from django.http import HttpRequest
from django.urls import path
from ninja import NinjaAPI
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from django_redlock.decorators import request_lock

api = NinjaAPI(urls_namespace="ninja-e014")


@api_view(["POST"])
@request_lock("lacks:{order_id}")
def drf_lacks(request: Request, order: str) -> Response:
    return Response({})


@api.post("/lacks/{order}")
@request_lock("lacks:{order_id}")
def ninja_lacks(request: HttpRequest, order: str) -> dict[str, str]:
    return {}


@api.post("/fine/{order}")
@request_lock("fine:{order}:{amount}")
def ninja_fine(request: HttpRequest, order: str, amount: int = 1) -> dict[str, str]:
    return {}


urlpatterns = [path("drf/<str:order>/", drf_lacks), path("ninja/", api.urls)]
