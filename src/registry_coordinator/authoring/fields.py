"""Reading typed fields out of JSON data, reporting every problem with its position.

The workflow format, scenarios and the service configuration are all YAML read
into plain data; this is how each of them checks a field's presence, type and
pattern while collecting diagnostics rather than stopping at the first.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from datetime import timedelta

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.diagnostics import Diagnostic
from registry_coordinator.authoring.durations import DurationError, parse_duration
from registry_coordinator.authoring.source import DataPath, SourceMap


class Reader:
    """Reads fields of a JSON document, collecting diagnostics with positions."""

    def __init__(self, source: SourceMap) -> None:
        self.source = source
        self.diagnostics: list[Diagnostic] = []

    def report(
        self, code: str, message: str, repair: str, path: DataPath, *, key: bool = False
    ) -> None:
        self.diagnostics.append(
            Diagnostic(code, message, repair, self.source.file, self.source.at(path, key=key))
        )

    def mapping(self, value: JSON, path: DataPath, what: str) -> dict[str, JSON] | None:
        if isinstance(value, dict):
            return value
        self.report(
            "field.type",
            f"{what} must be a mapping, not {describe(value)}",
            f"write {what} as 'name: value' lines",
            path,
        )
        return None

    def fields(
        self,
        data: dict[str, JSON],
        path: DataPath,
        what: str,
        required: Iterable[str],
        optional: Iterable[str] = (),
    ) -> bool:
        """Report unknown and missing fields; true when there were none."""
        required, optional = list(required), list(optional)
        allowed = required + optional
        ok = True
        for name in data:
            if name not in allowed:
                ok = False
                close = difflib.get_close_matches(name, allowed, n=1)
                repair = (
                    f"did you mean '{close[0]}'?"
                    if close
                    else f"remove it; {what} allows: {', '.join(allowed)}"
                )
                self.report(
                    "field.unknown",
                    f"{what} has no field '{name}'",
                    repair,
                    (*path, name),
                    key=True,
                )
        for name in required:
            if name not in data:
                ok = False
                self.report(
                    "field.missing",
                    f"{what} needs the field '{name}'",
                    f"add '{name}:' to {what}",
                    path,
                )
        return ok

    def string(self, data: dict[str, JSON], name: str, path: DataPath, what: str) -> str | None:
        value = data.get(name)
        if value is None and name not in data:
            return None
        if isinstance(value, str):
            return value
        hint = f'quote it: {name}: "{value}"' if isinstance(value, int | float) else ""
        self.report(
            "field.type",
            f"{what} field '{name}' must be a string, not {describe(value)}",
            hint or f"give '{name}' a string value",
            (*path, name),
        )
        return None

    def matching(
        self,
        value: str | None,
        pattern: re.Pattern[str],
        code: str,
        what: str,
        path: DataPath,
        *,
        key: bool = False,
        repair: str = "use lower-case letters, digits and the allowed separators, "
        "starting with a letter",
    ) -> str | None:
        if value is None or pattern.match(value):
            return value
        self.report(
            code, f"{what} {value!r} does not match {pattern.pattern}", repair, path, key=key
        )
        return None

    def duration(
        self, data: dict[str, JSON], name: str, path: DataPath, what: str
    ) -> timedelta | None:
        text = self.string(data, name, path, what)
        if text is None:
            return None
        try:
            return parse_duration(text)
        except DurationError as exc:
            self.report(
                "duration.invalid",
                str(exc),
                "write an ISO 8601 duration such as P14D or PT2H",
                (*path, name),
            )
            return None


def describe(value: JSON) -> str:
    """How a JSON value's type reads in a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "a mapping"
