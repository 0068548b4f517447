"""A checked workflow, ready to run: steps, their catalog contracts, compiled expressions.

Only :mod:`checker` makes a :class:`Definition`, so holding one means every
reference resolves, the graph is acyclic and every expression compiled in the
scope of its step. The offline test runner and the engine both run from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jsonschema

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.catalog import Catalog, Operation, Result
from registry_coordinator.authoring.expressions import (
    Activation,
    Compiled,
    EvaluationError,
    Scope,
    Template,
    render,
    variables_of_input,
)
from registry_coordinator.authoring.workflow import Step, Workflow
from registry_coordinator.errors import CoordinatorError


class SubjectMissing(CoordinatorError):
    """A start whose input gives its workflow's ``subject`` no id."""


class ConcurrencyKeyMissing(CoordinatorError):
    """A start whose input gives its workflow's ``concurrency.key`` no key."""


@dataclass(frozen=True)
class Definition:
    workflow: Workflow
    catalog: Catalog
    operations: dict[str, Operation]  # call step id -> its operation
    results: dict[str, Result]  # wait-for step id -> its result
    scopes: dict[str, Scope]
    templates: dict[str, Template]  # call input / finish output by step id
    programs: dict[str, dict[str, Compiled]]  # step id -> expression source -> program
    subject: Compiled | None = None  # the workflow's subject, over the input alone
    concurrency: Compiled | None = None  # its concurrency key, over the input alone
    search: dict[str, Compiled] = field(default_factory=dict)  # its search fields, by name
    _validators: dict[int, jsonschema.Draft202012Validator] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def id(self) -> str:
        return self.workflow.id

    @property
    def version(self) -> str:
        return self.workflow.version

    def step(self, step_id: str) -> Step:
        return self.workflow.steps[step_id]

    def expression(self, step_id: str, source: str) -> Compiled:
        return self.programs[step_id][source]

    def subject_of(self, run_input: JSON) -> str | None:
        """The id of the data subject a run of ``run_input`` belongs to (None: the
        workflow names none); :class:`SubjectMissing` if the subject gives none for it.
        Its words never quote the input."""
        return _string_of(self.subject, run_input, "subject", SubjectMissing)

    def concurrency_of(self, run_input: JSON) -> str | None:
        """The key a run of ``run_input`` is one live run of at most (None: the workflow
        names none); :class:`ConcurrencyKeyMissing` if the key gives none for it."""
        return _string_of(self.concurrency, run_input, "concurrency key", ConcurrencyKeyMissing)

    def search_of(self, run_input: JSON) -> dict[str, str]:
        """The search fields a run of ``run_input`` is found by, each as text: a string
        as it is, an integer in decimal. A field the input gives no non-empty string or
        integer for is left out (the run is not found by it); a search never refuses."""
        found = {}
        for name, compiled in self.search.items():
            try:
                value = compiled.evaluate(variables_of_input(run_input))
            except EvaluationError:
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                found[name] = str(value)
            elif isinstance(value, str) and value:
                found[name] = value
        return found

    def render(self, step_id: str, variables: Activation) -> JSON:
        """Evaluate a call's input or a finish's output for a run."""
        return render(self.templates[step_id], self.programs[step_id], variables)

    def schema_errors(self, schema: JSON, value: JSON) -> list[str]:
        """Messages for ``value`` against a JSON Schema of this definition, first few only."""
        # Schemas belong to this immutable definition, so their ids are stable keys.
        validator = self._validators.get(id(schema))
        if validator is None:
            validator = jsonschema.Draft202012Validator(schema)
            self._validators[id(schema)] = validator
        messages = []
        for error in sorted(validator.iter_errors(value), key=lambda e: list(e.path))[:5]:
            where = "/".join(str(p) for p in error.absolute_path)
            messages.append(f"{where or '(top)'}: {_without_value(error)}")
        return messages


#: Keywords whose own message names only the schema's words and the value's keys.
_KEYS_ONLY = frozenset(
    {"required", "additionalProperties", "dependentRequired", "unevaluatedProperties"}
)
#: How a value fails a keyword whose schema value is worth showing, in words.
_FAILS = {
    "type": "is not of type",
    "pattern": "does not match",
    "enum": "is not one of",
    "const": "is not",
    "format": "is not a valid",
}


def _without_value(error: jsonschema.ValidationError) -> str:
    """What a value fails, never the value: a run's values (a product's answer, an
    applicant's id) may be a person's, and what fails them is told in clear — in the run's
    detail, its history and the log. Only the schema's words and the value's keys appear."""
    keyword = str(error.validator)
    if keyword in _KEYS_ONLY:
        return error.message
    rule = error.validator_value
    if keyword in _FAILS:
        return f"{_FAILS[keyword]} {rule!r}"
    if isinstance(rule, int | float | str | bool):
        return f"fails {keyword}: {rule!r}"
    return f"fails {keyword}"


def _string_of(
    compiled: Compiled | None, run_input: JSON, what: str, missing: type[CoordinatorError]
) -> str | None:
    """What ``compiled``, over the input alone, gives for ``run_input``: a non-empty
    string, or ``missing`` raised in words that never quote the input."""
    if compiled is None:
        return None
    try:
        value = compiled.evaluate(variables_of_input(run_input))
    except EvaluationError:
        value = None
    if not isinstance(value, str) or not value:
        kind = "an empty string" if value == "" else "no string"
        raise missing(
            f"the workflow's {what} `{compiled.source}` gives {kind} for this input: give "
            "the field it reads, as a non-empty string"
        )
    return value
