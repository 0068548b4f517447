"""Data keys in the database: the installation's shared key, made once (by whichever
process starts first) and unwrapped at every start with the configured key-encryption
keys, so the store seals new runs' personal data and opens what any key it holds sealed.

A start refuses, in one line, a database whose keys the configuration cannot unwrap
(a KEK version no longer listed, or another key under the same version) and a database
that holds sealed data with no custody configured: either would otherwise be found by
the first run that needs its data, mid-flight.
"""

from __future__ import annotations

import os
import secrets

from registry_coordinator.config import CustodyConfig
from registry_coordinator.custody import (
    CustodyCode,
    DataKey,
    Sealer,
    Unopenable,
    unwrap,
    wrap,
)
from registry_coordinator.store.database import Database


async def open_custody(db: Database, custody: CustodyConfig) -> Sealer | None:
    """The sealer of ``db`` under ``custody``'s keys (None when it configures none)."""
    held = await db.rows("data_keys_held")
    if custody.active is None:
        if held:
            raise Unopenable(
                CustodyCode.KEK_MISSING,
                f"the database holds {len(held)} data keys, and the configuration has no "
                "custody keys to open them with: give custody: {keys: ..., active: N}",
            )
        return None
    timeline = await db.row("timeline")
    assert timeline is not None, "schema 13 gives the timeline its row"
    installation = timeline["installation"]
    if not any(row["shared"] for row in held):
        kek = custody.keks[custody.active]
        made = DataKey(secrets.randbits(63) or 1, os.urandom(32))
        wrapped = wrap(kek, installation, made)
        await db.execute(
            "make_shared_data_key", {"id": made.id, "kek": kek.version, "wrapped": wrapped}
        )
        held = await db.rows("data_keys_held")  # ours, or another process's made first
    keys: dict[int, DataKey | None] = {}
    shared = None
    for row in held:
        if row["wrapped"] is None:
            keys[row["id"]] = None
            continue
        key = unwrap(custody.keks, installation, row["id"], row["kek"], bytes(row["wrapped"]))
        keys[row["id"]] = key
        if row["shared"]:
            shared = key
    assert shared is not None, "the shared key is never erased"
    return Sealer(installation, shared, keys)
