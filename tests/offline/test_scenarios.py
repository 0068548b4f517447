"""``coordinator test``: failing expectations and malformed scenario files are reported."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support import WORKFLOWS, coordinator


def workflow_with(tmp_path: Path, scenarios: str) -> Path:
    target = tmp_path / "wf"
    target.mkdir()
    shutil.copy(WORKFLOWS / "review-application" / "workflow.yaml", target / "workflow.yaml")
    (target / "scenarios.yaml").write_text(scenarios)
    return target


APPLICATION = "7d1c2a4e-0b5f-4c3a-9e21-5a6b7c8d9e01"
REVIEW = "2b0e6c1a-3d4f-4a5b-8c6d-7e8f9a0b1c01"
DIGEST = "sha256:" + "0" * 64
#: One line per reply, so that the lines below are where the tests say: read_application
#: on line 5, request_review on line 9, await_decision on line 11.
REJECTED = f"""\
scenarios:
  - name: rejected
    input: {{applicationId: {APPLICATION}}}
    replies:
      read_application:
        success:
          data: {{recordIdentifier: {APPLICATION}, revisionIdentifier: '3', domainData: {{email: a@example.org}}}}
          meta: {{registryIdentifier: r, datasetIdentifier: d, entityTypeIdentifier: application}}
      request_review: {{success: {{requestId: {REVIEW}, subject: {{source: s, type: t, id: i, version: '3', digest: '{DIGEST}'}}, policy: {{id: p, version: '1', digest: '{DIGEST}'}}, submissionDigest: '{DIGEST}'}}}}
    results:
      await_decision: [{{after: PT1H, payload: {{resultId: r-1, requestId: {REVIEW}, subject: {{}}, policy: {{}}, submissionDigest: '{DIGEST}', status: rejected, completedAt: '2026-01-05T10:00:00Z', availableUntil: '2026-04-05T10:00:00Z'}}}}]
    expect:
"""  # noqa: E501


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
    lines = REJECTED.splitlines(keepends=True)
    assert lines[8].startswith("      request_review: {success: ")
    missing = "".join(lines[:8] + lines[9:])
    result = coordinator("test", workflow_with(tmp_path, missing + "      state: finished\n"))
    assert result.returncode == 1
    assert "scripts no reply for it" in result.stderr


def test_input_must_fit_the_workflow(tmp_path: Path) -> None:
    wrong = REJECTED.replace(f"{{applicationId: {APPLICATION}}}", "{applicant: 1}")
    assert wrong != REJECTED
    wrong += "      state: failed\n"
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


def test_a_call_retried_past_the_runners_bound_is_refused_with_a_repair(tmp_path: Path) -> None:
    """A product scripted to ask for a retry every second until a deadline weeks away would
    be sent more times than the runner takes on: refused as a scenario mistake, with what
    to write instead, not a traceback."""
    read = REJECTED.index("      read_application:")
    retried = (
        REJECTED[:read]
        + "      read_application: {retryable: {status: 503, retryAfter: PT1S}}\n"
        + REJECTED[REJECTED.index("      request_review:") :]
    )
    result = coordinator("test", workflow_with(tmp_path, retried + "      state: expired\n"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "scenario.invalid" in result.stderr + result.stdout
    assert "read_application" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
