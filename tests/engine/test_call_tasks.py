"""Call tasks in-process, against a stand-in product on loopback: what a shutdown, an
outage that outlasts the lease, or a database that refuses an answer leave behind.

The call pool runs as in the service; the test holds the database handle it is given
(:mod:`tests.support.interleave`), so a statement can stop, fail, or fail after committing
exactly where the case needs it.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import trio

from registry_coordinator import store
from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.engine.calls import Calls, Sending, open_products
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.http import operations
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.semantics.steps import Held, Request, Send, bind, on_due
from registry_coordinator.store.database import StatementFailed, sync_connection
from registry_coordinator.store.statements import INTERRUPTED
from tests.support import (
    LEASE,
    RECORD,
    STANDIN_TOKEN,
    Failing,
    Paused,
    breg,
    breg_config,
    call_pool,
    claimed_call,
    events,
    invocations,
)


async def _sealed(
    calls: Calls, sealing: Paused, definition: Definition, run: store.Claimed, send: Send
) -> None:
    """The run's mutation submitted, until its sealing statement has run (not returned)."""
    calls.submit(definition, run, send.request)
    await sealing.reached.wait()


def run_row(dsn: str) -> dict[str, object]:
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT state, step, hold_code, dispatched_at FROM runs").fetchone()
    assert row is not None
    return dict(row)


@pytest.mark.trio
async def test_a_shutdown_while_a_run_goes_on_after_its_call_keeps_the_answer(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read's answer is recorded and the run goes on, still held, in the call's task;
    the service stops right then. The run stays where the answer took it: the call is
    not recorded a second time as interrupted (it used to be, sending the run back)."""
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    async with breg(dsn) as (db, _, port):
        config = breg_config(tmp_path, dsn, "bench-four", port)
        definition, run, read = await claimed_call(db, "bench-four")
        going_on = trio.Event()

        async def proceed(_: Definition, run: store.Claimed, ahead: store.Ahead | None) -> None:
            assert run.step == "act" and ahead is not None and isinstance(ahead.transition, Send)
            going_on.set()
            await trio.sleep_forever()  # the engine's step loop, when the shutdown comes

        async with call_pool(config, db, proceed=proceed) as calls:
            calls.submit(definition, run, read.request)
            await going_on.wait()
            await calls.drain(timedelta(0))  # the shutdown: calls in flight are cancelled
    kinds = [(e["kind"], e["step"]) for e in events(dsn, str(run.id))]
    assert kinds == [
        ("admitted", "read"),
        ("call-dispatched", "read"),
        ("call-answered", "read"),
        ("step-completed", "read"),
        ("step-completed", "decide"),
    ]
    assert {k: v for k, v in run_row(dsn).items() if k in ("state", "step")} == {
        "state": RunState.RUNNING,
        "step": "act",
    }


@pytest.mark.trio
async def test_a_request_sealed_as_the_shutdown_came_is_recorded_as_not_sent(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shutdown comes while the mutation is being sealed: its statement has committed,
    its reply is on the way. The sealing completes; the request, which had not begun to
    leave, is recorded as not sent, and the next holder sends it — where the run used to
    be held as interrupted, a mutation that was never sent."""
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    async with breg(dsn) as (db, product, port):
        definition, run, send = await claimed_call(db, "act")
        sealing = Paused(db, after="dispatch_call")
        async with call_pool(breg_config(tmp_path, dsn, "act", port), sealing) as calls:
            await _sealed(calls, sealing, definition, run, send)
            await calls.drain(timedelta(0))  # the shutdown
            sealing.go()
        with sync_connection(dsn) as conn:  # its retry has come
            conn.execute("UPDATE runs SET due_at = now()")
        again = await store.claim(db, "holder:2", LEASE)
        assert again is not None and not again.dispatched
        later = again.now() + timedelta(minutes=1)
        assert isinstance(
            on_due(definition, again.record(), again.step, False, again.timer_at, later), Send
        )
    assert invocations(product) == []  # prepared, sealed, never sent
    assert not product.ledger.applied
    history = events(dsn, str(run.id))
    assert [e["kind"] for e in history] == [
        "admitted",
        "call-dispatched",
        "call-not-sent",
        "retry-scheduled",
    ]
    assert history[2]["detail"] == {"attempt": 1, "detail": "the service stopped before sending"}
    assert history[-1]["detail"]["detail"] == "not sent: the service stopped before sending"
    assert run_row(dsn)["dispatched_at"] is None


@pytest.mark.trio
async def test_an_answer_after_the_claim_was_lost_is_kept_and_reconcile_uses_it(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database outage outlasts the lease while BReg applies the mutation; another
    holder takes the run over and holds it dispatch-interrupted. When the database comes
    back, the answer the call task holds is kept with the run and shown with the hold,
    and reconcile completes the step with it (invoke-action has no receipt lookup). It
    used to be dropped, leaving an operator nothing but a guess."""
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    lease = timedelta(seconds=1)
    async with breg(dsn, size=3) as (db, product, port):
        config = breg_config(tmp_path, dsn, "act", port)
        definition, run, send = await claimed_call(db, "act", lease)
        outage = Failing(db, "transition")
        outage.failing_before = 10**9
        async with call_pool(config, outage, lease) as calls:
            calls.submit(definition, run, send.request)
            await outage.refused.wait()  # answered, and the answer cannot be recorded
            taken = None
            while taken is None:  # the lease runs out: another holder takes the run over
                await trio.sleep(0.1)
                taken = await store.claim(db, "holder:2", LEASE)
            interrupted = on_due(
                definition, taken.record(), taken.step, False, None, taken.now(), True
            )
            assert isinstance(interrupted, Held)
            await store.commit(db, definition, taken, interrupted, LEASE)
            outage.failing_before = 0  # the database is back
            while "late-answer" not in [e["kind"] for e in events(dsn, str(run.id))]:
                await trio.sleep(0.05)
            held = await store.status(db, run.id)
            assert held is not None and held.hold_code == "dispatch-interrupted"
            assert (held.late_attempt, held.late_status) == (1, 200)
            await operations.reconcile(
                db, Workflows([]), calls.products, calls.timer, run.id, "ops", "OPS-7: BReg up"
            )
    history = events(dsn, str(run.id))
    assert [e["kind"] for e in history] == [
        "admitted",
        "call-dispatched",
        "call-lost",  # recorded by the holder that took the run over, finding it dispatched
        "held",
        "late-answer",
        "reconciled",
    ]
    assert history[2]["detail"] == {"attempt": 1, "detail": INTERRUPTED}
    assert history[-1]["detail"]["evidence"] == "late-answer"
    assert len(invocations(product)) == 1  # nothing was sent again
    assert list(product.ledger.applied.values()) == [1]
    with sync_connection(dsn) as conn:
        outputs = conn.execute("SELECT outputs FROM runs").fetchone()
    assert outputs is not None
    invoked = outputs["outputs"]["invoke"]
    assert invoked["action"] == "mark-reviewed"
    assert invoked["results"]["application"]["recordId"] == RECORD


@pytest.mark.trio
async def test_an_answer_the_database_refuses_holds_the_run_with_the_answer_kept(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database refuses the statement recording a call's answer (a defect, not an
    outage): the run is held engine-defect at once, with the answer's bytes kept on the
    call's execution, instead of being left to its lease to be found interrupted."""
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    async with breg(dsn) as (db, product, port):
        config = breg_config(tmp_path, dsn, "act", port)
        definition, run, send = await claimed_call(db, "act")
        refusing = Failing(db, "transition", StatementFailed)
        refusing.failing_before = 1
        async with call_pool(config, refusing) as calls:
            calls.submit(definition, run, send.request)
            while run_row(dsn)["state"] != RunState.HELD:
                await trio.sleep(0.02)
    row = run_row(dsn)
    assert row["hold_code"] == "engine-defect"
    history = events(dsn, str(run.id))
    # The answer came back; the hold is the database's refusal to record it.
    assert [e["kind"] for e in history] == ["admitted", "call-dispatched", "call-answered", "held"]
    assert history[2]["detail"] == {"attempt": 1, "status": 200}
    assert "the database refused to record the answer (2xx)" in history[-1]["detail"]["detail"]
    with sync_connection(dsn) as conn:
        execution = conn.execute("SELECT outcome, status, response FROM executions").fetchone()
    assert execution is not None
    assert (execution["outcome"], execution["status"]) == ("response", 200)
    assert b'"action": "mark-reviewed"' in bytes(execution["response"])
    assert len(invocations(product)) == 1


@pytest.mark.trio
async def test_the_connection_trace_tells_when_a_request_leaves(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpcore's trace reports the moment before a request's first byte is written: a
    shutdown's "not sent" relies on it. Should a newer httpcore stop reporting it, this
    fails, while the service falls back to counting every request handed over as sent."""
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    async with breg(dsn) as (_, product, port):
        config = breg_config(tmp_path, dsn, "act", port)
        async with open_products(config.connections) as (products, _):
            registry = products["registry"]
            record = Request("GET", f"/v1/records/applications/{RECORD}", None, None)
            reading = builtin_catalog().operation("breg", "read-record")
            assert reading is not None
            read = bind(reading, record, registry.config.parameters)  # its accessProfile
            sending = Sending()
            assert sending.never_left
            reply = await registry.send(
                read, registry.url(read.target), f"Bearer {STANDIN_TOKEN}", sending
            )
    assert reply.status == 200
    assert sending.left and Sending.proven and not sending.never_left
    assert len(product.ledger.requests) == 1


@pytest.mark.trio
async def test_a_request_sealed_before_a_products_pause_is_not_sent_and_waits_unsealed(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The product asks for a minute's pause (another run heard its 429) while this
    mutation is being sealed: the request is not sent, recorded so, and tried again after
    the pause. It used to wait out the minute marked dispatched, where a kill would have
    left its outcome unknown and held the run for an operator."""
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    async with breg(dsn) as (db, product, port):
        definition, run, send = await claimed_call(db, "act")
        sealing = Paused(db, after="dispatch_call")
        async with call_pool(breg_config(tmp_path, dsn, "act", port), sealing) as calls:
            await _sealed(calls, sealing, definition, run, send)
            for connection in calls.products.values():
                connection.pace.slow_down(timedelta(minutes=1))
            sealing.go()
            with trio.fail_after(10):  # not the minute
                while run_row(dsn)["dispatched_at"] is not None:
                    await trio.sleep(0.05)
    assert invocations(product) == []  # sealed, never sent
    history = events(dsn, str(run.id))
    assert [e["kind"] for e in history] == [
        "admitted",
        "call-dispatched",
        "call-not-sent",
        "retry-scheduled",
    ]
    assert "asked for 60 s more before another request" in history[2]["detail"]["detail"]
