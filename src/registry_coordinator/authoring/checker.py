"""The workflow checker: everything SPEC section 4 refuses, before anything runs.

Checks go in three stages, each reporting all it finds: the document's shape
(:mod:`authoring`); names and references (connections, catalog, outcomes, step
targets); then the graph (reachability, loops) and, on an acyclic graph, the
expressions, data flow and schemas of every reachable step. A later stage runs
only when the earlier ones passed, so one mistake is not reported five times.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import jsonschema

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.catalog import Catalog, Operation, Result
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.diagnostics import Diagnostic, Position, Severity, errors
from registry_coordinator.authoring.durations import format_duration
from registry_coordinator.authoring.expressions import (
    RESERVED,
    Compiled,
    CompileError,
    Environment,
    Expr,
    Interpolation,
    ListTemplate,
    Literal,
    MapTemplate,
    Problem,
    Scope,
    Template,
    TemplateError,
    parse_template,
    template_expressions,
    type_name,
)
from registry_coordinator.authoring.fields import describe
from registry_coordinator.authoring.graph import find_cycle, reachable, scopes
from registry_coordinator.authoring.source import DataPath, SourceMap
from registry_coordinator.authoring.workflow import (
    PRODUCES_DATA,
    Call,
    Choose,
    Finish,
    WaitFor,
    WaitUntil,
    Workflow,
    read_workflow,
    step_type,
)

MAX_STEPS = 64
MAX_CONNECTIONS = 32
MAX_OUTCOMES = 64
MAX_SEARCH_FIELDS = 8


class _Checker:
    def __init__(self, workflow: Workflow, source: SourceMap, catalog: Catalog) -> None:
        self.workflow = workflow
        self.source = source
        self.catalog = catalog
        self.diagnostics: list[Diagnostic] = []
        self.operations: dict[str, Operation] = {}
        self.results: dict[str, Result] = {}
        self.scopes: dict[str, Scope] = {}

    def report(
        self,
        code: str,
        message: str,
        repair: str,
        path: DataPath,
        *,
        key: bool = False,
        position: Position | None = None,
        severity: Severity = Severity.ERROR,
    ) -> None:
        where = position or self.source.at(path, key=key)
        self.diagnostics.append(
            Diagnostic(code, message, repair, self.source.file, where, severity)
        )

    # --- stage 2: names and references -------------------------------------------------

    def references(self) -> None:
        """Stage 2: what the workflow names exists, and what it declares is used."""
        self._limits_and_ids()
        self._schemas()
        self._connections_and_start()
        used_connections, used_outcomes = self._step_references()
        self._unused(used_connections, used_outcomes)

    def _limits_and_ids(self) -> None:
        wf = self.workflow
        for code, count, limit, what in (
            ("limit.steps", len(wf.steps), MAX_STEPS, "steps"),
            ("limit.connections", len(wf.connections), MAX_CONNECTIONS, "connections"),
            ("limit.outcomes", len(wf.outcomes), MAX_OUTCOMES, "outcomes"),
        ):
            if count > limit:
                self.report(
                    code,
                    f"the workflow has {count} {what}; at most {limit} are allowed",
                    "split the process into smaller workflows",
                    (what,),
                )
        if len(wf.search) > MAX_SEARCH_FIELDS:
            self.report(
                "limit.search-fields",
                f"the workflow has {len(wf.search)} search fields; at most "
                f"{MAX_SEARCH_FIELDS} are allowed",
                "keep the fields operators find runs by, and read the rest from the run",
                ("search",),
            )
        for step_id in wf.steps:
            if step_id in RESERVED:
                self.report(
                    "step.bad-id",
                    f"the step id {step_id!r} is a reserved word in CEL expressions",
                    "rename the step (for example add a suffix: in_review)",
                    ("steps", step_id),
                    key=True,
                )

    def _schemas(self) -> None:
        wf = self.workflow
        for path, schema in [(("input",), wf.input_schema)] + [
            (("outcomes", name), schema) for name, schema in wf.outcomes.items()
        ]:
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                where = "/".join(str(p) for p in exc.path)
                self.report(
                    "schema.invalid",
                    f"not a valid JSON Schema 2020-12 at {where or '(top)'}: {exc.message}",
                    "correct the schema; see https://json-schema.org/draft/2020-12",
                    (*path, *exc.path),
                )

    def _connections_and_start(self) -> None:
        wf = self.workflow
        for name, kind in wf.connections.items():
            if kind not in self.catalog.products:
                self.report(
                    "connection.unknown-product",
                    f"connection '{name}' names product {kind!r}, which the catalog does not know",
                    f"use one of: {', '.join(sorted(self.catalog.products))}",
                    ("connections", name),
                )
        if wf.start not in wf.steps:
            self.report(
                "workflow.unknown-start",
                f"start names {wf.start!r}, which is not a step",
                self._step_hint(wf.start),
                ("start",),
            )

    def _step_references(self) -> tuple[set[str], set[str]]:
        """Each step's edges, connection and outcome resolve; the connections and
        outcomes the steps use."""
        wf = self.workflow
        used_connections: set[str] = set()
        used_outcomes: set[str] = set()
        for step in wf.steps.values():
            for edge in step.edges():
                if edge.target not in wf.steps:
                    self.report(
                        "step.unknown-next",
                        f"step '{step.id}' {edge.label} names {edge.target!r}, which is not a step",
                        self._step_hint(edge.target),
                        edge.path,
                    )
            if isinstance(step, Call | WaitFor):
                used_connections.add(step.connection)
                self._resolve(step)
            elif isinstance(step, Finish):
                used_outcomes.add(step.outcome)
                if step.outcome not in wf.outcomes:
                    self.report(
                        "step.unknown-outcome",
                        f"step '{step.id}' finishes with {step.outcome!r}, "
                        "which is not a declared outcome",
                        f"declare it under outcomes, or use one of: {', '.join(wf.outcomes)}",
                        (*step.path, "outcome"),
                    )
        return used_connections, used_outcomes

    def _unused(self, used_connections: set[str], used_outcomes: set[str]) -> None:
        wf = self.workflow
        for name in wf.connections:
            if name not in used_connections:
                self.report(
                    "connection.unused",
                    f"connection '{name}' is declared but no step uses it",
                    "remove it, so operators need not bind it",
                    ("connections", name),
                    key=True,
                    severity=Severity.WARNING,
                )
        for name in wf.outcomes:
            if name not in used_outcomes:
                self.report(
                    "outcome.unused",
                    f"outcome '{name}' is declared but no finish step uses it",
                    "remove the outcome, or add a finish step that ends with it",
                    ("outcomes", name),
                    key=True,
                )

    def _step_hint(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self.workflow.steps), n=1)
        return f"did you mean '{close[0]}'?" if close else "name one of the workflow's steps"

    def _resolve(self, step: Call | WaitFor) -> None:
        wf = self.workflow
        if step.connection not in wf.connections:
            self.report(
                "step.unknown-connection",
                f"step '{step.id}' uses connection {step.connection!r}, "
                "which the workflow does not declare",
                "declare it under connections, or use one of: "
                + (", ".join(wf.connections) or "(none declared)"),
                (*step.path, "connection" if isinstance(step, Call) else "result"),
            )
            return
        kind = wf.connections[step.connection]
        product = self.catalog.products.get(kind)
        if product is None:
            return  # reported on the connection
        if isinstance(step, Call):
            operation = product.operations.get(step.operation)
            if operation is None:
                self.report(
                    "step.unknown-operation",
                    f"product {kind} has no operation {step.operation!r}",
                    f"use one of: {', '.join(sorted(product.operations))}",
                    (*step.path, "operation"),
                )
            else:
                self.operations[step.id] = operation
            return
        result = product.results.get(step.result_name)
        if result is None:
            self.report(
                "step.unknown-result",
                f"product {kind} has no result {step.result_name!r}",
                f"use one of: {', '.join(sorted(product.results)) or '(it has none)'}",
                (*step.path, "result"),
            )
        else:
            self.results[step.id] = result
        if step.timeout is not None and step.timeout > wf.deadline:
            self.report(
                "step.timeout-exceeds-deadline",
                f"step '{step.id}' waits up to {format_duration(step.timeout)}, longer than "
                f"the workflow deadline {format_duration(wf.deadline)}",
                "shorten the timeout or lengthen the deadline: the run would expire first",
                (*step.path, "timeout"),
            )

    # --- stage 3: graph, expressions, data flow, schemas --------------------------------

    def graph(self) -> bool:
        wf = self.workflow
        live = set(reachable(wf))
        for step_id in wf.steps:
            if step_id not in live:
                self.report(
                    "workflow.unreachable-step",
                    f"step '{step_id}' cannot be reached from start '{wf.start}'",
                    "remove the step, or name it in a next of a reachable step",
                    ("steps", step_id),
                    key=True,
                )
        cycle = find_cycle(wf)
        if cycle:
            back = wf.steps[cycle[-2]]
            edge = next(e for e in back.edges() if e.target == cycle[-1])
            self.report(
                "workflow.cycle",
                f"the steps loop: {' -> '.join(cycle)}; workflows are acyclic",
                "break the loop: a workflow runs each step at most once; start a new run to repeat",
                edge.path,
            )
            return False
        return True

    def expressions(self) -> tuple[dict[str, dict[str, Compiled]], dict[str, Template]]:
        """Compile every reachable step's expressions in the scope of that step."""
        programs: dict[str, dict[str, Compiled]] = {}
        templates: dict[str, Template] = {}
        self.scopes = scopes(self.workflow)
        for step_id, scope in self.scopes.items():
            step = self.workflow.steps[step_id]
            env = Environment(scope)
            compiled: dict[str, Compiled] = {}
            programs[step_id] = compiled
            bare: list[tuple[str, DataPath, tuple[str, ...]]] = []
            if isinstance(step, Choose):
                bare = [
                    (case.when, (*step.path, "cases", index, "when"), ("BOOL",))
                    for index, case in enumerate(step.cases)
                ]
            elif isinstance(step, WaitUntil):
                bare = [(step.at, (*step.path, "at"), ("TIMESTAMP", "STRING"))]
            elif isinstance(step, WaitFor):
                bare = [(step.key, (*step.path, "key"), ("STRING",))]
            else:
                field = "input" if isinstance(step, Call) else "output"
                data = step.input if isinstance(step, Call) else step.output
                template = self._template(env, step_id, data, (*step.path, field), compiled)
                if template is not None:
                    templates[step_id] = template
                    self._template_schema(step, template, compiled, (*step.path, field))
            for source, path, expect in bare:
                program = self._compile(env, step_id, source, path, 0, expect)
                if program is not None:
                    compiled[source] = program
        return programs, templates

    def subject(self) -> Compiled | None:
        """The workflow's ``subject``, compiled over the input alone to give a string: a
        run's data subject is known at its admission, before any step has run."""
        return self._over_input(
            self.workflow.subject,
            ("subject",),
            "workflow.subject",
            "the subject",
            "write the subject from the input, for example subject: input.applicantId",
        )

    def concurrency_key(self) -> Compiled | None:
        """The workflow's ``concurrency.key``, compiled over the input alone to give a
        string: a start is refused at its admission if a run of its key is live."""
        return self._over_input(
            self.workflow.concurrency_key,
            ("concurrency", "key"),
            "workflow.concurrency-key",
            "the concurrency key",
            "write the key from the input, for example concurrency: {key: input.applicationId}",
        )

    def search_fields(self) -> dict[str, Compiled]:
        """The workflow's ``search`` fields, each compiled over the input alone to give a
        string or an integer: a run's fields are kept at its admission."""
        compiled = {}
        for name, text in self.workflow.search.items():
            program = self._over_input(
                text,
                ("search", name),
                "workflow.search-field",
                f"the search field {name}",
                f"write the field from the input, for example {name}: input.{name}",
                ("STRING", "INT"),
            )
            if program is not None:
                compiled[name] = program
        return compiled

    def _over_input(
        self,
        text: str | None,
        path: DataPath,
        code: str,
        what: str,
        repair: str,
        expect: tuple[str, ...] = ("STRING",),
    ) -> Compiled | None:
        """``text`` at ``path``, compiled over the input alone to give one of ``expect``;
        refused with ``code`` where it reads anything else (the run has not begun)."""
        if text is None:
            return None
        try:
            return Environment(None).compile(text, expect)
        except CompileError as exc:
            for problem in exc.problems:
                if problem.kind != "undeclared":
                    self._expression_problem("", text, path, 0, problem)
                    continue
                self.report(
                    code,
                    f"{what} reads {problem.name}: it is known before the run, "
                    "from the input alone",
                    repair,
                    path,
                    position=self._place(text, path, 0, problem),
                )
            return None

    def _compile(
        self,
        env: Environment,
        step_id: str,
        text: str,
        path: DataPath,
        offset: int,
        expect: tuple[str, ...] = (),
    ) -> Compiled | None:
        try:
            return env.compile(text, expect)
        except CompileError as exc:
            for problem in exc.problems:
                self._expression_problem(step_id, text, path, offset, problem)
            return None

    def _place(self, text: str, path: DataPath, offset: int, problem: Problem) -> Position | None:
        """Where in the source ``problem`` is: at the name it is about, if it names one."""
        line, column = problem.line, problem.column
        if problem.name:
            head = ".".join(problem.name.split(".")[:2])
            index = text.find(head)
            if index >= 0:
                line = text.count("\n", 0, index) + 1
                column = index - (text.rfind("\n", 0, index) + 1) + 1
        return self._position_in(path, offset, line, column)

    def _expression_problem(
        self, step_id: str, text: str, path: DataPath, offset: int, problem: Problem
    ) -> None:
        position = self._place(text, path, offset, problem)
        shown = " ".join(text.split())
        if problem.kind == "template":
            self.report(
                "expression.template",
                f"{problem.message} in {text!r}",
                "write each expression as ${{ expression }}",
                path,
                position=position,
            )
        elif problem.kind == "syntax":
            self.report(
                "expression.syntax",
                f"the CEL expression `{shown}` does not parse: {problem.message}",
                "fix the expression's syntax (see https://cel.dev)",
                path,
                position=position,
            )
        elif problem.kind == "type":
            self.report(
                "expression.type",
                f"in `{shown}`: {problem.message}",
                "change the expression so its value has the type this field needs",
                path,
                position=position,
            )
        else:
            code, message, repair = self._undeclared(step_id, problem.name or "")
            self.report(code, message, repair, path, position=position)

    def _undeclared(self, step_id: str, name: str) -> tuple[str, str, str]:
        parts = name.split(".")
        root = parts[0]
        steps = self.workflow.steps
        if root in ("steps", "completed") and len(parts) > 1:
            target = parts[1]
            if target not in steps:
                return (
                    "expression.unknown-variable",
                    f"{root}.{target} names no step",
                    self._step_hint(target),
                )
            if root == "steps" and not isinstance(steps[target], PRODUCES_DATA):
                return (
                    "dataflow.no-output",
                    f"step '{target}' is a {step_type(steps[target])} step and produces no data",
                    "read the output of a call or wait-for step instead",
                )
            if target == step_id:
                return (
                    "dataflow.not-dominating",
                    f"step '{step_id}' reads {root}.{target}, its own, which does not exist yet",
                    "read only steps that come before this one",
                )
            if root == "steps" and target in self.scopes[step_id].completed:
                return (
                    "dataflow.not-dominating",
                    f"steps.{target} is read here, but some path reaches step '{step_id}' through "
                    f"'{target}' on-timeout, where its result never arrived",
                    "read it only on steps reached through its next, or guard the read in a choose",
                )
            return (
                "dataflow.not-dominating",
                f"{root}.{target} is read at step '{step_id}', "
                f"but '{target}' does not run on every path to it",
                f"read {root}.{target} only in steps that every path reaches through '{target}'",
            )
        if root in ("steps", "completed"):
            return (
                "expression.unknown-variable",
                f"{root} is read as a whole",
                f"name one step: {root}.<step id>",
            )
        if root == "now":
            return (
                "expression.unknown-variable",
                "there is no 'now': a run's decisions depend only on its recorded data",
                "use run.admitted_at, run.deadline_at or completed.<step id> with a duration",
            )
        if root == "run":
            return (
                "expression.unknown-variable",
                f"run has no field {'.'.join(parts[1:])!r}",
                "use run.id, run.admitted_at or run.deadline_at",
            )
        return (
            "expression.unknown-variable",
            f"there is no variable {root!r}",
            "expressions can read input, steps.<id>, completed.<id> and run",
        )

    def _position_in(self, path: DataPath, offset: int, line: int, column: int) -> Position | None:
        origin = self.source.expression_origin(path)
        if origin is None:
            return self.source.at(path)
        start, quote = origin
        if line == 1:
            return Position(start.line, start.column + quote + offset + column - 1)
        return Position(start.line + line - 1, column)

    def _template(
        self,
        env: Environment,
        step_id: str,
        data: JSON,
        path: DataPath,
        compiled: dict[str, Compiled],
    ) -> Template | None:
        try:
            template = parse_template(data, path)
        except TemplateError as exc:
            self._expression_problem(step_id, exc.text, exc.path, 0, exc.problems[0])
            return None
        ok = True
        for sub_path, expr in template_expressions(template, path):
            program = self._compile(env, step_id, expr.source, sub_path, expr.offset)
            if program is None:
                ok = False
            else:
                compiled[expr.source] = program
        return template if ok else None

    def _template_schema(
        self, step: Call | Finish, template: Template, compiled: dict[str, Compiled], path: DataPath
    ) -> None:
        moved: JSON = None  # an operation whose contract moved says how, with its first mismatch
        if isinstance(step, Call):
            operation = self.operations.get(step.id)
            if operation is None:
                return
            schema, code = operation.request_schema, "step.input-schema"
            what = f"operation {operation.product}/{operation.name}"
            moved = operation.descriptor.get("moved")
        else:
            schema, code = self.workflow.outcomes[step.outcome], "step.output-schema"
            what = f"outcome '{step.outcome}'"
        instance = _stand_in(template, compiled)
        for error in jsonschema.Draft202012Validator(schema).iter_errors(instance):
            message = _schema_mismatch(error)
            if message is None:
                continue
            if isinstance(step, Finish) and step.output is None:
                message = (
                    f"the output is omitted, which means null, and {what} needs more: {message}"
                )
                repair = "add an output that the outcome's schema accepts"
            else:
                repair = (
                    f"change the {'input' if isinstance(step, Call) else 'output'} to fit {what}"
                )
                if isinstance(moved, str):
                    repair, moved = f"{repair}: {moved}", None
            self.report(
                code,
                f"step '{step.id}' {'input' if isinstance(step, Call) else 'output'} does not fit "
                f"{what}: {message}",
                repair,
                (*path, *error.absolute_path),
            )


class _Unknown:
    """Stands for a value only known at run time, with its JSON type when known."""

    def __init__(self, kind: str | None) -> None:
        self.kind = kind


def _stand_in(template: Template, compiled: dict[str, Compiled]) -> JSON:
    if isinstance(template, Literal):
        return template.value
    if isinstance(template, Expr):
        return _Unknown(compiled[template.source].json_kind)
    if isinstance(template, Interpolation):
        return _Unknown("string")
    if isinstance(template, MapTemplate):
        return {key: _stand_in(item, compiled) for key, item in template.items}
    assert isinstance(template, ListTemplate)
    return [_stand_in(item, compiled) for item in template.items]


def _contains_unknown(value: JSON) -> bool:
    if isinstance(value, _Unknown):
        return True
    if isinstance(value, dict):
        return any(_contains_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_contains_unknown(v) for v in value)
    return False


def _schema_mismatch(error: jsonschema.ValidationError) -> str | None:
    """The message for a schema error that holds whatever the run-time values are."""
    instance = error.instance
    if isinstance(instance, _Unknown):
        if error.validator != "type" or instance.kind is None:
            return None
        allowed = (
            error.validator_value
            if isinstance(error.validator_value, list)
            else [error.validator_value]
        )
        if (
            instance.kind in allowed
            or (instance.kind == "integer" and "number" in allowed)
            or (instance.kind == "number" and "integer" in allowed)
        ):
            return None
        return (
            f"the expression gives {type_name(instance.kind)}, "
            f"but {' or '.join(map(str, allowed))} is needed"
        )
    if error.validator in ("oneOf", "anyOf"):
        # Say why each form does not fit rather than that none does; with values only known
        # at run time, only mismatches that hold for any value count (else: run time).
        said = _no_form(error)
        if said is not None or _contains_unknown(instance):
            return said
    if _contains_unknown(instance) and error.validator not in (
        "required",
        "additionalProperties",
        "unevaluatedProperties",
        "minProperties",
        "maxProperties",
        "minItems",
        "maxItems",
        "type",
    ):
        return None  # depends on run-time values (anyOf, oneOf, const, ...): decided at run time
    if error.validator == "type" and _contains_unknown(instance):
        return f"{describe(instance)} is not of type {error.validator_value!r}"
    return error.message


def _no_form(error: jsonschema.ValidationError) -> str | None:
    """A oneOf or anyOf that no form can fit whatever the run-time values are: every form
    has a mismatch that holds for any of them (a member missing, one too many)."""
    certain: dict[int, str] = {}
    for sub in error.context or ():
        branch = sub.schema_path[0] if sub.schema_path else None
        said = _schema_mismatch(sub)
        if isinstance(branch, int) and said is not None:
            certain.setdefault(branch, said)
    forms = error.validator_value
    if not isinstance(forms, list) or len(certain) < len(forms):
        return None  # some form may fit, depending on the values: decided at run time
    return "it fits none of the forms it may take: " + "; or ".join(
        certain[n] for n in sorted(certain)
    )


@dataclass(frozen=True)
class CheckReport:
    definition: Definition | None
    diagnostics: list[Diagnostic]

    @property
    def ok(self) -> bool:
        return self.definition is not None


def check_document(
    document: JSON, source: SourceMap, catalog: Catalog, *, trusted: bool = False
) -> CheckReport:
    """Check a workflow document against a catalog; a definition only when it passes.

    With ``trusted`` — a definition some run was admitted under, read back — the rules
    are not judged again (a build that tightens one must not strand the runs admitted
    before it): the definition is built whenever every part a run needs could be (each
    step's edges, operations and results resolved, its expressions compiled), and the
    diagnostics are only reported.
    """
    workflow, diagnostics = read_workflow(document, source, trusted=trusted)
    if workflow is None:
        return CheckReport(None, diagnostics)
    checker = _Checker(workflow, source, catalog)
    checker.references()
    refused = errors(checker.diagnostics) and not trusted
    if refused or _unresolved(checker) or not checker.graph():
        return CheckReport(None, _unusable(diagnostics + checker.diagnostics, trusted))
    programs, templates = checker.expressions()
    subject = checker.subject()
    concurrency = checker.concurrency_key()
    search = checker.search_fields()
    if errors(checker.diagnostics) and not trusted:
        return CheckReport(None, diagnostics + checker.diagnostics)
    definition = Definition(
        workflow=workflow,
        catalog=catalog,
        operations=checker.operations,
        results=checker.results,
        scopes=checker.scopes,
        templates=templates,
        programs=programs,
        subject=subject,
        concurrency=concurrency,
        search=search,
    )
    if trusted and not _compiled(definition):
        return CheckReport(None, _unusable(diagnostics + checker.diagnostics, trusted))
    return CheckReport(definition, diagnostics + checker.diagnostics)


def _unresolved(checker: _Checker) -> bool:
    """Whether a step names a step, operation or result that could not be found."""
    steps = checker.workflow.steps
    return any(
        edge.target not in steps
        or (isinstance(step, Call) and step.id not in checker.operations)
        or (isinstance(step, WaitFor) and step.id not in checker.results)
        for step in steps.values()
        for edge in step.edges()
    )


def _compiled(definition: Definition) -> bool:
    """Whether every expression of every step a run can reach was compiled, and the
    subject, if the workflow names one."""
    if definition.workflow.subject is not None and definition.subject is None:
        return False
    if definition.workflow.concurrency_key is not None and definition.concurrency is None:
        return False
    if definition.search.keys() != definition.workflow.search.keys():
        return False
    for step_id in definition.scopes:
        step = definition.step(step_id)
        programs = definition.programs.get(step_id, {})
        if isinstance(step, Choose):
            needed = [case.when for case in step.cases]
        elif isinstance(step, WaitUntil):
            needed = [step.at]
        elif isinstance(step, WaitFor):
            needed = [step.key]
        else:
            has_template = isinstance(step, Call) or step.output is not None
            if has_template and step_id not in definition.templates:
                return False
            needed = []
        if any(source not in programs for source in needed):
            return False
    return True


def _unusable(diagnostics: list[Diagnostic], trusted: bool) -> list[Diagnostic]:
    """A trusted definition's refusal leads with why it cannot be used."""
    if not trusted:
        return diagnostics
    found = "; ".join(f"{d.code}: {d.message}" for d in errors(diagnostics)[:3])
    reason = Diagnostic(
        "artifact.unusable",
        "this build cannot run it" + (f" ({found})" if found else ""),
        "run it with a build that can, or cancel the runs that use it",
        diagnostics[0].file if diagnostics else "",
    )
    return [reason, *diagnostics]
