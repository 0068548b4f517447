"""Webhook signatures, in-process: the timestamp is part of what is signed.

The end-to-end tests sign their deliveries with ``webhooks.sign`` itself, so a
signature that left the timestamp out would still match there (sign and verify
would agree with each other) and the stale checks only look at ``t=``. Then the
five-minute window would stop no replay: anyone could re-date a captured delivery.
Here a signature is compared with one computed by hand, and a captured signature
moved to another timestamp inside the window must be refused.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest

from registry_coordinator.http.problems import Problem
from registry_coordinator.http.webhooks import sign, verify

SECRET = "a-connections-secret"
BODY = b'{"result":"review-decision","key":"rev-1","eventId":"evt-1"}'
NOW = 1_700_000_000


def test_the_signature_is_an_hmac_over_timestamp_connection_and_body() -> None:
    signed = f"{NOW}.reviews.".encode() + BODY
    digest = hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
    assert sign(SECRET, NOW, "reviews", BODY) == f"t={NOW},v2={digest}"
    verify(SECRET, f"t={NOW},v2={digest}", "reviews", BODY, NOW)


def test_a_signature_moved_to_another_timestamp_is_refused() -> None:
    captured = sign(SECRET, NOW - 240, "reviews", BODY)
    verify(SECRET, captured, "reviews", BODY, NOW)  # four minutes old: still accepted
    redated = captured.replace(f"t={NOW - 240},", f"t={NOW},")
    assert redated != captured
    with pytest.raises(Problem) as refused:
        verify(SECRET, redated, "reviews", BODY, NOW)
    assert (refused.value.status, refused.value.code) == (401, "webhook.signature-invalid")
