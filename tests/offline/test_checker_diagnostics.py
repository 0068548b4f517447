"""What the checker tells an author about an expression: the code, the message, the
repair and the position, each pinned for one edit of the tutorial's workflow.

The corpus (tests/corpus) checks each refusal's code and line; mutation testing
(``just mutants-pure``) found that a message naming the wrong thing, or a column off
by one, went unnoticed. Also the trusted reading of a stored definition: refused only
when some step a run needs could not be compiled, with the reason first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from registry_coordinator.authoring.artifact import check_source, load
from registry_coordinator.authoring.canonical import canonical_bytes
from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.authoring.checker import MAX_CONNECTIONS
from registry_coordinator.authoring.diagnostics import Diagnostic, Position, Refused
from tests.support import WORKFLOWS

TUTORIAL = (WORKFLOWS / "review-application" / "workflow.yaml").read_text()
WHEN = 'steps.await_decision.status == "approved"'  # line 72, from column 15
UNKNOWN_VARIABLE = "expression.unknown-variable"
NOT_DOMINATING = "dataflow.not-dominating"


def diagnostics(tmp_path: Path, old: str, new: str) -> list[Diagnostic]:
    assert TUTORIAL.count(old) == 1, old
    path = tmp_path / "workflow.yaml"
    path.write_text(TUTORIAL.replace(old, new))
    return check_source(path).diagnostics


@pytest.mark.parametrize(
    ("old", "new", "code", "message", "repair", "at"),
    [
        (
            WHEN,
            "steps.nope.decision == 1",
            UNKNOWN_VARIABLE,
            "steps.nope names no step",
            "name one of the workflow's steps",
            (72, 15),
        ),
        (
            WHEN,
            'steps.notfy.id == "x"',
            UNKNOWN_VARIABLE,
            "steps.notfy names no step",
            "did you mean 'notify'?",
            (72, 15),
        ),
        (
            WHEN,
            "steps.route.x == 1",
            "dataflow.no-output",
            "step 'route' is a choose step and produces no data",
            "read the output of a call or wait-for step instead",
            (72, 15),
        ),
        (
            "key: steps.request_review.requestId",
            "key: steps.await_decision.requestId",
            NOT_DOMINATING,
            "step 'await_decision' reads steps.await_decision, its own, which does not exist yet",
            "read only steps that come before this one",
            (65, 10),
        ),
        (
            WHEN,
            "steps.notify.id == 'x'",
            NOT_DOMINATING,
            "steps.notify is read at step 'route', but 'notify' does not run on every path to it",
            "read steps.notify only in steps that every path reaches through 'notify'",
            (72, 15),
        ),
        (
            "  not_decided:  {type: finish, outcome: not-decided}",
            "  not_decided:  {type: finish, outcome: not-decided, "
            "output: '${{ steps.await_decision.status }}'}",
            NOT_DOMINATING,
            "steps.await_decision is read here, but some path reaches step 'not_decided' "
            "through 'await_decision' on-timeout, where its result never arrived",
            "read it only on steps reached through its next, or guard the read in a choose",
            (116, 67),
        ),
        (
            WHEN,
            "size(steps) > 0",
            UNKNOWN_VARIABLE,
            "steps is read as a whole",
            "name one step: steps.<step id>",
            (72, 20),
        ),
        (
            WHEN,
            "now > run.admitted_at",
            UNKNOWN_VARIABLE,
            "there is no 'now': a run's decisions depend only on its recorded data",
            "use run.admitted_at, run.deadline_at or completed.<step id> with a duration",
            (72, 15),
        ),
        (
            WHEN,
            "run.started == 1",
            UNKNOWN_VARIABLE,
            "run has no field 'started'",
            "use run.id, run.admitted_at or run.deadline_at",
            (72, 15),
        ),
        (
            WHEN,
            "foo == 1",
            UNKNOWN_VARIABLE,
            "there is no variable 'foo'",
            "expressions can read input, steps.<id>, completed.<id> and run",
            (72, 15),
        ),
        (
            'recordId: "${{ input.applicationId }}"',
            'recordId: "id-${{ nope }}"',
            UNKNOWN_VARIABLE,
            "there is no variable 'nope'",
            "expressions can read input, steps.<id>, completed.<id> and run",
            (41, 25),
        ),
        (
            'recordId: "${{ input.applicationId }}"',
            'recordId: "${{ input.applicationId"',
            "expression.template",
            "a ${{ is not closed by }} in '${{ input.applicationId'",
            "write each expression as ${{ expression }}",
            (41, 18),
        ),
        (
            WHEN,
            "completed.nope > run.admitted_at",
            UNKNOWN_VARIABLE,
            "completed.nope names no step",
            "name one of the workflow's steps",
            (72, 15),
        ),
        (
            WHEN,
            "size(completed) > 0",
            UNKNOWN_VARIABLE,
            "completed is read as a whole",
            "name one step: completed.<step id>",
            (72, 20),
        ),
        (
            WHEN,
            "run.a.b == 1",
            UNKNOWN_VARIABLE,
            "run has no field 'a.b'",
            "use run.id, run.admitted_at or run.deadline_at",
            (72, 15),
        ),
        (
            "result: reviews.review-decision",
            "result: nowhere.review-decision",
            "step.unknown-connection",
            "step 'await_decision' uses connection 'nowhere', which the workflow does not declare",
            "declare it under connections, or use one of: applications, reviews, notices",
            (64, 13),
        ),
        (
            "result: reviews.review-decision",
            "result: applications.review-decision",
            "step.unknown-result",
            "product breg has no result 'review-decision'",
            "use one of: (it has none)",
            (64, 13),
        ),
        (
            "    timeout: P14D\n",
            "    timeout: P61D\n",
            "step.timeout-exceeds-deadline",
            "step 'await_decision' waits up to P61D, longer than the workflow deadline P60D",
            "shorten the timeout or lengthen the deadline: the run would expire first",
            (66, 14),
        ),
        (
            WHEN,
            "1 + 'a'",
            "expression.type",
            "in `1 + 'a'`: found no matching overload for '_+_' applied to '(int, string)'",
            "change the expression so its value has the type this field needs",
            (72, 17),
        ),
    ],
)
def test_an_expressions_diagnostic_names_the_problem_and_its_place(
    tmp_path: Path, old: str, new: str, code: str, message: str, repair: str, at: tuple[int, int]
) -> None:
    [found] = diagnostics(tmp_path, old, new)
    assert (found.code, found.message, found.repair) == (code, message, repair)
    assert found.position == Position(*at)
    assert found.file == str(tmp_path / "workflow.yaml")


RECORD_ID = 'recordId: "${{ input.applicationId }}"'  # line 41, from column 7
READ_INPUT = "step 'read_application' input does not fit operation breg/read-record: "
#: read-record's contract moved with the real BReg's: a mismatch says how, in its repair.
READ_MOVED = builtin_catalog().products["breg"].operations["read-record"].descriptor["moved"]


@pytest.mark.parametrize(
    ("new", "mismatch", "at"),
    [
        ('recordId: "${{ 1 + 2 }}"', "the expression gives an integer, but string is needed", 17),
        ('recordId: "${{ 1.5 }}"', "the expression gives a number, but string is needed", 17),
        ('recordId: "${{ true }}"', "the expression gives a boolean, but string is needed", 17),
        ('recordId: "${{ [1] }}"', "the expression gives an array, but string is needed", 17),
        ("recordId: 5", "5 is not of type 'string'", 17),
        ('recordId: {a: "${{ input.x }}"}', "a mapping is not of type 'string'", 7),
        ('recordId: ["${{ input.x }}"]', "a list is not of type 'string'", 7),
        (
            RECORD_ID + '\n      extra: "${{ input.x }}"',
            "Additional properties are not allowed ('extra' was unexpected)",
            None,
        ),
    ],
)
def test_a_call_input_that_cannot_fit_its_operation_is_refused_where_it_is(
    tmp_path: Path, new: str, mismatch: str, at: int | None
) -> None:
    [found] = diagnostics(tmp_path, RECORD_ID, new)
    assert (found.code, found.message) == ("step.input-schema", READ_INPUT + mismatch)
    assert found.repair == f"change the input to fit operation breg/read-record: {READ_MOVED}"
    assert found.position == (Position(41, at) if at else Position(39, 5))


def test_how_an_operation_moved_is_said_once_with_its_first_mismatch(tmp_path: Path) -> None:
    assert READ_MOVED.startswith("since catalog 2026.12.1 recordId is a canonical lowercase UUID")
    first, second = diagnostics(tmp_path, RECORD_ID, 'recordId: 5\n      extra: "x"')
    assert first.repair == f"change the input to fit operation breg/read-record: {READ_MOVED}"
    assert second.repair == "change the input to fit operation breg/read-record"


def test_input_that_may_fit_at_run_time_is_left_to_run_time(tmp_path: Path) -> None:
    assert diagnostics(tmp_path, RECORD_ID, 'recordId: "a-${{ 1 }}"') == []
    assert diagnostics(tmp_path, RECORD_ID, 'recordId: "${{ input.x }}"') == []
    assert diagnostics(tmp_path, "    timeout: P14D\n", "    timeout: P60D\n") == []


def test_a_wait_until_needs_a_timestamp_or_its_text(tmp_path: Path) -> None:
    source = (WORKFLOWS / "follow-up-notice" / "workflow.yaml").read_text()
    at = 'at: run.admitted_at + duration("336h")'
    path = tmp_path / "workflow.yaml"
    path.write_text(source.replace(at, 'at: "5"'))
    [found] = check_source(path).diagnostics
    assert (found.code, found.message, found.position) == (
        "expression.type",
        "in `5`: the expression gives an int, not a string or a timestamp",
        Position(37, 10),
    )
    path.write_text(source.replace(at, "at: \"'2026-01-01T00:00:00Z'\""))
    assert check_source(path).diagnostics == []


def test_an_omitted_output_is_null_and_said_so(tmp_path: Path) -> None:
    outcome = "    outcome: approved-and-notified\n"
    output = '    output: {messageId: "${{ steps.notify.id }}"}\n'
    [found] = diagnostics(tmp_path, outcome + output, outcome)
    assert found.code == "step.output-schema"
    assert found.message == (
        "step 'approved' output does not fit outcome 'approved-and-notified': the output is "
        "omitted, which means null, and outcome 'approved-and-notified' needs more: "
        "None is not of type 'object'"
    )
    assert found.repair == "add an output that the outcome's schema accepts"
    [typed] = diagnostics(
        tmp_path, outcome + output, outcome + '    output: {messageId: "${{ 5 }}"}\n'
    )
    assert typed.message == (
        "step 'approved' output does not fit outcome 'approved-and-notified': "
        "the expression gives an integer, but string is needed"
    )
    assert typed.repair == "change the output to fit outcome 'approved-and-notified'"
    assert typed.position == Position(104, 25)


NOT_DECIDED = "  not_decided:  {type: finish, outcome: not-decided}\n"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            NOT_DECIDED,
            NOT_DECIDED + "  orphan: {type: finish, outcome: rejected}\n",
            (
                "workflow.unreachable-step",
                "error",
                "step 'orphan' cannot be reached from start 'read_application'",
                "remove the step, or name it in a next of a reachable step",
                Position(117, 3),
            ),
        ),
        (
            '  not-decided: {type: "null"}\n',
            '  not-decided: {type: "null"}\n  spare: {type: "null"}\n',
            (
                "outcome.unused",
                "error",
                "outcome 'spare' is declared but no finish step uses it",
                "remove the outcome, or add a finish step that ends with it",
                Position(33, 3),
            ),
        ),
        (
            "  notices: messaging\n",
            "  notices: messaging\n  extra: casework\n",
            (
                "connection.unused",
                "warning",
                "connection 'extra' is declared but no step uses it",
                "remove it, so operators need not bind it",
                Position(22, 3),
            ),
        ),
    ],
)
def test_a_declaration_nothing_uses_is_pointed_at_by_its_name(
    tmp_path: Path, old: str, new: str, expected: tuple[str, str, str, str, Position]
) -> None:
    """The key, not the value after it on the same line: the name is what to remove."""
    [found] = diagnostics(tmp_path, old, new)
    assert (found.code, found.severity.value, found.message, found.repair, found.position) == (
        expected
    )


def test_a_syntax_error_is_shown_with_the_expression_on_one_line(tmp_path: Path) -> None:
    [found] = diagnostics(tmp_path, WHEN, "steps.await_decision.status ==")
    assert found.code == "expression.syntax"
    assert found.message.startswith(
        "the CEL expression `steps.await_decision.status ==` does not parse: Syntax error: "
    )
    assert found.repair == "fix the expression's syntax (see https://cel.dev)"
    assert found.position == Position(72, 45)


def test_a_name_on_a_later_line_of_an_expression_is_placed_on_that_line(tmp_path: Path) -> None:
    block = "- when: |-\n          1 == 1 &&\n            steps.nope.x == 1 &&\n          true"
    [found] = diagnostics(tmp_path, f"- when: {WHEN}", block)
    assert found.message == "steps.nope names no step"
    assert found.position is not None and found.position.line == 73


def stored_tutorial() -> dict[str, Any]:
    checked = check_source(WORKFLOWS / "review-application")
    assert checked.artifact is not None
    document: dict[str, Any] = json.loads(checked.artifact)
    return document


@pytest.mark.parametrize(
    ("path", "broken"),
    [
        (("route", "cases", 0, "when"), "steps.await_decision.status =="),
        (("await_decision", "key"), "steps.request_review.requestId +"),
        (("read_application", "input", "recordId"), "${{ input. }}"),
        (("approved", "output", "messageId"), "${{ steps.notify. }}"),
    ],
)
def test_a_stored_definition_a_build_cannot_compile_is_refused_with_the_reason_first(
    path: tuple[str | int, ...], broken: str
) -> None:
    document = stored_tutorial()
    holder: Any = document["workflow"]
    for part in ("steps", *path[:-1]):
        holder = holder[part]
    holder[path[-1]] = broken
    with pytest.raises(Refused) as refused:
        load(canonical_bytes(document), "stored", trusted=True)
    first, second = refused.value.diagnostics[:2]
    assert first.code == "artifact.unusable"
    assert first.message == f"this build cannot run it ({second.code}: {second.message})"
    assert first.repair == "run it with a build that can, or cancel the runs that use it"


def test_a_stored_definition_is_built_under_rules_it_no_longer_meets() -> None:
    document = stored_tutorial()
    document["workflow"]["deadline"] = "P400D"  # over this build's limit of P366D
    definition = load(canonical_bytes(document), "stored", trusted=True)
    assert definition.results["await_decision"].name == "review-decision"
    assert definition.operations["notify"].name == "submit-message"
    with pytest.raises(Refused):
        load(canonical_bytes(document), "stored")


@pytest.mark.parametrize(
    ("path", "broken", "why"),
    [
        (
            ("route", "otherwise"),
            "nowhere",
            "step.unknown-next: step 'route' otherwise names 'nowhere', which is not a step",
        ),
        (
            ("read_application", "operation"),
            "nope",
            "step.unknown-operation: product breg has no operation 'nope'",
        ),
    ],
)
def test_a_stored_definition_naming_what_this_build_lacks_is_refused(
    path: tuple[str, str], broken: str, why: str
) -> None:
    document = stored_tutorial()
    document["workflow"]["steps"][path[0]][path[1]] = broken
    with pytest.raises(Refused) as refused:
        load(canonical_bytes(document), "stored", trusted=True)
    first = refused.value.diagnostics[0]
    assert (first.code, first.message, first.file) == (
        "artifact.unusable",
        f"this build cannot run it ({why})",
        "stored",
    )


def test_the_reason_names_the_first_three_errors() -> None:
    document = stored_tutorial()
    steps = document["workflow"]["steps"]
    steps["route"]["cases"][0]["when"] = "1 +"
    steps["await_decision"]["key"] = "2 +"
    steps["read_application"]["input"]["recordId"] = "${{ 3 + }}"
    steps["approved"]["output"]["messageId"] = "${{ 4 + }}"
    with pytest.raises(Refused) as refused:
        load(canonical_bytes(document), "stored", trusted=True)
    first, *errors = refused.value.diagnostics
    assert len(errors) == 4
    named = "; ".join(f"{d.code}: {d.message}" for d in errors[:3])
    assert first.message == f"this build cannot run it ({named})"


def test_a_stored_wait_until_that_cannot_compile_is_refused() -> None:
    checked = check_source(WORKFLOWS / "follow-up-notice")
    assert checked.artifact is not None
    document = json.loads(checked.artifact)
    document["workflow"]["steps"]["wait_two_weeks"]["at"] = "run.admitted_at +"
    with pytest.raises(Refused) as refused:
        load(canonical_bytes(document), "stored", trusted=True)
    assert refused.value.diagnostics[0].code == "artifact.unusable"


OUTPUT_ONLY = """\
apiVersion: coordinator.registrystack.org/v1alpha1
kind: Workflow
id: probe
version: "1"
deadline: P30D
input: {type: object}
outcomes:
  done: SCHEMA
start: finish
steps:
  finish: {type: finish, outcome: done, output: OUTPUT}
"""


@pytest.mark.parametrize(
    ("schema", "output", "mismatch"),
    [
        ("{properties: {n: {type: integer}}}", '{n: "${{ 1.5 }}"}', None),
        ("{properties: {n: {type: number}}}", '{n: "${{ 1 }}"}', None),
        ("{items: {const: 1}}", '["${{ input.x }}"]', None),  # decided at run time
        (
            "{properties: {n: {type: integer}}}",
            "{n: \"${{ 'a' }}\"}",
            "the expression gives a string, but integer is needed",
        ),
        (
            '{properties: {n: {type: [integer, "null"]}}}',
            "{n: \"${{ 'a' }}\"}",
            "the expression gives a string, but integer or null is needed",
        ),
        (
            "{properties: {n: {type: integer}}}",
            '{n: "n-${{ 1 }}"}',
            "the expression gives a string, but integer is needed",
        ),
        ("{maxProperties: 1}", '{a: "${{ input.x }}", b: 1}', "has too many properties"),
        ("{minProperties: 3}", '{a: "${{ input.x }}", b: 1}', "does not have enough properties"),
        (
            "{unevaluatedProperties: false, properties: {a: {}}}",
            '{a: "${{ input.x }}", b: 1}',
            "Unevaluated properties are not allowed ('b' was unexpected)",
        ),
        ("{minItems: 2}", '["${{ input.x }}"]', "is too short"),
        ("{maxItems: 1}", '["${{ input.x }}", 2]', "is too long"),
    ],
)
def test_an_output_is_refused_only_for_what_holds_whatever_its_expressions_give(
    tmp_path: Path, schema: str, output: str, mismatch: str | None
) -> None:
    """A count of properties or items is known without the values, and a type from an
    expression's static type (an integer is a number, and a number may be integral);
    anything else waits for the run."""
    path = tmp_path / "workflow.yaml"
    path.write_text(OUTPUT_ONLY.replace("SCHEMA", schema).replace("OUTPUT", output))
    found = check_source(path).diagnostics
    if mismatch is None:
        assert found == []
    else:
        [only] = found
        assert only.code == "step.output-schema"
        assert only.message.startswith("step 'finish' output does not fit outcome 'done': ")
        assert only.message.endswith(mismatch)


def test_a_workflow_at_a_limit_is_within_it(tmp_path: Path) -> None:
    declared = "".join(f"  c{n}: breg\n" for n in range(MAX_CONNECTIONS))
    path = tmp_path / "workflow.yaml"
    path.write_text(
        OUTPUT_ONLY.replace("SCHEMA", '{type: "null"}')
        .replace("OUTPUT", "null")
        .replace("outcomes:\n", "connections:\n" + declared + "outcomes:\n")
    )
    codes = {d.code for d in check_source(path).diagnostics}
    assert codes == {"connection.unused"}


def test_a_literal_input_that_fits_no_form_says_why_each_form_does_not(tmp_path: Path) -> None:
    """Messaging's request takes a template with its locale and data, or content: a call
    written in full, with no expression, that fits neither is told what each form lacks,
    not only that it is "valid under none of the given schemas"."""
    old = """\
      to: {email: "${{ steps.read_application.data.domainData.email }}"}
      template: {id: application-approved, version: "1"}
      locale: en
      data: {applicationId: "${{ input.applicationId }}"}
      correlationId: "${{ run.id }}"
"""
    new = """\
      to: {email: a@example.org}
      template: {id: application-approved, version: "1"}
      data: {}
"""
    [found] = diagnostics(tmp_path, old, new)
    assert found.code == "step.input-schema"
    assert "not valid under any of the given schemas" not in found.message
    assert found.message.startswith(
        "step 'notify' input does not fit operation messaging/submit-message: it fits none "
        "of the forms it may take: "
    )
