"""Step semantics the engine's tests reach only through a database: what a run does when
it falls due (``on_due``), a result read, an interrupted call; and the exact details
and boundaries of the transitions ``enter`` and ``settle`` decide.

Written where mutation testing (``just mutants-pure``) found no fast test telling the
real rule from a changed one: an off-by-one at an instant, a detail that says less.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.catalog import Receipt
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.semantics.codes import FailureCode, HoldCode
from registry_coordinator.semantics.steps import (
    MAX_DETAIL,
    Advance,
    Await,
    Expire,
    Failed,
    Fetch,
    Held,
    Reply,
    ReplyKind,
    Request,
    Retry,
    RunRecord,
    Send,
    Sleep,
    UnsafePath,
    backoff,
    build_receipt_request,
    detail,
    enter,
    fetched,
    on_due,
    path_segment,
    settle,
)
from tests.support import WORKFLOWS, review_result

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
READ, MUTATION = "read_application", "notify"
#: BReg takes canonical lowercase UUID record ids only.
APPLICATION = "7d1c2a4e-0b5f-4c3a-9e21-5a6b7c8d9e01"
MESSAGE = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c01"
#: Messaging's answer to a submitted message (202): queued, never yet delivered.
QUEUED = {"id": MESSAGE, "status": "queued", "links": {"self": "/m", "cancel": "/m/cancel"}}

#: Expressions of type dyn where the tutorial's are typed: the engine must check at run
#: time what the checker could not (a boolean, a timestamp, a non-empty key).
PROBE = """\
apiVersion: coordinator.registrystack.org/v1alpha1
kind: Workflow
id: probe
version: "1"
deadline: P30D
input: {type: object}
connections:
  reviews: casework
outcomes:
  done: {type: "null"}
start: route
steps:
  route:
    type: choose
    cases:
      - when: input.flag
        next: pause
    otherwise: pause
  pause:
    type: wait-until
    at: input.when
    next: wait
  wait:
    type: wait-for
    result: reviews.review-decision
    key: input.key
    next: done
  done: {type: finish, outcome: done}
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Definition:
    path = tmp_path_factory.mktemp("probe") / "probe.yaml"
    path.write_text(PROBE)
    checked = check_source(path)
    assert checked.definition is not None
    return checked.definition


def definition(name: str) -> Definition:
    checked = check_source(WORKFLOWS / name)
    assert checked.definition is not None
    return checked.definition


TUTORIAL = definition("review-application")


def record(input: object = None, **outputs: object) -> RunRecord:
    return RunRecord(
        "run-1",
        input if input is not None else {"applicationId": APPLICATION},
        NOW - timedelta(days=1),
        NOW + timedelta(days=30),
        dict(outputs),
        dict.fromkeys(outputs, NOW),
    )


def test_a_run_records_variables_carry_its_id_and_instants() -> None:
    variables = record().variables()
    assert variables["run.id"] == "run-1"
    assert variables["run.admitted_at"] == NOW - timedelta(days=1)
    assert variables["run.deadline_at"] == NOW + timedelta(days=30)


def test_an_interrupted_read_is_read_again_and_an_interrupted_mutation_held() -> None:
    run = record()
    read = on_due(TUTORIAL, run, READ, False, None, NOW, dispatched=True)
    assert read == Retry(NOW, "the service stopped while this read was in flight; reading again")
    held = on_due(TUTORIAL, run, MUTATION, False, None, NOW, dispatched=True)
    assert held == Held(
        HoldCode.DISPATCH_INTERRUPTED,
        "the service stopped after dispatching messaging/submit-message and before "
        "recording its answer; whether the product acted is unknown",
    )
    # The call's unknown outcome is decided first, even past the deadline.
    late = on_due(TUTORIAL, run, MUTATION, False, None, run.deadline_at, dispatched=True)
    assert isinstance(late, Held)


def test_a_run_expires_from_the_instant_of_its_deadline() -> None:
    run = record()
    assert on_due(TUTORIAL, run, READ, False, None, run.deadline_at) == Expire()
    just_before = run.deadline_at - timedelta(microseconds=1)
    assert isinstance(on_due(TUTORIAL, run, READ, False, None, just_before), Send)


def test_a_wait_until_wakes_from_its_instant_on() -> None:
    follow_up = definition("follow-up-notice")
    run, at = record(), NOW + timedelta(hours=1)
    before = at - timedelta(microseconds=1)
    assert on_due(follow_up, run, "wait_two_weeks", True, at, before) is None
    assert on_due(follow_up, run, "wait_two_weeks", True, at, at) == Advance(
        "read_application", "next"
    )


def test_a_wait_for_times_out_at_its_instant_and_is_read_before() -> None:
    run = record(request_review={"requestId": "rv-1"})
    at = NOW + timedelta(hours=1)
    result = TUTORIAL.results["await_decision"]
    before = at - timedelta(microseconds=1)
    assert on_due(TUTORIAL, run, "await_decision", True, at, before) == Fetch(result, "rv-1")
    assert on_due(TUTORIAL, run, "await_decision", True, at, at) == Advance(
        "not_decided", "on-timeout"
    )
    unusable = record(request_review={"requestId": ".."})
    failed = on_due(TUTORIAL, unusable, "await_decision", True, at, before)
    assert isinstance(failed, Failed) and failed.code is FailureCode.REQUEST_INVALID


def test_a_run_arriving_at_a_wait_until_is_decided_at_that_instant() -> None:
    follow_up = definition("follow-up-notice")
    run = record()
    two_weeks = run.admitted_at + timedelta(days=14)
    assert on_due(follow_up, run, "wait_two_weeks", False, None, NOW) == Sleep(two_weeks)
    assert on_due(follow_up, run, "wait_two_weeks", False, None, two_weeks) == Advance(
        "read_application", "next"
    )


def test_a_waiting_run_at_any_other_step_has_nothing_due() -> None:
    assert on_due(TUTORIAL, record(), READ, True, None, NOW) is None


def test_a_retry_is_due_from_its_instant_on() -> None:
    run, at = record(), NOW + timedelta(seconds=5)
    assert on_due(TUTORIAL, run, READ, False, at, at - timedelta(microseconds=1)) is None
    assert isinstance(on_due(TUTORIAL, run, READ, False, at, at), Send)
    assert isinstance(on_due(TUTORIAL, run, READ, False, None, NOW), Send)


def answer(status: int | None, body: object, kind: ReplyKind = ReplyKind.RESPONSE) -> Reply:
    return Reply(kind, status, json.dumps(body).encode())


def test_only_the_reads_own_success_with_a_final_valid_result_is_taken() -> None:
    """Casework answers a result with 200 only (202 is its pending answer): no other 2xx,
    however final its body looks, ends the wait."""
    final = review_result("approved")
    taken = Advance("route", "next", final, True)
    assert fetched(TUTORIAL, "await_decision", answer(200, final)) == taken
    for refused in (
        answer(199, final),
        answer(201, final),
        answer(202, final),
        answer(299, final),
        answer(300, final),
        answer(None, final),
        answer(None, final, ReplyKind.LOST),
        answer(200, {**final, "status": "reviewing"}),
        answer(200, {"requestId": "rv-1", "status": "approved"}),
        Reply(ReplyKind.RESPONSE, 200, b"{not json"),
    ):
        assert fetched(TUTORIAL, "await_decision", refused) is None, refused


def test_a_descriptor_without_its_own_success_takes_any_2xx() -> None:
    """An older descriptor names no success statuses: its success is any 2xx, exactly."""
    read = TUTORIAL.operations[READ]
    assert read.success == frozenset({200})
    assert [read.succeeded(s) for s in (199, 200, 201, 299)] == [False, True, False, False]
    older = replace(read, success=None)
    assert [older.succeeded(s) for s in (199, 200, 201, 299, 300)] == [
        False,
        True,
        True,
        True,
        False,
    ]


def test_a_choice_that_is_not_a_boolean_fails_the_run(probe: Definition) -> None:
    failed = enter(probe, "route", record({"flag": "yes"}), NOW)
    assert failed == Failed(FailureCode.EXPRESSION_ERROR, "input.flag: gave 'yes', not a boolean")


def test_a_wait_until_takes_timestamps_and_rfc_3339_text_only(probe: Definition) -> None:
    due = enter(probe, "pause", record({"when": "2026-03-01T12:00:00Z"}), NOW)
    assert due == Advance("wait", "next")  # due at the very instant: goes on
    ahead = enter(probe, "pause", record({"when": "2026-03-02T12:00:00+01:00"}), NOW)
    assert ahead == Sleep(datetime(2026, 3, 2, 11, 0, tzinfo=UTC))
    for value, why in (
        ("soon", "input.when: 'soon' is not an RFC 3339 timestamp with an offset"),
        (5, "input.when: gave 5, not a timestamp"),
    ):
        failed = enter(probe, "pause", record({"when": value}), NOW)
        assert failed == Failed(FailureCode.EXPRESSION_ERROR, why)


def test_a_wait_for_needs_a_non_empty_key_that_names_a_result(probe: Definition) -> None:
    waiting = enter(probe, "wait", record({"key": "rv-1"}), NOW)
    assert waiting == Await(probe.results["wait"], "rv-1", None)  # no timeout: waits on
    for key, shown in (("", "''"), (5, "5")):
        failed = enter(probe, "wait", record({"key": key}), NOW)
        assert failed == Failed(
            FailureCode.EXPRESSION_ERROR, f"input.key: gave {shown}, not a non-empty string"
        )
    unsafe = enter(probe, "wait", record({"key": ".."}), NOW)
    assert unsafe == Failed(
        FailureCode.REQUEST_INVALID,
        "input.key: requestId is '..', which cannot be a path segment",
    )


def test_an_output_that_breaks_its_outcome_schema_fails_the_run() -> None:
    failed = enter(TUTORIAL, "approved", record(notify={"id": 5}), NOW)
    assert isinstance(failed, Failed)
    assert failed.code is FailureCode.OUTPUT_INVALID
    assert failed.detail.startswith(
        "output for outcome approved-and-notified does not fit its schema: "
    )
    assert "messageId: is not of type 'string'" in failed.detail, failed.detail


#: Schemas a run's values are held to, each refusing the values drawn for it.
REFUSING = [
    {"type": "object", "properties": {"v": {"type": "string", "pattern": "^[0-9]{3}$"}}},
    {"type": "object", "properties": {"v": {"type": "string", "maxLength": 2}}},
    {"type": "object", "properties": {"v": {"enum": ["approved", "rejected"]}}},
    {"type": "object", "properties": {"v": {"type": "integer"}}},
    {"type": "object", "properties": {"v": {"const": "x"}}},
    {"type": "object", "properties": {"v": {"type": "array"}}},
    {"type": "object", "properties": {"v": {"not": {"type": "string"}}}},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "null"}, {"maxLength": 1}]}}},
]


@given(st.text(alphabet="abcdefghijklmnop@.+-", min_size=6, max_size=30), st.data())
def test_a_schema_error_names_where_and_what_never_the_value(
    value: str, data: st.DataObject
) -> None:
    """What a run's value fails (a product's answer, an output, a request) is told in its
    detail, its history and the log, which are in clear: the words name where and which
    rule, never the value itself, which may be a person's."""
    schema = data.draw(st.sampled_from(REFUSING))
    messages = TUTORIAL.schema_errors(schema, {"v": value, "w": 1})
    assert messages and all(m.startswith("v: ") for m in messages), messages
    assert all(value not in m for m in messages), messages


def test_an_expression_error_is_the_failures_detail() -> None:
    failed = enter(TUTORIAL, "route", record(await_decision={"requestId": "r"}), NOW)
    assert isinstance(failed, Failed)
    assert failed.detail.startswith('steps.await_decision.status == "approved": ')
    assert "status" in failed.detail.split(": ", 1)[1]


def test_an_input_that_breaks_the_operations_schema_says_which() -> None:
    bad_email = record(read_application={"data": {"domainData": {"email": "nope"}}})
    refused = enter(TUTORIAL, MUTATION, bad_email, NOW)
    assert isinstance(refused, Failed)
    assert refused.detail.startswith("input for messaging/submit-message does not fit its schema: ")


def test_receipt_lookups_and_path_segments() -> None:
    notify = TUTORIAL.operations[MUTATION]
    sealed = Request(
        "POST",
        "/v1/messages?accessProfile=p",
        b'{"senderProfile":"s"}',
        "coordinator:r/1:notify",
        (("X-Profile", "v"),),
    )
    # Messaging's receipt resends the original key, body, headers and query to its route.
    assert build_receipt_request(notify, sealed) == Request(
        "POST",
        "/v1/messages/receipt?accessProfile=p",
        b'{"senderProfile":"s"}',
        "coordinator:r/1:notify",
        (("X-Profile", "v"),),
    )
    unqueried = replace(sealed, target="/v1/messages")
    assert build_receipt_request(notify, unqueried).target == "/v1/messages/receipt"
    # An older descriptor's receipt is a GET naming the key as a path segment.
    by_key = replace(
        notify, receipt=Receipt("GET", "/v1/messages/by-idempotency-key/{key}", frozenset({404}))
    )
    assert build_receipt_request(by_key, sealed) == Request(
        "GET", "/v1/messages/by-idempotency-key/coordinator%3Ar%2F1%3Anotify", None, None
    )
    with pytest.raises(UnsafePath, match=r"^key is '\.\.', which cannot be a path segment$"):
        build_receipt_request(by_key, replace(sealed, idempotency_key=".."))
    assert path_segment("n", 5) == "5"
    assert path_segment("n", True) == "true"
    assert path_segment("n", {"a": [1, 2]}) == "%7B%22a%22%3A%5B1%2C2%5D%7D"


def reply(status: int | None, body: bytes = b"", kind: ReplyKind = ReplyKind.RESPONSE) -> Reply:
    """A product's reply; one with no status says why (a product's answer has no detail:
    only Coordinator's own refusal of its identity gives one, :mod:`engine.calls`)."""
    return Reply(kind, status, body, None, "connection reset" if status is None else "")


def test_call_details_say_what_came_back() -> None:
    not_sent = settle(TUTORIAL, READ, reply(None, kind=ReplyKind.NOT_SENT), 1, NOW)
    assert isinstance(not_sent, Retry) and not_sent.detail == "not sent: connection reset"
    # A response without a status is no answer, as a lost one is.
    for no_answer in (reply(None), reply(None, kind=ReplyKind.LOST)):
        held = settle(TUTORIAL, MUTATION, no_answer, 1, NOW)
        assert held == Held(HoldCode.OUTCOME_UNKNOWN, "no answer: connection reset")
    assert settle(TUTORIAL, MUTATION, reply(401, b" denied \n"), 1, NOW) == Held(
        HoldCode.PRODUCT_FORBIDDEN, "401, 9 bytes"
    )
    assert settle(TUTORIAL, MUTATION, reply(500), 1, NOW) == Held(
        HoldCode.OUTCOME_UNKNOWN, "500, no body"
    )
    assert settle(TUTORIAL, MUTATION, reply(500, b"\xffbad"), 1, NOW) == Held(
        HoldCode.OUTCOME_UNKNOWN, "500, 4 bytes"
    )
    read = settle(TUTORIAL, READ, reply(500, b"oops"), 1, NOW)
    assert isinstance(read, Retry) and read.detail == "500, 4 bytes"
    problem = b'{"code": "auth.denied", "title": "Access denied", "detail": "for Ada Lovelace"}'
    assert settle(TUTORIAL, MUTATION, reply(403, problem), 1, NOW) == Held(
        HoldCode.PRODUCT_FORBIDDEN, "403 auth.denied (Access denied)"
    )  # a problem's code and title, never its instance's words
    refused = Reply(ReplyKind.RESPONSE, 401, b"", None, "the token endpoint refused the secret")
    assert settle(TUTORIAL, MUTATION, refused, 1, NOW) == Held(
        HoldCode.PRODUCT_FORBIDDEN, "401: the token endpoint refused the secret"
    )  # Coordinator's own words, when its identity was refused before sending


def test_only_the_operations_own_success_is_success() -> None:
    """Messaging accepts a message with 202: no other status, 2xx or not, is its success."""
    body = json.dumps(QUEUED).encode()
    assert settle(TUTORIAL, MUTATION, reply(202, body), 1, NOW) == Advance(
        "await_delivery", "next", QUEUED, True
    )
    for status in (200, 201, 299, 300):
        assert settle(TUTORIAL, MUTATION, reply(status, body), 1, NOW) == Held(
            HoldCode.OUTCOME_UNKNOWN, f"{status}, {len(body)} bytes"
        ), status


@pytest.mark.parametrize(
    "problem",
    [
        (422, "template.render-refused"),  # Messaging renders a retry again first
        (404, "template.not-found"),
        (409, "idempotency.key-reused"),
        (400, "request.invalid"),
    ],
)
def test_a_refusal_of_a_resend_after_an_unknown_outcome_holds_rather_than_fails(
    problem: tuple[int, str],
) -> None:
    """A product may refuse a resend for what changed since the first sending (Messaging
    authorizes and renders an exact retry again before it looks up its key) while the
    first stands: only a refusal of a request no earlier sending may have delivered says
    that nothing took effect."""
    status, code = problem
    body = json.dumps({"status": status, "code": code}).encode()
    first = settle(TUTORIAL, MUTATION, reply(status, body), 2, NOW)
    assert isinstance(first, Failed) and first.code is FailureCode.PRODUCT_REFUSED
    resent = settle(TUTORIAL, MUTATION, reply(status, body), 2, NOW, uncertain=True)
    assert isinstance(resent, Held) and resent.code is HoldCode.OUTCOME_UNKNOWN
    assert resent.detail.startswith("the product refused this resend, but an earlier")
    # What says the product did not act, or asks to wait, means the same either way.
    for retried in (429, 503):
        assert isinstance(
            settle(TUTORIAL, MUTATION, reply(retried, b""), 2, NOW, uncertain=True), Retry
        )


def test_an_unusable_answer_says_why_never_what_it_said() -> None:
    """The detail is kept in clear; the answer, which may name the person the request was
    about, is kept sealed with the sending."""

    def shown(body: bytes) -> str:
        held = settle(TUTORIAL, MUTATION, reply(202, body), 1, NOW)
        assert isinstance(held, Held) and held.code is HoldCode.RESPONSE_INVALID
        assert "canary" not in held.detail
        return held.detail

    assert shown(b"canary" * 20).endswith("(the body is 120 bytes)")
    assert shown(b"").endswith("(the body is 0 bytes)")
    assert shown(b"\xffcanary").endswith("(the body is 7 bytes)")
    several = shown(b'{"id": 1, "status": 2, "to": "canary"}')
    assert "is not of type 'string'; " in several


def test_backoff_doubles_per_attempt() -> None:
    assert [backoff(n, lambda: 1.0) for n in (1, 2, 3)] == [
        timedelta(seconds=1),
        timedelta(seconds=2),
        timedelta(seconds=4),
    ]


def test_a_detail_of_exactly_the_limit_is_kept_whole() -> None:
    assert detail("x" * MAX_DETAIL) == "x" * MAX_DETAIL
    assert detail("x" * (MAX_DETAIL + 1)) == "x" * (MAX_DETAIL - 1) + "…"
