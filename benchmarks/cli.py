"""Command line of the benchmark: parse the options, run every scenario, print the tables."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence

from benchmarks.common import WORKERS, quiet_logging, setup_django
from benchmarks.handoff import CONTENDED_LOCKS, contended
from benchmarks.report import Report, machine_description, markdown, plot, print_tables, tables
from benchmarks.scenarios import Plan, five_nodes, paused_node, single_node

DESCRIPTION = "Benchmark django-redlock against the usual Redis lock libraries, in one run."


def run(plan: Plan, mode: str, workers: int) -> Report:
    from django_redlock.testing import RedisNodes

    started = time.perf_counter()
    report = Report(mode=mode, machine=machine_description())
    nodes = RedisNodes.start(6)  # node 0: the single-node alias; nodes 1-5: the five-node one
    loop = asyncio.new_event_loop()
    try:
        url1, five = nodes[0].url, nodes[1:]
        urls5 = list(five.urls)
        ports5 = [n.port for n in five]
        setup_django(url1, urls5)
        step("single node")
        report.single = single_node(url1, plan)
        step("five nodes")
        report.five = five_nodes(urls5, ports5, plan, loop)
        for label, kind, count in CONTENDED_LOCKS:
            step(f"contended: {label}")
            report.contended.append(contended(label, kind, count, url1, urls5, plan, workers))
        step("five nodes, one paused")
        report.paused = paused_node(five, plan, loop)
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        nodes.stop()
    report.seconds = time.perf_counter() - started
    return report


def step(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--quick", action="store_true", help="a ~40 s run with shorter phases")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG bar chart of the results")
    parser.add_argument("--markdown", metavar="PATH", help="write the tables as Markdown")
    parser.add_argument("--workers", type=int, default=WORKERS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quiet_logging("pottery", "aioredlock")
    plan = Plan.quick() if args.quick else Plan.full()
    report = run(plan, "quick" if args.quick else "full", args.workers)
    all_tables = tables(report)
    print_tables(report, all_tables)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(markdown(report, all_tables))
    if args.plot:
        plot(report, args.plot)
    return 0
