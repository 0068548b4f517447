"""Workflows made up by Hypothesis, for the property tests of the offline logic and of the
one decision loop: acyclic by construction, every step type, both products' operations."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

JSON = Any

HEAD = {
    "apiVersion": "coordinator.registrystack.org/v1alpha1",
    "kind": "Workflow",
    "id": "generated",
    "version": "1",
    "deadline": "P30D",
    "input": {"type": "object"},
    "connections": {"records": "breg", "notices": "messaging"},
    "outcomes": {"done": {"type": "null"}},
}
MESSAGE = {
    "to": {"email": "a@example.org"},
    "template": {"id": "t", "version": "1"},
    "locale": "en",
    "data": {},
}


@st.composite
def dags(draw: st.DrawFn) -> dict[str, JSON]:
    """A workflow whose edges all go forward, so it is acyclic by construction.

    Steps are s0..sN; each non-finish step's edges target later steps, and the last
    step is a finish. Which steps are reachable is left to chance.
    """
    count = draw(st.integers(min_value=2, max_value=24))
    steps: dict[str, JSON] = {}
    for i in range(count):
        later = [f"s{j}" for j in range(i + 1, count)]
        kind = (
            "finish"
            if not later
            else draw(
                st.sampled_from(["finish", "choose", "wait-until", "wait-for", "read", "send"])
            )
        )
        pick = st.sampled_from(later) if later else st.nothing()
        if kind == "finish":
            steps[f"s{i}"] = {"type": "finish", "outcome": "done"}
        elif kind == "choose":
            cases = draw(st.lists(pick, min_size=1, max_size=3))
            steps[f"s{i}"] = {
                "type": "choose",
                "cases": [{"when": f"input.n == {k}", "next": t} for k, t in enumerate(cases)],
                "otherwise": draw(pick),
            }
        elif kind == "wait-until":
            at = f'run.admitted_at + duration("{i}h")'
            steps[f"s{i}"] = {"type": "wait-until", "at": at, "next": draw(pick)}
        elif kind == "wait-for":
            steps[f"s{i}"] = {
                "type": "wait-for",
                "result": "notices.message-delivered",
                "key": "run.id",
                "timeout": "P1D",
                "on-timeout": draw(pick),
                "next": draw(pick),
            }
        elif kind == "read":
            steps[f"s{i}"] = {
                "type": "call",
                "connection": "records",
                "operation": "read-record",
                "input": {"collection": "people", "recordId": "${{ run.id }}"},
                "next": draw(pick),
            }
        else:
            steps[f"s{i}"] = {
                "type": "call",
                "connection": "notices",
                "operation": "submit-message",
                "input": MESSAGE,
                "next": draw(pick),
            }
    return {**HEAD, "start": "s0", "steps": steps}
