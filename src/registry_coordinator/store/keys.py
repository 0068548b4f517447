"""Data keys in the database: the installation's shared key, made once (by whichever
process starts first) and unwrapped at every start with the configured key-encryption
keys, so the store seals new runs' personal data and opens what any key it holds sealed.

Rotation (:func:`rotate`) wraps each data key again under the active KEK, one row per
statement, each committed on its own and only if the row still names the version it was
read under: a kill between any two leaves every row whole under one of the configured
versions, and the next rotation goes on from there. No sealed value is touched.

A start refuses, in one line, a database whose keys the configuration cannot unwrap
(a KEK version no longer listed, or another key under the same version) and a database
that holds sealed data with no custody configured: either would otherwise be found by
the first run that needs its data, mid-flight.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from psycopg.types.json import Jsonb

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.config import CustodyConfig
from registry_coordinator.custody import (
    NO_RUN,
    CustodyCode,
    DataKey,
    Purpose,
    Sealer,
    Unopenable,
    unwrap,
    wrap,
)
from registry_coordinator.errors import CoordinatorError
from registry_coordinator.store.database import Database, Row
from registry_coordinator.store.faults import crash_point


def counted(count: int) -> str:
    """``count`` data keys, in words: "1 data key", "3 data keys"."""
    return f"{count} data key{'' if count == 1 else 's'}"


async def open_custody(db: Database, custody: CustodyConfig, *, make: bool) -> Sealer | None:
    """The sealer of ``db`` under ``custody``'s keys (None when it configures none). With
    ``make``, the installation's shared key is made if there is none yet (``serve`` seals
    new runs under it); without, a database that holds none gives None: nothing in it is
    sealed, and a command that only reads writes nothing.

    Only the shared key is unwrapped now, and one key of each KEK version a key names, so
    that a KEK configured wrongly stops the start; a subject's key is unwrapped when a
    row first names it (:meth:`Connection.rows`): a registry holds one per person."""
    versions = await db.rows("data_keys_by_version")
    installation = await _installation(db, custody, versions)
    if installation is None:
        return None
    shared = await db.row("shared_data_key")
    if shared is None and not make:
        return None
    if shared is None:
        assert custody.active is not None
        kek = custody.keks[custody.active]
        made = DataKey(_new_id(), os.urandom(32))
        wrapped = wrap(kek, installation, made)
        await db.execute(
            "make_shared_data_key", {"id": made.id, "kek": kek.version, "wrapped": wrapped}
        )
        shared = await db.row("shared_data_key")  # ours, or another process's made first
        assert shared is not None
    key = _unwrap(custody, installation, shared)
    sealer = Sealer(installation, key, {}, custody.keks, active=custody.active)
    sealer.keys[key.id] = key
    for row in versions:  # each KEK version proven configured right, its sample held
        if row["id"] != key.id:
            sealer.learn(row["id"], row["kek"], row["wrapped"])
    return sealer


def _new_id() -> int:
    return secrets.randbits(63) or 1


async def versions(db: Database, custody: CustodyConfig) -> dict[int, int]:
    """How many data keys each KEK version wraps, one of each unwrapped with
    ``custody``'s keys (:class:`Unopenable` as a start would refuse it); nothing is made
    or changed."""
    held = await db.rows("data_keys_by_version")
    installation = await _installation(db, custody, held)
    if installation is not None:
        for row in held:
            _unwrap(custody, installation, row)
    return {row["kek"]: row["count"] for row in held}


async def _installation(db: Database, custody: CustodyConfig, held: list[Row]) -> uuid.UUID | None:
    """The installation keys are bound to; None when ``custody`` configures none (and the
    database holds no keys it would need)."""
    if custody.active is None:
        if held:
            count = sum(row["count"] for row in held)
            raise Unopenable(
                CustodyCode.KEK_MISSING,
                f"the database holds {counted(count)}, and the configuration has no "
                "custody keys to open them with: give custody: {keys: ..., active: N}",
            )
        return None
    timeline = await db.row("timeline")
    assert timeline is not None, "schema 13 gives the timeline its row"
    installation: uuid.UUID = timeline["installation"]
    return installation


def _unwrap(custody: CustodyConfig, installation: uuid.UUID, row: Row) -> DataKey:
    return unwrap(custody.keks, installation, row["id"], row["kek"], bytes(row["wrapped"]))


@dataclass(frozen=True)
class Rotated:
    """What a rotation did: keys wrapped again, keys already under the active version,
    erased keys (nothing to wrap), and the versions that still wrap a key."""

    active: int
    rewrapped: int
    already: int
    erased: int
    still: tuple[int, ...]


async def rotate(
    db: Database, custody: CustodyConfig, progress: Callable[[int, int], None]
) -> Rotated:
    """Every data key of ``db`` wrapped under ``custody``'s active KEK, a page of keys at
    a time; ``progress`` is told (done, of) after each key. ``db`` was opened under
    ``custody`` (each version a key names is configured)."""
    assert custody.active is not None
    kek = custody.keks[custody.active]
    before = await db.row("data_keys_counted", {"kek": kek.version})
    assert before is not None
    installation = db.sealer.installation if db.sealer is not None else None
    rewrapped, done, after = 0, 0, 0
    while installation is not None:
        page = await db.rows("data_keys_to_rewrap", {"kek": kek.version, "after": after})
        if not page:
            break
        for row in page:
            wrapped = wrap(kek, installation, _unwrap(custody, installation, row))
            crash_point("mid-rotation")  # wrapped, not yet stored: the row is as it was
            params = {"id": row["id"], "was": row["kek"], "kek": kek.version, "wrapped": wrapped}
            rewrapped += await db.execute("rewrap_data_key", params)
            done += 1
            progress(done, before["due"])
        after = page[-1]["id"]
    now = await db.rows("data_keys_by_version")
    return Rotated(
        kek.version,
        rewrapped,
        before["already"],
        before["erased"],
        tuple(sorted(row["kek"] for row in now)),
    )


async def subject_key(db: Database, subject: str) -> int:
    """The id of ``subject``'s live data key, made if the subject has none (by this start,
    or another made first), and held by the store's sealer to seal the run under."""
    sealer = db.sealer
    assert sealer is not None and sealer.active is not None, "serve seals with custody"
    hashed = {"subject": sealer.subject_hash(subject)}
    row = await db.row("subject_data_key", hashed)
    if row is None:
        made = DataKey(_new_id(), os.urandom(32))
        kek = sealer.keks[sealer.active]
        wrapped = wrap(kek, sealer.installation, made)
        params = {**hashed, "id": made.id, "kek": kek.version, "wrapped": wrapped}
        if await db.execute("make_subject_data_key", params):
            sealer.keys[made.id] = made
            return made.id
        row = await db.row("subject_data_key", hashed)
        assert row is not None, "another start made the subject's key"
    if row["id"] not in sealer.keys:
        sealer.learn(row["id"], row["kek"], row["wrapped"])
    key: int = row["id"]
    return key


#: How ``erase_data_key`` tells every process a key was erased: ``erased:<id>`` on the
#: wake channel.
ERASED = "erased:"


def forget_notified(db: Database, payload: str) -> bool:
    """Whether ``payload`` told of an erased key, which ``db``'s sealer then forgets."""
    if not payload.startswith(ERASED):
        return False
    if db.sealer is not None:
        db.sealer.forget(int(payload.removeprefix(ERASED)))
    return True


async def forget_erased(db: Database) -> None:
    """Every key ``db``'s sealer holds that was erased meanwhile forgotten: a listener
    that was away may have missed the notice."""
    if db.sealer is None:
        return
    held = [key for key, secret in db.sealer.keys.items() if secret is not None]
    for row in await db.rows("data_keys_erased", {"ids": held}):
        db.sealer.forget(row["id"])


@dataclass(frozen=True)
class Erasure:
    """A subject's data key erased: which, when, by whom, how many runs it sealed (in the
    database and archived), and whether this call erased it or found it erased before."""

    key: int
    at: datetime
    actor: str
    runs: int
    before: bool = False


class SubjectUnknown(CoordinatorError):
    """No run was ever sealed under a key of this subject."""


class SubjectLive(CoordinatorError):
    """Some of the subject's runs have not ended: erasing now would strand them."""

    def __init__(self, runs: list[uuid.UUID]) -> None:
        listed = ", ".join(map(str, runs))
        super().__init__(
            f"the subject has runs that have not ended ({listed}{', …' if len(runs) == 5 else ''}):"
            " cancel them first (coordinator runs cancel RUN --reason …), then erase"
        )
        self.runs = runs


async def erase(db: Database, subject: str, actor: str, reason: str) -> Erasure:
    """Destroy ``subject``'s live data key for ``actor`` with ``reason`` (kept sealed under
    the shared key): every value sealed under it, here and in every bundle, is unreadable
    from then on, and every process forgets it. Refused while one of its runs is live
    (:class:`SubjectLive`); a subject already erased is said so (``before``), changing
    nothing; one never seen is :class:`SubjectUnknown`."""
    sealer = db.sealer
    if sealer is None:
        raise SubjectUnknown("this service seals nothing (no custody keys): nothing to erase")
    hashed = {"subject": sealer.subject_hash(subject)}
    async with db.connection() as conn, conn.transaction():
        key = await conn.row("lock_subject_data_key", hashed)
        if key is None:
            erased = await conn.rows("subject_erasures", hashed)
            if not erased:
                raise SubjectUnknown("no run was sealed under this subject: check the id")
            last = erased[0]
            return Erasure(last["id"], last["erased_at"], last["erased_by"], 0, before=True)
        live = await conn.rows("live_runs_of_data_key", {"key": key["id"]})
        if live:
            raise SubjectLive([row["id"] for row in live])
        sealed = sealer.seal(NO_RUN, Purpose.REASON, "erasure", reason, f"key.{key['id']}")
        done = await conn.row(
            "erase_data_key", {"key": key["id"], "actor": actor, "reason": Jsonb(sealed)}
        )
        assert done is not None, "the key was locked live"
        crash_point("mid-erasure")  # erased, not committed: a kill leaves the key whole
    sealer.forget(key["id"])
    return Erasure(done["id"], done["erased_at"], actor, done["runs"])


@dataclass(frozen=True)
class SharedPlace:
    """Where a value no run owns is sealed under the shared key (an operator's reason for
    holding admission, pausing a connection, a bulk job's filter): its place, the part
    of it, and what it is called when it cannot be opened."""

    step: str
    part: str
    what: str

    def seal(self, sealer: Sealer | None, value: JSON) -> tuple[JSON, int | None]:
        """``value`` as its row keeps it, and the id of the key it is sealed under: with
        custody, sealed (a string); without, as it is (None)."""
        if sealer is None:
            return value, None
        return sealer.seal(NO_RUN, Purpose.REASON, self.step, value, self.part), sealer.key.id

    def open(self, sealer: Sealer | None, value: JSON, key: int | None) -> JSON:
        """A value its row keeps, opened (``key`` None: kept in clear); :class:`Unopenable`
        where it does not open."""
        if key is None:
            return value
        if sealer is None:
            raise Unopenable(
                CustodyCode.KEK_MISSING,
                f"{self.what} is sealed, and the configuration has no custody keys: give "
                "custody: {keys: ..., active: N} as it was",
            )
        return sealer.open(NO_RUN, Purpose.REASON, self.step, value, self.part)
