"""The products as their published contracts have them, end to end, through real processes.

Each test runs ``coordinator serve`` against the stand-in products on loopback, which
answer as the real products' contracts say (tests/contracts/test_standins.py holds them
to the fixtures written from those contracts): BReg's actions prepared from the
registry's metadata and frozen; an unknown outcome asked about (a receipt looked up, or
the identical request sent again) before a run is held; Casework's completions pushed
and listed on its feed; Messaging read, since it tells nothing; RFC 8707 resources in
token requests. The stand-ins' ledgers show what was sent, and how often.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.engine.workflows import read_service
from registry_coordinator.semantics.codes import FailureCode, HoldCode, RunState
from registry_coordinator.store.database import sync_connection
from tests.support import (
    STANDIN_TOKEN,
    Services,
    completion_request,
    connection,
    decide,
    events,
    free_port,
    oauth2,
    run_state,
    sendings,
    until,
    wait_for,
    wait_state,
)

RECORD = "3f2a1b0c-9d8e-4f7a-8b6c-5d4e3f2a1b01"
#: Messaging keeps the next submission and its answer never comes back.
LOSE_NOTICE = {"match": "POST /v1/messages", "mode": "hang-after-apply", "seconds": 30, "times": 1}
QUICK = {"requestTimeout": "PT1S", "verification": {"attempts": 3, "spacing": "PT1S"}}


def kinds(history: list[dict[str, Any]]) -> list[str]:
    return [event["kind"] for event in history]


def sent(requests: list[dict[str, Any]], method: str, path: str) -> list[dict[str, Any]]:
    return [r for r in requests if r["method"] == method and r["path"] == path]


def test_a_breg_action_is_prepared_from_its_contract_and_sent_once(
    dsn: str, services: Services
) -> None:
    """The registry's metadata is read, the target's condition fetched, and the action
    sent with its precondition under the connection's access profile: once."""
    service, products = services.deploy(["act"], {"registry": ("breg", {})})
    run = service.start_run("act", {"recordId": RECORD})
    wait_state(dsn, run, RunState.FINISHED)
    requests = products.ledger("breg")["requests"]
    assert [r["path"] for r in requests] == [
        "/v1/registry",
        "/v1/actions/mark-reviewed/target-conditions",
        "/v1/actions/mark-reviewed",
    ]
    assert all(r["query"] == {"accessProfile": "coordinator"} for r in requests)
    assert list(products.ledger("breg")["applied"].values()) == [1]
    [sealed] = sendings(dsn, run)
    body, prepared = sealed["body"], sealed["prepared"]
    assert body == (
        b'{"input":{"outcome":"approved","targetId":"' + RECORD.encode() + b'"},'
        b'"preconditions":{"targetId":{"ifMatch":"\\"cond-3f2a1b0c-r1\\""}}}'
    )
    assert prepared["action"] == "mark-reviewed"
    assert prepared["accessProfile"] == "coordinator"
    assert prepared["registryRevision"].startswith("sha256:")
    status = service.status(run)
    assert uuid.UUID(status["output"]["applicationId"])


def test_an_action_the_registry_does_not_offer_or_an_input_it_does_not_take_sends_nothing(
    dsn: str, services: Services
) -> None:
    service, products = services.deploy(["act-chosen"], {"registry": ("breg", {})})
    unknown = service.start_run("act-chosen", {"action": "close-case", "input": {}})
    wrong = service.start_run(
        "act-chosen", {"action": "mark-reviewed", "input": {"targetId": "not-a-uuid"}}
    )
    wait_state(dsn, unknown, RunState.FAILED)
    wait_state(dsn, wrong, RunState.FAILED)
    assert service.status(unknown)["failure"]["code"] == FailureCode.ACTION_UNAVAILABLE
    failure = service.status(wrong)["failure"]
    assert failure["code"] == FailureCode.REQUEST_INVALID
    assert "targetId must be a canonical lowercase UUID" in failure["detail"]
    assert "outcome is required" in failure["detail"]
    paths = [r["path"] for r in products.ledger("breg")["requests"]]
    assert paths == ["/v1/registry", "/v1/registry"]  # no condition read, nothing invoked


#: The action applies, and its answer never comes back (only the action: not the reads
#: of its metadata and target conditions before it).
ACTION_ANSWER_LOST = {
    "match": "POST /v1/actions/mark-reviewed$",
    "mode": "hang-after-apply",
    "seconds": 30,
    "times": 1,
}


def test_a_lost_action_answer_is_had_from_the_identical_request_under_its_key(
    dsn: str, services: Services
) -> None:
    """BReg replays the original answer to the same key and body: the run asks by sending
    the sealed command again, and BReg applied it once."""
    service, products = services.deploy(["act"], {"registry": ("breg", QUICK)})
    products.faults("breg", ACTION_ANSWER_LOST)
    run = service.start_run("act", {"recordId": RECORD})
    wait_state(dsn, run, RunState.FINISHED)
    invoked = sent(products.ledger("breg")["requests"], "POST", "/v1/actions/mark-reviewed")
    assert len(invoked) == 2
    assert invoked[0]["key"] == invoked[1]["key"]
    assert invoked[0]["bodySha256"] == invoked[1]["bodySha256"]
    assert products.ledger("breg")["applied"] == {invoked[0]["key"]: 1}
    assert kinds(service.history(run)).count("verify-scheduled") == 1
    # Asked with the identical request: its contract was checked again, no new condition.
    conditions = "/v1/actions/mark-reviewed/target-conditions"
    assert len(sent(products.ledger("breg")["requests"], "POST", conditions)) == 1
    assert len(sent(products.ledger("breg")["requests"], "GET", "/v1/registry")) == 2


def test_a_prepared_action_is_not_sent_again_once_its_contract_moved(
    dsn: str, services: Services
) -> None:
    """The action's answer is lost and the run held (this connection asks BReg nothing
    itself); the registry moves to a new revision; the operator's retry-same reads the
    metadata again before the frozen command would go, and holds the run instead."""
    asks_nothing = {**QUICK, "verification": {"attempts": 0}}
    service, products = services.deploy(["act"], {"registry": ("breg", asks_nothing)})
    products.faults("breg", ACTION_ANSWER_LOST)
    run = service.start_run("act", {"recordId": RECORD})
    wait_state(dsn, run, RunState.HELD)
    assert run_state(dsn, run)["hold_code"] == HoldCode.OUTCOME_UNKNOWN
    moved = httpx.post(
        products.url("breg") + "/_control/registry", json={"revision": "sha256:" + "5" * 64}
    )
    assert moved.status_code == 200
    reason = {"reason": "BReg says to resend"}
    assert service.http.post(f"/v1/runs/{run}/retry-same", json=reason).status_code == 200
    wait_for(
        dsn,
        "SELECT hold_code FROM runs WHERE id = %s",
        HoldCode.PREPARED_COMMAND_MISMATCH,
        params=(run,),
    )
    held = run_state(dsn, run)
    assert held["hold_code"] == HoldCode.PREPARED_COMMAND_MISMATCH
    assert "registryRevision" in held["detail"]
    invoked = sent(products.ledger("breg")["requests"], "POST", "/v1/actions/mark-reviewed")
    assert len(invoked) == 1  # the frozen command was never sent under the new contract


def test_a_lost_notice_is_confirmed_by_its_receipt_and_never_resent(
    dsn: str, services: Services
) -> None:
    service, products = services.deploy(["notify"], {"notices": ("messaging", QUICK)})
    products.faults("messaging", LOSE_NOTICE)
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, run, RunState.FINISHED)
    requests = products.ledger("messaging")["requests"]
    submitted = sent(requests, "POST", "/v1/messages")
    receipts = sent(requests, "POST", "/v1/messages/receipt")
    assert len(submitted) == 1
    assert receipts and all(r["key"] == submitted[0]["key"] for r in receipts)
    assert all(r["bodySha256"] == submitted[0]["bodySha256"] for r in receipts)
    assert products.ledger("messaging")["applied"] == {submitted[0]["key"]: 1}
    history = service.history(run)
    assert "receipt-looked-up" in kinds(history)
    looked = [e for e in history if e["kind"] == "receipt-looked-up"]
    assert looked[-1]["detail"]["status"] == 200
    assert service.status(run)["output"]["messageId"]


def test_a_notice_no_receipt_matches_is_held_after_the_askings_without_a_resend(
    dsn: str, services: Services
) -> None:
    """Messaging answers a 500 without keeping the message: no receipt matches, which is
    no evidence either way, so the run is held after the connection's two askings."""
    settings = {**QUICK, "verification": {"attempts": 2, "spacing": "PT1S"}}
    service, products = services.deploy(["notify"], {"notices": ("messaging", settings)})
    products.faults(
        "messaging", {"match": "POST /v1/messages", "mode": "status", "status": 500, "times": 1}
    )
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, run, RunState.HELD)
    held = run_state(dsn, run)
    assert held["hold_code"] == HoldCode.OUTCOME_UNKNOWN
    assert "asked the product for its receipt 2 times" in held["detail"]
    requests = products.ledger("messaging")["requests"]
    assert len(sent(requests, "POST", "/v1/messages")) == 1
    assert [r["status"] for r in sent(requests, "POST", "/v1/messages/receipt")] == [409, 409]


def test_messaging_is_read_for_what_became_of_a_notice(dsn: str, services: Services) -> None:
    """Messaging sends nothing: the run reads the message, soon and then less often."""
    settings = {"resultPollFirst": "PT1S"}
    service, products = services.deploy(["notice-delivery"], {"notices": ("messaging", settings)})
    run = service.start_run("notice-delivery", {"email": "a@example.org"})
    wait_state(dsn, run, RunState.FINISHED)
    assert service.status(run)["output"] == {"status": "delivered"}
    requests = products.ledger("messaging")["requests"]
    [submitted] = sent(requests, "POST", "/v1/messages")
    reads = [r for r in requests if r["method"] == "GET"]
    history = service.history(run)
    # Each read is in the run's history: those that found it not yet delivered, and the
    # one that found it delivered and ended the wait.
    assert len(reads) == kinds(history).count("result-polled") + 1
    message = next(e["detail"]["key"] for e in history if e["kind"] == "waiting")
    assert all(r["path"] == f"/v1/messages/{message}" for r in reads), reads
    # None sooner than resultPollFirst after the notice was sent, each later one no
    # sooner than that after the one before.
    times = [submitted["at"], *(r["at"] for r in reads)]
    assert all(later - earlier >= 0.9 for earlier, later in itertools.pairwise(times)), times
    read = [e for e in history if e["kind"] == "result-read"]
    assert len(read) == 1 and read[0]["detail"]["delivered"] is False  # found by a read


def test_casework_pushes_its_completions_and_each_wakes_its_run(
    dsn: str, services: Services
) -> None:
    """The tutorial against the products: the review decided by staff, Casework's
    completion pushed with its destination's secret and acknowledged with an empty 204,
    the result read; the notice read until Messaging says it was delivered."""
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "applications": ("breg", {}),
        "reviews": ("casework", {"resultPoll": "PT10M", "feedPoll": "PT10M"}),
        "notices": ("messaging", {"resultPollFirst": "PT1S"}),
    }
    service, products = services.deploy(["review-application"], connections, webhooks=True)
    run = service.start_run("review-application", {"applicationId": RECORD})
    key = until(
        lambda: next(
            (e["detail"]["key"] for e in service.history(run) if e["kind"] == "waiting"), None
        ),
        "the run waiting for its review",
    )
    decide(products, key)
    wait_state(dsn, run, RunState.FINISHED)
    assert service.status(run)["outcome"] == "approved-and-notified"
    pushed = products.ledger("casework")["webhooks"]
    assert [p["status"] for p in pushed] == [204]
    read = next(e for e in service.history(run) if e["kind"] == "result-read")
    assert read["detail"]["delivered"] is True


def test_a_pushed_completion_without_the_secret_changes_nothing(
    dsn: str, services: Services
) -> None:
    service, _ = services.deploy(
        ["await-review"],
        {"reviews": ("casework", {"completions": {"secret": "env:STANDIN_WEBHOOK_SECRET"}})},
    )
    forged = service.http.post(**completion_request(str(uuid.uuid4()), secret="guessed"))
    assert forged.status_code == 401
    assert forged.json()["code"] == "webhook.unauthenticated"
    accepted = service.http.post(**completion_request(str(uuid.uuid4())))
    assert (accepted.status_code, accepted.content) == (204, b"")


def test_one_feed_read_wakes_every_run_it_names(dsn: str, services: Services) -> None:
    """Without pushes (no completions configured), Casework's result feed is followed:
    each entry wakes the run waiting for it, which then reads its own result once."""
    settings = {"feedPoll": "PT1S", "resultPoll": "PT10M"}
    service, products = services.deploy(["await-review"], {"reviews": ("casework", settings)})
    requests = [products.review() for _ in range(3)]
    runs = [service.start_run("await-review", {"requestId": r}) for r in requests]
    for run in runs:
        wait_state(dsn, run, RunState.WAITING)
    for request_id in requests:
        decide(products, request_id)
    for run in runs:
        wait_state(dsn, run, RunState.FINISHED)
    ledger = products.ledger("casework")["requests"]
    feed = [r for r in ledger if r["path"] == "/v1/review-results"]
    assert feed and all(r["query"].get("limit") == "100" for r in feed)
    for request_id in requests:
        path = f"/v1/review-requests/{request_id}/result"
        reads = [r for r in ledger if r["path"] == path]
        assert [r["status"] for r in reads][-1] == 200
    for run in runs:
        read = next(e for e in service.history(run) if e["kind"] == "result-read")
        assert read["detail"]["delivered"] is True
    with sync_connection(dsn) as conn:
        kept = conn.execute("SELECT cursor FROM feed_cursors WHERE connection = 'reviews'")
        cursor = kept.fetchone()
    assert cursor is not None and uuid.UUID(cursor["cursor"])


def test_a_result_the_product_conceals_holds_the_run(dsn: str, services: Services) -> None:
    service, _ = services.deploy(
        ["await-review"], {"reviews": ("casework", {"resultPoll": "PT1S", "feedPoll": "PT10M"})}
    )
    run = service.start_run("await-review", {"requestId": str(uuid.uuid4())})
    wait_state(dsn, run, RunState.HELD)
    assert run_state(dsn, run)["hold_code"] == HoldCode.RESULT_CONCEALED


def test_a_token_is_asked_for_the_products_resource(
    dsn: str, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RFC 8707: the token request names the resource the token is for."""
    idp = free_port()
    monkeypatch.setenv("STANDIN_CLIENT_SECRET", "s3cret-for-tests")  # the service's and IdP's
    identity = oauth2(idp, clientSecret="env:STANDIN_CLIENT_SECRET")
    service, products = services.deploy(
        ["notify"], {"notices": ("messaging", {"identity": identity})}, also={"idp": idp}
    )
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, run, RunState.FINISHED)
    forms = [r["form"] for r in products.ledger("idp")["requests"]]
    assert forms == [
        {
            "grant_type": "client_credentials",
            "client_id": "coordinator",
            "scope": "messaging:send",
            "resource": "urn:example:messaging",
        }
    ]
    assert events(dsn, run)


def last_weekday_morning() -> tuple[str, str]:
    """An hour of slots in the past (the stand-in books any slot; the reminder due the day
    before fires at once)."""
    day = datetime.now(UTC).date() - timedelta(days=1)
    while day.weekday() >= 5:
        day -= timedelta(days=1)
    start = datetime(day.year, day.month, day.day, 9, tzinfo=UTC)
    return format_instant(start), format_instant(start + timedelta(hours=1))


def test_a_booking_is_made_under_the_task_grant_a_person_approved(
    dsn: str, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scheduling books only under Casework's task authority: Coordinator asks Casework to
    assert the grant the run names (with a bootstrap token), exchanges the assertion for a
    token of Scheduling (RFC 8693), and books with it; the calendar is read with the
    service's own identity, and a receipt with the read-only one."""
    idp, casework = free_port(), free_port()
    monkeypatch.setenv("STANDIN_CLIENT_SECRET", "s3cret-for-tests")
    credentials = oauth2(idp, clientSecret="env:STANDIN_CLIENT_SECRET")["oauth2"]
    assert isinstance(credentials, dict)
    booking = {
        "oauth2": {
            **credentials,
            "scopes": ["scheduling:book"],
            "resource": "urn:example:scheduling",
            "taskAuthority": {
                "baseUrl": f"http://127.0.0.1:{casework}",
                "issuer": "urn:stand-in:casework",
                "subject": "coordinator-agent",
                "exchangeAudience": "urn:stand-in:idp",
                "bootstrapResource": "urn:example:casework",
            },
        }
    }
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "calendar": ("scheduling", {}),
        "bookings": (
            "scheduling",
            {"identity": booking, "observationIdentity": {"bearer": "env:STANDIN_TOKEN"}},
        ),
        "notices": ("messaging", {}),
    }
    service, products = services.deploy(
        ["book-appointment"], connections, also={"idp": idp, "casework": casework}
    )
    approved = httpx.post(
        products.url("casework") + "/_control/grant",
        json={
            "client": "coordinator",
            "resource": "urn:example:scheduling",
            "scope": "scheduling:book",
        },
    ).json()
    start, end = last_weekday_morning()
    given = {
        "applicationId": RECORD,
        "email": "a@example.org",
        "offering": "passport-interview",
        "from": start,
        "to": end,
        "grant": approved,
    }
    run = service.start_run("book-appointment", given)
    wait_state(dsn, run, RunState.FINISHED, timeout=60)
    assert service.status(run)["output"]["start"] == start
    asserted = products.ledger("casework")["requests"]
    assert [r["path"] for r in asserted] == [f"/v1/task-grants/{approved['id']}/assertion"]
    forms = [r["form"] for r in products.ledger("idp")["requests"]]
    assert forms == [
        {
            "grant_type": "client_credentials",
            "client_id": "coordinator",
            "scope": "casework:grants:assert",
            "resource": "urn:example:casework",
        },
        {
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "client_id": "coordinator",
            "scope": "scheduling:book",
            "resource": "urn:example:scheduling",
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        },
    ]
    booked = sent(products.ledger("scheduling")["requests"], "POST", "/v1/appointments")
    assert [r["status"] for r in booked] == [201]
    [sealed] = sendings(dsn, run, "book")
    assert (
        b"grant" not in sealed["body"] and b"policyRevision" in sealed["body"]
    )  # proved, not sent
    assert sealed["prepared"] == {"grant": approved}


def test_a_booking_without_task_authority_is_refused_before_anything_starts(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    config = services.configure(
        ["book-appointment"],
        connections={
            "calendar": connection("scheduling", free_port()),
            "bookings": connection("scheduling", free_port()),
            "notices": connection("messaging", free_port()),
        },
    )
    reading, _ = read_service(config)
    found = [(d.code, d.message) for d in reading.problems.all()]
    assert [code for code, _ in found] == ["config.task-authority-missing"]
    assert "runs only under Casework's task authority" in found[0][1]
