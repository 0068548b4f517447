"""The store's typed records, made from rows as the queries name their columns: closed
lists become their enums where this build knows the code, and the API shows a run made
from a record exactly as it showed the row (StrEnum members are their text in JSON)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from registry_coordinator import store
from registry_coordinator.http.routes.runs import run_status
from registry_coordinator.semantics.codes import FailureCode, HoldCode, RunState
from registry_coordinator.store.database import Row

AT = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)


def held_row(hold_code: str) -> Row:
    """A held run's row as ``run_status`` selects it, with a late answer."""
    return {
        "id": uuid.UUID(int=7),
        "workflow_id": "act",
        "version": "1",
        "digest": "sha256:" + "0" * 64,
        "caller": "alice",
        "state": "held",
        "step": "invoke",
        "seq": 4,
        "attempt": 1,
        "timer_at": None,
        "outcome": None,
        "output": None,
        "failure_code": None,
        "hold_code": hold_code,
        "detail": "no answer",
        "admitted_at": AT,
        "deadline_at": AT,
        "updated_at": AT,
        "ended_at": None,
        "late_attempt": 1,
        "late_status": 200,
        "late_at": AT,
        "head": "ab" * 32,
    }


def test_a_runs_state_and_codes_are_their_enums() -> None:
    run = store.RunStatus.from_row(held_row("outcome-unknown"))
    assert run.state is RunState.HELD
    assert run.hold_code is HoldCode.OUTCOME_UNKNOWN
    failed = store.RunStatus.from_row(
        held_row("") | {"state": "failed", "hold_code": None, "failure_code": "request-invalid"}
    )
    assert failed.failure_code is FailureCode.REQUEST_INVALID and failed.hold_code is None


def test_a_code_this_build_does_not_know_is_kept_as_its_text() -> None:
    """A newer build may hold a run with a code this one has no member for: it is shown."""
    run = store.RunStatus.from_row(held_row("some-new-hold"))
    assert run.hold_code == "some-new-hold" and not isinstance(run.hold_code, HoldCode)


def test_the_api_shows_a_record_as_it_showed_the_row() -> None:
    shown = json.dumps(run_status(store.RunStatus.from_row(held_row("outcome-unknown"))))
    assert json.loads(shown)["state"] == "held"
    assert '"state": "held"' in shown and '"code": "outcome-unknown"' in shown
    assert json.loads(shown)["hold"] == {
        "code": "outcome-unknown",
        "detail": "no answer",
        "lateAnswer": {"attempt": 1, "status": 200, "at": "2026-03-01T09:30:00Z"},
    }
