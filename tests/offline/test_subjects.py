"""A workflow's data subject: a CEL expression over the input alone, checked offline to
give a string, and evaluated at admission to the id whose key seals the run's data
(docs/custody.md). What it gives is the input's own text, never a value cut short, and
a start whose input gives it none is refused in words that never quote the input."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.authoring.artifact import build, check_source, load
from registry_coordinator.authoring.definition import (
    ConcurrencyKeyMissing,
    Definition,
    SubjectMissing,
)
from tests.support import TUTORIAL, tutorial_with


def test_a_subject_over_the_input_gives_the_inputs_field(tmp_path: Path) -> None:
    definition, found = tutorial_with(tmp_path, "input.applicationId")
    assert found == []
    assert definition is not None
    assert definition.subject_of({"applicationId": "a-1"}) == "a-1"
    packaged = load(build(definition), "artifact.json", trusted=True)
    assert packaged.subject_of({"applicationId": "a-1"}) == "a-1"


def test_a_workflow_without_a_subject_gives_none(tmp_path: Path) -> None:
    path = tmp_path / "workflow.yaml"
    path.write_text(TUTORIAL)
    definition = check_source(path).definition
    assert definition is not None
    assert definition.subject_of({"applicationId": "a-1"}) is None


@pytest.mark.parametrize(
    ("subject", "code", "words"),
    [
        ("steps.read_application.id", "workflow.subject", "reads steps.read_application"),
        ("run.id", "workflow.subject", "reads run.id"),
        ("size(input)", "expression.type", "gives an int, not a string"),
        ("input.", "expression.syntax", "does not parse"),
    ],
)
def test_a_subject_that_is_not_a_string_of_the_input_is_refused(
    tmp_path: Path, subject: str, code: str, words: str
) -> None:
    definition, found = tutorial_with(tmp_path, subject)
    assert definition is None
    assert [c for c, _ in found] == [code]
    assert words in found[0][1]


@pytest.fixture(scope="module")
def by_applicant(tmp_path_factory: pytest.TempPathFactory) -> Definition:
    definition, _ = tutorial_with(tmp_path_factory.mktemp("subject"), "input.applicationId")
    assert definition is not None
    return definition


@given(st.text(min_size=1).filter(lambda t: "\0" not in t))
def test_the_subject_is_the_inputs_text_whole(by_applicant: Definition, text: str) -> None:
    assert by_applicant.subject_of({"applicationId": text}) == text


@pytest.mark.parametrize(
    ("given_input", "kind"),
    [
        ({}, "no string"),
        ({"applicationId": 7}, "no string"),
        ({"applicationId": ""}, "an empty string"),
        ({"applicationId": "canary\0-cut"}, "no string"),  # cel-cpp would read it short
    ],
)
def test_an_input_that_gives_no_subject_is_refused_without_its_value(
    by_applicant: Definition, given_input: dict[str, object], kind: str
) -> None:
    with pytest.raises(SubjectMissing) as refused:
        by_applicant.subject_of(given_input)
    words = str(refused.value)
    assert f"gives {kind} for this input" in words
    assert "input.applicationId" in words
    assert "canary" not in words and "7" not in words


KEYED = "concurrency: {{key: {}}}"


def test_a_concurrency_key_over_the_input_survives_packaging(tmp_path: Path) -> None:
    """Checked as the subject is, and kept in the artifact a run is admitted under."""
    definition, found = tutorial_with(tmp_path, "input.applicationId", KEYED)
    assert found == [] and definition is not None
    packaged = load(build(definition), "artifact.json", trusted=True)
    assert packaged.concurrency_of({"applicationId": "a-1"}) == "a-1"
    assert packaged.subject_of({"applicationId": "a-1"}) is None
    with pytest.raises(ConcurrencyKeyMissing, match=r"concurrency key `input\.applicationId`"):
        packaged.concurrency_of({"applicationId": ""})
    refused, said = tutorial_with(tmp_path, "run.id", KEYED)
    assert refused is None and said[0][0] == "workflow.concurrency-key"
    assert "the concurrency key reads run.id" in said[0][1]
