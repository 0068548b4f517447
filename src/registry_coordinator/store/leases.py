"""Lease bookkeeping: which process holds which claims, and keeping them held.

A claim is held by its lease: the run's ``due_at`` is the lease's expiry, so a
process that dies (or a task that gives up on a claim) stops extending it and the
run falls due again for any worker. Every write a holder makes stays fenced on
the claim's lease token, whatever happens here: taking over or extending a lease
only decides when a run falls due, never who may write it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from registry_coordinator.store.database import Database


@dataclass(frozen=True)
class Holder:
    """This process as the holder of claims (the runs it is advancing).

    ``name`` is the host and port the service listens on: a process restarted on the
    same host and port is the same holder, and takes over at once the claims its
    predecessor left when it died (:func:`take_over`). Every database session of the
    process carries ``session`` as its application_name; ``family`` starts the
    session name of every process of this holder (a digest: names are cut at 63 bytes).
    """

    name: str
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def family(self) -> str:
        return "coordinator/" + hashlib.sha256(self.name.encode()).hexdigest()[:16] + "/"

    @property
    def session(self) -> str:
        return self.family + self.nonce


async def take_over(db: Database, holder: Holder) -> int:
    """Make the claims of this holder's dead predecessor due now; how many there were."""
    params = {"owner": holder.name, "family": holder.family, "session": holder.session}
    return await db.execute("take_over_claims", params)


async def extend_leases(db: Database, tokens: list[uuid.UUID], lease: timedelta) -> int:
    return await db.execute("extend_leases", {"tokens": tokens, "lease": lease})


class Holdings:
    """The claims this process is working on, counted: a worker and the call task it
    hands a run to may hold one claim at once. The lease keeper extends these only."""

    def __init__(self) -> None:
        self._counts: Counter[uuid.UUID] = Counter()

    def take(self, token: uuid.UUID) -> None:
        self._counts[token] += 1

    def let_go(self, token: uuid.UUID) -> None:
        self._counts[token] -= 1
        if self._counts[token] <= 0:
            del self._counts[token]

    @contextmanager
    def holding(self, token: uuid.UUID) -> Iterator[None]:
        self.take(token)
        try:
            yield
        finally:
            self.let_go(token)

    def tokens(self) -> list[uuid.UUID]:
        return list(self._counts)
