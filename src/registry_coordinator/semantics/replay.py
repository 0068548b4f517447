"""An auditor's replay: a run's decisions taken again from its recorded data, offline.

A history records what happened; the run's record (its input, each step's output, its
output and its deadline) records what the decisions were made on. :func:`replay` walks
the history with the workflow the run ran under and asks :mod:`steps` — the semantics
the engine and the test runner use — what each step decides on that record: the case a
choose takes, the instant a wait-until waits for, the key and timeout of a wait-for, the
outcome and output a finish ends with, and the failures an expression, a request or an
output brings. Every event must fit: at the step the run is at, and, where it is a
decision, the one the semantics give. The first that does not is :class:`Diverged`,
naming its seq.

What the products and operators did is not a decision the record can make again (the
status a product answered, a hold, a retry, a cancel): those events are taken as they
are, checked only to be at the run's step and, where they complete a step, that the
output the record holds is one the step could complete with. Nothing here reads a
clock: instants are the events' own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal  # a bundle's numbers, as the chain's canonical form parses them

from registry_coordinator.authoring.canonical import JSON, canonical_bytes
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.expressions import (
    EvaluationError,
    format_instant,
    parse_instant,
)
from registry_coordinator.authoring.workflow import Call, Choose, WaitFor, WaitUntil
from registry_coordinator.semantics.chain import ENDS, Event
from registry_coordinator.semantics.codes import FailureCode
from registry_coordinator.semantics.steps import (
    Advance,
    Await,
    Failed,
    Finished,
    RunRecord,
    Send,
    Sleep,
    Transition,
    advanced,
    enter,
    result_arrived,
)

#: The failures a step's semantics decide from the record alone; any other failure is
#: a product's (a refusal, an expired result) and is taken as the history says it.
DECIDED = frozenset(
    {FailureCode.EXPRESSION_ERROR, FailureCode.REQUEST_INVALID, FailureCode.OUTPUT_INVALID}
)
#: The events that say a step went on, which one the record makes fail cannot have.
_GOING_ON = frozenset({"step-completed", "reconciled", "waiting", "finished", "call-dispatched"})
#: Before any instant: entering a wait-until then always gives its instant (a Sleep).
_BEFORE = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Record:
    """What a run's decisions were made on, as an auditor's bundle holds it (in clear)."""

    input: JSON
    outputs: dict[str, JSON]
    output: JSON
    deadline: str  # RFC 3339


class Diverged(ValueError):
    """The history does not follow from the record at event ``seq`` (0: the record)."""

    def __init__(self, seq: int, why: str) -> None:
        super().__init__(f"event {seq}: {why}" if seq else why)
        self.seq = seq
        self.why = why


@dataclass(frozen=True)
class Decision:
    """One event the replay decided again and found as the history has it."""

    seq: int
    step: str
    said: str


@dataclass(frozen=True)
class Replayed:
    """A history that follows from its record: each decision, and where the run is."""

    decisions: tuple[Decision, ...]
    step: str
    ended: str | None  # the kind of the event that ended it; None: it is live


@dataclass
class _Walk:
    definition: Definition
    run: RunRecord
    record: Record
    step: str
    since: datetime  # when the run arrived at ``step``
    decisions: list[Decision] = field(default_factory=list)
    entered: Transition | None = None  # what ``step`` decides on the record
    timeout_at: datetime | None = None  # a wait-for's, as its waiting event gave it
    status: int | None = None  # the last answer to the step's call

    def decided(self, event: Event, said: str) -> None:
        self.decisions.append(Decision(event.seq, event.step, said))

    def arrive(self, step: str, at: datetime) -> None:
        self.step, self.since = step, at
        self.entered, self.timeout_at, self.status = None, None, None


def replay(
    definition: Definition, run_id: str, events: Sequence[Event], record: Record
) -> Replayed:
    """The decisions of the run ``run_id`` whose history is ``events`` (a bundle's, its
    chain already checked), taken again on ``record``; :class:`Diverged` at the first
    event that does not follow."""
    admitted = events[0]
    start = definition.workflow.start
    if admitted.step != start:
        raise Diverged(1, f"the run was admitted at step {admitted.step}, not {start}")
    at = _instant(admitted)
    walk = _Walk(
        definition,
        RunRecord(run_id, record.input, at, _deadline(record)),
        record,
        start,
        at,
    )
    ended: Event | None = None
    for event in events[1:]:
        if event.step != walk.step:
            raise Diverged(event.seq, f"it is at step {event.step}; the run was at {walk.step}")
        _follow(walk, event)
        if event.kind in ENDS:
            ended = event
    _matches_record(walk, ended)
    return Replayed(tuple(walk.decisions), walk.step, ended.kind if ended else None)


def _follow(walk: _Walk, event: Event) -> None:
    """Check ``event`` at the run's step against what the step decides on the record."""
    step = walk.definition.step(walk.step)
    if walk.entered is None:
        try:
            walk.entered = enter(walk.definition, walk.step, walk.run, _BEFORE)
        except EvaluationError as exc:  # data no admitted run holds (a NUL, say)
            raise Diverged(event.seq, f"the record cannot be read at {walk.step}: {exc}") from None
    decided = walk.entered
    if isinstance(decided, Failed) and event.kind in _GOING_ON:
        raise Diverged(event.seq, f"the history says {event.kind}; {_says(decided)}")
    detail = event.detail if isinstance(event.detail, dict) else {}
    match event.kind:
        case "failed":
            _failed(walk, event, detail.get("code"))
        case "step-completed":
            _completed(walk, event, step, detail)
        case "reconciled":
            if not isinstance(step, Call) or walk.step not in walk.record.outputs:
                raise Diverged(event.seq, f"reconciled step {walk.step}, with no output recorded")
            walk.decided(event, f"reconciled on the product's evidence, on to {step.next}")
            _advance(walk, event, Advance(step.next, "next", walk.record.outputs[walk.step], True))
        case "waiting":
            _waiting(walk, event, step, detail)
        case "finished":
            if not isinstance(decided, Finished) or decided.outcome != detail.get("outcome"):
                raise Diverged(event.seq, f"finished {detail.get('outcome')!r}; {_says(decided)}")
            if canonical_bytes(decided.output) != canonical_bytes(walk.record.output):
                raise Diverged(event.seq, "the recorded output is not the one the finish renders")
            walk.decided(event, f"finished {decided.outcome}, with the output it renders")
        case "expired":
            if _instant(event) < walk.run.deadline_at:
                raise Diverged(event.seq, f"expired before the deadline {walk.record.deadline}")
            walk.decided(event, f"expired after the deadline {walk.record.deadline}")
        case "call-dispatched":
            if not isinstance(decided, Send):
                raise Diverged(event.seq, f"a request was sent; {_says(decided)}")
            walk.status = None
        case "receipt-looked-up":  # evidence of its own kind: what it confirms is not judged
            walk.status = None
        case "call-answered":
            status = detail.get("status")
            walk.status = int(status) if isinstance(status, int | Decimal) else None
        case _:  # a product's or an operator's act, at the run's step
            pass


def _failed(walk: _Walk, event: Event, code: object) -> None:
    decided = walk.entered
    if isinstance(decided, Failed):
        if code != decided.code.value:
            raise Diverged(event.seq, f"failed {code}; {_says(decided)}")
        walk.decided(event, f"failed {code}, as the record makes it")
    elif code in DECIDED and not isinstance(decided, Send):  # a request's preparation
        raise Diverged(event.seq, f"failed {code}; {_says(decided)}")


def _completed(walk: _Walk, event: Event, step: object, detail: dict[str, JSON]) -> None:
    """A step completed: along the edge its semantics give, with an output it takes."""
    via, next_ = detail.get("via"), detail.get("next")
    said = f"{via} -> {next_}"
    decided = walk.entered
    output = walk.record.outputs.get(walk.step)
    match step:
        case Choose():
            assert isinstance(decided, Advance)  # a choose advances, or fails first
            if (decided.via, decided.next) != (via, next_):
                raise Diverged(event.seq, f"the history says {said}; {_says(decided)}")
            walk.decided(event, f"took {said}")
            _advance(walk, event, decided)
        case WaitUntil():
            assert isinstance(decided, Sleep)
            if (via, next_) != ("next", step.next) or _instant(event) < decided.until:
                raise Diverged(
                    event.seq,
                    f"the history says {said} at {event.at}; the record makes it wait until "
                    f"{format_instant(decided.until)}, then next -> {step.next}",
                )
            walk.decided(event, f"woke after {format_instant(decided.until)}")
            _advance(walk, event, Advance(step.next, "next"))
        case WaitFor() if via == "on-timeout":
            timeout = walk.timeout_at
            if step.on_timeout is None or next_ != step.on_timeout or timeout is None:
                raise Diverged(event.seq, f"the history says {said}; the step has no timeout")
            if _instant(event) < timeout:
                raise Diverged(event.seq, f"the history says {said} before any timeout")
            walk.decided(event, f"timed out -> {next_}")
            _advance(walk, event, Advance(step.on_timeout, "on-timeout"))
        case WaitFor():
            final = result_arrived(walk.definition, walk.step, output)
            if final is None or (via, next_) != ("next", final.next):
                raise Diverged(
                    event.seq,
                    f"the history says {said}; the recorded output is not a final result of "
                    f"{step.result}",
                )
            walk.decided(event, f"the recorded result is final: {said}")
            _advance(walk, event, final)
        case Call():
            _call_completed(walk, event, step, said, output)
        case _:
            raise Diverged(event.seq, f"a {type(step).__name__.lower()} step does not complete")


def _call_completed(walk: _Walk, event: Event, step: Call, said: str, output: JSON) -> None:
    operation = walk.definition.operations[step.id]
    if said != f"next -> {step.next}":
        raise Diverged(event.seq, f"the history says {said}; a call goes next -> {step.next}")
    if walk.status is not None and not operation.succeeded(walk.status):
        raise Diverged(event.seq, f"it completed on a {walk.status}, not a success")
    if step.id not in walk.record.outputs:
        raise Diverged(event.seq, f"step {step.id} completed, and the record holds no output")
    problems = walk.definition.schema_errors(operation.response_schema, output)
    if problems:
        raise Diverged(event.seq, f"the recorded answer does not fit: {problems[0]}")
    walk.decided(event, f"answered as the record holds: {said}")
    _advance(walk, event, Advance(step.next, "next", output, True))


def _waiting(walk: _Walk, event: Event, step: object, detail: dict[str, JSON]) -> None:
    decided = walk.entered
    if isinstance(decided, Sleep):
        if detail.get("until") != format_instant(decided.until):
            raise Diverged(
                event.seq,
                f"it waits until {detail.get('until')}; the record gives "
                f"{format_instant(decided.until)}",
            )
        walk.decided(event, f"waits until {detail.get('until')}")
        return
    if not isinstance(decided, Await) or not isinstance(step, WaitFor):
        raise Diverged(event.seq, f"the run waits; {_says(decided)}")
    if detail.get("key") != decided.key:
        raise Diverged(event.seq, f"it waits for key {detail.get('key')!r}; {_says(decided)}")
    timeout = detail.get("timeoutAt")
    if (timeout is None) != (step.timeout is None):
        raise Diverged(event.seq, f"its timeout is {timeout}; the step's is {step.timeout}")
    if isinstance(timeout, str) and step.timeout is not None:
        walk.timeout_at = parse_instant(timeout)
        decided_at = walk.timeout_at - step.timeout
        if not walk.since <= decided_at <= _instant(event):
            raise Diverged(event.seq, f"its timeout {timeout} is not the step's from its start")
    walk.decided(event, f"waits for {step.result} {decided.key!r}")


def _advance(walk: _Walk, event: Event, advance: Advance) -> None:
    at = _instant(event)
    walk.run = advanced(walk.run, walk.step, advance, at)
    walk.arrive(advance.next, at)


def _matches_record(walk: _Walk, ended: Event | None) -> None:
    """The record holds what the walk gave it: no output of a step never completed, and
    a run's output only once it finished."""
    extra = sorted(set(walk.record.outputs) - set(walk.run.outputs))
    if extra:
        raise Diverged(0, f"the record holds an output of step {extra[0]}, which never completed")
    if walk.record.output is not None and (ended is None or ended.kind != "finished"):
        raise Diverged(0, "the record holds an output, and the run did not finish")


def _says(decided: Transition | None) -> str:
    """What the record makes the step do, in an auditor's words."""
    match decided:
        case Advance(via=via, next=next_):
            return f"the record makes it take {via} -> {next_}"
        case Finished(outcome=outcome):
            return f"the record makes it finish {outcome}"
        case Failed(code=code, detail=why):
            return f"the record makes it fail {code}: {why}"
        case Sleep(until=until):
            return f"the record makes it wait until {format_instant(until)}"
        case Await(key=key):
            return f"the record makes it wait for key {key!r}"
        case Send(request=request):
            return f"the record makes it send {request.method} {request.target}"
        case _:
            return f"the record makes it {type(decided).__name__.lower()}"


def _instant(event: Event) -> datetime:
    return parse_instant(event.at)


def _deadline(record: Record) -> datetime:
    try:
        return parse_instant(record.deadline)
    except ValueError:
        raise Diverged(0, f"the record's deadline {record.deadline!r} is not an instant") from None
