"""Idempotent requests: the request's key, its lock name and fingerprint, and the kept
response (what is kept, how it is replayed).

A request with the ``REDLOCK_IDEMPOTENCY`` header (``Idempotency-Key``) runs under the lock
``<filled key template>%=<digest>``: the digest is the SHA-256 of the user's id and the header's
value, so two users' keys never meet, and ``%=`` never appears in a filled template value (see
:mod:`.keys`), so no plain request lock has that name (unless a template's own text has
it). Holding that lock, the request finds the kept response of an earlier request
(:mod:`.records`) and answers with it, or runs.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.http.request import RawPostDataException
from django.http.response import HttpResponseBase

from ..conf import MAX_NAME_LENGTH, IdempotencyConfig, idempotency_setting
from .frameworks import principal_id
from .records import Record
from .responses import error_response

AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"
#: Longest header value accepted (characters).
MAX_KEY_LENGTH = 255
#: Separates the filled key template from the key's digest in the lock name.
KEY_MARK = "%="
#: The header on a replayed response.
REPLAYED_HEADER = "Idempotent-Replayed"
#: The status of a request whose key was used with another request (another fingerprint).
MISMATCH_STATUS = 422
#: The status of a retry whose first response was not kept (too large, streaming).
NOT_KEPT_STATUS = 409
_DIGEST = 32
#: Response headers never kept: cookies belong to the request that set them.
_NOT_KEPT_HEADERS = frozenset({"set-cookie", REPLAYED_HEADER.lower()})


class BadKey(Exception):
    """The header's value is empty, too long or not printable ASCII: answered with 400."""

    def response(self, request: HttpRequest) -> HttpResponse:
        return error_response(request, 400, "invalid_idempotency_key", str(self))


@functools.cache
def config() -> IdempotencyConfig:
    """``REDLOCK_IDEMPOTENCY`` (cached; reset when the setting changes); an invalid value
    raises ``ImproperlyConfigured`` (E030) on every call."""
    return idempotency_setting()


@receiver(setting_changed)
def _reset_config(*, setting: str, **kwargs: Any) -> None:
    if setting == "REDLOCK_IDEMPOTENCY":
        config.cache_clear()


def key_of(request: HttpRequest, header: str) -> str | None:
    """The header's value, or None when the request does not carry it; :class:`BadKey` when it
    is empty, longer than :data:`MAX_KEY_LENGTH` or has a character outside printable ASCII."""
    value = request.headers.get(header)
    if value is None:
        return None
    if not value.strip():
        raise BadKey(
            f"The {header} header is empty. Send 1 to {MAX_KEY_LENGTH} printable ASCII "
            "characters, e.g. a UUID."
        )
    if len(value) > MAX_KEY_LENGTH:
        raise BadKey(
            f"The {header} header is longer than {MAX_KEY_LENGTH} characters. Send a shorter "
            "key, e.g. a UUID."
        )
    if not all(" " <= ch <= "~" for ch in value):
        raise BadKey(
            f"The {header} header has a character outside printable ASCII (control "
            "characters and non-ASCII are refused). Send e.g. a UUID."
        )
    return value


def has_user(request: HttpRequest) -> bool:
    """Whether ``request`` has a user to scope its key to. Without one while
    ``AuthenticationMiddleware`` is installed (``RequestLockMiddleware`` placed before it),
    ``ImproperlyConfigured``: every user would share one key space and get each other's kept
    responses (check E017 reports it at startup)."""
    if hasattr(request, "user"):
        return True
    if AUTH_MIDDLEWARE in settings.MIDDLEWARE:
        raise ImproperlyConfigured(
            f"An idempotent request reached RequestLockMiddleware before {AUTH_MIDDLEWARE} "
            "set request.user, so its key cannot be scoped to its user (one user's key would "
            "replay another user's response). Move django_redlock.middleware."
            "RequestLockMiddleware after it in MIDDLEWARE (see django_redlock.E017)."
        )
    return False  # no authentication at all: every request is anonymous


def lock_name(filled: str, key: str, user: Any) -> str:
    """The lock of one key: the filled template, :data:`KEY_MARK`, a digest of user and key."""
    digest = hashlib.sha256(f"{principal_id(user)}\n{key}".encode()).hexdigest()[:_DIGEST]
    suffix = f"{KEY_MARK}{digest}"
    if len(filled) + len(suffix) <= MAX_NAME_LENGTH:
        return filled + suffix
    whole = hashlib.sha256(filled.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{filled[: MAX_NAME_LENGTH - len(suffix) - len(whole) - 2]}%#{whole}{suffix}"


def fingerprint(request: HttpRequest, user: Any) -> str:
    """SHA-256 of the request's method, path (with its query string), body and user id."""
    digest = hashlib.sha256()
    for part in (request.method or "", request.get_full_path(), principal_id(user)):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    digest.update(_body_digest(request))
    return digest.hexdigest()


def _body_digest(request: HttpRequest) -> bytes:
    """The body's SHA-256; a multipart POST body's is taken from its parsed fields and files
    (Django parses no other; a PUT's or PATCH's is its raw bytes)."""
    if request.content_type == "multipart/form-data" and request.method == "POST":
        return _multipart_digest(request)  # Django parses multipart bodies of POSTs only
    try:
        return hashlib.sha256(request.body).digest()
    except RawPostDataException:  # parsed from the stream already (a multipart body)
        return _multipart_digest(request)


def _multipart_digest(request: HttpRequest) -> bytes:
    """A multipart body's fields, and each file's name, content type, size and content.

    Parsed by Django (large files streamed to temporary files), never read whole as
    ``request.body``, which refuses a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``; the same
    whether a middleware parsed it first (CSRF reading ``request.POST``) or not."""
    digest = hashlib.sha256()
    for field, values in sorted(request.POST.lists()):
        digest.update(json.dumps([field, values]).encode())
    for field, files in sorted(request.FILES.lists()):
        for upload in files:
            described = [field, upload.name, upload.content_type, upload.size]
            digest.update(json.dumps(described).encode())
            for chunk in upload.chunks():
                digest.update(chunk)
            upload.seek(0)
    return digest.digest()


def kept_values(
    response: HttpResponseBase, fingerprint: str, max_bytes: int
) -> list[bytes | str] | None:
    """What to keep of ``response`` (the values of ``records.FIELDS``), or None to keep nothing
    (a 5xx: a retry runs again). A streaming response, or a record (body, status and headers)
    over ``max_bytes``, keeps only a marker: the request ran, its response cannot be replayed
    (a retry gets 409)."""
    if response.status_code >= 500:
        return None
    if response.streaming:
        return _not_kept(fingerprint, "streaming")
    body: bytes = response.content  # type: ignore[attr-defined]
    headers = [
        [name, value]
        for name, value in response.headers.items()
        if name.lower() not in _NOT_KEPT_HEADERS
    ]
    meta = {
        "kept": True,
        "status": response.status_code,
        "reason": response.reason_phrase,
        "headers": headers,
    }
    described = json.dumps(meta)
    if len(body) + len(described.encode()) > max_bytes:
        return _not_kept(fingerprint, "too large")
    return [fingerprint, described, body]


def _not_kept(fingerprint: str, why: str) -> list[bytes | str]:
    """The marker of a request that ran but whose response cannot be replayed."""
    return [fingerprint, json.dumps({"kept": False, "why": why}), b""]


def answer(request: HttpRequest, record: Record, fingerprint: str, header: str) -> HttpResponse:
    """The response to a request whose key has a kept record: the replay, or 422 when the key
    was used with another request, or 409 when the first response was not kept."""
    if record.fingerprint != fingerprint:
        return error_response(
            request,
            MISMATCH_STATUS,
            "idempotency_key_reused",
            f"This {header} was already used for a different request (method, path or body). "
            "Send a new key for a new request.",
        )
    meta = json.loads(record.meta)
    if not meta.get("kept"):
        return error_response(
            request,
            NOT_KEPT_STATUS,
            "idempotent_response_not_kept",
            f"The request with this {header} was already done, but its response was not kept "
            f"({meta.get('why', 'not kept')}). It is not run again.",
        )
    response = HttpResponse(record.body, status=meta["status"], reason=meta["reason"])
    del response.headers["Content-Type"]  # HttpResponse's default, unless the original had one
    for name, value in meta["headers"]:
        response.headers[name] = value
    response.headers[REPLAYED_HEADER] = "true"
    return response
