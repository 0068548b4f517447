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
from tests.support import Forms, Services, coordinator, run_state, wait_for, wait_state

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
    assert (
        'coordinator_connection_paused{connection="records"} 1.0'
        in service.http.get("/metrics").text
    )
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


def test_an_operator_pauses_and_resumes_a_connection_from_the_console(
    dsn: str, services: Services
) -> None:
    """The Admission page lists each connection and pauses or resumes it with a reason, as
    the API does; a form from another origin, or without a reason, changes nothing."""
    service, _ = services.deploy(["subject-lookup"], RECORDS)
    origin = {"Origin": service.url}
    page = service.http.get("/console/admission")
    assert page.status_code == 200 and 'id="connection-records"' in page.text
    form = Forms(page.text).by_button("Pause records")
    forged = service.http.post(form.action, data={**form.fields, "reason": REASON})
    assert forged.status_code == 403
    unexplained = service.http.post(form.action, data=dict(form.fields), headers=origin)
    assert unexplained.status_code == 400 and "request.reason-missing" in unexplained.text
    assert service.http.get("/v1/connections").json()["connections"][0]["paused"] is None

    taken = service.http.post(form.action, data={**form.fields, "reason": REASON}, headers=origin)
    assert taken.status_code == 303, taken.text
    shown = service.http.get(taken.headers["location"])
    assert "The connection is paused" in shown.text and REASON in shown.text
    resume = Forms(shown.text).by_button("Resume records")
    back = service.http.post(resume.action, data={**resume.fields, "reason": "ok"}, headers=origin)
    assert back.status_code == 303
    assert service.http.get("/v1/connections").json()["connections"][0]["paused"] is None
