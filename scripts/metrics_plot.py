"""Plot the lock metrics of a real oversell demo run, from real scrapes of the demo's /metrics.

Starts three redis-server nodes on free loopback ports, migrates a fresh SQLite demo database,
serves the demo (``REDLOCK_DEMO_METRICS=1``: django-prometheus and
``django_redlock.contrib.prometheus``) with gunicorn in prometheus-client's multiprocess mode,
runs ``manage.py oversell`` (its worker processes write their metrics to the same directory),
scrapes ``/metrics`` over HTTP every ``--every`` seconds while it runs, parses each scrape with
prometheus-client's parser and draws four panels: acquisitions per second by outcome, acquire
latency quantiles, waiting calls, and the mean hold time. Everything it started is stopped by
PID at the end.

    .venv/bin/pip install -e ".[bench]"          # matplotlib
    .venv/bin/python scripts/metrics_plot.py [--out docs/images/oversell-metrics.png]
        [--workers 8] [--attempts 1500] [--stock 400] [--lock-timeout 0.1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ALIAS = "default"


@dataclass
class Scrape:
    """What one scrape said about the alias's locks (counters are totals since the start)."""

    at: float
    counts: dict[str, float] = field(default_factory=dict)  # outcome -> acquire calls
    buckets: dict[float, float] = field(default_factory=dict)  # le -> acquired calls
    hold_count: float = 0.0
    hold_sum: float = 0.0
    waiters: float = 0.0


def scrape(url: str, at: float) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    result = Scrape(at)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("alias") != ALIAS:
                continue
            if s.name == "redlock_acquire_seconds_count":
                outcome = s.labels["outcome"]
                result.counts[outcome] = result.counts.get(outcome, 0.0) + s.value
            elif s.name == "redlock_acquire_seconds_bucket" and s.labels["outcome"] == "acquired":
                le = float(s.labels["le"])
                result.buckets[le] = result.buckets.get(le, 0.0) + s.value
            elif s.name == "redlock_hold_seconds_count":
                result.hold_count += s.value
            elif s.name == "redlock_hold_seconds_sum":
                result.hold_sum += s.value
            elif s.name == "redlock_waiters":
                result.waiters += s.value
    return result


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """``histogram_quantile`` over cumulative ``buckets`` (le -> count), linear in a bucket."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le in bounds:
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower
            inside = buckets[le] - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = le, buckets[le]
    return lower


def active(scrapes: list[Scrape], margin: int = 4) -> list[Scrape]:
    """The scrapes from a little before the first lock call to a little after the last (the
    worker processes take seconds to start)."""
    totals = [sum(s.counts.values()) for s in scrapes]
    changed = [i for i in range(1, len(totals)) if totals[i] != totals[i - 1]]
    if not changed:
        return scrapes
    return scrapes[max(0, changed[0] - margin) : changed[-1] + margin]


def plot(scrapes: list[Scrape], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(itertools.pairwise(scrapes))
    t = [b.at - scrapes[0].at for _, b in pairs]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    for outcome, colour in (("acquired", "tab:green"), ("busy", "tab:orange")):
        rate = [
            (b.counts.get(outcome, 0) - a.counts.get(outcome, 0)) / (b.at - a.at) for a, b in pairs
        ]
        axes[0].plot(t, rate, label=outcome, color=colour)
    axes[0].set_ylabel("acquire calls/s")
    axes[0].set_title("rate(redlock_acquire_seconds_count) by outcome")
    axes[0].legend(loc="upper right")
    for q, colour in ((0.5, "tab:blue"), (0.95, "tab:purple"), (0.99, "tab:red")):
        values = []
        for a, b in pairs:
            window = {le: b.buckets.get(le, 0) - a.buckets.get(le, 0) for le in b.buckets}
            value = quantile(q, window)
            values.append(float("nan") if value is None else value * 1000)
        axes[1].plot(t, values, label=f"p{int(q * 100)}", color=colour)
    axes[1].set_ylabel("ms")
    axes[1].set_yscale("log")
    axes[1].set_title("histogram_quantile(redlock_acquire_seconds{outcome=acquired})")
    axes[1].legend(loc="upper right")
    axes[2].plot(t, [b.waiters for _, b in pairs], color="tab:brown")
    axes[2].set_ylabel("calls")
    axes[2].set_title("sum(redlock_waiters)")
    holds = [
        (b.hold_sum - a.hold_sum) / (b.hold_count - a.hold_count) * 1000
        if b.hold_count > a.hold_count
        else float("nan")
        for a, b in pairs
    ]
    axes[3].plot(t, holds, color="tab:gray")
    axes[3].set_ylabel("ms")
    axes[3].set_title("mean redlock_hold_seconds")
    axes[3].set_xlabel("seconds since the first scrape")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=ROOT / "docs/images/oversell-metrics.png")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--attempts", type=int, default=1500)
    parser.add_argument("--stock", type=int, default=400)
    parser.add_argument(
        "--lock-timeout", type=float, default=0.1, help="seconds a buyer waits for the lock"
    )
    parser.add_argument("--every", type=float, default=0.25, help="seconds between scrapes")
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes
    from django_redlock.testing.wire import free_port

    with (
        tempfile.TemporaryDirectory(prefix="redlock-metrics-") as tmp,
        RedisNodes.start(3) as nodes,
    ):
        prom = Path(tmp) / "prometheus"
        prom.mkdir()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "REDLOCK_NODES": ",".join(nodes.urls),
            "REDLOCK_DEMO_METRICS": "1",
            "PROMETHEUS_MULTIPROC_DIR": str(prom),
            "DEMO_SQLITE_PATH": str(Path(tmp) / "demo.sqlite3"),
            "PYTHONPATH": str(ROOT),
        }
        env.pop("DATABASE_URL", None)
        manage = [sys.executable, str(ROOT / "manage.py")]
        subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, cwd=ROOT, check=True)
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "testproject.wsgi:application", "--workers", "2",
             "--bind", f"127.0.0.1:{port}", "--log-level", "warning"],
            env=env, cwd=ROOT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/metrics"
        demo: subprocess.Popen[bytes] | None = None
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(url, timeout=1).read()
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit("the demo server did not start") from None
                    time.sleep(0.2)
            summary = Path(tmp) / "oversell.json"
            demo = subprocess.Popen(
                [*manage, "oversell", "--workers", str(args.workers), "--attempts",
                 str(args.attempts), "--stock", str(args.stock), "--lock-timeout",
                 str(args.lock_timeout), "--json", str(summary)],
                env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            scrapes = [scrape(url, time.monotonic())]
            while demo.poll() is None:
                time.sleep(args.every)
                scrapes.append(scrape(url, time.monotonic()))
            scrapes.append(scrape(url, time.monotonic()))
            result: dict[str, Any] = json.loads(summary.read_text())
        finally:
            for proc in (demo, server):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=15)
    last = scrapes[-1]
    title = (
        f"oversell demo with the lock: {result['workers']} processes, {result['attempts']} buy "
        f"attempts, {result['stock']} in stock; sold {result['sold']}, oversold "
        f"{result['oversold']}"
    )
    plot(active(scrapes), args.out, title)
    print(f"{len(scrapes)} scrapes; acquire calls: {last.counts}; holds: {last.hold_count:.0f}")
    print(f"demo: sold {result['sold']}, busy {result['busy']}, oversold {result['oversold']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
