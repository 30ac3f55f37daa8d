"""Jobs that must run once (docs/jobs.md): lock names filled from a call's arguments,
``manage.py redlock run`` (a command run as a child process under a kept-alive lease), and the
queue-independent part of unique tasks (:mod:`.unique`, its markers in :mod:`.notes`;
docs/effects.md).

The ``@lock`` decorator itself is :class:`django_redlock.locking.block.LockBlock`; the Celery task
base
is :mod:`django_redlock.contrib.celery`.
"""
