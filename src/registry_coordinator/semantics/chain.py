"""A run's history as a hash chain, computed without the database.

Each event's hash is SHA-256 over the canonical JSON of the event and the hash of the one
before it (schema 9, ``sql/migrations/0009_chain.sql``, writes the same bytes in
PostgreSQL as each event is inserted). So whoever holds a history — the database, or an
export of it — can check that no event was changed, removed, added or moved since it was
written: :func:`first_break` names the first event where the chain does not hold. A run
ends once: an event after its end (``finished``, ``failed``, ``expired``, ``cancelled``)
is a break too, however well it is chained, for the chain alone would take an event
appended by whoever can write the table and recompute one hash.

The canonical form is fixed by what both sides can write exactly: keys sorted by code
point, no whitespace, strings escaped only where JSON requires (UTF-8 otherwise), and
numbers as plain decimals without trailing zeros (``1.50`` and ``1.5`` are one number, as
in jsonb). Numbers are read as :class:`~decimal.Decimal`, never as floats, so no digit
is lost on the way: use :func:`parse` for JSON text that holds an event's detail.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import NoReturn

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.semantics.codes import TERMINAL

#: The largest power of ten a number may carry in JSON the chain reads: far beyond any
#: event's, small enough that writing it out in plain decimal stays small. (PostgreSQL
#: writes numbers out in full, so what it stores never comes with an exponent at all.)
MAX_EXPONENT = 1000

#: The kinds of the event a run ends with: the names of the states it ends in.
ENDS = frozenset(state.value for state in TERMINAL)


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _decimal(text: str) -> Decimal:
    try:
        number = Decimal(text)
    except ArithmeticError:
        raise ValueError(f"the number {text[:40]} cannot be read") from None
    if abs(number.adjusted()) > MAX_EXPONENT:
        raise ValueError(f"the number {text[:40]} is too large to write out")
    return number


def parse(text: str | bytes) -> JSON:
    """JSON text as the chain reads it: every number a Decimal; NaN and Infinity, which
    Python reads but JSON has not, and numbers too large to write out in plain decimal,
    refused (ValueError)."""
    return json.loads(text, parse_float=_decimal, parse_int=_decimal, parse_constant=_no_constant)


def _number(value: Decimal | int) -> str:
    """A number in plain decimal, every digit kept, no trailing zeros (jsonb's trim_scale):
    ``format`` is exact, where ``Decimal.normalize`` would round to the context's precision."""
    number = Decimal(value)
    if number == 0:
        return "0"
    text = format(number, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def canonical(value: object) -> str:
    """The canonical JSON text of ``value`` (as :func:`parse` gives it)."""
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(f"{canonical(k)}:{canonical(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical(item) for item in value) + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, Decimal | int):
        return _number(value)
    raise TypeError(f"{type(value).__name__} has no place in an event's canonical JSON")


@dataclass(frozen=True)
class Event:
    """One history event as the chain covers it; ``at`` as RFC 3339 text."""

    run: str
    seq: int
    at: str
    kind: str
    step: str
    actor: str
    detail: JSON
    hash: bytes  # as recorded


def event_hash(previous: bytes | None, event: Event) -> bytes:
    """The hash ``event`` must carry after an event whose hash is ``previous``."""
    body = {
        "prev": previous.hex() if previous is not None else None,
        "run": event.run,
        "seq": event.seq,
        "at": event.at,
        "type": event.kind,
        "step": event.step,
        "actor": event.actor,
        "detail": event.detail,
    }
    return hashlib.sha256(canonical(body).encode("utf-8")).digest()


@dataclass(frozen=True)
class Break:
    """Where a run's chain does not hold, and how."""

    run: str
    seq: int  # the first event that is not what the chain says (or where one is missing)
    why: str


def first_break(run: str, events: Iterable[Event], last: int) -> Break | None:
    """The first place where run ``run``'s events, in the order given, are not the chain
    they were written as — an event changed, missing, added or out of order, or one after
    the run's end — given that its latest event is number ``last``; None when it holds."""
    previous: bytes | None = None
    expected = 1
    end: Event | None = None
    for event in events:
        if event.run != run or event.seq != expected:
            why = "missing" if event.seq > expected else "out of order, repeated or another's"
            return Break(run, expected, f"event {expected} is {why}")
        if event_hash(previous, event) != event.hash:
            return Break(run, event.seq, "its hash does not match what it holds")
        if end is not None:
            why = f"it follows the run's end, event {end.seq} ({end.kind})"
            return Break(run, event.seq, f"{why}: nothing is written after a run ends")
        if event.kind in ENDS:
            end = event
        previous, expected = event.hash, expected + 1
    if expected != last + 1:
        seq = min(expected, last + 1)
        return Break(run, seq, f"the history ends at event {expected - 1}, not {last}")
    return None
