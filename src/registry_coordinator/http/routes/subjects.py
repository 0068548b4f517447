"""Data subjects (docs/custody.md): ``POST /v1/erasures`` destroys one subject's data key,
for operators only, with a reason (:func:`erase_subject`, which the console calls too);
``POST /v1/subject-reports`` answers what the service holds and did for one subject, as
an extract signed with the audit key (:mod:`audit.subjects`), for operators only
(:func:`signed_report`, which the console calls too).

The subject's id comes in the body, never in a path or a query: an access log, a proxy's
log or a trace holds paths, and an id may be a national one. The log line and the answer
name the data key and how many runs it sealed, never the subject.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from quart import Response

from registry_coordinator.audit import subjects
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.http.auth import Caller
from registry_coordinator.http.context import Context
from registry_coordinator.http.operations import require_reason
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import authenticated, body_json, instant, json_response
from registry_coordinator.store import keys

log = logging.getLogger(__name__)
#: The longest subject id taken: ids are short; a long one is a mistake, refused whole.
MAX_SUBJECT = 1024


async def erase(context: Context) -> Response:
    """Erase ``{"subject": ID, "reason": …}``: 200 with the key, when, by whom and how
    many runs it sealed (``before``: it was erased already, and nothing changed); 409
    ``subject.live`` naming runs not ended; 404 ``subject.unknown``."""
    who = await authenticated(context)
    erased = await erase_subject(context, who, await body_json())
    return json_response(
        {
            "key": erased.key,
            "erasedAt": instant(erased.at),
            "erasedBy": erased.actor,
            "runs": erased.runs,
            "before": erased.before,
        }
    )


def asked_subject(body: JSON) -> str:
    """The subject an erasure names, checked; refused (400) in words that never quote it."""
    subject = body.get("subject") if isinstance(body, dict) else None
    if not isinstance(subject, str) or not subject.strip() or len(subject) > MAX_SUBJECT:
        raise Problem(
            400,
            "request.invalid",
            f'give the subject: {{"subject": "...", "reason": "..."}}, 1 to {MAX_SUBJECT} '
            "characters, as the workflow's subject gives it",
        )
    return subject


async def erase_subject(context: Context, who: Caller, body: JSON) -> keys.Erasure:
    """The erasure ``body`` asks for, by ``who`` (an operator, checked first), as the API
    and the console take it; refused with a Problem, changing nothing."""
    who.require_operator()
    subject = asked_subject(body)
    reason = require_reason(body)
    try:
        erased = await keys.erase(context.db, subject, who.actor, reason)
    except keys.SubjectUnknown as exc:
        raise Problem(404, "subject.unknown", str(exc)) from None
    except keys.SubjectLive as exc:
        raise Problem(409, "subject.live", str(exc), runs=[str(r) for r in exc.runs]) from None
    if not erased.before:
        words = "data key %s erased by %s: %d runs were sealed under it"
        log.info(words, erased.key, who.actor, erased.runs)
    return erased


async def report(context: Context) -> Response:
    """The signed report of ``{"subject": ID}``: every run and effect, as
    ``coordinator subject report`` writes it; 404 ``subject.unknown``; 409
    ``subject.report-unsigned`` when the service has no audit signing key."""
    who = await authenticated(context)
    signed = await signed_report(context, who, await body_json())
    return Response(signed, status=200, content_type="application/json")


async def signed_report(context: Context, who: Caller, body: JSON) -> bytes:
    """The signed report ``body`` asks for, by ``who`` (an operator, checked first), as
    the API and the console give it; refused with a Problem."""
    who.require_operator()
    subject = asked_subject(body)
    if context.signing_key is None:
        raise Problem(
            409,
            "subject.report-unsigned",
            "a subject report is signed with the audit key, and this service has none: "
            "give audit: {signingKey: file:/path/to/audit-key.pem}",
        )
    try:
        return await subjects.extract(
            context.db, subject, datetime.now(UTC), context.signing_key, context.archive
        )
    except keys.SubjectUnknown as exc:
        raise Problem(404, "subject.unknown", str(exc)) from None
