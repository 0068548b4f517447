"""Store: runs in PostgreSQL, and the one way to them.

The database layer and its named queries (``sql/queries.sql``), versioned migrations
(``sql/migrations``), the embedded PostgreSQL for demos and tests, and the statements
that admit, claim, transition and read runs. Nothing here starts a task or sends a
request: the engine above decides, the store writes what it decided in one short
transaction. The face callers use is this package (``store.commit``, ``store.Claimed``):
:mod:`runs` and the modules it re-exports (:mod:`claims`, :mod:`leases`,
:mod:`statements`, and the typed records of its reads, :mod:`records`) behind it.
The data keys personal data is sealed under are kept here too (:mod:`keys`); the
database's connections open what a run's row holds sealed, so no read hands on a
sealed value as if it were the value.

The package is larger than a room (19 modules): the data keys came in with issue 33,
the operators' tables (:mod:`pauses`, :mod:`bulk_jobs`) with issue 34, and what
operators and the console alone read and write (:mod:`console_reads`, :mod:`sessions`,
:mod:`pauses`, :mod:`bulk_jobs`, :mod:`operator_actions`) is the split it waits for: a
package of the operators' statements, beside the runs' own.
"""

from registry_coordinator.store.runs import *  # noqa: F403  (the face: runs.__all__)
from registry_coordinator.store.runs import __all__ as __all__
