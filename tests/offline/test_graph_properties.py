"""Property tests of the workflow graph's rules: data flow, and what a digest must notice.

The checker's data-flow rule (``steps.X`` and ``completed.X`` are readable only where X
has run on every path, ``steps.X`` only along X's ``next``) is compared with an oracle
written here another way: X's data is available at a step when removing X's edges that
carry it (all its edges, for ``completed``) leaves that step unreachable. The digest
must change under changes of structure, not only of leaf values: cases reordered (the
first true case wins), a step renamed, an edge moved, a step inserted.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tests.support import TUTORIAL, TUTORIAL_DIGEST, check, dags, digest_of_yaml, edges, reachable

JSON = Any
#: What a generated workflow may be refused for besides data flow: the generator leaves
#: steps unreachable, and connections unused, by chance.
INCIDENTAL = {"workflow.unreachable-step", "connection.unused"}
PRODUCES_DATA = ("call", "wait-for")


def available(document: JSON, root: str, target: str, reader: str) -> bool:
    """Whether ``root.target`` is readable at ``reader``: no path from the start reaches
    ``reader`` without leaving ``target`` by an edge that carries what ``root`` reads (for
    ``steps``, a call's or wait-for's ``next``; for ``completed``, any edge)."""
    if target == reader:
        return False
    graph = edges(document)
    step = document["steps"][target]
    kept = [step["on-timeout"]] if root == "steps" and "on-timeout" in step else []
    graph[target] = kept
    return reader not in reachable(graph, "s0")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(dags(), st.data())
def test_steps_and_completed_are_readable_exactly_where_every_path_brings_them(
    document: JSON, data: st.DataObject
) -> None:
    live = reachable(edges(document), "s0")
    readers = sorted(s for s in live if document["steps"][s]["type"] == "choose")
    assume(readers)
    reader = data.draw(st.sampled_from(readers))
    target = data.draw(st.sampled_from(sorted(document["steps"])))
    root = data.draw(st.sampled_from(["steps", "completed"]))
    cases = document["steps"][reader]["cases"]
    cases.insert(0, {"when": f"{root}.{target} != null", "next": cases[0]["next"]})
    if root == "steps" and document["steps"][target]["type"] not in PRODUCES_DATA:
        expected = {"dataflow.no-output"}
    elif available(document, root, target, reader):
        expected = set()
    else:
        expected = {"dataflow.not-dominating"}
    event(f"expected {sorted(expected) or 'readable'}")
    report = check(document)
    codes = {d.code for d in report.diagnostics} - INCIDENTAL
    assert codes == expected, (root, target, reader, [d.message for d in report.diagnostics])


def tutorial() -> JSON:
    return yaml.safe_load(TUTORIAL)


def step_edges(document: JSON) -> list[tuple[str, str, int | None]]:
    """Every edge of every step: (step id, field, case index for a case's next)."""
    found: list[tuple[str, str, int | None]] = []
    for step_id, step in document["steps"].items():
        found += [(step_id, f, None) for f in ("next", "otherwise", "on-timeout") if f in step]
        found += [(step_id, "cases", i) for i in range(len(step.get("cases", [])))]
    return found


def renamed(value: JSON, old: str, new: str) -> JSON:
    """``value`` with the step id ``old`` called ``new`` wherever it is named: as a key
    of steps, as an edge's target, as ``start``, and inside expressions."""
    if isinstance(value, dict):
        return {(new if k == old else k): renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, old, new) for v in value]
    if isinstance(value, str):
        return new if value == old else value.replace(f"steps.{old}.", f"steps.{new}.")
    return value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.data())
def test_any_change_of_structure_changes_the_digest(data: st.DataObject) -> None:
    document = tutorial()
    steps = document["steps"]
    change = data.draw(st.sampled_from(["swap-cases", "rename", "retarget", "insert"]))
    if change == "swap-cases":
        steps["route"]["cases"].reverse()
    elif change == "rename":
        old = data.draw(st.sampled_from(sorted(steps)))
        document = renamed(document, old, old + "_2")
    elif change == "retarget":
        step_id, field, index = data.draw(st.sampled_from(step_edges(document)))
        holder = steps[step_id]["cases"][index] if index is not None else steps[step_id]
        key = "next" if index is not None else field
        others = sorted(s for s in steps if s not in (holder[key], step_id))
        holder[key] = data.draw(st.sampled_from(others))
    else:
        step_id, field, index = data.draw(st.sampled_from(step_edges(document)))
        holder = steps[step_id]["cases"][index] if index is not None else steps[step_id]
        key = "next" if index is not None else field
        steps["inserted"] = {
            "type": "choose",
            "cases": [{"when": "input.applicationId == 'x'", "next": holder[key]}],
            "otherwise": holder[key],
        }
        holder[key] = "inserted"
    digest = digest_of_yaml(yaml.dump(copy.deepcopy(document)))
    assume(digest is not None)  # the change left the workflow valid
    event(change)
    assert digest != TUTORIAL_DIGEST, change
