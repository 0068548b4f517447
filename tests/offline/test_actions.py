"""BReg's immediate actions as the registry's metadata describes them, offline.

What ``semantics.actions`` decides before a BReg action is sealed — which action the
metadata offers the connection's profile, whether an input fits its declared inputs,
which condition tokens it needs — and whether a frozen command still fits before it is
sent again. Property tests range over inputs and metadata; the fixture's facts are in
``tests/contracts/fixtures/breg.json`` (the upstream files and commit it names).
"""

from __future__ import annotations

import copy
import json
import re
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.semantics.actions import (
    Action,
    ActionUnavailable,
    conditions_request,
    input_problems,
    preconditions,
    select,
    still_fits,
)

FIXTURE = json.loads(
    (Path(__file__).resolve().parent.parent / "contracts" / "fixtures" / "breg.json").read_text()
)
METADATA: dict[str, Any] = FIXTURE["operations"]["invoke-action"]["metadata"]
PROFILE = "writer"
TARGET = "00000000-0000-4000-8000-000000000001"


def action(metadata: dict[str, Any] | None = None) -> Action:
    return select(metadata or METADATA, "update-item", PROFILE)


def changed(path: list[str | int], value: Any) -> dict[str, Any]:
    """The fixture's metadata with the member at ``path`` (under the action) replaced."""
    metadata = copy.deepcopy(METADATA)
    where: Any = metadata["actions"][0]
    for step in path[:-1]:
        where = where[step]
    if value is None:
        del where[path[-1]]
    else:
        where[path[-1]] = value
    return metadata


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        (["access", "selectedProfile"], "reader", "not offered to profile writer"),
        (["route"], "/v1/actions/other", "is not invoked at /v1/actions/update-item"),
        (["routes", "invoke", "path"], "/elsewhere", "is not invoked at"),
        (["contractFingerprint"], "md5:00", "has no contract fingerprint"),
        (["requiredConditionKeys"], ["nope"], "is no required input"),
        (["requiredConditionKeys"], ["targetId", "label"], "label is no reference input"),
        (["inputMode"], "batch", "takes its input in a mode Coordinator lacks"),
        (["inputMode"], None, "takes its input in a mode Coordinator lacks"),
        (["inputs", 1, "nullable"], True, "declares input label unclearly"),
        (["inputs", 1, "nullable"], None, "declares input label unclearly"),
        (["conditionRoute"], None, "has condition keys but no condition route"),
        (["inputs", 0, "apiName"], 7, "declares an input without its name"),
    ],
)
def test_an_action_the_metadata_does_not_offer_as_prepared_is_unavailable(
    path: list[str | int], value: Any, why: str
) -> None:
    with pytest.raises(ActionUnavailable, match=why):
        action(changed(path, value))


def test_an_action_absent_or_metadata_of_another_version_is_unavailable() -> None:
    with pytest.raises(ActionUnavailable, match="offers no action 'close-item'"):
        select(METADATA, "close-item", PROFILE)
    with pytest.raises(ActionUnavailable, match="not Registry Metadata version 1"):
        select({**METADATA, "metadataVersion": "2"}, "update-item", PROFILE)
    with pytest.raises(ActionUnavailable, match="names no revision"):
        select({**METADATA, "revision": "7"}, "update-item", PROFILE)


LABELS = st.text(string.ascii_letters + " ", min_size=0, max_size=24)


@given(LABELS)
def test_a_string_input_fits_exactly_when_its_length_is_declared(label: str) -> None:
    problems = input_problems(action(), {"targetId": TARGET, "label": label})
    assert (problems == []) is (1 <= len(label) <= 16)


@given(st.dictionaries(st.sampled_from(["targetId", "label", "note", "extra"]), st.just("x")))
def test_an_input_names_exactly_the_declared_inputs_it_needs(given: dict[str, str]) -> None:
    given = {k: TARGET if k == "targetId" else v for k, v in given.items()}
    problems = input_problems(action(), given)
    unknown = sorted(set(given) - {"targetId", "label"})
    missing = sorted({"targetId", "label"} - set(given))
    assert [p for p in problems if "is not an input" in p] == [
        f"{name} is not an input of update-item" for name in unknown
    ]
    assert [p for p in problems if p.endswith("is required")] == [
        f"{name} is required" for name in missing
    ]


@given(st.one_of(st.integers(), st.booleans(), st.none(), st.text(max_size=40)))
def test_a_reference_is_a_canonical_lowercase_uuid_and_never_null(value: Any) -> None:
    problems = input_problems(action(), {"targetId": value, "label": "x"})
    assert problems  # none of these is a canonical UUID
    assert input_problems(action(), {"targetId": TARGET, "label": "x"}) == []
    upper = "7D1C2A4E-0B5F-4C3A-9E21-5A6B7C8D9E01"
    assert input_problems(action(), {"targetId": upper, "label": "x"})
    assert input_problems(action(), {"targetId": upper.lower(), "label": "x"}) == []


def test_a_handler_actions_optional_inputs_and_only_those_may_be_null() -> None:
    handler = changed(["inputMode"], "handler")
    handler["actions"][0]["inputs"][1].update(required=False, nullable=True)
    found = action(handler)
    assert input_problems(found, {"targetId": TARGET, "label": None}) == []
    assert input_problems(found, {"targetId": None, "label": "x"}) == ["targetId may not be null"]
    handler["actions"][0]["inputs"][1]["nullable"] = False
    with pytest.raises(ActionUnavailable, match="declares input label unclearly"):
        action(handler)


def declared(field_type: dict[str, Any]) -> Action:
    """The fixture's action with its label input of ``field_type``."""
    return action(changed(["inputs", 1, "fieldType"], field_type))


DECIMAL = {"type": "decimal", "precision": 5, "scale": 2, "minimum": "-10.00", "maximum": "100.00"}


@pytest.mark.parametrize(
    ("field_type", "value", "fits"),
    [
        (DECIMAL, "12.50", True),
        (DECIMAL, "0.00", True),
        (DECIMAL, "-10.00", True),
        (DECIMAL, "12.5", False),  # exactly the declared scale
        (DECIMAL, "1234.00", False),  # more integer digits than precision - scale
        (DECIMAL, "100.01", False),  # over the maximum
        (DECIMAL, "-0.00", False),
        (DECIMAL, "012.00", False),
        (DECIMAL, "+1.00", False),
        (DECIMAL, 12.5, False),  # a decimal is written as a string
        ({"type": "date"}, "2024-02-29", True),
        ({"type": "date"}, "2023-02-29", False),  # no such day
        ({"type": "date"}, "2023-13-01", False),
        ({"type": "timestamp"}, "2026-12-04T10:00:00Z", True),
        ({"type": "timestamp"}, "2026-12-04T25:00:00Z", False),
        ({"type": "int64"}, 2**62, True),
        ({"type": "int64"}, 2**63, False),
        ({"type": "int64"}, True, False),
        ({"type": "string"}, "x", False),  # a string with no declared maximum
        ({"type": "text", "maxLength": 3}, "four", False),
        ({"type": "hologram"}, "x", False),
    ],
)
def test_an_input_is_held_to_its_declared_field_type(
    field_type: dict[str, Any], value: Any, fits: bool
) -> None:
    problems = input_problems(declared(field_type), {"targetId": TARGET, "label": value})
    assert (problems == []) is fits, problems


def test_a_string_over_the_actions_byte_bound_is_refused() -> None:
    """The bound counts UTF-8 bytes of every string input (the target's UUID's 36 too)."""
    bounded = action(changed(["maximumInputStringBytes"], 36))
    assert input_problems(bounded, {"targetId": TARGET, "label": "abcdefghijklmn"}) == []
    assert input_problems(bounded, {"targetId": TARGET, "label": "é" * 13}) == []
    assert input_problems(bounded, {"targetId": TARGET, "label": "é" * 14 + "ab"}) == []
    tight = action(changed(["maximumInputStringBytes"], 27))
    assert input_problems(tight, {"targetId": TARGET, "label": "é" * 14}) == [
        "label must be at most 27 bytes",
        "targetId must be at most 27 bytes",
    ]


def test_the_conditions_asked_for_and_sent_back_are_exactly_the_condition_keys() -> None:
    found = action()
    given = {"targetId": TARGET, "label": "x"}
    assert conditions_request(found, given) == {"input": {"targetId": TARGET}}
    token = {"targetId": {"ifMatch": '"r7"'}}
    assert preconditions(found, {"preconditions": token}) == token
    answers: tuple[Any, ...] = (
        {"preconditions": {}},
        {"preconditions": {**token, "label": {"ifMatch": '"x"'}}},
        {"preconditions": {"targetId": {"ifMatch": "r7"}}},  # an unquoted entity tag
        {"preconditions": {"targetId": "r7"}},
        {"preconditions": {"targetId": {"ifMatch": '"r"7"'}}},  # a quote inside
        {"preconditions": {"targetId": {"ifMatch": '"' + "r" * 255 + '"'}}},  # over 256 bytes
        {"preconditions": {"targetId": {"ifMatch": '"r7"', "weak": True}}},
        {"preconditions": token, "also": 1},
        [],
    )
    for wrong in answers:
        with pytest.raises(ActionUnavailable):
            preconditions(found, wrong)


MEMBERS = ["action", "accessProfile", "registryRevision", "contractFingerprint"]


@given(st.sets(st.sampled_from(MEMBERS)))
def test_a_frozen_command_is_sent_again_only_under_the_authority_it_was_prepared_under(
    moved: set[str],
) -> None:
    found = action()
    frozen = found.binding(PROFILE)
    for member in moved:
        frozen[member] = f"{frozen[member]}-then"
    said = still_fits(frozen, found, PROFILE)
    if not moved:
        assert said is None
    else:
        assert said is not None
        assert sorted(re.findall(r"(\w+) was ", said)) == sorted(moved)
