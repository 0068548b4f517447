"""Result webhooks: how products sign deliveries, and how Coordinator checks them.

A delivery carries ``Coordinator-Signature: t=<unix seconds>,v1=<hex>``, where
the hex is HMAC-SHA256 with the connection's webhook secret over the timestamp,
a dot and the raw body. A signature older or newer than five minutes is refused,
so a captured delivery cannot be replayed later; comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from .problems import Problem

SIGNATURE_HEADER = "Coordinator-Signature"
REPLAY_WINDOW = 300  # seconds
_SIGNATURE = re.compile(r"^t=(\d{1,12}),v1=([0-9a-f]{64})$")


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify(secret: str, header: str | None, body: bytes, now: float) -> None:
    """Accept a delivery's signature, or refuse it with a 401 :class:`Problem`."""
    if not header:
        raise Problem(
            401, "webhook.signature-missing", f"sign the delivery: send a {SIGNATURE_HEADER} header"
        )
    match = _SIGNATURE.match(header.strip())
    if match is None:
        raise Problem(
            401,
            "webhook.signature-invalid",
            f"{SIGNATURE_HEADER} must read t=<unix seconds>,v1=<64 hex digits>",
        )
    timestamp = int(match[1])
    if abs(now - timestamp) > REPLAY_WINDOW:
        raise Problem(
            401,
            "webhook.signature-stale",
            "the signature's timestamp is more than five minutes away from "
            "now: sign each delivery when it is sent",
        )
    expected = sign(secret, timestamp, body)
    if not hmac.compare_digest(expected, f"t={timestamp},v1={match[2]}"):
        raise Problem(
            401,
            "webhook.signature-invalid",
            "the signature does not match the body and this connection's secret",
        )
