"""The tests' secrets and what is signed with them: the stand-ins' bearer and staff tokens,
the webhook secret and the requests a product signs with it, the auth sections that trust
the development issuer or the stand-in OpenID Connect issuer, and audit signing keys."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.http.auth import DEVELOPMENT_AUDIENCE, DEVELOPMENT_ISSUER, jwks_path
from registry_coordinator.http.webhooks import SIGNATURE_HEADER, sign

STANDIN_TOKEN = "test-token-1"
#: The token of a staff member at the stand-in Casework, who decides reviews.
STAFF_TOKEN = "test-staff-token"
WEBHOOK_SECRET = "test-webhook-secret"
#: The values of the connection-bound parameters the stand-ins grant Coordinator.
PARAMETERS: dict[str, dict[str, str]] = {
    "breg": {"accessProfile": "coordinator"},
    "casework": {"profile": "coordinator"},
    "messaging": {"senderProfile": "case-notices"},
}
#: The console's client id at the stand-in issuer, in the configurations of :func:`signed_in`.
CONSOLE_CLIENT = "registry-console"


def delivery_request(
    body: Any,
    connection: str = "reviews",
    *,
    secret: str = WEBHOOK_SECRET,
    at: float | None = None,
    raw: bytes | None = None,
) -> dict[str, Any]:
    """The keyword arguments of an httpx ``post`` to ``/v1/results/{connection}`` that
    delivers ``body`` (or the bytes ``raw``) signed as a product signs it."""
    content = raw if raw is not None else json.dumps(body).encode()
    timestamp = int(at if at is not None else time.time())
    return {
        "url": f"/v1/results/{connection}",
        "content": content,
        "headers": {
            SIGNATURE_HEADER: sign(secret, timestamp, connection, content),
            "Content-Type": "application/json",
        },
    }


def completion_request(
    request_id: str,
    connection: str = "reviews",
    *,
    event_id: str | None = None,
    secret: str = WEBHOOK_SECRET,
) -> dict[str, Any]:
    """The keyword arguments of an httpx ``post`` to ``/v1/results/{connection}`` that
    pushes a Casework ``review.completed`` event for ``request_id``, as Casework's outbox
    sends it: the destination's secret as a bearer token, the event id as its key."""
    event = event_id or str(uuid.uuid4())
    body = {
        "type": "review.completed",
        "eventId": event,
        "requestId": request_id,
        "resultId": str(uuid.uuid4()),
        "completedAt": "2026-12-02T10:00:00Z",
    }
    return {
        "url": f"/v1/results/{connection}",
        "json": body,
        "headers": {
            "Authorization": f"Bearer {secret}",
            "Idempotency-Key": event,
            "Registry-Recipient-Binding": "coordinator",
        },
    }


def development_jwt(key: Path, *policies: dict[str, Any]) -> dict[str, Any]:
    """An ``auth`` section trusting the development issuer's tokens signed with ``key``
    (:func:`mint`), for the callers ``policies`` name."""
    return {
        "mode": "jwt",
        "issuer": DEVELOPMENT_ISSUER,
        "audience": DEVELOPMENT_AUDIENCE,
        "jwksFile": str(jwks_path(key)),
        "policies": list(policies),
    }


def signed_in(issuer_port: int, key: Path) -> dict[str, Any]:
    """Configuration sections for a service whose callers and console people come from the
    stand-in issuer on ``issuer_port`` (signing with ``key``): its people ada (an operator)
    and sam (the case portal, which may start, read and cancel its own runs)."""
    return {
        "auth": {
            "mode": "jwt",
            "issuer": f"http://127.0.0.1:{issuer_port}",
            "audience": DEVELOPMENT_AUDIENCE,
            "jwksFile": str(jwks_path(key)),
            "policies": [
                {
                    "client": "case-portal",
                    "scopes": ["coordinator.runs"],
                    "workflows": ["*"],
                    "actions": ["start", "read", "cancel"],
                },
                {
                    "client": "registry-operators",
                    "scopes": ["coordinator.operate"],
                    "operator": True,
                },
            ],
        },
        "console": {"clientId": CONSOLE_CLIENT},
    }


def signing(directory: Path, every: str = "PT1S") -> dict[str, Any]:
    """The configuration's ``audit`` section, with a new Ed25519 signing key written to
    ``directory`` (``audit-key.pem``, and its public half ``audit-key.pub``), checkpoints
    made every ``every``."""
    key = Ed25519PrivateKey.generate()
    directory.mkdir(parents=True, exist_ok=True)
    private = directory / "audit-key.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (directory / "audit-key.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return {"audit": {"signingKey": f"file:{private}", "checkpointEvery": every}}


def oauth2(idp_port: int, **credentials: str) -> dict[str, object]:
    """A connection's identity: OAuth 2 client credentials at the stand-in IdP, for a
    token meant for Messaging (its RFC 8707 resource)."""
    return {
        "oauth2": {
            "tokenUrl": f"http://127.0.0.1:{idp_port}/oauth2/token",
            "clientId": "coordinator",
            "scopes": ["messaging:send"],
            "resource": "urn:example:messaging",
            **credentials,
        }
    }
