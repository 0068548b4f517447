"""Two database roles: the schema's owner migrates and grants, ``serve`` runs as a runtime
role granted only what it needs, and that role can neither change the schema nor rewrite a
history, while runs admitted, called, checkpointed and archived all go through."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store import roles
from registry_coordinator.store.database import sync_connection
from tests.support import (
    Cluster,
    Services,
    coordinator,
    signing,
    wait_for,
    wait_state,
    write_config,
)


@pytest.fixture
def two_roles(cluster: Cluster) -> tuple[str, str]:
    """A database its own owner role owns, and a runtime role with nothing granted yet:
    the owner's connection string and the runtime role's."""
    suffix = uuid.uuid4().hex[:8]
    owner, runtime, name = f"owner_{suffix}", f"runtime_{suffix}", f"roles_{suffix}"
    with sync_connection(cluster.admin) as conn:
        conn.execute(f"CREATE ROLE {owner} LOGIN")
        conn.execute(f"CREATE ROLE {runtime} LOGIN")
        conn.execute(f"CREATE DATABASE {name} OWNER {owner}")
    admin = cluster.admin.replace("/coordinator?", f"/{name}?")
    user = admin.split("://", 1)[1].split(":", 1)[0]
    return admin.replace(f"//{user}:", f"//{owner}:"), admin.replace(f"//{user}:", f"//{runtime}:")


def database_section(owner: str, runtime: str, directory: Path) -> dict[str, Any]:
    mark = directory / "high-water.json"
    return {"dsn": runtime, "migrationDsn": owner, "poolSize": 5, "highWaterMark": str(mark)}


def test_serve_runs_as_a_runtime_role_that_cannot_change_history(
    two_roles: tuple[str, str], tmp_path: Path
) -> None:
    owner, runtime = two_roles
    section = database_section(owner, runtime, tmp_path)
    bare = write_config(tmp_path, runtime, ["chain"], extra={"database": section})

    refused = coordinator("doctor", "--config", bare)  # before migrate: no schema, no grants
    assert refused.returncode == 1
    migrated = coordinator("migrate", "--config", bare)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.splitlines()[-1].startswith("granted runtime_")
    looked = coordinator("doctor", "--config", bare)
    assert looked.returncode == 0, looked.stdout
    assert "has what it needs and cannot change history" in looked.stdout
    assert "WARN  serve connects as" not in looked.stdout

    archive = tmp_path / "archive"
    retention = {"archiveAfter": "PT1S", "directory": str(archive), "every": "PT1S"}
    extra = {"database": section, **signing(tmp_path / "keys"), "retention": retention}
    with Services(tmp_path, runtime) as services:
        service, _ = services.deploy(
            ["two-mutations"],
            {"reviews": ("casework", {}), "notices": ("messaging", {})},
            extra=extra,
        )
        run = service.start_run("two-mutations", {"id": "applicant-1"})
        wait_state(runtime, run, RunState.FINISHED)
        # Signed into a checkpoint, archived to a verified bundle, gone from the hot tables:
        # through remove_archived, the one way a history leaves.
        wait_for(runtime, "SELECT count(*) AS n FROM archived_runs WHERE id = %s", 1, params=(run,))
        wait_for(runtime, "SELECT count(*) AS n FROM runs WHERE id = %s", 0, params=(run,))
        assert service.stop() == 0

    with sync_connection(runtime) as conn:
        for forbidden in (
            "UPDATE run_events SET kind = 'x'",
            "DELETE FROM run_events",
            "DELETE FROM runs",
            "TRUNCATE definitions",
            "CREATE TABLE sneaky (id int)",
            "ALTER TABLE runs ADD COLUMN sneaky int",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(forbidden)
            conn.rollback()


def test_doctor_names_what_the_runtime_role_lacks_and_may_do_beyond(
    two_roles: tuple[str, str], tmp_path: Path
) -> None:
    owner, runtime = two_roles
    config = write_config(
        tmp_path, runtime, ["chain"], extra={"database": database_section(owner, runtime, tmp_path)}
    )
    assert coordinator("migrate", "--config", config).returncode == 0
    role = runtime.split("://", 1)[1].split(":", 1)[0]
    with sync_connection(owner) as conn:
        conn.execute(f"REVOKE INSERT ON run_events FROM {role}")
        conn.execute(f"GRANT DELETE ON run_events TO {role}")
        conn.commit()
    looked = coordinator("doctor", "--config", config)
    assert looked.returncode == 1
    assert f"FAIL  serve's role {role} lacks INSERT on run_events" in looked.stdout
    assert f"WARN  serve's role {role} may also DELETE on run_events" in looked.stdout


def test_the_grants_in_the_docs_are_the_ones_migrate_gives() -> None:
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    for statement in roles.text("coordinator_runtime"):
        assert statement in text, f"docs/operations.md lacks {statement}"
