"""The stand-in products held to the same contracts as the catalog.

Each stand-in is served on loopback in this process and asked what the fixtures say
the real product is asked: its answers must be the product's (statuses, shapes that
the catalog's schemas, themselves held to the fixtures, accept), its refusals problem
documents of the product's closed vocabulary, with the ``type`` its code names and the
``traceId`` of the ``traceparent`` every answer carries, and its keys honoured as the
product honours them. A stand-in that answers otherwise than the contract fails here,
so the service tests that run against the stand-ins run against the contracts.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import trio

from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.devtools import reviewer
from registry_coordinator.devtools.standins import Tokens, stand_in
from registry_coordinator.devtools.standins.server import Issued
from registry_coordinator.semantics.actions import select
from tests.support import PARAMETERS, STAFF_TOKEN, STANDIN_TOKEN, free_port

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CONTRACTS = {path.stem: json.loads(path.read_text()) for path in sorted(FIXTURES.glob("*.json"))}
TRACE = "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"
RECORD = "00000000-0000-4000-8000-000000000001"


@asynccontextmanager
async def serving(product: str, tokens: Tokens | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The stand-in of ``product`` on loopback (accepting ``tokens``, if given), and a
    client with Coordinator's token."""
    tokens = tokens or Tokens(STANDIN_TOKEN, STAFF_TOKEN)
    served = stand_in(product, tokens, delivery_delay=0)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(served.serve, "127.0.0.1", free_port())
        headers = {"Authorization": f"Bearer {STANDIN_TOKEN}", "traceparent": TRACE}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as client:
            yield client
        nursery.cancel_scope.cancel()


def schema_of(product: str, operation: str, part: str = "response") -> Any:
    op = builtin_catalog().products[product].operations[operation]
    return op.response_schema if part == "response" else op.request_schema


def answered(product: str, operation: str, response: httpx.Response) -> Any:
    """The body of a success of ``operation``, checked as the catalog reads it."""
    op = builtin_catalog().products[product].operations[operation]
    assert op.succeeded(response.status_code), (response.status_code, response.text)
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    jsonschema.validate(body, op.response_schema)
    return body


def refused(product: str, response: httpx.Response, code: str) -> None:
    """A problem document of ``product``'s vocabulary, as its clients check one."""
    contract = CONTRACTS[product]
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert set(problem) == {"type", "title", "status", "detail", "code", "traceId"}
    assert problem["code"] == code
    assert problem["status"] == response.status_code == contract["problems"][code]
    assert problem["type"] == contract["problemType"] + code.replace(".", "/")
    assert problem["traceId"] == response.headers["traceparent"].split("-")[1]


def traced(response: httpx.Response) -> None:
    """Every answer continues the caller's trace and is never cached."""
    assert response.headers["traceparent"].split("-")[1] == TRACE.split("-")[1]
    assert response.headers["cache-control"] == "no-store"


def key() -> dict[str, str]:
    return {"Idempotency-Key": f"coordinator:{uuid.uuid4()}:step"}


@pytest.mark.trio
@pytest.mark.parametrize("product", ["breg", "casework", "messaging", "scheduling"])
async def test_a_refusal_is_one_of_the_products_problems_with_its_trace(product: str) -> None:
    async with serving(product) as client:
        anonymous = await client.get("/v1/anything", headers={"Authorization": "Bearer no"})
        traced(anonymous)
        if product == "breg":  # BReg conceals what it does not route, as what it may not show
            refused(product, anonymous, "resource.not_found")
        else:
            refused(product, anonymous, "request.not-found")
        path = {
            "breg": f"/v1/records/applications/{RECORD}?accessProfile=coordinator",
            "casework": f"/v1/review-requests/{uuid.uuid4()}/result",
            "messaging": f"/v1/messages/{uuid.uuid4()}",
            "scheduling": "/v1/scheduling",
        }[product]
        unauthenticated = await client.get(path, headers={"Authorization": "Bearer guessed"})
        refused(product, unauthenticated, "authentication.refused")
        assert unauthenticated.headers["www-authenticate"] == "Bearer"


@pytest.mark.trio
async def test_messaging_answers_submissions_receipts_and_reads_as_its_contract_says() -> None:
    facts = CONTRACTS["messaging"]["operations"]["submit-message"]
    sender = PARAMETERS["messaging"]
    async with serving("messaging") as client:
        for given in facts["accepts"]:
            body = {**given, **sender}
            if "phone" in given["to"]:
                body["senderProfile"] = "case-notices-sms"
            first = await client.post("/v1/messages", json=body, headers=key())
            traced(first)
            assert answered("messaging", "submit-message", first)["status"] == "queued"
        body = {**facts["accepts"][0], **sender}
        sent = key()
        original = answered(
            "messaging",
            "submit-message",
            await client.post("/v1/messages", json=body, headers=sent),
        )
        again = await client.post("/v1/messages", json=body, headers=sent)
        assert (again.status_code, again.json()) == (202, original)
        changed = {**body, "correlationId": "another"}
        refused(
            "messaging",
            await client.post("/v1/messages", json=changed, headers=sent),
            "idempotency.key-reused",
        )
        receipt = await client.post("/v1/messages/receipt", json=body, headers=sent)
        assert (receipt.status_code, receipt.json()) == (200, original)
        for unresolved in (
            await client.post("/v1/messages/receipt", json=changed, headers=sent),
            await client.post("/v1/messages/receipt", json=body, headers=key()),
        ):
            refused("messaging", unresolved, "receipt.unresolved")
        without = {k: v for k, v in body.items() if k != "senderProfile"}
        refused(  # the request is closed, its senderProfile required: a shape refused
            "messaging",
            await client.post("/v1/messages", json=without, headers=key()),
            "request.unprocessable",
        )
        refused(
            "messaging",
            await client.post(
                "/v1/messages", json={**body, "senderProfile": "marketing"}, headers=key()
            ),
            "profile.not-authorized",
        )
        refused(
            "messaging",
            await client.post("/v1/messages", json={**body, "data": None}, headers=key()),
            "template.data-invalid",
        )
        refused("messaging", await client.post("/v1/messages", json=body), "request.invalid")
        delivered = builtin_catalog().products["messaging"].results["message-delivered"]
        with trio.fail_after(30):  # the stand-in's provider takes the message at once
            while True:
                read = await client.get(f"/v1/messages/{original['id']}")
                view = answered("messaging", "read-message", read)
                if delivered.is_final(view):
                    break
                await trio.sleep(0.01)
        assert view["status"] == "delivered"
        refused(
            "messaging", await client.get(f"/v1/messages/{uuid.uuid4()}"), "message.not-visible"
        )


@pytest.mark.trio
async def test_casework_answers_requests_results_and_its_feed_as_its_contract_says() -> None:
    facts = CONTRACTS["casework"]["operations"]["request-review"]
    profile = {"Registry-Casework-Profile": PARAMETERS["casework"]["profile"]}
    async with serving("casework") as client:
        given = {**facts["accepts"][0], "context": {"strategy": "submitted", "snapshot": {}}}
        sent = {**profile, **key()}
        created = await client.post("/v1/review-requests", json=given, headers=sent)
        traced(created)
        accepted = answered("casework", "request-review", created)
        assert created.status_code == 201
        recovered = await client.post("/v1/review-requests", json=given, headers=sent)
        assert (recovered.status_code, recovered.json()) == (200, accepted)
        changed = {**given, "requesterReference": "another"}
        refused(
            "casework",
            await client.post("/v1/review-requests", json=changed, headers=sent),
            "idempotency.key-reused",
        )
        refused(
            "casework",
            await client.post("/v1/review-requests", json=given, headers=key()),
            "request.invalid",
        )  # no profile header
        result = f"/v1/review-requests/{accepted['requestId']}/result"
        pending = await client.get(result, headers=profile)
        assert (pending.status_code, pending.content) == (202, b"")
        assert "content-type" not in pending.headers
        unknown = await client.get(f"/v1/review-requests/{uuid.uuid4()}/result", headers=profile)
        assert (unknown.status_code, unknown.content) == (404, b"")
        feed = await client.get("/v1/review-results", params={"limit": 100}, headers=profile)
        assert feed.json() == {"items": []}
        url = str(client.base_url).rstrip("/")
        await trio.to_thread.run_sync(
            lambda: reviewer.decide(url, accepted["requestId"], "approve", STAFF_TOKEN)
        )
        decided = answered(
            "casework", "read-review-result", await client.get(result, headers=profile)
        )
        assert decided["status"] == "approved" and "outcome" not in decided
        review = builtin_catalog().products["casework"].results["review-decision"]
        assert review.is_final(decided)
        page = (await client.get("/v1/review-results", headers=profile)).json()
        assert [e["requestId"] for e in page["items"]] == [accepted["requestId"]]
        assert set(page["items"][0]) == {"eventId", "requestId", "resultId", "completedAt"}
        after = await client.get(
            "/v1/review-results", params={"cursor": page["items"][0]["eventId"]}, headers=profile
        )
        assert after.json() == {"items": []}
        refused(
            "casework",
            await client.get(
                "/v1/review-results", params={"cursor": str(uuid.uuid4())}, headers=profile
            ),
            "review.result-expired",
        )


@pytest.mark.trio
async def test_casework_supersedes_the_review_of_an_earlier_version_of_a_subject() -> None:
    """A request for another version of a subject under the same kind settles every review
    of its earlier versions still under way as superseded: a result, a feed entry
    (``crates/registry-casework/src/review.rs`` ``create_review``, the commit the fixture
    names)."""
    facts = CONTRACTS["casework"]["operations"]["request-review"]
    profile = {"Registry-Casework-Profile": PARAMETERS["casework"]["profile"]}
    given = {**facts["accepts"][0], "context": {"strategy": "submitted", "snapshot": {}}}
    later = {**given, "subject": {**given["subject"], "version": "later"}}
    async with serving("casework") as client:
        first = await client.post("/v1/review-requests", json=given, headers={**profile, **key()})
        earlier = answered("casework", "request-review", first)["requestId"]
        second = await client.post("/v1/review-requests", json=later, headers={**profile, **key()})
        assert second.status_code == 201
        read = await client.get(f"/v1/review-requests/{earlier}/result", headers=profile)
        superseded = answered("casework", "read-review-result", read)
        assert superseded["status"] == "superseded"
        assert (
            builtin_catalog().products["casework"].results["review-decision"].is_final(superseded)
        )
        page = (await client.get("/v1/review-results", headers=profile)).json()
        assert [e["requestId"] for e in page["items"]] == [earlier]
        pending = second.json()["requestId"]
        still = await client.get(f"/v1/review-requests/{pending}/result", headers=profile)
        assert still.status_code == 202
        refused(
            "casework",
            await client.post(
                "/v1/review-requests",
                json={**later, "subject": {**later["subject"], "version": "again"}},
                headers={**profile, **key(), "Registry-Source-Profile": "intake"},
            ),
            "source-profile.not-applicable",
        )


@pytest.mark.trio
async def test_breg_answers_records_metadata_and_actions_as_its_contract_says() -> None:
    query = {"accessProfile": PARAMETERS["breg"]["accessProfile"]}
    async with serving("breg") as client:
        read = await client.get(f"/v1/records/applications/{RECORD}", params=query)
        traced(read)
        assert answered("breg", "read-record", read)["data"]["recordIdentifier"] == RECORD
        assert read.headers["etag"].startswith('"breg-') and read.headers["etag"].endswith('"')
        for concealed in (
            await client.get(f"/v1/records/applications/{RECORD[:-3]}404", params=query),
            await client.get(f"/v1/records/applications/{RECORD}", params={"accessProfile": "x"}),
            await client.get("/v1/records/applications/APP-1", params=query),
        ):
            refused("breg", concealed, "resource.not_found")
        metadata = (await client.get("/v1/registry", params=query)).json()
        action = select(metadata, "mark-reviewed", query["accessProfile"])
        assert action.condition_keys == ("targetId",)
        conditions = await client.post(
            "/v1/actions/mark-reviewed/target-conditions",
            params=query,
            json={"input": {"targetId": RECORD}},
        )
        preconditions = conditions.json()["preconditions"]
        body = {
            "input": {"targetId": RECORD, "outcome": "approved"},
            "preconditions": preconditions,
        }
        sent = key()
        invoked = await client.post(
            "/v1/actions/mark-reviewed", params=query, json=body, headers=sent
        )
        receipt = answered("breg", "invoke-action", invoked)
        assert receipt["results"]["application"]["revision"] == 2
        again = await client.post(
            "/v1/actions/mark-reviewed", params=query, json=body, headers=sent
        )
        assert (again.status_code, again.json()) == (200, receipt)
        other = {**body, "input": {**body["input"], "outcome": "rejected"}}
        refused(
            "breg",
            await client.post("/v1/actions/mark-reviewed", params=query, json=other, headers=sent),
            "idempotency.conflict",
        )
        # The record moved on: the first condition token is stale now.
        refused(
            "breg",
            await client.post("/v1/actions/mark-reviewed", params=query, json=body, headers=key()),
            "precondition.failed",
        )
        missing = {"input": {"targetId": RECORD, "outcome": "approved"}}
        refused(
            "breg",
            await client.post(
                "/v1/actions/mark-reviewed", params=query, json=missing, headers=key()
            ),
            "request.invalid",
        )


@pytest.mark.trio
async def test_scheduling_answers_its_policy_availability_bookings_and_receipts() -> None:
    """Bookings are made under Casework's task authority (``adapters.rs``): a standing
    service token is refused, a token exchanged for a task grant's assertion books. Here
    that token is put in the stand-in's keeping as its IdP issues one (the exchange
    itself is the service tests' ``test_a_booking_is_made_under_the_task_grant...``)."""
    facts = CONTRACTS["scheduling"]["operations"]
    tokens = Tokens(STANDIN_TOKEN, STAFF_TOKEN)
    granted = f"Bearer granted-{uuid.uuid4()}"
    tokens.issued[granted.removeprefix("Bearer ")] = Issued(
        time.monotonic() + 600, "scheduling:book", "urn:example:scheduling", str(uuid.uuid4())
    )
    under_grant = {"Authorization": granted}
    async with serving("scheduling", tokens) as client:
        policy = answered("scheduling", "read-scheduling", await client.get("/v1/scheduling"))
        asked: dict[str, str | int] = {
            "offering": "passport",
            "start": "2026-10-12T00:00:00Z",
            "end": "2026-10-13T00:00:00Z",
            "limit": 20,
        }
        page = answered(
            "scheduling", "read-availability", await client.get("/v1/availability", params=asked)
        )
        slot = page["items"][0]
        admission = {
            **facts["create-appointment"]["accepts"][0]["admission"],
            "offering": "passport",
            "start": slot["start"],
            "policyRevision": policy["policyRevision"],
        }
        body = {"admission": admission}
        sent = key()
        standing = await client.post("/v1/appointments", json=body, headers=key())
        refused("scheduling", standing, "operation.not-authorized")  # no task grant
        booked = answered(
            "scheduling",
            "create-appointment",
            await client.post("/v1/appointments", json=body, headers={**sent, **under_grant}),
        )
        assert booked["state"] == "confirmed"
        receipt = await client.post("/v1/appointments/receipt", json=body, headers=sent)
        assert (receipt.status_code, receipt.json()) == (200, booked)
        refused(
            "scheduling",
            await client.post("/v1/appointments/receipt", json=body, headers=key()),
            "receipt.unresolved",
        )
        full = await client.post("/v1/appointments", json=body, headers={**key(), **under_grant})
        refused("scheduling", full, "capacity.exhausted")
        stale = {"admission": {**admission, "policyRevision": policy["policyRevision"] + 1}}
        refused(
            "scheduling",
            await client.post("/v1/appointments", json=stale, headers={**key(), **under_grant}),
            "policy.changed",
        )
