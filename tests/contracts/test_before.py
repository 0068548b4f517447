"""What the catalog before the products' real contracts (2026.11.1) still means.

``fixtures/before/`` holds the tutorial's workflow as it was written against that
catalog, and the artifact the build before this one packaged from it. Runs admitted
under such an artifact keep the contract they were admitted under: its descriptors (a
receipt as a GET of the key, a result final by one field) are still read, and answered
as they were. A workflow still written against the old shapes is refused with what
moved, so its author knows what to change.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from registry_coordinator.authoring.artifact import check_source, load
from registry_coordinator.authoring.canonical import digest_of
from registry_coordinator.semantics.codes import HoldCode
from registry_coordinator.semantics.steps import (
    Advance,
    Held,
    Reply,
    ReplyKind,
    Request,
    build_receipt_request,
    fetched,
    settle,
)

BEFORE = Path(__file__).resolve().parent / "fixtures" / "before"
ARTIFACT = BEFORE / "review-application-2026.11.1.json"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_an_artifact_of_the_catalog_before_keeps_its_contract() -> None:
    data = ARTIFACT.read_bytes()
    assert digest_of(data) == (
        "sha256:20b407d86e6370d62d31a3bfa366a36be68481bfa8751150ef14e4112961cb57"
    )
    definition = load(data, str(ARTIFACT), trusted=True)
    notify = definition.operations["notify"]
    assert notify.receipt is not None
    assert (notify.receipt.method, notify.receipt.path) == (
        "GET",
        "/v1/messages/by-idempotency-key/{key}",
    )
    assert notify.bound == ()  # no connection-bound parameters then
    lookup = build_receipt_request(notify, Request("POST", "/v1/messages", b"{}", "k:1"))
    assert lookup == Request("GET", "/v1/messages/by-idempotency-key/k%3A1", None, None)
    # Its answers are read as they were: any 2xx a success, its old result shapes final.
    accepted = settle(
        definition,
        "notify",
        Reply(ReplyKind.RESPONSE, 200, b'{"id": "msg-1", "status": "accepted"}'),
        1,
        NOW,
    )
    assert isinstance(accepted, Advance)
    decided = Reply(ReplyKind.RESPONSE, 200, b'{"requestId": "rev-1", "decision": "approved"}')
    assert isinstance(fetched(definition, "await_decision", decided), Advance)
    pending = Reply(ReplyKind.RESPONSE, 200, b'{"requestId": "rev-1", "decision": "pending"}')
    assert fetched(definition, "await_decision", pending) is None
    # A review-decision of then was woken by Coordinator's signed webhooks, not read on a
    # backoff schedule as a result its product only lets be read.
    assert not definition.results["await_decision"].read_only
    refused = settle(definition, "notify", Reply(ReplyKind.RESPONSE, 403, b""), 1, NOW)
    assert isinstance(refused, Held) and refused.code is HoldCode.PRODUCT_FORBIDDEN


def test_the_artifact_before_checks_against_its_own_descriptors() -> None:
    """An artifact is judged against the descriptors it carries, not this build's catalog:
    the old one is still a valid artifact (only a run's build must read it)."""
    document = json.loads(ARTIFACT.read_text())
    assert document["catalog"]["casework"]["version"] == "2026.11.1"
    assert load(ARTIFACT.read_bytes(), str(ARTIFACT)).id == "review-application"


def test_a_workflow_written_against_the_old_shapes_is_told_what_moved() -> None:
    report = check_source(BEFORE / "review-application-2026.11.1.yaml")
    assert report.definition is None
    moved = {
        d.message.split("'")[1]: d.repair
        for d in report.diagnostics
        if d.code == "step.input-schema" and "since catalog 2026.12.1" in d.repair
    }
    assert sorted(moved) == ["notify", "request_review"]
    assert "the subject is {source, type, id, version, digest" in moved["request_review"]
    assert "a template is sent with its locale and data" in moved["notify"]
    notify = next(d for d in report.diagnostics if "'notify'" in d.message)
    assert "fits none of the forms it may take: 'locale' is a required property" in (notify.message)
