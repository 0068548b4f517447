"""wait-for: Casework's pushed completions, its feed, signed webhooks, the authoritative
read, wake-ups, timeouts and the poll.

Casework is a stand-in on loopback; reviews are requested at it and decided there by a
staff member. Its completions (``review.completed``) are either pushed by it or sent by
the test with the destination's secret, as it pushes them; its feed and the slow poll are
put out of the way (PT10M) unless a case is about them, so each case controls exactly
which wake-ups happen. The signed webhook route is exercised on connections configured
with ``webhookSecret``.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from registry_coordinator.http.webhooks import SIGNATURE_HEADER
from registry_coordinator.store.database import QUERIES, sync_connection
from tests.support import (
    QUIET,
    STANDIN_TOKEN,
    Service,
    Services,
    decide,
    deliver,
    delivery_request,
    events,
    metrics,
    new_review,
    push,
    pushing,
    reviews,
    run_state,
    until,
    wait_state,
)

AUTH = {"Authorization": f"Bearer {STANDIN_TOKEN}"}
#: Casework's feed and the slow poll, neither of them read while a case runs.


def deliveries(service: Service) -> dict[str, float]:
    """coordinator_webhook_deliveries_total of the reviews connection, by status."""
    return {
        dict(labels)["status"]: value
        for (name, labels), value in metrics(service).items()
        if name == "coordinator_webhook_deliveries_total"
        and dict(labels)["connection"] == "reviews"
    }


def at(event: dict[str, Any]) -> datetime:
    value = event["at"]
    assert isinstance(value, datetime)
    return value


def waiting_for(dsn: str, run: str) -> str:
    """The key the run's wait-for waits for (its review's request id), once it waits."""
    return str(
        until(
            lambda: next(
                (e["detail"]["key"] for e in events(dsn, run) if e["kind"] == "waiting"), None
            ),
            f"run {run} waiting for its result",
        )
    )


def test_a_pushed_completion_wakes_the_run_through_the_whole_tutorial(
    dsn: str, services: Services
) -> None:
    """The tutorial against the stand-ins: staff decide the review, Casework pushes its
    completion with its destination's secret (acknowledged with an empty 204) and the
    woken run reads the result; Messaging tells nothing, so the notice is read until it
    says delivered. The completion's wake-up is a NOTIFY, not the minute's sweep."""
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "applications": ("breg", {}),
        "reviews": ("casework", QUIET),
        "notices": ("messaging", {"resultPollFirst": "PT1S"}),
    }
    service, products = services.deploy(
        ["review-application"], connections, webhooks=True, sweep="PT60S"
    )
    run = service.start_run("review-application", {"applicationId": str(uuid.uuid4())})
    request_id = waiting_for(dsn, run)
    wait_state(dsn, run, "waiting")
    decide(products, request_id)
    wait_state(dsn, run, "finished")
    status = service.status(run)
    pushed = products.ledger("casework")["webhooks"]
    assert status["outcome"] == "approved-and-notified"
    message_id = status["output"]["messageId"]
    assert status["output"] == {"messageId": str(uuid.UUID(message_id))}
    message = httpx.get(products.url("messaging") + f"/v1/messages/{message_id}", headers=AUTH)
    assert (message.status_code, message.json()["status"]) == (200, "delivered")
    assert [(p["requestId"], p["status"]) for p in pushed] == [(request_id, 204)]
    history = events(dsn, run)
    # Each read of the notice that found it not yet final is kept once per change of
    # answer; how many there were depends on when Messaging's provider took it.
    polled = [e for e in history if e["kind"] == "result-polled"]
    assert {e["step"] for e in polled} <= {"await_delivery"}
    kept = [e for e in history if e["kind"] != "result-polled"]
    steps = [(e["kind"], e["step"]) for e in kept]
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
        ("result-read", "await_delivery"),
        ("step-completed", "await_delivery"),
        ("step-completed", "delivered"),
        ("finished", "approved"),
    ]
    assert kept[9]["detail"]["delivered"] is True  # the decision: read once pushed
    assert kept[16]["detail"]["delivered"] is False  # the notice: read, nothing told
    accepted = at(kept[8])
    resumed = at(kept[10]) - accepted
    next_step = at(kept[11]) - accepted
    print(
        f"completion accepted -> wait completed {resumed.total_seconds() * 1000:.1f} ms, "
        f"-> next step committed {next_step.total_seconds() * 1000:.1f} ms"
    )
    assert next_step < timedelta(seconds=30)  # woken by NOTIFY, not by the minute's sweep


def test_duplicate_reordered_early_and_late_completions_resume_each_run_once(
    dsn: str, services: Services
) -> None:
    """Casework pushes a completion again until it sees its 204, so the same event comes
    more than once; events for one review may come in any order, before its run waits,
    or after it finished. Each is kept once by its event id, and each run resumes once."""
    service, products = services.deploy(["await-review"], pushing())
    products.feed_read()
    # Five identical completions for one waiting run.
    first = new_review(products)
    run_a = service.start_run("await-review", {"requestId": first})
    wait_state(dsn, run_a, "waiting")
    decide(products, first)
    for _ in range(5):
        push(service, first, "evt-a")
    # Two completions for one review, the later event first.
    second = new_review(products)
    run_b = service.start_run("await-review", {"requestId": second})
    wait_state(dsn, run_b, "waiting")
    decide(products, second, "rejected")
    push(service, second, "evt-b2")
    push(service, second, "evt-b1")
    # A completion before its run even exists: kept, and matched when the run waits.
    third = new_review(products)
    decide(products, third)
    push(service, third, "evt-c")
    run_c = service.start_run("await-review", {"requestId": third})
    for run in (run_a, run_b, run_c):
        wait_state(dsn, run, "finished")
    # A completion for a finished run.
    before = events(dsn, run_a)
    push(service, first, "evt-z")
    time.sleep(0.5)  # time enough for a wake-up it must not cause
    with sync_connection(dsn) as conn:
        stored = conn.execute("SELECT event_id FROM deliveries ORDER BY event_id").fetchall()
    after = events(dsn, run_a)
    assert before == after
    assert [r["event_id"] for r in stored] == ["evt-a", "evt-b1", "evt-b2", "evt-c", "evt-z"]
    assert deliveries(service) == {"accepted": 5, "duplicate": 4}
    assert run_state(dsn, run_b)["output"] == {"decision": "rejected"}
    for run in (run_a, run_b, run_c):
        completed = [e for e in events(dsn, run) if e["kind"] == "step-completed"]
        assert [e["step"] for e in completed] == ["wait"], events(dsn, run)
    woken = [e for e in events(dsn, run_a) if e["kind"] == "result-delivered"]
    assert len(woken) == 1, events(dsn, run_a)  # the repeated event woke nothing more
    # The early completion was kept, and read as delivered once its run began to wait.
    read = [e for e in events(dsn, run_c) if e["kind"] in ("result-delivered", "result-read")]
    assert [(e["kind"], e["detail"].get("delivered")) for e in read] == [("result-read", True)]
    for key in (first, second, third):  # no feed, no poll: only the completions woke them
        reads = products.requests("casework", "GET", f"/v1/review-requests/{key}/result")
        assert [r["status"] for r in reads][-1:] == [200]


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
    service, products = services.deploy(["await-review"], pushing(), sweep="PT60S")
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
        # Another process accepted these completions while the listener was away.
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
        wait_state(dsn, run, "finished", timeout=45)  # under the 60 s sweep
    took = time.monotonic() - started
    ready = service.http.get("/ready").json()
    print(f"listener killed: 5 runs resumed {took:.2f} s after their deliveries")
    assert ready["parts"]["listener"] == {"ok": True, "reconnects": 1}
    for run in runs:
        assert "result-delivered" in [e["kind"] for e in events(dsn, run)]


def test_a_two_second_timeout_takes_on_timeout_and_a_late_result_changes_nothing(
    dsn: str, services: Services
) -> None:
    service, products = services.deploy(["await-review-briefly"], pushing(), sweep="PT60S")
    key = new_review(products)
    run = service.start_run("await-review-briefly", {"requestId": key})
    wait_state(dsn, run, "finished")
    decide(products, key)
    push(service, key, "late")
    time.sleep(0.5)
    history = events(dsn, run)
    assert [e["kind"] for e in history] == ["admitted", "waiting", "step-completed", "finished"]
    assert history[2]["detail"] == {"via": "on-timeout", "next": "not_decided"}
    lateness = at(history[2]) - (at(history[1]) + timedelta(seconds=2))
    print(f"wait-for timeout lateness: {lateness.total_seconds() * 1000:.1f} ms")
    assert timedelta(0) <= lateness < timedelta(seconds=30)  # its timer, not the sweep
    assert run_state(dsn, run)["outcome"] == "not-decided"
    assert deliveries(service) == {"accepted": 1}  # kept, and it woke nothing
    assert products.requests("casework", "GET", f"/v1/review-requests/{key}/result") == []


def test_without_a_push_or_a_feed_read_the_poll_completes_the_run(
    dsn: str, services: Services
) -> None:
    """No completions are configured (nothing is pushed: "lost") and the feed is read
    only at startup: the run's own poll reads the result, pending (an empty 202) until
    staff decide it."""
    service, products = services.deploy(
        ["await-review"], {"reviews": ("casework", {**QUIET, "resultPoll": "PT1S"})}
    )
    products.feed_read()
    key = new_review(products)
    run = service.start_run("await-review", {"requestId": key})
    wait_state(dsn, run, "waiting")
    path = f"/v1/review-requests/{key}/result"
    until(lambda: products.requests("casework", "GET", path), "a poll finding it pending")
    decide(products, key)
    wait_state(dsn, run, "finished")  # the feed is read again only in ten minutes
    reads = [r["status"] for r in products.requests("casework", "GET", path)]
    assert run_state(dsn, run)["output"] == {"decision": "approved"}
    assert len(reads) >= 2 and set(reads[:-1]) == {202} and reads[-1] == 200, reads
    history = events(dsn, run)
    assert "result-delivered" not in [e["kind"] for e in history]
    polled = [e["detail"]["status"] for e in history if e["kind"] == "result-polled"]
    assert polled == [202]  # pending, kept once however often it was read
    assert products.ledger("casework")["webhooks"] == []
