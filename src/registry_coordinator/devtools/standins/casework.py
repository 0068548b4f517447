"""Stand-in Registry Casework: review requests, their results, the feed, staff decisions.

As the real product: a producer (Coordinator) asks for a review under its requester
profile (``Registry-Casework-Profile``), naming one version of a subject; the same key
and request, or the same subject version under another key, recover the original
request (200). Staff decide: a staff member claims the review's task (``If-Match`` its
revision) and records a decision on it; Coordinator never decides. The settled result is
read with 200, pending with an empty 202, unknown with an empty 404. A request for another
version of a subject under the same kind settles every review of its earlier versions
still under way as ``superseded``. Each settlement is listed on the result feed, and
pushed as ``review.completed`` to the producer's destination (the stand-in's webhook)
with the destination's static secret as a bearer token, again every ``retry`` seconds
until the destination answers an empty 204, a dozen times at most.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import trio

from registry_coordinator.authoring.canonical import JSON, canonical_bytes
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.devtools.standins import grants
from registry_coordinator.devtools.standins.server import (
    Answer,
    Call,
    Keys,
    Refusal,
    Route,
    StandIn,
    Tokens,
    Webhook,
    new_id,
)

#: The requester profile Coordinator's producer is declared under, and the staff one.
REQUESTER_PROFILE = "coordinator"
STAFF_PROFILE = "reviewer"
#: What this stand-in's project declares: its review kinds and the producer's sources.
KINDS = ("application-review", "document-review")
RECIPIENT_BINDING = "coordinator"
RETAINED = timedelta(days=90)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_PROFILE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_DECISIONS = {
    "approve": "approved",
    "reject": "rejected",
    "changes-requested": "changes-requested",
    "answer": "answered",
}

#: code -> (status, title, detail), the detail fixed per code.
PROBLEMS = {
    "authentication.refused": (
        401,
        "Authentication refused",
        "The bearer credential is missing, invalid, or expired. Sign in again.",
    ),
    "idempotency.expired": (
        410,
        "Idempotency window expired",
        "The stored response for this idempotency key has expired. Reconcile the original "
        "operation before choosing a new key.",
    ),
    "idempotency.key-reused": (
        409,
        "Idempotency key reused",
        "This idempotency key was used for a different request.",
    ),
    "operation.not-authorized": (
        403,
        "Operation not authorized",
        "Your current Casework authority does not allow this operation.",
    ),
    "precondition.failed": (
        412,
        "Precondition failed",
        "The item or directory changed since you loaded it. Reload and try again.",
    ),
    "precondition.required": (
        428,
        "Precondition required",
        "This mutation requires the revision that you loaded.",
    ),
    "profile.not-authorized": (
        403,
        "Profile not authorized",
        "The selected Casework profile does not authorize this request.",
    ),
    "request.invalid": (400, "Invalid request", "The Casework request is invalid."),
    "request.limit-out-of-range": (
        400,
        "Page size out of range",
        "The limit query parameter must be from 1 to 100, or from 1 to 1000 on the "
        "directory absence list. Omit it for the default page size.",
    ),
    "request.not-found": (404, "Route not found", "The requested route does not exist."),
    "request.unprocessable": (
        422,
        "Request could not be processed",
        "The request body does not match the Casework contract.",
    ),
    "review.result-expired": (
        410,
        "Review result expired",
        "The retained review result is no longer available. Reconcile through the "
        "producer's retained source correlation.",
    ),
    "review.submission-conflict": (
        409,
        "Review submission conflict",
        "The same producer, source subject, version, and policy were already submitted "
        "with different canonical content.",
    ),
    "review.task-not-held": (
        409,
        "Review task not held",
        "Claim the review task before deciding it, and decide only while the claim "
        "remains current.",
    ),
    "runtime.failure": (
        500,
        "Casework runtime failure",
        "Casework could not complete the request.",
    ),
    "source-profile.not-applicable": (
        400,
        "Source profile not applicable",
        "This route does not take Registry-Source-Profile.",
    ),
    "service.unavailable": (
        503,
        "Casework service unavailable",
        "Casework storage is unavailable. Try again after the service recovers.",
    ),
    "work-item.not-visible": (
        404,
        "Work item not visible",
        "The registry did not show you this request, so Casework cannot show you the item.",
    ),
}


def _digest(value: JSON) -> str:
    return "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()


@dataclass
class Review:
    request_id: str
    accepted: dict[str, JSON]  # the ReviewRequestAccepted answer
    binding: tuple[str, ...]  # source, type, id, version, kind
    task_id: str = field(default_factory=new_id)
    revision: int = 1
    holder: str | None = None
    result: dict[str, JSON] | None = None


class Casework(StandIn):
    product = "casework"
    problem_base = "https://id.registrystack.org/problems/registry-casework/"
    problems = PROBLEMS

    def __init__(self, tokens: Tokens, webhook: Webhook | None = None, retry: float = 1.0) -> None:
        self.reviews: dict[str, Review] = {}
        self.tasks: dict[str, Review] = {}
        self.feed: list[dict[str, JSON]] = []
        #: Task grants people approved: id -> (deadline, client, resource, scopes).
        self.grants: dict[str, tuple[int, str, str, str]] = {}
        self.retry = retry
        super().__init__(tokens, webhook)

    def control(self, name: str, body: Any) -> JSON:
        """``POST /_control/grant {client, resource, scope, seconds?}``: a person approves a
        task grant for Coordinator's agent (as at a review task's task-grants route); its
        reference ``{id, expiresAt}``, as a workflow's input names it."""
        if name != "grant":
            return None
        grant = new_id()
        deadline = int(time.time()) + int(body.get("seconds", 900))
        scope = str(body.get("scope", ""))
        self.grants[grant] = (deadline, str(body["client"]), str(body["resource"]), scope)
        return {"id": grant, "expiresAt": deadline}

    def make_keys(self) -> Keys:
        # A request recovered by its key is answered 200, as any recovered binding.
        return Keys("idempotency.key-reused", replay_status=lambda status: 200)

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/v1/review-requests", self.create, keyed=True),
            Route("GET", "/v1/review-requests/{requestId}/result", self.result),
            Route("GET", "/v1/review-results", self.results),
            Route("GET", "/v1/review-tasks", self.task_list, staff=True),
            Route("POST", "/v1/review-tasks/{taskId}/claim", self.claim, keyed=True, staff=True),
            Route(
                "POST", "/v1/review-tasks/{taskId}/decisions", self.decide, keyed=True, staff=True
            ),
            Route("POST", "/v1/task-grants/{grantId}/assertion", self.assert_grant),
        ]

    def check(self, call: Call, route: Route) -> None:
        if route.handler == self.assert_grant:
            return  # an agent's bootstrap, with no profile of its own
        profile = call.headers.get("Registry-Casework-Profile")
        if profile is None or not _PROFILE.match(profile):
            raise Refusal("request.invalid", "send Registry-Casework-Profile")
        if profile != (STAFF_PROFILE if route.staff else REQUESTER_PROFILE):
            raise Refusal("profile.not-authorized")
        if "Registry-Source-Profile" in call.headers and not route.staff:
            raise Refusal("source-profile.not-applicable")

    # --- the producer's routes ------------------------------------------------------------

    async def create(self, call: Call) -> Answer:
        body = _create_request(call.body)
        subject = body["subject"]
        assert isinstance(subject, dict)
        binding = (*(str(subject[k]) for k in ("source", "type", "id", "version")), body["kind"])
        submission = _digest({"producer": "coordinator", "request": body})
        for review in self.reviews.values():
            if review.binding == binding:
                if review.accepted["submissionDigest"] != submission:
                    raise Refusal("review.submission-conflict")
                return Answer(200, review.accepted)
        for review in list(self.reviews.values()):
            same_subject = review.binding[:3] == binding[:3] and review.binding[4] == binding[4]
            if same_subject and review.result is None:
                self.settle(review, "superseded", {})
        request_id = new_id()
        policy = {"id": body["kind"], "version": "1", "digest": _digest({"kind": body["kind"]})}
        accepted = {
            "requestId": request_id,
            "subject": subject,
            "policy": policy,
            "submissionDigest": submission,
        }
        review = Review(request_id, accepted, binding)
        self.reviews[request_id] = review
        self.tasks[review.task_id] = review
        return Answer(201, accepted)

    async def result(self, call: Call) -> Answer:
        review = self.reviews.get(call.params["requestId"])
        if review is None:
            return Answer(404, empty=True)
        if review.result is None:
            return Answer(202, empty=True)
        return Answer(200, review.result)

    async def results(self, call: Call) -> Answer:
        """The feed: settlements after the cursor (an event id), oldest first."""
        try:
            limit = int(call.query.get("limit", "25"))
        except ValueError:
            raise Refusal("request.invalid", "limit is a whole number") from None
        if not 1 <= limit <= 100:
            raise Refusal("request.limit-out-of-range")
        start = 0
        cursor = call.query.get("cursor")
        if cursor is not None:
            ids = [entry["eventId"] for entry in self.feed]
            if cursor not in ids:
                raise Refusal("review.result-expired")
            start = ids.index(cursor) + 1
        page = self.feed[start : start + limit]
        more = start + limit < len(self.feed)
        return Answer(200, {"items": page, **({"nextCursor": page[-1]["eventId"]} if more else {})})

    async def assert_grant(self, call: Call) -> Answer:
        """An agent's assertion of a grant a person approved: asked with a bootstrap token
        (scope casework:grants:assert), never with a profile."""
        issued = self.tokens.of(call.headers.get("Authorization"))
        if issued is None or "casework:grants:assert" not in issued.scope.split():
            raise Refusal("operation.not-authorized")
        if "Registry-Casework-Profile" in call.headers or call.raw:
            raise Refusal("authentication.refused")
        found = self.grants.get(call.params["grantId"])
        if found is None:
            raise Refusal("work-item.not-visible")
        deadline, client, resource, scope = found
        if deadline <= time.time():
            raise Refusal("operation.not-authorized")
        grant = call.params["grantId"]
        signed, expires = grants.assertion(grant, deadline, client, resource, scope)
        return Answer(200, {"assertion": signed, "expiresAt": expires, "grantExpiresAt": deadline})

    # --- staff ----------------------------------------------------------------------------

    async def task_list(self, call: Call) -> Answer:
        items = [_task(review) for review in self.tasks.values() if review.result is None]
        return Answer(200, {"items": items, "status": "complete"})

    def _task_at(self, call: Call) -> Review:
        review = self.tasks.get(call.params["taskId"])
        if review is None or review.result is not None:
            raise Refusal("work-item.not-visible")
        expected = call.headers.get("If-Match")
        if expected is None:
            raise Refusal("precondition.required")
        if expected != f'"{review.revision}"':
            raise Refusal("precondition.failed")
        return review

    async def claim(self, call: Call) -> Answer:
        if call.raw:
            raise Refusal("request.invalid", "a claim has no body")
        review = self._task_at(call)
        if review.holder is not None and review.holder != "staff":
            raise Refusal("review.task-not-held")
        review.holder, review.revision = "staff", review.revision + 1
        return Answer(200, _task(review))

    async def decide(self, call: Call) -> Answer:
        review = self._task_at(call)
        if review.holder != "staff":
            raise Refusal("review.task-not-held")
        decision = call.body.get("decision") if isinstance(call.body, dict) else None
        kind = decision.get("type") if isinstance(decision, dict) else None
        if kind not in _DECISIONS:
            raise Refusal(
                "request.unprocessable", "decide approve, reject, changes-requested or answer"
            )
        assert isinstance(decision, dict)
        if kind != "approve" and not isinstance(decision.get("outcome"), str):
            raise Refusal("request.unprocessable", "name the decision's outcome")
        self.settle(review, _DECISIONS[kind], decision)
        return Answer(204, empty=True)

    def settle(self, review: Review, status: str, decision: dict[str, JSON]) -> None:
        """A review's result, the feed entry that lists it, and its completion pushed."""
        completed = datetime.now(UTC)
        review.revision += 1
        review.result = {
            "resultId": new_id(),
            "requestId": review.request_id,
            "subject": review.accepted["subject"],
            "policy": review.accepted["policy"],
            "submissionDigest": review.accepted["submissionDigest"],
            "status": status,
            **({"outcome": decision["outcome"]} if "outcome" in decision else {}),
            **({"result": decision["result"]} if isinstance(decision.get("result"), dict) else {}),
            "completedAt": format_instant(completed),
            "availableUntil": format_instant(completed + RETAINED),
        }
        event = {
            "eventId": new_id(),
            "requestId": review.request_id,
            "resultId": review.result["resultId"],
            "completedAt": review.result["completedAt"],
        }
        self.feed.append(event)
        if self.webhook is not None:
            self.start_soon(lambda: self._push(event))

    async def _push(self, event: dict[str, JSON]) -> None:
        """Deliver one completion as Casework's outbox does: POST, the destination's secret
        as a bearer token, the event id as its key, again until an empty 204."""
        assert self.webhook is not None
        await trio.sleep(self.webhook.delay)
        body = json.dumps({"type": "review.completed", **event}).encode()
        headers = {
            "Authorization": f"Bearer {self.webhook.secret}",
            "Content-Type": "application/json",
            "Idempotency-Key": str(event["eventId"]),
            "Registry-Recipient-Binding": RECIPIENT_BINDING,
        }
        for _ in range(12):
            try:
                async with httpx.AsyncClient(timeout=5, follow_redirects=False) as client:
                    response = await client.post(self.webhook.url, content=body, headers=headers)
                self.ledger.webhooks.append({**event, "status": response.status_code})
                if response.status_code == 204 and not response.content:
                    return
            except httpx.HTTPError as exc:
                self.ledger.webhooks.append({**event, "error": repr(exc)})
            await trio.sleep(self.retry)


def _task(review: Review) -> JSON:
    state: JSON = (
        "open"
        if review.holder is None
        else {"held": {"holder": {"issuer": "stand-in", "subject": review.holder}}}
    )
    if review.result is not None:
        state = "decided"
    return {
        "taskId": review.task_id,
        "requestId": review.request_id,
        "stageIndex": 0,
        "stageId": "review",
        "queue": "applications",
        "revision": review.revision,
        "eligibleProfiles": [STAFF_PROFILE],
        "state": state,
    }


def _text(value: JSON, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value.encode()) <= limit and value.strip() == value


def _create_request(body: JSON) -> dict[str, JSON]:
    """A ReviewCreateRequest as Casework reads it (closed objects throughout)."""
    known = {"kind", "subject", "requesterReference", "initiator", "context", "resultConstraints"}
    if not isinstance(body, dict) or set(body) - known:
        raise Refusal("request.unprocessable", "a ReviewCreateRequest has no such members")
    if body.get("kind") not in KINDS:
        raise Refusal("operation.not-authorized", "the producer may not ask for this kind")
    subject = body.get("subject")
    names = {"source", "type", "id", "version", "digest"}
    if not isinstance(subject, dict) or set(subject) != names:
        raise Refusal("request.unprocessable", "subject is {source, type, id, version, digest}")
    if not all(_text(subject[k], 128) for k in ("source", "type", "id", "version")):
        raise Refusal("request.invalid", "subject members are 1 to 128 bytes of text")
    if not isinstance(subject["digest"], str) or not _DIGEST.match(subject["digest"]):
        raise Refusal("request.unprocessable", "subject.digest is sha256:<64 hex>")
    if not _text(body.get("requesterReference"), 256):
        raise Refusal("request.invalid", "requesterReference is 1 to 256 bytes of text")
    context = body.get("context")
    if not isinstance(context, dict) or context.get("strategy") not in ("submitted", "source"):
        raise Refusal("request.unprocessable", "context is {strategy: submitted|source, ...}")
    if context["strategy"] == "submitted" and not isinstance(context.get("snapshot"), dict):
        raise Refusal("request.invalid", "a submitted context carries a snapshot object")
    if context["strategy"] == "source":
        binding = context.get("binding")
        if not isinstance(binding, dict) or not _text(binding.get("reference"), 256):
            raise Refusal("request.unprocessable", "a source context carries binding.reference")
    return body
