"""Four eyes: over a connection configured ``fourEyes``, a retry-same or cancel of a run
whose mutation is in doubt takes effect only once a second operator approves it.

The first operator's action is kept pending (202, nothing sent); they cannot approve it
themselves; a second operator's approval takes it, as the first, recorded in the run's
history with both people and both reasons; a rejection leaves the run held; an approval
of a run that changed meanwhile takes nothing and is stale. A bulk job does not take
such an action at all.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from registry_coordinator.semantics.codes import RunState
from tests.support import (
    HANG_ONCE,
    Service,
    Services,
    StandIns,
    call,
    coordinator,
    jwt_auth,
    token,
    until,
    wait_state,
)

NOTICES = {"requestTimeout": "PT1S", "verification": {"attempts": 0}, "fourEyes": True}


def _operator(person: str) -> str:
    """A token for ``person``, an operator signed in at the console's client; made when a
    test runs, not when its module is collected (it expires in minutes)."""
    return token("registry-operators", "coordinator.operate", sub=person)


def _held(service: Service, products: StandIns, dsn: str, ada: str) -> str:
    """A run held outcome-unknown: Messaging applied its message, and never answered."""
    products.faults("messaging", HANG_ONCE)
    answer = call(
        service,
        "POST",
        "/v1/runs",
        ada,
        json={"workflow": "notify", "input": {"email": f"{uuid.uuid4().hex[:8]}@example.org"}},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert answer.status_code == 201, answer.text
    run = str(answer.json()["id"])
    wait_state(dsn, run, RunState.HELD)
    return run


def _post(service: Service, who: str, path: str, reason: str) -> Any:
    return call(service, "POST", path, who, json={"reason": reason})


def test_an_action_on_a_mutation_in_doubt_waits_for_a_second_operator(
    dsn: str, services: Services, tmp_path: Path
) -> None:
    ada, bo = _operator("ada"), _operator("bo")
    auth = jwt_auth(tmp_path)
    service, products = services.deploy(
        ["notify"], {"notices": ("messaging", NOTICES)}, extra={"auth": auth}
    )
    run = _held(service, products, dsn, ada)

    asked = _post(service, ada, f"/v1/runs/{run}/retry-same", "INC-9: Messaging restarted")
    assert asked.status_code == 202, asked.text
    approval = asked.json()["approval"]
    assert approval["state"] == "pending" and approval["requestedBy"] == "ada (registry-operators)"
    assert call(service, "GET", f"/v1/runs/{run}", ada).json()["state"] == "held"
    assert len(products.requests("messaging", "POST", "/v1/messages")) == 1  # nothing resent
    again = _post(service, ada, f"/v1/runs/{run}/cancel", "or cancel it")
    assert again.status_code == 409 and again.json()["code"] == "approval.pending", again.text
    listed = call(service, "GET", "/v1/approvals", bo).json()["approvals"]
    assert [a["id"] for a in listed] == [approval["id"]]
    bo_token = tmp_path / "bo.token"
    bo_token.write_text(bo)
    shown = coordinator("approvals", "list", "--url", service.url, "--token-file", bo_token)
    assert shown.returncode == 0 and approval["id"] in shown.stdout, shown.stderr
    assert "retry-same of run" in shown.stdout and "INC-9: Messaging restarted" in shown.stdout

    decide = f"/v1/approvals/{approval['id']}"
    mine = _post(service, ada, f"{decide}/approve", "looks right to me")
    assert mine.status_code == 403 and mine.json()["code"] == "approval.self", mine.text
    approved = _post(service, bo, f"{decide}/approve", "checked Messaging: not delivered")
    assert approved.status_code == 200, approved.text
    assert approved.json()["approval"]["state"] == "approved"
    assert approved.json()["approval"]["decidedBy"] == "bo (registry-operators)"
    wait_state(dsn, run, RunState.FINISHED)
    assert len(products.requests("messaging", "POST", "/v1/messages")) == 2
    events = call(service, "GET", f"/v1/runs/{run}/history", ada).json()["events"]
    [taken] = [e for e in events if "approvedBy" in e["detail"]]
    assert taken["actor"] == "ada (registry-operators)"
    assert taken["detail"]["reason"] == "INC-9: Messaging restarted"
    assert taken["detail"]["approvedBy"] == "bo (registry-operators)"
    assert taken["detail"]["approval"] == "checked Messaging: not delivered"
    twice = _post(service, bo, f"{decide}/approve", "again")
    assert twice.status_code == 409 and twice.json()["code"] == "approval.decided"

    second = _held(service, products, dsn, ada)
    first_ask = _post(service, ada, f"/v1/runs/{second}/cancel", "the applicant withdrew")
    rejected = _post(
        service, bo, f"/v1/approvals/{first_ask.json()['approval']['id']}/reject", "not yet"
    )
    assert rejected.json()["approval"]["state"] == "rejected" and rejected.json()["run"] is None
    assert call(service, "GET", f"/v1/runs/{second}", ada).json()["state"] == "held"
    later = _post(service, ada, f"/v1/runs/{second}/cancel", "the applicant withdrew, really")
    assert later.status_code == 202, later.text
    reconciled = _post(service, bo, f"/v1/runs/{second}/reconcile", "Messaging has it")
    assert reconciled.status_code == 200, reconciled.text  # reconcile needs no approval
    stale = _post(service, bo, f"/v1/approvals/{later.json()['approval']['id']}/approve", "ok")
    assert stale.status_code == 409 and stale.json()["code"] == "run.changed", stale.text
    assert call(service, "GET", "/v1/approvals", bo).json()["approvals"] == []
    assert call(service, "GET", f"/v1/runs/{second}", ada).json()["state"] == "finished"

    third = _held(service, products, dsn, ada)
    body = {"action": "retry-same", "filter": {"workflow": "notify", "state": "held"}}
    job = call(service, "POST", "/v1/bulk-jobs", ada, json=body).json()
    _post(service, ada, f"/v1/bulk-jobs/{job['id']}/start", "redrive")
    done = until(
        lambda: j if (j := call(service, "GET", f"/v1/bulk-jobs/{job['id']}", ada).json())[
            "state"] == "done" else None, "job done",
    )  # fmt: skip
    assert done["notActedOn"][0]["run"] == third
    assert done["notActedOn"][0]["code"] == "approval.required"
    assert call(service, "GET", f"/v1/runs/{third}", ada).json()["state"] == "held"
