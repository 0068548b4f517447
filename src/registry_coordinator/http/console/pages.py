"""The console's pages: held work, runs, a run, workflows, admission, erasure, the subject
report's form and health.

Each is a top-level handler of the shared :class:`Context`, as the API's are, and sees
exactly what the visitor's token lets the API show: an operator every run, a client only
its own runs of the workflows its policies let it read. What a page shows of a run comes
from the same reads as the API's answers (``runs.run_status``), so the console and
``GET /v1/runs/{id}`` never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prometheus_client import Metric
from quart import Response, request

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON, storable
from registry_coordinator.authoring.catalog import Recovery
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.authoring.drawing import dot
from registry_coordinator.authoring.expressions import parse_instant
from registry_coordinator.authoring.workflow import Call
from registry_coordinator.http.console import wording
from registry_coordinator.http.console.render import html
from registry_coordinator.http.console.visitors import CSRF_COOKIE, Visitor, set_cookie, visitor
from registry_coordinator.http.context import Context
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import cursor, cursor_at, moment, next_cursor
from registry_coordinator.http.routes import bulk, connections, probes, runs
from registry_coordinator.semantics.codes import HoldCode, RunState
from registry_coordinator.store import approvals, bulk_jobs, console_reads, operator_actions
from registry_coordinator.store.bulk_jobs import BulkState
from registry_coordinator.store.console_reads import Execution, HeldWork, Sending

PAGE_SIZE = 50
#: The held runs a page of the landing page explains, oldest first; the next page goes on.
HELD_SHOWN = 25
#: How much of a product's answer a page shows; the whole is in the database.
ANSWER_PREVIEW = 600


def _visibility(who: Visitor) -> tuple[str | None, frozenset[str] | None]:
    """Whose runs, of which workflows, the visitor may read (None: no limit)."""
    who.caller.require("read")
    return runs.visible_to(who.caller)


async def page(
    context: Context, who: Visitor, template: str, status: int = 200, **values: object
) -> Response:
    """A page with what every page shows: who is looking, the held count, the CSRF token."""
    held = 0
    if who.caller.may("read"):
        held = await console_reads.held_count(context.db, *_visibility(who))
    # Only a page got by GET may be asked for again: a POST's answer has no URL to poll.
    live = request.method == "GET"
    response = html(
        template, status, who=who, held_count=held, path=request.path, live=live, **values
    )
    if who.new_csrf_cookie:
        set_cookie(context, response, CSRF_COOKIE, who.csrf)
    return response


def _answer(body: bytes | None) -> str | None:
    """A product's answer as text to show, cut to :data:`ANSWER_PREVIEW` characters."""
    if body is None:
        return None
    text = bytes(body).decode("utf-8", errors="replace")
    return text if len(text) <= ANSWER_PREVIEW else text[:ANSWER_PREVIEW] + " …"


@dataclass(frozen=True)
class Sent:
    """A call step's sealed request and what came of it, as a page shows it: the sending,
    the product's answer as text (:func:`_answer`), and the sealed request's whole body
    where the page shows it."""

    sending: Sending
    answer: str | None
    body: str | None = None

    @classmethod
    def of(cls, sending: Sending, body: bytes | None = None) -> Sent:
        """From one sending (``console_reads``), with its sealed ``body`` where the page
        shows it."""
        text = body.decode("utf-8", errors="replace") if body else None
        return cls(sending, _answer(sending.response), text)

    @classmethod
    def of_held(cls, held: HeldWork) -> Sent | None:
        """A held run's step's latest sending (``console_reads.held_runs``), if any."""
        return None if held.sending is None else cls.of(held.sending)

    @classmethod
    def of_execution(cls, execution: Execution) -> Sent:
        """One of a run's executions (``console_reads.executions``), with its body."""
        return cls.of(execution.sending, execution.body)


@dataclass(frozen=True)
class HeldRun:
    """A held run as the console explains it: why, what was sent, what is known, and the
    actions the visitor may take."""

    run: store.RunStatus
    status: JSON  # the run's status as the API shows it
    words: wording.Hold
    sent: Sent | None  # the step's latest sealed request, if it sealed one
    receipt: str | None  # how the product's receipt can be asked for, if it can
    actions: list[str]
    calls_shown: bool  # whether the visitor may see what was sent (an operator)


async def _receipt(context: Context, run: store.RunStatus) -> tuple[Definition | None, str | None]:
    try:
        definition = await context.workflows.by_digest(context.db, run.digest)
    except (LookupError, ValueError, Refused):  # missing, altered, or not runnable here
        return None, None
    step = definition.workflow.steps.get(run.step)
    if not isinstance(step, Call):
        return definition, None
    operation = definition.operations[step.id]
    if operation.receipt is not None:
        return definition, (
            f"{operation.product} keeps receipts for {operation.name}: reconcile asks for "
            "the receipt of the original key"
        )
    if operation.recovery is Recovery.IDENTICAL_REQUEST:
        return definition, (
            f"{operation.product} keeps no receipt for {operation.name}, but answers the "
            "same request under the same key with its original answer: retry sends it"
        )
    return definition, f"{operation.product} keeps no receipt for {operation.name}"


def _actions(who: Visitor, run: store.RunStatus) -> list[str]:
    """The actions the visitor may take on the run that can help it: for a held run, its
    hold's, the recommended first and cancel last (reconcile cannot help a run whose
    product refused the request)."""
    if run.state.terminal:
        return []
    names = list(wording.hold(run.hold_code).offers) if run.state == RunState.HELD else ["cancel"]
    return [name for name in names if runs.may_take(who.caller, name, run.workflow_id)]


async def _held_run(
    context: Context, who: Visitor, run: store.RunStatus, sent: Sent | None
) -> HeldRun:
    """A held run explained; what was sent where, and what came back, only to an operator
    (the API shows a run's calls to nobody else)."""
    sent = sent if who.caller.operator else None
    _, receipt = await _receipt(context, run)
    words = wording.hold(run.hold_code)
    actions = _actions(who, run)
    return HeldRun(run, runs.run_status(run), words, sent, receipt, actions, who.caller.operator)


@dataclass(frozen=True)
class Group:
    """A group of held work as the landing page counts it: the runs, the connection their
    step calls (None: not a call, or a definition no longer pinned), and their hold's
    words."""

    held: console_reads.HeldGroup
    connection: str | None
    words: wording.Hold


def _connection(context: Context, workflow: str, step: str) -> str | None:
    """The connection ``step`` of the pinned ``workflow`` calls, if it is a call step."""
    for pinned in context.workflows.pinned:
        found = pinned.definition.workflow.steps.get(step)
        if pinned.definition.id == workflow and isinstance(found, Call):
            return found.connection
    return None


async def held(context: Context) -> Response:
    """The landing page: the held runs the visitor may see counted by workflow, step and
    hold, then each explained, oldest first."""
    who = await visitor(context)
    visible = _visibility(who)
    groups = [
        Group(g, _connection(context, g.workflow, g.step), wording.hold(g.hold_code))
        for g in await console_reads.held_groups(context.db, *visible)
    ]
    after = cursor(request.args.get("after"), console_reads.FIRST_HELD)
    held_work = await console_reads.held_runs(context.db, *visible, HELD_SHOWN + 1, after)
    explained = [
        await _held_run(context, who, h.run, Sent.of_held(h)) for h in held_work[:HELD_SHOWN]
    ]
    more = None
    if len(held_work) > HELD_SHOWN:
        last = explained[-1].run
        more = cursor_at(last.updated_at, last.id)
    waiting = await approvals.pending(context.db) if who.caller.operator else []
    return await page(
        context,
        who,
        "held.html",
        held=explained,
        shown=HELD_SHOWN,
        groups=groups,
        more=more,
        waiting=waiting,
        done=request.args.get("done"),
    )


def _moment(name: str) -> datetime | None:
    """A time filter from the form (a datetime-local value, taken as UTC)."""
    return moment(name, request.args.get(name))


async def runs_page(context: Context) -> Response:
    """Runs the visitor may read, newest first, filtered, a page at a time; live."""
    who = await visitor(context)
    caller, readable = _visibility(who)
    args = request.args
    for name in ("workflow", "version", "caller", "q", "hold"):
        if not storable(args.get(name)):
            raise Problem(400, "request.invalid-filter", f"{name} holds text that cannot be stored")
    state = args.get("state") or None
    if state is not None and state not in set(RunState):
        raise Problem(400, "request.invalid-filter", f"state must be one of {', '.join(RunState)}")
    filters = store.RunFilter(
        caller=caller,
        readable=readable,
        state=state,
        workflow=args.get("workflow") or None,
        version=args.get("version") or None,
        started_by=args.get("caller") or None,
        since=_moment("since"),
        until=_moment("until"),
        text=args.get("q") or None,
        hold_code=args.get("hold") or None,
        fields=runs.search_fields(
            context, args.get("workflow") or None, [args["field"]] if args.get("field") else []
        ),
    )
    found = await store.runs_page(context.db, filters, cursor(args.get("cursor")), PAGE_SIZE + 1)
    shown = found[:PAGE_SIZE]
    more = None
    if len(found) > PAGE_SIZE:
        query = {k: v for k, v in args.items() if k != "cursor" and v}
        query["cursor"] = next_cursor(shown[-1])
        more = query
    return await page(
        context,
        who,
        "runs.html",
        runs=[runs.run_status(r) for r in shown],
        more=more,
        args=args,
        states=list(RunState),
        workflows=sorted({p.definition.id for p in context.workflows.pinned}),
        search_names=sorted({n for p in context.workflows.pinned for n in p.definition.search}),
        holds=list(HoldCode),
        counts=await console_reads.live_counts(context.db, caller, readable),
        tabs=[
            (state, {k: v for k, v in args.items() if k not in ("state", "cursor") and v})
            for state in ("", *RunState)
        ],
    )


async def run_page(context: Context, run_id: str) -> Response:
    """One run: its state, why it is held, its graph, input and output, every call attempt
    and every history event with who acted and why."""
    who = await visitor(context)
    run = await runs.visible_run(context, who.caller, run_id, "read")
    detail = await console_reads.run_detail(context.db, run.id)
    assert detail is not None  # runs are never deleted
    executions = await console_reads.executions(context.db, run.id)
    if not who.caller.operator:
        executions = []  # product URLs, keys and answers are for operators, as in the API
    events = await store.history(context.db, run.id)
    current = [e for e in executions if e.step == run.step]
    explained = None
    if run.state == RunState.HELD:
        sent = Sent.of_execution(current[-1]) if current else None
        explained = await _held_run(context, who, run, sent)
    definition, _ = await _receipt(context, run)
    graph = None
    if definition is not None:
        marks = dict.fromkeys(detail.completed or {}, "taken")
        marks[run.step] = "current"
        graph = dot(definition.workflow, marks)
    return await page(
        context,
        who,
        "run.html",
        run=runs.run_status(run),
        detail=detail,
        held=explained,
        actions=_actions(who, run),
        graph=graph,
        steps=list(definition.workflow.steps) if definition else [],
        executions=[(e, Sent.of(e.sending)) for e in executions],
        events=events,
        event_words=wording.EVENTS,
        done=_done(request.args.get("done"), events),
        waiting=await approvals.waiting_on(context.db, run.id),
        took=_durations(run, events, detail.completed or {}),
    )


def _durations(
    run: store.RunStatus, events: list[store.HistoryEvent], completed: dict[str, str]
) -> dict[str, timedelta]:
    """How long the run took (``""``: so far, if it has not ended), each step it completed
    took (from its first event to its completion), and the step it is at so far."""
    now = datetime.now(UTC)
    entered: dict[str, datetime] = {}
    for event in events:
        entered.setdefault(event.step, event.at)
    took = {"": (run.ended_at or now) - run.admitted_at}
    for step, at in completed.items():
        if step in entered:
            took[step] = parse_instant(at) - entered[step]
    if run.ended_at is None and run.step in entered and run.step not in completed:
        took[run.step] = now - entered[run.step]
    return took


#: The history event each console action leaves, by the ``done`` its redirect names.
_DONE = {
    "retry-same": "retry-same",
    "reconcile": "reconciled",
    "cancel": "cancelled",
    "cancel-pending": "cancel-requested",
}


def _done(done: str | None, events: list[store.HistoryEvent]) -> str | None:
    """The action to confirm at the top of a run's page: only the one its history's latest
    operator event shows (a link cannot make the page claim an action nobody took)."""
    people = [e for e in events if e.kind in _DONE.values()]
    if done in _DONE and people and people[-1].kind == _DONE[done]:
        return done
    return None


async def workflows_page(context: Context) -> Response:
    """The pinned workflows, by version, with their digests and how many runs each has."""
    who = await visitor(context)
    counts = await console_reads.run_counts(context.db) if who.caller.operator else {}
    return await page(
        context,
        who,
        "workflows.html",
        pinned=context.workflows.pinned,
        counts=counts,
        states=list(RunState),
    )


async def workflow_page(context: Context, digest: str) -> Response:
    who = await visitor(context)
    found = [p for p in context.workflows.pinned if p.digest == digest]
    if not found:
        raise Problem(404, "workflow.not-pinned", f"no pinned workflow with digest {digest}")
    pinned = found[0]
    counts = await console_reads.run_counts(context.db) if who.caller.operator else {}
    return await page(
        context,
        who,
        "workflow.html",
        pinned=pinned,
        graph=dot(pinned.definition.workflow),
        counts=counts.get(digest, {}),
        states=list(RunState),
    )


async def admission_page(context: Context) -> Response:
    who = await visitor(context)
    state = await console_reads.admission(context.db)
    operator = who.caller.operator
    events = await console_reads.admission_events(context.db) if operator else []
    paused = await connections.paused_by_name(context) if operator else []
    held = {h.workflow: h for h in await operator_actions.held_workflow_starts(context.db, None)}
    done = request.args.get("done")
    return await page(
        context,
        who,
        "admission.html",
        admission=state,
        events=events,
        done=done,
        connections=paused,
        workflows=[
            (name, held.get(name))
            for name in sorted({p.definition.id for p in context.workflows.pinned})
        ],
    )


async def erasure_page(context: Context) -> Response:
    """The form that erases a data subject: operators only."""
    who = await visitor(context)
    who.caller.require_operator()
    return await page(
        context, who, "erasure.html", stage="ask", subject="", reason="", refused=None, erased=None
    )


async def subject_report_page(context: Context) -> Response:
    """The form that asks for a data subject's report: operators only."""
    who = await visitor(context)
    who.caller.require_operator()
    return await page(context, who, "subject_report.html", subject="", refused=None, report=None)


def _families(metrics: list[Metric]) -> list[dict[str, object]]:
    """The service's metrics as tables: each family's samples by their labels."""
    shown: list[dict[str, object]] = []
    for family in metrics:
        samples = [
            {"name": s.name, "labels": s.labels, "value": s.value}
            for s in family.samples
            if not s.name.endswith(("_created", "_bucket"))
        ]
        if samples:
            shown.append({"name": family.name, "help": family.documentation, "samples": samples})
    return shown


async def health_page(context: Context) -> Response:
    """Readiness and the service's own figures, the same as /ready and /metrics give."""
    who = await visitor(context)
    parts = await probes.readiness(context)
    await probes.scrape(context)
    return await page(
        context,
        who,
        "health.html",
        parts=parts,
        ready=all(part["ok"] for part in parts.values()),
        sign_in=context.issuer.state(),
        families=_families(list(context.metrics.registry.collect())),
        pools=[
            {
                "name": name,
                "limit": product.limiter.total_tokens,
                "in_use": product.limiter.borrowed_tokens,
                "queued": max(0, product.queued - product.limiter.borrowed_tokens),
            }
            for name, product in sorted(context.products.items())
        ],
    )


#: The changes a job's page offers in each state, each with its button's words.
_JOB_CHANGES = {
    BulkState.PREVIEWED: [("start", "Start: take the action on each run"), ("cancel", "Discard")],
    BulkState.RUNNING: [("pause", "Pause the job"), ("cancel", "Cancel the job")],
    BulkState.PAUSED: [("resume", "Resume the job"), ("cancel", "Cancel the job")],
}


async def bulk_page(context: Context) -> Response:
    """Bulk jobs (operators): the form that previews one, prefilled from the link that
    led here (a group of held work), and the latest jobs; live."""
    who = await visitor(context)
    who.caller.require_operator()
    pinned = context.workflows.pinned
    return await page(
        context,
        who,
        "bulk.html",
        given=request.args,
        jobs=await bulk_jobs.latest(context.db, 20),
        actions=list(runs.ACTIONS),
        workflows=sorted({p.definition.id for p in pinned}),
        states=list(RunState),
        holds=list(HoldCode),
        search_names=sorted({n for p in pinned for n in p.definition.search}),
        connections=sorted(context.products),
    )


async def bulk_job_page(context: Context, job: str) -> Response:
    """One bulk job: its progress, the changes its state allows, the first runs still to
    take, the runs it did not act on and why, and who changed it; live."""
    who = await visitor(context)
    who.caller.require_operator()
    found = await bulk.known(context, job)
    return await page(
        context,
        who,
        "bulk_job.html",
        job=found,
        changes=_JOB_CHANGES.get(found.state, []),
        first=[run for run, _ in await bulk_jobs.next_runs(context.db, found.id, 10)],
        left=await bulk_jobs.settled(context.db, found.id, 100, every=False),
        events=await bulk_jobs.events(context.db, found.id),
    )
