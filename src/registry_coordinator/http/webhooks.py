"""Result webhooks: how products sign deliveries, and how Coordinator checks them.

A delivery carries ``Coordinator-Signature: t=<unix seconds>,v2=<hex>``, where the
hex is HMAC-SHA256 with the connection's webhook secret over the timestamp, a dot,
the connection's name (the last segment of ``/v1/results/{connection}``), a dot
and the raw body. The name is signed so that a delivery meant for one connection is
refused by another even where both were given the same secret (connection names
hold no dots, so the signed text is unambiguous). A signature older or newer than
five minutes is refused, so a captured delivery cannot be replayed later;
comparison is constant-time. ``v1`` signatures, which left the connection out, are
refused with a message saying so.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from registry_coordinator.http.problems import Problem

SIGNATURE_HEADER = "Coordinator-Signature"
REPLAY_WINDOW = 300  # seconds
_SIGNATURE = re.compile(r"^t=(\d{1,12}),v2=([0-9a-f]{64})$")
_FORMAT = "t=<unix seconds>,v2=<64 hex digits>"


def sign(secret: str, timestamp: int, connection: str, body: bytes) -> str:
    """The signature header a product sends with ``body`` to ``connection``."""
    signed = f"{timestamp}.{connection}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256)
    return f"t={timestamp},v2={digest.hexdigest()}"


def verify(secret: str, header: str | None, connection: str, body: bytes, now: float) -> None:
    """Accept a delivery's signature, or refuse it with a 401 :class:`Problem`."""
    if not header:
        raise Problem(
            401, "webhook.signature-missing", f"sign the delivery: send a {SIGNATURE_HEADER} header"
        )
    match = _SIGNATURE.match(header.strip())
    if match is None:
        old = ",v1=" in header
        raise Problem(
            401,
            "webhook.signature-invalid",
            f"{SIGNATURE_HEADER} must read {_FORMAT}"
            + (
                ", signed over timestamp.connection.body (v1 left the connection out)"
                if old
                else ""
            ),
        )
    timestamp = int(match[1])
    if abs(now - timestamp) > REPLAY_WINDOW:
        raise Problem(
            401,
            "webhook.signature-stale",
            "the signature's timestamp is more than five minutes away from "
            "now: sign each delivery when it is sent",
        )
    expected = sign(secret, timestamp, connection, body)
    if not hmac.compare_digest(expected, f"t={timestamp},v2={match[2]}"):
        raise Problem(
            401,
            "webhook.signature-invalid",
            f"the signature does not match the body, connection {connection} and its secret",
        )
