"""The step semantics: how each call outcome is classified, for reads and for mutations.

This table is the contract SPEC section 5 states; the engine and the offline
runner both rely on it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.catalog import Operation, Receipt
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.semantics.codes import FailureCode, HoldCode
from registry_coordinator.semantics.steps import (
    Advance,
    Await,
    Check,
    Failed,
    Finished,
    Held,
    Reply,
    ReplyKind,
    Request,
    Retry,
    RunRecord,
    Send,
    Sleep,
    Unbound,
    UnsafePath,
    Verification,
    Verify,
    bind,
    build_receipt_request,
    build_request,
    checked,
    detail,
    enter,
    fetched,
    interrupted,
    on_due,
    result_arrived,
    settle,
)
from tests.support import WORKFLOWS, reply, review_result

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def definition(name: str) -> Definition:
    report = check_source(WORKFLOWS / name)
    assert report.definition is not None
    return report.definition


TUTORIAL = definition("review-application")
#: A read (BReg's read-record, answered 200) and a mutation (Messaging's submit-message,
#: answered 202, with a receipt lookup): a table row's OK is the operation's own success.
READ, MUTATION = "read_application", "notify"
OK = 0
RECORD = {
    "data": {
        "recordIdentifier": "7d1c2a4e-0b5f-4c3a-9e21-5a6b7c8d9e01",
        "revisionIdentifier": "3",
        "domainData": {"email": "a@example.org"},
    },
    "meta": {"registryIdentifier": "r", "datasetIdentifier": "d", "entityTypeIdentifier": "e"},
}
RECORD_BODY = json.dumps(RECORD).encode()
MESSAGE = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c01"
QUEUED = {"id": MESSAGE, "status": "queued", "links": {"self": "/m", "cancel": "/m/cancel"}}


def answer(step_id: str, given: Reply) -> Reply:
    """``given`` as the step's operation would be answered: OK is its success status."""
    if given.status != OK:
        return given
    success = TUTORIAL.operations[step_id].success
    return replace(given, status=min(success) if success else 200)


@pytest.mark.parametrize(
    ("given", "read", "mutation"),
    [
        (reply(kind=ReplyKind.NOT_SENT), Retry, Retry),
        (reply(kind=ReplyKind.LOST), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(500), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(502), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(504), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(302), Retry, HoldCode.OUTCOME_UNKNOWN),
        # A 2xx that is not the operation's success is no answer it knows.
        (reply(200, json.dumps(QUEUED).encode()), Advance, HoldCode.OUTCOME_UNKNOWN),
        (reply(OK, b"not json"), Retry, HoldCode.RESPONSE_INVALID),
        (reply(OK, b'{"unexpected": 1}'), Retry, HoldCode.RESPONSE_INVALID),
        (reply(429), Retry, Retry),
        (reply(503), Retry, Retry),
        (reply(401), HoldCode.PRODUCT_FORBIDDEN, HoldCode.PRODUCT_FORBIDDEN),
        (reply(403), HoldCode.PRODUCT_FORBIDDEN, HoldCode.PRODUCT_FORBIDDEN),
        (reply(400), FailureCode.PRODUCT_REFUSED, FailureCode.PRODUCT_REFUSED),
        (reply(404), FailureCode.PRODUCT_REFUSED, FailureCode.PRODUCT_REFUSED),
        (reply(409), FailureCode.PRODUCT_REFUSED, FailureCode.PRODUCT_REFUSED),
        (reply(422), FailureCode.PRODUCT_REFUSED, FailureCode.PRODUCT_REFUSED),
        # Messaging also refuses a body too large and a media type it does not take; a
        # read has the default refusals (400, 404, 409, 422), where any other 4xx says
        # nothing of the command.
        (reply(413), Retry, FailureCode.PRODUCT_REFUSED),
        (reply(415), Retry, FailureCode.PRODUCT_REFUSED),
        (reply(408), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(410), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(418), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(423), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(425), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(451), Retry, HoldCode.OUTCOME_UNKNOWN),
        # The key spent on an original whose answer expired: it acted, its answer is gone.
        (
            reply(410, b'{"code": "idempotency.expired", "status": 410}'),
            Retry,
            HoldCode.RECEIPT_EXPIRED,
        ),
        # 2xx answers PostgreSQL could not store are invalid answers, never stored.
        (reply(OK, b'{"id": NaN, "status": "queued"}'), Retry, HoldCode.RESPONSE_INVALID),
        (
            reply(OK, b'{"id": "m", "status": "queued", "n": -Infinity}'),
            Retry,
            HoldCode.RESPONSE_INVALID,
        ),
        (
            reply(OK, b'{"id": "m", "status": "queued", "n": 1e999}'),
            Retry,
            HoldCode.RESPONSE_INVALID,
        ),
        (reply(OK, b'{"id": "m\\u0000", "status": "queued"}'), Retry, HoldCode.RESPONSE_INVALID),
        (reply(OK, b'{"id": "\\ud800", "status": "queued"}'), Retry, HoldCode.RESPONSE_INVALID),
        (
            reply(
                OK,
                b'{"id": "m", "status": "queued", "d": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            ),
            Retry,
            HoldCode.RESPONSE_INVALID,
        ),
        (
            reply(OK, b'{"id": "m", "status": "queued", "d": ' + b"[" * 65 + b"]" * 65 + b"}"),
            Retry,
            HoldCode.RESPONSE_INVALID,
        ),
        (reply(OK, b"\xff\xfe"), Retry, HoldCode.RESPONSE_INVALID),
    ],
)
def test_call_outcomes(given: Reply, read: object, mutation: object) -> None:
    """With nothing to ask (no verification), as the descriptors read their answers."""
    for step_id, expected in ((READ, read), (MUTATION, mutation)):
        sent = answer(step_id, given)
        if expected is Advance:  # the read's own 200, with a record
            sent = replace(sent, body=RECORD_BODY)
        transition = settle(TUTORIAL, step_id, sent, 1, NOW)
        if expected is Retry:
            assert isinstance(transition, Retry), (step_id, transition)
            assert transition.at > NOW
        elif expected is Advance:
            assert isinstance(transition, Advance), (step_id, transition)
        elif isinstance(expected, HoldCode):
            assert isinstance(transition, Held), (step_id, transition)
            assert transition.code is expected
        else:
            assert isinstance(transition, Failed), (step_id, transition)
            assert transition.code is expected


def test_success_validates_and_becomes_the_output() -> None:
    transition = settle(TUTORIAL, READ, reply(200, RECORD_BODY), 1, NOW)
    assert transition == Advance("request_review", "next", RECORD, True)
    accepted = settle(TUTORIAL, MUTATION, reply(202, json.dumps(QUEUED).encode()), 1, NOW)
    assert isinstance(accepted, Advance)
    assert accepted.output == QUEUED


def test_retry_after_is_honoured_and_backoff_is_capped() -> None:
    later = settle(TUTORIAL, MUTATION, reply(429, retry_after=timedelta(seconds=90)), 1, NOW)
    assert later == Retry(NOW + timedelta(seconds=90), "429: the product asked to retry later")
    capped = settle(TUTORIAL, READ, reply(kind=ReplyKind.NOT_SENT), 50, NOW, jitter=lambda: 1.0)
    assert isinstance(capped, Retry)
    assert capped.at == NOW + timedelta(minutes=5)


def test_error_bodies_are_truncated() -> None:
    transition = settle(TUTORIAL, MUTATION, reply(422, b"x" * 10_000), 1, NOW)
    assert isinstance(transition, Failed)
    assert len(transition.detail) <= 500


def test_details_escape_what_the_database_cannot_store() -> None:
    """A control character in a problem's code, or a NUL escape in an
    invalid answer, is shown escaped: the detail is text PostgreSQL stores."""
    body = b'{"code": "bad\\u0007field\\u001b[31m"}'
    refused = settle(TUTORIAL, MUTATION, reply(422, body), 1, NOW)
    assert isinstance(refused, Failed)
    assert refused.detail == "422 bad\\u0007field\\u001b[31m"
    invalid = settle(TUTORIAL, MUTATION, reply(202, b'{"id": "m\\u0000", "status": "x"}'), 1, NOW)
    assert isinstance(invalid, Held)
    assert "\x00" not in invalid.detail
    assert detail("lone \ud800 surrogate") == "lone \\ud800 surrogate"
    assert len(detail("é" * 1000)) == 500


APPLICATION = "7d1c2a4e-0b5f-4c3a-9e21-5a6b7c8d9e01"


def run(run_input: object = None, **outputs: object) -> RunRecord:
    return RunRecord(
        "run-1",
        run_input if run_input is not None else {"applicationId": APPLICATION},
        NOW,
        NOW + timedelta(days=60),
        dict(outputs),
        dict.fromkeys(outputs, NOW),
    )


def test_a_call_is_sealed_with_a_stable_key_and_its_own_shape() -> None:
    first = enter(TUTORIAL, READ, run(), NOW)
    assert isinstance(first, Send)
    assert first.request.method == "GET"
    assert first.request.target == f"/v1/records/applications/{APPLICATION}"
    assert first.request.body is None
    assert first.request.idempotency_key is None
    review = enter(TUTORIAL, "request_review", run(read_application=RECORD), NOW)
    again = enter(
        TUTORIAL, "request_review", run(read_application=RECORD), NOW + timedelta(hours=1)
    )
    assert isinstance(review, Send)
    assert review == again  # same bytes, same key on every attempt
    assert review.request.idempotency_key == "coordinator:run-1:request_review"
    body = json.loads(review.request.body or b"")
    assert body["subject"] == {
        "source": "applications-registry",
        "type": "application",
        "id": APPLICATION,
        "version": "3",
        # digest() of the record's domain data: sha256 of its canonical JSON
        "digest": "sha256:" + hashlib.sha256(b'{"email":"a@example.org"}').hexdigest(),
    }
    assert body["requesterReference"] == "run-1"
    assert body["context"] == {
        "strategy": "source",
        "binding": {"reference": f"applications/{APPLICATION}"},
    }


def test_connection_bound_parameters_are_placed_as_the_product_takes_them() -> None:
    """BReg's access profile in the query, Casework's profile as a header, Messaging's
    sender profile in the body: sealed with the request, never from workflow input."""
    read = enter(TUTORIAL, READ, run(), NOW)
    assert isinstance(read, Send)
    bound = bind(TUTORIAL.operations[READ], read.request, {"accessProfile": "coordinator"})
    assert bound.target == f"/v1/records/applications/{APPLICATION}?accessProfile=coordinator"
    assert bound.headers == ()
    review = enter(TUTORIAL, "request_review", run(read_application=RECORD), NOW)
    assert isinstance(review, Send)
    sealed = bind(TUTORIAL.operations["request_review"], review.request, {"profile": "p-1"})
    assert sealed.headers == (("Registry-Casework-Profile", "p-1"),)
    assert sealed.body == review.request.body
    notice = Request("POST", "/v1/messages", b'{"to":{"email":"a@example.org"}}', "k")
    sent = bind(TUTORIAL.operations[MUTATION], notice, {"senderProfile": "case-notices"})
    assert sent.body == b'{"senderProfile":"case-notices","to":{"email":"a@example.org"}}'
    with pytest.raises(Unbound, match="sends senderProfile, which the connection does not set"):
        bind(TUTORIAL.operations[MUTATION], notice, {})


def test_a_receipt_lookup_resends_the_original_key_and_body_or_names_the_key() -> None:
    operation = TUTORIAL.operations[MUTATION]
    sealed = Request("POST", "/v1/messages", b'{"a":1}', "coordinator:r:notify", (("X-P", "v"),))
    lookup = build_receipt_request(operation, sealed)
    assert lookup == Request(
        "POST", "/v1/messages/receipt", b'{"a":1}', "coordinator:r:notify", (("X-P", "v"),)
    )
    legacy = Operation(
        **{**vars(operation), "receipt": Receipt("GET", "/v1/m/by-key/{key}", frozenset({404}))}
    )
    assert build_receipt_request(legacy, sealed).target == "/v1/m/by-key/coordinator%3Ar%3Anotify"


@pytest.mark.parametrize("record_id", [".", ".."])
def test_a_path_parameter_that_would_name_another_path_fails_the_run(record_id: str) -> None:
    """``recordId: ".."`` would reach GET /v1/records/applications/.. = /v1/records (HTTP
    clients remove dot segments): the call is refused before anything is sent, and so is
    a wait whose key names no result that can be read."""
    lookup = definition("follow-up-notice").operations["read_application"]
    with pytest.raises(UnsafePath, match=f"recordId is {record_id!r}, which cannot be"):
        build_request(lookup, {"collection": "c", "recordId": record_id}, None)
    waiting = enter(TUTORIAL, "await_decision", run(request_review={"requestId": record_id}), NOW)
    assert isinstance(waiting, Failed)
    assert waiting.code is FailureCode.REQUEST_INVALID


def test_an_input_the_products_contract_does_not_take_fails_before_sending() -> None:
    """The catalog holds the products' shapes: BReg takes canonical lowercase UUIDs only."""
    read = enter(TUTORIAL, READ, RunRecord("run-1", {"applicationId": "APP-1"}, NOW, NOW), NOW)
    assert isinstance(read, Failed)
    assert read.code is FailureCode.REQUEST_INVALID
    assert "does not fit its schema" in read.detail


def test_dots_inside_a_path_parameter_stay_literal() -> None:
    op = TUTORIAL.operations[READ]
    for value, segment in (("...", "..."), ("a/..", "a%2F.."), ("%2e%2e", "%252e%252e")):
        request = build_request(op, {"collection": "c", "recordId": value}, None)
        assert request.target == f"/v1/records/c/{segment}"


def test_query_parameters_for_reads() -> None:
    op = definition("book-appointment").operations["find_slots"]
    given = {"offering": "x", "start": "2026-01-01T00:00:00Z", "end": "b", "limit": 20}
    request = build_request(op, given, "k")
    assert request.target == (
        "/v1/availability?end=b&limit=20&offering=x&start=2026-01-01T00%3A00%3A00Z"
    )
    assert request.idempotency_key is None


def result(status: str) -> dict[str, object]:
    return review_result(status, "q-1")


def test_choose_wait_and_finish() -> None:
    decided = run(await_decision=result("rejected"))
    assert enter(TUTORIAL, "route", decided, NOW) == Advance("rejected", "case 2")
    other = run(await_decision=result("superseded"))
    assert enter(TUTORIAL, "route", other, NOW) == Advance("not_decided", "otherwise")
    waiting = enter(TUTORIAL, "await_decision", run(request_review={"requestId": "rv-1"}), NOW)
    assert isinstance(waiting, Await)
    assert (waiting.key, waiting.timeout_at) == ("rv-1", NOW + timedelta(days=14))
    assert enter(TUTORIAL, "approved", run(notify={"id": "m-1"}), NOW) == Finished(
        "approved-and-notified", {"messageId": "m-1"}
    )
    assert enter(TUTORIAL, "rejected", run(), NOW) == Finished("rejected", None)


def test_results_resume_only_when_final_and_valid() -> None:
    assert result_arrived(TUTORIAL, "await_decision", result("reviewing")) is None  # no status
    assert result_arrived(TUTORIAL, "await_decision", {"status": "approved"}) is None  # invalid
    final = result_arrived(TUTORIAL, "await_decision", result("approved"))
    assert final == Advance("route", "next", result("approved"), True)


def message(status: str, report: str) -> bytes:
    view = {
        "id": MESSAGE,
        "status": status,
        "dispatch": "submitted",
        "report": report,
        "channel": "email",
        "senderProfile": "case-notices",
        "to": {"email": "redacted"},
        "acceptedAt": "a",
        "expiresAt": "e",
        "updatedAt": "u",
        "attempts": [],
        "links": {"self": "s", "cancel": "c"},
    }
    return json.dumps(view).encode()


@pytest.mark.parametrize(
    ("step_id", "given", "ends"),
    [
        # Casework: a result is 200; pending is an empty 202; 404 conceals, 410 expired.
        ("await_decision", reply(200, json.dumps(result("approved")).encode()), Advance),
        ("await_decision", reply(202), None),
        ("await_decision", reply(404), HoldCode.RESULT_CONCEALED),
        ("await_decision", reply(410), FailureCode.RESULT_EXPIRED),
        ("await_decision", reply(503), None),
        ("await_decision", reply(kind=ReplyKind.LOST), None),
        ("await_decision", reply(200, b"{}"), None),
        # Messaging: final when delivered, failed, expired or cancelled, or submitted to a
        # provider that reports no deliveries; anything else is read again later.
        ("await_delivery", reply(200, message("delivered", "delivered")), Advance),
        ("await_delivery", reply(200, message("failed", "undelivered")), Advance),
        ("await_delivery", reply(200, message("submitted", "unavailable")), Advance),
        ("await_delivery", reply(200, message("submitted", "none")), None),
        ("await_delivery", reply(200, message("unknown", "none")), None),
        ("await_delivery", reply(404), HoldCode.RESULT_CONCEALED),
        ("await_delivery", reply(410), None),
    ],
)
def test_a_result_read_ends_the_wait_as_the_product_answers(
    step_id: str, given: Reply, ends: object
) -> None:
    transition = fetched(TUTORIAL, step_id, given)
    if ends is None:
        assert transition is None
    elif ends is Advance:
        assert isinstance(transition, Advance)
    elif isinstance(ends, HoldCode):
        assert isinstance(transition, Held) and transition.code is ends
    else:
        assert isinstance(transition, Failed) and transition.code is ends


ASKING = Verification(attempts=2, spacing=timedelta(seconds=30))


def test_an_unknown_outcome_is_asked_about_as_often_as_allowed_then_held() -> None:
    """Messaging keeps receipts: the run asks for the receipt (a read), twice, 15 to 30 s
    apart, and is held only when neither confirmed the call."""
    lost = reply(kind=ReplyKind.LOST)
    first = settle(TUTORIAL, MUTATION, lost, 1, NOW, checks=0, verification=ASKING)
    assert isinstance(first, Verify)
    assert NOW + timedelta(seconds=15) <= first.at <= NOW + timedelta(seconds=30)
    unresolved = reply(409, b'{"code": "receipt.unresolved"}')
    again = checked(TUTORIAL, MUTATION, unresolved, 1, NOW, ASKING)
    assert isinstance(again, Verify)
    assert "not evidence that it had no effect" in again.detail
    held = checked(TUTORIAL, MUTATION, unresolved, 2, NOW, ASKING)
    assert isinstance(held, Held) and held.code is HoldCode.OUTCOME_UNKNOWN
    assert "asked the product for its receipt 2 times; not confirmed" in held.detail
    confirmed = checked(TUTORIAL, MUTATION, reply(200, json.dumps(QUEUED).encode()), 2, NOW, ASKING)
    assert confirmed == Advance("await_delivery", "next", QUEUED, True)
    unusable = checked(TUTORIAL, MUTATION, reply(200, b'{"id": 1}'), 2, NOW, ASKING)
    assert isinstance(unusable, Held)


def test_an_identical_request_is_its_products_recovery() -> None:
    """Casework answers the identical request under the same key with the original: the
    request is sent again (a Verify, then the sealed bytes), and held after the last."""
    lost = reply(502)
    first = settle(TUTORIAL, "request_review", lost, 1, NOW, checks=0, verification=ASKING)
    assert isinstance(first, Verify)
    last = settle(TUTORIAL, "request_review", lost, 3, NOW, checks=2, verification=ASKING)
    assert isinstance(last, Held) and last.code is HoldCode.OUTCOME_UNKNOWN
    assert "with the identical request 2 times" in last.detail
    expired = reply(410, b'{"code": "idempotency.expired"}')
    spent = settle(TUTORIAL, "request_review", expired, 2, NOW, checks=1, verification=ASKING)
    assert isinstance(spent, Held) and spent.code is HoldCode.RECEIPT_EXPIRED


def test_a_product_that_can_say_nothing_is_held_at_once() -> None:
    """A read is read again, and an answer that cannot be used is never asked about (a
    receipt of it would be the same answer)."""
    invalid = settle(TUTORIAL, MUTATION, reply(202, b"{}"), 1, NOW, verification=ASKING)
    assert isinstance(invalid, Held) and invalid.code is HoldCode.RESPONSE_INVALID
    read = settle(TUTORIAL, READ, reply(kind=ReplyKind.LOST), 1, NOW, verification=ASKING)
    assert isinstance(read, Retry)


def test_a_call_interrupted_by_a_stop_is_asked_about_where_its_product_can_say() -> None:
    asked = interrupted(TUTORIAL, MUTATION, NOW, 0, ASKING)
    assert isinstance(asked, Verify)
    held = interrupted(TUTORIAL, MUTATION, NOW, 2, ASKING)
    assert isinstance(held, Held) and held.code is HoldCode.DISPATCH_INTERRUPTED
    assert isinstance(interrupted(TUTORIAL, MUTATION, NOW), Held)
    assert isinstance(interrupted(TUTORIAL, READ, NOW, 0, ASKING), Retry)


def test_a_run_being_asked_about_falls_due_to_the_asking() -> None:
    record = run(read_application=RECORD, request_review={"requestId": "q"})
    operation = TUTORIAL.operations[MUTATION]
    due = on_due(TUTORIAL, record, MUTATION, False, NOW, NOW, checks=1, verification=ASKING)
    assert due == Check(operation)
    early = on_due(TUTORIAL, record, MUTATION, False, NOW + timedelta(seconds=1), NOW, checks=1)
    assert early is None
    # An identical request is asked by sending it again: the step is taken as ever.
    again = on_due(TUTORIAL, record, "request_review", False, NOW, NOW, checks=1)
    assert isinstance(again, Send)


def test_wait_until_in_the_past_fires_at_once() -> None:
    follow_up = definition("follow-up-notice")
    record = run()
    assert isinstance(enter(follow_up, "wait_two_weeks", record, NOW), Sleep)
    later = NOW + timedelta(days=15)
    assert enter(follow_up, "wait_two_weeks", record, later) == Advance("read_application", "next")


def test_runtime_expression_errors_fail_the_run() -> None:
    broken = run(await_decision={"requestId": "r"})  # no status field
    transition = enter(TUTORIAL, "route", broken, NOW)
    assert isinstance(transition, Failed)
    assert transition.code is FailureCode.EXPRESSION_ERROR
    missing_email = run(read_application={"data": {"domainData": {}}})
    failed = enter(TUTORIAL, "notify", missing_email, NOW)
    assert isinstance(failed, Failed)
    assert failed.code is FailureCode.EXPRESSION_ERROR
    bad_email = run(read_application={"data": {"domainData": {"email": "nope"}}})
    refused = enter(TUTORIAL, "notify", bad_email, NOW)
    assert isinstance(refused, Failed)
    assert refused.code is FailureCode.REQUEST_INVALID
