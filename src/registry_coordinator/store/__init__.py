"""Store: runs in PostgreSQL, and the one way to them.

The database layer and its named queries (``sql/queries.sql``), versioned migrations
(``sql/migrations``), the embedded PostgreSQL for demos and tests, and the statements
that admit, claim, transition and read runs. Nothing here starts a task or sends a
request: the engine above decides, the store writes what it decided in one short
transaction. The face callers use is this package (``store.commit``, ``store.Claimed``):
:mod:`runs` and the modules it re-exports (:mod:`claims`, :mod:`leases`,
:mod:`statements`, and the typed records of its reads, :mod:`records`) behind it.
"""

from registry_coordinator.store.runs import *  # noqa: F403  (the face: runs.__all__)
from registry_coordinator.store.runs import __all__ as __all__
