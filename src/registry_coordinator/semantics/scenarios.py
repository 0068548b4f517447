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
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import assert_never

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
    Check,
    Expire,
    Failed,
    Fetch,
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
    chain,
    checked,
    on_due,
    result_arrived,
    settle,
)

DEFAULT_ADMITTED_AT = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
#: The sendings of one call step a scenario may script before its run ends, a bound of the
#: runner's, not the engine's: a product answering "retry in a second" for weeks is a
#: script to end, not a run to take a million steps through.
MAX_ATTEMPTS = 10_000
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
    """Drive one run as the engine does, on a virtual clock: each due step decided by
    :func:`steps.on_due`, the steps after an advance taken by :func:`steps.chain`, each
    transition applied as the engine's commit applies it. Between transitions the clock
    jumps to the next instant the run falls due — a wait-until's, a retry's or an
    asking's, a wait-for's result or timeout — never past the deadline, where ``on_due``
    expires the run as it does in the engine."""
    return _Run(definition, scenario).drive()


def run_id(scenario: Scenario) -> str:
    """The id of a scenario's run: a UUID, as the engine's run ids are (an input schema may
    ask for one), named by the scenario, so a scenario's keys are the same every time."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"urn:coordinator:scenario:{scenario.name}"))


def _upper() -> float:
    """The upper end of every spread: a scenario's times are exact."""
    return 1.0


class _Run:
    """A scenario's run as the engine's columns would hold it: its step, whether it is
    waiting, its timer, the sendings and askings of its current call."""

    def __init__(self, definition: Definition, scenario: Scenario) -> None:
        self.definition = definition
        self.scenario = scenario
        self.now = scenario.admitted_at
        self.deadline = scenario.admitted_at + definition.workflow.deadline
        self.record = RunRecord(run_id(scenario), scenario.input, self.now, self.deadline)
        self.step = definition.workflow.start
        self.waiting = False
        self.timer_at: datetime | None = None
        self.attempt = 0  # sendings of the current call step
        self.checks = 0  # askings about its unknown outcome
        self.ended = Outcome(path=[self.step])

    def drive(self) -> Outcome:
        transition = self._due()
        while True:
            match transition:
                case None:  # nothing due yet: the clock jumps to when something is
                    self.now = min(self.timer_at or self.deadline, self.deadline)
                    transition = self._due()
                case Send():
                    transition = self._send()
                case Check():
                    transition = self._ask()
                case Advance():
                    transition = self._advance(transition)
                case Sleep(until=until):
                    self.waiting, self.timer_at = True, until
                    transition = None
                case Await():
                    transition = self._await(transition)
                case Retry(at=at):
                    self.timer_at = at
                    transition = None
                case Verify(at=at):
                    self.checks, self.timer_at = self.checks + 1, at
                    transition = None
                case Finished() | Failed() | Held() | Expire():
                    return self._end(transition)
                case Fetch():  # polls are the engine's; a scenario's results arrive
                    raise AssertionError("a scenario's wait-for is never polled")
                case _:
                    assert_never(transition)

    def _due(self) -> Transition | None:
        return on_due(
            self.definition,
            self.record,
            self.step,
            self.waiting,
            self.timer_at,
            self.now,
            checks=self.checks,
            verification=VERIFICATION,
            jitter=_upper,
        )

    def _send(self) -> Transition:
        script = self.scenario.replies.get(self.step)
        if not script:
            raise _Unscripted(
                self.step,
                "but scripts no reply for it",
                f"add replies: {{{self.step}: {{success: ...}}}}",
            )
        self.attempt += 1
        if self.attempt > MAX_ATTEMPTS:
            raise _Unscripted(
                self.step,
                f"and sends it more than {MAX_ATTEMPTS:,} times before the run's deadline",
                f"end the replies of {self.step} with one that completes or fails the step",
            )
        self.ended.attempts[self.step] = self.attempt
        reply = script[min(self.attempt, len(script)) - 1]
        return settle(
            self.definition,
            self.step,
            reply,
            self.attempt,
            self.now,
            jitter=_upper,
            checks=self.checks,
            verification=VERIFICATION,
        )

    def _ask(self) -> Transition:
        """The product asked for its receipt: the scenario's ``checks``-th answer, or none."""
        receipts = self.scenario.receipts.get(self.step, [])
        answer = (
            receipts[min(self.checks, len(receipts)) - 1]
            if receipts
            else Reply(ReplyKind.LOST, detail="no receipt scripted (scenario)")
        )
        return checked(
            self.definition, self.step, answer, self.checks, self.now, VERIFICATION, _upper
        )

    def _advance(self, advance: Advance) -> Transition | None:
        """Commit ``advance`` with the steps taken after it; what is due after them."""
        chained = chain(self.definition, self.record, self.step, advance, self.now)
        self.ended.path += [advance.next] + [
            t.next for _, t in chained.taken if isinstance(t, Advance)
        ]
        self.record, self.step = chained.run, chained.step
        self.waiting, self.timer_at, self.attempt, self.checks = False, None, 0, 0
        last = chained.taken[-1][1] if chained.taken else None
        if chained.ahead is not None:
            return chained.ahead
        if isinstance(last, Finished | Failed | Expire | Sleep):
            return last
        raise AssertionError(f"a chain ended in {last!r} with nothing ahead")

    def _await(self, waiting: Await) -> Transition | None:
        """Wait for the scenario's first result for the key before the timeout and the
        deadline: the step completes as it arrives; else the run is due at its timeout."""
        self.waiting, self.timer_at = True, waiting.timeout_at
        limit = min(waiting.timeout_at or self.deadline, self.deadline)
        for delivery in self.scenario.results.get(self.step, []):
            at = self.now + delivery.after
            if at >= limit:
                break
            if delivery.key is not None and delivery.key != waiting.key:
                continue
            advanced = result_arrived(self.definition, self.step, delivery.payload)
            if advanced is not None:
                self.now = at
                return advanced
        return None

    def _end(self, transition: Finished | Failed | Held | Expire) -> Outcome:
        ended = self.ended
        ended.elapsed = min(self.now, self.deadline) - self.scenario.admitted_at
        match transition:
            case Finished(outcome=outcome, output=output):
                ended.state, ended.outcome, ended.output = RunState.FINISHED, outcome, output
            case Failed(code=code, detail=detail):
                ended.state, ended.failure, ended.detail = RunState.FAILED, code.value, detail
            case Held(code=code, detail=detail):
                ended.state, ended.hold, ended.detail = RunState.HELD, code.value, detail
            case Expire():
                ended.state = RunState.EXPIRED
                ended.failure = FailureCode.DEADLINE_REACHED.value
        return ended


class _Unscripted(Exception):
    """A call step the scenario's script cannot take through: what it lacks, and what to write."""

    def __init__(self, step_id: str, lacks: str, repair: str) -> None:
        super().__init__(step_id)
        self.step_id, self.lacks, self.repair = step_id, lacks, repair


def mismatches(scenario: Scenario, ended: Outcome) -> list[str]:
    """How the run differs from what the scenario expects; empty when it passed."""
    expect = scenario.expect
    found: list[str] = []

    def compare(what: str, wanted: object, got: object) -> None:
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
        except _Unscripted as missing:
            raise Refused(
                [
                    Diagnostic(
                        "scenario.invalid",
                        f"scenario {scenario.name!r} reaches call step '{missing.step_id}' "
                        + missing.lacks,
                        missing.repair,
                        file,
                    )
                ]
            ) from None
        results.append((scenario, ended, mismatches(scenario, ended)))
    return results
