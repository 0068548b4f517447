"""The step semantics: how each call outcome is classified, for reads and for mutations.

This table is the contract SPEC section 5 states; the engine and the offline
runner both rely on it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.semantics.codes import FailureCode, HoldCode
from registry_coordinator.semantics.steps import (
    Advance,
    Await,
    Failed,
    Finished,
    Held,
    Reply,
    ReplyKind,
    Retry,
    RunRecord,
    Send,
    Sleep,
    UnsafePath,
    build_receipt_request,
    build_request,
    detail,
    enter,
    result_arrived,
    settle,
)
from tests.harness import WORKFLOWS, reply

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def definition(name: str) -> Definition:
    report = check_source(WORKFLOWS / name)
    assert report.definition is not None
    return report.definition


TUTORIAL = definition("review-application")
READ, MUTATION = "read_application", "notify"
RECORD_BODY = json.dumps(
    {"data": {"recordIdentifier": "a", "revisionIdentifier": "r", "domainData": {}}, "meta": {}}
).encode()


@pytest.mark.parametrize(
    ("given", "read", "mutation"),
    [
        (reply(kind=ReplyKind.NOT_SENT), Retry, Retry),
        (reply(kind=ReplyKind.LOST), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(500), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(502), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(504), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(302), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(200, b"not json"), Retry, HoldCode.RESPONSE_INVALID),
        (reply(200, b'{"unexpected": 1}'), Retry, HoldCode.RESPONSE_INVALID),
        (reply(429), Retry, Retry),
        (reply(503), Retry, Retry),
        (reply(401), HoldCode.PRODUCT_FORBIDDEN, HoldCode.PRODUCT_FORBIDDEN),
        (reply(403), HoldCode.PRODUCT_FORBIDDEN, HoldCode.PRODUCT_FORBIDDEN),
        (reply(400), FailureCode.PRODUCT_REFUSED, FailureCode.PRODUCT_REFUSED),
        (reply(404), FailureCode.PRODUCT_REFUSED, FailureCode.PRODUCT_REFUSED),
        (reply(409), FailureCode.PRODUCT_REFUSED, FailureCode.PRODUCT_REFUSED),
        (reply(422), FailureCode.PRODUCT_REFUSED, FailureCode.PRODUCT_REFUSED),
        # Only 400, 404, 409 and 422 refuse the command; any other 4xx says nothing of it.
        (reply(408), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(410), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(418), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(423), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(425), Retry, HoldCode.OUTCOME_UNKNOWN),
        (reply(451), Retry, HoldCode.OUTCOME_UNKNOWN),
        # 2xx answers PostgreSQL could not store are invalid answers, never stored.
        (reply(200, b'{"id": NaN, "status": "accepted"}'), Retry, HoldCode.RESPONSE_INVALID),
        (
            reply(200, b'{"id": "m", "status": "accepted", "n": -Infinity}'),
            Retry,
            HoldCode.RESPONSE_INVALID,
        ),
        (
            reply(200, b'{"id": "m", "status": "accepted", "n": 1e999}'),
            Retry,
            HoldCode.RESPONSE_INVALID,
        ),
        (reply(200, b'{"id": "m\\u0000", "status": "accepted"}'), Retry, HoldCode.RESPONSE_INVALID),
        (reply(200, b'{"id": "\\ud800", "status": "accepted"}'), Retry, HoldCode.RESPONSE_INVALID),
        (
            reply(
                200,
                b'{"id": "m", "status": "accepted", "d": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            ),
            Retry,
            HoldCode.RESPONSE_INVALID,
        ),
        (
            reply(200, b'{"id": "m", "status": "accepted", "d": ' + b"[" * 65 + b"]" * 65 + b"}"),
            Retry,
            HoldCode.RESPONSE_INVALID,
        ),
        (reply(200, b"\xff\xfe"), Retry, HoldCode.RESPONSE_INVALID),
    ],
)
def test_call_outcomes(given: Reply, read: object, mutation: object) -> None:
    for step_id, expected in ((READ, read), (MUTATION, mutation)):
        transition = settle(TUTORIAL, step_id, given, 1, NOW)
        if expected is Retry:
            assert isinstance(transition, Retry), (step_id, transition)
            assert transition.at > NOW
        elif isinstance(expected, HoldCode):
            assert isinstance(transition, Held), (step_id, transition)
            assert transition.code is expected
        else:
            assert isinstance(transition, Failed), (step_id, transition)
            assert transition.code is expected


def test_success_validates_and_becomes_the_output() -> None:
    transition = settle(TUTORIAL, READ, reply(200, RECORD_BODY), 1, NOW)
    assert transition == Advance("request_review", "next", json.loads(RECORD_BODY), True)
    accepted = settle(TUTORIAL, MUTATION, reply(202, b'{"id": "m1", "status": "accepted"}'), 1, NOW)
    assert isinstance(accepted, Advance)
    assert accepted.output == {"id": "m1", "status": "accepted"}


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
    """A NUL byte in an error body, or a NUL escape in an invalid answer, is shown escaped:
    the detail is text PostgreSQL stores, and still says what the product sent."""
    refused = settle(TUTORIAL, MUTATION, reply(422, b"bad\x00field\x1b[31m"), 1, NOW)
    assert isinstance(refused, Failed)
    assert refused.detail == "422: bad\\u0000field\\u001b[31m"
    invalid = settle(TUTORIAL, MUTATION, reply(201, b'{"id": "m\\u0000", "status": "x"}'), 1, NOW)
    assert isinstance(invalid, Held)
    assert "\x00" not in invalid.detail
    assert 'the body began: {"id": "m\\u0000", "status": "x"}' in invalid.detail
    assert detail("lone \ud800 surrogate") == "lone \\ud800 surrogate"
    assert len(detail("é" * 1000)) == 500


def run(**outputs: object) -> RunRecord:
    return RunRecord(
        "run-1",
        {"applicationId": "app 1/2"},
        NOW,
        NOW + timedelta(days=60),
        dict(outputs),
        dict.fromkeys(outputs, NOW),
    )


def test_a_call_is_sealed_with_a_stable_key_and_escaped_path() -> None:
    first = enter(TUTORIAL, READ, run(), NOW)
    assert isinstance(first, Send)
    assert first.request.method == "GET"
    assert first.request.target == "/v1/records/applications/app%201%2F2"
    assert first.request.body is None
    assert first.request.idempotency_key is None
    review = enter(TUTORIAL, "request_review", run(), NOW)
    again = enter(TUTORIAL, "request_review", run(), NOW + timedelta(hours=1))
    assert isinstance(review, Send)
    assert review == again  # same bytes, same key on every attempt
    assert review.request.idempotency_key == "coordinator:run-1:request_review"
    assert json.loads(review.request.body or b"") == {
        "kind": "application-review",
        "subject": {"type": "application", "id": "app 1/2"},
    }


@pytest.mark.parametrize("record_id", [".", ".."])
def test_a_path_parameter_that_would_name_another_path_fails_the_run(record_id: str) -> None:
    """``recordId: ".."`` would reach GET /v1/records/applications/.. = /v1/records (HTTP
    clients remove dot segments): the call is refused before anything is sent, and so is
    a wait whose key names no result that can be read."""
    read = enter(TUTORIAL, READ, RunRecord("run-1", {"applicationId": record_id}, NOW, NOW), NOW)
    assert isinstance(read, Failed)
    assert read.code is FailureCode.REQUEST_INVALID
    assert f"recordId is {record_id!r}, which cannot be a path segment" in read.detail
    waiting = enter(TUTORIAL, "await_decision", run(request_review={"requestId": record_id}), NOW)
    assert isinstance(waiting, Failed)
    assert waiting.code is FailureCode.REQUEST_INVALID
    for unsafe in (record_id, ""):
        with pytest.raises(UnsafePath):
            build_receipt_request(TUTORIAL.operations["notify"], unsafe)


def test_dots_inside_a_path_parameter_stay_literal() -> None:
    op = TUTORIAL.operations[READ]
    for value, segment in (("...", "..."), ("a/..", "a%2F.."), ("%2e%2e", "%252e%252e")):
        request = build_request(op, {"collection": "c", "recordId": value}, None)
        assert request.target == f"/v1/records/c/{segment}"


def test_query_parameters_for_reads() -> None:
    op = definition("book-appointment").operations["find_slots"]
    request = build_request(op, {"service": "x", "from": "2026-01-01T00:00:00Z", "to": "b"}, "k")
    assert request.target == "/v1/availability?from=2026-01-01T00%3A00%3A00Z&service=x&to=b"
    assert request.idempotency_key is None


def test_choose_wait_and_finish() -> None:
    decided = run(await_decision={"requestId": "r", "decision": "rejected"})
    assert enter(TUTORIAL, "route", decided, NOW) == Advance("rejected", "case 2")
    other = run(await_decision={"requestId": "r", "decision": "superseded"})
    assert enter(TUTORIAL, "route", other, NOW) == Advance("not_decided", "otherwise")
    waiting = enter(TUTORIAL, "await_decision", run(request_review={"requestId": "rv-1"}), NOW)
    assert isinstance(waiting, Await)
    assert (waiting.key, waiting.timeout_at) == ("rv-1", NOW + timedelta(days=14))
    assert enter(TUTORIAL, "approved", run(notify={"id": "m-1"}), NOW) == Finished(
        "approved-and-notified", {"messageId": "m-1"}
    )
    assert enter(TUTORIAL, "rejected", run(), NOW) == Finished("rejected", None)


def test_results_resume_only_when_final_and_valid() -> None:
    assert (
        result_arrived(TUTORIAL, "await_decision", {"requestId": "r", "decision": "pending"})
        is None
    )
    assert result_arrived(TUTORIAL, "await_decision", {"decision": "approved"}) is None  # invalid
    final = result_arrived(TUTORIAL, "await_decision", {"requestId": "r", "decision": "approved"})
    assert final == Advance("route", "next", {"requestId": "r", "decision": "approved"}, True)


def test_wait_until_in_the_past_fires_at_once() -> None:
    follow_up = definition("follow-up-notice")
    record = run()
    assert isinstance(enter(follow_up, "wait_two_weeks", record, NOW), Sleep)
    later = NOW + timedelta(days=15)
    assert enter(follow_up, "wait_two_weeks", record, later) == Advance("read_application", "next")


def test_runtime_expression_errors_fail_the_run() -> None:
    broken = run(await_decision={"requestId": "r"})  # no decision field
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
