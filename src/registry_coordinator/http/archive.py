"""What the API says about runs that retention archived: their summary as it is kept in
``archived_runs``, and the 410 ``run.archived`` that names the bundle their history went
to (for a read or an action on one, and for a start retried with its Idempotency-Key)."""

from __future__ import annotations

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import instant
from registry_coordinator.store.database import Row


def archived_status(row: Row) -> JSON:
    """An archived run as the API shows it: what is left of it here, and its bundle."""
    return {
        "id": str(row["id"]),
        "workflow": {"id": row["workflow_id"], "digest": row["digest"]},
        "caller": row["caller"],
        "state": row["state"],
        "outcome": row["outcome"],
        "admittedAt": instant(row["admitted_at"]),
        "endedAt": instant(row["ended_at"]),
        "head": row["head"],
        "archived": {
            "at": instant(row["archived_at"]),
            "bundle": row["bundle"],
            "sha256": row["sha256"],
        },
    }


def gone(row: Row) -> Problem:
    """410: the run ended and was archived, and where its history is now."""
    return Problem(
        410,
        "run.archived",
        f"run {row['id']} ended {instant(row['ended_at'])} and was archived "
        f"{instant(row['archived_at'])} to the bundle {row['bundle']} in the archive "
        "directory: its history is there (coordinator audit verify --bundle)",
        archived={
            "at": instant(row["archived_at"]),
            "bundle": row["bundle"],
            "sha256": row["sha256"],
        },
    )
