"""Stand-in Registry Messaging: submit, the original receipt, and what became of a message.

As the real product: a submission names its sender profile and exactly one recipient,
and either a template with its locale and data or direct content; it is accepted with
202 and a queued receipt. Messaging sends nothing to its callers: what became of a
message is only read (``GET /v1/messages/{id}``), where the worker's ``dispatch`` and the
provider's ``report`` give its ``status``. This stand-in's provider accepts each message
``delivery_delay`` seconds after it was queued and reports it delivered at once (a
negative delay: never), or, for a sender profile whose provider reports nothing
(:data:`UNREPORTED`), leaves it ``submitted`` with report ``unavailable``.
"""

from __future__ import annotations

import re

import trio

from registry_coordinator.authoring.canonical import JSON
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

#: Sender profiles the stand-in's access profile for Coordinator lists, with their channel.
SENDERS = {"case-notices": "email", "case-notices-sms": "sms", "case-notices-smtp": "email"}
#: Sender profiles whose provider reports no deliveries (SMTP): submitted is their last word.
UNREPORTED = frozenset({"case-notices-smtp"})
_EMAIL = re.compile(r"^[!-~]+@[!-~]+\.[!-~]+$")
_PHONE = re.compile(r"^\+[1-9][0-9]{1,14}$")
_KNOWN = {
    "senderProfile",
    "to",
    "template",
    "locale",
    "data",
    "content",
    "correlationId",
    "notBefore",
    "expiresAt",
}

#: code -> (status, title, detail), each fixed per code and carrying no values.
PROBLEMS = {
    "authentication.refused": (
        401,
        "Authentication refused",
        "The bearer credential is missing, invalid, or expired. Sign in again.",
    ),
    "content.invalid": (
        422,
        "Content invalid for the channel",
        "The content does not have the parts the channel requires, or the template's "
        "channel differs from the sender profile's.",
    ),
    "idempotency.expired": (
        410,
        "Idempotency window expired",
        "The stored response for this idempotency key has expired. Reconcile the original "
        "submission before choosing a new key.",
    ),
    "idempotency.key-reused": (
        409,
        "Idempotency key reused",
        "This idempotency key was used for a different request.",
    ),
    "message.not-visible": (
        404,
        "Message not visible",
        "No message with this identifier is visible to the caller.",
    ),
    "profile.not-authorized": (
        403,
        "Profile not authorized",
        "No Messaging access profile authorizes this caller for this request.",
    ),
    "rate-limit.exceeded": (
        429,
        "Request rate exceeded",
        "The request rate accepted from this caller is exceeded. Try again after the time "
        "in Retry-After.",
    ),
    "receipt.unresolved": (
        409,
        "Original receipt unresolved",
        "No retained success receipt matches this caller, key, and original request. The "
        "original outcome remains unknown; this is not evidence that no effect occurred.",
    ),
    "request.body-too-large": (
        413,
        "Payload too large",
        "The request body exceeds the accepted size.",
    ),
    "request.invalid": (
        400,
        "Request invalid",
        "The request could not be read as a Messaging request.",
    ),
    "request.method-not-allowed": (
        405,
        "Method not allowed",
        "The route exists but not for this method.",
    ),
    "request.not-found": (404, "Route not found", "The requested route does not exist."),
    "request.unprocessable": (
        422,
        "Request unprocessable",
        "The request body could not be processed.",
    ),
    "request.unsupported-media-type": (
        415,
        "Unsupported media type",
        "The request body is not JSON.",
    ),
    "service.unavailable": (
        503,
        "Messaging service unavailable",
        "Messaging is unavailable. Try again after the service recovers.",
    ),
    "template.data-invalid": (
        422,
        "Template data invalid",
        "The template data does not match what the template takes.",
    ),
    "template.not-found": (
        404,
        "Template not found",
        "No template with this identifier and version is available to the caller.",
    ),
}


class Messaging(StandIn):
    product = "messaging"
    problem_base = "https://id.registrystack.org/problems/registry-messaging/"
    problems = PROBLEMS

    def __init__(self, tokens: Tokens, delivery_delay: float = 0.5) -> None:
        self.delivery_delay = delivery_delay
        self.messages: dict[str, dict[str, JSON]] = {}
        super().__init__(tokens)

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/v1/messages", self.submit, keyed=True),
            Route("POST", "/v1/messages/receipt", self.receipt),
            Route("GET", "/v1/messages/{id}", self.read),
        ]

    async def submit(self, call: Call) -> Answer:
        body = _submission(call.body)
        message_id = new_id()
        sender = body["senderProfile"]
        channel = SENDERS[sender]
        self.messages[message_id] = {
            "id": message_id,
            "status": "queued",
            "dispatch": "queued",
            "report": "unavailable" if sender in UNREPORTED else "none",
            "channel": channel,
            "senderProfile": sender,
            "to": {"email": "redacted"} if channel == "email" else {"phone": "redacted"},
            **({"template": body["template"]} if "template" in body else {}),
            **({"correlationId": body["correlationId"]} if "correlationId" in body else {}),
            "acceptedAt": now(),
            "expiresAt": body.get("expiresAt", now()),
            "updatedAt": now(),
            "attempts": [],
            "links": _links(message_id),
        }
        if self.delivery_delay >= 0:
            self.start_soon(lambda: self._dispatch(message_id))
        return Answer(202, {"id": message_id, "status": "queued", "links": _links(message_id)})

    async def _dispatch(self, message_id: str) -> None:
        """The provider takes the message after the delay, and reports it delivered, or
        nothing at all."""
        await trio.sleep(self.delivery_delay)
        message = self.messages[message_id]
        reported = message["report"] != "unavailable"
        message.update(
            dispatch="submitted",
            status="delivered" if reported else "submitted",
            report="delivered" if reported else "unavailable",
            updatedAt=now(),
            attempts=[
                {
                    "generation": 1,
                    "attempt": 1,
                    "outcome": "accepted",
                    "startedAt": now(),
                    "finishedAt": now(),
                    "providerReference": True,
                }
            ],
        )
        if reported:
            message["reportedAt"] = now()

    async def receipt(self, call: Call) -> Answer:
        """The original receipt, for the original key and the same request; anything else
        is unresolved (which says nothing of whether the original took effect)."""
        held = self.held_answer("/v1/messages", call)
        if held is None:
            raise Refusal("receipt.unresolved")
        return Answer(200, held.body)

    async def read(self, call: Call) -> Answer:
        message = self.messages.get(call.params["id"])
        if message is None:
            raise Refusal("message.not-visible")
        return Answer(200, message)


def _links(message_id: str) -> JSON:
    return {"self": f"/v1/messages/{message_id}", "cancel": f"/v1/messages/{message_id}/cancel"}


def _submission(body: JSON) -> dict[str, JSON]:
    """A submission as Messaging reads it: closed, one recipient of the sender profile's
    channel, and a template with its locale and data, or direct content."""
    if not isinstance(body, dict) or set(body) - _KNOWN or "to" not in body:
        raise Refusal("request.unprocessable", "a submission is a closed SubmitMessageRequest")
    sender = body.get("senderProfile")
    if not isinstance(sender, str):
        raise Refusal("request.unprocessable", "a submission names its senderProfile")
    if sender not in SENDERS:
        raise Refusal("profile.not-authorized", "the access profile lists no such sender profile")
    to = body["to"]
    if not isinstance(to, dict) or len(to) != 1:
        raise Refusal("request.unprocessable", "name exactly one recipient")
    channel = SENDERS[str(sender)]
    address = to.get("email" if channel == "email" else "phone")
    pattern = _EMAIL if channel == "email" else _PHONE
    if not isinstance(address, str) or not pattern.match(address):
        raise Refusal("request.unprocessable", f"the sender profile sends by {channel}")
    templated = {"template", "locale", "data"} <= set(body)
    direct = "content" in body and not {"template", "locale", "data"} & set(body)
    if templated == direct:
        raise Refusal("request.unprocessable", "give template, locale and data, or content")
    if templated and not isinstance(body["data"], dict):
        raise Refusal("template.data-invalid", "template data is an object")
    return body
