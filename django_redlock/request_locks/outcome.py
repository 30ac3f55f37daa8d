"""Whether a rule's view produced the response ``RequestLockMiddleware`` sees.

The middleware wraps the whole rest of the chain: its response may come from the view, from
Django turning the view's exception into a response (``Http404`` -> 404), or from a middleware
that answered without calling the view (``CsrfViewMiddleware``'s 403). Only the first is the
request's answer, to be kept for an idempotent request. The middleware marks the request
pending before the chain, reached in its ``process_view`` (every middleware before it let the
view run) and raised in its ``process_exception``.
"""

from __future__ import annotations

from django.http import HttpRequest

_ATTR = "_redlock_view_outcome"
_PENDING, _REACHED, _RAISED = "pending", "reached", "raised"


def pending(request: HttpRequest) -> None:
    """The middleware is about to run the chain for a rule."""
    request.__dict__[_ATTR] = _PENDING


def reached(request: HttpRequest) -> None:
    """The middleware's ``process_view``: the view is about to run."""
    if request.__dict__.get(_ATTR) == _PENDING:
        request.__dict__[_ATTR] = _REACHED


def raised(request: HttpRequest) -> None:
    """The middleware's ``process_exception``: the view raised."""
    if _ATTR in request.__dict__:
        request.__dict__[_ATTR] = _RAISED


def not_the_views(request: HttpRequest) -> bool:
    """True when a rule's response is not the view's own answer: the view never ran (a
    middleware answered instead) or raised. False for a decorated view, or no rule."""
    return request.__dict__.get(_ATTR) in (_PENDING, _RAISED)
