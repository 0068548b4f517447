"""Benchmarks: `just bench [NAME ...]`. Not part of the test suite.

Each benchmark prints its figures beside a reference measured in the same run on
the same machine (this machine is shared and noisy: compare ratios and medians,
not single absolute times). Everything runs for real: the embedded PostgreSQL 18,
`coordinator serve` and stand-in products as separate processes on loopback.

The benchmarks' own helpers are this checkout's (its src/ comes first); the processes they
start (`python -m registry_coordinator serve`, `migrate`, `stand-ins`) are whatever build
their PYTHONPATH finds: `PYTHONPATH=OTHER/src bench/run.py ...` measures another build's
service with these benchmarks (its workflow format must be this one's).

  throughput  runs of a four-step workflow, several worker counts, beside pgbench
  wake        webhook accepted -> next step committed, thousands of waiting runs
  timers      10,000 wait-untils due at one instant, in one second, over a minute
  idle        100,000 waiting runs beside 100: RSS, idle CPU, time to ready
  recovery    SIGKILL with 1,000 runs in flight, restarted on the same or another port
  console     the console's runs page beside the API listing
  chain       an event's hash chain on and off; checkpoints, verify and bundle size
  checkpoints throughput with signed checkpoints and without
  archiving   throughput while retention archives a backlog, and without
  client      one statement's CPU by database client: blocking, asyncio, trio-asyncio, threads
              (needs the `bench` extra too)
  peer        runs started through the API beside DBOS Transact 3.4 and the bare HTTP calls
              (needs the `bench` extra: pip install -e '.[bench]')
  custody     runs started through the API with their data sealed, and in clear
  erasure     the time to erase one data subject whose key sealed --runs ended runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

import httpx  # noqa: E402
import psutil  # noqa: E402
import trio  # noqa: E402
from bench.product import Product  # noqa: E402
from bench.profile import Profile, summary  # noqa: E402
from bench.support import (  # noqa: E402
    COMPLETIONS,
    PG_BIN,
    Cluster,
    Service,
    completion_delivery,
    connection,
    free_port,
    migrate,
    put_to_sleep,
    service,
    signing,
    stand_ins,
    wait_ended,
    wait_ready,
    wait_runs,
    write_config,
)
from bench.versus import custody as sealing  # noqa: E402
from bench.versus import erasure  # noqa: E402
from bench.versus import peer as side_by_side  # noqa: E402

from registry_coordinator.config import Rate, load_config  # noqa: E402
from registry_coordinator.engine.pacing import Pace  # noqa: E402
from registry_coordinator.store.database import QUERIES, sync_connection  # noqa: E402

PGBENCH = PG_BIN / "pgbench"


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1]}


def ms(value: float) -> str:
    return f"{value * 1000:.1f} ms"


#: bench-four's input for the n-th run: a record id as BReg's are, a canonical lowercase
#: UUID (breg.yaml's read-record refuses any other before it is sent).
RECORDS = "jsonb_build_object('recordId', md5('app-' || n)::uuid::text)"


def bulk_admit(dsn: str, workflow: str, count: int, inputs: str, due_in: float, step: str) -> None:
    """Admit ``count`` runs in one statement, all due ``due_in`` seconds from now.

    Admission through the API is measured elsewhere; here the engine starts from a
    queue of due runs, as it does after an outage.
    """
    with sync_connection(dsn) as conn:
        conn.execute(
            f"""
            WITH made AS (
                INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest,
                                  input, state, step, seq, due_at, admitted_at, deadline_at,
                                  updated_at)
                SELECT gen_random_uuid(), d.digest, d.workflow_id, 'bench', 'k' || n, 'x',
                       {inputs}, 'running', %(step)s, 1,
                       now() + %(due)s, now(), now() + interval '1 hour', now()
                FROM definitions d, generate_series(1, %(count)s) AS n
                WHERE d.workflow_id = %(workflow)s
                RETURNING id, step, admitted_at
            )
            INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
            SELECT id, 1, admitted_at, 'admitted', step, 'bench', '{{}}' FROM made
            """,
            {"workflow": workflow, "count": count, "due": timedelta(seconds=due_in), "step": step},
        )
        conn.execute("SELECT pg_notify('coordinator_wake', 'bench')")


def bulk_ended(dsn: str, workflow: str, count: int) -> None:
    """``count`` runs that finished a day ago, five events each, for retention to archive."""
    with sync_connection(dsn) as conn:
        conn.execute(
            """
            WITH made AS (
                INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest,
                                  input, state, step, seq, admitted_at, deadline_at,
                                  updated_at, ended_at, outcome)
                SELECT gen_random_uuid(), d.digest, d.workflow_id, 'bench', 'old-' || n, 'x',
                       '{}', 'finished', 'done', 5, now() - interval '1 day',
                       now() + interval '1 hour', now() - interval '1 day',
                       now() - interval '1 day', 'done'
                FROM definitions d, generate_series(1, %(count)s) AS n
                WHERE d.workflow_id = %(workflow)s
                RETURNING id, digest, workflow_id
            )
            INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
            SELECT id, e.seq, now() - interval '1 day',
                   CASE e.seq WHEN 1 THEN 'admitted' WHEN 5 THEN 'finished' ELSE 'note' END,
                   'done', 'bench',
                   CASE e.seq WHEN 1 THEN jsonb_build_object('workflow', workflow_id,
                                                             'version', '1', 'digest', digest)
                        ELSE jsonb_build_object('n', e.seq, 'text', 'a detail of some length')
                   END
            FROM made, generate_series(1, 5) AS e (seq) ORDER BY id, e.seq
            """,
            {"workflow": workflow, "count": count},
        )


# --- throughput ---------------------------------------------------------------------------


def pgbench_tps(cluster: Cluster, clients: int, seconds: int = 10) -> float:
    dsn = cluster.create_database()
    subprocess.run([str(PGBENCH), "-i", "-q", "-s", "10", dsn], check=True, capture_output=True)
    result = subprocess.run(
        [
            str(PGBENCH),
            "-b",
            "simple-update",
            "-c",
            str(clients),
            "-j",
            str(clients),
            "-T",
            str(seconds),
            "-n",
            dsn,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("tps ="))
    return float(line.split()[2])


def throughput(
    cluster: Cluster,
    directory: Path,
    runs: int,
    workers: list[int],
    processes: list[int],
    rounds: int,
) -> None:
    """Each worker count in one process, and each further process count with the default
    four workers each, ``rounds`` times, interleaved so that a noisy minute on this shared
    machine falls on all of them; the table is the medians, beside pgbench's median with as
    many clients, measured in the same rounds."""
    print(
        f"throughput: {runs} runs of bench-four (read call, choose, mutation call, finish); "
        f"medians of {rounds} interleaved rounds"
    )
    setups = [(1, count) for count in workers] + [(n, 4) for n in processes if n > 1]
    figures: dict[tuple[int, int], list[tuple[float, float, float]]] = {s: [] for s in setups}
    for round_ in range(rounds):
        for setup in setups:
            seconds, steps = _throughput_once(
                cluster, directory / f"r{round_}p{setup[0]}w{setup[1]}", runs, *setup
            )
            tps = pgbench_tps(cluster, setup[0] * setup[1])
            figures[setup].append((runs / seconds, steps / seconds, tps))
            print(
                f"  round {round_ + 1}, {setup[0]} x {setup[1]} workers: "
                f"{steps / seconds:.0f} steps/s, pgbench {tps:.0f} tps",
                flush=True,
            )
    print(
        f"  {'processes':>9}  {'workers':>7}  {'runs/s':>8}  {'steps/s':>8}  {'pgbench tps':>11}"
        f"  {'ratio':>6}"
    )
    for (count, each), measured in figures.items():
        runs_s, steps_s, tps = (statistics.median(column) for column in zip(*measured, strict=True))
        spread = f"{min(m[1] for m in measured):.0f}-{max(m[1] for m in measured):.0f}"
        print(
            f"  {count:>9}  {each:>7}  {runs_s:>8.0f}  {steps_s:>8.0f}  {tps:>11.0f}"
            f"  {steps_s / tps:>6.2f}   (steps/s over the rounds: {spread})"
        )


def _throughput_once(
    cluster: Cluster,
    directory: Path,
    runs: int,
    processes: int,
    workers: int,
    extra: dict[str, Any] | None = None,
    ended: int = 0,
) -> tuple[float, int]:
    """Seconds from the runs falling due to the last one ending, and step transitions, with
    ``processes`` processes of ``serve --processes`` (``extra``: more sections of the
    service's configuration; ``ended``: runs ended a day ago beside them, for retention to
    archive meanwhile)."""
    breg = free_port()
    connections = {"registry": connection("breg", breg, poolSize=max(4, workers * 2))}
    with (
        stand_ins(directory.with_suffix(".standins.log"), {"breg": breg}),
        service(
            cluster,
            directory,
            ["bench-four"],
            processes,
            workers=workers,
            connections=connections,
            extra=extra,
        ) as (_, dsn),
    ):
        if ended:
            bulk_ended(dsn, "bench-four", ended)
        bulk_admit(dsn, "bench-four", runs, RECORDS, 2.0, "read")
        wait_ended(dsn, runs, 600)
        check_bench_four(dsn, breg, runs)
        with sync_connection(dsn) as conn:
            row = conn.execute(
                "SELECT EXTRACT(EPOCH FROM max(ended_at) - min(admitted_at))::float8 - 2.0 "
                "AS seconds, (SELECT count(*) FROM run_events e JOIN runs r ON r.id = e.run_id"
                " WHERE e.kind <> 'admitted' AND r.caller = 'bench' AND r.start_key LIKE 'k%%')"
                " AS steps FROM runs WHERE start_key LIKE 'k%%'"
            ).fetchone()
    assert row is not None
    return row["seconds"], row["steps"]


def check_bench_four(dsn: str, breg: int, runs: int) -> None:
    """Stop the benchmark unless each of the ``runs`` runs of bench-four finished ``acted``
    and the BReg stand-in on port ``breg`` was asked, per run, one record read and one
    action invoked with a key of its own (besides the action's preparation: the registry's
    metadata and the target's conditions), nothing refused or repeated."""
    with sync_connection(dsn) as conn:
        ends = conn.execute(
            "SELECT state, outcome, failure_code, hold_code, min(detail) AS detail, count(*) AS n"
            " FROM runs WHERE start_key LIKE 'k%%' GROUP BY 1, 2, 3, 4"
        ).fetchall()
    wrong = [e for e in ends if (e["state"], e["outcome"]) != ("finished", "acted")]
    if wrong:
        raise SystemExit(f"benchmark: runs of bench-four did not all finish acted: {wrong}")
    ledger = httpx.get(f"http://127.0.0.1:{breg}/_control/ledger", timeout=60).json()
    asked = ledger["requests"]
    reads = [r for r in asked if r["method"] == "GET" and r["path"].startswith("/v1/records/")]
    acts = [r for r in asked if r["method"] == "POST" and r["path"] == "/v1/actions/mark-reviewed"]
    refused = [r for r in asked if not 200 <= r.get("status", 0) < 300]
    keys = {r["key"] for r in acts}
    if not len(reads) == len(acts) == len(keys) == runs or refused:
        raise SystemExit(
            f"benchmark: BReg was asked {len(reads)} reads and {len(acts)} actions with "
            f"{len(keys)} keys for {runs} runs, {len(refused)} refused (first {refused[:1]})"
        )


def checkpointing(cluster: Cluster, directory: Path, runs: int, rounds: int) -> None:
    """Throughput with signed checkpoints (every second, and as runs end) against without,
    4 workers, the two interleaved in each round."""
    print(f"checkpoints: {runs} runs of bench-four, 4 workers, with and without, {rounds} rounds")
    figures: dict[str, list[float]] = {"without": [], "with": []}
    for round_ in range(rounds):
        for side, values in figures.items():
            extra = signing(directory / f"keys-{round_}", every="PT1S") if side == "with" else {}
            seconds, steps = _throughput_once(
                cluster, directory / f"r{round_}-{side}", runs, 1, 4, extra
            )
            values.append(steps / seconds)
            print(f"  round {round_ + 1}, {side:<7}: {steps / seconds:.0f} steps/s", flush=True)
    without, signed = (statistics.median(v) for v in figures.values())
    print(
        f"  median steps/s: without {without:.0f}, with {signed:.0f} ({signed / without:.2f}x); "
        f"spread without {min(figures['without']):.0f}-{max(figures['without']):.0f}"
    )


def archiving(cluster: Cluster, directory: Path, runs: int, rounds: int, ended: int) -> None:
    """Throughput while retention archives a backlog of ``ended`` runs beside, against the
    same with retention off (signed checkpoints on both), 4 workers, interleaved."""
    print(
        f"archiving: {runs} runs of bench-four beside {ended} ended runs, retention on and off, "
        f"{rounds} rounds"
    )
    figures: dict[str, list[float]] = {"off": [], "on": []}
    for round_ in range(rounds):
        for side, values in figures.items():
            extra = signing(directory / f"keys-{round_}-{side}")
            if side == "on":
                archive = directory / f"archive-{round_}"
                extra["retention"] = {
                    "archiveAfter": "PT1H",
                    "directory": str(archive),
                    "every": "PT1S",
                }
            seconds, steps = _throughput_once(
                cluster, directory / f"r{round_}-{side}", runs, 1, 4, extra, ended
            )
            values.append(steps / seconds)
            archived = len(list(archive.rglob("*.bundle.json"))) if side == "on" else 0
            print(
                f"  round {round_ + 1}, retention {side:<3}: {steps / seconds:.0f} steps/s"
                + (f", {archived} runs archived meanwhile" if side == "on" else ""),
                flush=True,
            )
    off, on = (statistics.median(v) for v in figures.values())
    print(f"  median steps/s: off {off:.0f}, on {on:.0f} ({on / off:.2f}x)")


def on_another_port(config: Path, name: str) -> Path:
    """The same service's configuration beside ``config``, listening on a free port: another
    process on the same database."""
    settings = json.loads(config.read_text())
    settings["listen"]["port"] = free_port()
    other = config.with_name(f"{name}.yaml")
    other.write_text(json.dumps(settings))
    return other


# --- wake latency -------------------------------------------------------------------------


def wake(
    cluster: Cluster,
    directory: Path,
    waiting: int,
    rates: list[float],
    profile: Path | None = None,
) -> None:
    """At each of ``rates``, a new service with ``waiting`` runs waiting, each woken by the
    ``review.completed`` Casework pushes for its review (as Casework's outbox sends it:
    bench/support.py's ``completion_delivery``), then reading the result. Casework is
    bench/product.py (every review approved, its result feed empty), not the tests'
    stand-in, so that its cost is not the engine's; it is printed apart. With ``profile``,
    py-spy samples serve while the webhooks are delivered."""
    casework = Product(free_port(), directory / "product.log")
    reviews = connection("casework", casework.port, completions=COMPLETIONS, poolSize=16)
    try:
        for rate in rates:
            with service(
                cluster,
                directory / f"at-{rate:.0f}",
                ["await-review"],
                workers=4,
                connections={"reviews": reviews},
            ) as (running, dsn):
                at = profile and profile.with_name(f"{profile.stem}-{rate:.0f}{profile.suffix}")
                _wake(running, dsn, casework, waiting, rate, at)
    finally:
        casework.stop()


def _wake(
    running: Service, dsn: str, casework: Product, waiting: int, rate: float, profile: Path | None
) -> None:
    keys = [str(uuid.uuid4()) for _ in range(waiting)]  # review request ids are UUIDs
    with sync_connection(dsn) as conn:
        conn.execute("CREATE TEMP TABLE bench_keys (n int, key text)")
        with conn.cursor().copy("COPY bench_keys FROM STDIN") as copy:
            for n, key in enumerate(keys, 1):
                copy.write_row((n, key))
        conn.execute(
            """
            WITH made AS (
                INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest,
                                  input, state, step, seq, due_at, admitted_at,
                                  deadline_at, updated_at)
                SELECT gen_random_uuid(), d.digest, d.workflow_id, 'bench', 'k' || b.n, 'x',
                       jsonb_build_object('requestId', b.key), 'running', 'wait', 1, now(),
                       now(), now() + interval '1 hour', now()
                FROM definitions d, bench_keys b WHERE d.workflow_id = 'await-review'
                RETURNING id, step, admitted_at
            )
            INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
            SELECT id, 1, admitted_at, 'admitted', step, 'bench', '{}' FROM made
            """
        )
    wait_runs(dsn, "state = 'waiting'", waiting, 300)
    serve = psutil.Process(running.process.pid)
    cpu = _cpu(serve), _cpu(casework.cpu)
    read_before = casework.counters()["results"]  # one Casework serves every rate's round
    started = time.monotonic()
    with contextlib.ExitStack() as profiling:
        if profile is not None:
            profile.parent.mkdir(parents=True, exist_ok=True)
            profiling.enter_context(Profile(running.process.pid, profile))
        answered, sending = deliver_at(running.url, keys, rate)
    wait_ended(dsn, waiting, 300)
    elapsed = time.monotonic() - started
    with sync_connection(dsn) as conn:
        ends = conn.execute(
            "SELECT state, outcome, output, hold_code, count(*) AS n FROM runs GROUP BY 1, 2, 3, 4"
        ).fetchall()
    if [(e["state"], e["outcome"], e["output"]) for e in ends] != [
        ("finished", "decided", {"decision": "approved"})
    ]:
        raise SystemExit(f"benchmark: the runs did not all finish decided, approved: {ends}")
    serve_ms, casework_ms = (
        (_cpu(p) - before) * 1000 / waiting
        for p, before in zip((serve, casework.cpu), cpu, strict=True)
    )
    read = casework.counters()["results"] - read_before
    with sync_connection(dsn) as conn:
        rows = conn.execute(
            """
            SELECT EXTRACT(EPOCH FROM c.at - d.at)::float8 AS resumed,
                   EXTRACT(EPOCH FROM f.at - d.at)::float8 AS next
            FROM run_events d
            JOIN run_events c
              ON c.run_id = d.run_id AND c.kind = 'step-completed' AND c.step = 'wait'
            JOIN run_events f ON f.run_id = d.run_id AND f.kind = 'finished'
            WHERE d.kind = 'result-delivered'
            """
        ).fetchall()
    print(
        f"wake: {waiting} runs waiting; webhooks offered at {rate:.0f}/s, sent at "
        f"{waiting / sending:.0f}/s (n={len(rows)})"
    )
    print(
        f"  CPU per wake: serve {serve_ms:.2f} ms, Casework (bench/product.py) "
        f"{casework_ms:.2f} ms; results read {read}; {elapsed:.1f} s from the first webhook "
        "to the last run's end"
    )
    if profile is not None:
        print(summary(profile))
    figures = quantiles(answered)
    print("  webhook answered\n    " + "  ".join(f"{k} {ms(v)}" for k, v in figures.items()))
    for label, column in (
        ("webhook accepted -> wait completed (after reading Casework)", "resumed"),
        ("webhook accepted -> next step committed", "next"),
    ):
        figures = quantiles([r[column] for r in rows])
        print(
            f"  {label}\n    " + "  ".join(f"{k} {ms(v)}" for k, v in figures.items()), flush=True
        )


#: Webhook senders at once: enough that the offered rate is kept while each waits for its
#: answer (a sender that waited in turn set the rate by the service's answer time instead).
SENDERS = 32


def deliver_at(url: str, keys: list[str], rate: float) -> tuple[list[float], float]:
    """Push Casework's ``review.completed`` for each key (a review request's id), the n-th
    at n / ``rate`` seconds, from :data:`SENDERS` threads (one connection each); how long
    each took to be acknowledged (an empty 204, as Casework's outbox requires), and how
    long the sending took."""
    answered: list[float] = []
    refused: list[str] = []
    started = time.monotonic()

    def sender(first: int) -> None:
        with httpx.Client(base_url=url) as client:
            for n in range(first, len(keys), SENDERS):
                pause = started + n / rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                delivery = completion_delivery(keys[n])
                sent = time.monotonic()
                answer = client.post(**delivery)
                took = time.monotonic() - sent
                if answer.status_code != 204 or answer.content:
                    refused.append(f"{answer.status_code} {answer.text[:300]}")
                else:
                    answered.append(took)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if refused:
        raise SystemExit(f"benchmark: {len(refused)} webhooks not acknowledged: {refused[0]}")
    if len(answered) != len(keys):
        raise SystemExit(f"benchmark: {len(keys) - len(answered)} webhooks were not answered")
    return answered, time.monotonic() - started


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


# --- timer lateness -----------------------------------------------------------------------


def timers(cluster: Cluster, directory: Path, count: int) -> None:
    print(f"timers: {count} wait-untils; lateness from the instant due")
    for name, spread in (("same instant", 0.0), ("same second", 1.0), ("over a minute", 60.0)):
        with service(cluster, directory / name.replace(" ", "-"), ["timed-choice"], workers=4) as (
            _,
            dsn,
        ):
            put_to_sleep(dsn, count, timedelta(seconds=5), timedelta(seconds=spread))
            wait_ended(dsn, count, 300)
            with sync_connection(dsn) as conn:
                rows = conn.execute(
                    "SELECT EXTRACT(EPOCH FROM e.at - due)::float8 AS woke, "
                    "       EXTRACT(EPOCH FROM r.ended_at - due)::float8 AS ended "
                    "FROM runs r JOIN run_events e ON e.run_id = r.id, "
                    "     LATERAL (SELECT r.admitted_at + interval '2 s' AS due) d "
                    "WHERE e.kind = 'step-completed' AND e.step = 'pause'"
                ).fetchall()
        for label, column in (("wait-until completed", "woke"), ("run finished", "ended")):
            figures = quantiles([r[column] for r in rows])
            print(
                f"  {name:<14} {label:<21}" + "  ".join(f"{k} {ms(v)}" for k, v in figures.items()),
                flush=True,
            )


# --- idle scale -----------------------------------------------------------------------------


def idle(cluster: Cluster, directory: Path, sizes: list[int], seconds: float) -> None:
    print(f"idle: runs waiting on a wait-until an hour away; CPU over {seconds:.0f} idle s")
    print(f"  {'waiting':>8}  {'RSS MB':>7}  {'CPU %':>6}  {'start->ready s':>14}")
    for size in sizes:
        dsn = cluster.create_database()
        config = write_config(
            directory / f"idle-{size}", dsn, ["timed-choice"], workers=4, sweep="PT30S"
        )
        migrate(config)
        first = Service(config, directory / f"idle-{size}.log").wait_listening(60)
        first.stop()
        put_to_sleep(dsn, size, timedelta(hours=1), timedelta(0))
        with sync_connection(dsn) as conn:
            conn.execute("VACUUM ANALYZE runs")
        started = time.monotonic()
        running = Service(config, directory / f"idle-{size}.log")
        wait_ready(running)
        ready = time.monotonic() - started
        process = psutil.Process(running.process.pid)
        time.sleep(2)
        cpu_before = process.cpu_times()
        time.sleep(seconds)
        cpu_after = process.cpu_times()
        used = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
        rss = process.memory_info().rss / 1e6
        running.stop()
        print(f"  {size:>8}  {rss:>7.1f}  {100 * used / seconds:>6.2f}  {ready:>14.2f}", flush=True)


# --- recovery -----------------------------------------------------------------------------


def recovery(cluster: Cluster, directory: Path, count: int) -> None:
    print(
        f"recovery: SIGKILL 1 s after {count} runs fell due, lease PT30S (the default); "
        "restarted on the same host:port (it takes the dead process's claims over at once), "
        "or another process on another port (it waits for their leases)"
    )
    for restart in ("same host:port", "another port"):
        figures = recover(cluster, directory / restart.replace(" ", "-"), count, restart)
        print(f"  {restart:<15}" + "; ".join(figures), flush=True)


def recover(cluster: Cluster, directory: Path, count: int, restart: str) -> list[str]:
    breg = free_port()
    connections = {"registry": connection("breg", breg, poolSize=16)}
    directory.mkdir()
    with stand_ins(directory / "standins.log", {"breg": breg}):
        dsn = cluster.create_database()
        config = write_config(
            directory, dsn, ["bench-four"], workers=4, lease="PT30S", connections=connections
        )
        migrate(config)
        first = Service(config, directory / "service.log").wait_listening(60)
        bulk_admit(dsn, "bench-four", count, RECORDS, 0.0, "read")
        time.sleep(1.0)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        killed = time.monotonic()
        with sync_connection(dsn) as conn:
            left = conn.execute(
                "SELECT count(*) FILTER (WHERE ended_at IS NULL) AS n, "
                "count(*) FILTER (WHERE dispatched_at IS NOT NULL) AS dispatched, "
                "array_agg(id) FILTER (WHERE lease_owner IS NOT NULL) AS claims, "
                "clock_timestamp() AS at FROM runs"
            ).fetchone()
        assert left is not None
        if restart != "same host:port":
            config = on_another_port(config, "other")
        second = Service(config, directory / "service.log")
        wait_ready(second)
        ready = time.monotonic() - killed
        deadline = time.monotonic() + 600
        taken = None  # when every run the killed process held had moved on
        with sync_connection(dsn) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE ended_at IS NULL AND state <> 'held') AS open,"
                    " count(*) FILTER (WHERE state = 'held') AS held,"
                    " count(*) FILTER (WHERE id = ANY(%s) AND lease_owner IS NOT NULL"
                    "                  AND updated_at < %s) AS stuck FROM runs",
                    (left["claims"] or [], left["at"]),
                ).fetchone()
                assert row is not None
                if taken is None and row["stuck"] == 0:
                    taken = time.monotonic() - killed
                if row["open"] == 0:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"benchmark: {row['open']} runs still open after 600 s")
                time.sleep(0.05)
        resumed = time.monotonic() - killed
        second.stop()
    return [
        f"at the kill {left['n']} unfinished, {len(left['claims'] or [])} held by the process, "
        f"{left['dispatched']} mid-call",
        f"ready {ready:.2f} s",
        f"its runs moved on {resumed if taken is None else taken:.2f} s",
        f"all runnable runs ended {resumed:.2f} s after the kill",
        f"held for an operator (killed mid-mutation): {row['held']}",
    ]


# --- console ------------------------------------------------------------------------------


def console(cluster: Cluster, directory: Path, count: int, requests: int) -> None:
    """What a console page costs beside the API's listing of the same 50 runs, with ``count``
    runs waiting, the requests interleaved; and the live view's revalidation (304)."""
    print(f"console: {count} runs waiting; {requests} requests of each, interleaved (ms)")
    dsn = cluster.create_database()
    config = write_config(directory, dsn, ["timed-choice"], workers=2)
    migrate(config)
    Service(config, directory / "service.log").wait_listening(60).stop()  # stores the pin
    put_to_sleep(dsn, count, timedelta(hours=1), timedelta(0))
    with sync_connection(dsn) as conn:
        conn.execute("VACUUM ANALYZE runs")
    running = Service(config, directory / "service.log").wait_listening(60)
    try:
        wait_ready(running)
        tag = running.http.get("/console/runs").headers["ETag"]
        kinds = {
            "API GET /v1/runs?limit=50": ("/v1/runs?limit=50", {}),
            "console /console/runs (50 rows)": ("/console/runs", {}),
            "console /console/runs, unchanged (304)": ("/console/runs", {"If-None-Match": tag}),
            "console held work (none held)": ("/console/", {}),
            "console search ?q= over every input": ("/console/runs?q=nobody", {}),
        }
        times: dict[str, list[float]] = {name: [] for name in kinds}
        for _ in range(requests):
            for name, (path, headers) in kinds.items():
                started = time.perf_counter()
                answer = running.http.get(path, headers=headers)
                times[name].append(time.perf_counter() - started)
                assert answer.status_code in (200, 304), (path, answer.status_code)
        base = statistics.median(times["API GET /v1/runs?limit=50"])
        print(f"  {'request':<42} {'p50':>8} {'p95':>8} {'x API':>6}")
        for name, values in times.items():
            q = quantiles(values)
            ratio = statistics.median(values) / base
            print(
                f"  {name:<42} {q['p50'] * 1000:>8.1f} {q['p95'] * 1000:>8.1f} {ratio:>6.2f}",
                flush=True,
            )
    finally:
        running.stop()


# --- chain --------------------------------------------------------------------------------


def chain(cluster: Cluster, directory: Path, count: int) -> None:
    """What chaining costs an event: the same inserts with the trigger on and off (off as
    under replication), interleaved; then how fast ``coordinator audit verify`` checks them."""
    print(f"chain: {count} runs of 5 events, inserted in one statement each way, 3 rounds")
    dsn = cluster.create_database()
    config = write_config(directory, dsn, ["timed-choice"], extra=signing(directory / "keys"))
    migrate(config)
    Service(config, directory / "service.log").wait_listening(60).stop()  # stores the pin
    insert = """
        WITH made AS (
            INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest, input,
                              state, step, seq, admitted_at, deadline_at, updated_at)
            SELECT gen_random_uuid(), d.digest, d.workflow_id, 'bench', %(prefix)s || n, 'x',
                   '{}', 'waiting', 'pause', 5, now(), now() + interval '1 hour', now()
            FROM definitions d, generate_series(1, %(count)s) AS n
            RETURNING id
        )
        INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail, hash)
        SELECT id, e.seq, now(), 'note', 'pause', 'bench',
               jsonb_build_object('n', e.seq, 'text', 'a detail of some length'), ''
        FROM made, generate_series(1, 5) AS e (seq) ORDER BY id, e.seq
    """
    times: dict[str, list[float]] = {"chained": [], "unchained": []}
    with sync_connection(dsn) as conn:
        for round_ in range(3):
            for side, role in (("chained", "origin"), ("unchained", "replica")):
                conn.execute(f"SET session_replication_role = {role}")
                started = time.perf_counter()
                conn.execute(insert, {"count": count, "prefix": f"{side}-{round_}-"})
                times[side].append(time.perf_counter() - started)
        conn.execute("SET session_replication_role = replica")  # unchained rows: not history
        conn.execute(
            "DELETE FROM run_events WHERE run_id IN "
            "(SELECT id FROM runs WHERE start_key LIKE 'unchained-%%')"
        )
        conn.execute("DELETE FROM runs WHERE start_key LIKE 'unchained-%%'")
    events = count * 5
    base = statistics.median(times["unchained"])
    for side, values in times.items():
        median = statistics.median(values)
        print(
            f"  {side:<10} median {median:.2f} s, {median / events * 1e6:.1f} us per event,"
            f" {median / base:.2f}x"
        )
    audit(config, directory, 3 * count, 3 * events)


def _audit_command(*args: str | Path) -> tuple[float, str]:
    """``coordinator audit ARGS``: seconds taken (the command's start included), its output."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "registry_coordinator", "audit", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - started
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return took, lines[-1][-200:] if lines else ""


def audit(config: Path, directory: Path, runs: int, events: int) -> None:
    """Checkpoints over ``runs`` new heads and over none, ``audit verify`` with them, and
    the size of a bundle: what its events add per event, and what it holds besides."""
    took, said = _audit_command("checkpoint", "--config", config, "--out", directory / "kept")
    print(f"  checkpoint of {runs:,} new heads: {took:.1f} s with the command's start ({said})")
    took, said = _audit_command("checkpoint", "--config", config, "--out", directory / "kept")
    print(f"  checkpoint with nothing new: {took:.2f} s with the command's start")
    dsn = str(load_config(config).database.dsn)
    # The scans the checkpointer makes when nothing is new: of every run, and of the runs
    # updated since its last checkpoint (the index runs_by_update), which was just now.
    last = datetime.now(UTC)
    with sync_connection(dsn) as conn:
        for what, since in (("every run (hourly)", None), ("what changed since (each time)", last)):
            scans = []
            for _ in range(7):  # psycopg prepares the statement from the sixth on, as served
                started = time.perf_counter()
                conn.execute(
                    QUERIES["audit_changed_heads"], {"since": since, "runs": None, "limit": 10_000}
                ).fetchall()
                scans.append(time.perf_counter() - started)
            scan = ms(statistics.median(scans))
            print(f"  the checkpointer's scan of {what}, {runs:,} runs: median {scan}")
    took, said = _audit_command("verify", "--config", config)
    print(f"  audit verify: {said}")
    print(f"  in {took:.1f} s with the command's start: {events / took:,.0f} events/s")
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT id FROM runs ORDER BY id LIMIT 1").fetchone()
    assert row is not None
    bundle = directory / "bundle.json"
    _audit_command("export", "--config", config, "--run", str(row["id"]), "--out", bundle)
    document = json.loads(bundle.read_bytes())
    whole = bundle.stat().st_size
    per_event = statistics.median(
        len(json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode()) + 1
        for e in document["events"]
    )
    artifact = len(document["artifact"].encode())
    rest = whole - artifact - len(document["events"]) * per_event
    print(
        f"  bundle of a run of {len(document['events'])} events: {whole:,} bytes; each event "
        f"adds {per_event:.0f} bytes (a 64-hex hash and its fields); the artifact "
        f"{artifact:,} bytes; checkpoint, proof and framing {rest:,.0f}"
    )


def peer(cluster: Cluster, directory: Path, args: argparse.Namespace) -> None:
    """bench/versus.py's side by side, with this command's options."""
    pairs = args.pairs or args.runs
    profiles = args.profile and args.profile.resolve()
    if profiles:
        profiles.mkdir(parents=True, exist_ok=True)
    side_by_side(
        cluster, directory, args.runs, args.rounds, pairs, args.callers, args.dbos_threads, profiles
    )


def database_clients(dsn: str, statements: int, rounds: int) -> None:
    """bench/client.py, imported when it runs: it needs trio-asyncio (the ``bench`` extra),
    which the other benchmarks and ``--help`` do without."""
    from bench.client import client  # noqa: PLC0415

    client(dsn, statements, rounds)


def pacing(requests: int, rounds: int) -> None:
    """What the send gate every request passes (``engine.pacing.Pace.leave``) costs in the
    loop, beside a bare Trio checkpoint, with no rate and with one never reached: medians
    of ``rounds``, in microseconds a request."""

    async def timed(step: Callable[[], Awaitable[None]]) -> float:
        start = time.perf_counter()
        for _ in range(requests):
            await step()
        return (time.perf_counter() - start) / requests * 1e6

    async def measure() -> None:
        for label, pace in (
            ("no rate", Pace(None)),
            ("a rate never reached", Pace(Rate(10**9, 10**9))),
        ):
            gate = [await timed(pace.leave) for _ in range(rounds)]
            bare = [await timed(trio.lowlevel.checkpoint) for _ in range(rounds)]
            print(
                f"pacing, {label}: Pace.leave() {statistics.median(gate):.1f} us a request, "
                f"a bare checkpoint {statistics.median(bare):.1f} us "
                f"({statistics.median(gate) / statistics.median(bare):.2f}x)"
            )

    trio.run(measure)


BENCHMARKS: dict[str, Callable[[Cluster, Path, argparse.Namespace], None]] = {
    "throughput": lambda c, d, a: throughput(c, d, a.runs, a.workers, a.processes, a.rounds),
    "wake": lambda c, d, a: wake(
        c, d, a.waiting, a.rate, a.profile and a.profile.resolve() / "wake.txt"
    ),
    "timers": lambda c, d, a: timers(c, d, a.timers),
    "idle": lambda c, d, a: idle(c, d, a.idle, a.idle_seconds),
    "recovery": lambda c, d, a: recovery(c, d, a.recovery),
    "console": lambda c, d, a: console(c, d, a.console_runs, a.console_requests),
    "chain": lambda c, d, a: chain(c, d, a.chain_runs),
    "checkpoints": lambda c, d, a: checkpointing(c, d, a.runs, a.rounds),
    "archiving": lambda c, d, a: archiving(c, d, a.runs, a.rounds, a.ended),
    "peer": peer,
    "custody": lambda c, d, a: sealing(c, d, a.runs, a.rounds, a.callers),
    "erasure": lambda c, d, a: erasure(c, d, a.runs, a.rounds),
    "client": lambda c, d, a: database_clients(c.create_database(), a.statements, a.rounds),
    "pacing": lambda c, d, a: pacing(a.statements * 40, a.rounds),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default all): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--waiting", type=int, default=2000)
    parser.add_argument("--rate", type=float, nargs="+", default=[100.0, 500.0, 1000.0])
    parser.add_argument("--timers", type=int, default=10_000)
    parser.add_argument("--idle", type=int, nargs="+", default=[100, 100_000])
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--recovery", type=int, default=1000)
    parser.add_argument("--console-runs", type=int, default=10_000)
    parser.add_argument("--console-requests", type=int, default=100)
    parser.add_argument("--chain-runs", type=int, default=10_000)
    parser.add_argument("--ended", type=int, default=20_000)
    parser.add_argument("--statements", type=int, default=5000, help="client: round trips")
    parser.add_argument("--callers", type=int, default=8, help="peer: concurrent callers")
    parser.add_argument("--pairs", type=int, help="peer: bare HTTP pairs (default --runs)")
    parser.add_argument(
        "--dbos-threads",
        type=int,
        default=16,
        help="peer: DBOS's max_executor_threads (0: its default)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="peer, wake: write py-spy profiles of serve here (collapsed stacks), sum them up",
    )
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; choose from {', '.join(BENCHMARKS)}")
    with tempfile.TemporaryDirectory(prefix="coordinator-bench-") as scratch:
        directory = Path(scratch)
        os.chmod(directory, 0o755)
        cluster = Cluster(directory)
        try:
            for name in args.names or list(BENCHMARKS):
                (directory / name).mkdir()
                BENCHMARKS[name](cluster, directory / name, args)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
