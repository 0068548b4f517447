"""A connection paused for its product's maintenance, as an operator would: while it is
paused the product sees no call of a run that comes to it — the run waits, parked, not
held — and once resumed the run goes on and finishes. Who paused and resumed, when and
why, is listed by the API and the CLI (the reasons sealed at rest), ``/ready`` names the
paused connection, and a pause of a connection not configured, or without a reason, is
refused and changes nothing.
"""

from __future__ import annotations

import uuid

from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import sync_connection
from tests.support import Services, coordinator, run_state, wait_for, wait_state

RECORDS: dict[str, tuple[str, dict[str, str]]] = {"records": ("breg", {})}
REASON = "BReg maintenance window, ticket OPS-41"


def test_a_paused_connection_sends_nothing_until_resumed(dsn: str, services: Services) -> None:
    service, products = services.deploy(["subject-lookup"], RECORDS)
    refused = service.http.post("/v1/connections/recordz/pause", json={"reason": REASON})
    assert (refused.status_code, refused.json()["code"]) == (404, "connection.unknown")
    unexplained = service.http.post("/v1/connections/records/pause", json={})
    assert (unexplained.status_code, unexplained.json()["code"]) == (400, "request.reason-missing")
    paused = coordinator(
        "connections", "pause", "records", "--reason", REASON, "--url", service.url
    )
    assert paused.returncode == 0 and "paused" in paused.stdout, paused.stderr

    record = str(uuid.uuid4())
    run = service.start_run(
        "subject-lookup",
        {"recordId": record, "applicantId": f"a-{uuid.uuid4()}", "until": "2020-01-01T00:00:00Z"},
    )
    wait_for(dsn, "SELECT count(*) FROM runs WHERE paused_for = 'records'", 1)
    assert run_state(dsn, run)["state"] == RunState.RUNNING  # waiting its turn, not held
    assert products.requests("breg", "GET", "/v1/records/") == []
    assert service.http.get("/ready").json()["parts"]["connections"]["paused"] == ["records"]
    [listed] = service.http.get("/v1/connections").json()["connections"]
    assert listed["name"] == "records" and listed["paused"]["reason"] == REASON
    shown = coordinator("connections", "list", "--url", service.url)
    assert "records  breg  paused since" in shown.stdout and REASON in shown.stdout

    resumed = service.http.post("/v1/connections/records/resume", json={"reason": "done"})
    assert resumed.status_code == 200 and resumed.json()["runs"] == 1, resumed.text
    wait_state(dsn, run, RunState.FINISHED)
    [sent] = products.requests("breg", "GET", "/v1/records/")
    assert record in sent["path"]
    again = service.http.post("/v1/connections/records/resume", json={"reason": "twice"})
    assert again.json()["wasPaused"] is False
    assert service.http.get("/ready").json()["parts"]["connections"]["paused"] == []

    with sync_connection(dsn) as conn:
        rows = conn.execute(
            "SELECT paused, actor, reason::text AS reason FROM connection_pause_events ORDER BY at"
        ).fetchall()
    assert [(r["paused"], r["actor"]) for r in rows] == [
        (True, "local-developer"),
        (False, "local-developer"),
    ]
    assert all(REASON not in r["reason"] and "done" not in r["reason"] for r in rows)
