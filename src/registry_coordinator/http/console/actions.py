"""Operator actions from the console, each in three steps: ask, confirm, act.

``GET .../<action>`` asks for a reason and says what the action will send;
``POST .../<action>/review`` shows exactly that again with the reason, for the operator to
confirm; ``POST .../<action>`` takes it — through the very function the API's route
calls (``runs.act``, ``admission.change``), so the checks, the refusals and the history
event (with the operator and the reason) are the API's — then answers 303 to the run.
Both POSTs are checked forms (:func:`visitors.checked_form`): nothing is taken without the
visitor's CSRF token and the console's origin. A refusal is shown on the action's page with
the API's words and status; the run is as it was.

The erasure and the subject report take a subject's id, which never goes into a URL: each
is answered on the page its POST gets, as the API answers it (``subjects.erase_subject``,
``subjects.signed_report``), and the report's page shows what its signed extract holds.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from quart import Response

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.http import operations
from registry_coordinator.http.console import wording
from registry_coordinator.http.console.pages import Sent, page
from registry_coordinator.http.console.render import redirect
from registry_coordinator.http.console.visitors import Visitor, checked_form, visitor
from registry_coordinator.http.context import Context
from registry_coordinator.http.operations import Evidence, require_reason
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.routes import (
    admission,
    approvals,
    bulk,
    connections,
    runs,
    subjects,
)
from registry_coordinator.semantics.codes import HoldCode
from registry_coordinator.store import console_reads, keys, pauses

_ADMISSION = {"hold": True, "release": False}


def _body(form: dict[str, str]) -> Callable[[], Awaitable[JSON]]:
    """The form's reason, attestation, binding and workflow as the request body the API's
    actions read."""

    async def body() -> JSON:
        fields = ("reason", "attestation", "binding", "workflow")
        return {field: form.get(field, "") for field in fields}

    return body


def _known(action: str) -> wording.ActionWords:
    if action not in runs.ACTIONS:
        raise Problem(404, "route.not-found", f"no run action {action}")
    return wording.ACTIONS[action]


async def _run(context: Context, who: Visitor, run_id: str, action: str) -> store.RunStatus:
    """The run the action is for, refused as the API refuses: an operator first, if the
    action needs one, then a run the visitor may take it on."""
    words = runs.ACTIONS[action]
    if words.operator:
        who.caller.require_operator()
    return await runs.visible_run(context, who.caller, run_id, words.permission)


async def _subject(
    context: Context, who: Visitor, run_id: str, action: str
) -> tuple[store.RunStatus, Sent | None]:
    """The run the action is for (:func:`_run`) and its step's latest sealed request."""
    run = await _run(context, who, run_id, action)
    executions = await console_reads.executions(context.db, run.id)
    sent = [Sent.of_execution(e) for e in executions if e.step == run.step]
    return run, sent[-1] if sent else None


async def _form(
    context: Context,
    who: Visitor,
    run_id: str,
    action: str,
    stage: str,
    reason: str = "",
    refused: Problem | None = None,
    form: dict[str, str] | None = None,
) -> Response:
    words = _known(action)
    run, sent = await _subject(context, who, run_id, action)
    sealed = await store.sealed_at(context.db, run.id, run.step) if action == "retry-same" else None
    change = operations.binding_change(sealed, context.products) if sealed else None
    found: Evidence | None = None
    if action == "reconcile" and stage == "confirm":
        try:  # what reconcile will find, shown before the operator confirms it
            found = (
                await operations.find_evidence(
                    context.db, context.workflows, context.products, run.id
                )
            ).evidence
        except Problem as nothing:
            stage, refused = "ask", nothing
    return await page(
        context,
        who,
        "action.html",
        refused.status if refused else 200,
        run=runs.run_status(run),
        action=action,
        words=words,
        sent=sent,
        stage=stage,
        reason=reason,
        attestation=(form or {}).get("attestation", ""),
        binding=(form or {}).get("binding", ""),
        change=change,
        restored=run.hold_code == HoldCode.RESTORED_REVIEW,
        refused=refused,
        evidence=found,
        seq=run.seq,
    )


async def ask(context: Context, run_id: str, action: str) -> Response:
    who = await visitor(context)
    return await _form(context, who, run_id, action, "ask")


def _reason(form: dict[str, str]) -> tuple[str, str, Problem | None]:
    """The next stage for a form's reason, checked as the API checks it: confirm it, or
    ask again with what was typed and why it was refused."""
    typed = form.get("reason", "")
    try:
        return "confirm", require_reason({"reason": typed}), None
    except Problem as refused:
        return "ask", typed, refused


async def review(context: Context, run_id: str, action: str) -> Response:
    who = await visitor(context)
    form = await checked_form(context, who)
    _known(action)
    stage, reason, refused = _reason(form)
    return await _form(context, who, run_id, action, stage, reason, refused, form)


async def take(context: Context, run_id: str, action: str) -> Response:
    who = await visitor(context)
    form = await checked_form(context, who)
    _known(action)
    reason = form.get("reason", "")
    try:
        await _unchanged(context, who, run_id, action, form.get("seq"))
        taken = await runs.act(context, who.caller, run_id, action, _body(form))
    except Problem as refused:
        if refused.status in (401, 403, 404):
            raise
        return await _form(context, who, run_id, action, "ask", reason, refused, form)
    done = action if taken.status == 200 else f"{action}-pending"
    if taken.approval is not None:
        done = f"{action}-approval"
    return redirect(f"/console/runs/{taken.run.id}?{urlencode({'done': done})}")


async def _unchanged(
    context: Context, who: Visitor, run_id: str, action: str, reviewed: str | None
) -> None:
    """Refuse to act on a run that moved since the operator confirmed what would be done:
    what they saw (the request to resend, the evidence) may no longer be what happens."""
    run = await _run(context, who, run_id, action)
    if reviewed != str(run.seq):
        raise Problem(
            409,
            "run.changed",
            f"the run changed since you reviewed it (it is now {run.state} at step "
            f"{run.step}): nothing was done; look again",
        )


def _change(change: str) -> bool:
    if change not in _ADMISSION:
        raise Problem(404, "route.not-found", f"no admission action {change}")
    return _ADMISSION[change]


async def _admission_form(
    context: Context,
    who: Visitor,
    change: str,
    stage: str,
    reason: str = "",
    refused: Problem | None = None,
    attestation: str = "",
) -> Response:
    who.caller.require_operator()
    return await page(
        context,
        who,
        "admission_change.html",
        refused.status if refused else 200,
        change=change,
        stage=stage,
        reason=reason,
        refused=refused,
        admission=await console_reads.admission(context.db),
    )


async def admission_review(context: Context, change: str) -> Response:
    who = await visitor(context)
    form = await checked_form(context, who)
    _change(change)
    return await _admission_form(context, who, change, *_reason(form))


async def admission_take(context: Context, change: str) -> Response:
    who = await visitor(context)
    form = await checked_form(context, who)
    held = _change(change)
    try:
        await admission.change(context, who.caller, held, _body(form))
    except Problem as refused:
        if refused.status in (401, 403):
            raise
        return await _admission_form(context, who, change, "ask", form.get("reason", ""), refused)
    return redirect("/console/admission?" + urlencode({"done": change}))


async def _erasure_form(
    context: Context,
    who: Visitor,
    stage: str,
    form: dict[str, str],
    refused: Problem | None = None,
    erased: keys.Erasure | None = None,
) -> Response:
    return await page(
        context,
        who,
        "erasure.html",
        refused.status if refused else 200,
        stage=stage,
        subject=form.get("subject", ""),
        reason=form.get("reason", ""),
        refused=refused,
        erased=erased,
    )


async def erasure_review(context: Context) -> Response:
    """The erasure as asked, to confirm; or the form again with why it was refused."""
    who = await visitor(context)
    form = await checked_form(context, who)
    who.caller.require_operator()
    try:
        subjects.asked_subject(form)
        require_reason(form)
    except Problem as refused:
        return await _erasure_form(context, who, "ask", form, refused=refused)
    return await _erasure_form(context, who, "confirm", form)


async def erasure_take(context: Context) -> Response:
    """The erasure, taken as the API takes it: what was done, on this answer's page (the
    subject never goes into a URL to redirect to)."""
    who = await visitor(context)
    form = await checked_form(context, who)
    try:
        erased = await subjects.erase_subject(context, who.caller, dict(form))
    except Problem as refused:
        if refused.status in (401, 403):
            raise
        return await _erasure_form(context, who, "ask", form, refused=refused)
    return await _erasure_form(context, who, "done", {}, erased=erased)


async def _report_form(
    context: Context, who: Visitor, subject: str, refused: Problem | None = None
) -> Response:
    status = refused.status if refused else 200
    return await page(
        context, who, "subject_report.html", status, subject=subject, refused=refused, report=None
    )


async def _signed_report(context: Context) -> tuple[Visitor, dict[str, str], bytes | Response]:
    """The signed report a console form asks for, or the form again with why not."""
    who = await visitor(context)
    form = await checked_form(context, who)
    try:
        return who, form, await subjects.signed_report(context, who.caller, dict(form))
    except Problem as refused:
        if refused.status in (401, 403):
            raise
        return who, form, await _report_form(context, who, form.get("subject", ""), refused)


async def subject_report(context: Context) -> Response:
    """The subject's report as a page, on this answer (the subject never goes into a
    URL): what was signed, read back from the extract."""
    who, _, signed = await _signed_report(context)
    if isinstance(signed, Response):
        return signed
    report = json.loads(signed)["report"]
    return await page(context, who, "subject_report.html", report=report, refused=None)


async def subject_extract(context: Context) -> Response:
    """The subject's signed report, as a file to hand over or keep."""
    _, _, signed = await _signed_report(context)
    if isinstance(signed, Response):
        return signed
    answer = Response(signed, status=200, content_type="application/json")
    answer.headers["Content-Disposition"] = 'attachment; filename="subject-report.json"'
    answer.headers["Cache-Control"] = "no-store"
    return answer


async def connection_take(context: Context, name: str, action: str) -> Response:
    """Pause or resume a connection, with the reason the form gives, as the API does;
    then the Admission page, which shows it."""
    who = await visitor(context)
    form = await checked_form(context, who)
    who.caller.require_operator()
    if action not in ("pause", "resume"):
        raise Problem(404, "route.not-found", f"no connection action {action}: pause or resume")
    reason = require_reason(form)
    connections.known(context, name)
    if action == "pause":
        await pauses.pause(context.db, name, who.caller.actor, reason)
    else:
        await pauses.resume(context.db, name, who.caller.actor, reason)
    return redirect("/console/admission?" + urlencode({"done": f"connection-{action}"}))


async def bulk_preview(context: Context) -> Response:
    """Preview a bulk job from the form, as the API does; then the job's page, where it
    is started."""
    who = await visitor(context)
    form = await checked_form(context, who)
    who.caller.require_operator()
    try:
        rate = int(form.get("perSecond") or bulk.PER_SECOND)
    except ValueError:
        rate = 0  # refused by bulk.asked, in its words
    given = {
        "action": form.get("action"),
        "filter": {name: form.get(name) for name in bulk.FILTER_FIELDS if name != "fields"}
        | {"fields": [form["field"]] if form.get("field") else []},
        "perSecond": rate,
    }
    job, _ = await bulk.preview(context, who.caller.actor, bulk.asked(context, given))
    return redirect(f"/console/bulk/{job}")


async def bulk_change(context: Context, job: str, change: str) -> Response:
    """Start, pause, resume or cancel a bulk job with the form's reason; then its page."""
    who = await visitor(context)
    form = await checked_form(context, who)
    who.caller.require_operator()
    reason = require_reason(form)
    changed = await bulk.change_job(context, job, change, who.caller.actor, reason)
    return redirect(f"/console/bulk/{changed.id}")


async def approval_decide(context: Context, approval: str, decision: str) -> Response:
    """Approve or reject an action another operator asked for, with the form's reason, as
    the API does; then Held work, which says what was decided."""
    who = await visitor(context)
    form = await checked_form(context, who)
    who.caller.require_operator()
    reason = require_reason(form)
    decided, _ = await approvals.decide(context, approval, decision, who.caller.actor, reason)
    return redirect("/console/?" + urlencode({"done": decided.state}))


async def workflow_starts_take(context: Context, change: str) -> Response:
    """Hold or release the starts of the workflow the form names, with its reason, as the
    API does; then the Admission page, which shows it."""
    who = await visitor(context)
    form = await checked_form(context, who)
    held = _change(change)
    if not form.get("workflow"):
        raise Problem(400, "request.invalid-filter", "name the workflow whose starts to hold")
    await admission.change(context, who.caller, held, _body(form))
    return redirect("/console/admission?" + urlencode({"done": f"workflow-{change}"}))
