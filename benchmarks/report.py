"""The results of a run as tables (terminal, Markdown), targets, a bar chart and the machine."""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import WORKERS, percentile
from benchmarks.handoff import ContendedResult
from benchmarks.scenarios import PairResult, PauseResult


@dataclass
class Report:
    mode: str
    machine: str
    single: list[PairResult] = field(default_factory=list)
    five: list[PairResult] = field(default_factory=list)
    paused: list[PauseResult] = field(default_factory=list)
    contended: list[ContendedResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def header(self) -> str:
        return f"{self.machine}; mode: {self.mode}; run took {self.seconds:.0f} s"


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]


# -- formatting ---------------------------------------------------------------------------------
def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:,.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:,.2f} ms"
    return f"{seconds:,.2f} s"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return "∞" if math.isinf(value) else f"{value:.2f}x"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def find(results: Sequence[Any], label: str) -> Any:
    return next((r for r in results if r.label == label), None)


# -- tables -------------------------------------------------------------------------------------
def pair_table(title: str, results: Sequence[PairResult], baseline: str, column: str) -> Table:
    """Pairs/s, the ratio to the ``baseline`` library's (in ``column``) and acquire p50/p99."""
    base = find(results, baseline)
    base_rate = base.rate if base else None
    return Table(
        title,
        ["library", "pairs/s", column, "acquire p50", "acquire p99", "notes"],
        [
            [
                r.label,
                fmt_rate(r.rate),
                fmt_ratio(ratio(r.rate, base_rate)),
                fmt_time(r.p50),
                fmt_time(r.p99),
                r.note + (f"; {r.failures} failed" if r.failures else ""),
            ]
            for r in results
        ],
    )


def tables(report: Report) -> list[Table]:
    out: list[Table] = [
        pair_table(
            "Single node: acquire+release pairs (one process, back to back)",
            report.single,
            "raw redis-py",
            "vs raw",
        ),
        pair_table(
            "Five nodes: acquire+release pairs (one process, back to back)",
            report.five,
            "pottery",
            "vs pottery",
        ),
    ]
    out.append(
        Table(
            "Five nodes, one SIGSTOPped: one acquire attempt (timeout 0) at a time",
            [
                "library",
                "attempts",
                "attempts/s",
                "acquired",
                "acquire p50",
                "acquire p99",
                "worst",
                "keys left (healthy)",
                "keys left (resumed node)",
                "notes",
            ],
            [
                [
                    r.label,
                    str(r.attempts),
                    fmt_rate(r.rate),
                    fmt_pct(r.success),
                    fmt_time(r.p50),
                    fmt_time(r.p99),
                    fmt_time(r.worst),
                    "-" if r.keys_healthy is None else str(r.keys_healthy),
                    "-" if r.keys_resumed is None else str(r.keys_resumed),
                    r.note,
                ]
                for r in report.paused
            ],
        )
    )
    out.append(
        Table(
            f"Contended: {WORKERS} processes, one name: acquire, tiny critical section, release",
            [
                "library",
                "nodes",
                "sections/s",
                "to another process",
                "hand-off p50",
                "hand-off p99",
                "max/min per worker",
                "overlaps",
                "notes",
            ],
            [
                [
                    r.label,
                    str(r.nodes),
                    fmt_rate(r.rate),
                    fmt_pct(r.other_share),
                    fmt_time(percentile(r.to_other, 50)),
                    fmt_time(percentile(r.to_other, 99)),
                    fmt_ratio(r.fairness)
                    + (f" ({max(r.per_worker)}/{min(r.per_worker)})" if r.per_worker else ""),
                    str(r.overlaps),
                    r.note + (f"; {r.failed_acquires} timed out" if r.failed_acquires else ""),
                ]
                for r in report.contended
            ],
        )
    )
    out.append(targets_table(report))
    return out


def targets_table(report: Report) -> Table:
    rows: list[list[str]] = []

    def check(target: str, measured: str, ok: bool | None) -> None:
        rows.append([target, measured, "n/a" if ok is None else ("met" if ok else "NOT met")])

    def at_least(value: float | None, bound: float) -> bool | None:
        return None if value is None else value >= bound

    def at_most(value: float | None, bound: float) -> bool | None:
        return None if value is None else value <= bound

    s = {r.label: r for r in report.single}
    f = {r.label: r for r in report.five}
    ours1, ours5 = s.get("django-redlock"), f.get("django-redlock")
    ours5a = f.get("django-redlock async")

    def rate_of(r: PairResult | None) -> float | None:
        return None if r is None else r.rate

    x = ratio(rate_of(ours1), rate_of(s.get("raw redis-py")))
    check("1 node: pairs/s >= 0.9x raw redis-py", fmt_ratio(x), at_least(x, 0.9))
    x = ratio(rate_of(ours1), rate_of(s.get("redis-py Lock")))
    check("1 node: pairs/s >= 1.1x redis-py Lock", fmt_ratio(x), at_least(x, 1.1))
    x = ratio(rate_of(ours5), rate_of(f.get("pottery")))
    check("5 nodes: pairs/s >= 5x pottery", fmt_ratio(x), at_least(x, 5.0))
    x = ratio(rate_of(ours5a), rate_of(f.get("aioredlock")))
    check("5 nodes: async pairs/s >= 1.2x aioredlock", fmt_ratio(x), at_least(x, 1.2))
    x = ratio(rate_of(ours5), rate_of(f.get("aioredlock")))
    check("5 nodes: sync pairs/s >= 1.2x aioredlock", fmt_ratio(x), at_least(x, 1.2))
    x = ratio(ours5.p50 if ours5 else None, ours1.p50 if ours1 else None)
    check(
        "5 nodes: acquire p50 <= 2x our 1-node acquire p50",
        f"{fmt_time(ours5.p50 if ours5 else None)} = {fmt_ratio(x)}",
        at_most(x, 2.0),
    )
    paused = find(report.paused, "django-redlock")
    if paused is not None:
        check("1 of 5 paused: 100 % acquired", fmt_pct(paused.success), at_least(paused.success, 1))
        check("1 of 5 paused: acquire p99 <= 5 ms", fmt_time(paused.p99), at_most(paused.p99, 5e-3))
        keys = None if paused.keys_healthy is None else float(paused.keys_healthy)
        check("1 of 5 paused: no keys left on healthy nodes", fmt_rate(keys), at_most(keys, 0))
    c = {r.label: r for r in report.contended}
    prl = c.get("python-redis-lock")
    pot5 = c.get("pottery")
    # The targets: "8 processes on one name: hand-off p50/p99, sections/s >= python-redis-lock's
    # (a single-node lock), max/min <= 1.5; on 5 nodes >= 5x pottery's sections/s". The
    # single-node targets are checked on 1 node; on 5 nodes, pottery's and the fairness bound.
    for label in ("django-redlock", "django-redlock 5 nodes"):
        r = c.get(label)
        if r is None or r.note.startswith("failed"):
            continue
        where = "1 node" if r.nodes == 1 else "5 nodes"
        if r.nodes == 1:
            p50, p99 = percentile(r.to_other, 50), percentile(r.to_other, 99)
            check(f"8 procs, {where}: hand-off p50 <= 0.5 ms", fmt_time(p50), at_most(p50, 5e-4))
            check(f"8 procs, {where}: hand-off p99 <= 5 ms", fmt_time(p99), at_most(p99, 5e-3))
            x = ratio(r.rate, prl.rate if prl else None)
            check(
                f"8 procs, {where}: sections/s >= python-redis-lock's",
                fmt_ratio(x),
                at_least(x, 1.0),
            )
        check(
            f"8 procs, {where}: max/min per worker <= 1.5",
            fmt_ratio(r.fairness),
            at_most(r.fairness, 1.5),
        )
        if r.nodes == 5:
            x = ratio(r.rate, pot5.rate if pot5 else None)
            check("8 procs, 5 nodes: sections/s >= 5x pottery's", fmt_ratio(x), at_least(x, 5))
    return Table("Targets of the engine's speed work", ["target", "measured", "verdict"], rows)


# -- output -------------------------------------------------------------------------------------
def print_tables(report: Report, all_tables: Sequence[Table]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table as RichTable
    except ImportError:
        print(report.header)
        for t in all_tables:
            print()
            print(plain_table(t))
        return
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(report.header)
    for t in all_tables:
        rt = RichTable(title=t.title, title_justify="left")
        for i, col in enumerate(t.columns):
            rt.add_column(col, justify="left" if i == 0 or col == "notes" else "right")
        for row in t.rows:
            rt.add_row(*row)
        console.print(rt)


def plain_table(t: Table) -> str:
    widths = [max(len(c), *(len(r[i]) for r in t.rows)) for i, c in enumerate(t.columns)]
    lines = [t.title, "  ".join(c.ljust(w) for c, w in zip(t.columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in t.rows]
    return "\n".join(lines)


def markdown(report: Report, all_tables: Sequence[Table]) -> str:
    parts = [f"{report.header}."]
    for t in all_tables:
        parts.append(f"**{t.title}**\n")
        lines = ["| " + " | ".join(t.columns) + " |"]
        lines.append("|" + "|".join("---" for _ in t.columns) + "|")
        lines += ["| " + " | ".join(v.replace("|", "\\|") for v in r) + " |" for r in t.rows]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def plot(report: Report, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours_color, other_color, p99_color = "#1f77b4", "#b0b0b0", "#ff7f0e"
    width = 0.4

    def bars(ax: Any, labels: list[str], values: list[float], title: str, unit: str) -> None:
        colors = [ours_color if lab.startswith("django-redlock") else other_color for lab in labels]
        ax.bar(range(len(values)), values, color=colors)
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit, fontsize=8)
        for i, v in enumerate(values):
            ax.annotate(f"{v:,.0f}", (i, v), ha="center", va="bottom", fontsize=7)

    def p50_p99(ax: Any, labels: list[str], p50: list[float], p99: list[float], title: str) -> None:
        """Side-by-side p50/p99 bars in ms on a log axis."""
        xs = list(range(len(labels)))
        ax.bar([x - width / 2 for x in xs], p50, width, label="p50", color=ours_color)
        ax.bar([x + width / 2 for x in xs], p99, width, label="p99", color=p99_color)
        ax.set_yscale("log")
        ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("ms", fontsize=8)
        ax.legend(fontsize=8)

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    single = [r for r in report.single if r.rate]
    bars(axes[0][0], [r.label for r in single], [r.rate or 0 for r in single], "1 node", "pairs/s")
    five = [r for r in report.five if r.rate]
    bars(axes[0][1], [r.label for r in five], [r.rate or 0 for r in five], "5 nodes", "pairs/s")
    paused = report.paused
    bars(
        axes[0][2],
        [r.label for r in paused],
        [(r.success or 0) * 100 for r in paused],
        "5 nodes, 1 SIGSTOPped: acquired",
        "%",
    )
    cont = [r for r in report.contended if r.sections]
    labels = [f"{r.label.replace(' 5 nodes', '')} ({r.nodes}n)" for r in cont]
    bars(axes[1][0], labels, [r.rate for r in cont], "8 processes, one name", "sections/s")
    p50_p99(
        axes[1][1],
        labels,
        [(percentile(r.to_other, 50) or 0) * 1e3 for r in cont],
        [(percentile(r.to_other, 99) or 0) * 1e3 for r in cont],
        "Hand-off to another process (log)",
    )
    lat = [r for r in report.five if r.p50]
    p50_p99(
        axes[1][2],
        [r.label for r in lat],
        [(r.p50 or 0) * 1e3 for r in lat],
        [(r.p99 or 0) * 1e3 for r in lat],
        "5 nodes: acquire latency (log)",
    )
    fig.suptitle(f"django-redlock benchmarks ({report.machine})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_description() -> str:
    try:
        from django_redlock.testing import find_redis_server

        version = subprocess.run(
            [find_redis_server(), "--version"], capture_output=True, text=True, check=False
        ).stdout.split()
        server = next((v.split("=")[1] for v in version if v.startswith("v=")), "?")
    except Exception:
        server = "?"
    import redis

    here = os.path.dirname(os.path.abspath(__file__))
    git = subprocess.run(
        ["git", "-C", here, "log", "-1", "--format=%h"], capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", here, "status", "--porcelain", "--", "../django_redlock"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    commit = f"{git}{'+changes' if dirty else ''}" if git else "?"
    return (
        f"{os.cpu_count()} cores, loopback, Python {platform.python_version()}, "
        f"redis-server {server}, redis-py {redis.__version__}, django-redlock {commit}"
    )
