"""semantics/replay without the database: a history that follows from its record replays,
decision by decision, and one whose branch, instant, key, output or order was changed —
or whose record was — is refused naming the first event that does not follow. The
histories are built the way the engine writes them, from the same step semantics."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.semantics import bundles
from registry_coordinator.semantics.chain import Event, canonical, parse
from registry_coordinator.semantics.checkpoints import Leaf, sign
from registry_coordinator.semantics.replay import Diverged, Record, replay
from registry_coordinator.semantics.steps import Finished, RunRecord, enter
from tests.support import TEST_WORKFLOWS, chained
from tests.support.answers import breg_record

RECORD_ID = "7d1c2a4e-0b5f-4c3a-9e21-5a6b7c8d9e01"
RUN = "5b0f7c1e-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEY = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"test_replay: signer").digest())


def definition(name: str) -> Definition:
    report = check_source(TEST_WORKFLOWS / name)
    assert report.definition is not None
    return report.definition


TIMED = definition("timed-choice.yaml")
LOOKUP = definition("lookup.yaml")


def at(seconds: float) -> str:
    return format_instant(T0 + timedelta(seconds=seconds))


def timed_history(answer: str, woke: float = 2.5) -> tuple[list[Event], Record]:
    """timed-choice's history and record as the engine writes them for ``answer``: it
    waits two seconds, wakes ``woke`` seconds after admission and chooses on the answer."""
    yes = answer == "yes"
    finish = "said_yes" if yes else "said_no"
    run = RunRecord(
        RUN,
        {"answer": answer},
        T0,
        T0 + timedelta(hours=1),
        completed={"pause": T0 + timedelta(seconds=woke), "route": T0 + timedelta(seconds=woke)},
    )
    finished = enter(TIMED, finish, run, T0 + timedelta(seconds=woke))
    assert isinstance(finished, Finished)
    drafts: list[tuple[str, str, str, str, Any]] = [
        (at(0), "admitted", "pause", "local", {"workflow": "timed-choice", "version": "1"}),
        (at(0), "waiting", "pause", "coordinator", {"until": at(2)}),
        (at(woke), "step-completed", "pause", "coordinator", {"via": "next", "next": "route"}),
        (
            at(woke),
            "step-completed",
            "route",
            "coordinator",
            {"via": "case 1" if yes else "otherwise", "next": finish},
        ),
        (at(woke), "finished", finish, "coordinator", {"outcome": finished.outcome}),
    ]
    record = Record({"answer": answer}, {}, finished.output, at(3600))
    return chained(RUN, drafts), record


def changed(events: list[Event], seq: int, **fields: Any) -> list[Event]:
    """``events`` with event ``seq`` changed as a key holder would, every hash re-chained."""
    drafts = [(e.at, e.kind, e.step, e.actor, e.detail) for e in events]
    e = replace(events[seq - 1], **fields)
    drafts[seq - 1] = (e.at, e.kind, e.step, e.actor, e.detail)
    return chained(RUN, drafts)


def diverges(events: list[Event], record: Record, definition: Definition = TIMED) -> Diverged:
    with pytest.raises(Diverged) as refused:
        replay(definition, RUN, events, record)
    return refused.value


def test_a_history_that_follows_from_its_record_replays_decision_by_decision() -> None:
    events, record = timed_history("yes")
    replayed = replay(TIMED, RUN, events, record)
    assert [(d.seq, d.step) for d in replayed.decisions] == [
        (2, "pause"),
        (3, "pause"),
        (4, "route"),
        (5, "said_yes"),
    ]
    assert replayed.decisions[2].said == "took case 1 -> said_yes"
    assert (replayed.step, replayed.ended) == ("said_yes", "finished")


def test_a_branch_changed_and_re_signed_is_refused_at_that_event() -> None:
    events, record = timed_history("yes")
    forged = changed(events, 4, detail={"via": "otherwise", "next": "said_no"})
    forged = changed(forged, 5, step="said_no", detail={"outcome": "no"})
    refused = diverges(forged, record)
    assert refused.seq == 4
    assert "otherwise -> said_no" in refused.why and "case 1 -> said_yes" in refused.why


def test_a_record_changed_under_its_history_is_refused_at_the_decision_it_changes() -> None:
    events, record = timed_history("yes")
    assert diverges(events, replace(record, input={"answer": "no"})).seq == 4


def test_a_wait_cut_short_or_moved_is_refused_where_it_shows() -> None:
    events, record = timed_history("yes")
    assert diverges(changed(events, 2, detail={"until": at(1)}), record).seq == 2
    early, early_record = timed_history("yes", woke=1.5)
    assert diverges(early, early_record).seq == 3


def test_an_output_the_finish_does_not_render_is_refused() -> None:
    events, record = timed_history("yes")
    refused = diverges(events, replace(record, output={"paused": at(9), "admitted": at(0)}))
    assert refused.seq == 5 and "output" in refused.why
    assert diverges(*timed_history("no")[:1], replace(record, input={"answer": "no"})).seq == 5


def test_an_event_at_another_step_than_the_run_is_at_is_refused() -> None:
    events, record = timed_history("yes")
    refused = diverges(changed(events, 3, step="route"), record)
    assert refused.seq == 3 and "the run was at pause" in refused.why


def test_a_record_holding_more_than_the_history_made_is_refused() -> None:
    events, record = timed_history("yes")
    refused = diverges(events, replace(record, outputs={"route": 1}))
    assert refused.seq == 0 and "route" in refused.why
    unreadable = diverges(events, replace(record, input={"answer": "ye\x00s"}))
    assert unreadable.seq == 2 and "NUL" in unreadable.why


@given(
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12),
    st.floats(min_value=2, max_value=3000),
)
def test_every_history_built_from_the_semantics_replays_and_its_other_branch_does_not(
    answer: str, woke: float
) -> None:
    events, record = timed_history(answer, woke)
    assert replay(TIMED, RUN, events, record).ended == "finished"
    other = {"via": "otherwise", "next": "said_no"}
    if answer != "yes":
        other = {"via": "case 1", "next": "said_yes"}
    assert diverges(changed(events, 4, detail=other), record).seq == 4


def lookup_history(status: int, body: Any) -> tuple[list[Event], Record]:
    """lookup's history: the read sent once, answered ``status`` with ``body``, done."""
    drafts: list[tuple[str, str, str, str, Any]] = [
        (at(0), "admitted", "read", "local", {"workflow": "lookup", "version": "1"}),
        (at(1), "call-dispatched", "read", "coordinator", {"attempt": 1, "method": "GET"}),
        (at(2), "call-answered", "read", "coordinator", {"attempt": 1, "status": status}),
        (at(2), "step-completed", "read", "coordinator", {"via": "next", "next": "done"}),
        (at(2), "finished", "done", "coordinator", {"outcome": "found"}),
    ]
    output = {"email": body["data"]["domainData"].get("email")}
    return chained(RUN, drafts), Record({"recordId": RECORD_ID}, {"read": body}, output, at(600))


def test_a_call_completes_only_on_a_success_with_an_answer_its_operation_gives() -> None:
    body = breg_record(RECORD_ID)
    body["data"]["domainData"]["email"] = "a@example.org"
    events, record = lookup_history(200, body)
    assert replay(LOOKUP, RUN, events, record).ended == "finished"
    assert diverges(*lookup_history(500, body), LOOKUP).seq == 4
    read_back = parse(canonical({"status": 500}))  # as a bundle's events are read
    refused = changed(events, 3, detail={"attempt": 1, **read_back})
    assert diverges(refused, record, LOOKUP).seq == 4
    unusable = replace(record, outputs={"read": {"data": "not a record"}})
    assert diverges(events, unusable, LOOKUP).seq == 4
    assert diverges(events, replace(record, outputs={}), LOOKUP).seq == 4


def test_an_auditors_bundle_carries_its_record_signed_with_its_last_event() -> None:
    events, record = timed_history("yes")
    artifact = b"{}"
    drafts = [(e.at, e.kind, e.step, e.actor, e.detail) for e in events]
    digest = "sha256:" + hashlib.sha256(artifact).hexdigest()
    drafts[0] = (*drafts[0][:4], {**drafts[0][4], "digest": digest})
    events = chained(RUN, drafts)
    leaf = Leaf(RUN, len(events), events[-1].hash)
    checkpoint = sign(KEY, 1, at(4000), None, [leaf])
    signed = bundles.signed_record(KEY, RUN, events[-1].hash, record)
    data = bundles.write(RUN, events, artifact, checkpoint, len(events), 0, [], signed)
    proven = bundles.check(data, KEY.public_key())
    assert proven.record == record and proven.history == tuple(events)
    moved = bundles.signed_record(KEY, RUN, events[-2].hash, record)
    with pytest.raises(bundles.Refused, match="record's signature"):
        bundles.check(
            bundles.write(RUN, events, artifact, checkpoint, len(events), 0, [], moved),
            KEY.public_key(),
        )
    other = bundles.signed_record(KEY, RUN, events[-1].hash, replace(record, input={"a": 1}))
    text = bundles.write(RUN, events, artifact, checkpoint, len(events), 0, [], other)
    swapped = text.replace(b'"input":{"a":1}', b'"input":{"answer":"yes"}')
    with pytest.raises(bundles.Refused, match="record's signature"):
        bundles.check(swapped, KEY.public_key())
    assert bundles.named_key(data).public_bytes_raw() == KEY.public_key().public_bytes_raw()
