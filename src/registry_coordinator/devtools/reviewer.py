"""A staff member at the stand-in Casework: the review decisions of the demo and tests.

Coordinator never decides a review; a person does, through Casework's review tasks. This
is that person, as Casework's staff routes take them: the review's task found in the
staff member's list, claimed at its revision (``If-Match``), and decided at the next
revision, each request under its own idempotency key, with the staff token and the
staff profile.
"""

from __future__ import annotations

import uuid

import httpx

from registry_coordinator.errors import CoordinatorError, ExitCode

#: What a staff member may decide, and the decision's type on the wire.
DECISIONS = {
    "approve": "approve",
    "reject": "reject",
    "changes-requested": "changes-requested",
    "answer": "answer",
}
STAFF_PROFILE = "reviewer"


class ReviewRefused(CoordinatorError):
    """The stand-in Casework refused the decision (or could not be reached: exit 3)."""


class CaseworkUnavailable(ReviewRefused):
    exit_code = ExitCode.UNAVAILABLE


def decide(
    casework: str, request_id: str, decision: str, token: str, outcome: str | None = None
) -> None:
    """Claim the task of review ``request_id`` at ``casework`` and decide it."""
    if decision != "approve" and outcome is None:
        raise ReviewRefused(f"a decision to {decision} names its outcome: give --outcome ID")
    headers = {"Authorization": f"Bearer {token}", "Registry-Casework-Profile": STAFF_PROFILE}
    try:
        with httpx.Client(base_url=casework, headers=headers, timeout=10) as staff:
            tasks = staff.get("/v1/review-tasks")
            _ok(tasks, "listing the review tasks")
            task = next((t for t in tasks.json()["items"] if t["requestId"] == request_id), None)
            if task is None:
                raise ReviewRefused(f"no open review task for request {request_id}")
            claim = staff.post(
                f"/v1/review-tasks/{task['taskId']}/claim",
                headers=_fenced(task["revision"]),
            )
            _ok(claim, "claiming the task")
            body: dict[str, object] = {"type": DECISIONS[decision]}
            if outcome is not None:
                body["outcome"] = outcome
            decided = staff.post(
                f"/v1/review-tasks/{task['taskId']}/decisions",
                json={"decision": body},
                headers=_fenced(claim.json()["revision"]),
            )
            _ok(decided, "deciding it")
    except httpx.HTTPError as exc:
        raise CaseworkUnavailable(f"{casework} is unavailable: {exc}") from None


def _fenced(revision: int) -> dict[str, str]:
    return {"If-Match": f'"{revision}"', "Idempotency-Key": str(uuid.uuid4())}


def _ok(response: httpx.Response, doing: str) -> None:
    if response.status_code >= 300:
        raise ReviewRefused(f"Casework refused {doing} ({response.status_code}): {response.text}")
