"""``coordinator graph``: a workflow drawn as Mermaid or Graphviz DOT text.

The console draws the same DOT (with Graphviz in the browser), marking steps with a class
of its closed list :data:`MARKS` for its stylesheet to colour: a run's path and where it is.
"""

from __future__ import annotations

from collections.abc import Mapping

from registry_coordinator.authoring.durations import format_duration
from registry_coordinator.authoring.workflow import (
    Call,
    Choose,
    Finish,
    Step,
    WaitFor,
    WaitUntil,
    Workflow,
)


def _label(step: Step) -> str:
    if isinstance(step, Call):
        return f"{step.id}\ncall {step.connection}.{step.operation}"
    if isinstance(step, Choose):
        return f"{step.id}\nchoose"
    if isinstance(step, WaitUntil):
        return f"{step.id}\nwait until {step.at}"
    if isinstance(step, WaitFor):
        timeout = f" (timeout {format_duration(step.timeout)})" if step.timeout else ""
        return f"{step.id}\nwait for {step.result}{timeout}"
    return f"{step.id}\nfinish {step.outcome}"


def _edge_label(step: Step, label: str) -> str:
    if isinstance(step, Choose) and label.startswith("case "):
        return step.cases[int(label.split()[1]) - 1].when
    return "" if label == "next" else label


def mermaid(workflow: Workflow) -> str:
    def text(value: str) -> str:
        return '"' + value.replace('"', "#quot;").replace("\n", "<br/>") + '"'

    shapes = {
        Call: "[{}]",
        Choose: "{{{}}}",
        WaitUntil: "([{}])",
        WaitFor: "([{}])",
        Finish: "(({}))",
    }
    lines = ["flowchart TD", f"  {MERMAID_ENTRY}(( )) --> {_node(workflow.start)}"]
    for step in workflow.steps.values():
        lines.append(f"  {_node(step.id)}{shapes[type(step)].format(text(_label(step)))}")
    for step in workflow.steps.values():
        for edge in step.edges():
            label = _edge_label(step, edge.label)
            arrow = "-.->" if not edge.carries_output else "-->"
            middle = f"|{text(label)}|" if label else ""
            lines.append(f"  {_node(step.id)} {arrow}{middle} {_node(edge.target)}")
    return "\n".join(lines) + "\n"


#: The entry point's node in Mermaid. Steps' nodes are ``step_ID``, so no step can be it,
#: and none is a word Mermaid keeps for itself (``end`` closes a subgraph).
MERMAID_ENTRY = "entry"


def _node(step: str) -> str:
    return f"step_{step}"


#: The entry point's node in DOT: no step id can be it (step ids begin with a letter), and
#: ids are quoted, so a step may be named ``start``, ``node`` or ``graph``.
START = "__start"
#: The classes a drawing may give a step: ``taken`` on the path a run took, ``current``
#: where it is (or ended).
MARKS = frozenset({"taken", "current"})


def dot(workflow: Workflow, marks: Mapping[str, str] | None = None) -> str:
    """The workflow in DOT, each step's node with the id ``step-ID`` and its mark's class."""
    marks = marks or {}
    assert set(marks.values()) <= MARKS, marks

    def text(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    shapes = {
        Call: "box",
        Choose: "diamond",
        WaitUntil: "ellipse",
        WaitFor: "ellipse",
        Finish: "doublecircle",
    }
    lines = [
        f"digraph {text(workflow.id)} {{",
        "  rankdir=TB;",
        f"  {START} [shape=point];",
        f"  {START} -> {text(workflow.start)};",
    ]
    for step in workflow.steps.values():
        mark = f", class={text(marks[step.id])}" if step.id in marks else ""
        lines.append(
            f"  {text(step.id)} [shape={shapes[type(step)]}, label={text(_label(step))}, "
            f"id={text('step-' + step.id)}{mark}];"
        )
    for step in workflow.steps.values():
        for edge in step.edges():
            attrs = []
            label = _edge_label(step, edge.label)
            if label:
                attrs.append(f"label={text(label)}")
            if not edge.carries_output:
                attrs.append("style=dashed")
            suffix = f" [{', '.join(attrs)}]" if attrs else ""
            lines.append(f"  {text(step.id)} -> {text(edge.target)}{suffix};")
    lines.append("}")
    return "\n".join(lines) + "\n"
