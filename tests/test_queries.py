"""Every named query in sql/queries.sql is valid SQL against the migrated schema."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from registry_coordinator.engine.database import QUERIES, sync_connection

from .harness import Cluster, migrate, write_config


@pytest.fixture(scope="module")
def schema(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    dsn = cluster.create_database()
    migrate(write_config(tmp_path_factory.mktemp("queries"), dsn, ["timed-choice"]))
    return dsn


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_the_query_prepares(name: str, schema: str) -> None:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    sql = re.sub(r"%\((\w+)\)s", number, QUERIES[name])
    with sync_connection(schema) as conn:
        if sql.startswith("CREATE"):  # DDL cannot be prepared; it is idempotent, so run it
            conn.execute(sql)
            return
        conn.execute(f"PREPARE checked AS {sql}")
        conn.execute("DEALLOCATE checked")


def test_queries_are_named_uniquely() -> None:
    text = (
        Path(__file__).resolve().parent.parent
        / "src"
        / "registry_coordinator"
        / "engine"
        / "sql"
        / "queries.sql"
    ).read_text()
    declared = re.findall(r"^-- name: (\S+)", text, flags=re.MULTILINE)
    assert len(declared) == len(set(declared)) == len(QUERIES)
