"""One decision loop: ``coordinator test`` and the engine take a run through the same steps.

The scenario runner (``semantics/scenarios.py``) decides each due step with the engine's
``on_due`` and takes the steps after an advance with the engine's ``chain``. Here the
engine's side is driven as the engine commits: each transition through
``store.statements.plan`` — the statement builder every commit uses — with the run's
columns as the statement leaves them, and a result read as the engine reads one
(``Fetch``, then ``fetched``), where the runner takes a result as it arrives
(``result_arrived``). On random acyclic workflows and random replies, receipts and
results, both must end the same way: the same path, state, outcome, failure, hold,
sendings per call step, and time taken.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.authoring.checker import check_document
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.source import SourceMap
from registry_coordinator.authoring.workflow import WaitFor
from registry_coordinator.semantics import scenarios
from registry_coordinator.semantics.codes import TERMINAL, RunState
from registry_coordinator.semantics.scenarios import VERIFICATION, Delivery, Scenario
from registry_coordinator.semantics.steps import (
    Advance,
    Await,
    Check,
    Fetch,
    Reply,
    ReplyKind,
    Send,
    Transition,
    checked,
    fetched,
    on_due,
    settle,
)
from registry_coordinator.store.claims import Claimed
from registry_coordinator.store.statements import plan
from tests.support.generated import dags

ADMITTED = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
RECORD = {
    "data": {
        "recordIdentifier": "3e2d1c0b-9a8f-4e7d-8c6b-5a4f3e2d1c01",
        "revisionIdentifier": "4",
        "domainData": {"status": "open"},
    },
    "meta": {
        "registryIdentifier": "people-registry",
        "datasetIdentifier": "people",
        "entityTypeIdentifier": "person",
    },
}
MESSAGE_ID = "6f5e4d3c-2b1a-4f0e-9d8c-7b6a5f4e3d01"
ACCEPTED = {
    "id": MESSAGE_ID,
    "status": "queued",
    "links": {"self": f"/v1/messages/{MESSAGE_ID}", "cancel": f"/v1/messages/{MESSAGE_ID}/cancel"},
}
#: What the message's read says (and a delivery carries), by status.
MESSAGES: dict[str, JSON] = {
    status: {
        "id": MESSAGE_ID,
        "status": status,
        "dispatch": "submitted" if status != "queued" else "queued",
        "report": status if status == "delivered" else "none",
        "channel": "email",
        "senderProfile": "case-notices",
        "to": {"email": "redacted"},
        "acceptedAt": "2026-01-05T09:00:00.000Z",
        "expiresAt": "2026-01-06T09:00:00.000Z",
        "updatedAt": "2026-01-05T09:01:00.000Z",
        "attempts": [],
        "links": {"self": f"/v1/messages/{MESSAGE_ID}"},
    }
    for status in ("queued", "delivered", "failed")
}


def upper() -> float:
    return 1.0


def answered(status: int, body: JSON = None) -> Reply:
    return Reply(ReplyKind.RESPONSE, status, b"" if body is None else json.dumps(body).encode())


#: What a product may answer a sending, by the kind of call: its success, a refusal, a
#: failure worth retrying, an answer that cannot be used, no answer at all.
REPLIES = {
    "read-record": [answered(200, RECORD), answered(404), answered(503), answered(200, {})],
    "submit-message": [answered(202, ACCEPTED), answered(422), answered(503), answered(500)],
}
NO_ANSWERS = [Reply(ReplyKind.LOST, detail="reset"), Reply(ReplyKind.NOT_SENT, detail="refused")]
RECEIPTS = [answered(200, ACCEPTED), answered(404), Reply(ReplyKind.LOST, detail="timeout")]


class Drawn:
    """A workflow and a scenario for it, shown as the workflow's document and the scenario's
    input and scripts (a definition's own repr runs to tens of kilobytes)."""

    def __init__(self, document: JSON, definition: Definition, scenario: Scenario) -> None:
        self.document, self.definition, self.scenario = document, definition, scenario

    def __repr__(self) -> str:
        s = self.scenario
        return f"Drawn({self.document!r}, input={s.input!r}, replies={s.replies!r}, " + (
            f"receipts={s.receipts!r}, results={s.results!r})"
        )


@st.composite
def runs(draw: st.DrawFn) -> Drawn:
    """A random workflow that checks, and a scenario for it: replies for every call step,
    receipts, and results that arrive (for the run's key or another) or do not."""
    # A deadline before or after the waits (wait-untils up to a day, results up to two):
    # a month would only retry a failing call some thousands of times more.
    document = {**draw(dags()), "deadline": draw(st.sampled_from(["PT6H", "P3D"]))}
    definition = check_document(document, SourceMap("g.yaml"), builtin_catalog()).definition
    assume(definition is not None)  # a graph the checker refuses has nothing to run
    assert definition is not None
    replies, receipts, results = {}, {}, {}
    for step_id, operation in definition.operations.items():
        kinds = st.sampled_from(REPLIES[operation.name] + NO_ANSWERS)
        replies[step_id] = draw(st.lists(kinds, min_size=1, max_size=4))
        receipts[step_id] = draw(st.lists(st.sampled_from(RECEIPTS), max_size=3))
    for step_id, step in definition.workflow.steps.items():
        if isinstance(step, WaitFor):
            delivery = st.builds(
                Delivery,
                after=st.sampled_from(
                    [timedelta(minutes=5), timedelta(hours=3), timedelta(days=2)]
                ),
                payload=st.sampled_from(list(MESSAGES.values())),
                key=st.sampled_from([None, "another-message"]),
            )
            results[step_id] = draw(st.lists(delivery, max_size=2))
    scenario = Scenario(
        name="generated",
        input={"n": draw(st.integers(min_value=0, max_value=3))},
        admitted_at=ADMITTED,
        replies=replies,
        results=results,
        expect=scenarios.Expectation(None, None, None, None, False, None, None, None, {}),
        path=(),
        receipts=receipts,
    )
    return Drawn(document, definition, scenario)


@dataclass
class Ended:
    path: list[str]
    state: RunState
    outcome: str | None = None
    failure: str | None = None
    hold: str | None = None
    elapsed: timedelta = timedelta(0)
    attempts: dict[str, int] = field(default_factory=dict)


def as_the_engine_commits(definition: Definition, scenario: Scenario) -> Ended:
    """The run taken through the engine's own commits, on the scenario's clock."""
    now, deadline = scenario.admitted_at, scenario.admitted_at + definition.workflow.deadline
    run = Claimed(
        id=uuid.UUID(scenarios.run_id(scenario)),
        workflow_id="generated",
        digest="generated",
        input=scenario.input,
        state=RunState.RUNNING,
        step=definition.workflow.start,
        seq=1,
        attempt=0,
        checks=0,
        timer_at=None,
        outputs={},
        completed={},
        admitted_at=now,
        deadline_at=deadline,
        owner="engine",
        token=uuid.UUID(int=2),
        dispatched=False,
        traceparent=None,
        clock=(now, 0.0),
    )
    ended = Ended([run.step], RunState.RUNNING)
    ahead: Transition | None = None
    while True:
        waiting = run.state == RunState.WAITING
        transition = ahead or on_due(
            definition,
            run.record(),
            run.step,
            waiting,
            run.timer_at,
            now,
            checks=run.checks,
            verification=VERIFICATION,
            jitter=upper,
        )
        ahead = None
        if transition is None:  # due later: at its timer, or its deadline
            now = min(run.timer_at or deadline, deadline)
            continue
        if isinstance(transition, Send):
            run = replace(run, attempt=run.attempt + 1)  # the sealing counts the sending
            ended.attempts[run.step] = run.attempt
            script = scenario.replies[run.step]
            reply = script[min(run.attempt, len(script)) - 1]
            transition = settle(
                definition, run.step, reply, run.attempt, now, upper, run.checks, VERIFICATION
            )
        elif isinstance(transition, Check):
            asked = scenario.receipts.get(run.step) or [Reply(ReplyKind.LOST, detail="none")]
            receipt = asked[min(run.checks, len(asked)) - 1]
            transition = checked(
                definition, run.step, receipt, run.checks, now, VERIFICATION, upper
            )
        planned = plan(
            definition,
            run,
            transition,
            LEASE,
            keep_lease=True,
            poll=None,
            now=now,
            settlement=None,
            go_on=True,
        )
        ended.path += [t.next for _, t in planned.taken if isinstance(t, Advance)]
        run = planned.run
        if run.state in TERMINAL or run.state == RunState.HELD:
            statement = planned.statement
            ended.state, ended.outcome = run.state, statement["outcome"]
            ended.failure, ended.hold = statement["failure_code"], statement["hold_code"]
            ended.elapsed = min(now, deadline) - scenario.admitted_at
            return ended
        ahead = planned.ahead.transition if planned.ahead is not None else None
        if isinstance(transition, Await):  # Await is never taken at once: it is ``transition``
            now, ahead = read_as_results_arrive(definition, scenario, run, now, deadline)


def read_as_results_arrive(
    definition: Definition, scenario: Scenario, run: Claimed, now: datetime, deadline: datetime
) -> tuple[datetime, Transition | None]:
    """A waiting run read as each result arrives, as a delivery wakes it: the step completes
    on the first final one for its key; else the run is next due at its timeout."""
    limit = min(run.timer_at or deadline, deadline)
    for delivery in scenario.results.get(run.step, []):
        at = now + delivery.after
        if at >= limit:
            break
        if delivery.key is not None:  # another message's: the run's own read finds nothing
            continue
        fetch = on_due(definition, run.record(), run.step, True, run.timer_at, at)
        assert isinstance(fetch, Fetch)
        read = fetched(definition, run.step, answered(200, delivery.payload))
        if isinstance(read, Advance):
            return at, read
    return limit, None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(runs())
def test_the_test_runner_ends_every_run_as_the_engine_commits_it(drawn: Drawn) -> None:
    definition, scenario = drawn.definition, drawn.scenario
    note(repr(drawn))
    runner = scenarios.run(definition, scenario)
    engine = as_the_engine_commits(definition, scenario)
    assert (
        runner.path,
        runner.state,
        runner.outcome,
        runner.failure,
        runner.hold,
        runner.elapsed,
        runner.attempts,
    ) == (
        engine.path,
        engine.state,
        engine.outcome,
        engine.failure,
        engine.hold,
        engine.elapsed,
        engine.attempts,
    )
