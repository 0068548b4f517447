"""The high-water mark: the database's timeline, copied to a file outside it before
requests leave, so that a database restored from a backup is recognised.

A backup knows nothing of what runs did after it was taken. Restored, it would have the
service send again what it had already sent. So no sealed request leaves before the mark
holds an epoch that the database reached *after* that sealing committed
(:meth:`HighWater.passed`): the advance of the timeline begins after the sealing's
commit, and is written to the mark, durably, before the request is sent. A backup taken
before the sealing is then behind the mark, whatever happened next; one taken after it
knows the request was sealed, and the engine never resends a sealed mutation on a guess.
Many calls share one advance: each waits for the next one to begin after it asks.

At startup, before any run is claimed, :func:`judge` holds the mark against the database:
behind it, the database is recorded as restored (``store.timeline``), every run it may have
forgotten the progress of held ``restored-review``, and the service serves operators only
until the recovery is ended. The mark names the database's installation: a mark is never
held against another database, and one that names another is refused in one line.

The file is small JSON, replaced whole (a temporary file, fsync, rename, fsync of the
directory) under an exclusive lock of a lock file beside it, keeping the greater epoch of
the file's and its own: the processes of ``serve --processes N`` share one mark. It must
not be restored with the database: keep it off the database's disks and backups.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import trio

from registry_coordinator.engine.backoff import DATABASE_OUTAGE
from registry_coordinator.errors import CoordinatorError
from registry_coordinator.store import timeline
from registry_coordinator.store.database import Database, Unavailable
from registry_coordinator.store.faults import crash_point
from registry_coordinator.store.timeline import Restore

log = logging.getLogger(__name__)

FORMAT = "registry-coordinator.high-water/v1"

#: What a run held after a restore says, in its hold's detail.
RESTORED = (
    "the database was restored from a backup, and may not know what this run did since "
    "(a request it sent, an answer it had): check the product for this run's effects, "
    "then retry-same with an attestation of what you found, reconcile, or cancel"
)


class MarkUnusable(CoordinatorError):
    """The high-water mark cannot be read, written, or held against this database (exit
    code 1: starting again cannot cure it)."""

    summary = "high-water mark unusable"


@dataclass(frozen=True)
class Mark:
    installation: uuid.UUID
    epoch: int


def read_mark(path: Path) -> Mark | None:
    """The mark at ``path``, or None if there is none yet."""
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MarkUnusable(f"the high-water mark {path} cannot be read: {exc.strerror}") from None
    try:
        data = json.loads(text)
        if data["format"] != FORMAT or not isinstance(data["epoch"], int):
            raise ValueError
        return Mark(uuid.UUID(data["installation"]), data["epoch"])
    except (ValueError, KeyError, TypeError):
        raise MarkUnusable(
            f"the high-water mark {path} is not one this build wrote ({FORMAT}): restore it "
            "from where it was copied, or, only if this database was never restored, move it "
            "away and start again"
        ) from None


def write_mark(path: Path, mark: Mark) -> Mark:
    """Raise the mark at ``path`` to ``mark`` (never lower it), durably; the mark stored."""
    try:
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            stored = read_mark(path)
            if stored is not None:
                if stored.installation != mark.installation:
                    raise MarkUnusable(_another(path, stored, mark.installation))
                if stored.epoch >= mark.epoch:
                    return stored
            text = json.dumps(
                {"format": FORMAT, "installation": str(mark.installation), "epoch": mark.epoch}
            )
            temporary = path.with_name(path.name + ".new")
            with open(temporary, "w", encoding="utf-8") as file:
                file.write(text + "\n")
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
            directory = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
            return mark
    except OSError as exc:
        raise MarkUnusable(
            f"the high-water mark {path} cannot be written: {exc.strerror}"
        ) from None


def _another(path: Path, stored: Mark, installation: uuid.UUID) -> str:
    return (
        f"the high-water mark {path} belongs to database {stored.installation}, and this "
        f"database is {installation}: point database.highWaterMark at this database's own "
        "mark (a new database needs a new file)"
    )


async def judge(db: Database, path: Path | None, actor: str) -> Restore | None:
    """Hold the mark against the database, before any run is claimed: the recovery open, if
    the database is recognised as restored now or was before and its recovery not ended."""
    if path is not None:
        async with timeline.judged(db) as judged:
            line = judged.timeline
            mark = await trio.to_thread.run_sync(read_mark, path)
            if mark is not None and mark.installation != line.installation:
                raise MarkUnusable(_another(path, mark, line.installation))
            if mark is None:
                await trio.to_thread.run_sync(write_mark, path, Mark(line.installation, line.epoch))
                if line.epoch:
                    log.warning(
                        "no high-water mark was at %s: made one at epoch %d; a restore of "
                        "this database before now cannot be recognised",
                        path,
                        line.epoch,
                    )
            elif mark.epoch > line.epoch:
                restore = await judged.restored(mark.epoch, actor, RESTORED)
                log.error(
                    "this database was restored from a backup: its timeline is at epoch %d "
                    "and the high-water mark at %d; its newest change is from %s. %d runs "
                    "are held restored-review, and the service serves operators only until "
                    "the recovery is ended (docs/operations.md, Restoring a backup)",
                    restore.database_epoch,
                    restore.mark_epoch,
                    restore.newest_change.isoformat() if restore.newest_change else "never",
                    restore.held,
                )
    return await timeline.open_restore(db)


class HighWater:
    """The advances of the timeline that requests wait for before they leave; none are
    made (and none waited for) without a mark configured."""

    def __init__(self, db: Database, path: Path | None) -> None:
        self.db = db
        self.path = path
        self._begun = 0  # advances begun
        self._done = 0  # advances in the mark
        self._asked = trio.Event()
        self._advanced = trio.Event()
        #: Why the mark cannot be raised at the moment (requests wait meanwhile), or None.
        self.failing: str | None = None

    async def passed(self) -> None:
        """Return once the mark holds an epoch the database reached after this was called:
        every request sealed before it may then leave."""
        if self.path is None:
            await trio.lowlevel.checkpoint_if_cancelled()
            return
        wanted = self._begun + 1  # an advance begun after this moment
        self._asked.set()
        while self._done < wanted:
            await self._advanced.wait()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Advance the timeline and raise the mark whenever a request waits for it: an
        outage or a mark that cannot be written is waited out, requests held meanwhile."""
        task_status.started()
        if self.path is None:
            return
        while True:
            await self._asked.wait()
            self._asked = trio.Event()
            self._begun += 1
            await self._advance(self.path)
            self._done = self._begun
            advanced, self._advanced = self._advanced, trio.Event()
            advanced.set()

    async def _advance(self, path: Path) -> None:
        failures = 0
        while True:
            try:
                line = await timeline.advance(self.db)
                crash_point("mid-mark")  # advanced, not yet in the mark: nothing was sent
                await trio.to_thread.run_sync(write_mark, path, Mark(line.installation, line.epoch))
                self.failing = None
                return
            except (Unavailable, MarkUnusable) as exc:
                self.failing = str(exc)
                log.warning("could not raise the high-water mark (%s); retrying", exc)
            failures += 1
            await trio.sleep(DATABASE_OUTAGE.pause(failures))
