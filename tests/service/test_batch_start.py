"""The batch start, ``POST /v1/runs:batch``, against a live service on real PostgreSQL.

Each start of a batch gets the result a single start with its key would have answered
(its run, or the same problem), a start refused never stops the others, a batch that is
not one changes nothing, and the runs a batch starts are runs like any other: they run to
their end, are counted as started, and continue the caller's trace. One service serves
the whole module; each test starts runs under keys of its own and counts those.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from registry_coordinator import store
from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.http.auth import mint
from registry_coordinator.store.database import sync_connection
from tests.support import (
    TEST_WORKFLOWS,
    Cluster,
    Service,
    Services,
    Uncommitted,
    blocked_or_done,
    database,
    development_jwt,
    wait_for,
)

#: A trace the caller started its runs in (W3C traceparent).
CALLER_TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#: How long a test waits for runs to end before it is failed as hung, not timed.
HANG = 60


@dataclass(frozen=True)
class Batches:
    """The module's service and who calls it: ``portal`` may start and read timed-choice
    and chain runs (and nope, never pinned; not deadline, which is); ``operator`` may do
    anything."""

    service: Service
    dsn: str
    key: Path  # what the tokens are signed with
    portal: str
    operator: str

    def post(self, body: Any, token: str | None = None, **headers: str) -> httpx.Response:
        bearer = {"Authorization": f"Bearer {token or self.portal}"}
        return self.service.http.post("/v1/runs:batch", json=body, headers=bearer | headers)

    def batch(self, starts: list[dict[str, Any]], **headers: str) -> list[dict[str, Any]]:
        """Each start's result, the batch answered 200."""
        response = self.post({"starts": starts}, **headers)
        assert response.status_code == 200, response.text
        results: list[dict[str, Any]] = response.json()["results"]
        assert [r["key"] for r in results] == [s["key"] for s in starts]
        return results

    def single(self, start: dict[str, Any]) -> httpx.Response:
        """The same start sent alone, its key as Idempotency-Key."""
        body = {name: value for name, value in start.items() if name != "key"}
        headers = {"Authorization": f"Bearer {self.portal}", "Idempotency-Key": start["key"]}
        return self.service.http.post("/v1/runs", json=body, headers=headers)

    def get(self, path: str) -> httpx.Response:
        return self.service.http.get(path, headers={"Authorization": f"Bearer {self.portal}"})

    def admission(self, change: str) -> None:
        response = self.service.http.post(
            f"/v1/admission/{change}",
            json={"reason": "batch test"},
            headers={"Authorization": f"Bearer {self.operator}"},
        )
        assert response.status_code == 200, response.text

    def runs(self, prefix: str) -> int:
        """Runs in PostgreSQL whose key starts with ``prefix``."""
        with sync_connection(self.dsn) as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM runs WHERE start_key LIKE %s", (f"{prefix}%",)
            ).fetchone()
        assert row is not None
        return int(row["n"])

    def started_total(self) -> float:
        """coordinator_runs_started_total, over every workflow."""
        text = self.service.http.get("/metrics").text
        found = re.findall(r"^coordinator_runs_started_total\{[^}]*\} (\S+)$", text, re.M)
        return sum(float(value) for value in found)


@pytest.fixture(scope="module")
def batches(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Batches]:
    directory = tmp_path_factory.mktemp("batch")
    key = directory / "signing-key.pem"
    portal = mint(key, "portal", ["coordinator.runs"], 1800)
    operator = mint(key, "operators", ["coordinator.operate"], 1800)
    auth = development_jwt(
        key,
        {
            "client": "portal",
            "scopes": ["coordinator.runs"],
            "workflows": ["timed-choice", "chain", "nope"],  # nope: never pinned
            "actions": ["start", "read"],
        },
        {"client": "operators", "scopes": ["coordinator.operate"], "operator": True},
    )
    dsn = cluster.create_database(migrated=True)
    extra = {"auth": auth, "tracing": {"enabled": True}}
    with Services(directory, dsn) as services:
        service = services(["timed-choice", "chain", "deadline"], extra=extra)
        yield Batches(service, dsn, key, portal, operator)


def keyed(prefix: str, *starts: dict[str, Any]) -> list[dict[str, Any]]:
    """The starts, each with a key of its own under ``prefix``."""
    return [{"key": f"{prefix}{n}", **start} for n, start in enumerate(starts)]


NO = {"workflow": "timed-choice", "input": {"answer": "no"}}
YES = {"workflow": "timed-choice", "input": {"answer": "yes"}}


def test_each_start_of_a_mixed_batch_gets_what_it_would_get_alone(batches: Batches) -> None:
    """Created runs, and each refusal with the very problem a single start answers."""
    prefix = f"mixed-{uuid.uuid4().hex[:6]}-"
    starts = keyed(
        prefix,
        NO,
        {"workflow": "chain", "input": {"n": 1}},
        {"workflow": "nope", "input": {}},  # not pinned
        {"workflow": "deadline", "input": {}},  # pinned, but no policy of the portal's
        {"workflow": "timed-choice", "input": {}},  # not the input schema's
        {"workflow": "timed-choice", "version": "9", "input": {"answer": "no"}},
        {**YES, "version": "1"},
    )
    started = batches.started_total()
    results = batches.batch(starts)
    assert [r["status"] for r in results] == [201, 201, 404, 403, 422, 404, 201]
    assert batches.runs(prefix) == 3
    assert batches.started_total() == started + 3
    for start, result in zip(starts, results, strict=True):
        if result["status"] == 201:
            assert set(result) == {"key", "status", "run"}
            shown = batches.get(f"/v1/runs/{result['run']['id']}").json()
            assert set(result["run"]) == set(shown)
            for same in ["id", "workflow", "caller", "admittedAt", "deadlineAt"]:
                assert result["run"][same] == shown[same]
            assert result["run"]["workflow"]["id"] == start["workflow"]
            continue
        assert set(result) == {"key", "status", "problem"}
        alone = batches.single(start)
        assert alone.status_code == result["status"], alone.text
        assert alone.json() == result["problem"]
    assert batches.runs(prefix) == 3, "a start refused in the batch was admitted alone"
    codes = [r["problem"]["code"] for r in results if "problem" in r]
    unpinned = "workflow.not-pinned"
    assert codes == [unpinned, "auth.forbidden", "input.invalid", unpinned]


def test_the_same_batch_again_creates_nothing_and_finds_each_run(batches: Batches) -> None:
    prefix = f"again-{uuid.uuid4().hex[:6]}-"
    starts = keyed(prefix, *[{"workflow": "chain", "input": {"n": n}} for n in range(5)], YES)
    first = batches.batch(starts)
    assert [r["status"] for r in first] == [201] * 6
    started = batches.started_total()
    again = batches.batch(starts)
    assert [r["status"] for r in again] == [200] * 6
    assert [r["run"]["id"] for r in again] == [r["run"]["id"] for r in first]
    assert batches.runs(prefix) == 6
    assert batches.started_total() == started, "a run found again was counted as started"
    alone = batches.single(starts[2])
    assert (alone.status_code, alone.json()["id"]) == (200, first[2]["run"]["id"])


def test_a_key_reused_for_another_start_is_refused_and_the_others_are_created(
    batches: Batches,
) -> None:
    prefix = f"reused-{uuid.uuid4().hex[:6]}-"
    original = batches.single({"key": f"{prefix}0", **NO})
    assert original.status_code == 201, original.text
    starts = keyed(prefix, YES, NO, {"workflow": "chain", "input": {"n": 2}})
    results = batches.batch(starts)
    assert [r["status"] for r in results] == [409, 201, 201]
    assert results[0]["problem"]["code"] == "run.key-reused"
    assert results[0]["problem"]["run"] == original.json()["id"]
    assert batches.runs(prefix) == 3


def test_while_admission_is_held_new_keys_get_503_and_used_keys_their_run(
    batches: Batches,
) -> None:
    prefix = f"held-{uuid.uuid4().hex[:6]}-"
    [before] = batches.batch(keyed(prefix, NO))
    assert before["status"] == 201
    starts = keyed(prefix, NO, YES, {"workflow": "chain", "input": {"n": 3}})
    batches.admission("hold")
    try:
        results = batches.batch(starts)
    finally:
        batches.admission("release")
    assert [r["status"] for r in results] == [200, 503, 503]
    assert results[0]["run"]["id"] == before["run"]["id"]
    assert {r["problem"]["code"] for r in results[1:]} == {"admission.held"}
    assert "batch test" in results[1]["problem"]["detail"]
    assert batches.runs(prefix) == 1
    released = batches.batch(starts)
    assert [r["status"] for r in released] == [200, 201, 201]
    assert batches.runs(prefix) == 3


def test_a_batch_that_is_not_one_is_refused_whole_and_changes_nothing(batches: Batches) -> None:
    prefix = f"malformed-{uuid.uuid4().hex[:6]}-"
    valid = keyed(prefix, NO)[0]
    many = [{"key": f"{prefix}many-{n}", **NO} for n in range(501)]
    cases: list[tuple[Any, str, str]] = [
        ([valid], "request.invalid", '{"starts"'),
        ({}, "request.invalid", '{"starts"'),
        ({"starts": [valid], "also": 1}, "request.invalid", '{"starts"'),
        ({"starts": valid}, "request.invalid", "a list of 1 to 500"),
        ({"starts": []}, "request.invalid", "a list of 1 to 500"),
        ({"starts": many}, "request.invalid", "a list of 1 to 500"),
        ({"starts": [valid, "start"]}, "request.invalid", "starts[1] is not a start"),
        ({"starts": [valid, NO]}, "request.idempotency-key-missing", "starts[1] has no key"),
        ({"starts": [valid, {**NO, "key": 7}]}, "request.idempotency-key-invalid", "starts[1]"),
        (
            {"starts": [valid, {**NO, "key": "has space"}]},
            "request.idempotency-key-invalid",
            "starts[1].key",
        ),
        (
            {"starts": [valid, {**NO, "key": "x" * 201}]},
            "request.idempotency-key-invalid",
            "starts[1].key",
        ),
        (
            {"starts": [valid, {**NO, "key": "line\n"}]},
            "request.idempotency-key-invalid",
            "starts[1].key",
        ),
        ({"starts": [valid, valid]}, "request.invalid", "starts[0] and starts[1]"),
        (
            {"starts": [valid, {**NO, "key": f"{prefix}x", "extra": 1}]},
            "request.invalid",
            "starts[1]: unknown fields: extra",
        ),
        (
            {"starts": [valid, {"key": f"{prefix}x", "workflow": 7, "input": {}}]},
            "request.invalid",
            "starts[1]: workflow",
        ),
        (
            {"starts": [valid, {"key": f"{prefix}x", "workflow": "chain"}]},
            "request.invalid",
            "starts[1]: the start needs an input",
        ),
    ]
    started = batches.started_total()
    for body, code, said in cases:
        response = batches.post(body)
        assert response.status_code == 400, (body, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["code"] == code, (body, problem)
        assert said in problem["detail"], (body, problem)
    assert batches.runs(prefix) == 0
    assert batches.started_total() == started
    nobody = mint(batches.key, "stranger", ["coordinator.runs"], 600)  # no policy names it
    refused = batches.post({"starts": [valid]}, token=nobody)
    assert (refused.status_code, refused.json()["code"]) == (403, "auth.forbidden")
    assert batches.runs(prefix) == 0


def test_the_runs_a_batch_starts_run_to_their_end_in_the_callers_trace(batches: Batches) -> None:
    prefix = f"end-{uuid.uuid4().hex[:6]}-"
    starts = keyed(
        prefix,
        {"workflow": "chain", "input": {"n": 1}},
        {"workflow": "chain", "input": {"n": 2}},
        YES,
        NO,
    )
    results = batches.batch(starts, traceparent=CALLER_TRACE)
    assert [r["status"] for r in results] == [201] * 4
    ended = "SELECT count(*) FROM runs WHERE start_key LIKE %s AND state = 'finished'"
    wait_for(batches.dsn, ended, 4, timeout=HANG, params=(f"{prefix}%",))
    outcomes = [batches.get(f"/v1/runs/{r['run']['id']}").json()["outcome"] for r in results]
    assert outcomes == ["odd", "even", "yes", "no"]
    with sync_connection(batches.dsn) as conn:
        traces = conn.execute(
            "SELECT DISTINCT traceparent FROM runs WHERE start_key LIKE %s", (f"{prefix}%",)
        ).fetchall()
    (kept,) = [t["traceparent"] for t in traces]
    version, trace_id, span_id, flags = kept.split("-")
    _, caller_trace, caller_span, _ = CALLER_TRACE.split("-")
    assert (version, trace_id, flags) == ("00", caller_trace, "01")
    assert span_id != caller_span  # the batch request's span, a child of the caller's


@pytest.mark.trio
async def test_batches_sharing_keys_wait_for_one_another_and_never_deadlock(dsn: str) -> None:
    """A admits k1 and keeps its transaction open; B asks for k3 and k1, and waits for A;
    then A admits k3 too. B inserts in key order, so it waits at k1 before taking k3, and
    A goes on. (Inserted in the order asked, B holds k3 while it waits for A, A then waits
    for B: PostgreSQL ends one of them as a deadlock.) Once A commits, B finds both runs."""
    checked = check_source(TEST_WORKFLOWS / "chain.yaml")
    assert checked.definition is not None and checked.digest and checked.artifact
    definition, digest = checked.definition, checked.digest

    def starts(*keys: str) -> list[store.Start]:
        return [store.Start(definition, digest, key, {"n": 1}) for key in keys]

    found: list[list[store.StartOutcome]] = []
    done = trio.Event()
    async with database(dsn, size=3) as db:
        await store.store_definition(db, definition, digest, checked.artifact)

        async def rival() -> None:
            found.append(await store.admit_many(db, "c", starts("k3", "k1")))
            done.set()

        # Left in reverse order: A's transaction commits, then the nursery waits for B.
        async with (
            db.connection() as conn,
            trio.open_nursery() as nursery,
            conn.transaction(),
        ):
            first = Uncommitted(conn, dsn)
            [k1] = await store.admit_many(first, "c", starts("k1"))
            nursery.start_soon(rival)
            assert await blocked_or_done(db, done), "B did not wait for A's k1"
            [k3] = await store.admit_many(first, "c", starts("k3"))
    [(again3, again1)] = found
    assert isinstance(k1, store.Admitted) and isinstance(k3, store.Admitted)
    assert isinstance(again1, store.Admitted) and isinstance(again3, store.Admitted)
    assert (again3.run_id, again3.created) == (k3.run_id, False)
    assert (again1.run_id, again1.created) == (k1.run_id, False)
