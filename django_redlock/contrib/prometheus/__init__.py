"""Prometheus metrics of every lock manager (docs/observability.md): add
``"django_redlock.contrib.prometheus"`` to ``INSTALLED_APPS`` (needs ``prometheus-client``,
the ``prometheus`` extra).

The metrics live in prometheus-client's default registry, so django-prometheus's ``/metrics``
view (or prometheus-client's own exporters) serve them. Their labels are the alias, the outcome
and the node, never a lock name: the number of series stays bounded however many names are
locked. See ``docs/observability.md``.
"""
