"""The documentation names every code the product can emit."""

from __future__ import annotations

from registry_coordinator.authoring.diagnostics import CODES
from registry_coordinator.http.problems import CODES as PROBLEMS
from registry_coordinator.semantics.codes import FailureCode, HoldCode
from tests.harness import ROOT


def test_every_diagnostic_failure_and_hold_code_is_documented() -> None:
    text = (ROOT / "docs" / "diagnostics.md").read_text()
    codes = [*CODES, *PROBLEMS, *(c.value for c in FailureCode), *(c.value for c in HoldCode)]
    for code in codes:
        assert f"| `{code}` |" in text, f"docs/diagnostics.md does not list {code}"
