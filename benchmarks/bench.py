"""Benchmark django-redlock against the usual Redis lock libraries, in one run.

Starts its own ``redis-server`` nodes on loopback (``django_redlock.testing``), configures a bare
Django in-process and measures, on the same machine and in the same run:

* single node: acquire+release pairs/s and acquire p50/p99 for django-redlock, raw redis-py
  (``SET NX PX`` + ``EVALSHA`` compare-and-delete), redis-py ``Lock``, python-redis-lock and
  pottery (``Redlock`` with one master);
* five nodes: pairs/s and acquire p50/p99 for django-redlock (sync and asyncio), pottery,
  redlock-py and aioredlock;
* five nodes with one SIGSTOPped: acquire success rate, acquire p50/p99, keys left behind on the
  healthy nodes and, once the node is resumed, on it;
* contended hand-off: 8 worker processes (``spawn``) loop acquire -> tiny critical section ->
  release on one name; critical sections/s, hand-off latency to *another* process (release
  timestamp -> next holder's acquire timestamp, both ``time.monotonic()``, i.e.
  ``CLOCK_MONOTONIC``, shared by all processes on Linux), max/min acquisitions per worker.

Usage::

    python benchmarks/bench.py                    # ~3 minutes
    python benchmarks/bench.py --quick            # ~40 seconds
    python benchmarks/bench.py --plot docs/benchmarks.png --markdown /tmp/table.md

The comparison libraries come from the ``bench`` extra: ``pip install -e ".[bench]"``.

This script only starts :func:`benchmarks.cli.main`; the code is in the modules beside it:
``cli`` (options, run), ``scenarios`` (uncontended scenarios), ``handoff`` (contended workers),
``contenders`` (each library's acquire/release), ``loops``, ``report`` and ``common``.
"""

import os
import sys

# As a script sys.path[0] is benchmarks/: add the repo root for `benchmarks.*` (workers too).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
