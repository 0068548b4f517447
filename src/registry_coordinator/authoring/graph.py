"""Facts about a workflow's step graph: reachability, cycles, data flow, paths.

The graph is small (at most 64 steps) but its paths can be many, so everything
here works on the graph in topological order rather than enumerating paths,
except where paths are listed for a human, which is capped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from registry_coordinator.authoring.expressions import Scope
from registry_coordinator.authoring.workflow import (
    PRODUCES_DATA,
    Call,
    Step,
    WaitFor,
    WaitUntil,
    Workflow,
)

MAX_LISTED_PATHS = 50


def reachable(workflow: Workflow) -> list[str]:
    """Steps reachable from start, in the order a depth-first walk meets them."""
    seen: list[str] = []
    stack = [workflow.start]
    while stack:
        step_id = stack.pop()
        if step_id in seen or step_id not in workflow.steps:
            continue
        seen.append(step_id)
        stack.extend(reversed([e.target for e in workflow.steps[step_id].edges()]))
    return seen


def find_cycle(workflow: Workflow) -> list[str] | None:
    """A loop in the step graph as the list of its steps (first repeated last), if any."""
    state: dict[str, int] = {}  # 1 on the current walk, 2 finished
    for root in [workflow.start, *workflow.steps]:
        if root in state:
            continue
        trail: list[str] = []
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            node, index = stack.pop()
            edges = workflow.steps[node].edges()
            if index == 0:
                state[node] = 1
                trail.append(node)
            if index < len(edges):
                stack.append((node, index + 1))
                target = edges[index].target
                if state.get(target) == 1:
                    return [*trail[trail.index(target) :], target]
                if target not in state:
                    stack.append((target, 0))
            else:
                state[node] = 2
                trail.pop()
    return None


def topological(workflow: Workflow) -> list[str]:
    """Reachable steps ordered so every edge goes forward (the graph must be acyclic)."""
    order: list[str] = []
    done: set[str] = set()
    stack = [(workflow.start, iter(workflow.steps[workflow.start].edges()))]
    while stack:
        node, edges = stack[-1]
        for edge in edges:
            if edge.target not in done:
                stack.append((edge.target, iter(workflow.steps[edge.target].edges())))
                break
        else:
            stack.pop()
            if node not in done:
                done.add(node)
                order.append(node)
    order.reverse()
    return order


def scopes(workflow: Workflow) -> dict[str, Scope]:
    """For each reachable step, the steps whose data is available on every path to it.

    Data flows along edges: a call or wait-for produces its output along its ``next``
    edge only, so a step reached through a wait's ``on-timeout`` cannot read it.
    """
    order = topological(workflow)
    data_in: dict[str, frozenset[str]] = {}
    done_in: dict[str, frozenset[str]] = {}
    for step_id in order:
        data_in.setdefault(step_id, frozenset())
        done_in.setdefault(step_id, frozenset())
        step = workflow.steps[step_id]
        for edge in step.edges():
            produced = isinstance(step, PRODUCES_DATA) and edge.carries_output
            data_out = data_in[step_id] | ({step_id} if produced else set())
            done_out = done_in[step_id] | {step_id}
            target = edge.target
            data_in[target] = data_in[target] & data_out if target in data_in else data_out
            done_in[target] = done_in[target] & done_out if target in done_in else done_out
    return {s: Scope(data_in[s], done_in[s]) for s in order}


@dataclass(frozen=True)
class Facts:
    """What ``check --explain`` reports about a workflow's paths."""

    path_count: int
    paths: list[list[str]]  # listed when there are at most MAX_LISTED_PATHS
    max_calls: int
    max_mutations: int
    mutations_per_path: list[int]
    longest_bounded_wait: timedelta
    open_ended_wait: bool  # some path waits on a wait-until or a wait-for without timeout
    deadline: timedelta


def facts(workflow: Workflow, is_mutation: Callable[[Call], bool]) -> Facts:
    order = topological(workflow)
    steps = workflow.steps

    def longest(weight: Callable[[Step], int]) -> int:
        best: dict[str, int] = {}
        for step_id in reversed(order):
            tail = max((best[e.target] for e in steps[step_id].edges()), default=0)
            best[step_id] = weight(steps[step_id]) + tail
        return best[workflow.start]

    counts: dict[str, int] = {}
    for step_id in reversed(order):
        edges = steps[step_id].edges()
        counts[step_id] = sum(counts[e.target] for e in edges) if edges else 1
    path_count = counts[workflow.start]

    def wait_seconds(step: Step) -> int:
        if isinstance(step, WaitFor) and step.timeout is not None:
            return int(step.timeout.total_seconds())
        return 0

    paths: list[list[str]] = []
    if path_count <= MAX_LISTED_PATHS:
        stack = [[workflow.start]]
        while stack:
            path = stack.pop()
            edges = steps[path[-1]].edges()
            if not edges:
                paths.append(path)
            stack.extend([*path, e.target] for e in reversed(edges))

    def open_ended(step: Step) -> bool:
        return isinstance(step, WaitUntil) or (isinstance(step, WaitFor) and not step.timeout)

    def mutates(step: Step) -> bool:
        return isinstance(step, Call) and is_mutation(step)

    return Facts(
        path_count=path_count,
        paths=paths,
        max_calls=longest(lambda s: isinstance(s, Call)),
        max_mutations=longest(mutates),
        mutations_per_path=[sum(mutates(steps[s]) for s in p) for p in paths],
        longest_bounded_wait=timedelta(seconds=longest(wait_seconds)),
        open_ended_wait=any(open_ended(steps[s]) for s in order),
        deadline=workflow.deadline,
    )
