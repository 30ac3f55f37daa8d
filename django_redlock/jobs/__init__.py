"""Jobs that must run once (docs/jobs.md): lock names filled from a call's arguments, and
``manage.py redlock run`` (a command run as a child process under a kept-alive lease).

The ``@lock`` decorator itself is :class:`django_redlock.locking.block.LockBlock`; the Celery task
base
is :mod:`django_redlock.contrib.celery`.
"""
