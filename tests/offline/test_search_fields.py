"""A workflow's search fields: named CEL expressions over the input alone, checked
offline like the subject, kept in the artifact a run is admitted under, and evaluated at
admission to the text a run is found by exactly. A field the input does not give is left
out: a search never refuses a start."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.authoring.artifact import build, load
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.definition import Definition
from tests.support import tutorial_with

SEARCH = "search: {}"
FIELDS = "{applicationId: input.applicationId, attempt: input.attempt}"


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Definition:
    definition, found = tutorial_with(tmp_path_factory.mktemp("search"), FIELDS, SEARCH)
    assert found == [] and definition is not None
    return load(build(definition), "artifact.json", trusted=True)


def test_search_fields_over_the_input_survive_packaging(searched: Definition) -> None:
    assert searched.search_of({"applicationId": "a-3-17", "attempt": 2}) == {
        "applicationId": "a-3-17",
        "attempt": "2",
    }
    assert searched.search_of({"applicationId": "a-1"}) == {"applicationId": "a-1"}


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ("{applicationId: run.id}", "workflow.search-field", "field applicationId reads run.id"),
        ("{flag: input.a == 1}", "expression.type", "gives a bool"),
        ("{Application: input.a}", "search.bad-name", "'Application' does not match"),
        ("{application-id: input.a}", "search.bad-name", "does not match"),
        ("{applicationId: 7}", "field.type", "string"),
        (
            "{" + ", ".join(f"f{n}: input.a" for n in range(9)) + "}",
            "limit.search-fields",
            "9 search fields; at most 8",
        ),
    ],
)
def test_a_search_field_not_over_the_input_is_refused(
    tmp_path: Path, fields: str, code: str, words: str
) -> None:
    refused, said = tutorial_with(tmp_path, fields, SEARCH)
    assert refused is None
    assert [c for c, _ in said] == [code], said
    assert words in said[0][1], said


#: JSON as a run's input holds it: admission refuses NUL and unpaired surrogates
#: (``canonical.storable``: PostgreSQL cannot keep them), and CEL's integers are 64-bit.
TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]))
SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
JSON_VALUES = st.recursive(
    SCALARS | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


def test_any_input_gives_only_declared_fields_as_text(searched: Definition) -> None:
    @given(application=JSON_VALUES, attempt=JSON_VALUES, other=JSON_VALUES)
    def gives(application: JSON, attempt: JSON, other: JSON) -> None:
        _only_declared(searched, application, attempt, other)

    gives()


def _only_declared(searched: Definition, application: JSON, attempt: JSON, other: JSON) -> None:
    found = searched.search_of({"applicationId": application, "attempt": attempt, "x": other})
    expected: dict[str, str] = {}
    for name, value in (("applicationId", application), ("attempt", attempt)):
        if isinstance(value, str) and value:
            expected[name] = value
        elif isinstance(value, int) and not isinstance(value, bool):
            expected[name] = str(value)
    assert found == expected
