"""Per-request locks: hold a distributed lock while one request runs.

The entry points are :func:`django_redlock.decorators.request_lock` and
:class:`django_redlock.middleware.RequestLockMiddleware`. This package holds the parts they share:

- ``keys``: filling a key template (``"order:{order_id}"``) into a lock name;
- ``rules``: what to lock (``LockSpec``), the ``REDLOCK_REQUEST_LOCKS`` rules and matching them;
- ``holding``: holding one lease around one request, sync or async, and releasing it;
- ``responses``: the 409/503 responses with ``Retry-After``;
- ``idempotency``, ``keeping``, ``records``: idempotent requests (the key's lock and
  fingerprint; answering from and keeping a response; the response on the nodes);
- ``checks``: the system checks (``django_redlock.E010``-``E019``, ``E030``, ``W010``).
"""
