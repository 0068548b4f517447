"""Crashes and concurrency: SIGKILL at chosen points, kills while waiting, two processes.

After every scenario each run must reach the outcome its input determines, with a
history in which each step completed exactly once, in path order, and the
sequence numbers run 1, 2, 3... without a gap: nothing lost, nothing done twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from registry_coordinator.store import Holder
from registry_coordinator.store.database import QUERIES, sync_connection
from tests.support import (
    Cluster,
    Service,
    Services,
    connection,
    free_port,
    runs_opened,
    wait_for,
    write_config,
)

#: The chain workflow's path for an input n (steps completed, then the finish step).
EVEN = (["now", "parity", "even_pause", "even_check"], "even")
ODD = (["now", "parity", "odd_check", "odd_pause"], "odd")


def expected(n: int) -> tuple[list[str], str]:
    return EVEN if n % 2 == 0 else ODD


def check_chain_runs(dsn: str, minimum: int) -> dict[str, int]:
    """Every chain run finished as its input says, each step once; returns events by actor."""
    actors: dict[str, int] = {}
    runs = runs_opened(dsn, "input, state, outcome")
    with sync_connection(dsn) as conn:
        assert len(runs) >= minimum
        for run in runs:
            path, outcome = expected(run["input"]["n"])
            assert (run["state"], run["outcome"]) == ("finished", outcome), run
            events = conn.execute(
                "SELECT seq, kind, step, actor FROM run_events WHERE run_id = %s ORDER BY seq",
                (run["id"],),
            ).fetchall()
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), events
            completed = [e["step"] for e in events if e["kind"] == "step-completed"]
            assert completed == path, (run["input"], events)
            assert [e["kind"] for e in events].count("finished") == 1
            assert events[-1]["kind"] == "finished" and events[-1]["step"] == outcome
            assert events[0]["kind"] == "admitted"
            waits = [e["step"] for e in events if e["kind"] == "waiting"]
            assert len(waits) == len(set(waits)), events  # a wait is entered once
            for event in events[1:]:
                actors[event["actor"]] = actors.get(event["actor"], 0) + 1
    return actors


def wait_all_ended(dsn: str, timeout: float = 60) -> None:
    wait_for(dsn, "SELECT count(*) FROM runs WHERE ended_at IS NULL", 0, timeout)


def admit_until_dead(
    service: Service,
    count: int,
    workflow: str = "chain",
    input_of: Callable[[int], Any] = lambda n: {"n": n},
) -> list[str]:
    """Start runs until ``count`` are admitted or the service has killed itself; the ids
    of those it said it admitted. Only a broken connection means death: any answer but
    201 from a live service fails the test."""
    admitted = []
    for n in range(count):
        try:
            admitted.append(service.start_run(workflow, input_of(n)))
        except httpx.TransportError:
            break
    return admitted


@pytest.mark.parametrize("point", ["after-claim:3", "before-commit:4", "after-commit:6"])
def test_killed_at_a_chosen_point_every_run_still_finishes_once(
    point: str, dsn: str, services: Services
) -> None:
    config = services.configure(["chain"], lease="PT2S", workers=2)
    doomed = services.start(config, crash_at=point)
    admitted = len(admit_until_dead(doomed, 10))
    assert doomed.process.wait(30) == -9, "the crash point was never reached"
    with sync_connection(dsn) as conn:
        unfinished = conn.execute("SELECT count(*) AS n FROM runs WHERE ended_at IS NULL")
        assert (unfinished.fetchone() or {})["n"] > 0, "the kill left nothing to recover"
    services.start(config)
    wait_all_ended(dsn)
    check_chain_runs(dsn, minimum=admitted)  # every run the service said it admitted, and more


def test_killed_inside_a_transition_nothing_of_it_remains(dsn: str, services: Services) -> None:
    """Killed inside the transaction that begins a wait-for (the run's new state, its
    history event and its wait row are written, not committed): at the kill the database
    shows that transition wholly or not at all, and after restart each run waits, times
    out and finishes once, as if the kill never happened.

    The rows are read right after the kill, before a restart can repair anything: the
    wait times out after 2 s whatever happened, so a transition half committed (the run
    waiting, its ``waiting`` event written, no ``waits`` row) ends with the same history
    as a whole one, and only the rows at the kill tell the two apart. One worker takes
    the runs in order of admission, so the kill (the third pass through the transaction)
    lands in the third run's: the two before it wait, wholly, and the third is still
    claimed at the step it was killed in.
    """
    casework = connection("casework", free_port())  # never called: the waits time out
    config = services.configure(
        ["await-review-briefly"], lease="PT2S", workers=1, connections={"reviews": casework}
    )
    doomed = services.start(config, crash_at="mid-transition:3")
    runs = admit_until_dead(doomed, 6, "await-review-briefly", lambda n: {"requestId": f"rev-{n}"})
    assert doomed.process.wait(30) == -9, "the crash point was never reached"
    at_kill = transition_rows(dsn)
    assert len(at_kill) >= 3, at_kill
    for run in at_kill:
        whole = (run["state"], run["seq"], run["kinds"], run["waits"]) == (
            "waiting",
            2,
            ["admitted", "waiting"],
            1,
        )
        none = (run["state"], run["seq"], run["kinds"], run["waits"]) == (
            "running",
            1,
            ["admitted"],
            0,
        )
        assert whole or none, f"the transition is half committed: {run}"
    # In order of admission: two waited wholly before the kill; the third was killed in
    # its transaction and is still claimed, unmoved; the rest were never claimed.
    assert [(r["state"], r["claimed"]) for r in at_kill] == [
        ("waiting", False),
        ("waiting", False),
        ("running", True),
    ] + [("running", False)] * (len(at_kill) - 3), at_kill
    services.start(config)
    wait_all_ended(dsn)
    with sync_connection(dsn) as conn:
        ended = conn.execute("SELECT id, outcome FROM runs").fetchall()
        assert len(ended) == len(at_kill)
        assert set(runs) <= {str(run["id"]) for run in ended}  # no admitted run was lost
        for run in ended:
            assert run["outcome"] == "not-decided"
            events = conn.execute(
                "SELECT seq, kind FROM run_events WHERE run_id = %s ORDER BY seq", (run["id"],)
            ).fetchall()
            assert [e["kind"] for e in events] == [
                "admitted",
                "waiting",
                "step-completed",
                "finished",
            ], events
            assert [e["seq"] for e in events] == [1, 2, 3, 4]
        assert conn.execute("SELECT count(*) AS n FROM waits").fetchone() == {"n": 0}


def transition_rows(dsn: str) -> list[dict[str, Any]]:
    """Each run's row, history kinds and wait count as the database holds them, in order
    of admission: what a transition wrote, if it committed."""
    with sync_connection(dsn) as conn:
        return list(
            conn.execute(
                """
                SELECT r.id, r.state, r.seq, r.lease_token IS NOT NULL AS claimed,
                       (SELECT array_agg(e.kind ORDER BY e.seq) FROM run_events e
                        WHERE e.run_id = r.id) AS kinds,
                       (SELECT count(*) FROM waits w WHERE w.run_id = r.id) AS waits
                FROM runs r ORDER BY r.admitted_at, r.id
                """
            ).fetchall()
        )


def test_killed_while_runs_wait_they_resume_on_restart(dsn: str, services: Services) -> None:
    service = services(["timed-choice"])
    runs = [service.start_run("timed-choice", {"answer": "yes"}) for _ in range(6)]
    wait_for(dsn, "SELECT count(*) FROM runs WHERE state = 'waiting'", 6)
    service.kill()
    again = services.start(service.config)
    wait_all_ended(dsn)
    for run in runs:
        assert again.status(run)["outcome"] == "yes"
        kinds = [(e["kind"], e["step"]) for e in again.history(run)]
        assert kinds == [
            ("admitted", "pause"),
            ("waiting", "pause"),
            ("step-completed", "pause"),
            ("step-completed", "route"),
            ("finished", "said_yes"),
        ]


def test_sigkill_at_random_moments_loses_nothing(dsn: str, services: Services) -> None:
    config = services.configure(["chain"], lease="PT2S", workers=3)
    admitted = 0
    for delay in (0.05, 0.15, 0.3):
        service = services.start(config)
        for n in range(admitted, admitted + 15):
            service.start_run("chain", {"n": n})
        admitted += 15
        time.sleep(delay)
        service.kill()
    services.start(config)
    wait_all_ended(dsn)
    check_chain_runs(dsn, minimum=admitted)


def test_two_processes_share_500_runs_without_doing_a_step_twice(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    config = services.configure(["chain"], workers=3)
    other = write_config(tmp_path, dsn, ["chain"], workers=3)  # its database is migrated
    first = services.start(config, tmp_path / "a.log")
    second = services.start(other, tmp_path / "b.log")
    started = time.monotonic()
    for n in range(500):
        (first, second)[n % 2].start_run("chain", {"n": n})
    wait_all_ended(dsn, timeout=120)
    elapsed = time.monotonic() - started
    actors: dict[str, Any] = check_chain_runs(dsn, minimum=500)
    print(f"500 runs over two processes in {elapsed:.1f} s; events by process: {actors}")
    assert len(actors) == 2, actors
    assert min(actors.values()) > 0, actors  # both took part (how evenly is load's doing)


def test_a_restarted_process_takes_over_its_predecessors_claims_at_once(
    dsn: str, services: Services
) -> None:
    """Killed with reads in flight under a one-minute lease, the service restarted on the
    same host and port makes those runs due at once: they resend their reads and finish
    in seconds, not when the lease runs out."""
    connections: dict[str, tuple[str, dict[str, Any]]] = {"records": ("breg", {"poolSize": 8})}
    service, products = services.deploy(["lookup"], connections, lease="PT60S", workers=4)
    products.faults("breg", {"match": "GET /v1/", "mode": "delay", "seconds": 120})
    records = [f"00000000-0000-4000-8000-{n:012d}" for n in range(5)]  # BReg's UUID ids
    runs = [service.start_run("lookup", {"recordId": record}) for record in records]
    wait_for(dsn, "SELECT count(*) FROM runs WHERE dispatched_at IS NOT NULL", 5)
    service.kill()
    products.faults("breg")
    killed = time.monotonic()
    again = services.start(service.config, service.log)
    assert "took over 5 claims left by the previous process" in again.log.read_text()
    wait_all_ended(dsn, timeout=55)  # the claims' lease of 60 s has not run out
    took = time.monotonic() - killed
    assert {again.status(run)["outcome"] for run in runs} == {"found"}
    print(f"5 runs killed mid-read finished {took:.1f} s after the kill (lease 60 s)")


def test_claims_are_taken_over_only_when_no_session_of_their_holder_is_left(
    cluster: Cluster, dsn: str, services: Services
) -> None:
    """A predecessor that may be alive (a session of it is still connected) keeps its
    claims until their leases run out; once its last session is gone they are taken."""
    services.configure(["timed-choice"])
    predecessor, successor = Holder("host:8080"), Holder("host:8080")
    stranger = Holder("host:9090")
    assert predecessor.family == successor.family != stranger.family
    with sync_connection(dsn) as conn:
        conn.execute(
            """
            INSERT INTO definitions (digest, workflow_id, version, artifact)
            VALUES ('sha256:' || repeat('0', 64), 'x', '1', '');
            INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest, input,
                              state, step, seq, due_at, lease_owner, lease_token, admitted_at,
                              deadline_at, updated_at)
            VALUES (gen_random_uuid(), 'sha256:' || repeat('0', 64), 'x', 'c', 'k', 'x', '{}',
                    'running', 's', 1, now() + interval '1 minute', 'host:8080',
                    gen_random_uuid(), now(), now() + interval '1 hour', now());
            """
        )

    def take_over(holder: Holder) -> int:
        with sync_connection(dsn) as conn:
            params = {"owner": holder.name, "family": holder.family, "session": holder.session}
            return conn.execute(QUERIES["take_over_claims"], params).rowcount

    alive = psycopg.connect(dsn, application_name=predecessor.session)
    try:
        assert take_over(successor) == 0  # the predecessor may be alive
        assert take_over(stranger) == 0  # not its claims
    finally:
        alive.close()
    deadline = time.monotonic() + 10
    while (taken := take_over(successor)) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # until the server has ended the closed session
    assert taken == 1
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT due_at <= now() AS due FROM runs").fetchone()
    assert row == {"due": True}
