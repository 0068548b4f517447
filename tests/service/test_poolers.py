"""The service behind PgBouncer (Debian's 1.18) in transaction mode.

A pooler in transaction mode gives each transaction whichever server session is free, so
nothing may outlive one: no server-side prepared statement (psycopg prepares a query it
has run five times), no LISTEN, no session lock. Declared (``database.pooler:
transaction``), the service prepares nothing on its pooled connections and LISTENs on
``database.sessionDsn``; undeclared, it notices that its sessions change under it and
refuses to start in one line, as ``doctor`` does, rather than run with its log full of
``prepared statement "_pg3_0" already exists`` and its wake-ups lost.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from registry_coordinator.semantics.codes import RunState
from tests.support import (
    Services,
    coordinator,
    put_to_sleep,
    signing,
    wait_for,
    wait_state,
    write_config,
)
from tests.support.pgbouncer import PgBouncer


@pytest.fixture
def pgbouncer(dsn: str, tmp_path: Path) -> Iterator[PgBouncer]:
    """PgBouncer before this test's database."""
    bouncer = PgBouncer(tmp_path / "pgbouncer", dsn)
    try:
        yield bouncer
    finally:
        bouncer.stop()


def pooled(bouncer: PgBouncer, directory: Path, **database: Any) -> dict[str, Any]:
    """A database section on the transaction-mode pool, with ``database``'s settings."""
    mark = directory / "high-water.json"
    section = {"dsn": bouncer.transaction, "poolSize": 4, "highWaterMark": str(mark)}
    return {"database": {**section, **database}}


def test_declared_the_service_runs_wakes_and_archives_through_a_transaction_pooler(
    dsn: str, pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    extra = {
        **pooled(pgbouncer, tmp_path, pooler="transaction", sessionDsn=pgbouncer.session),
        **signing(tmp_path / "keys"),
        "retention": {
            "archiveAfter": "PT1S",
            "directory": str(archive),
            "every": "PT1S",
            "batch": 2,
        },
    }
    # A sweep of ten minutes: a run put to sleep by another session wakes by NOTIFY alone.
    config = write_config(tmp_path, dsn, ["chain", "timed-choice"], sweep="PT10M", extra=extra)
    looked = coordinator("doctor", "--config", config)
    assert looked.returncode == 0, looked.stdout
    assert "ok    database.pooler: transaction" in looked.stdout
    with Services(tmp_path, dsn) as services:
        service = services.start(config)
        # Each statement of a run's path runs many times on each pooled connection: psycopg
        # would have prepared it after five.
        runs = [service.start_run("chain", {"n": 3}, key=f"chain-{n}") for n in range(12)]
        for run in runs:
            wait_state(dsn, run, RunState.FINISHED)
        # Archived in batches of two under the archiver's lock, which lasts one transaction.
        wait_for(dsn, "SELECT count(*) AS n FROM archived_runs", 12, timeout=120)
        # Runs another process put to sleep (written straight in: too unlike a real
        # history to archive), due in a second, which only the NOTIFY tells the service of.
        put_to_sleep(dsn, 3, timedelta(seconds=1), prefix="notified")
        wait_for(
            dsn,
            "SELECT count(*) AS n FROM runs WHERE start_key LIKE 'notified%%' "
            "AND state = 'finished'",
            3,
            timeout=120,
        )
        ready = service.http.get("/ready")
        assert ready.status_code == 200, ready.text
        assert ready.json()["parts"]["database"]["pooler"] == "transaction"
        assert service.stop() == 0
    log = (tmp_path / "service.log").read_text()
    assert "prepared statement" not in log and "Traceback" not in log
    assert "listener disconnected" not in log


def test_an_undeclared_transaction_pooler_is_refused_in_one_line(
    pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path, pgbouncer.transaction, ["chain"], extra=pooled(pgbouncer, tmp_path)
    )
    refused = coordinator("serve", "--config", config)
    assert refused.returncode == 1, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr
    assert "database.dsn" in lines[0] and "transaction" in lines[0]
    assert "database.pooler: transaction" in lines[0]  # the repair
    looked = coordinator("doctor", "--config", config)
    assert looked.returncode == 1
    failed = [line for line in looked.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and "database.pooler: transaction" in failed[0], looked.stdout


def test_a_session_dsn_through_a_transaction_pool_is_refused(
    pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    section = pooled(pgbouncer, tmp_path, pooler="transaction", sessionDsn=pgbouncer.transaction)
    config = write_config(tmp_path, pgbouncer.transaction, ["chain"], extra=section)
    refused = coordinator("serve", "--config", config)
    assert refused.returncode == 1, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "database.sessionDsn" in lines[0], refused.stderr


def test_a_declared_pooler_needs_a_session_dsn(tmp_path: Path) -> None:
    section = {"dsn": "postgresql://coordinator@127.0.0.1:6432/pooled", "pooler": "transaction"}
    config = write_config(tmp_path, section["dsn"], ["chain"], extra={"database": section})
    refused = coordinator("serve", "--config", config)
    assert refused.returncode == 1
    assert "database.sessionDsn" in refused.stderr and "Traceback" not in refused.stderr


def test_an_unreachable_session_dsn_is_said_in_one_line(
    pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    nowhere = "postgresql://postgres@127.0.0.1:1/session"
    section = pooled(pgbouncer, tmp_path, pooler="transaction", sessionDsn=nowhere)
    config = write_config(tmp_path, pgbouncer.transaction, ["chain"], extra=section)
    refused = coordinator("serve", "--config", config)
    assert refused.returncode == 3, refused.stderr  # unavailable now: systemd tries again
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "database.sessionDsn" in lines[0], refused.stderr
