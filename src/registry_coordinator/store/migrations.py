"""Versioned schema migrations: ``sql/migrations/NNNN_name.sql``, applied in order.

Each applied migration is recorded with the SHA-256 of its file, so a database
is known to hold exactly this build's schema: the service refuses to start on a
database that is behind (run ``coordinator migrate``), ahead (an older build),
or whose applied files differ from this build's.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from registry_coordinator.errors import CoordinatorError
from registry_coordinator.store.database import MINIMUM_SERVER_VERSION, Database, Queries


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def known() -> list[Migration]:
    """This build's migrations, in version order."""
    folder = resources.files(__package__).joinpath("sql", "migrations")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d{4})_([a-z0-9_]+)\.sql$", entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    assert [m.version for m in found] == list(range(1, len(found) + 1)), "migration numbering"
    return found


class SchemaMismatch(CoordinatorError):
    """The database's schema is not this build's; the message says what to do."""


async def check_server(db: Database) -> str:
    """Refuse a PostgreSQL older than 17; returns the server's version text."""
    row = await db.row("server_version")
    assert row is not None
    if row["version"] < MINIMUM_SERVER_VERSION:
        raise SchemaMismatch(
            f"PostgreSQL {row['text']} is too old: Registry Coordinator needs 17 or newer"
        )
    return str(row["text"])


async def pending(db: Queries) -> list[Migration]:
    """Migrations this build has that the database lacks; raises on any disagreement."""
    migrations = known()
    present = await db.row("migrations_table_exists")
    applied = await db.rows("applied_migrations") if present and present["present"] else []
    by_version = {m.version: m for m in migrations}
    newest = max((row["version"] for row in applied), default=0)
    for row in applied:
        mine = by_version.get(row["version"])
        if mine is None:  # the database's newest version is the one to name, not this one
            raise SchemaMismatch(
                f"the database has schema version {newest}, newer than this build's "
                f"{migrations[-1].version}: run a matching or newer Registry Coordinator"
            )
        if mine.checksum != row["checksum"]:
            raise SchemaMismatch(
                f"schema migration {row['version']} ({row['name']}) in the database differs "
                "from this build's file: the schema was changed by hand or by another build"
            )
    return migrations[len(applied) :]


async def migrate(db: Database) -> list[Migration]:
    """Apply what is pending in one transaction, so a schema is never half upgraded.

    An advisory lock makes concurrent ``migrate`` runs wait for each other; the
    second then finds nothing pending.
    """
    async with db.connection() as conn, conn.transaction():
        await conn.execute("lock_migrations")
        await conn.execute("create_migrations_table")
        todo = await pending(conn)
        for migration in todo:
            await conn.execute_script(migration.sql)
            await conn.execute(
                "record_migration",
                {
                    "version": migration.version,
                    "name": migration.name,
                    "checksum": migration.checksum,
                },
            )
    return todo


async def require_current(db: Database) -> None:
    """Refuse to run on a schema older than this build's."""
    missing = await pending(db)
    if missing:
        raise SchemaMismatch(
            f"the database schema is at version {missing[0].version - 1}, this build needs "
            f"{known()[-1].version}: run `coordinator migrate --config FILE`"
        )
