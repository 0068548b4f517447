"""Exit codes and output of the command line."""

from __future__ import annotations

from pathlib import Path

from .harness import CORPUS, WORKFLOWS, coordinator


def test_usage_errors_exit_2() -> None:
    assert coordinator().returncode == 2
    assert coordinator("frobnicate").returncode == 2
    assert coordinator("check").returncode == 2
    assert coordinator("graph", WORKFLOWS / "review-application", "--format", "png").returncode == 2
    assert coordinator("package", WORKFLOWS / "review-application").returncode == 2


def test_ok_exits_0_and_refused_exits_1() -> None:
    assert coordinator("check", WORKFLOWS / "review-application").returncode == 0
    assert coordinator("check", CORPUS / "invalid" / "workflow-cycle.yaml").returncode == 1
    mixed = coordinator(
        "check", WORKFLOWS / "review-application", CORPUS / "invalid" / "workflow-cycle.yaml"
    )
    assert mixed.returncode == 1
    assert mixed.stdout.startswith("ok ")


def test_graph_mermaid() -> None:
    result = coordinator("graph", WORKFLOWS / "review-application")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "flowchart TD"
    assert "  start(( )) --> read_application" in lines
    assert '  route -->|"steps.await_decision.decision == #quot;approved#quot;"| notify' in lines
    assert '  await_decision -.->|"on-timeout"| not_decided' in lines


def test_demo_outside_the_project_says_where_the_workflows_are(tmp_path: Path) -> None:
    elsewhere = coordinator("demo", "--data", tmp_path / "data", cwd=tmp_path)
    assert elsewhere.returncode == 2
    assert "not found" in elsewhere.stderr
