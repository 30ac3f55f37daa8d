"""``manage.py redlock list|show|release|clear|nodes|run|prune-tombstones|effects|order``:
inspect and clear held locks, run a command under a lock (``run``: see
:mod:`django_redlock.jobs.runner` for its exit statuses), delete old FencedModel tombstones
(``prune-tombstones``), list the effect ledger (``effects``) and the lock-order checker's
records (``order``; ``--check``: exit status 3 when an inverted pair or a cycle is recorded).

Reads Redis only through :mod:`django_redlock.inspection`. The result is printed first; then, if a
node could not be reached, an alias's settings are broken or the name is not held, a one-line
error on stderr and exit status 1. With ``--json``, an error that comes before the result prints
``{"error": "<that line>", "code": "<kind>"}`` on stdout instead of the result.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import ModuleType
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import inspection
from ...fencing import tombstones
from ...inspection import LockInfo, NodeError, NodeHealth
from ...locking.ordering import shared as order_records
from ...locking.registry import locks
from .. import job_commands
from ..arguments import add_subcommands
from ..effects import EFFECT_HEADERS, effect_document, effect_row, ledger_rows
from ..failures import Failure, first_failure
from ..order import ORDER_HEADERS, OrderReport, inverted_details, order_document, order_row
from ..rendering import (
    HOLDER_HEADERS,
    LOCK_HEADERS,
    NODE_HEADERS,
    holder_rows,
    lock_row,
    node_row,
    printable,
    released_what,
    table,
)

#: Subcommands that run under ``simulate`` too (they take locks, or read only the database).
LIVE = ("run", "leader", "scheduler", "schedule")
#: ``clear`` lists and releases locks in batches of this many names.
CLEAR_BATCH = 500
#: ``order --check``: the exit status when an inverted pair is recorded (1 is an error).
ORDER_INVERTED_STATUS = 3


#: ``code`` of the ``--json`` error document for each refusal of ``inspection.force_release``.
RELEASE_CODES = {
    inspection.NotHeld: "not_held",
    inspection.HolderChanged: "holder_changed",
    inspection.Unreachable: "unreachable",
}


def _check_encodable(options: dict[str, Any]) -> None:
    """A name or prefix from the command line that is not valid UTF-8 (a shell's raw bytes,
    which Python's argv turns into lone surrogates) fails here, before any network call."""
    for option in ("name", "prefix"):
        value = options.get(option)
        if not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Failure(
                f"The {option} {printable(value)} is not valid UTF-8 (byte "
                f"{printable(value[exc.start])} at position {exc.start}); lock names are "
                "UTF-8 text: pass the character itself, or \\u escapes in $'...'.",
                "bad_name",
            ) from None


#: The most ``prune-tombstones --days`` takes: 100 years (more would overflow the cutoff date).
MAX_PRUNE_DAYS = 36525


def _simulation_support() -> ModuleType | None:
    """``django_redlock.testing.operator`` when a simulation may be in play (docs/testing.md:
    ``REDLOCK_SIMULATE`` set, or the test helpers imported), else None: production code
    never imports the test helpers."""
    if "REDLOCK_SIMULATE" not in os.environ and "django_redlock.testing" not in sys.modules:
        return None
    return importlib.import_module("django_redlock.testing.operator")


class Command(BaseCommand):
    help = "List, show, release and clear held locks; show node health."
    requires_system_checks: list[str] = []  # must work while nodes or settings are broken

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """``run NAME [options] -- COMMAND``: everything after the first ``--`` is COMMAND,
        options included (argparse's own ``--`` handling does not reach sub-parsers)."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parse = parser.parse_args

        def parse_args(args: Sequence[str] | None = None, namespace: Any = None) -> Any:
            given = list(sys.argv[2:] if args is None else args)
            command: list[str] | None = None
            if "--" in given and {"run", "leader"} & set(given[: given.index("--")]):
                cut = given.index("--")
                given, command = given[:cut], given[cut + 1 :]
            parsed = parse(given, namespace)
            if command is not None and getattr(parsed, "subcommand", None) in ("run", "leader"):
                parsed.command = [*parsed.command, *command]
            return parsed

        parser.parse_args = parse_args  # type: ignore[method-assign,assignment]
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        add_subcommands(parser)

    def run_from_argv(self, argv: list[str]) -> None:
        """From a command line: this process ends with the command (see ``front.run``)."""
        self._from_argv = True
        super().run_from_argv(argv)

    def _run_job(self, options: dict[str, Any]) -> None:
        exiting = getattr(self, "_from_argv", False)
        job_commands.run_command(options, self._one_alias, exiting=exiting)

    def handle(self, *args: Any, **options: Any) -> None:
        commands: dict[str, Callable[[dict[str, Any]], None]] = {
            "list": self.list_locks,
            "show": self.show,
            "release": self.release,
            "clear": self.clear,
            "nodes": self.nodes,
            "run": self._run_job,
            "leader": self._run_job,
            "scheduler": lambda options: job_commands.scheduler(self, options),
            "schedule": lambda options: job_commands.schedule(self, options),
            "prune-tombstones": self.prune_tombstones,
            "effects": self.effects,
            "order": self.order,
        }
        self._printed = False
        try:
            _check_encodable(options)
            support = _simulation_support()
            try:  # REDLOCK_SIMULATE: a test's subprocess runs without Redis (docs/testing.md)
                simulation = support.from_environment() if support is not None else None
            except ValueError as exc:
                raise Failure(exc, "bad_settings") from exc
            with simulation or contextlib.nullcontext():
                if (
                    options["subcommand"] not in LIVE
                    and support is not None
                    and self._simulated(options, support)
                ):
                    return
                commands[options["subcommand"]](options)
        except Failure as exc:
            if options.get("json") and not self._printed:
                self._json({"error": str(exc), "code": exc.code})
            raise CommandError(str(exc)) from exc  # stderr: "CommandError: <one line>"

    # -- helpers ---------------------------------------------------------------------------
    def _simulated(self, options: dict[str, Any], support: ModuleType) -> bool:
        """Under ``simulate``, nothing may reach the nodes: ``list`` prints the leases held
        in memory; the other operator commands refuse. False when nothing is simulated."""
        simulated: list[str] = support.simulated_aliases()
        if not simulated:
            return False
        if options["subcommand"] == "order" and self._order_in_memory(options, simulated):
            return False  # the checker's records of a simulation are kept in memory
        if options["subcommand"] != "list":
            aliases = ", ".join(repr(a) for a in simulated)
            raise Failure(
                f"The locks of {aliases} are simulated (django_redlock.testing.simulate): "
                f"'redlock {options['subcommand']}' does not run without real nodes.",
                "simulated",
            )
        for line in support.held_lines(simulated):
            self.stdout.write(line)
        return True

    @staticmethod
    def _order_in_memory(options: dict[str, Any], simulated: list[str]) -> bool:
        """True when every alias ``order`` reads is simulated: it then reads (or clears) the
        records the simulation keeps, and nothing reaches a node."""
        covered = set(simulated)
        using = options["using"]
        return using in covered if using is not None else covered >= set(locks)

    def _aliases(self, using: str | None) -> list[str]:
        try:
            names = inspection.aliases()
        except ImproperlyConfigured as exc:  # REDLOCK itself is not a dict of aliases
            raise Failure(exc, "bad_settings") from exc
        if using is not None and using not in names:
            raise Failure(f"REDLOCK has no alias {using!r}.", "unknown_alias")
        return names if using is None else [using]

    @staticmethod
    def _broken(alias: str) -> Failure | None:
        """Why ``alias`` cannot be used (its settings are invalid), or None."""
        try:
            locks[alias]  # builds the alias's manager, validating its settings
        except (ImproperlyConfigured, TypeError, ValueError) as exc:
            return Failure(f"alias {alias!r}: invalid settings: {exc}", "bad_settings")
        return None

    def _one_alias(self, using: str) -> str:
        return self._usable(using, [])[0]

    def _usable(self, using: str | None, problems: list[NodeError | Failure]) -> list[str]:
        """The aliases to read whose settings are valid; the others are added to ``problems``
        (raised at once if ``using`` names one alias: nothing could be read)."""
        usable: list[str] = []
        for alias in self._aliases(using):
            broken = self._broken(alias)
            if broken is None:
                usable.append(alias)
            elif using is not None:
                raise broken
            else:
                problems.append(broken)
        return usable

    def _json(self, document: object) -> None:
        self._printed = True
        self.stdout.write(json.dumps(document, indent=2, ensure_ascii=False))

    @staticmethod
    def _fail(problems: Sequence[NodeError | Failure]) -> None:
        failure = first_failure(problems)
        if failure is not None:
            raise failure

    # -- subcommands -----------------------------------------------------------------------
    def prune_tombstones(self, options: dict[str, Any]) -> None:
        """Delete the tombstones of deletes older than ``--days`` (a database, not Redis)."""
        days = options["days"]
        if not 0 <= days <= MAX_PRUNE_DAYS:  # NaN fails too; more would overflow the date
            raise Failure(
                f"--days must be a number from 0 to {MAX_PRUNE_DAYS} (100 years), not {days:g}.",
                "usage",
            )
        if options["database"] not in settings.DATABASES:
            raise Failure(f"DATABASES has no alias {options['database']!r}.", "usage")
        deleted = tombstones.prune(timedelta(days=days), using=options["database"])
        self.stdout.write(
            self.style.SUCCESS(
                f"Deleted {deleted} tombstone(s) older than {days:g} day(s) "
                f"from database {options['database']!r}."
            )
        )

    def effects(self, options: dict[str, Any]) -> None:
        """The effect ledger, newest begin first (a database, not Redis)."""
        database = options["database"]
        if database not in settings.DATABASES:
            raise Failure(f"DATABASES has no alias {database!r}.", "usage")
        found = ledger_rows(
            database, pending=options["pending"], prefix=options["prefix"], limit=options["limit"]
        )
        if options["json"]:
            self._json([effect_document(row) for row in found])
        elif found:
            self.stdout.write(table(EFFECT_HEADERS, [effect_row(row) for row in found]))
        else:
            self.stdout.write("No effects are pending." if options["pending"] else "No effects.")

    def list_locks(self, options: dict[str, Any]) -> None:
        """Every held lock, or the first ``--limit`` (SCAN cost grows with the locks read)."""
        found: list[LockInfo] = []
        problems: list[NodeError | Failure] = []
        limit: int | None = options.get("limit")
        for alias in self._usable(options["using"], problems):
            if limit is None:  # one pass over the names, not a new scan before each page
                infos, errors = inspection.all_locks(alias, options["prefix"], CLEAR_BATCH)
                found.extend(infos)
                problems.extend(e for e in errors if e not in problems)
                continue
            if len(found) < limit:
                page = inspection.list_locks([alias], options["prefix"], 0, limit - len(found))
                found.extend(page.locks)
                problems.extend(e for e in page.errors if e not in problems)
        if options["json"]:
            self._json([info.as_dict() for info in found])
        elif found:
            self.stdout.write(table(LOCK_HEADERS, [lock_row(info) for info in found]))
        else:
            self.stdout.write("No locks are held.")
        self._fail(problems)

    def show(self, options: dict[str, Any]) -> None:
        alias = self._one_alias(options["using"])
        info, errors = inspection.get_lock(alias, options["name"])
        if info is None:
            self._fail(errors)
            raise Failure(f"Lock {options['name']!r} is not held on alias {alias!r}.", "not_held")
        if options["json"]:
            self._json(info.as_dict())
        else:
            row = lock_row(info)
            width = max(len(h) for h in LOCK_HEADERS)
            for header, value in zip(LOCK_HEADERS, row, strict=True):
                self.stdout.write(f"{header.ljust(width)}  {printable(str(value))}")
            self.stdout.write(f"HOLDERS ({len(info.holders)}):")
            self.stdout.write(table(HOLDER_HEADERS, holder_rows(info)))
        self._fail(errors)

    def release(self, options: dict[str, Any]) -> None:
        alias = self._one_alias(options["using"])
        try:
            deleted, info = inspection.force_release(alias, options["name"], options["token"])
        except inspection.InspectionError as exc:
            raise Failure(f"{exc}.", RELEASE_CODES.get(type(exc), "not_held")) from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"Released {released_what(info)} on {deleted}/{info.nodes_total} nodes."
            )
        )

    def clear(self, options: dict[str, Any]) -> None:
        if not options["yes"]:
            raise Failure("clear force-releases every matching lock; add --yes to do it.", "usage")
        released = left = 0
        problems: list[NodeError | Failure] = []
        for alias in self._usable(options["using"], problems):
            skipped = 0  # names left in place stay ahead of the next batch in SCAN order
            while True:
                page = inspection.list_locks([alias], options["prefix"], skipped, CLEAR_BATCH)
                problems.extend(e for e in page.errors if e not in problems)
                batch = 0
                for info in page.locks:
                    try:
                        deleted, _ = inspection.force_release(
                            alias, info.name, info.token, info.lease_id
                        )
                    except inspection.InspectionError:
                        deleted = 0
                    if not deleted:  # expired or changed hands meanwhile: not ours to clear
                        skipped += 1
                        continue
                    batch += 1
                released += batch
                left += len(page.locks) - batch
                if not page.has_more or not batch:
                    break
        changed = f" Left {left} that changed hands or expired meanwhile." if left else ""
        self.stdout.write(self.style.SUCCESS(f"Released {released} lock(s).{changed}"))
        self._fail(problems)

    def nodes(self, options: dict[str, Any]) -> None:
        report: list[NodeHealth] = []
        problems: list[NodeError | Failure] = []
        for alias in self._usable(options["using"], problems):
            report.extend(inspection.node_health([alias]))
        if options["json"]:
            self._json([node.as_dict() for node in report])
        else:
            self.stdout.write(table(NODE_HEADERS, [node_row(node) for node in report]))
        problems += [NodeError(n.alias, n.node, n.error) for n in report if not n.up]
        self._fail(problems)

    def order(self, options: dict[str, Any]) -> None:
        """The lock-order records of every alias (or ``--using``), or ``--clear`` them."""
        problems: list[NodeError | Failure] = []
        aliases = self._usable(options["using"], problems)
        if options["clear"]:
            for alias in aliases:
                _, errors = order_records.clear(locks[alias].engine)
                problems += [NodeError(alias, node, error) for node, error in errors.items()]
            self.stdout.write(
                self.style.SUCCESS(f"Cleared the lock-order records of {len(aliases)} alias(es).")
            )
            self._fail(problems)
            return
        found: list[order_records.Recorded] = []
        for alias in aliases:
            edges, errors = order_records.read_all(locks[alias].engine)
            found += edges
            problems += [NodeError(alias, node, error) for node, error in errors.items()]
        report = OrderReport(found)
        if options["json"]:
            self._json(order_document(report))
        elif report.edges:
            self.stdout.write(table(ORDER_HEADERS, [order_row(report, r) for r in report.edges]))
            for line in inverted_details(report):
                self.stdout.write(printable(line) if line.strip() else line)
        else:
            self.stdout.write("No lock order is recorded.")
        self._fail(problems)
        found_problems = []
        if report.inverted:
            found_problems.append(f"{len(report.inverted)} inverted lock order pair(s) recorded.")
        if report.cycles:
            found_problems.append(
                f"{len(report.cycles)} lock order cycle(s) of three or more shapes recorded."
            )
        if options["check"] and found_problems:
            raise CommandError(" ".join(found_problems), returncode=ORDER_INVERTED_STATUS)
