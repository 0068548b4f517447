"""The authored workflow: typed steps read from YAML (or an artifact's JSON).

This module knows the workflow format's shape — which fields each place allows,
their types and id patterns — and nothing of the catalog, the graph or
expressions; :mod:`checker` builds on it. It reports every structural problem
it finds rather than stopping at the first, each pointing at its source.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from datetime import timedelta

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.diagnostics import Diagnostic
from registry_coordinator.authoring.fields import Reader, describe
from registry_coordinator.authoring.source import DataPath, SourceMap

API_VERSION = "coordinator.registrystack.org/v1alpha1"
WORKFLOW_ID = re.compile(r"^[a-z][a-z0-9-]{0,63}$")
VERSION = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
STEP_ID = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
NAME = re.compile(r"^[a-z][a-z0-9-]{0,63}$")
SEARCH_NAME = re.compile(r"^[a-z][A-Za-z0-9]{0,39}$")
MAX_DEADLINE = timedelta(days=366)


@dataclass(frozen=True)
class Edge:
    """One way out of a step. ``carries_output`` is false on a wait-for's timeout edge:
    a step reached that way must not read the wait's result."""

    label: str
    target: str
    path: DataPath
    carries_output: bool = True


@dataclass(frozen=True)
class Call:
    id: str
    path: DataPath
    connection: str
    operation: str
    input: JSON
    next: str

    def edges(self) -> list[Edge]:
        return [Edge("next", self.next, (*self.path, "next"))]


@dataclass(frozen=True)
class Case:
    when: str
    next: str


@dataclass(frozen=True)
class Choose:
    id: str
    path: DataPath
    cases: tuple[Case, ...]
    otherwise: str

    def edges(self) -> list[Edge]:
        edges = [
            Edge(f"case {i + 1}", case.next, (*self.path, "cases", i, "next"))
            for i, case in enumerate(self.cases)
        ]
        return [*edges, Edge("otherwise", self.otherwise, (*self.path, "otherwise"))]


@dataclass(frozen=True)
class WaitUntil:
    id: str
    path: DataPath
    at: str
    next: str

    def edges(self) -> list[Edge]:
        return [Edge("next", self.next, (*self.path, "next"))]


@dataclass(frozen=True)
class WaitFor:
    id: str
    path: DataPath
    result: str
    key: str
    timeout: timedelta | None
    on_timeout: str | None
    next: str

    @property
    def connection(self) -> str:
        return self.result.split(".", 1)[0]

    @property
    def result_name(self) -> str:
        return self.result.split(".", 1)[1]

    def edges(self) -> list[Edge]:
        edges = [Edge("next", self.next, (*self.path, "next"))]
        if self.on_timeout is not None:
            edges.append(Edge("on-timeout", self.on_timeout, (*self.path, "on-timeout"), False))
        return edges


@dataclass(frozen=True)
class Finish:
    id: str
    path: DataPath
    outcome: str
    output: JSON

    def edges(self) -> list[Edge]:
        return []


Step = Call | Choose | WaitUntil | WaitFor | Finish

#: Step types that produce data other steps may read as ``steps.<id>``.
PRODUCES_DATA = (Call, WaitFor)

STEP_TYPES = {
    "call": Call,
    "choose": Choose,
    "wait-until": WaitUntil,
    "wait-for": WaitFor,
    "finish": Finish,
}


def step_type(step: Step) -> str:
    """The type name an author writes for this step."""
    return next(name for name, cls in STEP_TYPES.items() if isinstance(step, cls))


@dataclass(frozen=True)
class Workflow:
    id: str
    version: str
    title: str | None
    description: str | None
    deadline: timedelta
    input_schema: JSON
    connections: dict[str, str]
    outcomes: dict[str, JSON]
    start: str
    steps: dict[str, Step]
    document: JSON = field(repr=False)
    #: Whose personal data the run holds: a CEL expression over the input giving the data
    #: subject's id (docs/custody.md), each subject's data sealed under a key of its own.
    subject: str | None = None
    #: At most one live run of the workflow per value of this CEL expression over the
    #: input (``concurrency: {key: input.applicationId}``): a start for a key whose run is
    #: live is refused, naming the run.
    concurrency_key: str | None = None
    #: The business fields a run is found by (``search: {applicationId:
    #: input.applicationId}``): each name's CEL expression over the input, its value kept
    #: as a keyed digest and matched exactly.
    search: dict[str, str] = field(default_factory=dict)


def read_workflow(
    document: JSON, source: SourceMap, *, trusted: bool = False
) -> tuple[Workflow | None, list[Diagnostic]]:
    """Read a workflow document; the workflow is returned only when it has no problems —
    or, ``trusted`` (read back for a run admitted under it), when all its parts were read."""
    reader = Reader(source)
    root = reader.mapping(document, (), "the workflow")
    if root is None:
        return None, reader.diagnostics
    reader.fields(
        root,
        (),
        "the workflow",
        ["apiVersion", "kind", "id", "version", "deadline", "input", "outcomes", "start", "steps"],
        ["title", "description", "connections", "subject", "concurrency", "search"],
    )
    _header(reader, root)
    wf_id = reader.matching(
        reader.string(root, "id", (), "the workflow"),
        WORKFLOW_ID,
        "workflow.bad-id",
        "the id",
        ("id",),
    )
    version = reader.matching(
        reader.string(root, "version", (), "the workflow"),
        VERSION,
        "workflow.bad-version",
        "the version",
        ("version",),
    )
    title = reader.string(root, "title", (), "the workflow")
    description = reader.string(root, "description", (), "the workflow")
    deadline = _deadline(reader, root)
    subject = reader.string(root, "subject", (), "the workflow")
    concurrency_key = _concurrency_key(reader, root)
    search = _search(reader, root.get("search", {}))
    input_schema = root.get("input")
    if "input" in root and not isinstance(input_schema, dict | bool):
        reader.report(
            "field.type",
            f"input must be a JSON Schema (a mapping), not {describe(input_schema)}",
            "describe the start input as a JSON Schema object",
            ("input",),
        )
    connections = _connections(reader, root.get("connections", {}))
    outcomes = _outcomes(reader, root.get("outcomes"))
    start = reader.string(root, "start", (), "the workflow")
    steps = _steps(reader, root.get("steps"))
    refused = bool(reader.diagnostics) and not trusted
    if refused or None in (wf_id, version, deadline, start) or steps is None:
        return None, reader.diagnostics
    assert wf_id and version and deadline and start and outcomes is not None
    workflow = Workflow(
        id=wf_id,
        version=version,
        title=title,
        description=description,
        deadline=deadline,
        input_schema=input_schema,
        connections=connections,
        outcomes=outcomes,
        start=start,
        steps=steps,
        document=document,
        subject=subject,
        concurrency_key=concurrency_key,
        search=search,
    )
    return workflow, reader.diagnostics


def _concurrency_key(reader: Reader, root: dict[str, JSON]) -> str | None:
    """``concurrency: {key: EXPR}``'s expression, if the workflow gives one."""
    if "concurrency" not in root:
        return None
    path = ("concurrency",)
    data = reader.mapping(root["concurrency"], path, "concurrency")
    if data is None:
        return None
    reader.fields(data, path, "concurrency", ["key"], [])
    return reader.string(data, "key", path, "concurrency")


def _search(reader: Reader, value: JSON) -> dict[str, str]:
    """``search: {NAME: EXPR, ...}``: each well-named field's expression."""
    data = reader.mapping(value, ("search",), "search") or {}
    fields: dict[str, str] = {}
    for name in data:
        path = ("search", name)
        if reader.matching(
            name,
            SEARCH_NAME,
            "search.bad-name",
            "the search field name",
            path,
            key=True,
            repair="name it in camelCase: a lower-case letter, then letters and digits "
            "(applicationId)",
        ):
            expression = reader.string(data, name, ("search",), "search")
            if expression is not None:
                fields[name] = expression
    return fields


def _header(reader: Reader, root: dict[str, JSON]) -> None:
    """apiVersion and kind: the document is a workflow this build reads."""
    api = reader.string(root, "apiVersion", (), "the workflow")
    if api is not None and api != API_VERSION:
        reader.report(
            "workflow.api-version",
            f"apiVersion {api!r} is not one this build reads",
            f"write apiVersion: {API_VERSION}",
            ("apiVersion",),
        )
    kind = reader.string(root, "kind", (), "the workflow")
    if kind is not None and kind != "Workflow":
        reader.report(
            "workflow.kind", f"kind {kind!r} is not Workflow", "write kind: Workflow", ("kind",)
        )


def _deadline(reader: Reader, root: dict[str, JSON]) -> timedelta | None:
    """The run's deadline: longer than zero, at most P366D."""
    deadline = reader.duration(root, "deadline", (), "the workflow")
    if deadline is not None and deadline > MAX_DEADLINE:
        reader.report(
            "workflow.deadline-too-long",
            f"the deadline {root['deadline']} is longer than P366D",
            "shorten the deadline to at most P366D",
            ("deadline",),
        )
    if deadline is not None and deadline <= timedelta(0):
        reader.report(
            "duration.invalid",
            "the deadline must be longer than zero",
            "give a deadline such as P30D",
            ("deadline",),
        )
    return deadline


def _connections(reader: Reader, value: JSON) -> dict[str, str]:
    data = reader.mapping(value, ("connections",), "connections") or {}
    result: dict[str, str] = {}
    for name in data:
        path = ("connections", name)
        if reader.matching(
            name, NAME, "connection.bad-name", "the connection name", path, key=True
        ):
            product = reader.string(data, name, ("connections",), "connections")
            if product is not None:
                result[name] = product
    return result


def _outcomes(reader: Reader, value: JSON) -> dict[str, JSON] | None:
    if value is None:
        return None
    data = reader.mapping(value, ("outcomes",), "outcomes")
    if data is None:
        return None
    result = {}
    for name, schema in data.items():
        path = ("outcomes", name)
        if not reader.matching(name, NAME, "outcome.bad-name", "the outcome name", path, key=True):
            continue
        if not isinstance(schema, dict | bool):
            reader.report(
                "field.type",
                f"outcome '{name}' must map to its output's JSON Schema, not {describe(schema)}",
                'write the output\'s JSON Schema, or {type: "null"} for an outcome without output',
                path,
            )
            continue
        result[name] = schema
    return result


_STEP_FIELDS: dict[str, tuple[list[str], list[str]]] = {
    "call": (["type", "connection", "operation", "input", "next"], []),
    "choose": (["type", "cases", "otherwise"], []),
    "wait-until": (["type", "at", "next"], []),
    "wait-for": (["type", "result", "key", "next"], ["timeout", "on-timeout"]),
    "finish": (["type", "outcome"], ["output"]),
}


def _steps(reader: Reader, value: JSON) -> dict[str, Step] | None:
    if value is None:
        return None
    data = reader.mapping(value, ("steps",), "steps")
    if data is None:
        return None
    if not data:
        reader.report(
            "workflow.no-steps",
            "the workflow has no steps",
            "add steps, at least one finish",
            ("steps",),
        )
        return None
    steps: dict[str, Step] = {}
    for step_id, body in data.items():
        path: DataPath = ("steps", step_id)
        if not reader.matching(step_id, STEP_ID, "step.bad-id", "the step id", path, key=True):
            continue
        step = _step(reader, step_id, body, path)
        if step is not None:
            steps[step_id] = step
    return steps


def _step(reader: Reader, step_id: str, body: JSON, path: DataPath) -> Step | None:
    what = f"step '{step_id}'"
    data = reader.mapping(body, path, what)
    if data is None:
        return None
    step_type = reader.string(data, "type", path, what)
    if step_type is None:
        if "type" not in data:
            reader.report(
                "field.missing",
                f"{what} needs the field 'type'",
                f"add 'type:' with one of {', '.join(STEP_TYPES)}",
                path,
            )
        return None
    if step_type not in STEP_TYPES:
        close = difflib.get_close_matches(step_type, list(STEP_TYPES), n=1)
        reader.report(
            "step.unknown-type",
            f"{what} has type {step_type!r}, which is not a step type",
            f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(STEP_TYPES)}",
            (*path, "type"),
        )
        return None
    required, optional = _STEP_FIELDS[step_type]
    if step_type != "finish" and "next" not in data and "otherwise" not in data:
        # A step with no way on cannot end in finish; name that, not just a missing field.
        reader.report(
            "workflow.path-without-finish",
            f"{what} has no 'next', so a run that reaches it could never end in a finish",
            "add 'next:' naming the step that follows (ending, eventually, in a finish step)",
            path,
        )
        optional = [*optional, *(r for r in required if r in ("next", "otherwise"))]
        required = [r for r in required if r not in ("next", "otherwise")]
    complete = reader.fields(data, path, what, required, optional)
    if step_type == "call":
        return _call(reader, step_id, data, path, what, complete)
    if step_type == "choose":
        return _choose(reader, step_id, data, path, what, complete)
    if step_type == "wait-until":
        at = _expression_field(reader, data, "at", path, what)
        nxt = reader.string(data, "next", path, what)
        if complete and at is not None and nxt is not None:
            return WaitUntil(step_id, path, at, nxt)
        return None
    if step_type == "wait-for":
        return _wait_for(reader, step_id, data, path, what, complete)
    outcome = reader.string(data, "outcome", path, what)
    if complete and outcome is not None:
        return Finish(step_id, path, outcome, data.get("output"))
    return None


def _expression_field(
    reader: Reader, data: dict[str, JSON], name: str, path: DataPath, what: str
) -> str | None:
    value = data.get(name)
    if name in data and isinstance(value, bool | int | float) and not isinstance(value, str):
        reader.report(
            "field.type",
            f"{what} field '{name}' must be a CEL expression (text), not {describe(value)}",
            f'quote it: {name}: "{str(value).lower() if isinstance(value, bool) else value}"',
            (*path, name),
        )
        return None
    return reader.string(data, name, path, what)


def _call(
    reader: Reader, step_id: str, data: dict[str, JSON], path: DataPath, what: str, complete: bool
) -> Call | None:
    connection = reader.string(data, "connection", path, what)
    operation = reader.string(data, "operation", path, what)
    nxt = reader.string(data, "next", path, what)
    payload = data.get("input")
    if "input" in data and not isinstance(payload, dict):
        reader.report(
            "field.type",
            f"{what} input must be a mapping of the operation's fields, not {describe(payload)}",
            "write input as 'field: value' lines",
            (*path, "input"),
        )
        return None
    if complete and None not in (connection, operation, nxt):
        assert connection and operation and nxt
        return Call(step_id, path, connection, operation, payload, nxt)
    return None


def _choose(
    reader: Reader, step_id: str, data: dict[str, JSON], path: DataPath, what: str, complete: bool
) -> Choose | None:
    otherwise = reader.string(data, "otherwise", path, what)
    raw = data.get("cases")
    if "cases" in data and not isinstance(raw, list):
        reader.report(
            "field.type",
            f"{what} cases must be a list of {{when, next}}, not {describe(raw)}",
            "write cases as a list: '- when: ...' and 'next: ...'",
            (*path, "cases"),
        )
        return None
    cases = []
    for index, item in enumerate(raw or []):
        case_path = (*path, "cases", index)
        case_what = f"case {index + 1} of {what}"
        case = reader.mapping(item, case_path, case_what)
        if case is None:
            complete = False
            continue
        complete = reader.fields(case, case_path, case_what, ["when", "next"]) and complete
        when = _expression_field(reader, case, "when", case_path, case_what)
        nxt = reader.string(case, "next", case_path, case_what)
        if when is not None and nxt is not None:
            cases.append(Case(when, nxt))
    if raw is not None and not 1 <= len(raw) <= 32:
        reader.report(
            "limit.cases",
            f"{what} has {len(raw)} cases; a choose has 1 to 32",
            "add a case, or split the decision over two choose steps" if raw else "add a case",
            (*path, "cases"),
        )
        return None
    if complete and otherwise is not None and len(cases) == len(raw or []):
        return Choose(step_id, path, tuple(cases), otherwise)
    return None


def _wait_for(
    reader: Reader, step_id: str, data: dict[str, JSON], path: DataPath, what: str, complete: bool
) -> WaitFor | None:
    result = reader.string(data, "result", path, what)
    if result is not None and not re.match(r"^[^.\s]+\.[^.\s]+$", result):
        reader.report(
            "step.bad-result-reference",
            f"{what} result {result!r} is not written connection.result-name",
            "write the connection's local name, a dot and the result, e.g. reviews.review-decision",
            (*path, "result"),
        )
        result = None
    key = _expression_field(reader, data, "key", path, what)
    timeout = reader.duration(data, "timeout", path, what)
    on_timeout = reader.string(data, "on-timeout", path, what)
    nxt = reader.string(data, "next", path, what)
    if "timeout" in data and "on-timeout" not in data:
        reader.report(
            "step.timeout-without-on-timeout",
            f"{what} has a timeout but no 'on-timeout'",
            "add 'on-timeout:' naming the step to take when the result does not arrive in time",
            (*path, "timeout"),
        )
        return None
    if "on-timeout" in data and "timeout" not in data:
        reader.report(
            "step.on-timeout-without-timeout",
            f"{what} has 'on-timeout' but no timeout, so it could never be taken",
            "add 'timeout:' (an ISO 8601 duration), or remove 'on-timeout'",
            (*path, "on-timeout"),
        )
        return None
    if timeout is not None and timeout <= timedelta(0):
        reader.report(
            "duration.invalid",
            f"{what} timeout must be longer than zero",
            "give a timeout such as P2D",
            (*path, "timeout"),
        )
        return None
    if complete and None not in (result, key, nxt) and ("timeout" not in data or timeout):
        assert result and key and nxt
        return WaitFor(step_id, path, result, key, timeout, on_timeout, nxt)
    return None
