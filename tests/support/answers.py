"""Products' answers as the tests feed them to the engine's pure parts: BReg's record
envelope, Casework's review result, and a reply as the call pool reports it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from registry_coordinator.semantics.steps import Reply, ReplyKind


def breg_record(record_id: str, status: str = "awaiting-review") -> dict[str, Any]:
    """BReg's answer to read-record: the envelope of one record of the applications."""
    return {
        "data": {
            "recordIdentifier": record_id,
            "revisionIdentifier": "1",
            "domainData": {"status": status},
        },
        "meta": {
            "registryIdentifier": "applications-registry",
            "datasetIdentifier": "applications",
            "entityTypeIdentifier": "application",
        },
    }


def review_result(status: str, request_id: str = "rv-1") -> dict[str, Any]:
    """Casework's ReviewResult as its result read answers it (200)."""
    return {
        "resultId": "r-1",
        "requestId": request_id,
        "subject": {},
        "policy": {},
        "submissionDigest": "sha256:x",
        "status": status,
        "completedAt": "2026-03-01T12:00:00Z",
        "availableUntil": "2026-06-01T12:00:00Z",
    }


def reply(
    status: int | None = None,
    body: bytes = b"",
    kind: ReplyKind = ReplyKind.RESPONSE,
    retry_after: timedelta | None = None,
) -> Reply:
    """A product's reply as the call pool reports it to the step semantics."""
    return Reply(kind, status, body, retry_after, "test")
