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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import assert_never
from urllib.parse import quote, urlencode

from registry_coordinator.authoring.canonical import (
    JSON,
    UnusableJson,
    canonical_bytes,
    strict_json,
)
from registry_coordinator.authoring.catalog import (
    Effect,
    Gone,
    Operation,
    Recovery,
    Result,
    Where,
)
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.expressions import (
    Activation,
    EvaluationError,
    parse_instant,
    to_json,
    variables,
)
from registry_coordinator.authoring.workflow import Call, Choose, Finish, WaitFor, WaitUntil
from registry_coordinator.errors import CoordinatorError
from registry_coordinator.semantics import external
from registry_coordinator.semantics.codes import FailureCode, HoldCode

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

    def variables(self) -> dict[str, object]:
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
    #: Its connection-bound headers (an Authorization is had for each sending, not sealed).
    headers: tuple[tuple[str, str], ...] = ()
    #: The task grant it runs under, if it does: proved to the product, never sent.
    grant: JSON = None


@dataclass(frozen=True)
class Send:
    request: Request


@dataclass(frozen=True)
class Retry:
    """The product did not act (or a read may be repeated): try again at ``at``."""

    at: datetime
    detail: str


@dataclass(frozen=True)
class Verify:
    """A mutation's outcome is unknown, and its product can say what became of it: ask it
    again at ``at`` — its receipt of the original key, or, where the product answers the
    identical request under the same key with the original answer, that request."""

    at: datetime
    detail: str


@dataclass(frozen=True)
class Check:
    """Ask the product now for its receipt of the call's original key (a read that never
    causes an effect); the step completes only on the receipt it confirms."""

    operation: Operation


@dataclass(frozen=True)
class Expire:
    """The run's deadline has passed: it ends ``expired`` wherever it was."""


@dataclass(frozen=True)
class Fetch:
    """A wait-for woken before its timeout (a delivery, or the poll): read the product's
    authoritative result for ``key``, and go on only if it is final."""

    result: Result
    key: str


Transition = (
    Advance
    | Finished
    | Failed
    | Held
    | Sleep
    | Await
    | Send
    | Retry
    | Verify
    | Check
    | Expire
    | Fetch
)


@dataclass(frozen=True)
class Verification:
    """How often Coordinator asks a product about a mutation whose outcome is unknown
    before it holds the run: ``attempts`` times, ``spacing`` apart (each spread by
    jitter). Zero attempts: held at once, as for a product that can say nothing."""

    attempts: int = 3
    spacing: timedelta = timedelta(seconds=20)

    def next(self, checks: int, now: datetime, jitter: Callable[[], float]) -> datetime | None:
        """When to ask again after ``checks`` askings; None when the asking is over."""
        if checks >= self.attempts:
            return None
        return now + self.spacing * (0.5 + 0.5 * jitter())


#: Asking nothing: an unknown outcome holds the run at once.
NO_VERIFICATION = Verification(attempts=0)


def on_due(
    definition: Definition,
    run: RunRecord,
    step_id: str,
    waiting: bool,
    timer_at: datetime | None,
    now: datetime,
    dispatched: bool = False,
    checks: int = 0,
    verification: Verification = NO_VERIFICATION,
    jitter: Callable[[], float] = random.random,
) -> Transition | None:
    """What a run does when it falls due at ``now``; ``None`` when nothing is due yet.

    A run falls due when its deadline passes, when its step's own instant comes
    (a wait-until, a wait-for's timeout, a call's retry), when it is runnable, or
    when the process that held it stopped — possibly in the middle of a call
    (``dispatched``), whose outcome is then unknown and decided first. ``checks`` is how
    often the product was asked about the call's unknown outcome so far, and
    ``verification`` how often it may be.
    """
    if dispatched:
        return interrupted(definition, step_id, now, checks, verification, jitter)
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
    operation = definition.operations.get(step_id)
    if checks and operation is not None and operation.receipt is not None:
        return Check(operation)
    return enter(definition, step_id, run, now)


#: What a run takes in the same commit as the Advance before it: entering these steps needs
#: neither a product nor a wait registered, so nothing lies between them.
TAKEN_AT_ONCE = (Advance, Finished, Failed, Expire, Sleep)


@dataclass(frozen=True)
class Chain:
    """What a commit takes after a step's transition, and what comes after it."""

    taken: tuple[tuple[str, Transition], ...]  # (step, transition) after the first, in order
    step: str  # the step the run is at once they are taken
    run: RunRecord  # the run's record as they leave it
    ahead: Transition | None  # the next step's transition, decided, when it is not taken


def advanced(run: RunRecord, step_id: str, advance: Advance, now: datetime) -> RunRecord:
    """The record as ``advance`` leaves it: the step completed at ``now``, with its output."""
    outputs = {**run.outputs, step_id: advance.output} if advance.has_output else run.outputs
    return replace(run, outputs=outputs, completed={**run.completed, step_id: now})


def chain(
    definition: Definition, run: RunRecord, step_id: str, transition: Transition, now: datetime
) -> Chain:
    """The steps taken after ``transition`` at ``step_id``, in the same commit: while a step
    advances, the next one is entered at ``now`` — decided as any due step is
    (:func:`on_due`), so a deadline that has passed expires the run there — and taken with it
    while it is :data:`TAKEN_AT_ONCE`. The first that is not is :attr:`Chain.ahead`: decided
    once, here, and handed to whoever holds the run, never decided twice. The engine commits
    a chain as one statement; the offline test runner takes it exactly so."""
    taken: list[tuple[str, Transition]] = []
    while isinstance(transition, Advance):
        run = advanced(run, step_id, transition, now)
        step_id = transition.next
        following = on_due(definition, run, step_id, False, None, now)
        assert following is not None  # a step just entered is due at once
        if not isinstance(following, TAKEN_AT_ONCE):
            return Chain(tuple(taken), step_id, run, following)
        taken.append((step_id, following))
        transition = following
    return Chain(tuple(taken), step_id, run, None)


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


def _choose(definition: Definition, step: Choose, scope: Activation) -> Advance:
    """The first case whose condition holds, else ``otherwise``."""
    for index, case in enumerate(step.cases):
        value = definition.expression(step.id, case.when).evaluate(scope)
        if not isinstance(value, bool):
            raise EvaluationError(f"{case.when}: gave {to_json(value)!r}, not a boolean")
        if value:
            return Advance(case.next, f"case {index + 1}")
    return Advance(step.otherwise, "otherwise")


def _await(definition: Definition, step: WaitFor, scope: Activation, now: datetime) -> Transition:
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


def _finish(definition: Definition, step: Finish, scope: Activation) -> Transition:
    """End with the step's outcome and its rendered output, if that fits the schema."""
    output = definition.render(step.id, scope) if step.id in definition.templates else None
    problems = definition.schema_errors(definition.workflow.outcomes[step.outcome], output)
    if problems:
        return Failed(
            FailureCode.OUTPUT_INVALID,
            f"output for outcome {step.outcome} does not fit its schema: " + "; ".join(problems),
        )
    return Finished(step.outcome, output)


def _instant(value: object, source: str) -> datetime:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return parse_instant(value)
        except ValueError as exc:
            raise EvaluationError(f"{source}: {exc}") from None
    raise EvaluationError(f"{source}: gave {to_json(value)!r}, not a timestamp")


def _send(definition: Definition, step: Call, run: RunRecord, scope: Activation) -> Transition:
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
    Raises :class:`UnsafePath` for a path parameter that is not a safe segment. The
    connection-bound parameters are placed by :func:`bind`. An external read's path is
    placed as it is, under the connection's base URL (:func:`external.target`)."""
    if operation.external:
        path, query = payload["path"], payload.get("query") or {}
        if not isinstance(path, str) or not external.PATH.match(path):
            raise UnsafePath(f"path is {path!r}, which is not a relative path to read")
        assert isinstance(query, dict)
        return Request("GET", external.target(path, query), None, None)
    target = operation.path
    rest = dict(payload)
    grant = rest.pop("grant", None) if operation.grant else None
    for name in operation.path_params:
        target = target.replace("{" + name + "}", path_segment(name, rest.pop(name)))
    body = None
    if operation.method == "GET":
        if rest:
            target += "?" + urlencode(sorted((k, _query_value(v)) for k, v in rest.items()))
    else:
        body = canonical_bytes(rest)
    key = key if operation.idempotency_key else None
    return Request(operation.method, target, body, key, grant=grant)


class Unbound(CoordinatorError, ValueError):
    """A connection-bound parameter the connection does not set (startup refuses such a
    configuration, so a run meets this only if the configuration moved under it)."""


def bind(operation: Operation, request: Request, values: Mapping[str, JSON]) -> Request:
    """``request`` with the operation's connection-bound parameters in place: the values
    the operator set on the connection (``values``), as headers, query parameters or body
    members. Sealed with the request, so a resend carries the values it was first sent with."""
    if not operation.bound:
        return request
    headers = list(request.headers)
    query: list[tuple[str, str]] = []
    members: dict[str, JSON] = {}
    for parameter in operation.bound:
        if parameter.name not in values:
            raise Unbound(
                f"{operation.product}/{operation.name} sends {parameter.name}, which the "
                "connection does not set"
            )
        value = values[parameter.name]
        match parameter.where:
            case Where.HEADER:
                headers.append((parameter.wire, _query_value(value)))
            case Where.QUERY:
                query.append((parameter.wire, _query_value(value)))
            case Where.BODY:
                members[parameter.wire] = value
            case _:
                assert_never(parameter.where)
    target = request.target
    if query:
        target += ("&" if "?" in target else "?") + urlencode(sorted(query))
    body = request.body
    if members:
        sent = strict_json(body) if body else {}
        assert isinstance(sent, dict)
        body = canonical_bytes({**sent, **members})
    return replace(request, target=target, body=body, headers=tuple(headers))


def build_receipt_request(operation: Operation, sealed: Request) -> Request:
    """The read-only lookup of the product's record of a sealed request's original key:
    a GET of the receipt path naming the key, or a POST resending the original key, body
    and connection-bound headers and query to the receipt route."""
    receipt = operation.receipt
    assert receipt is not None and sealed.idempotency_key is not None
    key = sealed.idempotency_key
    if receipt.method == "GET":
        return Request("GET", receipt.path.replace("{key}", path_segment("key", key)), None, None)
    _, mark, query = sealed.target.partition("?")
    return Request("POST", receipt.path + mark + query, sealed.body, key, sealed.headers)


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
    #: The answer's body was longer than the connection takes: refused, not cut short
    #: (``body`` is then empty).
    exceeded: bool = False


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
    checks: int = 0,
    verification: Verification = NO_VERIFICATION,
    reviewed: external.Reviewed | None = None,
    uncertain: bool = False,
) -> Transition:
    """Classify the reply to a call's ``attempt``-th sending (SPEC section 5, call outcomes),
    as the operation's descriptor reads its product's answers: which statuses are its
    success, its refusals, and which problem codes say a key was spent on an original
    whose answer is gone. ``checks`` and ``verification`` say whether the product may
    still be asked about an unknown outcome (:class:`Verify`) before the run is held;
    ``reviewed`` is an external connection's review, which its answers must fit (None
    offline, where only the catalog's ``{status, body}`` is known). ``uncertain``: an
    earlier sending of this same request may have taken effect, so a refusal of this one
    holds the run rather than failing it — a product may refuse a resend for what has
    changed since (Messaging authorizes and renders a retry again before it looks up its
    key; BReg answers a resend under other claims ``idempotency.conflict``) while the
    first sending stands."""
    operation = definition.operations[step_id]
    step = definition.step(step_id)
    assert isinstance(step, Call)
    retry_at = now + backoff(attempt, jitter)
    if reply.kind is ReplyKind.NOT_SENT:
        return Retry(retry_at, detail(f"not sent: {reply.detail}"))
    if operation.external:
        return _read_externally(definition, step, reply, reviewed, retry_at)
    unknown = _Unknown(operation, retry_at, now, checks, verification, jitter)
    if reply.kind is ReplyKind.LOST or reply.status is None:
        return unknown(HoldCode.OUTCOME_UNKNOWN, f"no answer: {reply.detail}")
    status = reply.status
    if operation.succeeded(status):
        return _succeeded(definition, step, reply, unknown)
    refusal = _refusal(operation, status, reply.body, uncertain)
    if refusal is not None:
        return refusal
    if status in (429, 503):
        wait = max(reply.retry_after, BACKOFF_BASE) if reply.retry_after else None
        return Retry(
            now + wait if wait else retry_at, f"{status}: the product asked to retry later"
        )
    if status in (401, 403):  # Coordinator's own words, when its identity was refused
        said = detail(f"{status}: {reply.detail}") if reply.detail else None
        return Held(HoldCode.PRODUCT_FORBIDDEN, said or _status_detail(status, reply.body))
    if status in operation.refusals:
        return Failed(FailureCode.PRODUCT_REFUSED, _status_detail(status, reply.body))
    # Any other answer (408, 423, 425, another 4xx, a 5xx) does not say the product
    # refused the command: it may have acted, or may yet.
    return unknown(HoldCode.OUTCOME_UNKNOWN, _status_detail(status, reply.body))


def _succeeded(definition: Definition, step: Call, reply: Reply, unknown: _Unknown) -> Transition:
    """A success status: the step advances with the body, if the body is one the operation
    answers; any other body leaves the outcome unknown (the product may have acted)."""
    operation = definition.operations[step.id]
    try:
        body = strict_json(reply.body)
    except UnusableJson as exc:
        problems = [f"{exc} (the body is {len(reply.body)} bytes)"]
    else:
        problems = definition.schema_errors(operation.response_schema, body)
    if not problems:
        return Advance(step.next, "next", body, True)
    return unknown(
        HoldCode.RESPONSE_INVALID,
        f"answered {reply.status} with a response that cannot be used: {'; '.join(problems)}",
    )


def _refusal(operation: Operation, status: int, body: bytes, uncertain: bool) -> Transition | None:
    """What a problem code the operation names says: a key spent on an original whose
    answer expired holds the run; a refusal fails it, unless an earlier sending's outcome
    is unknown and may stand. None: the code (or its absence) says neither."""
    code = problem_code(body)
    if code is not None and code in operation.spent_codes:
        return Held(
            HoldCode.RECEIPT_EXPIRED,
            _status_detail(
                status,
                body,
                "the product spent this key on an original "
                "that took effect, and its record of the answer has expired",
            ),
        )
    refused = (code is not None and code in operation.refused_codes) or (
        status in operation.refusals
    )
    if refused and uncertain:
        return Held(
            HoldCode.OUTCOME_UNKNOWN,
            _status_detail(
                status,
                body,
                "the product refused this resend, but an earlier sending's outcome is "
                "unknown and may stand (a refusal of a resend does not say it failed)",
            ),
        )
    if code is not None and code in operation.refused_codes:
        return Failed(FailureCode.PRODUCT_REFUSED, _status_detail(status, body))
    return None


def _read_externally(
    definition: Definition,
    step: Call,
    reply: Reply,
    reviewed: external.Reviewed | None,
    retry_at: datetime,
) -> Transition:
    """An external read's answer: none is read again later; a redirect is refused; any
    other is the step's result, ``{status, body}``, once it fits the review."""
    if reply.kind is not ReplyKind.RESPONSE or reply.status is None:
        return Retry(retry_at, detail(f"no answer: {reply.detail}"))
    if reply.status in external.REDIRECTS:
        return Failed(
            FailureCode.EXTERNAL_REDIRECT,
            f"answered {reply.status}, a redirect, which an external read never follows",
        )
    answer = (reviewed or external.UNREVIEWED).answer(reply.status, reply.body, reply.exceeded)
    if not isinstance(answer, str):
        schema = definition.operations[step.id].response_schema
        problems = definition.schema_errors(schema, answer)
        answer = f"the answer is not {{status, body}}: {problems[0]}" if problems else answer
    if isinstance(answer, str):
        return Failed(FailureCode.EXTERNAL_INVALID_RESPONSE, f"answered {reply.status}: {answer}")
    return Advance(step.next, "next", answer, True)


@dataclass(frozen=True)
class _Unknown:
    """What becomes of a call whose effect is unknown: a read is simply sent again; a
    mutation whose product can say what became of it is asked (:class:`Verify`) while
    its verification allows; otherwise an operator decides."""

    operation: Operation
    retry_at: datetime
    now: datetime
    checks: int
    verification: Verification
    jitter: Callable[[], float]

    def __call__(self, code: HoldCode, why: str) -> Transition:
        if self.operation.effect is Effect.READ:
            return Retry(self.retry_at, detail(why))
        if code is not HoldCode.RESPONSE_INVALID and verifiable(self.operation):
            at = self.verification.next(self.checks, self.now, self.jitter)
            if at is not None:
                return Verify(at, detail(why))
        return Held(code, detail(why + _asked(self.operation, self.checks)))


def verifiable(operation: Operation) -> bool:
    """Whether a product can say what became of a call of ``operation`` without a second
    effect: by its receipt of the original key, or by answering the identical request."""
    return operation.recovery in (Recovery.SAME_COMMAND_AND_RECEIPT, Recovery.IDENTICAL_REQUEST)


def _asked(operation: Operation, checks: int) -> str:
    if not checks:
        return ""
    how = "for its receipt" if operation.receipt is not None else "with the identical request"
    return f" (asked the product {how} {checks} time{'s' if checks > 1 else ''}; not confirmed)"


def checked(
    definition: Definition,
    step_id: str,
    reply: Reply,
    checks: int,
    now: datetime,
    verification: Verification,
    jitter: Callable[[], float] = random.random,
) -> Transition:
    """The product's answer to the ``checks``-th lookup of a call's receipt: the step
    completes with a receipt that confirms the call; anything else is asked again while
    the verification allows, and then holds the run with what the product said."""
    operation = definition.operations[step_id]
    step = definition.step(step_id)
    assert isinstance(step, Call) and operation.receipt is not None
    if reply.kind is not ReplyKind.RESPONSE or reply.status is None:
        why = f"the receipt lookup got no answer: {reply.detail}"
    elif reply.status in operation.receipt.unresolved:
        why = (
            f"{reply.status}: no retained receipt matches the original key and request "
            "(not evidence that it had no effect)"
        )
    elif not 200 <= reply.status < 300:
        why = f"the receipt lookup was answered {_status_detail(reply.status, reply.body)}"
    else:
        try:
            body = strict_json(reply.body)
        except UnusableJson as exc:
            problems = [str(exc)]
        else:
            problems = definition.schema_errors(operation.response_schema, body)
        if not problems:
            return Advance(step.next, "next", body, True)
        why = f"the receipt cannot be used: {'; '.join(problems)}"
    at = verification.next(checks, now, jitter)
    if at is not None:
        return Verify(at, detail(why))
    return Held(HoldCode.OUTCOME_UNKNOWN, detail(why + _asked(operation, checks)))


def problem_code(body: bytes) -> str | None:
    """The ``code`` of a product's problem document (RFC 9457, as every Registry Stack
    product answers a refusal), if the body is one."""
    try:
        document = strict_json(body)
    except UnusableJson:
        return None
    code = document.get("code") if isinstance(document, dict) else None
    return code if isinstance(code, str) else None


def _status_detail(status: int, body: bytes, meaning: str = "") -> str:
    said = said_of(status, body)
    return detail(f"{meaning}: {said}" if meaning else said)


#: The longest problem title a detail repeats; a longer one is a product's own words.
MAX_TITLE = 80


def said_of(status: int, body: bytes) -> str:
    """What a detail says of a product's answer: its status and, for a problem document,
    its ``code`` and ``title`` (a problem type's fixed words) — never the instance's words
    (``detail``, its fields) nor a body's text, which may name the person the request was
    about: a detail is kept in clear. The whole answer is in the run's sealed sending."""
    try:
        document = strict_json(body)
    except UnusableJson:
        document = None
    if isinstance(document, dict) and isinstance(document.get("code"), str):
        title = document.get("title")
        named = f" ({title})" if isinstance(title, str) and len(title) <= MAX_TITLE else ""
        return f"{status} {document['code']}{named}"
    return f"{status}, {len(body)} bytes" if body else f"{status}, no body"


#: C0 control characters (and DEL) shown escaped in details, but for tab and newline.
_CONTROLS = {c: f"\\u{c:04x}" for c in (*range(0x20), 0x7F) if chr(c) not in "\t\n"}


def detail(text: str) -> str:
    """Text fit for a failure's or hold's detail: control characters escaped (a NUL cannot
    be stored), unpaired surrogates shown as escapes, at most :data:`MAX_DETAIL` long."""
    text = text.translate(_CONTROLS).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


# --- waits ----------------------------------------------------------------------------


def interrupted(
    definition: Definition,
    step_id: str,
    now: datetime,
    checks: int = 0,
    verification: Verification = NO_VERIFICATION,
    jitter: Callable[[], float] = random.random,
) -> Transition:
    """A call was dispatched but its holder stopped before recording what came back: a
    read is sent again; a mutation's product is asked what became of it where it can
    say, while ``verification`` allows; else the run is held."""
    operation = definition.operations[step_id]
    if operation.effect is Effect.READ:
        return Retry(now, "the service stopped while this read was in flight; reading again")
    why = (
        f"the service stopped after dispatching {operation.product}/{operation.name} and "
        "before recording its answer; whether the product acted is unknown"
    )
    if verifiable(operation):
        at = verification.next(checks, now, jitter)
        if at is not None:
            return Verify(at, why)
    return Held(HoldCode.DISPATCH_INTERRUPTED, why + _asked(operation, checks))


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


def fetched(definition: Definition, step_id: str, reply: Reply) -> Transition | None:
    """The product's answer to a result fetch: go on if it is a valid, final result; end
    the wait as the result's descriptor says when the product says the result will never
    be readable (concealed: held; expired: failed); otherwise (pending, not final, not
    usable, no answer) None: keep waiting."""
    if reply.kind is not ReplyKind.RESPONSE or reply.status is None:
        return None
    result = definition.results[step_id]
    if reply.status in result.pending:
        return None
    gone = result.vanished(reply.status)
    if gone is Gone.CONCEALED:
        return Held(
            HoldCode.RESULT_CONCEALED,
            f"{result.product} answered {reply.status} for {result.name}: it has no result "
            "for this key that Coordinator's identity may see",
        )
    if gone is Gone.EXPIRED:
        return Failed(
            FailureCode.RESULT_EXPIRED,
            f"{result.product} answered {reply.status} for {result.name}: the result is no "
            "longer retained",
        )
    if not result.fetch.succeeded(reply.status):
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
