"""The peer's side of `bench/run.py peer`: DBOS Transact 3.4 running the same four steps.

The workflow is the one Registry Coordinator runs (`tests/workflows/bench-four.yaml`),
written as DBOS writes it: a step that reads the record over HTTP, a choice in Python, a
step that invokes the action over HTTP with an idempotency key derived from the workflow's
id (so a step DBOS retries after a crash sends the same key, as Coordinator's does), and a
finish (the workflow's return, recorded by DBOS as its output). Both steps call the same
product server as Coordinator (`bench/product.py`), with the same paths, headers and bodies,
through the same HTTP library Coordinator uses (httpx, one pooled client), and check the
answer's status and the field the choice reads.

DBOS runs with its defaults (a system database pool of 20) but for its executor, which
`bench/run.py` bounds to 16 threads (`--dbos-threads`; 0 gives DBOS's default, a thread
per workflow in flight, which on this machine made DBOS slower and its CPU per run higher,
2,000 threads contending for one interpreter), on a database of its own in the
benchmark's PostgreSQL. Its callers are 8 threads in this process calling
`DBOS.start_workflow`, as an application embedding DBOS starts workflows; each workflow's
id is given by its caller, as Coordinator's callers give an `Idempotency-Key`. This file
runs only as a process of its own, so its CPU is measured by process as
`coordinator serve`'s is; `dbos` is imported nowhere else (the `bench` extra is not
installed in CI).

Protocol with bench/run.py: argv is the system database URL, the product's URL, the number
of runs, of callers, DBOS's `max_executor_threads` (0: its default) and a tag for the
workflow ids. It prints `ready` once DBOS is launched, waits for a line on stdin, starts
the runs, waits for every result, then prints one JSON line: when the first start began
(epoch seconds), the callers' CPU seconds (their threads' own clocks) and how many
workflows returned the action's id.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import httpx
from dbos import DBOS, DBOSConfig, SetWorkflowID

AUTHORIZATION = "Bearer test-token-1"  # what Coordinator sends (bench/product.py checks it)
client = httpx.Client(timeout=30, headers={"Authorization": AUTHORIZATION})
product = ""  # the product server's URL, set by main before any workflow starts


def _read_record(record: str) -> dict[str, Any]:
    answer = client.get(f"{product}/v1/records/applications/{record}")
    answer.raise_for_status()
    data: dict[str, Any] = answer.json()["data"]
    return data


def _invoke_action(record: str) -> str:
    answer = client.post(
        f"{product}/v1/actions/mark-reviewed",
        json={"collection": "applications", "recordId": record},
        headers={"Idempotency-Key": f"{DBOS.workflow_id}:act"},
    )
    answer.raise_for_status()
    return str(answer.json()["actionId"])


def _bench_four(record: str) -> dict[str, Any] | None:
    """read -> decide -> act -> acted (or skipped), as bench-four.yaml."""
    data = read_record(record)
    if data["domainData"].get("status") != "awaiting-review":
        return None
    return {"actionId": invoke_action(record)}


# Registered without decorator syntax: CI type-checks this file without dbos installed,
# where a decorator would be untyped.
read_record = DBOS.step()(_read_record)
invoke_action = DBOS.step()(_invoke_action)
bench_four = DBOS.workflow(name="bench-four")(_bench_four)


def main() -> None:
    global product  # one setting for the steps, before any of them runs
    database, product, runs_text, callers_text, executors, tag = sys.argv[1:]
    runs, callers = int(runs_text), int(callers_text)
    config: DBOSConfig = {
        "name": "bench-peer",
        "system_database_url": database,
        "log_level": "WARNING",
    }
    if int(executors):
        config["max_executor_threads"] = int(executors)
    DBOS(config=config)
    DBOS.launch()
    print("ready", flush=True)
    sys.stdin.readline()

    handles: list[Any] = []
    cpu: list[float] = []

    def caller(first: int) -> None:
        started = time.thread_time()
        mine = []
        for n in range(first, runs, callers):
            with SetWorkflowID(f"{tag}-{n}"):
                mine.append(DBOS.start_workflow(bench_four, f"app-{n}"))
        cpu.append(time.thread_time() - started)
        handles.extend(mine)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(callers)]
    began = time.time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    acted = sum(1 for handle in handles if (handle.get_result() or {}).get("actionId"))
    print(json.dumps({"began": began, "callers_cpu": sum(cpu), "acted": acted}), flush=True)
    DBOS.destroy()


if __name__ == "__main__":
    main()
