"""Every problem one configuration file has, collected stage by stage.

A file is looked at in stages: its structure (:func:`config.read_config`), then the pinned
workflows' artifacts, then the connections they are bound to
(``engine.workflows.load_service``), and, where a start is refused anyway, what the file
points at and cannot be reached now (the listen address, the database: ``reach``), so the
operator meets every problem in one pass rather than one per attempt. Each stage appends
here instead of raising at its first problem, and the problems are reported in the stages'
order, each in the file's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from registry_coordinator.authoring.diagnostics import Diagnostic, Refused, sort_key
from registry_coordinator.authoring.source import DataPath, SourceMap

Stage = Literal["configuration", "workflows", "connections", "reach"]
#: The stages a configuration is looked at in, in the order they are reported.
STAGES: tuple[Stage, ...] = ("configuration", "workflows", "connections", "reach")


class Problems:
    """Every problem one configuration file has, collected by each stage that looks at it
    (rather than raised at the first), each pointing at the field of the file it is about."""

    def __init__(self, source: SourceMap) -> None:
        self.source = source
        self._found: dict[Stage, list[Diagnostic]] = {stage: [] for stage in STAGES}

    def report(self, stage: Stage, code: str, message: str, repair: str, path: DataPath) -> None:
        """A problem with the field at ``path`` of this file (or its nearest ancestor)."""
        position = self.source.at(path)
        self._found[stage].append(Diagnostic(code, message, repair, self.source.file, position))

    def add(self, stage: Stage, diagnostics: Iterable[Diagnostic]) -> None:
        self._found[stage].extend(diagnostics)

    def of(self, stage: Stage) -> list[Diagnostic]:
        """One stage's problems, in the order of the file."""
        return sorted(self._found[stage], key=sort_key)

    def all(self) -> list[Diagnostic]:
        return [d for stage in STAGES for d in self.of(stage)]

    def __bool__(self) -> bool:
        return any(self._found.values())

    def refuse(self) -> None:
        """Raise :class:`Refused` with every problem, if there is one."""
        if self:
            raise Refused(self.all())
