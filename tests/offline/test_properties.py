"""Property tests of the offline logic: graphs, digests, canonical JSON, expressions."""

from __future__ import annotations

import copy
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from registry_coordinator.authoring.canonical import (
    MAX_NESTING,
    UnusableJson,
    canonical_bytes,
    nesting,
    strict_json,
)
from registry_coordinator.authoring.durations import format_duration, parse_duration
from registry_coordinator.authoring.expressions import (
    Environment,
    EvaluationError,
    Scope,
    variables,
)
from registry_coordinator.semantics.steps import BACKOFF_CAP, backoff
from registry_coordinator.store import wait_due
from tests.support import TUTORIAL, TUTORIAL_DIGEST, check, dags, digest_of_yaml, edges, reachable

JSON = Any


def reachable_from(document: JSON, start: str) -> set[str]:
    return reachable(edges(document), start)


@settings(max_examples=150, deadline=None)
@given(dags())
def test_random_acyclic_graphs_check_or_fail_cleanly(document: JSON) -> None:
    report = check(document)
    unreachable = set(document["steps"]) - reachable_from(document, "s0")
    codes = {d.code for d in report.diagnostics}
    assert codes <= {"workflow.unreachable-step", "connection.unused"}, codes
    reported = {
        d.message.split("'")[1] for d in report.diagnostics if d.code == "workflow.unreachable-step"
    }
    assert reported == unreachable
    assert (report.definition is not None) == (not unreachable)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(dags(), st.randoms(use_true_random=False))
def test_a_back_edge_always_makes_a_cycle(document: JSON, rnd: random.Random) -> None:
    live = reachable_from(document, "s0")
    pairs = [
        (a, b)
        for a in live
        for b in reachable_from(document, a)
        if document["steps"][b]["type"] != "finish"
    ]
    assume(pairs)
    ancestor, step_id = rnd.choice(sorted(pairs))
    step = document["steps"][step_id]
    fields = [f for f in ("next", "otherwise", "on-timeout") if f in step]
    fields += [f"cases.{i}" for i in range(len(step.get("cases", [])))]
    field = rnd.choice(fields)  # any edge: a choose's cases too, not only its otherwise
    if field.startswith("cases."):
        step["cases"][int(field.split(".")[1])]["next"] = ancestor
    else:
        step[field] = ancestor
    report = check(document)
    assert "workflow.cycle" in {d.code for d in report.diagnostics}
    assert report.definition is None


def shuffled(value: JSON, rnd: random.Random) -> JSON:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


@settings(max_examples=60, deadline=None)
@given(
    st.randoms(use_true_random=False),
    st.sampled_from([None, True, False]),
    st.sampled_from([None, '"', "'"]),
    st.integers(min_value=2, max_value=8),
)
def test_key_order_and_yaml_style_never_change_the_digest(
    rnd: random.Random, flow: bool | None, quote: str | None, indent: int
) -> None:
    document = yaml.safe_load(TUTORIAL)
    text = yaml.dump(
        shuffled(document, rnd),
        sort_keys=False,
        default_flow_style=flow,
        default_style=quote,
        indent=indent,
        width=rnd.choice([40, 80, 10_000]),
        allow_unicode=True,
    )
    assert digest_of_yaml(text) == TUTORIAL_DIGEST


def leaves(value: JSON, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in leaves(v, (*path, i))]
    return [path]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.data())
def test_any_semantic_change_changes_the_digest(data: st.DataObject) -> None:
    document = yaml.safe_load(TUTORIAL)
    path = data.draw(st.sampled_from(leaves(document)))
    changed = copy.deepcopy(document)
    holder = changed
    for part in path[:-1]:
        holder = holder[part]
    old = holder[path[-1]]
    if isinstance(old, bool):
        new: JSON = not old
    elif isinstance(old, int):
        new = old + data.draw(st.integers(min_value=1, max_value=5))
    elif isinstance(old, str) and old.startswith("P") and old[-1] == "D":
        new = f"P{int(old[1:-1]) - 1}D"
    elif isinstance(old, str):
        new = old + data.draw(st.sampled_from(["x", " ", "1", "-b"]))
    else:
        new = "changed"
    holder[path[-1]] = new
    digest = digest_of_yaml(yaml.dump(changed))
    assume(digest is not None)  # the change left the workflow valid
    assert digest != TUTORIAL_DIGEST, f"changing {path} from {old!r} to {new!r}"


#: Any character but NUL, which JSON can hold but PostgreSQL's jsonb and cel-cpp cannot.
TEXT = st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"])
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=TEXT),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(alphabet=TEXT, max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values, st.randoms(use_true_random=False))
def test_canonical_json_is_stable(value: JSON, rnd: random.Random) -> None:
    data = canonical_bytes(value)
    assert json.loads(data) == value
    assert canonical_bytes(shuffled(value, rnd)) == data
    assert canonical_bytes(json.loads(data)) == data
    assert b"\n" not in data


def depth(value: JSON) -> int:
    """Nesting, counted the obvious recursive way."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


@given(json_values, st.integers(min_value=0, max_value=5))
def test_nesting_counts_as_deep_as_the_value_goes(value: JSON, wrap: int) -> None:
    for _ in range(wrap):
        value = [value]
    assert nesting(value) == depth(value)


@given(json_values)
def test_json_values_cross_into_cel_and_back_unchanged(value: JSON) -> None:
    env = Environment(Scope(frozenset(), frozenset()))
    program = env.compile("input")
    assert program.evaluate({"input": value}) == value


@given(json_values)
def test_strict_json_reads_back_whatever_canonical_json_writes(value: JSON) -> None:
    assert strict_json(canonical_bytes(value)) == value


@given(
    json_values,
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", '"\\u0000"', '"a\\udc00"']),
    st.integers(min_value=0, max_value=3),
)
def test_strict_json_refuses_what_cannot_be_stored_wherever_it_is(
    value: JSON, poison: str, wrap: int
) -> None:
    """Whatever holds a non-finite number, a NUL or a lone surrogate is refused, and what
    strict_json accepts PostgreSQL's jsonb takes (canonical_bytes has no form for NaN)."""
    text = poison
    for _ in range(wrap):
        text = f'{{"k": {text}}}'
    document = "[" + canonical_bytes(value).decode() + "," + text + "]"
    with pytest.raises(UnusableJson):
        strict_json(document.encode())


@given(st.integers(min_value=0, max_value=MAX_NESTING + 8))
def test_strict_json_takes_nesting_up_to_its_limit(depth_: int) -> None:
    data = b"[" * depth_ + b"0" + b"]" * depth_
    if depth_ <= MAX_NESTING:
        assert nesting(strict_json(data)) == depth_
    else:
        with pytest.raises(UnusableJson) as refused:
            strict_json(data)
        assert refused.value.reason == "too-deep"


def test_nul_characters_are_refused_not_cut_short() -> None:
    env = Environment(Scope(frozenset(), frozenset()))
    program = env.compile("input.name")
    with pytest.raises(EvaluationError, match="NUL"):
        program.evaluate(
            variables(
                input={"name": "a\x00b"},
                outputs={},
                completed={},
                run_id="r",
                admitted_at=datetime.now(UTC),
                deadline_at=datetime.now(UTC),
            )
        )


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=400)))
def test_durations_round_trip(value: timedelta) -> None:
    assert parse_duration(format_duration(value)) == value


@given(st.integers(min_value=1, max_value=10_000), st.floats(min_value=0, max_value=1))
def test_backoff_grows_within_bounds(attempt: int, jitter: float) -> None:
    delay = backoff(attempt, lambda: jitter)
    step = min(BACKOFF_CAP, timedelta(seconds=2 ** min(attempt - 1, 20)))
    assert step / 2 <= delay <= step
    assert delay <= BACKOFF_CAP


@given(
    st.floats(min_value=0, max_value=1),
    st.timedeltas(min_value=timedelta(seconds=1), max_value=timedelta(days=2)),
)
def test_a_waits_poll_is_spread_by_a_tenth_either_way(jitter: float, poll: timedelta) -> None:
    """Runs that began to wait in one burst poll spread over a fifth of the poll, never
    past their timeout or deadline."""
    now = datetime(2026, 12, 1, tzinfo=UTC)
    far = now + timedelta(days=30)
    due = wait_due(now, None, far, poll, lambda: jitter)
    assert now + poll * 0.9 <= due <= now + poll * 1.1
    assert wait_due(now, now + poll / 2, far, poll, lambda: jitter) == now + poll / 2
    assert wait_due(now, None, now + poll / 2, poll, lambda: jitter) == now + poll / 2
