"""The console's reads, driven in-process: the runs listing's filters, held work with its
sendings and the API's visibility, a run's record and call attempts, run counts, and
admission. Runs get where they are by the store's own statements, as the engine moves
them: admitted, claimed, their requests sealed, their answers settled, held."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from registry_coordinator import store
from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.semantics.codes import HoldCode, RunState
from registry_coordinator.semantics.steps import Held, Request, Send, on_due, settle
from registry_coordinator.store import console_reads, operator_actions
from registry_coordinator.store.database import Database
from tests.support import TEST_WORKFLOWS, breg_record, database, reply

LEASE = timedelta(seconds=30)
#: A cursor before which every run was admitted: the listing's first page.
FIRST_PAGE = (datetime.max.replace(tzinfo=UTC), uuid.UUID(int=0))


def record_id(key: str) -> str:
    """The BReg record (its id a UUID) the run started with ``key`` acts on."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"breg.test/applications/{key}"))


#: BReg's answer to read-record that takes bench-four's choice to its mutation.
AWAITING_REVIEW = json.dumps(breg_record(record_id("app-1"))).encode()


@dataclass(frozen=True)
class Pinned:
    """A stored definition, to admit runs of."""

    definition: Definition
    digest: str


async def pin(db: Database, source: Path) -> Pinned:
    checked = check_source(source)
    assert checked.definition is not None and checked.artifact and checked.digest
    await store.store_definition(db, checked.definition, checked.digest, checked.artifact)
    return Pinned(checked.definition, checked.digest)


async def start(db: Database, pinned: Pinned, caller: str, key: str, run_input: Any) -> uuid.UUID:
    admitted = await store.admit(db, pinned.definition, pinned.digest, caller, key, run_input)
    return admitted.run_id


async def claimed(db: Database, pinned: Pinned, caller: str, key: str) -> store.Claimed:
    """A new run, claimed at its first step (no other run is due)."""
    run_id = await start(db, pinned, caller, key, {"recordId": record_id(key)})
    run = await store.claim(db, "holder:1", LEASE)
    assert run is not None and run.id == run_id
    return run


async def sealed(db: Database, pinned: Pinned, run: store.Claimed) -> tuple[store.Claimed, Request]:
    """The run's call, sealed and dispatched as the call pool does before sending it."""
    send = on_due(pinned.definition, run.record(), run.step, False, None, run.now())
    assert isinstance(send, Send)
    return await store.dispatch(db, run, send.request, url(run.step)), send.request


def url(step: str) -> str:
    return f"http://breg.test/{step}"


async def answered(
    db: Database, pinned: Pinned, run: store.Claimed, status: int, body: bytes
) -> store.Committed:
    """The sealed call's answer, settled as the call pool settles it."""
    transition = settle(pinned.definition, run.step, reply(status, body), run.attempt, run.now())
    return await store.commit(
        db,
        pinned.definition,
        run,
        transition,
        LEASE,
        settlement=store.Settlement("response", status, body),
        go_on=True,
    )


async def held_unsent(db: Database, pinned: Pinned, caller: str, key: str) -> uuid.UUID:
    """A run held at its first call before it sealed a request."""
    run = await claimed(db, pinned, caller, key)
    await store.commit(db, pinned.definition, run, Held(HoldCode.PRODUCT_FORBIDDEN, "401"), LEASE)
    return run.id


async def listed(db: Database, which: store.RunFilter) -> list[uuid.UUID]:
    return [run.id for run in await store.runs_page(db, which, FIRST_PAGE, 100)]


def anyone(**asked: Any) -> store.RunFilter:
    """A filter as an operator's listing asks it: every caller's runs, every workflow."""
    return store.RunFilter(None, None, **asked)


@pytest.mark.trio
async def test_runs_are_listed_by_their_definitions_version(dsn: str, tmp_path: Path) -> None:
    second = tmp_path / "act.yaml"
    second.write_text(
        (TEST_WORKFLOWS / "act.yaml").read_text().replace('version: "1"', 'version: "2"')
    )
    async with database(dsn) as db:
        one = await start(
            db, await pin(db, TEST_WORKFLOWS / "act.yaml"), "test", "a", {"recordId": "a"}
        )
        two = await start(db, await pin(db, second), "test", "b", {"recordId": "b"})
        assert await listed(db, anyone()) == [two, one]
        assert await listed(db, anyone(version="2")) == [two]
        assert await listed(db, anyone(workflow="act", version="1")) == [one]
        assert await listed(db, anyone(workflow="bench-four", version="1")) == []


@pytest.mark.trio
async def test_runs_are_listed_by_who_started_them_within_what_the_caller_may_see(
    dsn: str,
) -> None:
    async with database(dsn) as db:
        act = await pin(db, TEST_WORKFLOWS / "act.yaml")
        first = await start(db, act, "alice", "a", {"recordId": "a"})
        await start(db, act, "bob", "b", {"recordId": "b"})
        second = await start(db, act, "alice", "c", {"recordId": "c"})
        assert await listed(db, anyone(started_by="alice")) == [second, first]
        assert await listed(db, store.RunFilter("alice", None, started_by="alice")) == [
            second,
            first,
        ]
        assert await listed(db, store.RunFilter("bob", None, started_by="alice")) == []


@pytest.mark.trio
async def test_runs_are_listed_by_when_they_were_admitted_from_since_until_before_until(
    dsn: str,
) -> None:
    async with database(dsn) as db:
        act = await pin(db, TEST_WORKFLOWS / "act.yaml")
        runs = [await start(db, act, "test", key, {"recordId": key}) for key in "abc"]
        at = []
        for run in runs:
            status = await store.status(db, run)
            assert status is not None
            at.append(status.admitted_at)
        first, second, third = runs
        assert await listed(db, anyone(since=at[1])) == [third, second]
        assert await listed(db, anyone(until=at[1])) == [first]
        assert await listed(db, anyone(since=at[0], until=at[2])) == [second, first]
        assert await listed(db, anyone(since=at[2], until=at[2])) == []


@pytest.mark.trio
async def test_text_is_found_in_the_start_key_or_the_input_ignoring_case_and_literally(
    dsn: str,
) -> None:
    """The text is the user's, not a pattern: ``_`` and ``%`` are not wildcards, and a
    backslash is not LIKE's escape."""
    async with database(dsn) as db:
        act = await pin(db, TEST_WORKFLOWS / "act.yaml")
        keyed = {
            key: await start(db, act, "test", key, {"recordId": record})
            for key, record in [
                ("Order-42", "a"),
                ("k-underscore", "app_1"),
                ("k-letter", "appX1"),
                ("100%", "b"),
                ("1000", "c"),
                ("C:\\path", "d"),
                ("Cpath", "e"),
            ]
        }
        assert await listed(db, anyone(text="order-4")) == [keyed["Order-42"]]
        assert await listed(db, anyone(text="APP_1")) == [keyed["k-underscore"]]
        assert await listed(db, anyone(text="appx")) == [keyed["k-letter"]]
        assert await listed(db, anyone(text="100%")) == [keyed["100%"]]
        assert await listed(db, anyone(text="c:\\PATH")) == [keyed["C:\\path"]]
        assert await listed(db, anyone(text="recordid")) == list(reversed(keyed.values()))
        assert await listed(db, anyone(text="nowhere")) == []


@pytest.mark.trio
async def test_held_runs_come_oldest_first_with_their_steps_latest_sending_as_the_api_shows(
    dsn: str,
) -> None:
    """Three held runs: one whose mutation was answered 502 after its read went through,
    one held before it sent anything, one held after sending whose answer came late. A
    running run is not held work."""
    late_body = json.dumps(
        {
            "action": "mark-reviewed",
            "applicationId": "5e2b7c9d-1f3a-4b6c-8d0e-2a4c6e8f0b1d",
            "results": {},
        }
    ).encode()
    async with database(dsn) as db:
        bench = await pin(db, TEST_WORKFLOWS / "bench-four.yaml")
        act = await pin(db, TEST_WORKFLOWS / "act.yaml")

        reading, _ = await sealed(db, bench, await claimed(db, bench, "alice", "answered"))
        went_on = await answered(db, bench, reading, 200, AWAITING_REVIEW)
        assert went_on.held and went_on.run.step == "act"
        acting, mutation = await sealed(db, bench, went_on.run)
        assert (await answered(db, bench, acting, 502, b"bad gateway")).run.state is RunState.HELD

        unsent = await held_unsent(db, act, "bob", "unsent")

        lost, lost_request = await sealed(db, act, await claimed(db, act, "alice", "late"))
        assert await store.record_defect(db, lost, HoldCode.ENGINE_DEFECT, "test: an error")
        assert await store.keep_late_answer(db, lost, 200, late_body)

        await start(db, act, "alice", "running", {"recordId": "running"})

        everything = await console_reads.held_runs(db, None, None)
        assert [held.run.id for held in everything] == [acting.id, unsent, lost.id]
        first, second, third = (held.run for held in everything)
        first_sent, second_sent, third_sent = (held.sending for held in everything)
        assert (first.state, first.step, first.hold_code) == (
            RunState.HELD,
            "act",
            HoldCode.OUTCOME_UNKNOWN,
        )
        assert first.version == "1" and first.caller == "alice"
        assert first_sent is not None
        sent = (first_sent.attempt, first_sent.method, first_sent.url, first_sent.idempotency_key)
        assert sent == (1, mutation.method, url("act"), mutation.idempotency_key)
        assert mutation.idempotency_key is not None
        assert first_sent.sealed_at == first_sent.dispatched_at is not None
        assert first_sent.settled_at is not None
        assert (first_sent.status, first_sent.outcome) == (502, "response")
        assert first_sent.response == b"bad gateway"
        assert first.late_attempt is None

        assert second.hold_code is HoldCode.PRODUCT_FORBIDDEN
        assert second_sent is None
        assert (second.late_attempt, second.late_status, second.late_at) == (None, None, None)

        assert third.hold_code is HoldCode.ENGINE_DEFECT
        assert third_sent is not None
        assert (third_sent.attempt, third_sent.url) == (1, url("invoke"))
        assert third_sent.idempotency_key == lost_request.idempotency_key
        assert (third_sent.status, third_sent.outcome, third_sent.response) == (
            None,
            "defect",
            None,
        )
        assert (third.late_attempt, third.late_status) == (1, 200)
        assert third.late_at is not None

        assert [held.run.id for held in await console_reads.held_runs(db, None, None, 2)] == [
            acting.id,
            unsent,
        ]
        visible = {
            ("alice", None): [acting.id, lost.id],
            (None, frozenset({"act"})): [unsent, lost.id],
            ("alice", frozenset({"act"})): [lost.id],
            ("bob", frozenset({"bench-four"})): [],
        }
        for (caller, readable), ids in visible.items():
            shown = await console_reads.held_runs(db, caller, readable)
            assert [held.run.id for held in shown] == ids, (caller, readable)
            assert await console_reads.held_count(db, caller, readable) == len(ids)
        assert await console_reads.held_count(db, None, None) == 3


@pytest.mark.trio
async def test_a_runs_record_and_its_call_attempts_in_the_order_they_were_sealed(
    dsn: str,
) -> None:
    async with database(dsn) as db:
        bench = await pin(db, TEST_WORKFLOWS / "bench-four.yaml")
        reading, read = await sealed(db, bench, await claimed(db, bench, "alice", "app-1"))
        went_on = await answered(db, bench, reading, 200, AWAITING_REVIEW)
        acting, mutation = await sealed(db, bench, went_on.run)
        await answered(db, bench, acting, 502, b"bad gateway")

        detail = await console_reads.run_detail(db, acting.id)
        attempts = await console_reads.executions(db, acting.id)
        assert await console_reads.run_detail(db, uuid.uuid4()) is None
        assert await console_reads.executions(db, uuid.uuid4()) == []
    assert detail is not None
    assert detail.input == {"recordId": record_id("app-1")} and detail.start_key == "app-1"
    assert set(detail.completed) == {"read", "decide"}
    assert detail.outputs["read"]["data"]["domainData"] == {"status": "awaiting-review"}
    sendings = [a.sending for a in attempts]
    assert [(a.step, s.attempt, s.method) for a, s in zip(attempts, sendings, strict=True)] == [
        ("read", 1, read.method),
        ("act", 1, mutation.method),
    ]
    assert [(s.status, s.outcome, s.response) for s in sendings] == [
        (200, "response", AWAITING_REVIEW),
        (502, "response", b"bad gateway"),
    ]
    assert sendings[0].sealed_at < sendings[1].sealed_at
    assert sendings[1].url == url("act")
    assert sendings[1].idempotency_key == mutation.idempotency_key
    assert all(s.dispatched_at and s.settled_at for s in sendings)
    assert [(a.late_status, a.late_at) for a in attempts] == [(None, None)] * 2
    assert attempts[1].body is not None and attempts[0].body is None


@pytest.mark.trio
async def test_runs_are_counted_by_definition_and_state_ended_ones_too(dsn: str) -> None:
    closed = json.loads(AWAITING_REVIEW)
    closed["data"]["domainData"]["status"] = "closed"
    async with database(dsn) as db:
        bench = await pin(db, TEST_WORKFLOWS / "bench-four.yaml")
        act = await pin(db, TEST_WORKFLOWS / "act.yaml")
        reading, _ = await sealed(db, bench, await claimed(db, bench, "test", "skipped"))
        skipped = await answered(db, bench, reading, 200, json.dumps(closed).encode())
        assert skipped.run.state is RunState.FINISHED
        await held_unsent(db, act, "test", "held")
        for key in "ab":
            await start(db, act, "test", key, {"recordId": key})
        assert await console_reads.run_counts(db) == {
            bench.digest: {"finished": 1},
            act.digest: {"held": 1, "running": 2},
        }


@pytest.mark.trio
async def test_admission_and_its_latest_changes_newest_first(dsn: str) -> None:
    async with database(dsn) as db:
        never = await console_reads.admission(db)
        assert never is not None and not never.held and never.actor == "coordinator"
        assert await console_reads.admission_events(db) == []
        changes = [
            (True, "ops-1", "maintenance"),
            (False, "ops-2", "done"),
            (True, "ops-3", "again"),
        ]
        for held, actor, reason in changes:
            await operator_actions.set_admission(db, held, actor, reason)
        now = await console_reads.admission(db)
        latest = await console_reads.admission_events(db, limit=2)
        every = await console_reads.admission_events(db)
    assert now is not None
    assert (now.held, now.actor, now.reason) == (True, "ops-3", "again")
    assert [(e.held, e.actor, e.reason) for e in latest] == changes[:0:-1]
    assert [(e.held, e.actor, e.reason) for e in every] == changes[::-1]
    assert now.at == every[0].at > every[1].at > every[2].at
