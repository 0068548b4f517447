"""Stand-in Registry Scheduling: the policy revision, availability, bookings, receipts.

As the real product: the service document names the policy revision a booking must
echo; availability is one page of an offering's slots between two instants, each with
how many places are free; a booking is a direct admission (never a hold) at a slot's
start under the current policy revision, refused ``policy.changed`` under another and
``capacity.exhausted`` when the slot is full; and the original receipt of a booking is
read by resending its key and body (``POST /v1/appointments/receipt``), answered 409
``receipt.unresolved`` when nothing matches. Every offering has hourly slots from 09:00
to 16:00 UTC on weekdays, one place each. A booking needs no scope but a token that
carries a task grant (exchanged for a stand-in Casework's assertion of one); a standing
service token is refused ``operation.not-authorized``, as the real product refuses it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.expressions import format_instant, parse_instant
from registry_coordinator.devtools.standins.server import (
    Answer,
    Call,
    Refusal,
    Route,
    StandIn,
    Tokens,
    new_id,
    now,
)

POLICY_REVISION = 7
_OFFERING = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")

#: code -> (status, title, detail); the stand-in gives each code's title as its detail.
PROBLEMS = {
    code: (status, title, title)
    for code, (status, title) in {
        "authentication.refused": (401, "Authentication refused"),
        "capacity.exhausted": (409, "Capacity exhausted"),
        "cursor.invalid": (400, "Cursor invalid"),
        "idempotency.expired": (410, "Idempotency window expired"),
        "idempotency.key-reused": (409, "Idempotency key reused"),
        "operation.not-authorized": (403, "Operation not authorized"),
        "policy.changed": (412, "Policy changed"),
        "profile.not-authorized": (403, "Profile not authorized"),
        "receipt.unresolved": (409, "Original receipt unresolved"),
        "request.invalid": (400, "Request invalid"),
        "request.method-not-allowed": (405, "Method not allowed"),
        "request.not-found": (404, "Not found"),
        "request.unprocessable": (422, "Request unprocessable"),
        "service.unavailable": (503, "Scheduling service unavailable"),
    }.items()
}


class Scheduling(StandIn):
    product = "scheduling"
    problem_base = "https://id.registrystack.org/problems/registry-scheduling/"
    problems = PROBLEMS

    def __init__(self, tokens: Tokens) -> None:
        self.booked: dict[tuple[str, str], int] = {}  # (offering, start) -> places taken
        super().__init__(tokens)

    def routes(self) -> list[Route]:
        return [
            Route("GET", "/v1/scheduling", self.service),
            Route("GET", "/v1/availability", self.availability),
            Route("POST", "/v1/appointments", self.book, keyed=True),
            Route("POST", "/v1/appointments/receipt", self.receipt),
        ]

    async def service(self, call: Call) -> Answer:
        digest = "sha256:" + f"{POLICY_REVISION:064x}"
        return Answer(
            200,
            {"schedulingId": "stand-in", "policyRevision": POLICY_REVISION, "policyDigest": digest},
        )

    def _slots(self, offering: str, start: datetime, end: datetime) -> list[datetime]:
        hour = start.replace(minute=0, second=0, microsecond=0)
        if hour < start:
            hour += timedelta(hours=1)
        found: list[datetime] = []
        while hour < end and len(found) < 500:
            if hour.weekday() < 5 and 9 <= hour.hour < 16:
                found.append(hour)
            hour += timedelta(hours=1)
        return found

    async def availability(self, call: Call) -> Answer:
        offering = call.query.get("offering", "")
        if not _OFFERING.match(offering):
            raise Refusal("request.invalid", "offering is an identifier")
        try:
            start = parse_instant(call.query.get("start", now()))
            end = parse_instant(call.query.get("end", "")) if "end" in call.query else start
            limit = min(200, max(1, int(call.query.get("limit", "50"))))
        except ValueError:
            raise Refusal("request.invalid", "start and end are instants, limit a number") from None
        end = min(max(end, start + timedelta(minutes=1)), start + timedelta(days=62))
        items = []
        for slot in self._slots(offering, start, end):
            free = 1 - self.booked.get((offering, format_instant(slot)), 0)
            if free > 0:
                items.append(
                    {
                        "kind": "slot",
                        "start": format_instant(slot),
                        "end": format_instant(slot + timedelta(minutes=30)),
                        "free": free,
                    }
                )
        return Answer(200, {"items": items[:limit], "nextCursor": None})

    async def book(self, call: Call) -> Answer:
        issued = self.tokens.of(call.headers.get("Authorization"))
        if issued is None or issued.grant is None:  # a booking needs a complete task grant
            raise Refusal("operation.not-authorized")
        body = call.body
        admission = body.get("admission") if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or body.get("hold") is not None
            or not isinstance(admission, dict)
        ):
            raise Refusal("request.invalid", "book with an admission, never a hold")
        offering = admission.get("offering")
        if not isinstance(offering, str) or not _OFFERING.match(offering):
            raise Refusal("request.unprocessable", "admission.offering is an identifier")
        if admission.get("policyRevision") != POLICY_REVISION:
            raise Refusal("policy.changed")
        try:
            start = parse_instant(str(admission.get("start")))
        except ValueError:
            raise Refusal("request.unprocessable", "admission.start is an instant") from None
        if start not in self._slots(offering, start, start + timedelta(minutes=1)):
            raise Refusal("request.unprocessable", "admission.start is no slot of the offering")
        taken = (offering, format_instant(start))
        if self.booked.get(taken, 0) >= 1:
            raise Refusal("capacity.exhausted")
        self.booked[taken] = self.booked.get(taken, 0) + 1
        document: JSON = {
            "appointmentId": new_id(),
            "offering": offering,
            "start": format_instant(start),
            "end": format_instant(start + timedelta(minutes=30)),
            "resource": "desk-1",
            "units": 1,
            "channel": admission.get("channel"),
            "revision": 1,
            "state": "confirmed",
            "policyRevision": POLICY_REVISION,
            "createdAt": format_instant(datetime.now(UTC)),
            "cancelledAt": None,
            "externalReferences": admission.get("externalReferences", []),
        }
        return Answer(201, document)

    async def receipt(self, call: Call) -> Answer:
        held = self.held_answer("/v1/appointments", call)
        if held is None:
            raise Refusal("receipt.unresolved")
        return Answer(200, held.body)
