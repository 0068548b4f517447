"""The documentation names every code the product can emit."""

from __future__ import annotations

from registry_coordinator.authoring.diagnostics import CODES
from registry_coordinator.custody import CustodyCode
from registry_coordinator.http.console.wording import EVENTS
from registry_coordinator.http.problems import CODES as PROBLEMS
from registry_coordinator.semantics.codes import FailureCode, HoldCode
from tests.support import ROOT


def test_every_diagnostic_failure_and_hold_code_is_documented() -> None:
    text = (ROOT / "docs" / "diagnostics.md").read_text()
    codes = [
        *CODES,
        *PROBLEMS,
        *(c.value for c in FailureCode),
        *(c.value for c in HoldCode),
        *(c.value for c in CustodyCode),
    ]
    for code in codes:
        assert f"| `{code}` |" in text, f"docs/diagnostics.md does not list {code}"


def test_every_history_event_kind_is_documented() -> None:
    """Operators read histories: each event kind the console has words for is in the
    operations guide's table, and the table names no kind the service does not write."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## What a run's history records", 1)[1].split("\n## ", 1)[0]
    listed = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
    assert listed == set(EVENTS)
