"""Database roles: what the runtime role ``serve`` connects as is granted, and judging it.

The schema's owner runs ``coordinator migrate`` (``database.migrationDsn``); ``serve`` runs
as a runtime role granted only what its statements need: no DDL, no UPDATE or DELETE of
a history (``run_events``) or of anything else append-only, and runs leave the hot tables
only through ``remove_archived``, which runs with the owner's rights for runs already
archived. :data:`GRANTS` is the one list: ``migrate`` grants it, ``doctor`` holds the
runtime role against it, and docs/operations.md prints it (a test holds the three equal).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from psycopg import sql

from registry_coordinator.store.database import Database, Queries

#: Each table and what serve's statements do to it. SELECT ... FOR UPDATE or FOR SHARE
#: needs UPDATE, which every table locked so has.
GRANTS: dict[str, tuple[str, ...]] = {
    "admission": ("SELECT", "INSERT", "UPDATE"),
    "admission_events": ("SELECT", "INSERT"),
    "approvals": ("SELECT", "INSERT", "UPDATE"),
    "archived_runs": ("SELECT", "INSERT"),
    "audit_checkpoints": ("SELECT", "INSERT"),
    "audit_leaves": ("SELECT", "INSERT"),
    "bulk_job_events": ("SELECT", "INSERT"),
    "bulk_job_runs": ("SELECT", "INSERT", "UPDATE"),
    "bulk_jobs": ("SELECT", "INSERT", "UPDATE"),
    "connection_pause_events": ("SELECT", "INSERT"),
    "connection_pauses": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "console_logins": ("SELECT", "INSERT", "DELETE"),
    "console_sessions": ("SELECT", "INSERT", "DELETE"),
    "coordinator_migrations": ("SELECT",),
    "data_keys": ("SELECT", "INSERT", "UPDATE"),
    "definitions": ("SELECT", "INSERT"),
    "deliveries": ("SELECT", "INSERT"),
    "executions": ("SELECT", "INSERT", "UPDATE"),
    "feed_cursors": ("SELECT", "INSERT", "UPDATE"),
    "restores": ("SELECT", "INSERT", "UPDATE"),
    "run_events": ("SELECT", "INSERT"),
    "run_search": ("SELECT", "INSERT", "DELETE"),
    "runs": ("SELECT", "INSERT", "UPDATE"),
    "timeline": ("SELECT", "UPDATE"),
    "waits": ("SELECT", "INSERT", "DELETE"),
    "workflow_holds": ("SELECT", "INSERT", "UPDATE"),
}
#: The functions serve calls that PUBLIC may not.
FUNCTIONS = ("remove_archived(uuid[])", "forget_deliveries(bigint)")
#: What a runtime role must not have on the tables that keep history.
HISTORY = (
    "run_events",
    "definitions",
    "deliveries",
    "admission_events",
    "connection_pause_events",
    "bulk_job_events",
    "audit_checkpoints",
)
FORBIDDEN = ("UPDATE", "DELETE", "TRUNCATE")


def statements(role: str) -> list[sql.Composed]:
    """The GRANTs that give ``role`` what serve needs, and nothing more."""
    who = sql.Identifier(role)
    granted = [sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(who)]
    for table, privileges in GRANTS.items():
        granted.append(
            sql.SQL("GRANT {} ON {} TO {}").format(
                sql.SQL(", ").join(map(sql.SQL, privileges)), sql.Identifier(table), who
            )
        )
    for function in FUNCTIONS:
        granted.append(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(function), who))
    return granted


def text(role: str) -> list[str]:
    """:func:`statements` as plain SQL, for people (docs, ``migrate``'s output)."""
    return [statement.as_string(None) + ";" for statement in statements(role)]


async def current_role(db: Queries) -> str:
    row = await db.row("current_role")
    assert row is not None
    return str(row["role"])


async def grant(db: Database, role: str) -> None:
    """Grant ``role`` what serve needs (as the schema's owner), in one transaction."""
    async with db.connection() as conn, conn.transaction():
        await conn.execute_script("\n".join(text(role)))


@dataclass
class Judged:
    """The role serve connects as, held against :data:`GRANTS`."""

    role: str
    owner: bool  # the schema's owner or a superuser: it may change anything
    missing: list[str] = field(default_factory=list)  # "INSERT on run_events"
    excess: list[str] = field(default_factory=list)  # "DELETE on run_events", "CREATE on public"


async def judge(db: Queries) -> Judged:
    """What the connected role may do, against what serve needs and must not have."""
    row = await db.row("role_standing")
    assert row is not None
    judged = Judged(row["role"], row["owner"])
    for table, privileges in GRANTS.items():
        for privilege in privileges:
            if not await _has(db, table, privilege):
                judged.missing.append(f"{privilege} on {table}")
    for table in HISTORY:
        for privilege in FORBIDDEN:
            if await _has(db, table, privilege):
                judged.excess.append(f"{privilege} on {table}")
    if row["creates"]:
        judged.excess.append("CREATE on schema public")
    return judged


async def _has(db: Queries, table: str, privilege: str) -> bool:
    row = await db.row("table_privilege", {"table": table, "privilege": privilege})
    return bool(row and row["granted"])
