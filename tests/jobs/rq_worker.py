"""An RQ worker process for tests/jobs/test_rq.py and test_unique_rq.py: Django set up from the
environment, then a burst worker (each job in a forked work horse, RQ's default) on the queue
at ``RQ_URL``; ``serve`` as the second argument: a worker that waits for jobs until stopped."""

from __future__ import annotations

import os
import sys

import django


def main() -> None:
    django.setup()
    from redis import Redis
    from rq import Queue, Worker

    class TestWorker(Worker):  # type: ignore[misc]
        def subscribe(self) -> None:
            """No command channel (the tests send no worker commands): RQ's pubsub thread,
            stopped by a burst worker that ends before its SUBSCRIBE was confirmed, waits 60 s
            for that confirmation (seen under a loaded parallel run) before the worker exits."""

    connection = Redis.from_url(os.environ["RQ_URL"])
    queues = [Queue("jobs", connection=connection)]
    worker = TestWorker(queues, connection=connection, name=sys.argv[1])
    worker.work(burst=sys.argv[2:3] != ["serve"], logging_level="WARNING")


if __name__ == "__main__":
    main()
