"""Refused requests: an HTTP status, a stable code and what to change.

Admission, operator actions, authentication and webhooks all refuse through this
one exception; the HTTP front end turns it into an RFC 9457 problem. A request
refused this way has changed nothing.
"""

from __future__ import annotations

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.custody import Unopenable
from registry_coordinator.errors import CoordinatorError

#: The closed list of problem codes the HTTP API answers with, and what each means.
CODES: dict[str, str] = {
    "request.invalid": "the body is not the object this route takes",
    "request.malformed-json": "the body is not JSON",
    "request.unstorable-text": "the body holds a NUL character or an unpaired surrogate",
    "request.too-deep": "the body nests arrays and objects too deep",
    "request.too-large": "the body is larger than the configured limit",
    "request.unsupported-media-type": "a body on a JSON route that is not sent as JSON",
    "request.idempotency-key-missing": (
        "a start without an Idempotency-Key header, or a batch start without a key"
    ),
    "request.idempotency-key-invalid": (
        "an Idempotency-Key (or a batch start's key) that is not 1-200 visible ASCII"
    ),
    "request.invalid-filter": "a run listing filter or limit that is not allowed",
    "request.invalid-cursor": "a page cursor this API did not return",
    "request.reason-missing": "an action without a reason",
    "request.binding-invalid": "a binding that is neither sealed nor current",
    "request.attestation-missing": "a release after a restore without what the operator "
    "found at the product, or an attestation that is not text",
    "route.not-found": "no such route",
    "route.method-not-allowed": "the route does not take this method",
    "auth.missing-token": "no bearer token",
    "auth.invalid-token": "a token that is not a valid JWT from the issuer",
    "auth.unknown-key": "a token signed with a key the issuer's key set does not have",
    "auth.expired": "an expired token",
    "auth.wrong-audience": "a token for another audience",
    "auth.wrong-issuer": "a token from another issuer",
    "auth.lifetime-too-long": "a token valid for longer than the configured maximum",
    "auth.forbidden": "no policy of the caller allows the action",
    "auth.operator-required": "an operator action by a caller who is not an operator",
    "auth.keys-unavailable": "the issuer's key set could not be read for longer than allowed",
    "workflow.not-pinned": "no pinned workflow (version) of that name",
    "input.invalid": "the input does not fit the workflow's input schema",
    "input.no-subject": "the input gives the workflow's subject no id",
    "input.no-concurrency-key": "the input gives the workflow's concurrency key no key",
    "subject.unknown": "no run was sealed under a key of that data subject",
    "subject.live": "the data subject has runs that have not ended: cancel them first",
    "subject.report-unsigned": "a subject report asked of a service with no audit signing key",
    "admission.held": "new starts are held by an operator",
    "run.binding-changed": "a resend of a request sealed under a binding its connection "
    "no longer has, without saying which to send it over",
    "run.not-found": "no run of that id that the caller may see",
    "run.data-unopenable": "the run's sealed data does not open here: moved from another "
    "row, changed, or under a key this configuration does not hold",
    "run.archived": "the run ended and was archived: its history is in the bundle named",
    "run.key-reused": "the Idempotency-Key started a run of another workflow, version or input",
    "run.concurrent": "a run of the workflow's concurrency key is live",
    "approval.pending": "an action on the run already waits for a second operator",
    "approval.not-found": "no approval of that id",
    "approval.decided": "the approval was decided already",
    "approval.self": "the operator who asked for an action cannot approve it",
    "approval.required": "a bulk job cannot take an action that needs a second operator",
    "bulk.invalid": "a bulk job's action or rate is not one this build takes",
    "bulk.not-found": "no bulk job of that id",
    "bulk.state": "the bulk job's state does not allow the change asked for",
    "bulk.too-many": "the filter finds more runs than one bulk job takes",
    "bulk.no-runs": "the filter finds no run",
    "run.ended": "the run has already ended",
    "run.not-held": "the action needs a held run",
    "run.nothing-to-resend": "reconcile on a held run that sent no request at its step",
    "run.definition-unusable": "reconcile on a run whose definition this build cannot load",
    "run.no-receipt": "the held call has no receipt lookup, and no answer to it came back late",
    "run.changed": "the run changed while the action was taken",
    "reconcile.no-receipt": "the product holds no receipt matching the original request",
    "reconcile.unavailable": "the product's receipt could not be read or used",
    "connection.unknown": "no connection of that name is configured (or accepts result "
    "webhooks, for a delivery)",
    "webhook.signature-missing": "a delivery without a signature",
    "webhook.signature-invalid": "a signature that does not match body and secret",
    "webhook.signature-stale": "a signature more than five minutes from now",
    "webhook.invalid-delivery": "a delivery that is not {result, key, eventId, payload?}, "
    "or a pushed event that is not the product's",
    "webhook.unauthenticated": "a pushed event without the secret of its connection",
    "webhook.recipient-mismatch": "a pushed event naming another recipient binding",
    "console.sign-in-unconfigured": "auth mode jwt without console.clientId: nobody can sign in",
    "console.issuer-unavailable": "the issuer's discovery document or token endpoint failed",
    "console.sign-in-failed": "a sign-in with an unknown, used or expired state, or bad tokens",
    "console.sign-in-needed": "a console form sent without a signed-in session",
    "console.forged-request": "a console form without its CSRF token, or from another origin",
    "service.unavailable": "the database cannot be reached; try again after Retry-After",
    "service.stopping": "the service is shutting down; try again after Retry-After",
    "service.recovery-only": "the service serves operators only, in a restored database's "
    "recovery; try again once it has ended",
    "service.internal-error": "the service failed to answer: a defect, logged with its cause",
}


class Problem(CoordinatorError):
    def __init__(self, status: int, code: str, detail: str, **extra: JSON) -> None:
        if code not in CODES:
            raise ValueError(f"problem code {code!r} is not in the closed list")
        super().__init__(detail)
        self.status, self.code, self.detail, self.extra = status, code, detail, extra


def data_unopenable(error: Unopenable) -> Problem:
    """Sealed data that does not open where it is read: not the caller's mistake, and never
    answered with another value. The words name the run, the purpose and the step (never
    a value), and what an administrator can do."""
    return Problem(
        500,
        "run.data-unopenable",
        f"{error}: restore the row from a backup, or configure the key-encryption key "
        "that wrapped its data key (docs/custody.md)",
        custody=str(error.code),
    )
