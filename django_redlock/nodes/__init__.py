"""Where the lock servers are and how they are doing: :mod:`.probe` reads a node's health
(role, eviction policy, run id) once for every report of it. Imports nothing on its own, so
``checks`` and ``inspection`` can use its modules without import circles."""
