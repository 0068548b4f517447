"""Product calls against stand-in products on loopback that count every request and key.

The stand-ins' ledgers are the evidence: how many requests a product received,
with which idempotency keys and body digests, and how many it applied.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import sync_connection
from tests.support import (
    STANDIN_TOKEN,
    Service,
    Services,
    StandIns,
    bound_to_one,
    events,
    run_state,
    running,
    sendings,
    stand_ins,
    wait_for,
    wait_state,
)

#: A connection that asks its product nothing about a call whose outcome is unknown
#: before it holds the run (test_products has the asking): the run is held at once.
UNASKED = {"verification": {"attempts": 0}}


def kinds(dsn: str, run: str) -> list[str]:
    return [e["kind"] for e in events(dsn, run)]


def records(count: int) -> list[str]:
    """Ids of ``count`` records the stand-in BReg has."""
    return [str(uuid.uuid4()) for _ in range(count)]


def posted(products: StandIns, product: str, path: str) -> list[dict[str, Any]]:
    """The POSTs ``product`` received at exactly ``path``."""
    return [r for r in products.requests(product, "POST", path) if r["path"] == path]


def message_at(products: StandIns, message_id: str) -> str:
    """The id of the message Messaging holds as ``message_id`` (the test fails if none)."""
    message = httpx.get(
        products.url("messaging") + f"/v1/messages/{message_id}",
        headers={"Authorization": f"Bearer {STANDIN_TOKEN}"},
    )
    assert message.status_code == 200, message.text
    return str(message.json()["id"])


def test_a_product_down_for_5_s_then_back(dsn: str, tmp_path: Path) -> None:
    config, port = bound_to_one(tmp_path, dsn, "notify", "notices", "messaging")
    with running(config, tmp_path / "service.log") as service:
        run = service.start_run("notify", {"email": "a@example.org"})
        time.sleep(5)
        assert run_state(dsn, run)["state"] == RunState.RUNNING
        with stand_ins(tmp_path / "standins.log", {"messaging": port}) as products:
            wait_state(dsn, run, RunState.FINISHED, timeout=40)
            posts = products.requests("messaging", "POST", "/v1/messages")
    history = events(dsn, run)
    retries = [e for e in history if e["kind"] == "retry-scheduled"]
    assert len(retries) >= 2, history
    assert all("not sent" in e["detail"]["detail"] for e in retries)
    assert len(posts) == 1  # nothing reached the product while it was down
    assert history[-1]["kind"] == "finished"


def test_a_lost_response_holds_the_run_and_reconcile_completes_it(
    dsn: str, services: Services
) -> None:
    settings = {"requestTimeout": "PT1S", **UNASKED}
    service, products = services.deploy(["notify"], {"notices": ("messaging", settings)})
    products.faults(
        "messaging",
        {"match": "POST /v1/messages", "mode": "hang-after-apply", "seconds": 30, "times": 1},
    )
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, run, RunState.HELD)
    status = service.status(run)
    assert status["hold"] == {  # what timed out, after how long: not httpx's empty text
        "code": "outcome-unknown",
        "detail": "no answer: ReadTimeout: nothing came back within requestTimeout PT1S",
    }
    time.sleep(1.5)  # nothing is resent on its own
    posts = posted(products, "messaging", "/v1/messages")
    assert len(posts) == 1
    assert products.ledger("messaging")["applied"] == {posts[0]["key"]: 1}

    refused = service.http.post(f"/v1/runs/{run}/reconcile", json={})
    assert refused.status_code == 400
    assert refused.json()["code"] == "request.reason-missing"
    response = service.http.post(
        f"/v1/runs/{run}/reconcile", json={"reason": "ticket OPS-12: the product was slow"}
    )
    assert response.status_code == 200, response.text
    wait_state(dsn, run, RunState.FINISHED)
    assert len(posted(products, "messaging", "/v1/messages")) == 1
    receipts = posted(products, "messaging", "/v1/messages/receipt")
    assert [(r["key"], r["bodySha256"]) for r in receipts] == [
        (posts[0]["key"], posts[0]["bodySha256"])  # the original key and body, resent
    ]
    assert products.ledger("messaging")["applied"] == {posts[0]["key"]: 1}
    # The step completed with the receipt of the message Messaging accepted.
    output = service.status(run)["output"]
    assert output == {"messageId": message_at(products, output["messageId"])}
    reconciled = next(e for e in events(dsn, run) if e["kind"] == "reconciled")
    assert reconciled["actor"] == "local-developer"
    assert reconciled["detail"]["reason"] == "ticket OPS-12: the product was slow"


def test_retry_same_resends_identical_bytes_and_key(dsn: str, services: Services) -> None:
    settings = {"requestTimeout": "PT1S", **UNASKED}
    service, products = services.deploy(["act"], {"registry": ("breg", settings)})
    products.faults(
        "breg",
        {  # the action itself, not the reading of its target's condition before it
            "match": "POST /v1/actions/mark-reviewed$",
            "mode": "hang-after-apply",
            "seconds": 30,
            "times": 1,
        },
    )
    run = service.start_run("act", {"recordId": records(1)[0]})
    wait_state(dsn, run, RunState.HELD)
    no_receipt = service.http.post(f"/v1/runs/{run}/reconcile", json={"reason": "check"})
    assert no_receipt.status_code == 409
    assert no_receipt.json()["code"] == "run.no-receipt"
    response = service.http.post(
        f"/v1/runs/{run}/retry-same", json={"reason": "BReg confirmed nothing is pending"}
    )
    assert response.status_code == 200, response.text
    wait_state(dsn, run, RunState.FINISHED)
    posts = posted(products, "breg", "/v1/actions/mark-reviewed")
    applied = products.ledger("breg")["applied"]
    assert len(posts) == 2
    assert posts[0]["key"] == posts[1]["key"] == f"coordinator:{run}:invoke"
    assert posts[0]["bodySha256"] == posts[1]["bodySha256"]
    assert applied == {posts[0]["key"]: 1}  # the product's idempotency answered the resend
    rows = sendings(dsn, run)
    assert [r["attempt"] for r in rows] == [1, 2]
    assert rows[0]["body"] == rows[1]["body"]
    assert [r["outcome"] for r in rows] == ["lost", "response"]


def test_a_refused_resend_after_a_lost_answer_holds_and_reconcile_finds_the_first(
    dsn: str, services: Services
) -> None:
    """Messaging authorizes and renders an exact retry again before it looks up its key,
    so a 422 to a resend does not say the first sending failed: the run is held, not
    failed, and the receipt of the original key finds the message the first one queued."""
    settings = {"requestTimeout": "PT1S", **UNASKED}
    service, products = services.deploy(["notify"], {"notices": ("messaging", settings)})
    lost = {"match": "POST /v1/messages$", "mode": "hang-after-apply", "seconds": 30, "times": 1}
    products.faults("messaging", lost)
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, run, RunState.HELD)
    products.faults("messaging", {"match": "POST /v1/messages$", "mode": "status", "status": 422})
    resent = service.http.post(f"/v1/runs/{run}/retry-same", json={"reason": "resend it"})
    assert resent.status_code == 200, resent.text
    wait_for(
        dsn,
        "SELECT count(*) FROM executions WHERE run_id = %s AND outcome = 'response'",
        1,
        params=(run,),
    )
    wait_state(dsn, run, RunState.HELD)
    held = run_state(dsn, run)
    assert held["hold_code"] == "outcome-unknown"
    assert held["detail"].startswith("the product refused this resend, but an earlier")
    products.faults("messaging")
    found = service.http.post(f"/v1/runs/{run}/reconcile", json={"reason": "look it up"})
    assert found.status_code == 200, found.text
    wait_state(dsn, run, RunState.FINISHED)
    posts = posted(products, "messaging", "/v1/messages")
    assert len(posts) == 2 and posts[1]["status"] == 422  # the first hangs, having applied
    assert products.ledger("messaging")["applied"] == {posts[0]["key"]: 1}
    output = service.status(run)["output"]
    assert output == {"messageId": message_at(products, output["messageId"])}


def test_sigkill_while_a_mutation_is_in_flight_holds_it_on_restart(
    dsn: str, tmp_path: Path
) -> None:
    config, port = bound_to_one(
        tmp_path, dsn, "notify", "notices", "messaging", UNASKED, lease="PT2S"
    )
    log = tmp_path / "service.log"
    with stand_ins(tmp_path / "standins.log", {"messaging": port}) as products:
        products.faults("messaging", {"match": "POST /v1/messages", "mode": "delay", "seconds": 20})
        service = Service(config, log).wait_listening()
        run = service.start_run("notify", {"email": "a@example.org"})
        products.wait_in_flight("messaging")
        service.kill()
        products.faults("messaging")
        with running(config, log):
            wait_state(dsn, run, RunState.HELD, timeout=30)
            time.sleep(1)
            posts = posted(products, "messaging", "/v1/messages")
    assert len(posts) == 1
    state = run_state(dsn, run)
    assert state["hold_code"] == "dispatch-interrupted"
    # The holder after the restart found the call dispatched with no answer recorded.
    assert kinds(dsn, run) == ["admitted", "call-dispatched", "call-lost", "held"]


def test_401_holds_422_fails_and_503_waits_its_retry_after(dsn: str, services: Services) -> None:
    service, products = services.deploy(["notify"], {"notices": ("messaging", {})})
    products.faults("messaging", {"match": "POST", "mode": "status", "status": 401, "times": 1})
    forbidden = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, forbidden, RunState.HELD)
    products.faults("messaging", {"match": "POST", "mode": "status", "status": 422, "times": 1})
    refused = service.start_run("notify", {"email": "b@example.org"})
    wait_state(dsn, refused, RunState.FAILED)
    products.faults(
        "messaging",
        {"match": "POST", "mode": "status", "status": 503, "retryAfter": 2, "times": 1},
    )
    busy = service.start_run("notify", {"email": "c@example.org"})
    wait_state(dsn, busy, RunState.FINISHED)
    assert run_state(dsn, forbidden)["hold_code"] == "product-forbidden"
    assert run_state(dsn, refused)["failure_code"] == "product-refused"
    history = events(dsn, busy)
    dispatched = [e["at"] for e in history if e["kind"] == "call-dispatched"]
    assert len(dispatched) == 2
    waited = dispatched[1] - dispatched[0]
    assert waited >= timedelta(seconds=2), waited  # not before the product's Retry-After


def test_a_pool_of_4_never_has_more_than_4_open_while_others_flow(
    dsn: str, services: Services
) -> None:
    """BReg holds every read until the test lets them go: 50 runs' reads queue behind the
    4 its pool opens, and 10 runs calling Messaging finish meanwhile, none of them behind
    BReg's queue (nothing at BReg can finish while they do). Counts and order, no clock:
    a loaded machine changes how long each part takes, not what happens."""
    connections = {"records": ("breg", {"poolSize": 4}), "notices": ("messaging", {"poolSize": 4})}
    service, products = services.deploy(["lookup", "notify"], connections, workers=4)
    products.faults("breg", {"match": "GET", "mode": "hold", "seconds": 300})
    slow_runs = [service.start_run("lookup", {"recordId": r}) for r in records(50)]
    products.wait_in_flight("breg", 4)
    fast_runs = [service.start_run("notify", {"email": f"{n}@example.org"}) for n in range(10)]
    for run in fast_runs:
        wait_state(dsn, run, RunState.FINISHED, timeout=60)
    held = [run_state(dsn, r)["state"] for r in slow_runs]
    assert held == [RunState.RUNNING] * 50, held  # every read still held at BReg
    assert products.ledger("breg")["maxInFlight"] == 4
    products.faults("breg")  # let them go
    for run in slow_runs:
        wait_state(dsn, run, RunState.FINISHED, timeout=120)
    assert products.ledger("breg")["maxInFlight"] == 4  # never more, as the queue drained


def test_sigterm_during_20_calls_exits_within_grace_and_restart_resolves(
    dsn: str, tmp_path: Path
) -> None:
    config, port = bound_to_one(
        tmp_path,
        dsn,
        "lookup",
        "records",
        "breg",
        {"poolSize": 30},
        workers=4,
        grace="PT2S",
        lease="PT2S",
    )
    log = tmp_path / "service.log"
    with stand_ins(tmp_path / "standins.log", {"breg": port}) as products:
        products.faults("breg", {"match": "GET", "mode": "delay", "seconds": 30})
        service = Service(config, log).wait_listening()
        runs = [service.start_run("lookup", {"recordId": r}) for r in records(20)]
        products.wait_in_flight("breg", 20)
        stopping = time.monotonic()
        assert service.stop() == 0  # within the harness's 20 s: the calls would take 30
        took = time.monotonic() - stopping
        print(f"SIGTERM with 20 calls in flight: exited after {took:.2f} s (grace 2 s)")
        with sync_connection(dsn) as conn:
            states = conn.execute(
                "SELECT state, dispatched_at IS NULL AS settled, count(*) AS n "
                "FROM runs GROUP BY 1, 2"
            ).fetchall()
        assert states == [{"state": RunState.RUNNING, "settled": True, "n": 20}], states
        products.faults("breg")
        with running(config, log):
            for run in runs:
                wait_state(dsn, run, RunState.FINISHED, timeout=30)
    for run in runs:
        history = events(dsn, run)
        settled = [e for e in history if e["kind"] == "retry-scheduled"]
        assert "stopped during the call" in settled[0]["detail"]["detail"]
