"""The shipped workflows check, and every scenario of theirs passes, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support import WORKFLOWS, coordinator

SHIPPED = sorted(p for p in WORKFLOWS.iterdir() if (p / "workflow.yaml").is_file())


def test_the_shipped_workflows_each_wait_and_between_them_use_every_step_type() -> None:
    """Read as data, not by substring: every shipped workflow waits (that is what the
    service is for), wait-until and wait-for both appear, and so does every step type."""
    types = {
        p.name: {
            step["type"]
            for step in yaml.safe_load((p / "workflow.yaml").read_text())["steps"].values()
        }
        for p in SHIPPED
    }
    assert sorted(types) == ["book-appointment", "follow-up-notice", "review-application"]
    waits = {name: sorted(found & {"wait-until", "wait-for"}) for name, found in types.items()}
    assert waits == {
        "book-appointment": ["wait-until"],
        "follow-up-notice": ["wait-for", "wait-until"],
        "review-application": ["wait-for"],
    }
    assert set().union(*types.values()) == {"call", "choose", "wait-until", "wait-for", "finish"}


def test_all_workflows_check() -> None:
    result = coordinator("check", *(p / "workflow.yaml" for p in SHIPPED), "--format", "json")
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stderr
    assert report["ok"] is True
    assert all(w["digest"].startswith("sha256:") for w in report["workflows"])
    assert not [d for w in report["workflows"] for d in w["diagnostics"]]


@pytest.mark.parametrize("workflow", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_scenario_passes(workflow: Path) -> None:
    result = coordinator("test", workflow, "--format", "json")
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout
    assert report["ok"] is True
    assert len(report["scenarios"]) >= 4
    assert {s["state"] for s in report["scenarios"]} >= {"finished"}


def test_tutorial_scenarios_cover_each_ending() -> None:
    result = coordinator("test", WORKFLOWS / "review-application", "--format", "json")
    outcomes = {s["outcome"] for s in json.loads(result.stdout)["scenarios"]}
    assert outcomes >= {
        "approved-and-notified",
        "approved-delivery-unconfirmed",
        "rejected",
        "not-decided",
    }


def test_explain_reports_the_graph_facts() -> None:
    result = coordinator("check", WORKFLOWS / "review-application", "--explain", "--format", "json")
    facts = json.loads(result.stdout)["workflows"][0]["facts"]
    assert facts["pathCount"] == 6  # a delivery read as failed is its own path
    assert facts["maxCalls"] == 3
    assert facts["maxMutations"] == 2
    assert facts["longestBoundedWait"] == "P16D"
    assert sorted(p["mutations"] for p in facts["paths"]) == [1, 1, 1, 2, 2, 2]
    assert facts["deadline"] == "P60D"
    text = coordinator("check", WORKFLOWS / "review-application", "--explain").stdout
    assert "most mutations in one run: 2" in text
    assert "read_application -> request_review -> await_decision -> not_decided" in text
    assert "await_delivery -> delivered -> approved_unconfirmed_as_read" in text
