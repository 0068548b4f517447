"""What operators read: a line per API request (its route's pattern, status, caller, run,
duration; never its path's search or a run's input), a line when a run starts and when it
ends, and the process's and the interpreter's own figures on /metrics."""

from __future__ import annotations

import json
from typing import Any

from tests.support import Services, wait_state

CANARY = "canary-8c1f-applicant"  # in a start's key and a search: never in a log line


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_each_request_and_each_run_start_and_end_has_one_line(dsn: str, services: Services) -> None:
    service = services(["chain"])
    run = service.start_run("chain", {"n": 3}, key=f"{CANARY}-1")
    wait_state(dsn, run, "finished")
    assert service.http.get(f"/v1/runs/{run}").status_code == 200
    assert service.http.get("/v1/runs", params={"search": CANARY}).status_code in (200, 400)
    assert service.http.get("/v1/runs/not-a-run").status_code in (400, 404)
    assert service.http.get("/ready").status_code == 200
    assert service.stop() == 0
    logged = service.log.read_text()
    assert CANARY not in logged

    access = [e for e in lines(logged) if e["logger"] == "registry_coordinator.access"]
    by_route = [(e["method"], e["route"], e["status"]) for e in access]
    assert by_route[:2] == [("POST", "/v1/runs", 201), ("GET", "/v1/runs/<run_id>", 200)]
    assert by_route[2][:2] == ("GET", "/v1/runs")
    assert by_route[3][:2] == ("GET", "/v1/runs/<run_id>")
    assert len(access) == 4, by_route  # /ready is not logged
    assert access[0]["caller"] == access[1]["caller"] == "local-developer"
    assert access[1]["run"] == run and all(e["duration_ms"] >= 0 for e in access)

    of_run = [e for e in lines(logged) if e.get("run") == run and e["logger"].endswith("runs")]
    assert [e["message"].split(":")[0] for e in of_run] == ["run started", "run finished at odd"]
    assert of_run[0]["workflow"] == "chain" and of_run[1]["outcome"] == "odd"


def test_metrics_carry_the_process_and_the_interpreter(services: Services) -> None:
    service = services(["chain"])
    text = service.http.get("/metrics").text
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "python_gc_collections_total",
        "python_info",
    ):
        assert f"\n{name}" in text, name
