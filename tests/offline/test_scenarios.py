"""``coordinator test``: failing expectations and malformed scenario files are reported."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.harness import WORKFLOWS, coordinator


def workflow_with(tmp_path: Path, scenarios: str) -> Path:
    target = tmp_path / "wf"
    target.mkdir()
    shutil.copy(WORKFLOWS / "review-application" / "workflow.yaml", target / "workflow.yaml")
    (target / "scenarios.yaml").write_text(scenarios)
    return target


REJECTED = """\
scenarios:
  - name: rejected
    input: {applicationId: app-1}
    replies:
      read_application:
        success:
          data: {recordIdentifier: a, revisionIdentifier: r, domainData: {email: a@example.org}}
          meta: {}
      request_review: {success: {requestId: rv, status: open}}
    results:
      await_decision: [{after: PT1H, payload: {requestId: rv, decision: rejected}}]
    expect:
"""


def test_a_wrong_expectation_fails_with_the_difference(tmp_path: Path) -> None:
    path = workflow_with(
        tmp_path, REJECTED + "      outcome: approved-and-notified\n      elapsed: PT2H\n"
    )
    result = coordinator("test", path)
    assert result.returncode == 1
    assert "FAIL rejected" in result.stdout
    assert 'outcome: expected "approved-and-notified", got "rejected"' in result.stdout
    assert "elapsed: expected PT2H, got PT1H" in result.stdout
    assert "0 of 1 scenarios passed" in result.stdout


def test_a_right_expectation_passes(tmp_path: Path) -> None:
    path = workflow_with(tmp_path, REJECTED + "      outcome: rejected\n      elapsed: PT1H\n")
    result = coordinator("test", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_scenarios_naming_what_the_workflow_lacks_are_refused(tmp_path: Path) -> None:
    bad = (
        REJECTED.replace("request_review: {success", "request_reveiw: {success").replace(
            "await_decision: [", "route: ["
        )
        + "      state: done\n"
    )
    result = coordinator("test", workflow_with(tmp_path, bad))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error[" in line]
    assert len(errors) == 3, result.stderr
    assert all("[scenario.invalid]" in line for line in errors)
    assert ":9:7:" in errors[0]  # request_reveiw
    assert ":11:7:" in errors[1]  # route is not a wait-for
    assert "Traceback" not in result.stderr


def test_a_call_without_a_scripted_reply_is_refused(tmp_path: Path) -> None:
    missing = REJECTED.replace(
        "      request_review: {success: {requestId: rv, status: open}}\n", ""
    )
    result = coordinator("test", workflow_with(tmp_path, missing + "      state: finished\n"))
    assert result.returncode == 1
    assert "scripts no reply for it" in result.stderr


def test_input_must_fit_the_workflow(tmp_path: Path) -> None:
    wrong = REJECTED.replace("{applicationId: app-1}", "{applicant: 1}") + "      state: failed\n"
    result = coordinator("test", workflow_with(tmp_path, wrong))
    assert result.returncode == 1
    assert "input does not fit the workflow's input schema" in result.stderr


def test_missing_scenarios_file(tmp_path: Path) -> None:
    target = tmp_path / "wf"
    target.mkdir()
    shutil.copy(WORKFLOWS / "review-application" / "workflow.yaml", target / "workflow.yaml")
    result = coordinator("test", target)
    assert result.returncode == 1
    assert "file.unreadable" in result.stderr
