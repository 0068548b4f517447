"""The named queries of sql/queries.sql: each valid SQL against the migrated schema and
described, every name the code passes declared, and an undeclared name refused."""

from __future__ import annotations

import ast
import re
from typing import Any, cast

import psycopg
import pytest
import trio
from psycopg.conninfo import make_conninfo

from registry_coordinator.store.database import (
    QUERIES,
    Connection,
    Database,
    UnknownQuery,
    sync_connection,
)
from tests.support import ROOT, database


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_the_query_prepares(name: str, schema: str) -> None:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    sql = re.sub(r"%\((\w+)\)s", number, QUERIES[name])
    statement = "\n".join(line for line in sql.splitlines() if not line.startswith("--"))
    with sync_connection(schema) as conn:
        if statement.startswith("CREATE"):  # DDL cannot be prepared; it is idempotent, so run it
            conn.execute(sql)
            return
        conn.execute(f"PREPARE checked AS {sql}")
        conn.execute("DEALLOCATE checked")


def test_queries_are_named_uniquely() -> None:
    text = (ROOT / "src" / "registry_coordinator" / "store" / "sql" / "queries.sql").read_text()
    declared = re.findall(r"^-- name: (\S+)", text, flags=re.MULTILINE)
    assert len(declared) == len(set(declared)) == len(QUERIES)


class _Untouchable:
    """A connection that fails the test if anything is sent on it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the connection was used ({name}) for an undeclared query")


@pytest.mark.trio
@pytest.mark.parametrize("method", ["row", "rows", "execute"])
async def test_a_name_that_is_not_declared_is_refused_before_anything_is_sent(
    method: str,
) -> None:
    """A misspelled name used to be sent to PostgreSQL as if it were SQL."""
    conn = Connection(cast(Any, _Untouchable()))
    with pytest.raises(UnknownQuery, match="run_stauts"):
        await getattr(conn, method)("run_stauts", {"id": None})


@pytest.mark.trio
async def test_literal_sql_is_not_a_query_name(dsn: str) -> None:
    async with database(dsn) as db:
        with pytest.raises(UnknownQuery):
            await db.row("SELECT 1 AS one")


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_each_query_says_what_it_is_for_in_one_line(name: str) -> None:
    """Under its name, a one-line description; more only after a bare ``--`` line, so the
    first line stands alone (as Procrastinate's ``-- Get the first awaiting job``)."""
    first, second, *_ = QUERIES[name].splitlines()
    assert re.fullmatch(r"-- \S.{8,}", first), f"{name} has no description under its name"
    assert second == "--" or not second.startswith("--"), f"{name}'s description runs on"


def _names_passed(tree: ast.AST) -> set[str]:
    """The names passed as the first argument of a ``.row``, ``.rows`` or ``.execute``
    call: string literals shaped like a name (SQL text sent to psycopg directly, as
    the embedded server's setup does, is not)."""
    return {
        call.args[0].value
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("row", "rows", "execute")
        and call.args
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
        and re.fullmatch(r"[a-z_]+", call.args[0].value)
    }


def test_every_query_the_code_names_is_declared_and_every_declared_one_is_used() -> None:
    package = ROOT / "src" / "registry_coordinator"
    passed: set[str] = set()
    for module in package.rglob("*.py"):
        passed |= _names_passed(ast.parse(module.read_text(), str(module)))
    assert passed - set(QUERIES) == set(), "named but not declared in sql/queries.sql"
    assert set(QUERIES) - passed == set(), "declared in sql/queries.sql but never run"


@pytest.mark.trio
async def test_the_archivers_lock_outlives_a_short_idle_in_transaction_timeout(dsn: str) -> None:
    """The archiver's lock is a transaction left idle while the batch runs on other
    connections: a database's ``idle_in_transaction_session_timeout`` shorter than a batch
    would end it, and with it the one-archiver rule. The lock's statement turns the timeout
    off for its own transaction; any other transaction left idle as long is ended."""
    short = make_conninfo(dsn, options="-c idle_in_transaction_session_timeout=50")
    db = await Database(short, 2).open()
    try:
        async with db.connection() as other:
            await other.raw.execute("BEGIN")
            await trio.sleep(0.5)  # ten times the timeout: the session is ended meanwhile
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                await other.raw.execute("SELECT 1")
        async with db.connection() as lock, lock.transaction():
            assert await lock.row("retention_lock") == {"locked": True}
            await trio.sleep(0.5)
            assert await lock.row("retention_lock") == {"locked": True}  # held still
    finally:
        await db.close()
