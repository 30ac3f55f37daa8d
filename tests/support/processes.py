"""The process context of the tests' worker processes: a fork server with the heavy imports
done once.

``multiprocessing``'s spawn start method gives each worker a fresh interpreter that imports
Django, redis-py and django-redlock again: about 0.7 s of CPU per process, and the suite starts
hundreds. ``PROCESSES`` forks each worker from a server process that imported them once (and
nothing else: no settings configured, no connection opened, no thread started), so a worker is
as fresh as a spawned one (its own Django setup, its own connections) at a tenth of the cost.
Tests of ``fork()`` itself keep ``multiprocessing.get_context("fork")``.
"""

from __future__ import annotations

import multiprocessing

#: What the fork server imports before it forks any worker: libraries and modules that read
#: no settings at import time.
PRELOAD = ["tests.support.preload"]

PROCESSES = multiprocessing.get_context("forkserver")
PROCESSES.set_forkserver_preload(PRELOAD)
