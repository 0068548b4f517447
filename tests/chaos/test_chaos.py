"""Fault injection: the promise that nothing is lost and nothing is sent twice on a guess.

Each scenario prints one row of the summary table: faults injected, runs, finished,
held (and why), lost (must be 0) and duplicate sends (must be 0). Duplicate sends
are counted from the stand-in products' own ledgers: a mutation that took effect more
than once, or was sent again on a guess — its idempotency key received again after a
sending that may have acted, other than as its product's documented recovery. After an
unknown outcome Coordinator asks the product what became of the call: Messaging on its
receipt route (a read: the submission itself is never sent again), Casework by the
identical request under the same key, which it answers with the original acceptance
and never acts on twice. Such an identical resend is no second effect and no guess;
a changed one, or a submission sent again, is.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from registry_coordinator.store.database import sync_connection
from tests.support import (
    ASKING,
    CALLED,
    CASEWORK_POOL,
    HEADER,
    MESSAGING_POOL,
    MUTATIONS,
    PARAMETERS,
    SLEPT,
    STANDIN_TOKEN,
    Cluster,
    Service,
    Services,
    StandIns,
    completion_request,
    connection,
    decide,
    final_states,
    free_port,
    mutations_seen,
    oauth2,
    put_to_sleep,
    run_state,
    sent,
    stand_ins,
    start_runs,
    summary,
    unanswered,
    unanswered_requests,
    until,
    wait_answered,
    wait_for,
    wait_ready,
    wait_state,
)


def wait_settled(dsn: str, timeout: float = 90) -> None:
    """Until every run has ended or is held for an operator."""
    wait_for(
        dsn, "SELECT count(*) FROM runs WHERE ended_at IS NULL AND state <> 'held'", 0, timeout
    )


#: The kills (of 20) that land inside dispatch windows, by the product that holds every
#: mutation back meanwhile: the kill comes once that product has a full pool of them in
#: flight (Casework's review requests, or Messaging's submissions). The others land at
#: random moments.
IN_DISPATCH = {3: "casework", 7: "messaging", 11: "casework", 15: "messaging", 19: "casework"}
POOLS = {"casework": CASEWORK_POOL, "messaging": MESSAGING_POOL}


def test_crash_loop_twenty_kills_two_mutations(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    """200 runs of two mutations, ten admitted before each of 20 SIGKILLs. Five kills land
    while mutations are known to be in flight (the products' ledgers show them, held back
    by a delay): each cuts off a full pool of them unanswered, three at Casework and two
    at Messaging. After each restart
    the engine asks the products what became of every call a kill cut off, before it holds
    a run: Casework by the identical request under the same key (the original never took
    effect, so the first resend answered does, once: the run finishes), Messaging for its
    receipt (none matches a submission cut off unanswered, so the run is held
    ``outcome-unknown`` after the askings, its submission received once, never again).
    Every other run finishes with each mutation applied once (a kill between a dispatch
    and the recording of its answer is resolved by the same askings), or is held where
    the askings could not confirm its call; no mutation takes effect twice, and none is
    sent again on a guess.

    Without the known kills, random ones almost never land inside a millisecond-long
    dispatch, so a service that resent mutations after a crash would pass unnoticed.
    """
    print("\n" + HEADER)
    casework, messaging = free_port(), free_port()
    connections = {
        "reviews": connection("casework", casework, **ASKING),
        "notices": connection("messaging", messaging, **ASKING),
    }
    config = services.configure(["two-mutations"], lease="PT2S", workers=4, connections=connections)
    chance = random.Random(20261129)
    cut_at: dict[int, Counter[str]] = {}  # kill -> by product, the requests it cut off
    seen: set[tuple[str, str, float]] = set()  # requests found unanswered at a kill
    routes = {product: path for product, path, _ in MUTATIONS}
    with stand_ins(
        tmp_path / "standins.log", {"casework": casework, "messaging": messaging}
    ) as products:
        service = services.start(config)
        admitted = 0
        for kill in range(20):
            held_back = IN_DISPATCH.get(kill)
            if held_back is not None:  # the mutations themselves, not Messaging's receipts
                delay = {"match": f"POST {routes[held_back]}$", "mode": "delay", "seconds": 60}
                products.faults(held_back, delay)
            admitted += start_runs(service, 10, f"crash-{kill}")
            if held_back is not None:
                wait_full_pool(products, held_back, seen)
            else:
                time.sleep(chance.uniform(0.05, 0.6))
            service.kill()
            now_unanswered = set(unanswered_requests(products))
            cut_at[kill] = Counter(product for product, _, _ in now_unanswered - seen)
            seen |= now_unanswered
            if held_back is not None:
                products.faults(held_back)  # the rest are answered at once
            service = services.start(config)
        wait_settled(dsn)
        service.stop()
        row = summary("crash loop (SIGKILL)", dsn, admitted, 20, products)
        received, applied = mutations_seen(products)
        asked = receipts_asked(products)
        cut_off = {key for _, key, _ in unanswered_requests(products)}
    # Each known kill cut off exactly a full pool of the mutations held back in flight.
    known = {kill: cut_at[kill][product] for kill, product in IN_DISPATCH.items()}
    assert known == {kill: POOLS[product] for kill, product in IN_DISPATCH.items()}, cut_at
    with sync_connection(dsn) as conn:
        runs = {
            str(r["id"]): r
            for r in conn.execute("SELECT id, state, step, hold_code, detail FROM runs").fetchall()
        }
        steps = {
            (str(r["run_id"]), r["step"]): r["kinds"]
            for r in conn.execute(
                "SELECT run_id, step, array_agg(kind ORDER BY seq) AS kinds FROM run_events "
                "GROUP BY run_id, step"
            ).fetchall()
        }
    resolved = held_at_ask = 0
    for key in cut_off:
        _, run, step = key.split(":")
        found = runs[run]
        if step == "tell":  # asked for its receipt, which none matches: held, never resent
            assert (found["state"], found["step"], found["hold_code"]) == (
                "held",
                "tell",
                "outcome-unknown",
            ), (key, found)
            assert "asked the product for its receipt 3 times" in found["detail"], found
            # found dispatched by the next holder: lost (no answer recorded), then its
            # receipt asked for three times, and held
            assert steps[(run, "tell")] == ["call-dispatched", "call-lost"] + [
                "verify-scheduled",
                "receipt-looked-up",
            ] * 3 + ["held"], (key, steps[(run, "tell")])
            assert received[key] == 1 and applied[key] == 0, key
            answers = [status for status in asked[key] if status is not None]
            assert len(answers) >= 3 and set(answers) == {409}, (key, asked[key])
        elif found["state"] == "finished":  # asked by the identical request: acted on once
            assert received[key] >= 2 and applied[key] == 1, key
            kinds = [kind for kind in steps[(run, "ask")] if kind != "admitted"]
            assert kinds[:3] == ["call-dispatched", "call-lost", "verify-scheduled"], kinds
            assert kinds[-3:] == ["call-dispatched", "call-answered", "step-completed"], kinds
            resolved += 1
        else:  # every identical resend cut off by a kill too: held at the ask
            assert (found["state"], found["step"]) == ("held", "ask"), (key, found)
            assert found["hold_code"] in ("dispatch-interrupted", "outcome-unknown"), found
            assert applied[key] <= 1, key
            held_at_ask += 1
    for run, found in runs.items():
        ask, tell = f"coordinator:{run}:ask", f"coordinator:{run}:tell"
        if found["state"] == "finished":  # each mutation applied once
            assert applied[ask] == applied[tell] == 1, run
        elif found["step"] == "tell":  # no receipt confirmed it: Messaging never acted
            assert found["hold_code"] == "outcome-unknown", found
            assert received[tell] <= 1 and applied[tell] == 0, run
    held = row["states"]["held"]
    print(
        f"{len(cut_off)} mutations cut off unanswered ({sum(known.values())} at the "
        f"{len(IN_DISPATCH)} known kills), {resolved} of them confirmed by the identical "
        f"request; {held} runs held ({held_at_ask} at a review request), "
        f"{row['states']['finished']} finished"
    )
    assert set(row["holds"]) <= {"dispatch-interrupted", "outcome-unknown"}, row["holds"]
    assert row["states"]["finished"] + held == admitted


def wait_full_pool(products: StandIns, product: str, seen: set[tuple[str, str, float]]) -> None:
    """Until ``product`` holds a full pool of Coordinator's mutations unanswered, but those
    already found unanswered at an earlier kill (cut off then, never to be answered)."""

    def in_flight() -> bool | None:
        held = set(unanswered_requests(products)) - seen
        return sum(r[0] == product for r in held) >= POOLS[product] or None

    until(in_flight, f"a full pool of mutations in flight at {product}")


def receipts_asked(products: StandIns) -> dict[str, list[int | None]]:
    """By idempotency key, what Messaging answered each lookup of a submission's receipt
    (None: the lookup was cut off unanswered)."""
    asked: dict[str, list[int | None]] = {}
    for request in products.requests("messaging", "POST", "/v1/messages/receipt"):
        asked.setdefault(request["key"], []).append(request.get("status"))
    return asked


DECIDED = [
    "admitted",
    "waiting",
    "result-delivered",
    "result-read",
    "step-completed",
    "finished",
]


def test_database_restart_under_load(cluster: Cluster, dsn: str, services: Services) -> None:
    """PostgreSQL is stopped and started again while the service has runs in every state:
    mutations in flight at Casework (held back there), runs waiting for a review decision,
    runs asleep at a wait-until not yet due, and a thousand wait-untils come due at once,
    some finished, many not yet taken. Each state is counted at the moment of the stop and
    must be non-empty.

    While the database is down the products answer the calls in flight: an answer in hand
    is recorded once the database is back, so each of those runs finishes, its mutation
    received and applied once. The runs waiting for a decision resume when it is made,
    the sleepers and the due ones wake and finish, each history exactly as without the
    outage. The one kind of run that may rightly be held is one whose dispatch the stop
    cut off, its commit unknown: a mutation sealed and never sent, so none of those
    reached a product. Its product is asked about it first (Casework by the identical
    request, which then takes effect once, and the run finishes; Messaging for a receipt,
    which none matches), and only a run whose call no asking confirmed is held
    (``dispatch-interrupted``, or ``outcome-unknown`` after Messaging's receipts). The
    lease (30 s) outlasts the outage and the service's reconnection, so no claim on a call
    in flight is lost meanwhile: 15 s did not, once, beside two CPU hogs.
    """
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", ASKING),
        "notices": ("messaging", ASKING),
    }
    workflows = ["two-mutations", "await-review", "timed-choice"]
    service, products = services.deploy(
        workflows, connections, webhooks=True, workers=4, lease="PT30S"
    )
    reviews = [products.review() for _ in range(10)]  # left undecided, for now
    for key in reviews:
        service.start_run("await-review", {"requestId": key}, key=key)
    wait_for(dsn, "SELECT count(*) FROM waits", len(reviews))
    put_to_sleep(dsn, 20, timedelta(seconds=6), prefix="asleep")  # still, at the stop
    products.faults(
        "casework", {"match": "POST /v1/review-requests", "mode": "delay", "seconds": 5}
    )
    admitted = len(reviews) + 20 + start_runs(service, CASEWORK_POOL, "calling")
    products.wait_in_flight("casework", CASEWORK_POOL)
    # Due before the stop: half of them the timer's to take on in batches, half the workers'
    # (as runs that fell asleep before schema 5), so that hundreds are still due at the stop.
    put_to_sleep(dsn, 1000, timedelta(seconds=0.3), prefix="burst", unbatched_every=2)
    admitted += 1000
    at_stop = every_state(dsn)
    in_flight = set(unanswered(products))
    with cluster.down():
        wait_ready(service, 503)  # it reports the outage
        wait_answered(products, in_flight)  # answers in hand while the database is down
    products.faults("casework")
    wait_ready(service, 200)
    for key in reviews:
        decide(products, key)
    admitted += start_runs(service, 50, "after")
    wait_settled(dsn)
    assert service.process.poll() is None  # it survived
    row = summary("database restart", dsn, admitted, 1, products)
    received, applied = mutations_seen(products)
    print({state: len(runs) for state, runs in at_stop.items()})
    assert len(at_stop["mid-call"]) == CASEWORK_POOL
    assert len(at_stop["awaiting a result"]) == len(reviews)
    assert len(at_stop["asleep"]) == 20
    assert len(at_stop["due"]) >= 200
    # Every request in flight at the stop is a mid-call run's; one may have been answered
    # (its 5 s delay over) between the count and the stop, on a loaded machine.
    assert in_flight and in_flight <= {f"coordinator:{run}:ask" for run in at_stop["mid-call"]}
    ended = final_states(dsn)
    for run in at_stop["mid-call"]:  # answered during the outage: recorded, and went on
        assert ended[run][:2] == ("finished", "done"), ended[run]
        assert ended[run][2] == CALLED, ended[run]
        for step in ("ask", "tell"):
            assert received[f"coordinator:{run}:{step}"] == 1, (run, step)
            assert applied[f"coordinator:{run}:{step}"] == 1, (run, step)
    for run in at_stop["awaiting a result"]:
        assert ended[run] == ("finished", "decided", DECIDED), ended[run]
    for run in at_stop["asleep"] | at_stop["due"]:
        assert ended[run] == ("finished", "no", SLEPT), ended[run]
    held = [run for run, (state, _, _) in ended.items() if state == "held"]
    for run in held:  # cut off in its dispatch: sealed, never sent, and never took effect
        step = run_state(dsn, run)["step"]
        assert received[f"coordinator:{run}:{step}"] == 0, (run, step)
        assert applied[f"coordinator:{run}:{step}"] == 0, (run, step)
    assert set(row["holds"]) <= {"dispatch-interrupted", "outcome-unknown"}, row["holds"]
    assert row["states"]["finished"] == admitted - len(held)
    print(f"{len(held)} runs held, their dispatch cut off by the stop")


def every_state(dsn: str, timeout: float = 30) -> dict[str, set[str]]:
    """The unended runs by state, once every state the restart must hit has runs: calls in
    flight, waits for a result, wait-untils not yet due, and runs due that no worker holds
    yet (at least 200 of those, so that some are left when the stop lands) while others
    are being finished (the workers are busy)."""
    deadline = time.monotonic() + timeout
    with sync_connection(dsn) as conn:
        while True:
            rows = conn.execute(
                """
                SELECT id::text AS id,
                       ended_at IS NULL AND dispatched_at IS NOT NULL AS "mid-call",
                       EXISTS (SELECT 1 FROM waits w WHERE w.run_id = r.id)
                           AS "awaiting a result",
                       state = 'waiting' AND wakes_to IS NOT NULL
                           AND timer_at > clock_timestamp() AS asleep,
                       ended_at IS NULL AND due_at <= clock_timestamp()
                           AND lease_token IS NULL AS due,
                       ended_at IS NOT NULL AS ended
                FROM runs r
                """
            ).fetchall()
            states = {
                state: {r["id"] for r in rows if r[state]}
                for state in ("mid-call", "awaiting a result", "asleep", "due", "ended")
            }
            if all(states.values()) and len(states["due"]) >= 200:
                return states
            assert time.monotonic() < deadline, {k: len(v) for k, v in states.items()}
            time.sleep(0.01)


def test_two_processes_under_load_do_no_step_twice(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    """Two service processes on one database and the same products take 200 runs between
    them; one is killed mid-load and started again. No step completes twice in any run,
    and no mutation takes effect twice or is sent again on a guess: a call the kill cut
    off is asked about (by the identical request at Casework, for a receipt at
    Messaging) before its run is held."""
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", ASKING),
        "notices": ("messaging", ASKING),
    }
    first, products = services.deploy(["two-mutations"], connections, workers=3, lease="PT2S")
    settings = json.loads(first.config.read_text())
    settings["listen"]["port"] = free_port()
    other = tmp_path / "second.yaml"
    other.write_text(json.dumps(settings))
    log = tmp_path / "second.log"
    second = services.start(other, log)
    for n in range(200):
        (first, second)[n % 2].start_run("two-mutations", {"id": f"pair-{n}"}, f"pair-{n}")
    second.kill()
    second = services.start(other, log)
    wait_settled(dsn)
    row = summary("two processes (1 SIGKILL)", dsn, 200, 1, products)
    assert set(row["holds"]) <= {"dispatch-interrupted", "outcome-unknown"}, row["holds"]
    _, applied = mutations_seen(products)
    with sync_connection(dsn) as conn:
        for run in conn.execute("SELECT id::text AS id, state FROM runs").fetchall():
            if run["state"] == "finished":  # each mutation took effect once
                for step in ("ask", "tell"):
                    assert applied[f"coordinator:{run['id']}:{step}"] == 1, (run, step)
    with sync_connection(dsn) as conn:
        twice = conn.execute(
            "SELECT run_id, step FROM run_events WHERE kind = 'step-completed' "
            "GROUP BY run_id, step HAVING count(*) > 1"
        ).fetchall()
        actors = conn.execute(
            "SELECT count(DISTINCT actor) AS n FROM run_events WHERE kind = 'step-completed'"
        ).fetchone()
    assert twice == []
    assert actors is not None and actors["n"] >= 2, "both processes should have done steps"


def test_product_outage_and_hangs(dsn: str, services: Services) -> None:
    """Messaging keeps ten submissions and never answers them (hangs after applying), then
    Casework answers 503 to thirty requests, then Messaging hangs on five more while its
    receipt route fails. An answer that never came is an unknown outcome, and Messaging
    keeps receipts: the engine asks for the receipt of each (the original key and body,
    on the receipt route), and the first ten runs finish with what the receipts confirm;
    the 503s say Casework did not act, and are retried until those runs finish; the last
    five, whose receipts no asking could have, are held ``outcome-unknown`` for an
    operator. No submission is ever sent twice: every one was applied once, by its one
    sending."""
    connections = {
        "reviews": ("casework", {}),
        "notices": ("messaging", {"requestTimeout": "PT1S", **ASKING}),
    }
    service, products = services.deploy(["two-mutations"], connections, workers=4)
    hang = {"match": "POST /v1/messages$", "mode": "hang-after-apply", "seconds": 5}
    products.faults("messaging", {**hang, "times": 10})
    admitted = start_runs(service, 60, "hang")
    wait_settled(dsn)
    products.faults(
        "casework",
        {"match": "POST", "mode": "status", "status": 503, "retryAfter": 1, "times": 30},
    )
    admitted += start_runs(service, 40, "busy")
    wait_settled(dsn)
    confirmed = hung(dsn)
    assert len(confirmed) == 10
    receipts_down = {"match": "POST /v1/messages/receipt$", "mode": "status", "status": 500}
    products.faults("messaging", {**hang, "times": 5}, receipts_down)
    admitted += start_runs(service, 20, "unconfirmed")
    wait_settled(dsn)
    row = summary("product hangs and 503s", dsn, admitted, 45, products)
    unconfirmed = hung(dsn) - confirmed
    assert len(unconfirmed) == 5
    # The hangs that receipts confirmed finished; the others are held, their outcome
    # unknown to Coordinator (Messaging did act on each), after asking for the receipts.
    assert row["holds"] == Counter({"outcome-unknown": 5})
    assert row["states"]["finished"] == admitted - 5
    received, applied = mutations_seen(products)
    asked = receipts_asked(products)
    for key in confirmed | unconfirmed:
        assert received[key] == 1 and applied[key] == 1, key  # one sending, applied once
    for key in confirmed:
        assert asked[key][-1] == 200, (key, asked[key])
        _, run, _ = key.split(":")
        assert run_state(dsn, run)["state"] == "finished"
    for key in unconfirmed:
        assert asked[key] == [500, 500, 500], (key, asked[key])
        _, run, _ = key.split(":")
        found = run_state(dsn, run)
        assert (found["state"], found["step"]) == ("held", "tell"), found
        assert "asked the product for its receipt 3 times" in found["detail"], found
    # The 503s were retried: those review requests were each sent until one was answered.
    busy = [r for r in sent(products, "casework", "/v1/review-requests") if r["status"] == 503]
    assert len(busy) == 30


def hung(dsn: str) -> set[str]:
    """The submissions whose answer never came (the run recorded its call lost), by their
    idempotency keys."""
    with sync_connection(dsn) as conn:
        rows = conn.execute(
            "SELECT DISTINCT run_id::text AS run FROM run_events "
            "WHERE kind = 'call-lost' AND step = 'tell'"
        ).fetchall()
    return {f"coordinator:{r['run']}:tell" for r in rows}


def test_webhook_storm_resumes_each_run_once(dsn: str, services: Services) -> None:
    """150 runs wait for Casework review results, whose ``review.completed`` events come as
    a storm to the route Casework's outbox pushes them to (authenticated as it sends them:
    the destination's secret as a bearer token): three events naming each review (its own,
    with the event id Casework's feed lists for it, and two more), shuffled, a third of the
    reviews' events before their runs exist, the rest each sent twice once their runs
    wait. Every delivery is acknowledged with an empty 204; each run reads its result and
    resumes exactly once. Casework's feed names the same events, but is read again only
    ten minutes after the service's start (``feedPoll``): the storm wakes the runs."""
    completions = {"secret": "env:STANDIN_WEBHOOK_SECRET"}
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", {"completions": completions, "feedPoll": "PT10M"})
    }
    service, products = services.deploy(["await-review"], connections, workers=4)
    keys = products.decided_reviews(150, "application-review")
    listed = completion_events(products)
    assert set(listed) == set(keys)
    early, late = keys[:50], keys[50:]
    deliveries = [
        (key, listed[key] if copy == 0 else str(uuid.uuid4())) for key in keys for copy in range(3)
    ]
    random.Random(7).shuffle(deliveries)

    def deliver(key: str, event: str) -> None:
        response = service.http.post(**completion_request(key, event_id=event))
        assert (response.status_code, response.content) == (204, b""), response.text

    for key, event in deliveries:  # early ones: before their runs exist
        if key in early:
            deliver(key, event)
    runs = {key: service.start_run("await-review", {"requestId": key}) for key in keys}
    for key in late:
        wait_state(dsn, runs[key], "waiting")
    for key, event in deliveries:  # the rest: every one three times, out of order
        if key in late:
            deliver(key, event)
            deliver(key, event)  # and again, the same event
    wait_settled(dsn)
    row = summary("webhook storm", dsn, len(keys), len(early) * 3 + len(late) * 6)
    assert row["states"] == Counter({"finished": len(keys)})
    with sync_connection(dsn) as conn:
        resumed = conn.execute(
            "SELECT run_id, count(*) AS n FROM run_events WHERE kind = 'step-completed' "
            "AND step = 'wait' GROUP BY run_id"
        ).fetchall()
    assert len(resumed) == len(keys)
    assert {r["n"] for r in resumed} == {1}
    outputs = {service.status(run)["output"]["decision"] for run in runs.values()}  # sealed
    assert outputs == {"approved"}  # each as read from Casework
    read = {r["path"] for r in products.requests("casework", "GET", "/v1/review-requests/")}
    assert read == {f"/v1/review-requests/{key}/result" for key in keys}


def completion_events(products: StandIns) -> dict[str, str]:
    """The event id of each completion on Casework's result feed, by request id, read as
    Coordinator reads it (its token and requester profile), page after page."""
    headers = {
        "Authorization": f"Bearer {STANDIN_TOKEN}",
        "Registry-Casework-Profile": PARAMETERS["casework"]["profile"],
    }
    events: dict[str, str] = {}
    query: dict[str, str | int] = {"limit": 100}
    with httpx.Client(base_url=products.url("casework"), headers=headers) as casework:
        while True:
            page = casework.get("/v1/review-results", params=query)
            assert page.status_code == 200, page.text
            events |= {item["requestId"]: item["eventId"] for item in page.json()["items"]}
            if "nextCursor" not in page.json():
                return events
            query = {"limit": 100, "cursor": page.json()["nextCursor"]}


#: Faults of a hostile product, by stand-in, in the order each is met (each rule answers
#: ``times`` requests, then the next rule of that route takes over).
NAN_RECORD = (
    '{"data": {"recordIdentifier": "a", "revisionIdentifier": "r", '
    '"domainData": {"status": NaN}}, "meta": {}}'
)
DEEP = '{"id": "m", "status": "accepted", "d": ' + "[" * 20_000 + "]" * 20_000 + "}"
HOSTILE: dict[str, list[dict[str, Any]]] = {
    "breg": [
        {"match": "GET /v1/records", "mode": "status", "status": status, "times": 3}
        for status in (408, 423, 425)
    ]
    + [
        {"match": "GET /v1/records", "mode": "answer", "status": 200, "body": body, "times": 3}
        for body in (NAN_RECORD, DEEP)
    ],
    "casework": [
        {
            "match": "POST /v1/review-requests",
            "mode": "answer",
            "status": 201,
            "body": '{"requestId": "rev-\\u0000", "status": "open"}',
            "times": 2,
        },
        {"match": "POST /v1/review-requests", "mode": "status", "status": 408, "times": 2},
        {"match": "POST /v1/review-requests", "mode": "status", "status": 423, "times": 1},
        {"match": "POST /v1/review-requests", "mode": "status", "status": 425, "times": 1},
    ],
    "messaging": [
        {"match": "POST /v1/messages$", "mode": "answer", "status": 202, "body": DEEP, "times": 2}
    ],
    "idp": [{"match": "POST /oauth2/token", "mode": "delay", "seconds": 2, "times": 1}],
}


def test_a_hostile_product(dsn: str, services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """29 runs of the tutorial's workflow against products that answer 408, 423 and 425,
    JSON with NaN, a NUL or 20,000 levels of nesting, push completions of reviews that are
    still pending, and hand out tokens slowly; a run of a record read names the record "..",
    and the tutorial's workflow refuses it at admission. Every run ends finished, held with
    its true reason, or (the "..") failed before anything was sent. Every read retried was
    retried because of a fault. A review request answered 408, 423 or 425 may have been
    acted on: Coordinator asks Casework by the identical request under the same key, which
    it acts on once, and the run goes on; an answer that cannot be used holds the run.
    Every mutation took effect once, by one sending or its identical resend, and every
    pending result was read once per completion pushed."""
    idp = free_port()
    monkeypatch.setenv("STANDIN_CLIENT_SECRET", "s3cret-for-tests")
    identity = oauth2(idp, clientSecret="env:STANDIN_CLIENT_SECRET")
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "applications": ("breg", {}),
        "records": ("breg", {}),
        "reviews": ("casework", {}),
        "notices": ("messaging", {"identity": identity}),
    }
    service, products = services.deploy(
        ["review-application", "lookup"],
        connections,
        webhooks=True,
        also={"idp": idp},
        workers=4,
    )
    for product, rules in HOSTILE.items():
        products.faults(product, *rules)
    runs = [
        service.start_run("review-application", {"applicationId": f"{RECORDS}{n:012d}"})
        for n in range(29)
    ]
    refused = service.http.post(
        "/v1/runs",
        json={"workflow": "review-application", "input": {"applicationId": ".."}},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert (refused.status_code, refused.json()["code"]) == (422, "input.invalid")
    dots = service.start_run("lookup", {"recordId": ".."})
    wait_for(
        dsn,
        "SELECT count(*) FROM runs WHERE ended_at IS NULL AND state <> 'held' "
        "AND NOT (state = 'waiting' AND step = 'await_decision')",
        0,
        timeout=90,
    )
    with sync_connection(dsn) as conn:
        keys = [
            r["key"]
            for r in conn.execute(
                "SELECT key FROM waits WHERE step = 'await_decision' ORDER BY key"
            ).fetchall()
        ]
    for key in keys:  # a completion of a review still pending: one read, and the wait goes on
        pending(service, key)
    wait_for(dsn, "SELECT count(*) FROM run_events WHERE kind = 'result-delivered'", len(keys))
    until(
        lambda: len(results_read(products, 202)) == len(keys) or None,
        "each pending review read once",
    )
    for key in keys:
        decide(products, key)
    wait_settled(dsn)
    row = summary(
        "hostile product",
        dsn,
        len(runs) + 1,
        15 + 6 + 2 + 1 + 1,
        products,
        ended=frozenset({"finished", "held", "failed"}),
    )
    reads = products.requests("breg", "GET", "/v1/records/")
    results = Counter(r["path"] for r in results_read(products))
    sent_messages = sent(products, "messaging", "/v1/messages")
    assert row["holds"] == Counter({"response-invalid": 4})
    assert row["states"] == Counter({"finished": 25, "held": 4, "failed": 1})
    assert run_state(dsn, dots)["failure_code"] == "request-invalid"
    assert len(reads) == 29 + 15  # each unusable answer was read again once, nothing more
    assert all(".." not in r["path"] for r in products.ledger("breg")["requests"])
    assert set(results.values()) == {2}  # each review: its pending completion, its decision
    assert len(results) == len(keys) == 29 - 2
    assert len(sent_messages) == len(keys)
    received, applied = mutations_seen(products)
    with sync_connection(dsn) as conn:
        asked = {
            str(r["run_id"]): r["detail"]["detail"]
            for r in conn.execute(
                "SELECT run_id, detail FROM run_events WHERE kind = 'verify-scheduled'"
            ).fetchall()
        }
    # The answers that said nothing of what Casework did: each asked about once, by the
    # identical request, which Casework acted on (the faults had answered for it).
    assert Counter(why[:3] for why in asked.values()) == Counter({"408": 2, "423": 1, "425": 1})
    for run in asked:  # and the run went on with Casework's answer to it
        key = f"coordinator:{run}:request_review"
        assert (received[key], applied[key]) == (2, 1), key
        assert run_state(dsn, run)["step"] not in ("read_application", "request_review")
        assert run_state(dsn, run)["outputs"]["request_review"]["requestId"] in keys


#: The first groups of the applications' record ids (UUIDs, as BReg's are).
RECORDS = "00000000-0000-4000-8000-"


def results_read(products: StandIns, status: int | None = None) -> list[dict[str, Any]]:
    """Casework's answers to reads of review results (those of ``status``, if given)."""
    return [
        r
        for r in products.requests("casework", "GET", "/v1/review-requests/")
        if status is None or r.get("status") == status
    ]


def pending(service: Service, key: str) -> None:
    """A ``review.completed`` of a review Casework has not decided, pushed as Casework
    pushes one: it wakes the run, which reads the result and finds it pending."""
    response = service.http.post(**completion_request(key))
    assert (response.status_code, response.content) == (204, b""), response.text
