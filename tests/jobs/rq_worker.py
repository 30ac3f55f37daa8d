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

    connection = Redis.from_url(os.environ["RQ_URL"])
    worker = Worker([Queue("jobs", connection=connection)], connection=connection, name=sys.argv[1])
    worker.work(burst=sys.argv[2:3] != ["serve"], logging_level="WARNING")


if __name__ == "__main__":
    main()
