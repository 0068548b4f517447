"""What a run's history says of each request it sent and each result it read, against
stand-in products on loopback (or none, where a refused connection is the case).

``call-dispatched`` is written before a byte leaves; the event after it says what became
of the request: ``call-answered``, ``call-not-sent`` or ``call-lost``. A wait-for's reads
are there too: ``result-polled`` once per change of answer, and the ``result-read`` that
completes the step. Every history still holds its hash chain.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from registry_coordinator.http.console import wording
from registry_coordinator.semantics.codes import RunState
from tests.support import (
    HANG_ONCE,
    QUIET,
    Service,
    Services,
    StandIns,
    bound_to_one,
    coordinator,
    decide,
    events,
    new_review,
    wait_for,
    wait_state,
)


def kinds(history: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in history]


def holds_its_chain(config: Path) -> None:
    """`coordinator audit verify` finds every history in the database whole."""
    verified = coordinator("audit", "verify", "--config", config)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def said_in_plain_words(history: list[dict[str, Any]]) -> None:
    """The console has words for every kind of event the history holds."""
    assert [k for k in kinds(history) if not wording.event(k)] == []


def test_a_refused_connection_reads_as_not_sent_then_retried(
    dsn: str, services: Services, tmp_path: Path
) -> None:
    config, _ = bound_to_one(tmp_path, dsn, "notify", "notices", "messaging")  # nobody listens
    service = services.start(config)
    run = service.start_run("notify", {"email": "a@example.org"})
    retried = "SELECT count(*) >= 2 FROM run_events WHERE run_id = %s AND kind = 'retry-scheduled'"
    wait_for(dsn, retried, True, params=(run,))
    service.stop()
    history = events(dsn, run)
    assert kinds(history)[:4] == ["admitted", "call-dispatched", "call-not-sent", "retry-scheduled"]
    dispatched = [n for n, e in enumerate(history) if e["kind"] == "call-dispatched"]
    for attempt, n in enumerate(dispatched, start=1):
        dispatch, outcome, retry = history[n : n + 3]
        assert dispatch["detail"]["attempt"] == attempt
        assert outcome["kind"] == "call-not-sent" and outcome["step"] == "send"
        assert outcome["detail"]["attempt"] == attempt
        assert outcome["detail"]["detail"].startswith("ConnectError"), outcome
        assert retry["kind"] == "retry-scheduled"
        assert retry["detail"]["detail"] == "not sent: " + outcome["detail"]["detail"]
    said_in_plain_words(history)
    holds_its_chain(config)


def test_an_answer_reads_as_answered_with_its_status(dsn: str, services: Services) -> None:
    service, products = services.deploy(["lookup"], {"records": ("breg", {})})
    run = service.start_run("lookup", {"recordId": str(uuid.uuid4())})
    wait_state(dsn, run, RunState.FINISHED)
    history = events(dsn, run)
    assert kinds(history) == [
        "admitted",
        "call-dispatched",
        "call-answered",
        "step-completed",
        "finished",
    ]
    assert history[2]["detail"] == {"attempt": 1, "status": 200}
    assert [r["status"] for r in products.requests("breg", "GET", "/v1/records/")] == [200]
    said_in_plain_words(history)
    holds_its_chain(service.config)


def held_after_a_timeout(dsn: str, services: Services) -> tuple[Service, StandIns, str]:
    """A notice that Messaging applied and never answered within the 1 s timeout: held at
    once, the connection asking Messaging for no receipt before it holds (test_products
    has the asking)."""
    settings = {"requestTimeout": "PT1S", "verification": {"attempts": 0}}
    service, products = services.deploy(["notify"], {"notices": ("messaging", settings)})
    products.faults("messaging", HANG_ONCE)
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, run, RunState.HELD)
    return service, products, run


def test_a_mutation_that_times_out_reads_as_lost_and_is_held(dsn: str, services: Services) -> None:
    service, _, run = held_after_a_timeout(dsn, services)
    history = events(dsn, run)
    assert kinds(history) == ["admitted", "call-dispatched", "call-lost", "held"]
    assert history[2]["detail"] == {
        "attempt": 1,
        "detail": "ReadTimeout: nothing came back within requestTimeout PT1S",
    }
    assert history[3]["detail"]["code"] == "outcome-unknown"
    said_in_plain_words(history)
    holds_its_chain(service.config)


def test_reconcile_records_the_receipt_lookup_it_made(dsn: str, services: Services) -> None:
    service, products, run = held_after_a_timeout(dsn, services)
    answer = service.http.post(f"/v1/runs/{run}/reconcile", json={"reason": "OPS-3: check"})
    assert answer.status_code == 200, answer.text
    wait_state(dsn, run, RunState.FINISHED)
    posts = products.requests("messaging", "POST", "/v1/messages")
    [submitted] = [r for r in posts if r["path"] == "/v1/messages"]
    [receipt] = [r for r in posts if r["path"] == "/v1/messages/receipt"]
    # The receipt is asked for with the original key and body, resent.
    assert receipt["key"] == submitted["key"] == f"coordinator:{run}:send"
    assert receipt["bodySha256"] == submitted["bodySha256"]
    reconciled = next(e for e in events(dsn, run) if e["kind"] == "reconciled")
    lookup = reconciled["detail"]["receiptLookup"]
    assert (unquote(lookup["url"]), lookup["status"], lookup["outcome"]) == (
        products.url("messaging") + receipt["path"],
        receipt["status"],
        "response",
    )
    assert reconciled["detail"]["receiptStatus"] == receipt["status"] == 200
    holds_its_chain(service.config)


def test_a_result_found_by_polling_records_each_change_of_answer_then_the_read(
    dsn: str, services: Services
) -> None:
    service, products = services.deploy(
        ["await-review"], {"reviews": ("casework", {**QUIET, "resultPoll": "PT1S"})}
    )
    products.feed_read()  # the decision is on the feed for its next read only, in 10 min
    key = products.decided_reviews(1, "application-review")[0]
    result = "GET /v1/review-requests/"
    pending = {"match": result, "mode": "answer", "status": 202, "body": ""}
    products.faults(  # three polls find it pending, one the product busy, two pending again
        "casework",
        {**pending, "times": 3},
        {"match": result, "mode": "status", "status": 503, "retryAfter": 1, "times": 1},
        {**pending, "times": 2},
    )
    run = service.start_run("await-review", {"requestId": key})
    wait_state(dsn, run, RunState.FINISHED)
    reads = products.requests("casework", "GET", f"/v1/review-requests/{key}/result")
    assert [r["status"] for r in reads] == [202, 202, 202, 503, 202, 202, 200]
    history = events(dsn, run)
    assert kinds(history) == [
        "admitted",
        "waiting",
        "result-polled",
        "result-polled",
        "result-polled",
        "result-read",
        "step-completed",
        "finished",
    ]
    url = products.url("casework") + f"/v1/review-requests/{key}/result"
    polled = [e["detail"] for e in history if e["kind"] == "result-polled"]
    assert polled == [
        {"url": url, "status": status, "outcome": "response"} for status in (202, 503, 202)
    ]
    assert history[5]["detail"] == {"delivered": False, "url": url, "status": 200, "key": key}
    assert {e["step"] for e in history[1:7]} == {"wait"}
    instants = [e["at"] for e in history]
    assert instants == sorted(instants)
    said_in_plain_words(history)
    holds_its_chain(service.config)


def test_a_pushed_result_is_read_and_the_read_says_it_came_after_the_completion(
    dsn: str, services: Services
) -> None:
    service, products = services.deploy(
        ["await-review"], {"reviews": ("casework", QUIET)}, webhooks=True
    )
    review = new_review(products)  # decided once the run waits, so Casework's push wakes it
    run = service.start_run("await-review", {"requestId": review})
    wait_state(dsn, run, RunState.WAITING)
    decide(products, review)
    wait_state(dsn, run, RunState.FINISHED)
    history = events(dsn, run)
    assert kinds(history) == [
        "admitted",
        "waiting",
        "result-delivered",
        "result-read",
        "step-completed",
        "finished",
    ]
    assert history[3]["detail"] == {
        "delivered": True,
        "url": products.url("casework") + f"/v1/review-requests/{review}/result",
        "status": 200,
        "key": review,
    }
    reads = products.requests("casework", "GET", f"/v1/review-requests/{review}/result")
    assert [r["status"] for r in reads] == [200]
    said_in_plain_words(history)
    holds_its_chain(service.config)
