"""`bench/run.py peer`: Registry Coordinator against DBOS Transact 3.4, side by side.

What is measured: runs per second of the same four steps (read call, choose, mutation call,
finish) started by 8 concurrent callers, from the first start to the last run ended as the
engine recorded it in its database, and the CPU each run cost in every process it touched:
the engine (`coordinator serve`, or the process embedding DBOS), PostgreSQL (every process
of the cluster), the product server, and the callers. Beside them, the same two calls
with no engine between (8 threads of read + mutation pairs), through httpx (the library
both engines call products with) and through `http.client` (the product server's own
ceiling): the rates the engines are set against.

Why it is fair:

- one PostgreSQL 18 (the bench's embedded cluster) and one product server
  (bench/product.py: the standard library's threaded server, so neither side is measured by
  a web framework's cost) serve both sides; each round gives each side a fresh database;
- both engines run the same four steps, send the same requests (paths, bearer token, body,
  an idempotency key per mutation derived from the run's identity) through httpx, and both
  keep the runs durable in PostgreSQL; the product server's counters must show exactly one
  read and one mutation per run, each with a key of its own, nothing refused, nothing
  repeated, and every run must have ended with the action's id, or the benchmark stops;
- runs are started the way each engine's callers start them: through Coordinator's API
  (`POST /v1/runs` with an `Idempotency-Key`, one request per run, over keep-alive
  connections) and, for DBOS, a library inside the application, by `DBOS.start_workflow`
  with a workflow id given by the caller — so admission is inside each engine's figure;
- Coordinator runs with its default 4 workers (8 connections to the product, as the
  throughput benchmark) in one process, which is the ratio's figure; beside it, the same
  with the runs started 100 to a `POST /v1/runs:batch`, and with `serve --processes 2`
  (two such processes sharing the port: the engine's CPU is the supervisor's and its
  children's); DBOS with its defaults but for its executor, bounded to 16
  workflow threads, fewer than its 20 database connections (`--dbos-threads 0` gives its
  default, a thread per workflow in flight, which was slower here: the peer is measured
  at its better); each engine in its own process;
- the rounds alternate (Coordinator, DBOS, the bare calls, and again) so that a noisy
  minute on this shared machine falls on both; the figures are medians over the rounds.

The callers of Coordinator are threads of this process using `http.client` (the least
CPU a Python caller spends); their CPU is each thread's own clock. DBOS's callers are
threads of its own process, so their CPU is inside DBOS's engine figure (and shown apart).
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import psutil
from bench.product import Product, bare_pairs
from bench.profile import Profile, summary
from bench.support import (
    Cluster,
    connection,
    free_port,
    service,
    stand_ins,
    wait_ended,
    wait_ready,
)

from registry_coordinator.store.database import sync_connection

PEER = Path(__file__).with_name("peer.py")
CALLS = ("reads", "mutations", "keys", "repeated", "refused")


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def tree_cpu(process: psutil.Process) -> float:
    """CPU seconds of ``process`` and its children (``serve --processes``'s): they live as
    long as the window they are measured over."""
    return cpu_seconds(process) + sum(map(cpu_seconds, process.children(recursive=True)))


#: How Coordinator is run beside DBOS: processes (``serve --processes``) and starts per
#: request (1: ``POST /v1/runs``; more: ``POST /v1/runs:batch``). The first is the
#: ratio's figure, as callers start runs one by one.
COORDINATOR = {"Coordinator": (1, 1), "Coordinator batch": (1, 100), "Coordinator x2": (2, 1)}


class ClusterCpu:
    """CPU seconds of every process of the cluster: the postmaster and its children (each
    side's backends, the WAL writer, the checkpointer, autovacuum), sampled every half
    second so that a process that ends within the window counts up to its last sample."""

    def __init__(self, cluster: Cluster) -> None:
        pid = (cluster.server.data_directory / "postmaster.pid").read_text().split()[0]
        self.postmaster = psutil.Process(int(pid))
        self.baseline: dict[tuple[int, float], float] = {}
        self.latest: dict[tuple[int, float], float] = {}
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def _sample(self) -> None:
        for process in [self.postmaster, *self.postmaster.children()]:
            try:
                with process.oneshot():
                    self.latest[(process.pid, process.create_time())] = cpu_seconds(process)
            except psutil.NoSuchProcess:
                pass

    def _sampling(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def start(self) -> None:
        self.latest = {}
        self._sample()
        self.baseline = dict(self.latest)
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sampling, daemon=True)
        self._sampler.start()

    def stop(self) -> float:
        assert self._sampler is not None
        self._stop.set()
        self._sampler.join()
        self._sample()
        return sum(used - self.baseline.get(key, 0.0) for key, used in self.latest.items())


@dataclass
class Round:
    """One side's round: runs (or pairs), seconds, CPU seconds by process, product calls."""

    count: int
    seconds: float
    cpu: dict[str, float]
    calls: dict[str, int]
    notes: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    def per(self, name: str) -> float:
        """CPU milliseconds per run (or pair) in ``name``."""
        return 1000 * self.cpu[name] / self.count


class Window:
    """CPU of the engine's process, the cluster and the product between start and stop (of
    those given), and what the product was asked meanwhile."""

    def __init__(
        self, product: Product, cluster: ClusterCpu | None, engine: psutil.Process | None
    ) -> None:
        self.product, self.cluster, self.engine = product, cluster, engine
        self.calls: dict[str, int] = {}
        self.cpu: dict[str, float] = {}

    def start(self) -> None:
        self.calls = self.product.counters()
        self.cpu = {"product": cpu_seconds(self.product.cpu)}
        if self.engine is not None:
            self.cpu["engine"] = tree_cpu(self.engine)
        if self.cluster is not None:
            self.cluster.start()

    def stop(self) -> tuple[dict[str, float], dict[str, int]]:
        cpu = {"product": cpu_seconds(self.product.cpu) - self.cpu["product"]}
        if self.engine is not None:
            cpu["engine"] = tree_cpu(self.engine) - self.cpu["engine"]
        if self.cluster is not None:
            cpu["postgres"] = self.cluster.stop()
        after = self.product.counters()
        return cpu, {name: after[name] - self.calls[name] for name in CALLS}


def check_calls(side: str, expected: int, calls: dict[str, int]) -> None:
    """One read and one mutation per run, each mutation with a key not seen before."""
    wanted = {"reads": expected, "mutations": expected, "keys": expected, "repeated": 0}
    if {name: calls[name] for name in wanted} != wanted or calls["refused"]:
        raise SystemExit(f"benchmark: {side} did not make 2 calls per run: {calls}")


def record(tag: str, n: int) -> str:
    """The id of the record run ``n`` of ``tag`` reads: a UUID, as BReg's are."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}-{n}"))


def start_runs(url: str, tag: str, runs: int, callers: int, batch: int = 1) -> float:
    """``runs`` runs of bench-four from ``callers`` threads, each on one keep-alive
    connection, each run with its own idempotency key: one ``POST /v1/runs`` per run, or
    ``batch`` starts to a ``POST /v1/runs:batch``; the threads' CPU seconds."""
    host, port = url.removeprefix("http://").split(":")
    cpu: list[float] = []
    refused: list[str] = []

    def request(numbers: list[int]) -> tuple[str, str, dict[str, str]]:
        starts = [
            {"key": f"{tag}-{n}", "workflow": "bench-four", "input": {"recordId": record(tag, n)}}
            for n in numbers
        ]
        if batch > 1:
            return "/v1/runs:batch", json.dumps({"starts": starts}), {}
        key = starts[0].pop("key")
        return "/v1/runs", json.dumps(starts[0]), {"Idempotency-Key": str(key)}

    def created(status: int, text: bytes) -> bool:
        """Whether every start the answer is for created its run."""
        if batch == 1:
            return status == 201
        return status == 200 and all(r["status"] == 201 for r in json.loads(text)["results"])

    def caller(first: int) -> None:
        started = time.thread_time()
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        mine = list(range(first, runs, callers))
        for at in range(0, len(mine), batch):
            path, body, headers = request(mine[at : at + batch])
            conn.request("POST", path, body, {**headers, "Content-Type": "application/json"})
            answer = conn.getresponse()
            text = answer.read()
            if not created(answer.status, text):
                refused.append(f"{answer.status} {text[:200]!r}")
        conn.close()
        cpu.append(time.thread_time() - started)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if refused:
        raise SystemExit(f"benchmark: {len(refused)} starts refused, e.g. {refused[0]}")
    return sum(cpu)


def coordinator_round(
    cluster: Cluster,
    directory: Path,
    product: Product,
    runs: int,
    callers: int,
    how: tuple[int, int],
    profile: Path | None = None,
) -> Round:
    """One round of Coordinator run ``how`` (:data:`COORDINATOR`); with ``profile``,
    py-spy's samples of serve meanwhile."""
    processes, batch = how
    connections = {"registry": connection("breg", product.port, poolSize=8)}
    tag = directory.name
    with service(
        cluster, directory, ["bench-four"], processes, workers=4, connections=connections
    ) as (running, dsn):
        wait_ready(running)
        window = Window(product, ClusterCpu(cluster), psutil.Process(running.process.pid))
        with contextlib.ExitStack() as profiling:
            if profile is not None:
                profiling.enter_context(Profile(running.process.pid, profile))
            window.start()
            began = time.time()
            client = start_runs(running.url, tag, runs, callers, batch)
            wait_ended(dsn, runs, 600)
            cpu, calls = window.stop()
        if profile is not None:
            print(summary(profile))
        with sync_connection(dsn) as conn:
            row = conn.execute(
                "SELECT EXTRACT(EPOCH FROM max(ended_at))::float8 AS ended, count(*) FILTER "
                "(WHERE state = 'finished' AND outcome = 'acted' AND output ? 'actionId') AS acted"
                " FROM runs"
            ).fetchone()
    assert row is not None
    if row["acted"] != runs:
        raise SystemExit(f"benchmark: {row['acted']} of {runs} Coordinator runs acted")
    check_calls("Coordinator", runs, calls)
    return Round(runs, row["ended"] - began, {**cpu, "client": client}, calls)


def dbos_round(
    cluster: Cluster, directory: Path, product: Product, runs: int, callers: int, threads: int
) -> Round:
    directory.mkdir(parents=True)
    dsn = cluster.create_database()
    tag = directory.name
    with (directory / "dbos.log").open("ab") as log:  # the child's own from here
        peer = subprocess.Popen(
            [sys.executable, str(PEER), dsn, product.url, *map(str, (runs, callers, threads)), tag],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        said = _line(peer.stdout)
        if said != "ready":
            raise SystemExit(f"benchmark: DBOS did not launch (see {directory / 'dbos.log'})")
        window = Window(product, ClusterCpu(cluster), psutil.Process(peer.pid))
        window.start()
        assert peer.stdin is not None
        peer.stdin.write("go\n")
        peer.stdin.flush()
        result = json.loads(_line(peer.stdout) or "null")
        cpu, calls = window.stop()
        peer.wait(60)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
    if not result or result["acted"] != runs:
        raise SystemExit(f"benchmark: DBOS said {result} (see {directory / 'dbos.log'})")
    with sync_connection(dsn) as conn:
        row = conn.execute(
            "SELECT max(completed_at) / 1000.0 AS ended, count(*) AS finished "
            "FROM dbos.workflow_status WHERE status = 'SUCCESS' AND workflow_uuid LIKE %s",
            (f"{tag}-%",),
        ).fetchone()
    assert row is not None
    if row["finished"] != runs:
        raise SystemExit(f"benchmark: {row['finished']} of {runs} DBOS workflows succeeded")
    check_calls("DBOS", runs, calls)
    return Round(
        runs,
        float(row["ended"]) - result["began"],
        cpu,  # no client: the callers are threads of DBOS's process, inside its figure
        calls,
        {"callers": result["callers_cpu"]},
    )


def _line(stream: IO[str] | None) -> str:
    assert stream is not None
    return stream.readline().strip()


def bare_round(product: Product, tag: str, pairs: int, callers: int, library: str) -> Round:
    window = Window(product, None, None)
    window.start()
    seconds, client = bare_pairs(product.port, tag, pairs, callers, library)
    cpu, calls = window.stop()
    check_calls(f"the bare calls through {library}", pairs, calls)
    return Round(pairs, seconds, {**cpu, "client": client}, calls)


BARE = {"bare httpx": "httpx", "bare stdlib": "http.client"}


def peer(
    cluster: Cluster,
    directory: Path,
    runs: int,
    rounds: int,
    pairs: int,
    callers: int,
    dbos_threads: int,
    profiles: Path | None = None,
) -> None:
    """Coordinator, DBOS and the bare calls, ``rounds`` times interleaved; then the
    medians side by side. With ``profiles``, a py-spy profile of serve in each round is
    written there (``coordinator-rN.txt``) and summed up."""
    if importlib.util.find_spec("dbos") is None:
        raise SystemExit("benchmark peer: DBOS is not installed: pip install -e '.[bench]'")
    threads = f"{dbos_threads} executor threads" if dbos_threads else "its default executor"
    print(
        f"peer: {runs} runs of read call, choose, mutation call, finish, started by {callers} "
        f"concurrent callers, against one threaded stdlib product server; Coordinator "
        f"(4 workers, POST /v1/runs; beside it 100 starts to a POST /v1/runs:batch, and "
        f"serve --processes 2) and DBOS Transact 3.4 ({threads}, DBOS.start_workflow) "
        f"on one PostgreSQL 18; {pairs} bare read + mutation pairs from {callers} threads "
        f"through httpx and through http.client; medians of {rounds} interleaved rounds; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    product = Product(free_port(), directory / "product.log")
    sides: dict[str, list[Round]] = {name: [] for name in (*COORDINATOR, "DBOS", *BARE)}
    try:
        for round_ in range(rounds):
            for side, measured in sides.items():
                where = directory / f"r{round_ + 1}-{side.replace(' ', '-').lower()}"
                if side in COORDINATOR:
                    profile = (  # the profiles are of the ratio's setup
                        profiles / f"coordinator-r{round_ + 1}.txt"
                        if profiles and side == "Coordinator"
                        else None
                    )
                    figures = coordinator_round(
                        cluster, where, product, runs, callers, COORDINATOR[side], profile
                    )
                elif side == "DBOS":
                    figures = dbos_round(cluster, where, product, runs, callers, dbos_threads)
                else:
                    figures = bare_round(product, where.name, pairs, callers, BARE[side])
                measured.append(figures)
                print(f"  round {round_ + 1}, {side:<17} {_describe(side, figures)}", flush=True)
    finally:
        product.stop()
    _table(sides)


COLUMNS = ("engine", "postgres", "product", "client")


def _describe(side: str, figures: Round) -> str:
    unit = "pair" if side in BARE else "run"
    cpu = ", ".join(f"{name} {figures.per(name):.2f}" for name in COLUMNS if name in figures.cpu)
    notes = "".join(
        f" ({name} {1000 * value / figures.count:.2f} of it)"
        for name, value in figures.notes.items()
    )
    return (
        f"{figures.rate:6.1f} {unit}s/s in {figures.seconds:5.1f} s; "
        f"CPU ms per {unit}: {cpu}{notes}"
    )


def _median(rounds: list[Round], figure: str) -> float:
    """The median over the rounds of the rate (``rate``), or of CPU ms per run in a process
    or a note; NaN for a process the side has none of."""
    if figure == "rate":
        return statistics.median(r.rate for r in rounds)
    if figure in rounds[0].notes:
        return statistics.median(1000 * r.notes[figure] / r.count for r in rounds)
    if figure in rounds[0].cpu:
        return statistics.median(r.per(figure) for r in rounds)
    return float("nan")


def _table(sides: dict[str, list[Round]]) -> None:
    print(
        f"  {'':<17} {'per s':>7} {'rounds':>13}   CPU ms per run (bare: per pair):"
        + "".join(f" {name:>8}" for name in COLUMNS)
    )
    for side, rounds in sides.items():
        spread = f"{min(r.rate for r in rounds):.1f}-{max(r.rate for r in rounds):.1f}"
        cells = "".join(
            f" {'-':>8}" if math.isnan(value) else f" {value:>8.2f}"  # NaN: not this side's
            for value in (_median(rounds, name) for name in COLUMNS)
        )
        unit = "pairs" if side in BARE else "runs"
        print(f"  {side:<17} {_median(rounds, 'rate'):>7.1f} {spread:>13}   {unit:<32}{cells}")
    dbos = sides["DBOS"]
    print(
        f"  DBOS's callers are threads of its process: {_median(dbos, 'callers'):.2f} ms per "
        "run of its engine figure"
    )
    for name in COORDINATOR:
        coordinator = sides[name]
        rate = _median(coordinator, "rate") / _median(dbos, "rate")
        ratios = ", ".join(
            f"{process} {_median(coordinator, process) / _median(dbos, process):.2f}x"
            for process in ("engine", "postgres", "product")
        )
        paired = [c.rate / d.rate for c, d in zip(coordinator, dbos, strict=True)]
        print(
            f"  {name} / DBOS: runs/s {rate:.2f}x (round by round "
            f"{', '.join(f'{x:.2f}' for x in paired)}); CPU per run: {ratios}"
        )
    for side, library in BARE.items():
        bare = _median(sides[side], "rate")
        shares = ", ".join(
            f"{name} {100 * _median(sides[name], 'rate') / bare:.0f}%"
            for name in (*COORDINATOR, "DBOS")
        )
        print(f"  of the bare rate through {library} ({bare:.1f} pairs/s): {shares}")
    print(
        "  product calls, checked every round: one read and one mutation per run (pair), each "
        "mutation with a new key, none repeated or refused ("
        + "; ".join(
            f"{side} {sum(r.calls['reads'] for r in rounds)} reads, "
            f"{sum(r.calls['mutations'] for r in rounds)} mutations, "
            f"{sum(r.calls['keys'] for r in rounds)} new keys"
            for side, rounds in sides.items()
        )
        + ")"
    )


def _kek(directory: Path) -> Path:
    """A new key-encryption key in ``directory``, for ``custody.keys``."""
    directory.mkdir(parents=True, exist_ok=True)
    kek = directory / "kek-1"
    kek.write_text(os.urandom(32).hex() + "\n")
    kek.chmod(0o600)
    return kek


def custody(cluster: Cluster, directory: Path, runs: int, rounds: int, callers: int) -> None:
    """Coordinator with its runs' data sealed (custody configured) against the same in
    clear, runs of bench-four against stand-in BReg started one ``POST /v1/runs`` each by
    ``callers``, the two interleaved ``rounds`` times: what sealing costs a run."""
    print(
        f"custody: {runs} runs of bench-four (stand-in BReg) started by {callers} callers, "
        f"sealed and in clear, medians of {rounds} interleaved rounds; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    kek = _kek(directory)
    sealed = {"custody": {"keys": {"1": f"file:{kek}"}, "active": 1}}
    sides: dict[str, list[Round]] = {"in clear": [], "sealed": []}
    for round_ in range(rounds):
        for side, measured in sides.items():
            where = directory / f"r{round_ + 1}-{side.replace(' ', '-')}"
            figures = _custody_round(
                cluster, where, runs, callers, sealed if side == "sealed" else {}
            )
            measured.append(figures)
            print(f"  round {round_ + 1}, {side:<9} {_describe(side, figures)}", flush=True)
    clear, kept = (_median(sides[side], "rate") for side in sides)
    cpu = ", ".join(
        f"{name} {_median(sides['in clear'], name):.2f} -> {_median(sides['sealed'], name):.2f}"
        for name in ("engine", "postgres")
    )
    print(f"  median runs/s: in clear {clear:.1f}, sealed {kept:.1f} ({kept / clear:.2f}x)")
    print(f"  median CPU ms per run, in clear -> sealed: {cpu}")


def _custody_round(
    cluster: Cluster, directory: Path, runs: int, callers: int, extra: dict[str, Any]
) -> Round:
    breg = free_port()
    connections = {"registry": connection("breg", breg, poolSize=8)}
    with (
        stand_ins(directory.with_suffix(".standins.log"), {"breg": breg}),
        service(
            cluster, directory, ["bench-four"], workers=4, connections=connections, extra=extra
        ) as (running, dsn),
    ):
        wait_ready(running)
        engine, postgres = psutil.Process(running.process.pid), ClusterCpu(cluster)
        before = tree_cpu(engine)
        postgres.start()
        began = time.time()
        client = start_runs(running.url, directory.name, runs, callers)
        wait_ended(dsn, runs, 600)
        cpu = {"engine": tree_cpu(engine) - before, "postgres": postgres.stop(), "client": client}
        with sync_connection(dsn) as conn:
            row = conn.execute(
                "SELECT EXTRACT(EPOCH FROM max(ended_at))::float8 AS ended, count(*) FILTER "
                "(WHERE state = 'finished' AND outcome = 'acted') AS acted, "
                "count(*) FILTER (WHERE data_key IS NOT NULL) AS sealed FROM runs"
            ).fetchone()
    assert row is not None
    if row["acted"] != runs or row["sealed"] != (runs if extra else 0):
        raise SystemExit(f"benchmark: {row['acted']} of {runs} runs acted, {row['sealed']} sealed")
    return Round(runs, row["ended"] - began, cpu, {})


def erasure(cluster: Cluster, directory: Path, runs: int, rounds: int) -> None:
    """How long erasing one data subject takes when ``runs`` ended runs were sealed under
    its key, among as many runs of other subjects: ``rounds`` subjects, each erased by one
    ``POST /v1/erasures`` (the service's answer, timed by the client)."""
    print(
        f"erasure: {rounds} subjects with {runs} ended runs each of subject-lookup (stand-in "
        f"BReg), among {runs} runs of other subjects; load average {os.getloadavg()[0]:.2f}"
    )
    kek = _kek(directory)
    breg = free_port()
    connections = {"records": connection("breg", breg, poolSize=8)}
    extra = {"custody": {"keys": {"1": f"file:{kek}"}, "active": 1}}
    with (
        stand_ins(directory / "standins.log", {"breg": breg}),
        service(
            cluster, directory, ["subject-lookup"], workers=4, connections=connections, extra=extra
        ) as (running, dsn),
        httpx.Client(base_url=running.url, timeout=120) as http,
    ):
        wait_ready(running)
        subjects = [f"bench-subject-{n}" for n in range(rounds)]
        others = [f"bench-other-{n}" for n in range(runs)]
        for subject in [*subjects, None]:
            starts = [
                {
                    "key": uuid.uuid4().hex,
                    "workflow": "subject-lookup",
                    "input": {
                        "recordId": str(uuid.uuid4()),
                        "applicantId": subject or others[n],
                        "until": "2020-01-01T00:00:00Z",
                    },
                }
                for n in range(runs)
            ]
            for at in range(0, runs, 100):
                answer = http.post("/v1/runs:batch", json={"starts": starts[at : at + 100]})
                answer.raise_for_status()
        wait_ended(dsn, runs * (rounds + 1), 900)
        took = []
        for subject in subjects:
            began = time.perf_counter()
            answer = http.post("/v1/erasures", json={"subject": subject, "reason": "bench"})
            took.append(time.perf_counter() - began)
            if answer.status_code != 200 or answer.json()["runs"] != runs:
                raise SystemExit(f"benchmark: the erasure answered {answer.text}")
            print(f"  {subject}: {runs} runs erased in {took[-1] * 1000:.1f} ms", flush=True)
    print(f"  median {statistics.median(took) * 1000:.1f} ms to erase a subject of {runs} runs")
