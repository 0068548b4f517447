"""Workflow documents read in this process: checked against the built-in catalog, their
digest, their steps' graph (its edges, what is reachable from a step), and the tutorial's
workflow with its digest, and that workflow checked with a top-level field added."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from registry_coordinator.authoring.artifact import build, check_source
from registry_coordinator.authoring.canonical import digest_of
from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.authoring.checker import CheckReport, check_document
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.source import SourceMap, load_yaml
from tests.support.paths import WORKFLOWS

JSON = Any


def edges(document: JSON) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for step_id, step in document["steps"].items():
        targets = [step.get("next"), step.get("otherwise"), step.get("on-timeout")]
        targets += [case["next"] for case in step.get("cases", [])]
        out[step_id] = [t for t in targets if t]
    return out


def reachable(graph: dict[str, list[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


def check(document: JSON) -> CheckReport:
    return check_document(document, SourceMap("generated.yaml"), builtin_catalog())


def digest_of_yaml(text: str) -> str | None:
    document, source = load_yaml(text.encode(), "workflow.yaml")
    report = check_document(document, source, builtin_catalog())
    return digest_of(build(report.definition)) if report.definition else None


#: The tutorial's workflow (workflows/review-application), as its YAML, and its digest.
TUTORIAL = (WORKFLOWS / "review-application" / "workflow.yaml").read_text()


TUTORIAL_DIGEST = digest_of_yaml(TUTORIAL)


def tutorial_with(
    tmp_path: Path, value: str, field: str = "subject: {}"
) -> tuple[Definition | None, list[tuple[str, str]]]:
    """The tutorial's workflow checked from a file with the top-level ``field`` (``value``
    put in it) added: its definition, and each diagnostic's code and message."""
    path = tmp_path / "workflow.yaml"
    deadline = "deadline: P60D\n"
    path.write_text(TUTORIAL.replace(deadline, f"{deadline}{field.format(value)}\n"))
    report = check_source(path)
    return report.definition, [(d.code, d.message) for d in report.diagnostics]
