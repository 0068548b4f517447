"""The checkpointer: signs the heads of runs that changed into a checkpoint, periodically
and soon after runs end.

One checkpoint takes two statements: one reads the last checkpoint and the heads that
changed since (one snapshot), one writes the next checkpoint and its leaves. Two
processes that race for the same number both compute it; the second insert finds the
number taken and writes nothing, and that process looks again at what is still unsigned
and signs it in the next number. A head read a
moment before a transition commits is still a true head: the next checkpoint has the
newer one. Nothing here is on a run's path: a checkpoint that fails is made later.

Waiting runs cost nothing: a scan looks only at runs updated since shortly before the
previous scan (``runs_by_update``), :data:`MARGIN` earlier than it, for a transition
committed just after a scan with an instant from just before it. Once an hour, and at
start, a scan looks at every run, so that a head no window caught (a clock far off, a
key configured after runs ended) is still signed.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.engine.backoff import DATABASE_OUTAGE
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.semantics.checkpoints import Checkpoint, Leaf, sign
from registry_coordinator.store.database import Database, Row, Unavailable

log = logging.getLogger(__name__)

#: Leaves in one checkpoint at most; more changed heads make more checkpoints at once.
LEAVES = 10_000
#: How long after a run ends its checkpoint is made: ends close together share one.
AFTER_END = 1.0
#: How far before the previous scan a scan looks for changed runs.
MARGIN = timedelta(seconds=10)
#: How often a scan looks at every run rather than those changed lately.
WHOLE = 3600.0


def stored(row: Row) -> Checkpoint:
    """A checkpoint as ``audit_checkpoints`` holds it (``at`` read with ``rfc3339``)."""
    return Checkpoint(
        row["number"],
        row["at"],
        row["previous"],
        bytes(row["root"]),
        row["leaves"],
        row["key"],
        bytes(row["signature"]),
    )


async def checkpoint(
    db: Database,
    key: Ed25519PrivateKey,
    since: datetime | None = None,
    runs: list[uuid.UUID] | None = None,
) -> list[Checkpoint]:
    """Sign every head that changed since the last checkpoint it was in — of the runs
    updated ``since`` (None: of any), or of ``runs`` only; the checkpoints made (none
    when nothing changed, or when another process made the same one first)."""
    made: list[Checkpoint] = []
    while True:
        last_row = await db.row("audit_last_checkpoint")
        last = stored(last_row) if last_row is not None else None
        heads = await db.rows(
            "audit_changed_heads", {"since": since, "runs": runs, "limit": LEAVES}
        )
        if not heads:
            return made
        leaves = [Leaf(r["run"], r["seq"], bytes(r["hash"])) for r in heads]
        number = last.number + 1 if last is not None else 1
        previous = last.digest() if last is not None else None
        signed = sign(key, number, heads[0]["now"], previous, leaves)
        written = await db.row(
            "audit_insert_checkpoint",
            {
                "number": signed.number,
                "at": signed.at,
                "previous": signed.previous,
                "root": signed.root,
                "leaves": signed.leaves,
                "key": signed.key,
                "signature": signed.signature,
                "runs": [leaf.run for leaf in leaves],
                "seqs": [leaf.seq for leaf in leaves],
                "heads": [leaf.head for leaf in leaves],
            },
        )
        if written is None or not written["made"]:
            # Another process made this number, perhaps over other heads: look again, until
            # a checkpoint (ours or theirs) signs every head asked for.
            continue
        made.append(signed)
        log.info("checkpoint %d signs %d run heads", signed.number, signed.leaves)
        if len(heads) < LEAVES:
            return made


class Checkpointer:
    """The nursery's service that makes checkpoints; does nothing without a key."""

    def __init__(
        self, db: Database, key: Ed25519PrivateKey | None, every: timedelta, metrics: Metrics
    ) -> None:
        self.db = db
        self.key = key
        self.every = every.total_seconds()
        self.metrics = metrics
        self._ended = trio.Event()
        self._scanned: datetime | None = None  # when the last scan began; None: never
        self._whole_at = -float("inf")  # trio time of the last scan of every run

    async def sign(self, runs: list[uuid.UUID] | None = None) -> list[Checkpoint]:
        """Sign every head that changed (of ``runs`` only, if given), now; counted in the
        metrics."""
        assert self.key is not None, "nothing is signed without a key"
        if runs is not None:
            made = await checkpoint(self.db, self.key, runs=runs)
        else:
            began = datetime.now(UTC)
            whole = self._scanned is None or trio.current_time() - self._whole_at >= WHOLE
            since = None if whole or self._scanned is None else self._scanned - MARGIN
            made = await checkpoint(self.db, self.key, since=since)
            self._scanned = began
            if whole:
                self._whole_at = trio.current_time()
        for signed in made:
            self.metrics.checkpoints.inc()
            self.metrics.checkpoint_heads.inc(signed.leaves)
        return made

    def nudge(self) -> None:
        """A run ended: sign its head soon (within :data:`AFTER_END`)."""
        self._ended.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self.key is None:
            return
        failures = 0
        next_at = trio.current_time() + self.every
        while True:
            with trio.move_on_at(next_at):
                await self._ended.wait()
                await trio.sleep(AFTER_END)  # the ends that come close together share one
            self._ended = trio.Event()
            try:
                await self.sign()
                failures = 0
                next_at = trio.current_time() + self.every
            except Unavailable as exc:
                failures += 1
                log.warning("checkpointer: database unavailable: %s", exc)
                next_at = trio.current_time() + min(DATABASE_OUTAGE.pause(failures), self.every)
