"""django-ninja operations with ``auth=`` (bearer token and API key header)."""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.http import HttpRequest
from ninja import NinjaAPI, Schema, Status
from ninja.security import APIKeyHeader, HttpBearer

from django_redlock.decorators import request_lock

from .models import Payment


def _user_of_token(token: str) -> Any:
    """Tokens are ``token-<username>`` (a test's users)."""
    if not token.startswith("token-"):
        return None
    return get_user_model().objects.filter(username=token.removeprefix("token-")).first()


class Bearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return _user_of_token(token)


class ApiKey(APIKeyHeader):
    param_name = "X-API-Key"

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        return key if key in ("key-alice", "key-bob") else None


api = NinjaAPI(urls_namespace="ninja-api")


class Amount(Schema):
    amount: int = 1


def _pay(request: HttpRequest, order: str, via: str) -> dict[str, Any]:
    who = request.auth  # type: ignore[attr-defined]
    user = who if isinstance(who, get_user_model()) else None
    payment = Payment.objects.create(user=user, order=order, via=via, principal=str(who))
    return {"principal": str(who), "order": order, "payment": payment.pk}


@api.post("/bearer/{order}", auth=Bearer(), response={201: dict}, url_name="ninja-bearer")
@request_lock("pay:{order}", idempotency=True)
def bearer_pay(request: HttpRequest, order: str, body: Amount) -> Status:
    return Status(201, _pay(request, order, "ninja_bearer"))


@api.post("/key/{order}", auth=ApiKey(), response={201: dict}, url_name="ninja-key")
@request_lock("pay:{order}", idempotency=True)
def key_pay(request: HttpRequest, order: str, body: Amount) -> Status:
    return Status(201, _pay(request, order, "ninja_key"))


@api.post("/async/{order}", auth=Bearer(), response={201: dict})
@request_lock("pay:{order}", idempotency=True)
async def async_pay(request: HttpRequest, order: str, body: Amount, pause: float = 0) -> Status:
    if pause:
        await asyncio.sleep(pause)
    return Status(201, await sync_to_async(_pay)(request, order, "ninja_async"))
