"""What each step type does, as pure functions from a run's record to a transition.

This is the single statement of the step semantics. The offline test runner
(:mod:`scenarios`) drives it with a virtual clock and scripted replies; the
engine drives it with PostgreSQL, timers and real HTTP. Neither decides what a
step means: they only apply the transition returned here and record it.

Nothing here reads a clock or the network; ``now`` and the product's reply are
arguments, so every decision can be replayed from a run's history.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, assert_never
from urllib.parse import quote, urlencode

from registry_coordinator.authoring.canonical import (
    JSON,
    UnusableJson,
    canonical_bytes,
    strict_json,
)
from registry_coordinator.authoring.catalog import Effect, Operation, Result
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.expressions import (
    EvaluationError,
    parse_instant,
    to_json,
    variables,
)
from registry_coordinator.authoring.workflow import Call, Choose, Finish, WaitFor, WaitUntil
from registry_coordinator.errors import CoordinatorError
from registry_coordinator.semantics.codes import FailureCode, HoldCode

#: The statuses by which a product refuses a command as sent (SPEC section 5): the run
#: fails. Every other 4xx is no such statement, and is treated as an unknown outcome.
REFUSALS = frozenset({400, 404, 409, 422})
BACKOFF_BASE = timedelta(seconds=1)
BACKOFF_CAP = timedelta(minutes=5)
MAX_DETAIL = 500


@dataclass(frozen=True)
class RunRecord:
    """Everything a run's expressions may depend on: its recorded data, nothing else."""

    run_id: str
    input: JSON
    admitted_at: datetime
    deadline_at: datetime
    outputs: dict[str, JSON] = field(default_factory=dict)
    completed: dict[str, datetime] = field(default_factory=dict)

    def variables(self) -> dict[str, Any]:
        return variables(
            input=self.input,
            outputs=self.outputs,
            completed=self.completed,
            run_id=self.run_id,
            admitted_at=self.admitted_at,
            deadline_at=self.deadline_at,
        )


# --- transitions --------------------------------------------------------------------


@dataclass(frozen=True)
class Advance:
    """The step completed; the run goes on to ``next`` along the edge ``via``."""

    next: str
    via: str
    output: JSON = None
    has_output: bool = False


@dataclass(frozen=True)
class Finished:
    outcome: str
    output: JSON


@dataclass(frozen=True)
class Failed:
    code: FailureCode
    detail: str


@dataclass(frozen=True)
class Held:
    code: HoldCode
    detail: str


@dataclass(frozen=True)
class Sleep:
    """A wait-until whose instant is still ahead: park the run until ``until``."""

    until: datetime


@dataclass(frozen=True)
class Await:
    """A wait-for: park the run until ``result`` arrives for ``key``, or ``timeout_at``."""

    result: Result
    key: str
    timeout_at: datetime | None


@dataclass(frozen=True)
class Request:
    """A call's exact request, sealed before it is sent and resent only byte for byte."""

    method: str
    target: str  # path and query, relative to the connection's base URL
    body: bytes | None
    idempotency_key: str | None


@dataclass(frozen=True)
class Send:
    request: Request


@dataclass(frozen=True)
class Retry:
    """The product did not act (or a read may be repeated): try again at ``at``."""

    at: datetime
    detail: str


@dataclass(frozen=True)
class Expire:
    """The run's deadline has passed: it ends ``expired`` wherever it was."""


@dataclass(frozen=True)
class Fetch:
    """A wait-for woken before its timeout (a delivery, or the poll): read the product's
    authoritative result for ``key``, and go on only if it is final."""

    result: Result
    key: str


Transition = Advance | Finished | Failed | Held | Sleep | Await | Send | Retry | Expire | Fetch


def on_due(
    definition: Definition,
    run: RunRecord,
    step_id: str,
    waiting: bool,
    timer_at: datetime | None,
    now: datetime,
    dispatched: bool = False,
) -> Transition | None:
    """What a run does when it falls due at ``now``; ``None`` when nothing is due yet.

    A run falls due when its deadline passes, when its step's own instant comes
    (a wait-until, a wait-for's timeout, a call's retry), when it is runnable, or
    when the process that held it stopped — possibly in the middle of a call
    (``dispatched``), whose outcome is then unknown and decided first.
    """
    if dispatched:
        return interrupted(definition, step_id, now)
    if now >= run.deadline_at:
        return Expire()
    timer_passed = timer_at is not None and now >= timer_at
    if waiting:
        step = definition.step(step_id)
        if isinstance(step, WaitUntil):
            return woke(definition, step_id) if timer_passed else None
        if isinstance(step, WaitFor):
            if timer_passed:
                return timed_out(definition, step_id)
            awaiting = enter(definition, step_id, run, now)  # the key, as when it began
            return Fetch(awaiting.result, awaiting.key) if isinstance(awaiting, Await) else awaiting
        return None
    if timer_at is not None and not timer_passed:
        return None
    return enter(definition, step_id, run, now)


# --- entering a step ----------------------------------------------------------------


def enter(definition: Definition, step_id: str, run: RunRecord, now: datetime) -> Transition:
    """What happens when a run arrives at ``step_id`` at ``now``: an exhaustive match
    over the step types, so a new one that is not given its meaning here is a type error."""
    step = definition.step(step_id)
    scope = run.variables()
    try:
        match step:
            case Choose():
                return _choose(definition, step, scope)
            case WaitUntil():
                due = _instant(definition.expression(step_id, step.at).evaluate(scope), step.at)
                return Advance(step.next, "next") if due <= now else Sleep(due)
            case WaitFor():
                return _await(definition, step, scope, now)
            case Finish():
                return _finish(definition, step, scope)
            case Call():
                return _send(definition, step, run, scope)
            case _:
                assert_never(step)
    except EvaluationError as exc:
        return Failed(FailureCode.EXPRESSION_ERROR, detail(str(exc)))


def _choose(definition: Definition, step: Choose, scope: dict[str, Any]) -> Advance:
    """The first case whose condition holds, else ``otherwise``."""
    for index, case in enumerate(step.cases):
        value = definition.expression(step.id, case.when).evaluate(scope)
        if not isinstance(value, bool):
            raise EvaluationError(f"{case.when}: gave {to_json(value)!r}, not a boolean")
        if value:
            return Advance(case.next, f"case {index + 1}")
    return Advance(step.otherwise, "otherwise")


def _await(
    definition: Definition, step: WaitFor, scope: dict[str, Any], now: datetime
) -> Transition:
    """Begin to wait for the result the step's key names (refused if the key could not
    name one: it becomes a path segment of the fetch)."""
    key = definition.expression(step.id, step.key).evaluate(scope)
    if not isinstance(key, str) or not key:
        raise EvaluationError(f"{step.key}: gave {to_json(key)!r}, not a non-empty string")
    result = definition.results[step.id]
    try:
        path_segment(result.fetch_input, key)  # the key names the result to read
    except UnsafePath as exc:
        return Failed(FailureCode.REQUEST_INVALID, detail(f"{step.key}: {exc}"))
    timeout_at = now + step.timeout if step.timeout is not None else None
    return Await(result, key, timeout_at)


def _finish(definition: Definition, step: Finish, scope: dict[str, Any]) -> Transition:
    """End with the step's outcome and its rendered output, if that fits the schema."""
    output = definition.render(step.id, scope) if step.id in definition.templates else None
    problems = definition.schema_errors(definition.workflow.outcomes[step.outcome], output)
    if problems:
        return Failed(
            FailureCode.OUTPUT_INVALID,
            f"output for outcome {step.outcome} does not fit its schema: " + "; ".join(problems),
        )
    return Finished(step.outcome, output)


def _instant(value: Any, source: str) -> datetime:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return parse_instant(value)
        except ValueError as exc:
            raise EvaluationError(f"{source}: {exc}") from None
    raise EvaluationError(f"{source}: gave {to_json(value)!r}, not a timestamp")


def _send(definition: Definition, step: Call, run: RunRecord, scope: dict[str, Any]) -> Transition:
    operation = definition.operations[step.id]
    payload = definition.render(step.id, scope)
    problems = definition.schema_errors(operation.request_schema, payload)
    if problems:
        return Failed(
            FailureCode.REQUEST_INVALID,
            f"input for {operation.product}/{operation.name} does not fit its schema: "
            + "; ".join(problems),
        )
    try:
        request = build_request(operation, payload, idempotency_key(run.run_id, step.id))
    except UnsafePath as exc:
        return Failed(
            FailureCode.REQUEST_INVALID,
            detail(f"input for {operation.product}/{operation.name}: {exc}"),
        )
    return Send(request)


def idempotency_key(run_id: str, step_id: str) -> str:
    """The key every attempt of one call step sends: the same for the run's whole life."""
    return f"coordinator:{run_id}:{step_id}"


class UnsafePath(CoordinatorError, ValueError):
    """A path parameter that would name another path of the product: empty, ``.`` or ``..``
    (percent-encoding keeps ``/`` and ``%`` literal, but HTTP clients and servers remove
    dot segments, so ``recordId: ".."`` would reach the collection's parent)."""


def path_segment(name: str, value: JSON) -> str:
    """A path parameter's value, encoded as one literal path segment."""
    text = _query_value(value)
    if text in ("", ".", ".."):
        raise UnsafePath(f"{name} is {text!r}, which cannot be a path segment")
    return quote(text, safe="")


def build_request(operation: Operation, payload: dict[str, JSON], key: str | None) -> Request:
    """Place the input: path parameters into the path, the rest into query (GET) or body.
    Raises :class:`UnsafePath` for a path parameter that is not a safe segment."""
    target = operation.path
    rest = dict(payload)
    for name in operation.path_params:
        target = target.replace("{" + name + "}", path_segment(name, rest.pop(name)))
    body = None
    if operation.method == "GET":
        if rest:
            target += "?" + urlencode(sorted((k, _query_value(v)) for k, v in rest.items()))
    else:
        body = canonical_bytes(rest)
    return Request(operation.method, target, body, key if operation.idempotency_key else None)


def build_receipt_request(operation: Operation, key: str) -> Request:
    """The read-only lookup of the product's record of an original idempotency key."""
    assert operation.receipt is not None
    return Request("GET", operation.receipt.replace("{key}", path_segment("key", key)), None, None)


def _query_value(value: JSON) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


# --- settling a call ----------------------------------------------------------------


class ReplyKind(StrEnum):
    NOT_SENT = "not-sent"
    """The request certainly did not reach the product (refused connection, DNS, closed pool)."""
    RESPONSE = "response"
    """The product answered with a status."""
    LOST = "lost"
    """The request may have reached the product but no answer came (timeout, reset, cancel)."""


@dataclass(frozen=True)
class Reply:
    kind: ReplyKind
    status: int | None = None
    body: bytes = b""
    retry_after: timedelta | None = None
    detail: str = ""


def backoff(attempt: int, jitter: Callable[[], float] = random.random) -> timedelta:
    """Capped exponential backoff with jitter for the ``attempt``-th retry (from 1).

    ``jitter`` returns a number in [0, 1]; the delay is between half and all of the
    exponential step, so retries from many runs spread out without collapsing to zero.
    """
    step: timedelta = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(attempt - 1, 20))
    return step * (0.5 + 0.5 * jitter())


def settle(
    definition: Definition,
    step_id: str,
    reply: Reply,
    attempt: int,
    now: datetime,
    jitter: Callable[[], float] = random.random,
) -> Transition:
    """Classify the reply to a call's ``attempt``-th sending (SPEC section 5, call outcomes)."""
    operation = definition.operations[step_id]
    step = definition.step(step_id)
    assert isinstance(step, Call)
    retry_at = now + backoff(attempt, jitter)
    if reply.kind is ReplyKind.NOT_SENT:
        return Retry(retry_at, detail(f"not sent: {reply.detail}"))
    if reply.kind is ReplyKind.LOST or reply.status is None:
        return _uncertain(
            operation, retry_at, HoldCode.OUTCOME_UNKNOWN, f"no answer: {reply.detail}"
        )
    status = reply.status
    if 200 <= status < 300:
        try:
            body = strict_json(reply.body)
        except UnusableJson as exc:
            problems = [f"{exc}; the body began: {_excerpt(reply.body)}"]
        else:
            problems = definition.schema_errors(operation.response_schema, body)
        if not problems:
            return Advance(step.next, "next", body, True)
        return _uncertain(
            operation,
            retry_at,
            HoldCode.RESPONSE_INVALID,
            f"answered {status} with a response that cannot be used: {'; '.join(problems)}",
        )
    if status in (429, 503):
        wait = max(reply.retry_after, BACKOFF_BASE) if reply.retry_after else None
        return Retry(
            now + wait if wait else retry_at, f"{status}: the product asked to retry later"
        )
    if status in (401, 403):
        return Held(HoldCode.PRODUCT_FORBIDDEN, _status_detail(status, reply.body))
    if status in REFUSALS:
        return Failed(FailureCode.PRODUCT_REFUSED, _status_detail(status, reply.body))
    # Any other answer (408, 423, 425, another 4xx, a 5xx) does not say the product
    # refused the command: it may have acted, or may yet.
    return _uncertain(
        operation, retry_at, HoldCode.OUTCOME_UNKNOWN, _status_detail(status, reply.body)
    )


def _uncertain(operation: Operation, retry_at: datetime, code: HoldCode, why: str) -> Transition:
    """A read may simply be repeated; a mutation's effect is unknown, so an operator decides."""
    if operation.effect is Effect.READ:
        return Retry(retry_at, detail(why))
    return Held(code, detail(why))


def _status_detail(status: int, body: bytes) -> str:
    text = body.decode("utf-8", errors="replace").strip()
    return detail(f"{status}: {text}" if text else str(status))


def _excerpt(body: bytes, size: int = 120) -> str:
    """The start of a product's body, as evidence in a detail (escaped by :func:`detail`)."""
    text = body[:size].decode("utf-8", errors="replace")
    return text + ("…" if len(body) > size else "") if text else "(empty)"


#: C0 control characters (and DEL) shown escaped in details, but for tab and newline.
_CONTROLS = {c: f"\\u{c:04x}" for c in (*range(0x20), 0x7F) if chr(c) not in "\t\n"}


def detail(text: str) -> str:
    """Text fit for a failure's or hold's detail: control characters escaped (a NUL cannot
    be stored), unpaired surrogates shown as escapes, at most :data:`MAX_DETAIL` long."""
    text = text.translate(_CONTROLS).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


# --- waits ----------------------------------------------------------------------------


def interrupted(definition: Definition, step_id: str, now: datetime) -> Transition:
    """A call was dispatched but its holder stopped before recording what came back."""
    operation = definition.operations[step_id]
    if operation.effect is Effect.READ:
        return Retry(now, "the service stopped while this read was in flight; reading again")
    return Held(
        HoldCode.DISPATCH_INTERRUPTED,
        f"the service stopped after dispatching {operation.product}/{operation.name} and "
        "before recording its answer; whether the product acted is unknown",
    )


def result_arrived(definition: Definition, step_id: str, body: JSON) -> Advance | None:
    """An authoritative result for a wait-for: go on if it is final, else keep waiting.

    ``None`` also when the body breaks the fetch operation's schema: an unusable
    read is never taken as a decision.
    """
    step = definition.step(step_id)
    assert isinstance(step, WaitFor)
    result = definition.results[step_id]
    if definition.schema_errors(result.fetch.response_schema, body) or not result.is_final(body):
        return None
    return Advance(step.next, "next", body, True)


def fetched(definition: Definition, step_id: str, reply: Reply) -> Advance | None:
    """The product's answer to a result fetch: go on if it is a valid, final result."""
    if reply.kind is not ReplyKind.RESPONSE or reply.status is None or reply.status // 100 != 2:
        return None
    try:
        body = strict_json(reply.body)
    except UnusableJson:
        return None
    return result_arrived(definition, step_id, body)


def timed_out(definition: Definition, step_id: str) -> Advance:
    step = definition.step(step_id)
    assert isinstance(step, WaitFor) and step.on_timeout is not None
    return Advance(step.on_timeout, "on-timeout")


def woke(definition: Definition, step_id: str) -> Advance:
    """A wait-until's instant has come."""
    step = definition.step(step_id)
    assert isinstance(step, WaitUntil)
    return Advance(step.next, "next")
