"""The invalid-workflow corpus: one file per refusal, each naming its code and line.

Each file's first line is ``# expect: <code>``; the line the diagnostic must point
at ends with ``# <- here``. The expectation is written in the file, by hand, so
the checker cannot agree with itself by construction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.diagnostics import CODES, Severity
from tests.support import CORPUS, coordinator

FILES = sorted((CORPUS / "invalid").glob("*.yaml"))

#: Codes exercised by generated inputs (tests/offline/test_source.py) or by other tools.
ELSEWHERE = {
    "file.unreadable",
    "yaml.too-large",
    "yaml.encoding",
    "yaml.too-deep",
    "limit.artifact-size",
    "artifact.invalid",
    "artifact.not-canonical",
    "artifact.exists",
    "artifact.unusable",
    "scenario.invalid",
    "scenario.failed",
    "config.invalid-value",
    "config.secret-literal",
    "config.secret-unavailable",
    "config.digest-mismatch",
    "config.connection-unbound",
    "config.connection-kind",
    "config.parameter-missing",  # these five: tests/offline/test_config_problems.py
    "config.parameter-invalid",
    "config.parameter-unknown",
    "config.task-authority-missing",
    "config.task-authority-refused",
    "config.external-unreviewed",  # tests/service/test_external.py
    "config.listen-in-use",  # these two: tests/service/test_five_mistakes.py
    "config.database-unreachable",
}


def expectation(path: Path) -> tuple[str, int | None]:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# expect: "), f"{path.name} must start with '# expect: <code>'"
    code = lines[0].removeprefix("# expect: ").strip()
    marked = [n for n, line in enumerate(lines, 1) if line.endswith("# <- here")]
    assert len(marked) <= 1, f"{path.name} marks more than one line"
    return code, marked[0] if marked else None


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_refusal_points_at_its_line(path: Path) -> None:
    code, line = expectation(path)
    report = check_source(path)
    found = [(d.code, d.line) for d in report.diagnostics]
    assert (code, line) in found, f"expected {code} at line {line}, got {found}"
    diagnostic = next(d for d in report.diagnostics if d.code == code)
    assert diagnostic.message
    assert diagnostic.repair
    if diagnostic.severity is Severity.ERROR:
        assert report.definition is None
    else:
        assert report.definition is not None


def test_every_code_has_a_corpus_file() -> None:
    covered = {expectation(path)[0] for path in FILES}
    missing = set(CODES) - covered - ELSEWHERE
    assert not missing, f"no corpus file for {sorted(missing)}"
    assert len(FILES) >= 30


def test_cli_refuses_with_exit_1_and_no_traceback() -> None:
    result = coordinator("check", *FILES)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    for path in FILES:
        code, line = expectation(path)
        where = f"{path}:{line}:" if line else f"{path}:"
        assert any(
            row.startswith(where) and f"[{code}]" in row for row in result.stderr.splitlines()
        ), f"{path.name}: no '{where} ...[{code}]' line"


def test_json_format_carries_code_position_and_repair() -> None:
    path = CORPUS / "invalid" / "workflow-cycle.yaml"
    result = coordinator("check", path, "--format", "json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    (diagnostic,) = report["workflows"][0]["diagnostics"]
    assert diagnostic == {
        "severity": "error",
        "code": "workflow.cycle",
        "file": str(path),
        "line": 20,
        "column": 15,
        "message": "the steps loop: first -> second -> first; workflows are acyclic",
        "repair": "break the loop: a workflow runs each step at most once; "
        "start a new run to repeat",
    }


def test_a_warning_alone_does_not_refuse() -> None:
    result = coordinator("check", CORPUS / "invalid" / "connection-unused.yaml")
    assert result.returncode == 0
    assert "warning[connection.unused]" in result.stderr
