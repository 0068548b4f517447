"""The ``transition`` statement's parameters, built without PostgreSQL: what each kind
of transition sets of a run's columns, and how a chain of steps becomes one statement.

tests/engine/test_store.py commits these against PostgreSQL; here the building alone is
pinned, column by column, so a column left over from the step before shows up as a
wrong value, not as a run that misbehaves later.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.http.console import wording
from registry_coordinator.semantics.codes import FailureCode, HoldCode, RunState
from registry_coordinator.semantics.steps import (
    Advance,
    Await,
    Expire,
    Failed,
    Fetch,
    Finished,
    Held,
    Reply,
    ReplyKind,
    Request,
    Retry,
    Send,
    Sleep,
    Transition,
    Verify,
)
from registry_coordinator.store.claims import CancelledInFlight, Claimed, Settlement
from registry_coordinator.store.statements import (
    CALL_OUTCOMES,
    INTERRUPTED,
    call_outcome,
    columns,
    plan,
    result_polled,
    result_read,
    statement,
    wait_due,
)
from tests.support import TEST_WORKFLOWS

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
POLL = timedelta(minutes=10)
TOKEN = uuid.UUID(int=2)
RUN = uuid.UUID(int=3)


@cache
def definition(name: str) -> Definition:
    checked = check_source(TEST_WORKFLOWS / f"{name}.yaml")
    assert checked.definition is not None
    return checked.definition


def held_at(workflow: str, step: str, run_input: Any = None, **fields: Any) -> Claimed:
    """A run of ``workflow`` claimed at ``step``, at its third attempt there."""
    run = Claimed(
        id=uuid.UUID(int=1),
        workflow_id=workflow,
        digest="sha256:" + "0" * 64,
        input=run_input,
        state=RunState.RUNNING,
        step=step,
        seq=3,
        attempt=2,
        checks=0,
        timer_at=None,
        outputs={},
        completed={},
        admitted_at=NOW,
        deadline_at=NOW + definition(workflow).workflow.deadline,
        owner="holder:1",
        token=TOKEN,
        dispatched=False,
        traceparent=None,
        clock=(NOW, 0.0),
    )
    return replace(run, **fields)


def changed(workflow: str, step: str, transition: Transition | CancelledInFlight) -> dict[str, Any]:
    """The columns ``transition`` gives the run, but those every transition sets the same."""
    params, _ = columns(
        definition(workflow), held_at(workflow, step), transition, LEASE, True, POLL, NOW
    )
    common = {"id", "token", "now", "event_step", "actor", "honour_cancel"}
    common |= {"call_status", "call_response", "call_outcome"}
    return {name: value for name, value in params.items() if name not in common}


RESET = {
    "step": "now",
    "state": RunState.RUNNING,
    "attempt": 0,
    "checks": 0,
    "timer_at": None,
    "wakes_to": None,
    "due_at": None,
    "lease_owner": None,
    "lease_token": None,
    "outputs": {},
    "completed": {},
    "outcome": None,
    "output": None,
    "failure_code": None,
    "hold_code": None,
    "detail": None,
    "ends": False,
}
DONE = {"now": format_instant(NOW)}
DEADLINE = NOW + timedelta(minutes=10)  # chain's


def test_an_advance_keeps_the_lease_and_completes_the_step() -> None:
    assert changed("chain", "now", Advance("parity", "next")) == RESET | {
        "step": "parity",
        "due_at": NOW + LEASE,
        "lease_owner": "holder:1",
        "lease_token": TOKEN,
        "completed": DONE,
        "kind": "step-completed",
        "event": {"via": "next", "next": "parity"},
    }


def test_an_advance_without_the_lease_is_due_at_once_for_any_worker() -> None:
    run = held_at("chain", "now")
    params, _ = columns(
        definition("chain"), run, Advance("parity", "next"), LEASE, False, None, NOW
    )
    assert (params["due_at"], params["lease_owner"], params["lease_token"]) == (NOW, None, None)


def test_an_advance_with_output_records_it_for_the_step() -> None:
    read = Advance("decide", "next", {"data": {}}, True)
    assert changed("bench-four", "read", read)["outputs"] == {"read": {"data": {}}}


@pytest.mark.parametrize(
    ("transition", "expected"),
    [
        (
            Failed(FailureCode.EXPRESSION_ERROR, "no such field"),
            {
                "state": RunState.FAILED,
                "failure_code": "expression-error",
                "detail": "no such field",
                "ends": True,
                "attempt": 2,
                "kind": "failed",
                "event": {"code": "expression-error", "detail": "no such field"},
            },
        ),
        (
            Held(HoldCode.OUTCOME_UNKNOWN, "no answer"),
            {
                "state": RunState.HELD,
                "hold_code": "outcome-unknown",
                "detail": "no answer",
                "attempt": 2,
                "kind": "held",
                "event": {"code": "outcome-unknown", "detail": "no answer"},
            },
        ),
        (
            Expire(),
            {
                "state": RunState.EXPIRED,
                "failure_code": "deadline-reached",
                "detail": f"the deadline {format_instant(DEADLINE)} passed at step now",
                "ends": True,
                "kind": "expired",
                "event": {"deadline": format_instant(DEADLINE)},
            },
        ),
        (
            Retry(NOW + timedelta(seconds=4), "503: later"),
            {
                "attempt": 2,
                "timer_at": NOW + timedelta(seconds=4),
                "due_at": NOW + timedelta(seconds=4),
                "kind": "retry-scheduled",
                "event": {"at": format_instant(NOW + timedelta(seconds=4)), "detail": "503: later"},
            },
        ),
        (
            Retry(NOW + timedelta(hours=1), "past the deadline"),
            {
                "attempt": 2,
                "timer_at": NOW + timedelta(hours=1),
                "due_at": DEADLINE,
                "kind": "retry-scheduled",
                "event": {
                    "at": format_instant(NOW + timedelta(hours=1)),
                    "detail": "past the deadline",
                },
            },
        ),
        (
            # Asking the product about an unknown outcome counts the asking, keeps the attempt.
            Verify(NOW + timedelta(seconds=20), "no answer: timeout"),
            {
                "attempt": 2,
                "checks": 1,
                "timer_at": NOW + timedelta(seconds=20),
                "due_at": NOW + timedelta(seconds=20),
                "kind": "verify-scheduled",
                "event": {
                    "at": format_instant(NOW + timedelta(seconds=20)),
                    "check": 1,
                    "detail": "no answer: timeout",
                },
            },
        ),
    ],
)
def test_a_transition_sets_only_its_own_columns(
    transition: Transition, expected: dict[str, Any]
) -> None:
    assert changed("chain", "now", transition) == RESET | expected


def test_a_finish_ends_the_run_with_its_outcome_and_output() -> None:
    got = changed("chain", "even", Finished("even", {"n": 2}))
    output = got.pop("output")
    assert isinstance(output, Jsonb) and output.obj == {"n": 2}
    assert got == {name: value for name, value in RESET.items() if name != "output"} | {
        "step": "even",
        "state": RunState.FINISHED,
        "completed": {"even": format_instant(NOW)},
        "outcome": "even",
        "ends": True,
        "kind": "finished",
        "event": {"outcome": "even"},
    }


def test_a_wait_until_waits_for_its_instant_and_names_the_step_it_wakes_to() -> None:
    until = NOW + timedelta(milliseconds=300)
    assert changed("chain", "even_pause", Sleep(until)) == RESET | {
        "step": "even_pause",
        "state": RunState.WAITING,
        "timer_at": until,
        "wakes_to": "even_check",
        "due_at": until,
        "kind": "waiting",
        "event": {"until": format_instant(until)},
    }


def test_a_wait_for_waits_and_registers_its_wait_with_the_transition() -> None:
    review = definition("await-review")
    timeout = NOW + timedelta(minutes=50)
    waiting = Await(review.results["wait"], "req-1", timeout)
    run = held_at("await-review", "wait")
    params, wait = columns(review, run, waiting, LEASE, True, None, NOW)
    assert (params["state"], params["timer_at"], params["due_at"]) == (
        RunState.WAITING,
        timeout,
        timeout,  # no poll: its timeout, which comes before the deadline
    )
    assert params["event"] == {
        "result": "reviews.review-decision",
        "key": "req-1",
        "timeoutAt": format_instant(timeout),
    }
    assert wait == {
        "id": run.id,
        "step": "wait",
        "connection": "reviews",
        "result": review.results["wait"].name,
        "key": "req-1",
        "now": NOW,
        "timeout_at": timeout,
    }


def test_only_a_wait_for_registers_a_wait() -> None:
    run = held_at("chain", "now")
    for transition in (Advance("parity", "next"), Expire(), Sleep(NOW)):
        assert columns(definition("chain"), run, transition, LEASE, True, POLL, NOW)[1] is None


def test_a_cancellation_as_a_call_settles_keeps_the_calls_answer_and_skips_the_check() -> None:
    answered = Advance("decide", "next", {"data": {}}, True)
    cancelled = CancelledInFlight("cancelled by an operator", answered)
    run = held_at("bench-four", "read")
    settled = Settlement("response", 200, b"{}")
    params, wait = columns(
        definition("bench-four"), run, cancelled, LEASE, True, POLL, NOW, settled
    )
    assert wait is None
    assert params["state"] == RunState.CANCELLED and params["ends"] is True
    assert params["step"] == "read" and params["lease_token"] is None
    assert params["outputs"] == {"read": {"data": {}}}
    assert params["completed"] == {"read": format_instant(NOW)}
    assert (params["kind"], params["event"]) == (
        "cancelled",
        {"reason": "cancelled by an operator"},
    )
    assert params["honour_cancel"] is False
    assert (params["call_outcome"], params["call_status"], params["call_response"]) == (
        "response",
        200,
        b"{}",
    )


def test_a_cancellation_instead_of_a_failure_records_no_output() -> None:
    cancelled = CancelledInFlight("cancelled", Failed(FailureCode.PRODUCT_REFUSED, "422"))
    got = changed("bench-four", "read", cancelled)
    assert (got["outputs"], got["completed"], got["failure_code"]) == ({}, {}, None)


@pytest.mark.parametrize(
    "transition",
    [
        Send(Request("GET", "/x", None, None)),
        Fetch(definition("await-review").results["wait"], "k"),
    ],
)
def test_what_only_a_holder_acts_on_is_not_committed(transition: Transition) -> None:
    with pytest.raises(TypeError, match="is not committed by the store"):
        changed("chain", "now", transition)


def test_every_state_a_transition_sets_is_a_run_state() -> None:
    """psycopg sends a RunState as its text (tests/engine/test_store.py reads it back)."""
    review = definition("await-review")
    for transition in (
        Advance("parity", "next"),
        Finished("odd", {"n": 1}),
        Failed(FailureCode.EXPRESSION_ERROR, "x"),
        Held(HoldCode.ENGINE_DEFECT, "x"),
        Expire(),
        Sleep(NOW),
        Retry(NOW, "x"),
        CancelledInFlight("x", Expire()),
    ):
        assert type(changed("chain", "now", transition)["state"]) is RunState
    waiting = Await(review.results["wait"], "k", None)
    assert type(changed("await-review", "wait", waiting)["state"]) is RunState


def test_a_chain_is_one_statement_with_an_event_per_step() -> None:
    """The steps after an Advance that need nothing from outside: a choose and the
    wait-until after it, each decided at the same instant from the steps before it."""
    chain = definition("chain")
    run = held_at("chain", "now", {"n": 2})
    planned = plan(
        chain,
        run,
        Advance("parity", "next"),
        LEASE,
        keep_lease=True,
        poll=POLL,
        now=NOW,
        settlement=None,
        go_on=True,
    )
    until = NOW + timedelta(milliseconds=300)
    assert planned.taken == (
        ("now", Advance("parity", "next")),
        ("parity", Advance("even_pause", "case 1")),
        ("even_pause", Sleep(until)),
    )
    assert planned.ahead is None and planned.wait is None
    st = planned.statement
    assert st["kinds"] == ["step-completed", "step-completed", "waiting"]
    assert st["event_steps"] == ["now", "parity", "even_pause"]
    assert [e.obj for e in st["events"]] == [
        {"via": "next", "next": "parity"},
        {"via": "case 1", "next": "even_pause"},
        {"until": format_instant(until)},
    ]
    assert (st["state"], st["step"], st["timer_at"], st["due_at"]) == (
        RunState.WAITING,
        "even_pause",
        until,
        until,
    )
    assert st["event_step"] == "now" and st["token"] == TOKEN  # fenced where the run was
    assert st["completed"] == {"now": format_instant(NOW), "parity": format_instant(NOW)}
    assert st["lease_token"] is None and st["leaves_wait"] is False
    assert "kind" not in st and "event" not in st
    moved = planned.run
    assert (moved.seq, moved.state, moved.step) == (6, RunState.WAITING, "even_pause")
    assert moved.completed == {"now": NOW, "parity": NOW}
    committed = planned.committed()
    assert (committed.due_at, committed.held, committed.outcome) == (until, False, None)


def test_a_chain_hands_on_the_step_it_cannot_take_decided_at_its_instant() -> None:
    bench = definition("bench-four")
    answer = {"data": {"domainData": {"status": "awaiting-review"}}}
    run = held_at("bench-four", "read", {"recordId": "app-1"})
    read = Advance("decide", "next", answer, True)
    planned = plan(
        bench, run, read, LEASE, keep_lease=True, poll=POLL, now=NOW, settlement=None, go_on=True
    )
    assert [step for step, _ in planned.taken] == ["read", "decide"]
    assert planned.ahead is not None and planned.ahead.at == NOW
    assert isinstance(planned.ahead.transition, Send)
    committed = planned.committed()
    assert committed.held and committed.run.step == "act"
    assert committed.due_at == NOW + LEASE


def test_without_go_on_only_the_transition_is_taken() -> None:
    planned = plan(
        definition("chain"),
        held_at("chain", "now", {"n": 2}),
        Advance("parity", "next"),
        LEASE,
        keep_lease=True,
        poll=POLL,
        now=NOW,
        settlement=None,
        go_on=False,
    )
    assert [step for step, _ in planned.taken] == ["now"] and planned.ahead is None
    assert planned.statement["kinds"] == ["step-completed"]


def test_the_settled_call_and_the_fence_are_the_first_transitions() -> None:
    """A read answered, then the choice after it taken by a holder that keeps its lease."""
    four = definition("bench-four")
    settled = Settlement("response", 200, b"{}")
    read = Advance("decide", "next", {"data": {}}, True)
    first, _ = columns(four, held_at("bench-four", "read"), read, LEASE, False, POLL, NOW, settled)
    later = held_at("bench-four", "decide", token=uuid.uuid4())
    last, _ = columns(four, later, Advance("act", "case 1"), LEASE, True, POLL, NOW)
    merged = statement([first, last], leaves_wait=True)
    assert {name: merged[name] for name in ("token", "event_step", "call_status")} == {
        "token": TOKEN,
        "event_step": "read",
        "call_status": 200,
    }
    assert (merged["state"], merged["step"], merged["leaves_wait"]) == (
        RunState.RUNNING,
        "act",
        True,
    )
    assert merged["lease_token"] == later.token  # the last one's: the holder keeps it
    assert merged["outputs"] == {"read": {"data": {}}}
    instant = format_instant(NOW)
    assert merged["completed"] == {"read": instant, "decide": instant}
    assert merged["event_steps"] == ["read", "decide"]
    assert merged["kinds"] == ["step-completed", "step-completed"]


def test_leaving_a_wait_drops_it() -> None:
    review = definition("await-review")
    for state, drops in ((RunState.WAITING, True), (RunState.RUNNING, False)):
        run = held_at("await-review", "wait", {"requestId": "k"}, state=state)
        planned = plan(
            review,
            run,
            Advance("not_decided", "on-timeout"),
            LEASE,
            keep_lease=True,
            poll=POLL,
            now=NOW,
            settlement=None,
            go_on=False,
        )
        assert planned.statement["leaves_wait"] is drops


def test_a_wait_falls_due_at_its_poll_spread_by_a_tenth_or_at_its_timeout_or_deadline() -> None:
    deadline = NOW + timedelta(hours=1)
    assert wait_due(NOW, None, deadline, POLL, jitter=lambda: 0.0) == NOW + POLL * 0.9
    assert wait_due(NOW, None, deadline, POLL, jitter=lambda: 1.0) == NOW + POLL * 1.1
    soon = NOW + timedelta(minutes=1)
    assert wait_due(NOW, soon, deadline, POLL, jitter=lambda: 0.5) == soon
    assert wait_due(NOW, None, deadline, None) == deadline
    assert wait_due(NOW, None, soon, POLL) == soon


def test_a_settled_call_says_first_what_became_of_its_request() -> None:
    """The event that says what became of a dispatched request comes before the
    transition's, at the call's step, and the snapshot the holder goes on with counts it."""
    run = held_at("bench-four", "read", {"recordId": "app-1"}, dispatched=True)
    answered = Advance("decide", "next", {"data": {"domainData": {"status": "x"}}}, True)
    planned = plan(
        definition("bench-four"),
        run,
        answered,
        LEASE,
        keep_lease=True,
        poll=POLL,
        now=NOW,
        settlement=Settlement("response", 200, b"{}"),
        go_on=True,
        outcome=call_outcome(Settlement("response", 200, b"{}"), run.attempt),
    )
    st = planned.statement
    assert st["kinds"][:3] == ["call-answered", "step-completed", "step-completed"]
    assert st["event_steps"][:3] == ["read", "read", "decide"]
    assert st["events"][0].obj == {"attempt": 2, "status": 200}
    assert planned.run.seq == run.seq + len(st["kinds"])


@pytest.mark.parametrize(
    ("outcome", "kind"),
    [
        ("response", "call-answered"),
        ("not-sent", "call-not-sent"),
        ("lost", "call-lost"),
        ("interrupted", "call-lost"),
    ],
)
def test_each_outcome_of_a_sending_is_one_of_three_events(outcome: str, kind: str) -> None:
    said = call_outcome(Settlement(outcome, 200 if outcome == "response" else None), 3, "why")
    assert said.kind == kind == CALL_OUTCOMES[outcome]
    if outcome == "response":
        assert said.detail == {"attempt": 3, "status": 200}
    else:
        assert said.detail == {"attempt": 3, "detail": "why"}
    assert wording.event(kind), "the console has words for it"


def test_a_lost_call_says_why_with_its_text_made_storable() -> None:
    assert call_outcome(Settlement("interrupted"), 1).detail["detail"] == INTERRUPTED
    assert call_outcome(Settlement("lost"), 1, "reset\x00").detail["detail"] == "reset\\u0000"


def test_a_poll_keeps_the_answer_and_why_there_was_none() -> None:
    url = "http://casework.test/v1/review-requests/r/result"
    busy = result_polled(url, Reply(ReplyKind.RESPONSE, 503, b"busy", None, ""))
    assert busy == {"url": url, "status": 503, "outcome": "response"}
    refused = result_polled(url, Reply(ReplyKind.NOT_SENT, detail="ConnectError: refused"))
    assert refused == {
        "url": url,
        "status": None,
        "outcome": "not-sent",
        "detail": "ConnectError: refused",
    }
    read = result_read(url, 200, "r")
    assert (read.kind, read.detail) == ("result-read", {"url": url, "status": 200, "key": "r"})
    assert wording.event("result-polled") and wording.event("result-read")
