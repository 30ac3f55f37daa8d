"""Django REST framework views, token and JWT authenticated, in each placement."""

from __future__ import annotations

import time
from typing import Any

from django.utils.decorators import method_decorator
from rest_framework import viewsets
from rest_framework.authentication import BaseAuthentication, TokenAuthentication
from rest_framework.decorators import action, api_view, authentication_classes
from rest_framework.decorators import permission_classes as permissions
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework_simplejwt.authentication import JWTAuthentication

from django_redlock.decorators import request_lock

from .models import ApiClient, Payment

AUTH = [TokenAuthentication, JWTAuthentication]


class ClientAuthentication(BaseAuthentication):
    """``X-Client: <name>``: the request is the API client's (not a user's)."""

    def authenticate(self, request: Request) -> tuple[ApiClient, None] | None:
        name = request.META.get("HTTP_X_CLIENT")
        client = ApiClient.objects.filter(name=name).first() if name else None
        return None if client is None else (client, None)


def pay(request: Any, order: str, via: str) -> Response:
    """The effect: one payment row; the answer names the user it was made for."""
    pause = float(request.query_params.get("pause", 0))
    if pause:
        time.sleep(pause)
    user = request.user if not isinstance(request.user, ApiClient) else None
    payment = Payment.objects.create(user=user, order=order, via=via, principal=str(request.user))
    return Response(
        {"user": request.user.username, "order": order, "payment": payment.pk}, status=201
    )


@api_view(["POST"])
@authentication_classes(AUTH)
@permissions([IsAuthenticated])
@request_lock("pay:{order}", idempotency=True)
def under_api_view(request: Request, order: str) -> Response:
    """The decorator under ``@api_view``, as DRF's docs place decorators."""
    return pay(request, order, "under_api_view")


@api_view(["POST"])
@authentication_classes(AUTH)
@permissions([IsAuthenticated])
@request_lock("user-pay:{user.pk}:{order}")
def per_user_lock(request: Request, order: str) -> Response:
    """A ``{user.pk}`` key: one lock per DRF-authenticated user."""
    return pay(request, order, "per_user_lock")


@request_lock("pay:{order}", idempotency=True)
@api_view(["POST"])
@authentication_classes(AUTH)
@permissions([IsAuthenticated])
def above_api_view(request: Request, order: str) -> Response:
    """The decorator above ``@api_view``: it runs before DRF authenticates (refused)."""
    return pay(request, order, "above_api_view")


@api_view(["POST"])
@authentication_classes([*AUTH, ClientAuthentication])
@permissions([IsAuthenticated])
@request_lock("pay:{order}", idempotency=True)
def users_and_clients(request: Request, order: str) -> Response:
    """Users (token) and API clients (``X-Client``) on one view."""
    return pay(request, order, "users_and_clients")


@api_view(["POST"])
@authentication_classes([ClientAuthentication])
@permissions([IsAuthenticated])
def clients_only(request: Request, order: str) -> Response:
    """API clients only (``X-Client``, a header of its own): no lock of its own."""
    return pay(request, order, "clients_only")


class PayView(APIView):
    """``method_decorator`` on an ``APIView`` method."""

    authentication_classes = AUTH
    permission_classes = [IsAuthenticated]

    @method_decorator(request_lock("pay:{order}", idempotency=True))
    def post(self, request: Request, order: str) -> Response:
        return pay(request, order, "method_decorator")


class DirectPayView(APIView):
    """The decorator straight on an ``APIView`` method (its first argument is the view)."""

    authentication_classes = AUTH
    permission_classes = [IsAuthenticated]

    @request_lock("pay:{order}", idempotency=True)
    def post(self, request: Request, order: str) -> Response:
        return pay(request, order, "method")


class OrderViewSet(viewsets.ViewSet):
    """A ViewSet action and a ViewSet method."""

    authentication_classes = AUTH
    permission_classes = [IsAuthenticated]

    @request_lock("pay:{pk}", idempotency=True)
    def update(self, request: Request, pk: str) -> Response:
        return pay(request, pk, "viewset")

    @action(detail=True, methods=["post"])
    @request_lock("pay:{pk}", idempotency=True, limits={"settle:{pk}": 2})
    def settle(self, request: Request, pk: str) -> Response:
        return pay(request, pk, "action")
