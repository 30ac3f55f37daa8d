"""The subcommands and options of ``manage.py redlock`` (its argparse parser)."""

from __future__ import annotations

from django.core.management.base import CommandParser


def positive_int(text: str) -> int:
    """An ``int`` option that must be at least 1."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def holding_options(parser: CommandParser, using_help: str) -> None:
    """The options ``run`` and ``leader`` share: what to hold, and what to do on a loss."""
    parser.add_argument("name")
    parser.add_argument("--using", default="default", help=using_help)
    parser.add_argument("--ttl", type=float, help="Lease TTL in seconds (default: the alias's).")
    parser.add_argument(
        "--kill-after",
        type=float,
        default=10.0,
        help="After a lost lease, SIGKILL the command this many seconds after SIGTERM.",
    )
    parser.add_argument(
        "--status-file",
        metavar="PATH",
        help='Write {"outcome": ..., "child_status": ..., "exit_status": ...} there (JSON).',
    )


def add_subcommands(parser: CommandParser) -> None:
    """Every subcommand of ``manage.py redlock``, with its options."""
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    every = "Alias to read (default: every alias)."
    one = "Alias of the lock (default: default)."

    p = sub.add_parser("list", help="List held locks.")
    p.add_argument("--using", help=every)
    p.add_argument("--prefix", default="", help="Only names starting with this.")
    p.add_argument(
        "--limit", type=positive_int, help="Print at most this many locks (default: all)."
    )
    p.add_argument("--json", action="store_true", help="Print one JSON list.")

    p = sub.add_parser("show", help="Show one lock.")
    p.add_argument("name")
    p.add_argument("--using", default="default", help=one)
    p.add_argument("--json", action="store_true", help="Print one JSON object.")

    p = sub.add_parser("release", help="Force-release one lock (advances its fence).")
    p.add_argument("name")
    p.add_argument("--using", default="default", help=one)
    p.add_argument("--token", type=int, help="Release only if the lease with this token holds it.")

    p = sub.add_parser("clear", help="Force-release every held lock (needs --yes).")
    p.add_argument("--prefix", default="", help="Only names starting with this.")
    p.add_argument("--using", help=every)
    p.add_argument("--yes", action="store_true", help="Really release them.")

    p = sub.add_parser("nodes", help="Node health: latency, run_id, uptime, policy.")
    p.add_argument("--using", help=every)
    p.add_argument("--json", action="store_true", help="Print one JSON list.")

    p = sub.add_parser(
        "run",
        help="Run a command while holding a lock (flock for a cluster of servers).",
        usage="manage.py redlock run NAME [options] -- COMMAND [ARG ...]",
        description="Exit status: the command's; 75 busy, 69 no quorum, 70 lease lost.",
    )
    holding_options(p, one)
    p.add_argument(
        "--timeout", type=float, default=0.0, help="Seconds to wait for the lock (default 0)."
    )
    p.add_argument(
        "--skip-busy", action="store_true", help="Exit 0 silently when the lock is busy."
    )
    p.add_argument(
        "--min-hold",
        type=float,
        metavar="SECONDS",
        help="After the command exits 0, keep the name taken until SECONDS after it started "
        "(other servers' copies of the same cron tick stay busy).",
    )
    p.add_argument("command", nargs="*", help="-- COMMAND [ARG ...]")

    p = sub.add_parser(
        "leader",
        help="Campaign for a leadership; run a command while elected (SIGTERM on loss).",
        usage="manage.py redlock leader NAME [options] -- COMMAND [ARG ...]",
        description="Waits until elected. Exit status: the command's; 69 no quorum, 70 "
        "leadership lost.",
    )
    holding_options(p, one)
    p.add_argument("command", nargs="*", help="-- COMMAND [ARG ...]")

    p = sub.add_parser(
        "scheduler",
        help="Run REDLOCK_SCHEDULE: start it on every server; each tick runs once.",
        description="Runs until SIGTERM/SIGINT (or --for SECONDS); docs/schedules.md.",
    )
    p.add_argument("--for", dest="seconds", type=float, help="Stop after SECONDS.")

    p = sub.add_parser("schedule", help="Each REDLOCK_SCHEDULE entry's last and next tick.")
    p.add_argument("--json", action="store_true", help="Print one JSON list.")

    p = sub.add_parser(
        "prune-tombstones",
        help="Delete FencedModel tombstones older than --days (docs/fencedmodel.md).",
    )
    p.add_argument("--days", type=float, default=30.0, help="Age in days to keep (default 30).")
    p.add_argument("--database", default="default", help="Database alias (default: default).")

    p = sub.add_parser("effects", help="List the effect ledger (lease.once; docs/effects.md).")
    p.add_argument(
        "--pending", action="store_true", help="Only effects not done (begun, or interrupted)."
    )
    p.add_argument("--prefix", default="", help="Only keys starting with this.")
    p.add_argument(
        "--limit", type=positive_int, help="Print at most this many effects (default: all)."
    )
    p.add_argument("--database", default="default", help="Database alias (default: default).")
    p.add_argument("--json", action="store_true", help="Print one JSON list.")

    p = sub.add_parser(
        "order",
        help="The lock-order checker's records: shapes taken while others were held.",
        description="Exit status: 1 when a node is unreachable; with --check, 3 when an "
        "inverted pair or a cycle of three or more shapes is recorded.",
    )
    p.add_argument("--using", help=every)
    p.add_argument("--json", action="store_true", help="Print one JSON object.")
    p.add_argument("--clear", action="store_true", help="Forget the records instead.")
    p.add_argument("--check", action="store_true", help="Exit with status 3 if a pair is inverted.")
