"""The catalog held to the products' published contracts.

Each fixture in ``fixtures/`` was written from the upstream files it names (path and
commit), as facts: each operation's route, what a success, a refusal or a spent key is,
how its outcome can be had again, which parameters belong to the connection, inputs the
product takes and refuses, answers it gives and answers it does not. A descriptor that
drifts from the fixture (a route, a status, a field a schema lets through or refuses)
fails here, and a descriptor must name every upstream file its fixture was written from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from registry_coordinator.authoring.catalog import Operation, Product, builtin_catalog
from registry_coordinator.semantics.actions import (
    conditions_request,
    input_problems,
    preconditions,
    select,
)
from registry_coordinator.semantics.steps import build_request

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CONTRACTS = {path.stem: json.loads(path.read_text()) for path in sorted(FIXTURES.glob("*.json"))}
OPERATIONS = [
    (product, name) for product, contract in CONTRACTS.items() for name in contract["operations"]
]
RESULTS = [
    (product, name) for product, contract in CONTRACTS.items() for name in contract["results"]
]


def product(kind: str) -> Product:
    return builtin_catalog().products[kind]


def operation(kind: str, name: str) -> Operation:
    return product(kind).operations[name]


def valid(schema: Any, value: Any) -> bool:
    return not list(jsonschema.Draft202012Validator(schema).iter_errors(value))


def test_every_product_of_the_catalog_has_its_contract() -> None:
    assert sorted(CONTRACTS) == sorted(builtin_catalog().products)
    for kind, contract in CONTRACTS.items():
        assert sorted(contract["operations"]) == sorted(product(kind).operations), kind
        assert sorted(contract["results"]) == sorted(product(kind).results), kind


@pytest.mark.parametrize("kind", sorted(CONTRACTS))
def test_a_product_names_the_upstream_files_its_facts_come_from(kind: str) -> None:
    """Every file and commit a fixture was written from is one the descriptor says it
    follows, in the published repository."""
    described = product(kind)
    assert isinstance(described.contract, dict)
    assert described.contract["repository"] == "registrystack/registry-stack"
    named = {(f["path"], f["commit"]) for f in described.contract["follows"]}
    descriptors = [op.descriptor for op in described.operations.values()]
    descriptors += [result.descriptor for result in described.results.values()]
    for descriptor in descriptors:
        follows = descriptor.get("follows", []) if isinstance(descriptor, dict) else []
        named |= {(f["path"], f["commit"]) for f in follows}
    for source in CONTRACTS[kind]["sources"]:
        assert (source["path"], source["commit"]) in named, source["path"]


@pytest.mark.parametrize("kind", sorted(CONTRACTS))
def test_a_products_problem_vocabulary_and_parameters_are_its_own(kind: str) -> None:
    contract = CONTRACTS[kind]
    described = product(kind)
    assert described.problems == contract["problems"]
    placed = {n: {"in": p.where.value, "name": p.wire} for n, p in described.parameters.items()}
    assert placed == contract["parameters"]


@pytest.mark.parametrize(("kind", "name"), OPERATIONS)
def test_an_operation_is_routed_and_answered_as_its_product_says(kind: str, name: str) -> None:
    facts = CONTRACTS[kind]["operations"][name]
    op = operation(kind, name)
    route = (op.method, op.path, op.effect.value)
    assert route == (facts["method"], facts["path"], facts["effect"])
    assert op.idempotency_key is facts["idempotencyKey"]
    assert op.recovery.value == facts["recovery"]
    assert [p.name for p in op.bound] == facts["sends"]
    success = sorted(op.success) if op.success is not None else None
    assert success == (sorted(facts["success"]) if facts["success"] is not None else None)
    if "refusals" in facts:
        assert sorted(op.refusals) == sorted(facts["refusals"])
    assert sorted(op.refused_codes) == sorted(facts.get("refusedCodes", []))
    assert sorted(op.spent_codes) == sorted(facts.get("spentCodes", []))
    assert op.prepare == facts.get("prepare")
    assert op.grant == facts.get("grant")
    receipt = facts.get("receipt")
    if receipt is None:
        assert op.receipt is None
    else:
        assert op.receipt is not None
        got = (op.receipt.method, op.receipt.path, sorted(op.receipt.unresolved))
        assert got == (receipt["method"], receipt["path"], receipt["unresolved"])


@pytest.mark.parametrize(("kind", "name"), OPERATIONS)
def test_an_operation_takes_what_its_product_takes_and_refuses_the_rest(
    kind: str, name: str
) -> None:
    facts = CONTRACTS[kind]["operations"][name]
    schema = operation(kind, name).request_schema
    for given in facts["accepts"]:
        assert valid(schema, given), given
    for refused in facts["refuses"]:
        assert not valid(schema, refused["input"]), refused["why"]


@pytest.mark.parametrize(("kind", "name"), OPERATIONS)
def test_an_operation_reads_its_products_answers_and_no_others(kind: str, name: str) -> None:
    facts = CONTRACTS[kind]["operations"][name]
    op = operation(kind, name)
    for answer in facts["answers"]:
        assert op.succeeded(answer["status"]), answer["status"]
        assert valid(op.response_schema, answer["body"]), answer["body"]
    for wrong in facts["wrongAnswers"]:
        assert not valid(op.response_schema, wrong["body"]), wrong["why"]


@pytest.mark.parametrize(("kind", "name"), RESULTS)
def test_a_result_is_read_and_known_as_its_product_makes_it_known(kind: str, name: str) -> None:
    facts = CONTRACTS[kind]["results"][name]
    result = product(kind).results[name]
    assert (result.fetch.name, result.key) == (facts["fetch"], facts["key"])
    assert sorted(result.pending) == facts["pending"]
    assert {str(k): v.value for k, v in (result.gone or {}).items()} == facts["gone"]
    for answer in facts["final"]:
        assert result.is_final(answer), answer
    for answer in facts["notFinal"]:
        assert not result.is_final(answer), answer
    delivery = facts["delivery"]
    if delivery == "read":
        assert result.read_only and result.push is None and result.feed is None
        return
    push, feed = delivery["push"], delivery["feed"]
    assert result.push is not None and result.feed is not None
    pushed = (result.push.event, result.push.key, result.push.event_id)
    assert pushed == (push["event"], push["key"], push["eventId"])
    listed = (result.feed.path, result.feed.cursor, result.feed.items, result.feed.next)
    assert listed == (feed["path"], feed["cursor"], feed["items"], feed["next"])
    assert (result.feed.key, result.feed.event_id) == (feed["key"], feed["eventId"])
    assert 1 <= result.feed.limit <= feed["limitAtMost"]


def test_availability_is_asked_for_with_the_products_query() -> None:
    facts = CONTRACTS["scheduling"]["operations"]["read-availability"]
    read = operation("scheduling", "read-availability")
    request = build_request(read, facts["accepts"][0], None)
    assert request.target == "/v1/availability" + facts["query"]


def test_a_breg_action_is_prepared_as_its_contract_and_conditions_say() -> None:
    facts = CONTRACTS["breg"]["operations"]["invoke-action"]
    preparation = facts["preparation"]
    action = select(facts["metadata"], "update-item", preparation["profile"])
    assert action.condition_keys == ("targetId",)
    assert input_problems(action, preparation["input"]) == []
    for refused in preparation["refusedInputs"]:
        assert input_problems(action, refused["input"]), refused["why"]
    assert conditions_request(action, preparation["input"]) == preparation["conditionsRequest"]
    sent = {
        "input": preparation["input"],
        "preconditions": preconditions(action, preparation["conditionsAnswer"]),
    }
    assert sent == preparation["body"]
    assert action.binding(preparation["profile"]) == {
        "action": "update-item",
        "accessProfile": "writer",
        "registryRevision": facts["metadata"]["revision"],
        "contractFingerprint": facts["metadata"]["actions"][0]["contractFingerprint"],
    }


def test_an_external_read_never_takes_a_redirect_and_sends_its_query_as_data() -> None:
    facts = CONTRACTS["external-http"]["operations"]["external-get"]
    read = operation("external-http", "external-get")
    assert read.external
    for status in facts["redirects"]:
        assert not read.succeeded(status), status
    request = build_request(read, facts["accepts"][1], None)
    # The value is one query value, its &, = and / encoded as data, under the path as given.
    assert request.target == (
        "/offices?district=north+%26south%3Dhttp%3A%2F%2Felsewhere.test%2F%3Fx%3D1"
    )
