"""Diagnostics: what the offline tools say about a workflow, with stable codes.

Every refusal carries a code from the closed list below, so that scripts and the
documentation can rely on it; the message explains this instance and the repair
says what to change. Positions are 1-based, as editors show them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from registry_coordinator.errors import CoordinatorError


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


#: The closed list of diagnostic codes and what each means. Adding a code is a
#: visible change: it goes into docs/diagnostics.md and the invalid-workflow corpus.
CODES: dict[str, str] = {
    # reading the file
    "file.unreadable": "the file cannot be read (missing, a directory, no permission)",
    "yaml.too-large": "the file is larger than the 1 MiB a workflow source may be",
    "yaml.encoding": "the file is not UTF-8 text",
    "yaml.syntax": "the file is not well-formed YAML",
    "yaml.empty": "the file holds no document",
    "yaml.multiple-documents": "the file holds more than one YAML document",
    "yaml.too-deep": "values are nested deeper than the 32 levels allowed",
    "yaml.alias": "the file uses YAML anchors, aliases or merge keys",
    "yaml.duplicate-key": "a mapping names the same key twice",
    "yaml.non-string-key": "a mapping key is not a string",
    "yaml.unsupported-value": "a value has no JSON equivalent (a tag, timestamp, NaN, ...)",
    # structure
    "field.unknown": "a field that this place does not allow",
    "field.missing": "a required field is absent",
    "field.type": "a field has the wrong type",
    "workflow.api-version": "apiVersion is not one this build reads",
    "workflow.kind": "kind is not Workflow",
    "workflow.bad-id": "the workflow id does not match ^[a-z][a-z0-9-]{0,63}$",
    "workflow.bad-version": "the version does not match ^[A-Za-z0-9._-]{1,64}$",
    "workflow.no-steps": "the workflow declares no steps",
    "workflow.unknown-start": "start names no step",
    "workflow.unreachable-step": "a step cannot be reached from start",
    "workflow.cycle": "the steps form a loop",
    "workflow.path-without-finish": "a step has no way on, so a path would not end in finish",
    "workflow.deadline-too-long": "the deadline is longer than P366D",
    "workflow.subject": "the subject reads something other than the input",
    "workflow.concurrency-key": "the concurrency key reads something other than the input",
    "workflow.search-field": "a search field reads something other than the input",
    "duration.invalid": "a duration is not an ISO 8601 duration this build accepts",
    "limit.steps": "more than 64 steps",
    "limit.connections": "more than 32 connections",
    "limit.outcomes": "more than 64 outcomes",
    "limit.search-fields": "more than 8 search fields",
    "limit.cases": "a choose has fewer than 1 or more than 32 cases",
    "limit.artifact-size": "the packaged artifact would exceed 384 KiB",
    "connection.bad-name": "a connection name does not match ^[a-z][a-z0-9-]{0,63}$",
    "connection.unknown-product": "a connection names a product kind the catalog does not know",
    "connection.unused": "a connection that no step uses",
    "outcome.bad-name": "an outcome name does not match ^[a-z][a-z0-9-]{0,63}$",
    "outcome.unused": "an outcome that no finish step uses",
    "search.bad-name": "a search field name does not match ^[a-z][A-Za-z0-9]{0,39}$",
    "schema.invalid": "an input or outcome schema is not valid JSON Schema 2020-12",
    "step.bad-id": "a step id does not match ^[a-z][a-z0-9_]{0,63}$",
    "step.unknown-type": "a step type other than call, choose, wait-until, wait-for, finish",
    "step.unknown-next": "next, otherwise or on-timeout names no step",
    "step.unknown-connection": "a step names a connection the workflow does not declare",
    "step.unknown-operation": "a call names an operation its product does not have",
    "step.unknown-result": "a wait-for names a result its product does not have",
    "step.bad-result-reference": "a wait-for result is not written connection.result-name",
    "step.input-schema": "a call input cannot satisfy the operation's request schema",
    "step.output-schema": "a finish output cannot satisfy its outcome's schema",
    "step.unknown-outcome": "a finish names an outcome the workflow does not declare",
    "step.timeout-without-on-timeout": "a wait-for has a timeout but no on-timeout",
    "step.on-timeout-without-timeout": "a wait-for has on-timeout but no timeout",
    "step.timeout-exceeds-deadline": "a wait-for timeout is longer than the workflow deadline",
    # expressions and data flow
    "expression.syntax": "a CEL expression does not parse",
    "expression.template": "a ${{ }} template is not closed or is empty",
    "expression.unknown-variable": "an expression names a variable that does not exist",
    "expression.type": "an expression has the wrong type for its place",
    "dataflow.not-dominating": "steps.X or completed.X is read where X has not run on every path",
    "dataflow.no-output": "steps.X is read where step X produces no data",
    # artifacts
    "artifact.invalid": "the file is not a Registry Coordinator artifact",
    "artifact.not-canonical": "the artifact's bytes are not its canonical JSON form",
    "artifact.exists": "the output file already exists with other content",
    "artifact.unusable": "a stored definition that this build cannot run",
    # the service configuration
    "config.invalid-value": "a configuration value is out of range or contradicts another",
    "config.secret-literal": "a secret is written in the configuration instead of referenced",
    "config.secret-unavailable": "a secret's env: variable or file: is missing",
    "config.digest-mismatch": "a pinned artifact's bytes do not have the pinned digest",
    "config.connection-unbound": "a pinned workflow's connection is not configured",
    "config.connection-kind": "a pinned workflow's connection is bound to another product kind",
    "config.parameter-missing": "a pinned workflow's operation sends a connection-bound "
    "parameter its connection does not set",
    "config.parameter-invalid": "a connection sets a parameter to a value its product "
    "does not take",
    "config.parameter-unknown": "a connection sets a parameter its product does not have",
    "config.task-authority-missing": "a pinned workflow's operation runs only under "
    "Casework's task authority, and its connection has none",
    "config.external-unreviewed": "a pinned workflow reads an external path or query "
    "parameter its connection's review does not list",
    "config.task-authority-refused": "a pinned workflow's operation is bound to a connection "
    "whose task authority its product refuses for it",
    "config.listen-in-use": "the listen address is held by another process",
    "config.database-unreachable": "the database cannot be reached, or refuses the connection",
    # scenarios (coordinator test)
    "scenario.invalid": "a scenario names something the workflow does not have",
    "scenario.failed": "a scenario's run did not end as it expects",
}


@dataclass(frozen=True)
class Position:
    line: int
    column: int


@dataclass(frozen=True)
class Diagnostic:
    code: str
    message: str
    repair: str
    file: str
    position: Position | None = None
    severity: Severity = Severity.ERROR

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"diagnostic code {self.code!r} is not in the closed list")

    @property
    def line(self) -> int | None:
        return self.position.line if self.position else None

    @property
    def column(self) -> int | None:
        return self.position.column if self.position else None

    def as_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity.value,
            "code": self.code,
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "message": self.message,
            "repair": self.repair,
        }

    def as_text(self) -> str:
        where = self.file
        if self.position:
            where += f":{self.position.line}:{self.position.column}"
        return (
            f"{where}: {self.severity.value}[{self.code}]: {self.message}\n  repair: {self.repair}"
        )


class Refused(CoordinatorError):
    """Raised by an offline tool when its input is refused; carries the reasons."""

    def __init__(self, diagnostics: Sequence[Diagnostic]) -> None:
        super().__init__("\n".join(d.as_text() for d in diagnostics))
        self.diagnostics = tuple(diagnostics)


def errors(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.severity is Severity.ERROR]


def sort_key(d: Diagnostic) -> tuple[str, int, int, str]:
    pos = d.position or Position(0, 0)
    return (d.file, pos.line, pos.column, d.code)


def render_json(report: Any) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False, sort_keys=False)
