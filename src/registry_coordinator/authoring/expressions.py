"""CEL expressions and ``${{ }}`` templates, compiled against what a step may read.

Each expression is compiled by cel-cpp's checker in an environment that declares
exactly the variables available at its step: ``input``, ``run.id``,
``run.admitted_at``, ``run.deadline_at``, and one qualified variable
``steps.<id>`` / ``completed.<id>`` for every step whose data reaches this point
on every path. An expression that names anything else fails to compile, which is
how unknown variables and data-flow mistakes are caught offline rather than at
run time.

Values cross the boundary as JSON: timestamps leave as RFC 3339 text.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cel_expr_python import cel

from registry_coordinator.authoring.canonical import JSON, canonical_bytes
from registry_coordinator.errors import CoordinatorError

#: Names that CEL reserves; a step named like this could not be read as ``steps.<id>``.
RESERVED = frozenset(
    [
        "as",
        "break",
        "const",
        "continue",
        "else",
        "false",
        "for",
        "function",
        "if",
        "import",
        "in",
        "let",
        "loop",
        "package",
        "namespace",
        "null",
        "return",
        "true",
        "var",
        "void",
        "while",
    ]
)

_TEMPLATE = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)
_ERROR = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*)")
_UNDECLARED = re.compile(r"undeclared reference to '([^']+)'")

#: JSON Schema type a CEL static type produces once converted to JSON.
_JSON_KIND = {
    "BOOL": "boolean",
    "INT": "integer",
    "UINT": "integer",
    "DOUBLE": "number",
    "STRING": "string",
    "NULL": "null",
    "TIMESTAMP": "string",
    "DURATION": "string",
}


@dataclass(frozen=True)
class Scope:
    """What an expression may read at one point of the graph."""

    steps: frozenset[str]
    completed: frozenset[str]


@dataclass(frozen=True)
class Problem:
    """Why an expression did not compile, at a 1-based position within its text."""

    kind: str  # "syntax", "undeclared", "type", "template"
    message: str
    line: int
    column: int
    name: str | None = None


class CompileError(CoordinatorError):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


class TemplateError(CompileError):
    """A malformed ``${{ }}``, with the string and the data path it was found at."""

    def __init__(self, problem: Problem, text: str, path: tuple[str | int, ...]) -> None:
        super().__init__([problem])
        self.text, self.path = text, path


class EvaluationError(CoordinatorError):
    """An expression failed while a run evaluated it (missing field, division by zero...)."""


#: The variables a run's expressions evaluate against (:func:`variables`): its input, its
#: steps' outputs, when each step completed, and its id and instants. Not JSON: instants
#: are datetimes, as CEL's timestamps.
Activation = Mapping[str, object]


@dataclass(frozen=True)
class Compiled:
    source: str
    program: Any
    kind: str  # the CEL static type's name, e.g. "BOOL", "DYN", "MAP<DYN, DYN>"

    @property
    def json_kind(self) -> str | None:
        """The JSON Schema type of the value, when the checker knows it."""
        if self.kind.startswith("LIST"):
            return "array"
        if self.kind.startswith("MAP"):
            return "object"
        return _JSON_KIND.get(self.kind)

    def evaluate(self, variables: Activation) -> object:
        value = self.program.eval(data=variables)
        if value.type() == cel.Type.ERROR:
            raise EvaluationError(f"{self.source}: {_strip_status(str(value.value()))}")
        return value.plain_value()


def _digest(value: object) -> str:
    """``digest(value)``: ``sha256:`` and the hex SHA-256 of the value's canonical JSON —
    a content digest a product can bind a request to (Casework's subject digest)."""
    return "sha256:" + hashlib.sha256(canonical_bytes(to_json(value))).hexdigest()


#: The functions Coordinator adds to CEL's own: ``digest`` of a map, list or string.
FUNCTIONS = (
    cel.FunctionDecl(
        "digest",
        [
            cel.Overload(
                f"digest_{kind.lower()}", cel.Type.STRING, [getattr(cel.Type, kind)], impl=_digest
            )
            for kind in ("MAP", "LIST", "STRING")
        ],
    ),
)


class Environment:
    """A cel-cpp environment declaring the variables of one :class:`Scope`, and
    Coordinator's :data:`FUNCTIONS`."""

    def __init__(self, scope: Scope | None) -> None:
        """The environment of a step in ``scope``; with none, of the input alone (a
        workflow's ``subject``, known before the run is)."""
        variables: dict[str, object] = {"input": cel.Type.DYN}
        if scope is not None:
            variables["run.id"] = cel.Type.STRING
            variables["run.admitted_at"] = cel.Type.TIMESTAMP
            variables["run.deadline_at"] = cel.Type.TIMESTAMP
            variables.update({f"steps.{s}": cel.Type.DYN for s in scope.steps})
            variables.update({f"completed.{s}": cel.Type.TIMESTAMP for s in scope.completed})
        self._env = cel.NewEnv(variables=variables, functions=list(FUNCTIONS))

    def compile(self, source: str, expect: Iterable[str] = ()) -> Compiled:
        """Compile ``source``; ``expect`` lists the static types accepted besides DYN."""
        if not source.strip():
            raise CompileError([Problem("syntax", "the expression is empty", 1, 1)])
        try:
            program = self._env.compile(source)
        except RuntimeError as exc:
            raise CompileError(_problems(str(exc))) from None
        kind = program.return_type().name()
        allowed = set(expect)
        if allowed and kind != "DYN" and kind not in allowed:
            wanted = " or ".join(type_name(k) for k in sorted(allowed))
            raise CompileError(
                [Problem("type", f"the expression gives {type_name(kind)}, not {wanted}", 1, 1)]
            )
        return Compiled(source, program, kind)


def type_name(kind: str) -> str:
    """A CEL static type as a message reads it: 'an int', 'a timestamp', 'a list'."""
    word = kind.split("<", maxsplit=1)[0].lower()
    return ("an " if word[0] in "aeiou" else "a ") + word


def _problems(text: str) -> list[Problem]:
    problems = []
    for line, column, message in _ERROR.findall(text):
        undeclared = _UNDECLARED.search(message)
        if undeclared:
            problems.append(
                Problem("undeclared", message, int(line), int(column), undeclared.group(1))
            )
        elif message.startswith("Syntax error"):
            problems.append(Problem("syntax", message, int(line), int(column)))
        else:
            problems.append(Problem("type", message, int(line), int(column)))
    return problems or [Problem("syntax", _strip_status(text), 1, 1)]


def _strip_status(text: str) -> str:
    return re.sub(r"^[A-Z_]+: |\s*\[[A-Z_]+\]$", "", text.strip())


# --- templates --------------------------------------------------------------------------


@dataclass(frozen=True)
class Literal:
    value: JSON


@dataclass(frozen=True)
class Expr:
    """A string that is exactly ``${{ expr }}``: the value keeps the expression's type."""

    source: str
    offset: int  # where the expression's text starts within the string


@dataclass(frozen=True)
class Interpolation:
    """``${{ }}`` inside longer text: each expression's value is written into the text."""

    parts: tuple[str | Expr, ...]


@dataclass(frozen=True)
class MapTemplate:
    items: tuple[tuple[str, Template], ...]


@dataclass(frozen=True)
class ListTemplate:
    items: tuple[Template, ...]


Template = Literal | Expr | Interpolation | MapTemplate | ListTemplate


def parse_template(value: JSON, path: tuple[str | int, ...] = ()) -> Template:
    """Split a call input or finish output into literals and expressions.

    Raises :class:`TemplateError` for an unclosed, nested or empty ``${{``.
    """
    if isinstance(value, dict):
        return MapTemplate(tuple((k, parse_template(v, (*path, k))) for k, v in value.items()))
    if isinstance(value, list):
        return ListTemplate(tuple(parse_template(v, (*path, i)) for i, v in enumerate(value)))
    if not isinstance(value, str) or "${{" not in value:
        return Literal(value)

    def refuse(message: str, index: int) -> TemplateError:
        return TemplateError(Problem("template", message, 1, index + 1), value, path)

    parts: list[str | Expr] = []
    cursor = 0
    for match in _TEMPLATE.finditer(value):
        parts.append(value[cursor : match.start()])
        inner = match.group(1)
        if "${{" in inner:
            raise refuse("a ${{ is not closed by }}", match.start())
        if not inner.strip():
            raise refuse("a ${{ }} holds no expression", match.start())
        parts.append(Expr(inner, match.start(1)))
        cursor = match.end()
    rest = value[cursor:]
    if "${{" in rest:
        raise refuse("a ${{ is not closed by }}", cursor + rest.index("${{"))
    parts.append(rest)
    texts = [p for p in parts if p != ""]
    if len(texts) == 1 and isinstance(texts[0], Expr):
        return texts[0]
    return Interpolation(tuple(texts))


def template_expressions(
    template: Template, path: tuple[str | int, ...] = ()
) -> Iterable[tuple[tuple[str | int, ...], Expr]]:
    """Every expression of a template with the data path of the string holding it."""
    if isinstance(template, Expr):
        yield path, template
    elif isinstance(template, Interpolation):
        for part in template.parts:
            if isinstance(part, Expr):
                yield path, part
    elif isinstance(template, MapTemplate):
        for key, item in template.items:
            yield from template_expressions(item, (*path, key))
    elif isinstance(template, ListTemplate):
        for index, item in enumerate(template.items):
            yield from template_expressions(item, (*path, index))


def render(template: Template, compiled: Mapping[str, Compiled], variables: Activation) -> JSON:
    """Evaluate a template to JSON; ``compiled`` maps expression source to its program."""
    if isinstance(template, Literal):
        return template.value
    if isinstance(template, Expr):
        return to_json(compiled[template.source].evaluate(variables))
    if isinstance(template, Interpolation):
        return "".join(
            part if isinstance(part, str) else to_text(compiled[part.source].evaluate(variables))
            for part in template.parts
        )
    if isinstance(template, MapTemplate):
        return {key: render(item, compiled, variables) for key, item in template.items}
    return [render(item, compiled, variables) for item in template.items]


def to_json(value: object) -> JSON:
    """A CEL result as JSON: timestamps as RFC 3339 (UTC), durations as seconds text."""
    if isinstance(value, datetime):
        return format_instant(value)
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, dict):
        return {_json_key(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, bytes):
        raise EvaluationError("an expression gave bytes, which have no JSON form")
    if isinstance(value, float) and not math.isfinite(value):
        raise EvaluationError("an expression gave a number that is not finite")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise EvaluationError(f"an expression gave a {type(value).__name__}, which has no JSON form")


def _json_key(key: object) -> str:
    if isinstance(key, str):
        return key
    raise EvaluationError(f"an expression gave a map key {key!r} that is not a string")


def to_text(value: object) -> str:
    converted = to_json(value)
    if isinstance(converted, str):
        return converted
    return json.dumps(converted, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def format_instant(value: datetime) -> str:
    """RFC 3339 in UTC with a Z; a fraction of a second only when present, without trailing
    zeros."""
    value = value.astimezone(UTC)
    # Not strftime: its %Y does not pad years before 1000 to the four digits RFC 3339 needs.
    text = value.replace(tzinfo=None, microsecond=0).isoformat()
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text + "Z"


def parse_instant(text: str) -> datetime:
    """An RFC 3339 timestamp with an explicit offset; refuses local times."""
    if not re.match(
        r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$", text
    ):
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp with an offset")
    value = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    return value.astimezone(UTC)


def holds_nul(value: JSON) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in k or holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(holds_nul(v) for v in value)
    return False


def variables(
    *,
    input: JSON,
    outputs: Mapping[str, JSON],
    completed: Mapping[str, datetime],
    run_id: str,
    admitted_at: datetime,
    deadline_at: datetime,
) -> dict[str, object]:
    """The activation a run's expressions evaluate against: only its recorded data.

    cel-cpp cuts strings at a NUL character, so data holding one is refused here
    rather than silently read short.
    """
    for name, value in (("input", input), *outputs.items()):
        if holds_nul(value):
            raise EvaluationError(f"{name} holds a NUL character, which expressions cannot read")
    data: dict[str, object] = {
        "input": input,
        "run.id": run_id,
        "run.admitted_at": admitted_at,
        "run.deadline_at": deadline_at,
    }
    data.update({f"steps.{k}": v for k, v in outputs.items()})
    data.update({f"completed.{k}": v for k, v in completed.items()})
    return data


def variables_of_input(run_input: JSON) -> dict[str, object]:
    """The activation of an expression over the input alone (a workflow's subject), the
    input refused as :func:`variables` refuses it."""
    if holds_nul(run_input):
        raise EvaluationError("input holds a NUL character, which expressions cannot read")
    return {"input": run_input}
