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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from registry_coordinator.config import CustodyConfig
from registry_coordinator.custody import (
    CustodyCode,
    DataKey,
    Sealer,
    Unopenable,
    unwrap,
    wrap,
)
from registry_coordinator.store.database import Database, Row
from registry_coordinator.store.faults import crash_point


def counted(count: int) -> str:
    """``count`` data keys, in words: "1 data key", "3 data keys"."""
    return f"{count} data key{'' if count == 1 else 's'}"


async def open_custody(db: Database, custody: CustodyConfig, *, make: bool) -> Sealer | None:
    """The sealer of ``db`` under ``custody``'s keys (None when it configures none). With
    ``make``, the installation's shared key is made if there is none yet (``serve`` seals
    new runs under it); without, a database that holds none gives None: nothing in it is
    sealed, and a command that only reads writes nothing."""
    held = await db.rows("data_keys_held")
    installation = await _installation(db, custody, held)
    if installation is None or not (make or any(row["shared"] for row in held)):
        return None
    if not any(row["shared"] for row in held):
        assert custody.active is not None
        kek = custody.keks[custody.active]
        made = DataKey(secrets.randbits(63) or 1, os.urandom(32))
        wrapped = wrap(kek, installation, made)
        await db.execute(
            "make_shared_data_key", {"id": made.id, "kek": kek.version, "wrapped": wrapped}
        )
        held = await db.rows("data_keys_held")  # ours, or another process's made first
    keys = _unwrapped(custody, installation, held)
    shared = next(keys[row["id"]] for row in held if row["shared"])
    assert shared is not None, "the shared key is never erased"
    return Sealer(installation, shared, keys)


async def versions(db: Database, custody: CustodyConfig) -> dict[int, int]:
    """How many data keys each KEK version wraps, every one unwrapped with ``custody``'s
    keys (:class:`Unopenable` as a start would refuse it); nothing is made or changed."""
    held = await db.rows("data_keys_held")
    installation = await _installation(db, custody, held)
    if installation is not None:
        _unwrapped(custody, installation, held)
    return dict(Counter(row["kek"] for row in held if row["kek"] is not None))


async def _installation(db: Database, custody: CustodyConfig, held: list[Row]) -> uuid.UUID | None:
    """The installation keys are bound to; None when ``custody`` configures none (and the
    database holds no keys it would need)."""
    if custody.active is None:
        if held:
            raise Unopenable(
                CustodyCode.KEK_MISSING,
                f"the database holds {counted(len(held))}, and the configuration has no "
                "custody keys to open them with: give custody: {keys: ..., active: N}",
            )
        return None
    timeline = await db.row("timeline")
    assert timeline is not None, "schema 13 gives the timeline its row"
    installation: uuid.UUID = timeline["installation"]
    return installation


def _unwrapped(
    custody: CustodyConfig, installation: uuid.UUID, held: list[Row]
) -> dict[int, DataKey | None]:
    """Every key of ``held`` unwrapped (None: erased)."""
    return {
        row["id"]: None
        if row["wrapped"] is None
        else unwrap(custody.keks, installation, row["id"], row["kek"], bytes(row["wrapped"]))
        for row in held
    }


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
    """Every data key of ``db`` wrapped under ``custody``'s active KEK; ``progress`` is
    told (done, of) after each key. ``db`` was opened under ``custody`` (its sealer
    holds every key unwrapped, so each version a row names is configured; it has none
    when the database holds no key)."""
    assert custody.active is not None
    kek = custody.keks[custody.active]
    held = await db.rows("data_keys_held")
    due = [row for row in held if row["kek"] not in (None, kek.version)]
    rewrapped = 0
    for done, row in enumerate(due, start=1):
        assert db.sealer is not None, "the store opened every key it holds"
        key = db.sealer.keys[row["id"]]
        assert key is not None, "a key with a version is not erased"
        wrapped = wrap(kek, db.sealer.installation, key)
        crash_point("mid-rotation")  # wrapped, not yet stored: the row is as it was
        params = {"id": row["id"], "was": row["kek"], "kek": kek.version, "wrapped": wrapped}
        rewrapped += await db.execute("rewrap_data_key", params)
        progress(done, len(due))
    now = await db.rows("data_keys_held")
    return Rotated(
        kek.version,
        rewrapped,
        sum(1 for row in held if row["kek"] == kek.version),
        sum(1 for row in held if row["kek"] is None),
        tuple(sorted({row["kek"] for row in now if row["kek"] is not None})),
    )
