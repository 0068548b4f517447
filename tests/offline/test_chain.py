"""semantics/chain without the database: the canonical form every side writes, and a chain
checked from events alone (tests/engine/test_chain.py holds PostgreSQL to the same bytes)."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.semantics.chain import (
    ENDS,
    Break,
    Event,
    canonical,
    event_hash,
    first_break,
    parse,
)

VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)


@given(VALUES)
def test_canonical_text_reads_back_as_the_same_value_and_is_written_the_same_again(
    value: object,
) -> None:
    text = canonical(value)
    assert canonical(parse(text)) == text
    if isinstance(value, dict):  # the order keys were written in does not matter
        assert canonical(dict(reversed(list(value.items())))) == text


def test_numbers_are_one_number_however_written() -> None:
    assert canonical(parse("[1.50, 1.5, 1e2, 100, -0, 0.0, 2.0]")) == "[1.5,1.5,100,100,0,0,2]"
    many = "-999999999999999999999999999999.000000000000000000001"
    assert canonical(parse(many)) == many  # every digit, whatever Decimal's precision
    with pytest.raises(TypeError):
        canonical({"x": 1.5})  # a float would lose digits: parse() gives Decimals
    assert (
        canonical(parse('{"b": 1, "a": [true, null, "é\\n"]}')) == '{"a":[true,null,"é\\n"],"b":1}'
    )
    assert isinstance(parse("3"), Decimal)


def test_a_chain_verifies_without_the_database() -> None:
    run = str(uuid.uuid4())
    events: list[Event] = []
    previous = None
    for seq in (1, 2):
        draft = Event(run, seq, "2026-12-01T00:00:00Z", "k", "s", "a", parse("{}"), b"")
        hashed = event_hash(previous, draft)
        events.append(Event(run, seq, draft.at, "k", "s", "a", draft.detail, hashed))
        previous = hashed
    assert first_break(run, events, 2) is None
    assert first_break(run, events[::-1], 2) is not None
    assert first_break(run, events, 3) is not None


def _chain(run: str, kinds: list[str]) -> list[Event]:
    events: list[Event] = []
    previous = None
    for seq, kind in enumerate(kinds, 1):
        draft = Event(run, seq, "2026-12-01T00:00:00Z", kind, "s", "a", parse("{}"), b"")
        previous = event_hash(previous, draft)
        events.append(Event(run, seq, draft.at, kind, "s", "a", draft.detail, previous))
    return events


@given(
    st.lists(st.sampled_from(["admitted", "step-completed", "held", "retry-same"]), max_size=4),
    st.sampled_from(sorted(ENDS)),
    st.lists(st.sampled_from(sorted(ENDS | {"step-completed", "reconciled"})), max_size=3),
)
def test_a_run_ends_once_and_nothing_follows_its_end(
    before: list[str], end: str, after: list[str]
) -> None:
    """However well chained, an event after a run's end is a break at that event."""
    run = str(uuid.uuid4())
    events = _chain(run, [*before, end, *after])
    at = len(before) + 1
    expected = None
    if after:
        why = f"it follows the run's end, event {at} ({end}): nothing is written after a run ends"
        expected = Break(run, at + 1, why)
    assert first_break(run, events, len(events)) == expected


@pytest.mark.parametrize(
    "text",
    ["1e99999999999999999999", "1e999999999999999999", "1e100000000", "-1E1001", "1e-1001"],
)
def test_numbers_too_large_to_write_out_are_refused_as_json(text: str) -> None:
    """A hostile bundle's number would make canonical JSON write out millions of digits (or
    Decimal refuse it): parse refuses it first, as it refuses NaN, with a ValueError."""
    with pytest.raises(ValueError, match=r"cannot be read|too large to write out"):
        parse(f'{{"n": {text}}}')
    assert canonical(parse('{"n": 1e1000}')) == '{"n":1' + "0" * 1000 + "}"
