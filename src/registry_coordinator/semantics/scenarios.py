"""``coordinator test``: run a workflow offline against scripted product replies.

A scenario gives the start input, what each call step's product answers on each
attempt (and, for an operation with a receipt, what its receipt lookups answer),
when each awaited result arrives, and what the run must end as. The run is driven
through :mod:`steps` — the same semantics the engine uses — on a virtual clock, so a
fourteen-day timeout takes no time at all. A mutation whose outcome is unknown is
asked about as the engine asks with a connection's default verification: its receipt
looked up, or its identical request sent again (which takes the step's next reply).

Retries and askings use the upper end of their spread (no random jitter), so a
scenario's elapsed time is exact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.diagnostics import Diagnostic, Refused
from registry_coordinator.authoring.durations import format_duration
from registry_coordinator.authoring.expressions import parse_instant
from registry_coordinator.authoring.fields import Reader, describe
from registry_coordinator.authoring.source import DataPath, SourceMap
from registry_coordinator.authoring.workflow import Call, WaitFor
from registry_coordinator.semantics.codes import FailureCode, RunState
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
    Transition,
    Verification,
    Verify,
    checked,
    enter,
    result_arrived,
    settle,
    timed_out,
    woke,
)

DEFAULT_ADMITTED_AT = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
MAX_ATTEMPTS = 1000
#: How a scenario's run asks about an unknown outcome: as a connection does by default.
VERIFICATION = Verification()
#: The states a scenario may expect its run to end in (nothing cancels a scenario's run).
STATES = (RunState.FINISHED, RunState.FAILED, RunState.HELD, RunState.EXPIRED)


@dataclass(frozen=True)
class Delivery:
    after: timedelta  # from entering the wait-for step
    payload: JSON
    key: str | None


@dataclass(frozen=True)
class Expectation:
    path: list[str] | None
    state: str | None
    outcome: str | None
    output: JSON
    has_output: bool
    failure: str | None
    hold: str | None
    elapsed: timedelta | None
    attempts: dict[str, int]


@dataclass(frozen=True)
class Scenario:
    name: str
    input: JSON
    admitted_at: datetime
    replies: dict[str, list[Reply]]
    results: dict[str, list[Delivery]]
    expect: Expectation
    path: DataPath
    receipts: dict[str, list[Reply]] = field(default_factory=dict)


@dataclass
class Outcome:
    """How a scenario's run ended."""

    path: list[str] = field(default_factory=list)
    state: RunState = RunState.RUNNING
    outcome: str | None = None
    output: JSON = None
    failure: str | None = None
    hold: str | None = None
    detail: str = ""
    elapsed: timedelta = timedelta(0)
    attempts: dict[str, int] = field(default_factory=dict)


# --- reading scenarios.yaml -------------------------------------------------------------


def read_scenarios(document: JSON, source: SourceMap, definition: Definition) -> list[Scenario]:
    reader = Reader(source)
    root = reader.mapping(document, (), "the scenarios file")
    scenarios: list[Scenario] = []
    if root is not None and reader.fields(root, (), "the scenarios file", ["scenarios"]):
        items = root["scenarios"]
        if not isinstance(items, list) or not items:
            reader.report(
                "field.type",
                f"scenarios must be a non-empty list, not {describe(items)}",
                "write each scenario as a list item: '- name: ...'",
                ("scenarios",),
            )
        else:
            names: set[str] = set()
            for index, item in enumerate(items):
                scenario = _scenario(reader, item, ("scenarios", index), definition)
                if scenario is not None:
                    if scenario.name in names:
                        reader.report(
                            "scenario.invalid",
                            f"two scenarios are named {scenario.name!r}",
                            "give each scenario its own name",
                            ("scenarios", index, "name"),
                        )
                    names.add(scenario.name)
                    scenarios.append(scenario)
    if reader.diagnostics:
        raise Refused(reader.diagnostics)
    return scenarios


def _scenario(
    reader: Reader, item: JSON, path: DataPath, definition: Definition
) -> Scenario | None:
    data = reader.mapping(item, path, "a scenario")
    if data is None:
        return None
    before = len(reader.diagnostics)
    reader.fields(
        data,
        path,
        "a scenario",
        ["name", "input", "expect"],
        ["admittedAt", "replies", "receipts", "results"],
    )
    name = reader.string(data, "name", path, "a scenario") or f"#{path[-1]}"
    what = f"scenario {name!r}"
    problems = definition.schema_errors(definition.workflow.input_schema, data.get("input"))
    if "input" in data and problems:
        reader.report(
            "scenario.invalid",
            f"{what} input does not fit the workflow's input schema: {'; '.join(problems)}",
            "give an input the workflow would admit",
            (*path, "input"),
        )
    admitted_at = DEFAULT_ADMITTED_AT
    if "admittedAt" in data:
        text = reader.string(data, "admittedAt", path, what)
        try:
            admitted_at = parse_instant(text or "")
        except ValueError as exc:
            reader.report(
                "field.type",
                str(exc),
                "write an RFC 3339 instant such as 2026-01-05T09:00:00Z",
                (*path, "admittedAt"),
            )
    replies = _replies(reader, data.get("replies", {}), (*path, "replies"), definition, what)
    receipts = _replies(
        reader, data.get("receipts", {}), (*path, "receipts"), definition, what, receipt=True
    )
    results = _results(reader, data.get("results", {}), (*path, "results"), definition, what)
    expect = _expectation(reader, data.get("expect"), (*path, "expect"), definition, what)
    if len(reader.diagnostics) > before or expect is None:
        return None
    return Scenario(name, data["input"], admitted_at, replies, results, expect, path, receipts)


def _steps_of(
    reader: Reader, value: JSON, path: DataPath, definition: Definition, kind: type, what: str
) -> dict[str, list[JSON]]:
    data = reader.mapping(value, path, f"{what} {path[-1]}") or {}
    found = {}
    for step_id, entries in data.items():
        step = definition.workflow.steps.get(step_id)
        if not isinstance(step, kind):
            reader.report(
                "scenario.invalid",
                f"{what} scripts step {step_id!r}, which is not a "
                f"{'call' if kind is Call else 'wait-for'} step of the workflow",
                "script only the workflow's "
                f"{'call' if kind is Call else 'wait-for'} steps: "
                + ", ".join(s for s, v in definition.workflow.steps.items() if isinstance(v, kind)),
                (*path, step_id),
                key=True,
            )
            continue
        found[step_id] = entries if isinstance(entries, list) else [entries]
    return found


_UNCERTAIN = {"timeout", "reset", "invalid"}


def _replies(
    reader: Reader,
    value: JSON,
    path: DataPath,
    definition: Definition,
    what: str,
    *,
    receipt: bool = False,
) -> dict[str, list[Reply]]:
    """Each call step's scripted replies (``receipt``: its receipt lookups' answers). A
    success is answered with the operation's first success status (a receipt's, 200)."""
    replies: dict[str, list[Reply]] = {}
    for step_id, entries in _steps_of(reader, value, path, definition, Call, what).items():
        operation = definition.operations[step_id]
        if receipt and operation.receipt is None:
            reader.report(
                "scenario.invalid",
                f"{what} scripts receipts for {step_id}, but "
                f"{operation.product}/{operation.name} has no receipt lookup",
                "script receipts only for operations the catalog gives a receipt",
                (*path, step_id),
                key=True,
            )
            continue
        success = 200 if receipt or operation.success is None else min(operation.success)
        parsed = []
        for index, entry in enumerate(entries):
            where = (
                (*path, step_id)
                if len(entries) == 1 and not isinstance(value[step_id], list)
                else (*path, step_id, index)
            )
            reply = _reply(reader, entry, where, success)
            if reply is not None:
                parsed.append(reply)
        replies[step_id] = parsed
    return replies


def _reply(reader: Reader, entry: JSON, path: DataPath, success: int = 200) -> Reply | None:
    data = reader.mapping(entry, path, "a reply")
    if data is None:
        return None
    kinds = ["success", "refused", "retryable", "uncertain"]
    if len(data) != 1 or next(iter(data)) not in kinds:
        reader.report(
            "scenario.invalid",
            f"a reply must be exactly one of {', '.join(kinds)}",
            "write e.g. '{success: {...}}', '{refused: 422}', '{retryable: 503}', "
            "'{retryable: not-sent}' or '{uncertain: timeout}'",
            path,
        )
        return None
    kind, value = next(iter(data.items()))
    at = (*path, kind)
    if kind == "success":
        return Reply(ReplyKind.RESPONSE, success, json.dumps(value).encode())
    if kind == "refused":
        if isinstance(value, int) and 400 <= value < 500 and value not in (429,):
            return Reply(ReplyKind.RESPONSE, value, b'{"title":"refused by the scenario"}')
        reader.report(
            "scenario.invalid",
            f"refused takes a 4xx status other than 429, not {value!r}",
            "write e.g. 'refused: 422', or 'refused: 403' for a refused identity",
            at,
        )
        return None
    if kind == "retryable":
        if value == "not-sent":
            return Reply(ReplyKind.NOT_SENT, detail="connection refused (scenario)")
        status = value.get("status") if isinstance(value, dict) else value
        after = value.get("retryAfter") if isinstance(value, dict) else None
        if status in (429, 503):
            retry_after = reader.duration(value, "retryAfter", at, "retryable") if after else None
            return Reply(ReplyKind.RESPONSE, status, b"", retry_after)
        reader.report(
            "scenario.invalid",
            f"retryable takes 429, 503 or not-sent, not {value!r}",
            "write e.g. 'retryable: 503' or '{retryable: {status: 429, retryAfter: PT30S}}'",
            at,
        )
        return None
    if value in _UNCERTAIN:
        if value == "invalid":
            return Reply(ReplyKind.RESPONSE, success, b'{"unexpected": true}')
        return Reply(ReplyKind.LOST, detail=f"{value} (scenario)")
    if isinstance(value, int) and 500 <= value < 600 and value != 503:
        return Reply(ReplyKind.RESPONSE, value, b"")
    reader.report(
        "scenario.invalid",
        f"uncertain takes timeout, reset, invalid or a 5xx status, not {value!r}",
        "write e.g. 'uncertain: timeout' or 'uncertain: 502'",
        at,
    )
    return None


def _results(
    reader: Reader, value: JSON, path: DataPath, definition: Definition, what: str
) -> dict[str, list[Delivery]]:
    results: dict[str, list[Delivery]] = {}
    for step_id, entries in _steps_of(reader, value, path, definition, WaitFor, what).items():
        deliveries = []
        for index, entry in enumerate(entries):
            where = (*path, step_id, index)
            data = reader.mapping(entry, where, "a result delivery")
            if data is None or not reader.fields(
                data, where, "a result delivery", ["after", "payload"], ["key"]
            ):
                continue
            after = reader.duration(data, "after", where, "a result delivery")
            key = reader.string(data, "key", where, "a result delivery")
            if after is not None:
                deliveries.append(Delivery(after, data["payload"], key))
        results[step_id] = sorted(deliveries, key=lambda d: d.after)
    return results


def _expectation(
    reader: Reader, value: JSON, path: DataPath, definition: Definition, what: str
) -> Expectation | None:
    data = reader.mapping(value, path, f"{what} expect")
    if data is None:
        return None
    optional = ["path", "state", "outcome", "output", "failure", "hold", "elapsed", "attempts"]
    if not reader.fields(data, path, f"{what} expect", [], optional):
        return None
    if not data:
        reader.report(
            "scenario.invalid",
            f"{what} expects nothing, so it could not fail",
            "state at least the path and the final state",
            path,
        )
        return None
    steps = definition.workflow.steps
    trail = data.get("path")
    if trail is not None and (not isinstance(trail, list) or not all(s in steps for s in trail)):
        reader.report(
            "scenario.invalid",
            f"{what} expect.path must list steps of the workflow",
            "list step ids in the order the run visits them",
            (*path, "path"),
        )
    state = reader.string(data, "state", path, f"{what} expect")
    if state is not None and state not in STATES:
        reader.report(
            "scenario.invalid",
            f"state {state!r} is not one a run ends in",
            f"use one of: {', '.join(STATES)}",
            (*path, "state"),
        )
    outcome = reader.string(data, "outcome", path, f"{what} expect")
    if outcome is not None and outcome not in definition.workflow.outcomes:
        reader.report(
            "scenario.invalid",
            f"outcome {outcome!r} is not declared by the workflow",
            f"use one of: {', '.join(definition.workflow.outcomes)}",
            (*path, "outcome"),
        )
    attempts = data.get("attempts", {})
    if not isinstance(attempts, dict) or not all(
        isinstance(steps.get(k), Call) and isinstance(v, int) for k, v in attempts.items()
    ):
        reader.report(
            "scenario.invalid",
            "expect.attempts maps call steps to how often they were sent",
            "write e.g. 'attempts: {notify: 2}'",
            (*path, "attempts"),
        )
    return Expectation(
        path=trail,
        state=state,
        outcome=outcome,
        output=data.get("output"),
        has_output="output" in data,
        failure=reader.string(data, "failure", path, f"{what} expect"),
        hold=reader.string(data, "hold", path, f"{what} expect"),
        elapsed=reader.duration(data, "elapsed", path, f"{what} expect"),
        attempts=attempts if isinstance(attempts, dict) else {},
    )


# --- running a scenario -----------------------------------------------------------------


def run(definition: Definition, scenario: Scenario) -> Outcome:
    """Drive one run through the step semantics on a virtual clock."""
    now = scenario.admitted_at
    deadline = now + definition.workflow.deadline
    record = RunRecord(f"scenario-{scenario.name}", scenario.input, now, deadline)
    ended = Outcome()
    step_id = definition.workflow.start

    def finish(state: RunState, **fields: Any) -> Outcome:
        ended.state = state
        ended.elapsed = min(now, deadline) - scenario.admitted_at
        for name, value in fields.items():
            setattr(ended, name, value)
        return ended

    while True:
        ended.path.append(step_id)
        if now >= deadline:
            return finish(RunState.EXPIRED, failure=FailureCode.DEADLINE_REACHED.value)
        transition: Transition | _Expired = enter(definition, step_id, record, now)
        if isinstance(transition, Send):
            transition, now = _call(definition, scenario, step_id, now, ended)
        elif isinstance(transition, Sleep):
            if transition.until >= deadline:
                now = deadline
                return finish(RunState.EXPIRED, failure=FailureCode.DEADLINE_REACHED.value)
            now = transition.until
            transition = woke(definition, step_id)
        elif isinstance(transition, Await):
            transition, now = _wait(definition, scenario, step_id, transition, now, deadline)
        if isinstance(transition, Advance):
            if transition.has_output:
                record.outputs[step_id] = transition.output
            record.completed[step_id] = now
            step_id = transition.next
            continue
        if isinstance(transition, Finished):
            return finish(RunState.FINISHED, outcome=transition.outcome, output=transition.output)
        if isinstance(transition, Failed):
            return finish(RunState.FAILED, failure=transition.code.value, detail=transition.detail)
        if isinstance(transition, Held):
            return finish(RunState.HELD, hold=transition.code.value, detail=transition.detail)
        if isinstance(transition, _Expired):
            return finish(RunState.EXPIRED, failure=FailureCode.DEADLINE_REACHED.value)
        raise AssertionError(f"unexpected transition {transition!r}")


def _call(
    definition: Definition, scenario: Scenario, step_id: str, now: datetime, ended: Outcome
) -> tuple[Transition | _Expired, datetime]:
    deadline = scenario.admitted_at + definition.workflow.deadline
    script = scenario.replies.get(step_id)
    if not script:
        raise _NoReply(step_id)
    receipts = scenario.receipts.get(step_id, [])
    has_receipt = definition.operations[step_id].receipt is not None
    checks = 0
    for attempt in range(1, MAX_ATTEMPTS + 1):
        ended.attempts[step_id] = attempt
        reply = script[min(attempt, len(script)) - 1]
        transition = settle(
            definition,
            step_id,
            reply,
            attempt,
            now,
            jitter=_upper,
            checks=checks,
            verification=VERIFICATION,
        )
        while isinstance(transition, Verify) and has_receipt:
            if transition.at >= deadline:
                return _Expired(), deadline
            now, checks = transition.at, checks + 1
            answer = (
                receipts[min(checks, len(receipts)) - 1]
                if receipts
                else Reply(ReplyKind.LOST, detail="no receipt scripted (scenario)")
            )
            transition = checked(
                definition, step_id, answer, checks, now, VERIFICATION, jitter=_upper
            )
        if isinstance(transition, Verify):  # the identical request, sent again
            checks += 1
        elif not isinstance(transition, Retry):
            return transition, now
        if transition.at >= deadline:
            return _Expired(), deadline
        now = transition.at
    raise AssertionError("a call was retried more often than a deadline allows")


def _upper() -> float:
    """The upper end of every spread: a scenario's times are exact."""
    return 1.0


class _Expired:
    """The run's deadline came while a step was still retrying or waiting."""


def _wait(
    definition: Definition,
    scenario: Scenario,
    step_id: str,
    waiting: Await,
    now: datetime,
    deadline: datetime,
) -> tuple[Transition | _Expired, datetime]:
    entered = now
    limit = min(waiting.timeout_at or deadline, deadline)
    for delivery in scenario.results.get(step_id, []):
        at = entered + delivery.after
        if at >= limit:
            break
        if delivery.key is not None and delivery.key != waiting.key:
            continue
        advanced = result_arrived(definition, step_id, delivery.payload)
        if advanced is not None:
            return advanced, at
    if waiting.timeout_at is not None and waiting.timeout_at < deadline:
        return timed_out(definition, step_id), waiting.timeout_at
    return _Expired(), deadline


class _NoReply(Exception):
    def __init__(self, step_id: str) -> None:
        super().__init__(step_id)
        self.step_id = step_id


def mismatches(scenario: Scenario, ended: Outcome) -> list[str]:
    """How the run differs from what the scenario expects; empty when it passed."""
    expect = scenario.expect
    found: list[str] = []

    def compare(what: str, wanted: Any, got: Any) -> None:
        if wanted != got:
            found.append(f"{what}: expected {json.dumps(wanted)}, got {json.dumps(got)}")

    if expect.path is not None:
        compare("path", expect.path, ended.path)
    if expect.state is not None:
        compare("state", expect.state, ended.state)
    if expect.outcome is not None:
        compare("outcome", expect.outcome, ended.outcome)
    if expect.has_output:
        compare("output", expect.output, ended.output)
    if expect.failure is not None:
        compare("failure", expect.failure, ended.failure)
    if expect.hold is not None:
        compare("hold", expect.hold, ended.hold)
    if expect.elapsed is not None and expect.elapsed != ended.elapsed:
        wanted, got = format_duration(expect.elapsed), format_duration(ended.elapsed)
        found.append(f"elapsed: expected {wanted}, got {got}")
    for step_id, count in expect.attempts.items():
        compare(f"attempts of {step_id}", count, ended.attempts.get(step_id, 0))
    return found


def run_all(
    definition: Definition, scenarios: list[Scenario], file: str
) -> list[tuple[Scenario, Outcome, list[str]]]:
    results = []
    for scenario in scenarios:
        try:
            ended = run(definition, scenario)
        except _NoReply as missing:
            raise Refused(
                [
                    Diagnostic(
                        "scenario.invalid",
                        f"scenario {scenario.name!r} reaches call step '{missing.step_id}' "
                        "but scripts no reply for it",
                        f"add replies: {{{missing.step_id}: {{success: ...}}}}",
                        file,
                    )
                ]
            ) from None
        results.append((scenario, ended, mismatches(scenario, ended)))
    return results
