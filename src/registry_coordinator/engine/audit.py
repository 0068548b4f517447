"""``coordinator audit verify``: every run's history checked against its hash chain.

Runs are read in batches of :data:`BATCH`, each batch's events in one statement, and
checked by :mod:`semantics.chain` exactly as an exported history would be checked without
the database. A run's latest event must be its ``seq``: a history cut short is a break too.
What this cannot see alone is a history rewritten with every hash recomputed; signed
checkpoints kept elsewhere are for that.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby

from registry_coordinator.engine.database import Database
from registry_coordinator.semantics.chain import Break, Event, first_break, parse

BATCH = 500


@dataclass
class Verified:
    """What a verification covered, and where the chain did not hold."""

    runs: int = 0
    events: int = 0
    breaks: list[Break] = field(default_factory=list)


async def _batches(
    db: Database, run: uuid.UUID | None, since: datetime | None
) -> AsyncIterator[list[tuple[uuid.UUID, int]]]:
    after = uuid.UUID(int=0)
    while True:
        rows = await db.rows(
            "audit_runs", {"after": after, "run": run, "since": since, "limit": BATCH}
        )
        if not rows:
            return
        yield [(row["id"], row["seq"]) for row in rows]
        after = rows[-1]["id"]


async def verify(
    db: Database, run: uuid.UUID | None = None, since: datetime | None = None
) -> Verified:
    """Check the chain of every run (or of ``run``, or of runs changed ``since``)."""
    found = Verified()
    async for batch in _batches(db, run, since):
        rows = await db.rows("audit_events", {"runs": [run_id for run_id, _ in batch]})
        events = {
            run_id: [
                Event(
                    r["run"],
                    r["seq"],
                    r["at"],
                    r["kind"],
                    r["step"],
                    r["actor"],
                    parse(r["detail"]),
                    bytes(r["hash"]),
                )
                for r in group
            ]
            for run_id, group in groupby(rows, key=lambda r: r["run"])
        }
        for run_id, last in batch:
            history = events.get(str(run_id), [])
            found.runs += 1
            found.events += len(history)
            broken = first_break(str(run_id), history, last)
            if broken is not None:
                found.breaks.append(broken)
    return found
