"""A subject report's extract, checked offline as an auditor or the subject would: what
was signed reads back whole, and any changed byte, another key or another spelling of
the same content is refused, never read as a report."""

from __future__ import annotations

from decimal import Decimal

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.semantics import reports
from registry_coordinator.semantics.bundles import Refused
from registry_coordinator.semantics.chain import Event, parse

KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_a_report_reads_back_as_it_was_signed(report: object) -> None:
    extract = reports.write({"runs": [report]}, KEY)
    assert reports.check(extract, KEY.public_key()) == parse(extract)["report"]


@given(json_values, st.data())
def test_any_changed_byte_is_refused(report: object, data: st.DataObject) -> None:
    extract = bytearray(reports.write({"runs": [report]}, KEY))
    at = data.draw(st.integers(0, len(extract) - 1))
    extract[at] = data.draw(st.integers(0, 255).filter(lambda b: b != extract[at]))
    with pytest.raises(Refused):
        reports.check(bytes(extract), KEY.public_key())


def test_another_key_and_another_spelling_are_refused() -> None:
    extract = reports.write({"subject": "a-1", "runs": []}, KEY)
    with pytest.raises(Refused, match="signed by another key"):
        reports.check(extract, OTHER.public_key())
    head, signature = extract.split(b'"signature":"')
    shouted = head + b'"signature":"' + signature.upper()  # the same bytes, spelt otherwise
    with pytest.raises(Refused, match="lower-case hex"):
        reports.check(shouted, KEY.public_key())
    spaced = extract.replace(b'"runs":[]', b'"runs": []')
    with pytest.raises(Refused, match="canonical form"):
        reports.check(spaced, KEY.public_key())
    forged = reports.write({"subject": "a-2", "runs": []}, OTHER)
    resigned = forged.replace(
        forged[forged.index(b'"key":') : forged.index(b',"report"')],
        extract[extract.index(b'"key":') : extract.index(b',"report"')],
    )
    with pytest.raises(Refused, match="signature does not hold"):
        reports.check(resigned, KEY.public_key())


#: How a request's sending may end, by the event that settles it (None: none did).
SETTLED = {
    "call-answered": "answered",
    "call-not-sent": "not sent",
    "call-lost": "unknown",
    None: "unknown",
}


def _event(seq: int, kind: str, step: str, detail: dict[str, JSON]) -> Event:
    at = f"2026-12-07T10:00:{seq:02d}Z"
    return Event("r", seq, at, kind, step, "coordinator", detail, b"")


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(sorted(SETTLED, key=str))),
        max_size=6,
    )
)
def test_an_archived_history_gives_each_request_with_what_became_of_it(
    calls: list[tuple[str, str | None]],
) -> None:
    """Whatever the order of steps and outcomes, each ``call-dispatched`` is one sending,
    in order, settled by the event of its own step and attempt — a bundle's numbers read
    as Decimal given back as JSON's whole numbers."""
    events: list[Event] = []
    attempts = dict.fromkeys("ab", 0)
    for step, settled in calls:
        attempts[step] += 1
        attempt = Decimal(attempts[step])
        detail: dict[str, JSON] = {"attempt": attempt, "method": "POST", "url": f"/{step}"}
        events.append(_event(len(events) + 1, "call-dispatched", step, detail))
        if settled is not None:
            status = {"status": Decimal(201)} if settled == "call-answered" else {}
            events.append(_event(len(events) + 1, settled, step, {"attempt": attempt, **status}))
    sent = reports.sendings(events)
    assert [(s["step"], s["effect"]) for s in sent] == [(c, SETTLED[o]) for c, o in calls]
    for one, (_, settled) in zip(sent, calls, strict=True):
        assert type(one["attempt"]) is int and one["answer"] is None
        assert one["status"] == (201 if settled == "call-answered" else None)
        assert (one["settledAt"] is None) == (settled is None)


def test_a_late_answer_is_told_with_the_sending_it_answers() -> None:
    events = [
        _event(1, "call-dispatched", "send", {"attempt": 1, "method": "POST", "url": None}),
        _event(2, "call-lost", "send", {"attempt": 1}),
        _event(3, "late-answer", "send", {"attempt": 1, "status": 202}),
    ]
    [sent] = reports.sendings(events)
    assert sent["effect"] == "unknown" and sent["url"] is None
    assert sent["lateAnswer"] == {"status": 202, "at": "2026-12-07T10:00:03Z", "answer": None}
