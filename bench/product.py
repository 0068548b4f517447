"""The one product both engines call in `bench/run.py peer`, and a client of it with no engine.

The stand-ins of the tests (Quart on Trio) cost more CPU per request than either engine's
own work on a step would, so a throughput comparison through them would measure a Python
web framework. This server is as little as answers the two BReg operations the benchmark
workflow calls (`read-record`, `invoke-action` in
src/registry_coordinator/authoring/products/breg.yaml), and for the wake benchmark
Casework's `read-review-result` (every review approved, under the requester profile
`Registry-Casework-Profile` names) and its result feed (always empty, so that only the
benchmark's pushed `review.completed` events wake runs), with bodies that satisfy their
response schemas (src/registry_coordinator/authoring/products/casework.yaml): the standard
library's `ThreadingHTTPServer`, HTTP/1.1 keep-alive, a thread per connection, Nagle off. It
honours `Idempotency-Key` as a product must (a repeated key gets the original answer and
changes nothing) and counts what it was asked, so the benchmark can check that both engines
made exactly one read and one mutation per run, each mutation with a key of its own.

Run as a process of its own (`python bench/product.py PORT`) so its CPU is measured apart
from the engines'. `bare_pairs` is the same two calls from threads with no engine between:
the rate an engine's runs/s is set against, through httpx (the library both engines call
products with) and through `http.client` (the server's own ceiling).
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import httpx
import psutil

#: What the engines send (bench/support.py gives them the token, as the stand-ins'); a
#: request without it is refused, so neither side can skip the header's cost.
AUTHORIZATION = "Bearer test-token-1"
READ = re.compile(r"^/v1/records/(?P<collection>[a-z][a-z0-9-]{0,63})/(?P<record>[^/]+)$")
MUTATE = re.compile(r"^/v1/actions/(?P<action>[a-z][a-z0-9-]{0,63})$")
RESULT = re.compile(r"^/v1/review-requests/(?P<request>[^/]+)/result$")
FEED = re.compile(r"^/v1/review-results(\?.*)?$")
#: The requester profile the wake benchmark's Casework connection is granted
#: (bench/support.py's ``connection``), as Casework's ``Registry-Casework-Profile``.
CASEWORK_PROFILE = "coordinator"
#: What every review result this server answers holds besides its request's id: one
#: subject version, reviewed under one policy, approved (casework.yaml's ReviewResult).
REVIEWED = {
    "subject": {
        "source": "applications",
        "type": "application",
        "id": "bench",
        "version": "1",
        "digest": "sha256:" + "5e" * 32,
    },
    "policy": {"id": "application-review", "version": "1", "digest": "sha256:" + "9c" * 32},
    "submissionDigest": "sha256:" + "d1" * 32,
    "status": "approved",
    "completedAt": "2026-12-01T09:00:00Z",
    "availableUntil": "2027-03-01T09:00:00Z",
}


@dataclass
class Counters:
    """What the server was asked, under one lock (the handlers run in many threads)."""

    reads: int = 0
    results: int = 0  # Casework review results read (every review is approved)
    mutations: int = 0  # applied: the first request with its key
    repeated: int = 0  # a key seen before: answered from the receipt, nothing applied
    refused: int = 0  # anything else: no token, no key, an unknown path, a bad body
    receipts: dict[str, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def as_json(self) -> dict[str, int]:
        with self.lock:
            return {
                "reads": self.reads,
                "results": self.results,
                "mutations": self.mutations,
                "repeated": self.repeated,
                "refused": self.refused,
                "keys": len(self.receipts),
            }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as both engines' clients pool connections
    disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK stall
    counters = Counters()

    def do_GET(self) -> None:
        if self.path == "/_counters":
            self._answer(200, json.dumps(self.counters.as_json()).encode())
            return
        if self.headers.get("Authorization") != AUTHORIZATION:
            self._refuse()
            return
        decided = RESULT.match(self.path)
        if decided is not None or FEED.match(self.path):
            if self.headers.get("Registry-Casework-Profile") != CASEWORK_PROFILE:
                self._refuse()
            elif decided is not None:
                self._decided(decided["request"])
            else:  # the result feed: nothing on it, so only the pushed events wake runs
                self._answer(200, b'{"items": []}')
            return
        match = READ.match(self.path)
        if match is None:
            self._refuse()
            return
        record = match["record"]
        body = {
            "data": {
                "recordIdentifier": record,
                "revisionIdentifier": "r1",
                "domainData": {"name": f"Applicant {record}", "status": "awaiting-review"},
            },
            "meta": {"collection": match["collection"]},
        }
        with self.counters.lock:
            self.counters.reads += 1
        self._answer(200, json.dumps(body).encode())

    def do_POST(self) -> None:
        payload = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("Idempotency-Key")
        try:
            record = json.loads(payload)["recordId"]
        except (ValueError, KeyError, TypeError):
            record = None
        if (
            MUTATE.match(self.path) is None
            or self.headers.get("Authorization") != AUTHORIZATION
            or not key
            or not isinstance(record, str)
        ):
            self._refuse()
            return
        counters = self.counters
        with counters.lock:
            answer = counters.receipts.get(key)
            if answer is None:
                counters.mutations += 1
                answer = json.dumps(
                    {"actionId": f"act-{counters.mutations}", "status": "accepted"}
                ).encode()
                counters.receipts[key] = answer
            else:
                counters.repeated += 1
        self._answer(200, answer)

    def _decided(self, request: str) -> None:
        body = {"resultId": f"result-{request}", "requestId": request, **REVIEWED}
        with self.counters.lock:
            self.counters.results += 1
        self._answer(200, json.dumps(body).encode())

    def _refuse(self) -> None:
        with self.counters.lock:
            self.counters.refused += 1
        self._answer(404, b'{"title": "not a request of this benchmark"}')

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: a line per request would be most of this server's work."""


class ThreadedServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # 8 callers and two engines' pools connect at once


class Product:
    """The server as a child process of the benchmark: its URL, its CPU, its counters."""

    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        with log.open("ab") as stderr:  # the child's own from here
            self.process = subprocess.Popen(
                [sys.executable, __file__, str(port)], stdout=subprocess.DEVNULL, stderr=stderr
            )
        self.cpu = psutil.Process(self.process.pid)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.counters()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        f"benchmark: the product server did not start (see {log})"
                    ) from None
                time.sleep(0.05)

    def counters(self) -> dict[str, int]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/_counters")
            return dict(json.loads(conn.getresponse().read()))
        finally:
            conn.close()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class Sender(Protocol):
    """One thread's way of sending a request: its status, the JSON body read and parsed."""

    def __call__(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> int: ...


def _stdlib(port: int) -> Sender:
    """A keep-alive connection of the standard library's own (the least CPU per request)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def send(method: str, path: str, body: bytes | None, headers: dict[str, str]) -> int:
        conn.request(method, path, body, headers)
        answer = conn.getresponse()
        json.loads(answer.read())
        return answer.status

    return send


def bare_pairs(port: int, tag: str, pairs: int, threads: int, library: str) -> tuple[float, float]:
    """``pairs`` read + mutation pairs from ``threads`` threads, as the engines send them
    (same paths, headers and bodies), through ``library``: ``httpx`` (one pooled client, as
    both engines call products), or ``http.client`` (a keep-alive connection per thread: the
    product server's own ceiling). Seconds from the first request to the last answer, and
    the threads' CPU seconds (each thread's own clock)."""
    cpu: list[float] = []
    failures: list[str] = []
    pooled = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def through_httpx(method: str, path: str, body: bytes | None, headers: dict[str, str]) -> int:
        answer = pooled.request(method, path, content=body, headers=headers)
        answer.json()
        return answer.status_code

    def caller(first: int) -> None:
        started = time.thread_time()
        send = through_httpx if library == "httpx" else _stdlib(port)
        headers = {"Authorization": AUTHORIZATION}
        mutation = {**headers, "Content-Type": "application/json"}
        for n in range(first, pairs, threads):
            record = f"app-{tag}-{n}"
            read = send("GET", f"/v1/records/applications/{record}", None, headers)
            body = json.dumps({"collection": "applications", "recordId": record}).encode()
            key = {"Idempotency-Key": f"{tag}-{n}"}
            mutated = send("POST", "/v1/actions/mark-reviewed", body, {**mutation, **key})
            if read != 200 or mutated != 200:
                failures.append(f"{record}: {read}, {mutated}")
        cpu.append(time.thread_time() - started)

    workers = [threading.Thread(target=caller, args=(n,)) for n in range(threads)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.monotonic() - started
    pooled.close()
    if failures:
        raise SystemExit(f"benchmark: bare HTTP calls failed: {failures[:3]}")
    return seconds, sum(cpu)


def main() -> None:
    server = ThreadedServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
