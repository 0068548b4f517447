"""CEL expressions in-process: how compile problems are classified and placed, how
values cross into JSON and text, and the one form of instants.

The property tests check round trips; these pin the rules a round trip cannot see
(mutation testing, ``just mutants-pure``, found them untested): which problem a
message is, the article in a type's name, timestamps with and without a fraction.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from registry_coordinator.authoring.expressions import (
    CompileError,
    Environment,
    EvaluationError,
    Expr,
    Interpolation,
    ListTemplate,
    Literal,
    Problem,
    Scope,
    TemplateError,
    _problems,
    format_instant,
    holds_nul,
    parse_instant,
    parse_template,
    render,
    template_expressions,
    to_json,
    to_text,
    type_name,
    variables,
)

ENV = Environment(Scope(frozenset({"a"}), frozenset()))


def problems(source: str, expect: tuple[str, ...] = (), env: Environment = ENV) -> list[Problem]:
    with pytest.raises(CompileError) as refused:
        env.compile(source, expect)
    return refused.value.problems


def test_compile_problems_are_classified_and_placed() -> None:
    [undeclared] = problems("1 +\n  nope")
    assert (undeclared.kind, undeclared.line, undeclared.column, undeclared.name) == (
        "undeclared",
        2,
        3,
        "nope",
    )
    [syntax] = problems("1 +")
    assert (syntax.kind, syntax.line) == ("syntax", 1)
    assert syntax.message.startswith("Syntax error")
    [typed] = problems('1 + "a"')
    assert (typed.kind, typed.line, typed.column) == ("type", 1, 3)


def test_a_compile_error_says_each_problem() -> None:
    with pytest.raises(CompileError) as refused:
        ENV.compile("nope + other")
    first, second = refused.value.problems
    assert str(refused.value) == f"{first.message}; {second.message}"
    [empty] = problems("  ")
    assert empty == Problem("syntax", "the expression is empty", 1, 1)


def test_a_static_type_outside_the_expected_ones_is_refused() -> None:
    env = Environment(Scope(frozenset({"a"}), frozenset({"a"})))
    assert problems("1", ("BOOL",), env) == [
        Problem("type", "the expression gives an int, not a bool", 1, 1)
    ]
    assert problems('"s"', ("INT", "BOOL"), env) == [
        Problem("type", "the expression gives a string, not a bool or an int", 1, 1)
    ]
    assert env.compile("input.x", ("BOOL",)).kind == "DYN"  # known at run time only
    assert env.compile("steps.a", ("BOOL",)).kind == "DYN"
    assert env.compile("completed.a", ("TIMESTAMP",)).kind == "TIMESTAMP"
    assert env.compile("run.id", ("STRING",)).kind == "STRING"
    assert env.compile("run.admitted_at < run.deadline_at", ("BOOL",)).kind == "BOOL"
    assert env.compile("run.deadline_at", ("TIMESTAMP",)).kind == "TIMESTAMP"


def test_a_message_without_a_position_is_a_syntax_problem_at_the_start() -> None:
    assert _problems("INVALID_ARGUMENT: it broke [INVALID_ARGUMENT]") == [
        Problem("syntax", "it broke", 1, 1)
    ]


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("INT", "an int"),
        ("DOUBLE", "a double"),
        ("BOOL", "a bool"),
        ("TIMESTAMP", "a timestamp"),
        ("LIST<INT>", "a list"),
        ("MAP<STRING, LIST<INT>>", "a map"),
    ],
)
def test_type_names_read_as_a_message_reads_them(kind: str, name: str) -> None:
    assert type_name(kind) == name


def test_an_evaluation_error_names_the_expression_and_the_reason() -> None:
    compiled = Environment(Scope(frozenset(), frozenset())).compile("input.missing")
    with pytest.raises(EvaluationError, match=r"^input\.missing: .*missing"):
        compiled.evaluate({"input": {}})


def test_values_cross_into_json() -> None:
    assert to_json([datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), None]) == [
        "2026-01-02T03:04:05Z",
        None,
    ]
    assert to_json({"d": timedelta(seconds=90)}) == {"d": "90s"}
    assert to_json(1.5) == 1.5
    for value, why in (
        (b"x", "an expression gave bytes, which have no JSON form"),
        (float("inf"), "an expression gave a number that is not finite"),
        ({1: "a"}, "an expression gave a map key 1 that is not a string"),
        (object(), "an expression gave a object, which has no JSON form"),
    ):
        with pytest.raises(EvaluationError) as refused:
            to_json(value)
        assert str(refused.value) == why


def test_values_written_into_text() -> None:
    assert to_text("plain") == "plain"
    assert to_text(datetime(2026, 1, 2, tzinfo=UTC)) == "2026-01-02T00:00:00Z"
    assert to_text({"b": ["é", 1], "a": None}) == '{"a":null,"b":["é",1]}'


def test_templates_render_each_part() -> None:
    compiled = {"a": Environment(Scope(frozenset(), frozenset())).compile("input.a")}
    template = ListTemplate((Literal(1), Expr("a", 0), Interpolation(("x=", Expr("a", 0), "!"))))
    assert render(template, compiled, {"input": {"a": [1]}}) == [1, [1], "x=[1]!"]
    assert parse_template(["${{ a }}"]) == ListTemplate((Expr(" a ", 3),))


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("x ${{ ${{ y }} }}", "a ${{ is not closed by }}", 3),
        ("${{ }}", "a ${{ }} holds no expression", 1),
        ("tail ${{ x", "a ${{ is not closed by }}", 6),
        ("${{ a }} and ${{ b", "a ${{ is not closed by }}", 14),
    ],
)
def test_a_malformed_template_is_refused_where_it_goes_wrong(
    text: str, message: str, column: int
) -> None:
    with pytest.raises(TemplateError) as refused:
        parse_template({"k": [text]}, ("input",))
    assert refused.value.problems == [Problem("template", message, 1, column)]
    assert (refused.value.text, refused.value.path) == (text, ("input", "k", 0))


def test_templates_split_into_literals_and_expressions() -> None:
    assert parse_template("plain") == Literal("plain")
    assert parse_template(5) == Literal(5)
    assert parse_template("a ${{ b }} c ${{ d }}") == Interpolation(
        ("a ", Expr(" b ", 5), " c ", Expr(" d ", 16))
    )
    assert parse_template("${{x}}${{y}}") == Interpolation((Expr("x", 3), Expr("y", 9)))
    template = parse_template({"m": ["${{ a }}", {"k": "x${{ b }}"}]})
    assert list(template_expressions(template, ("input",))) == [
        (("input", "m", 0), Expr(" a ", 3)),
        (("input", "m", 1, "k"), Expr(" b ", 4)),
    ]


def test_instants_are_written_in_utc_whatever_the_machines_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert format_instant(datetime(2026, 1, 2, 5, tzinfo=UTC)) == "2026-01-02T05:00:00Z"
        assert parse_instant("2026-01-02T05:00:00+09:00").tzinfo is UTC
    finally:
        monkeypatch.undo()
        time.tzset()


def test_instants_have_one_form() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert format_instant(datetime(2026, 1, 2, 5, 0, tzinfo=plus_two)) == "2026-01-02T03:00:00Z"
    assert format_instant(datetime(2026, 1, 2, tzinfo=UTC)) == "2026-01-02T00:00:00Z"
    fraction = datetime(2026, 1, 2, 0, 0, 0, 120_000, tzinfo=UTC)
    assert format_instant(fraction) == "2026-01-02T00:00:00.12Z"
    assert format_instant(datetime(999, 1, 2, tzinfo=UTC)) == "0999-01-02T00:00:00Z"


@pytest.mark.parametrize(
    ("text", "instant"),
    [
        ("2026-01-02T03:04:05Z", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2026-01-02t03:04:05z", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2026-01-02 03:04:05.25+02:00", datetime(2026, 1, 2, 1, 4, 5, 250_000, tzinfo=UTC)),
    ],
)
def test_rfc_3339_instants_are_read_in_utc(text: str, instant: datetime) -> None:
    parsed = parse_instant(text)
    assert parsed == instant
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    [
        "2026-01-02T03:04:05",  # no offset: a local time
        "2026-01-02",
        "x2026-01-02T03:04:05Z",
        "2026-01-02T03:04:05Zx",
        "2026-01-02T03:04:05+0200",
    ],
)
def test_anything_else_is_not_an_instant(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not an RFC 3339 timestamp with an offset$"):
        parse_instant(text)


def test_nul_is_found_wherever_it_is() -> None:
    assert holds_nul({"a": ["x", {"b\x00": 1}]})
    assert holds_nul(["\x00"])
    assert not holds_nul({"a": ["x", 1, None]})


def test_a_runs_variables_refuse_nul_and_name_where_it_was() -> None:
    instant = datetime(2026, 1, 2, tzinfo=UTC)
    for given, outputs, name in (
        ({}, {"read": {"k": "\x00"}}, "read"),
        ({"k": "\x00"}, {}, "input"),
    ):
        with pytest.raises(EvaluationError, match=rf"^{name} holds a NUL character"):
            variables(
                input=given,
                outputs=outputs,
                completed={},
                run_id="r",
                admitted_at=instant,
                deadline_at=instant,
            )
