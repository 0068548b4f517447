"""wait-for: signed webhooks, the authoritative fetch, wake-ups, timeouts and the poll.

Casework is a stand-in on loopback; reviews are created and decided through it,
and deliveries are either sent by it or signed and sent by the test, so each
case controls exactly which wake-ups happen.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from registry_coordinator.engine.database import QUERIES, sync_connection
from registry_coordinator.http.webhooks import SIGNATURE_HEADER
from tests.harness import (
    STANDIN_TOKEN,
    WEBHOOK_SECRET,
    Service,
    Services,
    StandIns,
    decide,
    delivery_request,
    events,
    run_state,
    wait_for,
    wait_state,
)

AUTH = {"Authorization": f"Bearer {STANDIN_TOKEN}"}


def reviews(**settings: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """The one connection these tests use: Casework, accepting webhooks the tests sign."""
    return {"reviews": ("casework", {"webhookSecret": "env:STANDIN_WEBHOOK_SECRET", **settings})}


def new_review(products: StandIns) -> str:
    """A review request at the stand-in Casework, not decided yet."""
    response = httpx.post(
        products.url("casework") + "/v1/review-requests",
        headers=AUTH,
        json={"kind": "application-review", "subject": {"type": "a", "id": "1"}},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["requestId"])


def deliver(
    service: Service,
    body: dict[str, Any],
    *,
    connection_name: str = "reviews",
    secret: str = WEBHOOK_SECRET,
    at: float | None = None,
) -> httpx.Response:
    return service.http.post(**delivery_request(body, connection_name, secret=secret, at=at))


def at(event: dict[str, Any]) -> datetime:
    value = event["at"]
    assert isinstance(value, datetime)
    return value


def test_a_signed_webhook_wakes_the_run_through_the_whole_tutorial(
    dsn: str, services: Services
) -> None:
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "applications": ("breg", {}),
        "reviews": ("casework", {}),
        "notices": ("messaging", {}),
    }
    service, products = services.deploy(
        ["review-application"], connections, webhooks=True, sweep="PT60S"
    )
    run = service.start_run("review-application", {"applicationId": "app-1001"})
    wait_for(dsn, "SELECT step FROM runs WHERE id = %s", "await_decision", params=(run,))
    wait_state(dsn, run, "waiting")
    decide(products, "rev-1")
    wait_state(dsn, run, "finished")
    status = service.status(run)
    webhooks = [w["status"] for w in products.ledger("casework")["webhooks"]]
    assert status["outcome"] == "approved-and-notified"
    assert status["output"] == {"messageId": "msg-1"}
    assert webhooks == [202]
    history = events(dsn, run)
    steps = [(e["kind"], e["step"]) for e in history]
    assert steps == [
        ("admitted", "read_application"),
        ("call-dispatched", "read_application"),
        ("call-answered", "read_application"),
        ("step-completed", "read_application"),
        ("call-dispatched", "request_review"),
        ("call-answered", "request_review"),
        ("step-completed", "request_review"),
        ("waiting", "await_decision"),
        ("result-delivered", "await_decision"),
        ("result-read", "await_decision"),
        ("step-completed", "await_decision"),
        ("step-completed", "route"),
        ("call-dispatched", "notify"),
        ("call-answered", "notify"),
        ("step-completed", "notify"),
        ("waiting", "await_delivery"),
        ("result-delivered", "await_delivery"),
        ("result-read", "await_delivery"),
        ("step-completed", "await_delivery"),
        ("finished", "approved"),
    ]
    accepted = at(history[8])
    resumed = at(history[10]) - accepted
    next_step = at(history[11]) - accepted
    print(
        f"webhook accepted -> wait completed {resumed.total_seconds() * 1000:.1f} ms, "
        f"-> next step committed {next_step.total_seconds() * 1000:.1f} ms"
    )
    assert next_step < timedelta(seconds=30)  # woken by NOTIFY, not by the minute's sweep


def test_duplicate_reordered_early_and_late_deliveries_resume_each_run_once(
    dsn: str, services: Services
) -> None:
    service, products = services.deploy(["await-review"], reviews())
    # Five identical deliveries for one waiting run.
    first = new_review(products)
    run_a = service.start_run("await-review", {"requestId": first})
    wait_state(dsn, run_a, "waiting")
    decide(products, first)
    answers = [
        deliver(service, {"result": "review-decision", "key": first, "eventId": "evt-a"})
        for _ in range(5)
    ]
    # Two deliveries for one key, the later event first.
    second = new_review(products)
    run_b = service.start_run("await-review", {"requestId": second})
    wait_state(dsn, run_b, "waiting")
    decide(products, second, "rejected")
    deliver(service, {"result": "review-decision", "key": second, "eventId": "evt-b2"})
    deliver(service, {"result": "review-decision", "key": second, "eventId": "evt-b1"})
    # A delivery before its run even exists.
    third = new_review(products)
    decide(products, third)
    early = deliver(service, {"result": "review-decision", "key": third, "eventId": "evt-c"})
    run_c = service.start_run("await-review", {"requestId": third})
    for run in (run_a, run_b, run_c):
        wait_state(dsn, run, "finished")
    # A delivery for a finished run.
    before = events(dsn, run_a)
    late = deliver(service, {"result": "review-decision", "key": first, "eventId": "evt-z"})
    time.sleep(0.5)
    after = events(dsn, run_a)
    assert [a.status_code for a in answers] == [202] * 5
    assert [a.json()["duplicate"] for a in answers] == [False, True, True, True, True]
    assert early.status_code == 202 and early.json()["woke"] == 0
    assert late.status_code == 202 and late.json()["woke"] == 0
    assert before == after
    assert run_state(dsn, run_b)["output"] == {"decision": "rejected"}
    for run in (run_a, run_b, run_c):
        completed = [e for e in events(dsn, run) if e["kind"] == "step-completed"]
        assert [e["step"] for e in completed] == ["wait"], events(dsn, run)
    with sync_connection(dsn) as conn:
        stored = conn.execute("SELECT event_id FROM deliveries ORDER BY event_id").fetchall()
    assert [r["event_id"] for r in stored] == ["evt-a", "evt-b1", "evt-b2", "evt-c", "evt-z"]


def test_forged_stale_foreign_and_oversized_deliveries_change_nothing(
    dsn: str, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTHER_SECRET", "another-connections-secret")
    connections = {**reviews(), "archive": ("casework", {"webhookSecret": "env:OTHER_SECRET"})}
    body = {"result": "review-decision", "key": "rev-1", "eventId": "evt-1"}
    service, _ = services.deploy(["await-review"], connections)
    cases = [
        (deliver(service, body, secret="forged"), 401, "webhook.signature-invalid"),
        (deliver(service, body, at=time.time() - 400), 401, "webhook.signature-stale"),
        (deliver(service, body, at=time.time() + 400), 401, "webhook.signature-stale"),
        (
            deliver(service, body, secret="another-connections-secret"),
            401,
            "webhook.signature-invalid",
        ),
        (service.http.post("/v1/results/reviews", json=body), 401, "webhook.signature-missing"),
        (
            service.http.post(
                "/v1/results/reviews", json=body, headers={SIGNATURE_HEADER: "sha256=abc"}
            ),
            401,
            "webhook.signature-invalid",
        ),
        (  # the first format's signature, which left the connection out
            service.http.post(
                "/v1/results/reviews",
                json=body,
                headers={SIGNATURE_HEADER: f"t={int(time.time())},v1={'0' * 64}"},
            ),
            401,
            "webhook.signature-invalid",
        ),
        (deliver(service, {**body, "padding": "x" * 2_000_000}), 413, "request.too-large"),
        (deliver(service, body, connection_name="nowhere"), 404, "connection.unknown"),
        (
            deliver(service, {**body, "result": "message-delivered"}),
            422,
            "webhook.invalid-delivery",
        ),
        (
            deliver(service, {"result": "review-decision", "key": ""}),
            400,
            "webhook.invalid-delivery",
        ),
    ]
    cases.append(
        (
            service.http.post(**delivery_request(None, raw=b"{not json")),
            400,
            "request.malformed-json",
        )
    )
    for response, status, code in cases:
        assert response.status_code == status, response.text
        assert response.json()["code"] == code
        assert response.headers["content-type"] == "application/problem+json"
    good = deliver(service, body, secret="another-connections-secret", connection_name="archive")
    assert good.status_code == 202
    with sync_connection(dsn) as conn:
        stored = conn.execute("SELECT connection, event_id FROM deliveries").fetchall()
    assert stored == [{"connection": "archive", "event_id": "evt-1"}]


def test_a_delivery_signed_for_one_connection_is_refused_by_another_sharing_its_secret(
    dsn: str, services: Services
) -> None:
    """The signature covers the connection, so a secret given to two connections does
    not let one's deliveries be replayed to the other."""
    shared = {"webhookSecret": "env:STANDIN_WEBHOOK_SECRET"}
    connections = {**reviews(), "mirror": ("casework", shared)}
    body = {"result": "review-decision", "key": "rev-1", "eventId": "evt-1"}
    service, _ = services.deploy(["await-review"], connections)
    for_mirror = delivery_request(body, "mirror")
    replayed = service.http.post(**{**for_mirror, "url": "/v1/results/reviews"})
    assert replayed.status_code == 401, replayed.text
    assert replayed.json()["code"] == "webhook.signature-invalid"
    assert service.http.post(**for_mirror).status_code == 202
    with sync_connection(dsn) as conn:
        stored = conn.execute("SELECT connection, event_id FROM deliveries").fetchall()
    assert stored == [{"connection": "mirror", "event_id": "evt-1"}]


def test_results_delivered_while_the_listener_is_down_still_wake_their_runs(
    dsn: str, services: Services
) -> None:
    service, products = services.deploy(
        ["await-review"], reviews(resultPoll="PT10M"), sweep="PT60S"
    )
    keys = [new_review(products) for _ in range(5)]
    runs = [service.start_run("await-review", {"requestId": key}) for key in keys]
    for run in runs:
        wait_state(dsn, run, "waiting")
    for key in keys:
        decide(products, key)
    with sync_connection(dsn) as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity "
            "WHERE query = 'LISTEN coordinator_wake'"
        ).fetchall()
        assert killed == [{"killed": True}]
        # Another process accepted these deliveries while the listener was away.
        for n, key in enumerate(keys):
            conn.execute(
                QUERIES["record_delivery"],
                {
                    "connection": "reviews",
                    "event_id": f"evt-{n}",
                    "result": "review-decision",
                    "key": key,
                    "payload": None,
                },
            )
    started = time.monotonic()
    for run in runs:
        wait_state(dsn, run, "finished", timeout=20)
    took = time.monotonic() - started
    ready = service.http.get("/ready").json()
    print(f"listener killed: 5 runs resumed {took:.2f} s after their deliveries")
    assert ready["parts"]["listener"] == {"ok": True, "reconnects": 1}


def test_a_two_second_timeout_takes_on_timeout_and_a_late_result_changes_nothing(
    dsn: str, services: Services
) -> None:
    service, products = services.deploy(["await-review-briefly"], reviews(), sweep="PT60S")
    key = new_review(products)
    run = service.start_run("await-review-briefly", {"requestId": key})
    wait_state(dsn, run, "finished")
    decide(products, key)
    late = deliver(service, {"result": "review-decision", "key": key, "eventId": "late"})
    time.sleep(0.5)
    history = events(dsn, run)
    assert [e["kind"] for e in history] == ["admitted", "waiting", "step-completed", "finished"]
    assert history[2]["detail"] == {"via": "on-timeout", "next": "not_decided"}
    lateness = at(history[2]) - (at(history[1]) + timedelta(seconds=2))
    print(f"wait-for timeout lateness: {lateness.total_seconds() * 1000:.1f} ms")
    assert timedelta(0) <= lateness < timedelta(seconds=30)  # its timer, not the sweep
    assert run_state(dsn, run)["outcome"] == "not-decided"
    assert late.status_code == 202 and late.json()["woke"] == 0


def test_when_the_webhook_is_lost_the_poll_completes_the_run(dsn: str, services: Services) -> None:
    service, products = services.deploy(["await-review"], reviews(resultPoll="PT1S"))
    key = new_review(products)
    run = service.start_run("await-review", {"requestId": key})
    wait_state(dsn, run, "waiting")
    time.sleep(1.5)  # a poll or two find it pending
    decide(products, key)  # no webhook is configured: it is "lost"
    wait_state(dsn, run, "finished", timeout=10)
    reads = products.requests("casework", "GET", f"/v1/review-requests/{key}/result")
    assert run_state(dsn, run)["output"] == {"decision": "approved"}
    assert len(reads) >= 2
    assert "result-delivered" not in [e["kind"] for e in events(dsn, run)]
