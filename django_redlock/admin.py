"""The "Locks" admin page: held locks of every alias, node health, and force release.

Reads Redis only through :mod:`django_redlock.inspection`. Force release is a Django admin action
(``actions``, the ``_selected_action`` checkboxes, ``actions.js``) posted to the changelist: a
confirmation page, then a second POST; it needs ``django_redlock.delete_lock``. The locks are not a
queryset, so the changelist renders the action form itself and hands Django's
``response_action`` a :class:`LockSelection` of the posted leases. Each row carries the lease's
token and public fingerprint (``lease_id``), never its owner: the server re-reads the lock and
releases it only if that same lease still holds it.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode
from django.utils.translation import gettext, ngettext

from . import inspection
from .models import Effect, Lock, ScheduledTick
from .schedules.entries import schedule_setting
from .schedules.report import entry_report
from .validation import check_name

if TYPE_CHECKING:
    _LockAdminBase = admin.ModelAdmin[Lock]
else:
    _LockAdminBase = admin.ModelAdmin

logger = logging.getLogger("django_redlock")  # one logger for the app (records carry .module)

#: A lease picked on the list page: (alias, name, token, lease_id).
Target = tuple[str, str, int, str]


def encode_target(info: inspection.LockInfo) -> str:
    """The checkbox value naming one listed lease."""
    return json.dumps([info.alias, info.name, info.token, info.lease_id])


def decode_targets(values: list[str]) -> list[Target]:
    """Parse checkbox values; malformed ones (or ones naming no valid lock name) are dropped."""
    targets: list[Target] = []
    for value in values:
        try:
            alias, name, token, lease = json.loads(value)
            check_name(name)
            for text in (alias, name, lease):
                text.encode("utf-8")  # not a str, or a lone surrogate: malformed
        except (AttributeError, TypeError, ValueError):
            continue
        if type(token) is int:
            targets.append((alias, name, token, lease))
    return targets


class LockSelection(list[Target]):
    """The leases ticked on the list page, standing in for the queryset of Django's action
    machinery: ``response_action`` narrows it with ``filter(pk__in=<ticked values>)``, which
    it already is."""

    def filter(self, **lookups: Any) -> LockSelection:
        return self


def _refusal(alias: str) -> str:
    """Why ``alias`` (from a posted form) cannot be used: unknown, or invalid settings."""
    try:
        known = alias in inspection.aliases()
    except ImproperlyConfigured:
        known = False
    return f"alias {alias!r} has invalid settings" if known else f"unknown alias {alias!r}"


@admin.register(Lock)
class LockAdmin(_LockAdminBase):
    """Lists locks from Redis instead of a table; only the list and release views exist."""

    list_per_page = 50
    actions = ["force_release"]
    change_list_template = "admin/django_redlock/lock/change_list.html"
    release_template = "admin/django_redlock/lock/release_confirmation.html"

    # -- permissions -----------------------------------------------------------------------
    def has_view_permission(self, request: HttpRequest, obj: Lock | None = None) -> bool:
        user = request.user
        return bool(user.is_active and user.is_staff and user.has_perm("django_redlock.view_lock"))

    def has_delete_permission(self, request: HttpRequest, obj: Lock | None = None) -> bool:
        return self.has_view_permission(request) and request.user.has_perm(
            "django_redlock.delete_lock"
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Lock | None = None) -> bool:
        return False

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        """Only :meth:`force_release`: the site-wide "delete selected" needs a queryset."""
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    # -- urls ------------------------------------------------------------------------------
    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        prefix = f"{opts.app_label}_{opts.model_name}"
        return [
            path("", self.admin_site.admin_view(self.changelist_view), name=f"{prefix}_changelist"),
            path(
                "release/", self.admin_site.admin_view(self.release_view), name=f"{prefix}_release"
            ),
        ]

    def _changelist_url(self, **query: Any) -> str:
        url = reverse(f"{self.admin_site.name}:django_redlock_lock_changelist")
        query = {key: value for key, value in query.items() if value}
        return f"{url}?{urlencode(query)}" if query else url

    def _context(self, request: HttpRequest, title: str) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "changelist_url": self._changelist_url(),
        }

    # -- views -----------------------------------------------------------------------------
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Held locks of every alias (a page of them), the node panel and the action form; a
        POST runs the chosen action on the ticked leases."""
        if request.method == "POST" and (
            ACTION_CHECKBOX_NAME in request.POST or "index" in request.POST
        ):  # needs delete_lock (and view_lock); a refusal is logged
            return self._run_action(request, request.POST.getlist(ACTION_CHECKBOX_NAME))
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        query = request.GET.get("q", "").strip()
        try:
            page = max(1, int(request.GET.get("p", "1")))
        except ValueError:
            page = 1
        per_page = self.list_per_page
        result = inspection.list_locks(prefix=query, offset=(page - 1) * per_page, limit=per_page)
        nodes = inspection.node_health()
        rows = [(info, encode_target(info)) for info in result.locks]
        context = {
            **self._context(request, "Locks"),
            **self._action_context(request, len(rows)),
            "rows": rows,
            "errors": result.errors,
            "nodes": nodes,
            "nodes_down": sum(1 for node in nodes if not node.up),
            "query": query,
            "page": page,
            "previous_url": self._changelist_url(q=query, p=page - 1 if page > 2 else None)
            if page > 1
            else None,
            "next_url": self._changelist_url(q=query, p=page + 1) if result.has_more else None,
            **(extra_context or {}),
        }
        return TemplateResponse(request, self.change_list_template, context)

    def _action_context(self, request: HttpRequest, count: int) -> dict[str, Any]:
        """What Django's ``admin/actions.html`` needs (as ``ModelAdmin.changelist_view`` sets
        it), with ``cl`` reduced to the page's rows: there is no total count to select across."""
        choices = self.get_action_choices(request)
        action_form = None
        media = self.media
        if len(choices) > 1:
            action_form = self.action_form(auto_id=None)
            action_form.fields["action"].choices = choices
            media += action_form.media
        return {
            "action_form": action_form,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "actions_selection_counter": self.actions_selection_counter,
            "cl": {"result_count": count, "result_list": range(count)},
            "selection_note": gettext("0 of %(cnt)s selected") % {"cnt": count},
            "selection_note_all": ngettext(
                "%(total_count)s selected", "All %(total_count)s selected", count
            )
            % {"total_count": count},
            "module_name": str(self.model._meta.verbose_name_plural),
            "media": media,
        }

    def _run_action(self, request: HttpRequest, values: list[str]) -> HttpResponse:
        """Django's ``response_action`` on the posted leases (the same form, index and
        messages); then back to the page the form was on."""
        selection = LockSelection(decode_targets(values))
        self._require_delete(request, selection)
        # response_action only narrows the "queryset" with filter(): a LockSelection does that
        response = self.response_action(request, cast("QuerySet[Lock]", selection))
        return response or HttpResponseRedirect(request.get_full_path())

    def release_view(self, request: HttpRequest) -> HttpResponse:
        """The force release at its own URL (kept for forms posting ``selected``): POST only,
        so a GET never changes state; ``post=yes`` confirms."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        values = request.POST.getlist("selected") or request.POST.getlist(ACTION_CHECKBOX_NAME)
        selection = LockSelection(decode_targets(values))
        self._require_delete(request, selection)
        response = self.force_release(request, selection)
        return response or HttpResponseRedirect(self._changelist_url())

    def _require_delete(self, request: HttpRequest, targets: list[Target]) -> None:
        if not self.has_delete_permission(request):
            logger.warning(
                "Force release denied: user %r lacks django_redlock.delete_lock (locks: %s)",
                request.user.get_username(),
                ", ".join(f"{alias}:{name}" for alias, name, _, _ in targets) or "none",
            )
            raise PermissionDenied

    @admin.action(description="Force release selected locks", permissions=["delete"])
    def force_release(self, request: HttpRequest, selection: LockSelection) -> HttpResponse | None:
        """The action: a confirmation page, or with ``post=yes`` the release of each lease."""
        if not selection:
            messages.warning(request, "No locks were selected.")
            return None
        if request.POST.get("post") != "yes":
            return self._confirmation(request, selection)
        for target in selection:
            self._release_one(request, *target)
        return None

    def _confirmation(self, request: HttpRequest, targets: list[Target]) -> HttpResponse:
        rows = []
        for alias, name, token, lease in targets:
            row: dict[str, Any] = {"alias": alias, "name": name, "token": token, "info": None}
            try:
                row["info"], _ = inspection.get_lock(alias, name)
            except ImproperlyConfigured:
                row["refusal"] = _refusal(alias)
            row["same"] = row["info"] is not None and row["info"].lease_id == lease
            rows.append(row)
        context = {
            **self._context(request, "Force release locks?"),
            "rows": rows,
            "selected": [json.dumps(list(target)) for target in targets],
            "action": "force_release",
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, self.release_template, context)

    def _release_one(
        self, request: HttpRequest, alias: str, name: str, token: int, lease: str
    ) -> None:
        user = request.user.get_username()
        try:
            deleted, info = inspection.force_release(alias, name, token, lease)
        except (inspection.InspectionError, ImproperlyConfigured) as exc:
            why = str(exc) if isinstance(exc, inspection.InspectionError) else _refusal(alias)
            logger.warning("Force release by %r refused: %s", user, why)
            messages.error(request, f"Not released: {why}.")
            return
        count = len(info.holders)
        if info.kind == "semaphore":  # every permit; token and owner are the newest permit's
            what = (
                f"semaphore {name!r} on alias {alias!r} ({count} of {info.permits} permits, "
                f"newest token {token}, owner {info.owner})"
            )
        elif info.kind == "read":  # every read lease; the owners are the holders' (masked)
            owners = ", ".join(holder["owner"] for holder in info.holders)
            what = (
                f"the {count} read lease{'s' if count != 1 else ''} of {name!r} on alias "
                f"{alias!r} (owners {owners})"
            )
        else:  # "lock" or "write"
            what = (
                f"{'write lease' if info.kind == 'write' else 'lock'} {name!r} on alias "
                f"{alias!r} (token {token}, owner {info.owner})"
            )
        summary = f"Force-released {what} on {deleted} of {info.nodes_total} nodes."
        logger.warning("%s By %r.", summary, user)
        user_pk = request.user.pk
        assert user_pk is not None  # admin views run for authenticated staff only
        LogEntry.objects.create(
            user_id=user_pk,
            content_type_id=ContentType.objects.get_for_model(Lock, for_concrete_model=False).pk,
            object_id=f"{alias}:{name}",
            object_repr=f"{alias}:{name}"[:200],
            action_flag=DELETION,
            change_message=summary,
        )
        messages.success(request, summary)


class _ReadOnly:
    """An admin of rows only the app writes (under a lease): nobody adds or changes one."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


if TYPE_CHECKING:
    _EffectAdminBase = admin.ModelAdmin[Effect]
else:
    _EffectAdminBase = admin.ModelAdmin


@admin.register(Effect)
class EffectAdmin(_ReadOnly, _EffectAdminBase):
    """The effect ledger (``lease.once``), read-only: a row is written only under a lease.
    Deleting a row (``delete_effect``) makes its effect pending again."""

    list_display = (
        "key",
        "state",
        "token",
        "attempts",
        "alias",
        "lock_name",
        "began_at",
        "done_at",
    )
    list_filter = ("state", "alias")
    search_fields = ("key", "lock_name")
    date_hierarchy = "began_at"
    readonly_fields = (
        "key",
        "alias",
        "state",
        "token",
        "lock_name",
        "attempts",
        "began_at",
        "began_by",
        "done_at",
    )


if TYPE_CHECKING:
    _TickAdminBase = admin.ModelAdmin[ScheduledTick]
else:
    _TickAdminBase = admin.ModelAdmin


@admin.register(ScheduledTick)
class ScheduledTickAdmin(_ReadOnly, _TickAdminBase):
    """What became of each tick of ``REDLOCK_SCHEDULE`` (docs/schedules.md), read-only: the
    scheduler writes these rows under the entry's lease."""

    change_list_template = "admin/django_redlock/scheduledtick/change_list.html"
    list_display = ("entry", "tick", "outcome", "host", "token", "started_at", "finished_at")
    list_filter = ("outcome", "entry")
    search_fields = ("entry", "host", "note")
    date_hierarchy = "tick"
    readonly_fields = (
        "entry",
        "tick",
        "outcome",
        "host",
        "token",
        "started_at",
        "finished_at",
        "note",
    )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The ticks, under a summary of each entry: its last tick, outcome, the host that ran
        it, the next tick and the missed ticks (what ``manage.py redlock schedule`` shows)."""
        context = dict(extra_context or {})
        try:
            context["schedule"] = [entry_report(entry) for entry in schedule_setting()]
        except (ImproperlyConfigured, ImportError, TypeError, ValueError) as exc:
            # a bad REDLOCK_SCHEDULE (or CRON without cronsim): checks E040-E042 name it too
            context["schedule_error"] = str(exc)
        return super().changelist_view(request, context)
