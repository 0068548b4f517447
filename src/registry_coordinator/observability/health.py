"""What the service's probes read from the database: whether it answers, how many runs
are in each state that has not ended, and how long the run held longest has been held.

All are read while a caller waits (``/ready``, a ``/metrics`` scrape), so both give up
after :data:`PATIENCE` seconds and say so rather than raise: a probe answers at once, and
an outage is part of what it reports, never an error of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import Database, StatementFailed, Unavailable

#: Seconds a probe waits for the database before calling it unreachable: well inside the
#: timeouts of the load balancers and scrapers that call the probes.
PATIENCE = 2

#: The states a run is in until it ends, in their order in :class:`RunState`.
ACTIVE = tuple(state for state in RunState if not state.terminal)


async def database(db: Database) -> JSON:
    """The database's part of readiness: ``ok``, or not with what went wrong; and the
    pooler the service was started behind (``database.pooler``, checked at startup)."""
    try:
        with trio.fail_after(PATIENCE):
            await db.row("server_version")
    except (trio.TooSlowError, Unavailable) as exc:
        detail = str(exc) or f"no answer within {PATIENCE} s"
        return {"ok": False, "detail": detail, "pooler": db.pooler}
    return {"ok": True, "pooler": db.pooler}


@dataclass(frozen=True)
class Runs:
    """The runs in flight, as a scrape describes them."""

    counts: dict[RunState, int]  # in each of the ACTIVE states, 0 for one with none
    held_longest: float  # seconds since the run held longest was held; 0 when none is


async def runs_now(db: Database) -> Runs | None:
    """The runs in flight now, or None if the database does not answer both reads within
    :data:`PATIENCE` (or refuses one): the gauges then keep their last values."""
    try:
        with trio.fail_after(PATIENCE):
            rows = await db.rows("active_runs_by_state")
            held_longest = await store.held_longest(db)
    except (trio.TooSlowError, Unavailable, StatementFailed):
        return None
    counts = {row["state"]: row["runs"] for row in rows}
    return Runs({state: counts.get(state, 0) for state in ACTIVE}, held_longest)
