"""``coordinator audit``: histories checked against their hash chains and signed
checkpoints, and one run's history exported as a bundle that is checked offline.

Runs are read in batches of :data:`BATCH`, each batch's events in one statement, and
checked by :mod:`semantics.chain` exactly as a bundle is checked without the database.
A run's latest event must be its ``seq``: a history cut short is a break too. The
chain alone cannot see a history rewritten with every hash recomputed; each head a
checkpoint signed can: the event at that seq must still carry that hash. Checkpoints
themselves are checked in order: each names its predecessor's digest, its leaves give
its root, and its signature holds under the public key. A copy of a checkpoint kept
elsewhere must be the database's checkpoint of that number, which catches checkpoints
rewritten by someone who holds the key, or removed.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from registry_coordinator.audit.checkpointer import checkpoint, stored
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.custody import NO_RUN, Purpose
from registry_coordinator.errors import CoordinatorError
from registry_coordinator.semantics import bundles
from registry_coordinator.semantics.chain import Break, Event, first_break, parse
from registry_coordinator.semantics.checkpoints import Checkpoint, Leaf, inclusion, root, signed_by
from registry_coordinator.semantics.replay import Record
from registry_coordinator.store.database import Database, Row

BATCH = 500
CHECKPOINT_BATCH = 100


@dataclass
class Verified:
    """What a verification covered, and where the chain or a checkpoint did not hold."""

    runs: int = 0
    events: int = 0
    heads: int = 0  # signed heads checked against the histories
    checkpoints: int = 0
    archived: int = 0  # archived runs whose record and signed head agree
    bundles: int = 0  # and whose bundles were read and checked
    breaks: list[Break] = field(default_factory=list)
    checkpoint_breaks: list[tuple[int, str]] = field(default_factory=list)  # (number, why)
    moved: Moved | None = None  # the one run asked for, when it was archived
    erasures: list[Erased] = field(default_factory=list)  # of every run, not of one asked for


@dataclass(frozen=True)
class Erased:
    """A data subject's key, erased: when, by whom and why (None: sealed, and this
    command has no custody keys to open it), and how many runs and events (of those
    still in the database) held values sealed under it: their chain holds without them."""

    key: int
    at: datetime
    actor: str
    reason: str | None
    runs: int
    events: int


@dataclass(frozen=True)
class Moved:
    """Where the history of a run asked for by id went: the bundle it was archived to
    (under the archive directory, when that is at hand) and the event it ended at."""

    run: str
    seq: int
    bundle: str


def _event(row: Row) -> Event:
    return Event(
        row["run"],
        row["seq"],
        row["at"],
        row["kind"],
        row["step"],
        row["actor"],
        parse(row["detail"]),
        bytes(row["hash"]),
    )


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


def _unsigned_head(history: list[Event], leaves: Iterable[Row]) -> Break | None:
    """The first head a checkpoint signed that the history no longer has."""
    for leaf in leaves:
        seq = leaf["seq"]
        if seq > len(history) or history[seq - 1].hash != bytes(leaf["head"]):
            why = f"its hash is not the one checkpoint {leaf['checkpoint']} signed"
            return Break(leaf["run"], seq, why)
    return None


async def _checkpoints(db: Database, key: Ed25519PublicKey | None, found: Verified) -> None:
    """Every checkpoint in order: numbered without a gap, each naming the one before,
    its leaves giving its root, and (given the key) signed by it."""
    previous: Checkpoint | None = None
    while True:
        after = previous.number if previous is not None else 0
        rows = await db.rows("audit_checkpoints_after", {"after": after, "limit": CHECKPOINT_BATCH})
        if not rows:
            return
        for row in rows:
            c = stored(row)
            found.checkpoints += 1
            if c.number != after + 1:
                found.checkpoint_breaks.append((after + 1, "it is missing"))
            elif c.previous != (previous.digest() if previous is not None else None):
                found.checkpoint_breaks.append(
                    (c.number, "it does not name the digest of the one before")
                )
            leaves = await db.rows("audit_checkpoint_leaves", {"number": c.number})
            hashes = [Leaf(r["run"], r["seq"], bytes(r["head"])).hash() for r in leaves]
            if len(leaves) < c.leaves:
                found.checkpoint_breaks.append((c.number, _missing(leaves, c.leaves)))
            elif len(hashes) != c.leaves or root(hashes) != c.root:
                found.checkpoint_breaks.append((c.number, "its leaves do not give its signed root"))
            why = signed_by(c, key) if key is not None else None
            if why is not None:
                found.checkpoint_breaks.append((c.number, why))
            previous, after = c, c.number


#: Missing leaves of one checkpoint named each, at most; the rest are counted.
NAMED = 5


def _missing(leaves: list[Row], count: int) -> str:
    """Where the leaves a checkpoint signed but the database lacks stood: a run removed
    with its leaves leaves nothing to name it by but its place among the others, which
    are in run id order — a range to look for in the service's log and in backups."""
    runs = {r["position"]: r["run"] for r in leaves}
    gaps = [p for p in range(count) if p not in runs]
    places = []
    for p in gaps[:NAMED]:
        before = max((q for q in runs if q < p), default=None)
        after = min((q for q in runs if q > p), default=None)
        if before is not None and after is not None:
            where = f"between the runs {runs[before]} and {runs[after]}"
        elif before is not None:
            where = f"after the run {runs[before]}"
        elif after is not None:
            where = f"before the run {runs[after]}"
        else:
            where = "with no leaf left to place it by"
        places.append(f"position {p}, {where}")
    more = f"; and {len(gaps) - NAMED} more" if len(gaps) > NAMED else ""
    one = len(gaps) == 1
    return (
        f"{len(gaps)} of its {count} leaves {'is' if one else 'are'} missing: "
        f"{'; '.join(places)}{more} (in id order); "
        f"{'the run it' if one else 'the runs they'} signed {'was' if one else 'were'} removed "
        "with its leaves: look for a run id in that range in the service's log and in backups"
    )


def _bundle_holds(
    row: Row, archive: Path, key: Ed25519PublicKey | None, found: Verified
) -> str | None:
    """Why the bundle an archived run went to does not hold what was recorded, or None."""
    path = archive / row["bundle"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"its bundle {path} cannot be read: {exc.strerror}"
    if hashlib.sha256(data).hexdigest() != row["sha256"]:
        return f"its bundle {path} is not the one recorded (sha256 differs)"
    if key is not None:
        try:
            proven = bundles.check(data, key)
        except bundles.Refused as exc:
            return f"its bundle {path} does not hold: {exc}"
        if (proven.run, proven.events, proven.signed) != (row["run"], row["seq"], row["seq"]):
            return f"its bundle {path} is of another history"
    found.bundles += 1
    return None


async def _archived(
    db: Database,
    archive: Path | None,
    key: Ed25519PublicKey | None,
    found: Verified,
    run: uuid.UUID | None,
) -> None:
    """Each archived run (or ``run``, if archived): recorded at the head a checkpoint
    signed last for it (a run removed by someone who only wrote its ``archived_runs``
    row has no such head, or its bundle does not prove it), and, with the archive at
    hand, its bundle."""
    after = uuid.UUID(int=0)
    while rows := await db.rows("audit_archived", {"after": after, "run": run, "limit": BATCH}):
        for row in rows:
            if row["signed_seq"] is None:
                why: str | None = "it was archived, but no checkpoint ever signed its head"
            elif (row["signed_seq"], bytes(row["signed_head"])) != (row["seq"], bytes(row["head"])):
                why = (
                    f"it was archived at this event, but checkpoint {row['checkpoint']} "
                    f"signed event {row['signed_seq']} last"
                )
            else:
                why = _bundle_holds(row, archive, key, found) if archive is not None else None
            if why is None:
                found.archived += 1
            else:
                found.breaks.append(Break(row["run"], row["seq"], why))
            if run is not None:
                bundle = str(archive / row["bundle"]) if archive is not None else row["bundle"]
                found.moved = Moved(row["run"], row["seq"], bundle)
        after = uuid.UUID(rows[-1]["run"])


async def verify(
    db: Database,
    run: uuid.UUID | None = None,
    since: datetime | None = None,
    key: Ed25519PublicKey | None = None,
    kept: Checkpoint | None = None,
    archive: Path | None = None,
) -> Verified:
    """Check the chain and the signed heads of every run (or of ``run``, or of runs
    changed ``since``), then every archived run (with its bundle in ``archive``) and
    every run removed although signed (of these, ``run`` alone if it is no longer in the
    database), every checkpoint, and ``kept`` against the database's."""
    found = Verified()
    async for batch in _batches(db, run, since):
        ids = [run_id for run_id, _ in batch]
        rows = await db.rows("audit_events", {"runs": ids})
        events = {
            r: [_event(e) for e in group] for r, group in groupby(rows, key=lambda e: e["run"])
        }
        leaf_rows = await db.rows("audit_run_leaves", {"runs": ids})
        leaves = {r: list(group) for r, group in groupby(leaf_rows, key=lambda e: e["run"])}
        for run_id, last in batch:
            history = events.get(str(run_id), [])
            signed = leaves.get(str(run_id), [])
            found.runs += 1
            found.events += len(history)
            found.heads += len(signed)
            broken = first_break(str(run_id), history, last) or _unsigned_head(history, signed)
            if broken is not None:
                found.breaks.append(broken)
    if run is None or found.runs == 0:  # a run asked for by id may have left the database
        await _archived(db, archive, key, found, run)
        for lost in await db.rows("audit_lost_runs", {"run": run}):
            why = (
                f"the run is gone: checkpoint {lost['checkpoint']} signed this event, and the "
                "run is neither in the database nor archived"
            )
            found.breaks.append(Break(lost["run"], lost["seq"], why))
    if run is None:
        found.erasures = [_erased(db, row) for row in await db.rows("erased_events")]
    await _checkpoints(db, key, found)
    if kept is not None:
        row = await db.row("audit_checkpoint", {"number": kept.number})
        if row is None:
            found.checkpoint_breaks.append(
                (kept.number, "the copy kept elsewhere is not in the database")
            )
        elif stored(row).digest() != kept.digest():
            found.checkpoint_breaks.append(
                (kept.number, "the database's differs from the copy kept elsewhere")
            )
    return found


def _erased(db: Database, row: Row) -> Erased:
    reason = None
    if db.sealer is not None:
        place = (NO_RUN, Purpose.REASON, "erasure", row["erase_reason"], f"key.{row['id']}")
        opened = db.sealer.open(*place)
        reason = opened if isinstance(opened, str) else None
    return Erased(row["id"], row["erased_at"], row["erased_by"], reason, row["runs"], row["events"])


class Unexportable(CoordinatorError):
    """A run that cannot be exported, with why and what to do."""


#: Checkpoints' leaf hashes by number, as one archiving batch reads them: the runs of a
#: batch were mostly signed together, and a checkpoint holds up to 10,000 leaves.
Trees = dict[int, list[bytes]]


async def _holding(db: Database, run: uuid.UUID) -> list[Event]:
    """The history of ``run``, which must hold its chain: nothing is signed for one that
    does not (an event after its end, say, which a checkpoint would otherwise vouch for)."""
    events = [_event(e) for e in await db.rows("audit_events", {"runs": [run]})]
    broken = first_break(str(run), events, len(events))
    if broken is not None:
        raise Unexportable(
            f"run {run} is not exported: event {broken.seq}: {broken.why}; nothing was "
            f"signed (coordinator audit verify --run {run} says what else does not hold)"
        )
    return events


async def _record(db: Database, run: uuid.UUID, events: list[Event]) -> Record:
    """``run``'s record as its history's last event left it, opened."""
    row = await db.row("audit_run_record", {"run": run})
    assert row is not None  # a run being exported is not deleted: it is archived first
    if row["seq"] != len(events):
        raise Unexportable(f"run {run} changed while it was exported: export it again")
    if row["data_key"] is not None and db.sealer is not None and db.sealer.erased(row["data_key"]):
        raise Unexportable(
            f"run {run}'s data was erased: there is no record left to replay (its bundle "
            "without --record still verifies)"
        )
    return Record(row["input"], row["outputs"], row["output"], format_instant(row["deadline_at"]))


async def export(
    db: Database,
    run: uuid.UUID,
    key: Ed25519PrivateKey,
    trees: Trees | None = None,
    *,
    record: bool = False,
) -> bytes:
    """The bundle of ``run``: a checkpoint is made first if its head is not yet signed.
    ``trees`` keeps the checkpoints' leaves read, for the next export of a batch. With
    ``record``, an auditor's bundle: the run's record in clear, for ``audit replay``."""
    found = await db.row("audit_export_run", {"run": run})
    if found is None:
        archived = await db.row("archived_run", {"run": run})
        if archived is not None:
            raise Unexportable(
                f"run {run} was archived on {archived['archived_at']:%Y-%m-%d} to the bundle "
                f"{archived['bundle']} (sha256 {archived['sha256']}): that file is its bundle"
            )
        raise Unexportable(f"there is no run {run}")
    events = await _holding(db, run)
    if len(events) < found["seq"]:  # archived (or cut short) between the two reads
        raise Unexportable(f"run {run} changed while it was exported: export it again")
    proof = await db.row("audit_run_proof", {"run": run})
    if proof is None or proof["seq"] < len(events):
        await checkpoint(db, key, runs=[run])
        proof = await db.row("audit_run_proof", {"run": run})
    if proof is None or proof["seq"] < len(events):  # grown past its end meanwhile: unsigned
        raise Unexportable(f"run {run} changed while it was exported: export it again")
    if proof["seq"] > len(events):  # it went on since the read: the newer head is signed
        events = await _holding(db, run)
    signed = await db.row("audit_checkpoint", {"number": proof["checkpoint"]})
    assert signed is not None  # leaves reference their checkpoint
    trees = {} if trees is None else trees
    hashes = trees.get(proof["checkpoint"])
    if hashes is None:
        leaves = await db.rows("audit_checkpoint_leaves", {"number": proof["checkpoint"]})
        hashes = [Leaf(r["run"], r["seq"], bytes(r["head"])).hash() for r in leaves]
        trees[proof["checkpoint"]] = hashes
    path = inclusion(hashes, proof["position"])
    held = await _record(db, run, events) if record else None
    return bundles.write(
        str(run),
        events,
        bytes(found["artifact"]),
        stored(signed),
        proof["seq"],
        proof["position"],
        path,
        None if held is None else bundles.signed_record(key, str(run), events[-1].hash, held),
    )
