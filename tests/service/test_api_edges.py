"""The API's edges: what it refuses, and how, when a request or the world is not as expected.

Bodies not sent as JSON (415), JSON numbers no database holds (400), an Idempotency-Key
reused for another start (409), a database that is down (503 and one log line), a
shutdown under way (503), and admission holds that a start cannot slip past. Each
refusal is problem+json and changes nothing; every test runs against a real service
process or the store's own statements on real PostgreSQL.
"""

from __future__ import annotations

import signal
import time
import uuid
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.config import Policy
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.sleepers import Sleepers
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Pinned, Workflows
from registry_coordinator.http.auth import Caller
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.routes import admission
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.store.database import Database, sync_connection
from registry_coordinator.store.operator_actions import set_admission, set_workflow_hold
from tests.support import (
    TEST_WORKFLOWS,
    Cluster,
    Service,
    Services,
    bound_to_one,
    connection,
    database,
    delivery_request,
    free_port,
    rival_while_uncommitted,
    stand_ins,
)

START = {"workflow": "timed-choice", "input": {"answer": "no"}}


@pytest.fixture
def service(services: Services) -> Service:
    """A service pinning timed-choice and deadline, accepting webhooks for ``reviews``."""
    reviews = connection("casework", free_port(), webhookSecret="env:STANDIN_WEBHOOK_SECRET")
    return services(["timed-choice", "deadline"], connections={"reviews": reviews})


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == code, response.text


def run_count(dsn: str) -> int:
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT count(*) AS n FROM runs").fetchone()
    assert row is not None
    return int(row["n"])


def start(service: Service, body: Any = START, key: str | None = None) -> httpx.Response:
    return service.http.post(
        "/v1/runs", json=body, headers={"Idempotency-Key": key or uuid.uuid4().hex}
    )


def test_bodies_not_sent_as_json_get_415_and_change_nothing(service: Service, dsn: str) -> None:
    raw = b'{"workflow": "timed-choice", "input": {"answer": "no"}}'
    for media in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/xml",
        "image/png",
        "application/json; charset=latin-1",
        "application/jsonx",
    ]:
        headers = {"Content-Type": media, "Idempotency-Key": uuid.uuid4().hex}
        response = service.http.post("/v1/runs", content=raw, headers=headers)
        refused(response, 415, "request.unsupported-media-type")
    no_type = service.http.post("/v1/runs", content=raw, headers={"Idempotency-Key": "k-none"})
    refused(no_type, 415, "request.unsupported-media-type")
    assert run_count(dsn) == 0
    for media in ["application/json", "application/json; charset=UTF-8", "application/x+json"]:
        headers = {"Content-Type": media, "Idempotency-Key": uuid.uuid4().hex}
        assert service.http.post("/v1/runs", content=raw, headers=headers).status_code == 201
    run = start(service).json()["id"]
    reason = b'{"reason": "maintenance"}'
    text = {"Content-Type": "text/plain"}
    for path in [f"/v1/runs/{run}/cancel", "/v1/admission/hold"]:
        refused(
            service.http.post(path, content=reason, headers=text),
            415,
            "request.unsupported-media-type",
        )
    delivery = delivery_request({"result": "review-decision", "key": "k", "eventId": "e"})
    delivery["headers"]["Content-Type"] = "text/plain"
    refused(service.http.post(**delivery), 415, "request.unsupported-media-type")
    assert service.status(run)["state"] != "cancelled"
    assert start(service).status_code == 201, "admission was held by a refused request"
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM deliveries").fetchone() == {"n": 0}


def test_numbers_json_does_not_have_get_400_on_every_route(service: Service, dsn: str) -> None:
    run = start(service).json()["id"]
    for number in ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]:
        bodies = [
            ("/v1/runs", f'{{"workflow": "timed-choice", "input": {{"answer": {number}}}}}'),
            (f"/v1/runs/{run}/cancel", f'{{"reason": "x", "n": {number}}}'),
            ("/v1/admission/hold", f'{{"reason": {number}}}'),
        ]
        for path, text in bodies:
            headers = {"Content-Type": "application/json", "Idempotency-Key": uuid.uuid4().hex}
            response = service.http.post(path, content=text.encode(), headers=headers)
            refused(response, 400, "request.malformed-json")
        payload = (
            f'{{"result": "review-decision", "key": "k", "eventId": "e", "payload": {number}}}'
        )
        delivery = delivery_request(None, raw=payload.encode())
        refused(service.http.post(**delivery), 400, "request.malformed-json")
    assert run_count(dsn) == 1
    assert service.status(run)["state"] != "cancelled"
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM deliveries").fetchone() == {"n": 0}
        assert conn.execute("SELECT held FROM admission").fetchone() == {"held": False}


def test_the_replay_window_is_five_minutes_either_way(service: Service, dsn: str) -> None:
    """Signed 295 s ago or ahead: accepted; 305 s: refused as stale, and not kept."""
    for shift, status in [(-295, 202), (295, 202), (-305, 401), (305, 401)]:
        body = {"result": "review-decision", "key": "rev-1", "eventId": f"evt{shift:+}"}
        response = service.http.post(**delivery_request(body, at=time.time() + shift))
        assert response.status_code == status, (shift, response.text)
        if status == 401:
            assert response.json()["code"] == "webhook.signature-stale"
    with sync_connection(dsn) as conn:
        stored = conn.execute("SELECT event_id FROM deliveries ORDER BY event_id").fetchall()
    assert [r["event_id"] for r in stored] == ["evt+295", "evt-295"]


def second_version(directory: Path) -> Path:
    """timed-choice as version 2: the same steps, another pinned artifact."""
    source = (TEST_WORKFLOWS / "timed-choice.yaml").read_text()
    path = directory / "timed-choice-2.yaml"
    path.write_text(source.replace('version: "1"', 'version: "2"'))
    return path


def test_an_idempotency_key_stands_for_one_workflow_version_and_input(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    service = services(["timed-choice", "deadline", second_version(tmp_path)])
    first = start(service, {**START, "version": "1"}, key="K-1")
    assert first.status_code == 201, first.text
    original = first.json()["id"]
    for other in [
        {**START, "version": "2"},
        {"workflow": "deadline", "input": {"answer": "no"}},
        {**START, "input": {"answer": "yes"}},
        START,  # the same start, but naming no version
    ]:
        response = start(service, other, key="K-1")
        refused(response, 409, "run.key-reused")
        assert response.json()["run"] == original
    again = start(service, {**START, "version": "1"}, key="K-1")
    assert again.status_code == 200 and again.json()["id"] == original
    unversioned = start(service, START, key="K-2")
    assert unversioned.json()["workflow"]["version"] == "2"
    assert start(service, START, key="K-2").json()["id"] == unversioned.json()["id"]
    assert run_count(dsn) == 2


def test_while_the_database_is_down_the_api_answers_503_with_one_log_line(
    cluster: Cluster, dsn: str, services: Services
) -> None:
    service = services(["timed-choice"])
    run = start(service).json()["id"]
    log = service.log
    before = log.read_text()
    with cluster.refusing(dsn):
        answers = [
            start(service, key="during-outage"),
            service.http.get("/v1/runs"),
            service.http.get(f"/v1/runs/{run}"),
            service.http.get(f"/v1/runs/{run}/history"),
            service.http.post(f"/v1/runs/{run}/cancel", json={"reason": "outage"}),
            service.http.post("/v1/admission/hold", json={"reason": "outage"}),
        ]
        for response in answers:
            refused(response, 503, "service.unavailable")
            assert int(response.headers["Retry-After"]) > 0
    during = log.read_text()[len(before) :]
    assert "Traceback" not in during, during
    answered = [line for line in during.splitlines() if "answered" in line and "503" in line]
    assert len(answered) == len(answers), during
    retried = start(service, key="during-outage")
    assert retried.status_code == 201, retried.text
    assert service.status(run)["state"] != "cancelled"
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT held FROM admission").fetchone() == {"held": False}
    assert run_count(dsn) == 2


def test_no_start_is_admitted_once_shutdown_has_begun(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    """A read hangs at BReg, so the shutdown waits out its grace period with the HTTP
    front end still up: starts sent meanwhile get 503, and no run is admitted."""
    config, port = bound_to_one(tmp_path, dsn, "lookup", "records", "breg", grace="PT30S")
    with stand_ins(tmp_path / "standins.log", {"breg": port}) as products:
        products.faults("breg", {"match": "GET", "mode": "delay", "seconds": 60})
        service = services.start(config)
        try:
            body = {"workflow": "lookup", "input": {"recordId": str(uuid.uuid4())}}
            assert start(service, body).status_code == 201
            products.wait_in_flight("breg")
            service.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            log = service.log
            while "shutting down" not in log.read_text():
                assert service.process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the service never began its shutdown"
                time.sleep(0.05)
            response = start(service, body)
            refused(response, 503, "service.stopping")
            assert int(response.headers["Retry-After"]) > 0
            assert service.process.poll() is None, "the grace period was not waited out"
        finally:
            service.kill()  # the read would hang out the grace period
    assert run_count(dsn) == 1


# --- admission holds and starts, forced to race on real PostgreSQL ---------------------------

OPERATOR = Caller("starter", (Policy("starter", frozenset(), frozenset(), frozenset(), True),))


async def pinned(db: Database) -> Workflows:
    checked = check_source(TEST_WORKFLOWS / "timed-choice.yaml")
    assert checked.definition is not None and checked.digest and checked.artifact
    workflows = Workflows([Pinned(checked.definition, checked.digest, checked.artifact)])
    await workflows.store(db)
    return workflows


async def started(db: Database, workflows: Workflows) -> str:
    """A start through admission: the run's id, or the code it was refused with."""
    timer = Timer(
        db,
        timedelta(seconds=60),
        Sleepers(db, workflows, "test", timedelta(seconds=30), AfterCommit(Metrics())),
    )
    try:
        run = await admission.start(db, workflows, timer, OPERATOR, uuid.uuid4().hex, START)
        return run.run_id
    except Problem as refusal:
        return refusal.code


@pytest.mark.trio
async def test_a_start_waits_for_a_hold_in_progress_and_is_refused(dsn: str) -> None:
    """The hold is written, not yet committed, when a start comes: the start waits for it
    and is refused. (Reading the hold apart from admitting let the start through.)"""
    async with database(dsn, size=3) as db:
        workflows = await pinned(db)
        blocked, outcome = await rival_while_uncommitted(
            db,
            lambda uncommitted: set_admission(uncommitted, True, "ops", "maintenance"),
            partial(started, db, workflows),
        )
        assert (blocked, outcome) == (True, "admission.held")
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM runs").fetchone() == {"n": 0}


@pytest.mark.trio
@pytest.mark.parametrize("hold_first", [True, False])
async def test_one_workflows_hold_and_its_start_serialize(dsn: str, hold_first: bool) -> None:
    """As admission's: a start of a workflow whose hold is written, not yet committed,
    waits for it and is refused; a hold that comes while a start of it is written waits,
    so that run was admitted before the hold's answer."""
    async with database(dsn, size=3) as db:
        workflows = await pinned(db)
        hold = partial(set_workflow_hold, workflow="timed-choice", held=True, actor="ops")
        if hold_first:
            blocked, outcome = await rival_while_uncommitted(
                db,
                lambda uncommitted: hold(uncommitted, reason="a fault"),
                partial(started, db, workflows),
            )
            assert (blocked, outcome) == (True, "admission.held")
        else:
            blocked, _ = await rival_while_uncommitted(
                db, partial(started, workflows=workflows), partial(hold, db, reason="a fault")
            )
            assert blocked
    with sync_connection(dsn) as conn:
        count = conn.execute("SELECT count(*) AS n FROM runs").fetchone()
        assert count == {"n": 0 if hold_first else 1}


@pytest.mark.trio
async def test_a_hold_waits_for_a_start_in_progress(dsn: str) -> None:
    """The start is written, not yet committed, when the hold comes: the hold waits for
    it, so the run was admitted before the hold, never after its answer."""
    async with database(dsn, size=3) as db:
        workflows = await pinned(db)
        blocked, _ = await rival_while_uncommitted(
            db,
            partial(started, workflows=workflows),
            partial(set_admission, db, True, "ops", "maintenance"),
        )
        assert blocked
        with sync_connection(dsn) as conn:
            assert conn.execute("SELECT count(*) AS n FROM runs").fetchone() == {"n": 1}
        assert await started(db, workflows) == "admission.held"
