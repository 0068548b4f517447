"""What the API says about runs that retention archived: their summary as it is kept in
``archived_runs``, and the 410 ``run.archived`` that names the bundle their history went
to (for a read or an action on one, and for a start retried with its Idempotency-Key)."""

from __future__ import annotations

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import instant


def archived_status(run: store.ArchivedRun) -> JSON:
    """An archived run as the API shows it: what is left of it here, and its bundle."""
    return {
        "id": str(run.id),
        "workflow": {"id": run.workflow_id, "digest": run.digest},
        "caller": run.caller,
        "state": run.state,
        "outcome": run.outcome,
        "admittedAt": instant(run.admitted_at),
        "endedAt": instant(run.ended_at),
        "head": run.head,
        "archived": {
            "at": instant(run.archived_at),
            "bundle": run.bundle,
            "sha256": run.sha256,
        },
    }


def gone(run: store.ArchivedRun) -> Problem:
    """410: the run ended and was archived, and where its history is now."""
    return Problem(
        410,
        "run.archived",
        f"run {run.id} ended {instant(run.ended_at)} and was archived "
        f"{instant(run.archived_at)} to the bundle {run.bundle} in the archive "
        "directory: its history is there (coordinator audit verify --bundle)",
        archived={
            "at": instant(run.archived_at),
            "bundle": run.bundle,
            "sha256": run.sha256,
        },
    )
