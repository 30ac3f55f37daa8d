"""The connections of an alias: the budget of ``MAX_CONNECTIONS`` per node (:mod:`.budget`),
the sync callers' channels (:mod:`.channels`) and each event loop's (:mod:`.loops`)."""
