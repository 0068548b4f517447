"""The archiver: ended runs past ``retention.archiveAfter`` leave the hot tables for
verified bundles in ``retention.directory``.

A batch goes in this order, and a kill between any two steps loses nothing:

1. the batch's heads are signed (a checkpoint, if any is new);
2. each run's bundle is written to a temporary file, flushed to disk, renamed into place
   and the directory flushed — then read back from disk and checked as an auditor
   would, with the public key only (``crash point archive-written`` after the batch);
3. one transaction records the runs in ``archived_runs`` with each bundle's path and
   SHA-256 — only runs still ended at the seq their bundle holds — and removes their
   rows (``archive-recorded`` inside it, ``archive-committed`` after it).

Killed before 3 commits, every run is still in the hot tables, whole (a bundle left on
disk is written again next time); after, every run is in ``archived_runs`` and in a
bundle that verified. A run's bundle is the same bytes whoever writes it (its events, its
artifact, and the one checkpoint that signed its final head), so two processes archiving
the same run write the same file, and the second records nothing. The history's
append-only trigger lets a run's events go only once the run is in ``archived_runs``.
Batches are small and touch only ended runs, which no worker claims, so they hold nobody
up; bundles are written on a thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from registry_coordinator.audit import histories
from registry_coordinator.audit.checkpointer import Checkpointer
from registry_coordinator.config import RetentionConfig
from registry_coordinator.engine.backoff import DATABASE_OUTAGE
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.semantics import bundles
from registry_coordinator.store import faults
from registry_coordinator.store.database import Database, StatementFailed, Unavailable

log = logging.getLogger(__name__)
#: Seconds between full batches while a backlog is archived: each holds starts briefly.
PACE = 0.1


def bundle_path(run: uuid.UUID | str, ended_at: datetime) -> str:
    """Where a run's bundle goes under the archive directory: by the month (UTC) it ended,
    whatever the database session's time zone."""
    ended = ended_at.astimezone(UTC)
    return f"{ended:%Y}/{ended:%m}/{run}.bundle.json"


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _make_directories(directory: Path) -> None:
    """``directory`` and any parents missing, each new entry flushed to its parent, so a
    recorded bundle's path survives a power cut."""
    if directory.is_dir():
        return
    _make_directories(directory.parent)
    directory.mkdir(exist_ok=True)
    _fsync_directory(directory.parent)


def _write_verified(path: Path, data: bytes, key: Ed25519PublicKey) -> str:
    """Write ``data`` durably at ``path``, read it back and check it; its SHA-256."""
    _make_directories(path.parent)
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(path)
    _fsync_directory(path.parent)
    written = path.read_bytes()
    bundles.check(written, key)  # Refused, and the run stays, if it does not prove itself
    return hashlib.sha256(written).hexdigest()


async def archive_batch(
    db: Database, retention: RetentionConfig, checkpointer: Checkpointer, key: Ed25519PrivateKey
) -> tuple[int, int]:
    """Archive up to ``retention.batch`` runs that are due: how many were due, and how many
    this call archived (another process may have archived some first)."""
    assert retention.archive_after is not None and retention.directory is not None
    # The lock lasts a transaction that does nothing else (it holds no snapshot between
    # its statements, so it keeps nothing from vacuum); the batch's own statements run on
    # other connections. Cancelled or failed, the rollback lets the lock go. The lock's
    # statement turns idle_in_transaction_session_timeout off for this transaction only.
    async with db.connection() as lock, lock.transaction():
        locked = await lock.row("retention_lock")
        if locked is None or not locked["locked"]:
            return 0, 0  # another process is archiving: one writer of bundles at a time
        return await _archive_batch(db, retention, checkpointer, key)


async def _archive_batch(
    db: Database, retention: RetentionConfig, checkpointer: Checkpointer, key: Ed25519PrivateKey
) -> tuple[int, int]:
    assert retention.archive_after is not None and retention.directory is not None
    due = await db.rows(
        "retention_due", {"after": retention.archive_after, "limit": retention.batch}
    )
    if not due:
        return 0, 0
    await checkpointer.sign([row["id"] for row in due])
    runs, seqs, paths, digests = [], [], [], []
    trees: histories.Trees = {}
    for row in due:
        data = await histories.export(db, row["id"], key, trees)
        relative = bundle_path(row["id"], row["ended_at"])
        digest = await trio.to_thread.run_sync(
            _write_verified, retention.directory / relative, data, key.public_key()
        )
        runs.append(row["id"])
        seqs.append(row["seq"])
        paths.append(relative)
        digests.append(digest)
    faults.crash_point("archive-written")
    async with db.connection() as conn, conn.transaction():
        # Starts wait while the runs leave: one retried with a key being archived then
        # finds it in archived_runs, and never starts the run again (see retention_hold).
        await conn.execute("retention_hold_starts")
        recorded = await conn.rows(
            "retention_record",
            {"runs": runs, "seqs": seqs, "bundles": paths, "sha256s": digests},
        )
        faults.crash_point("archive-recorded")
        await conn.execute("retention_remove", {"runs": [r["id"] for r in recorded]})
    faults.crash_point("archive-committed")
    log.info("archived %d ended runs to %s", len(recorded), retention.directory)
    return len(due), len(recorded)


class Archiver:
    """The nursery's service that archives ended runs; does nothing without a retention."""

    def __init__(
        self,
        db: Database,
        retention: RetentionConfig,
        checkpointer: Checkpointer,
        metrics: Metrics,
    ) -> None:
        self.db = db
        self.retention = retention
        self.checkpointer = checkpointer
        self.metrics = metrics

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        key = self.checkpointer.key
        if self.retention.archive_after is None or key is None:
            return
        failures = 0
        while True:
            try:
                due, archived = await archive_batch(self.db, self.retention, self.checkpointer, key)
                self.metrics.archived.inc(archived)
                failures = 0
            except Unavailable as exc:
                failures += 1
                log.warning("archiver: database unavailable: %s", exc)
                await trio.sleep(DATABASE_OUTAGE.pause(failures))
                continue
            except (OSError, bundles.Refused, histories.Unexportable, StatementFailed) as exc:
                log.error("archiver: a bundle could not be written and verified: %s", exc)
                due = archived = 0
            # A full batch archived: more may be due, after the workers had their turn.
            full = due == self.retention.batch and archived > 0
            await trio.sleep(PACE if full else self.retention.every.total_seconds())
