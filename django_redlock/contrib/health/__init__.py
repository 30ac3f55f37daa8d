"""Health of the lock nodes for load balancers and django-health-check: per alias, can a
quorum of nodes vote (reachable, out of the restart quarantine, with a ``maxmemory-policy``
that cannot evict lock keys)?

* :func:`views.health`: a plain view, 200 when every alias (or ``?alias=``) is healthy, else
  503, with a JSON body; needs nothing beyond Django.
* :class:`checks.Redlock`: a django-health-check (4.x) check (needs the ``health`` extra).
"""
