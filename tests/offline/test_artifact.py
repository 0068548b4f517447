"""Packaging: canonical bytes, the printed digest, never overwriting, verification on load."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path

import pytest

from registry_coordinator.authoring.artifact import FORMAT, load, load_file
from registry_coordinator.authoring.canonical import canonical_bytes
from registry_coordinator.authoring.diagnostics import Refused
from tests.support import WORKFLOWS, coordinator

TUTORIAL = WORKFLOWS / "review-application"


def package(output: Path) -> tuple[str, Path]:
    result = coordinator("package", TUTORIAL, "--output", output)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), output / "review-application-1.json"


def test_package_prints_the_digest_of_the_bytes_written(tmp_path: Path) -> None:
    digest, artifact = package(tmp_path / "out")
    data = artifact.read_bytes()
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    document = json.loads(data)
    assert document["format"] == FORMAT
    assert document["workflow"]["id"] == "review-application"
    # Only the operations and results the workflow uses, plus the reads results fetch with.
    assert sorted(document["catalog"]["casework"]["operations"]) == [
        "read-review-result",
        "request-review",
    ]
    assert sorted(document["catalog"]["breg"]["operations"]) == ["read-record"]
    assert list(document["catalog"]["messaging"]["results"]) == ["message-delivered"]
    assert (
        data
        == json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    )


def test_same_input_same_bytes_and_digest_command_agrees(tmp_path: Path) -> None:
    first, a = package(tmp_path / "a")
    second, b = package(tmp_path / "b")
    assert first == second
    assert a.read_bytes() == b.read_bytes()
    result = coordinator("digest", a)
    assert result.returncode == 0
    assert result.stdout.strip() == first


def test_never_overwrites_other_content(tmp_path: Path) -> None:
    digest, artifact = package(tmp_path)
    again = coordinator("package", TUTORIAL, "--output", tmp_path)
    assert again.returncode == 0  # identical bytes: nothing to overwrite
    assert again.stdout.strip() == digest
    artifact.write_bytes(b"{}")
    refused = coordinator("package", TUTORIAL, "--output", tmp_path)
    assert refused.returncode == 1
    assert "artifact.exists" in refused.stderr
    assert artifact.read_bytes() == b"{}"
    assert [p.name for p in tmp_path.iterdir()] == [artifact.name]  # no temporary left


def test_digest_refuses_edited_or_foreign_files(tmp_path: Path) -> None:
    _, artifact = package(tmp_path)
    data = artifact.read_bytes()
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(json.loads(data), indent=2, sort_keys=True))
    result = coordinator("digest", pretty)
    assert result.returncode == 1
    assert "artifact.not-canonical" in result.stderr

    tampered = json.loads(data)
    tampered["workflow"]["steps"]["route"]["otherwise"] = "nowhere"
    edited = tmp_path / "edited.json"
    edited.write_bytes(json.dumps(tampered, sort_keys=True, separators=(",", ":")).encode())
    result = coordinator("digest", edited)
    assert result.returncode == 1
    assert "step.unknown-next" in result.stderr

    foreign = json.loads(data)
    foreign["catalog"]["breg"]["operations"]["read-record"]["method"] = "DELETE"
    odd = tmp_path / "odd.json"
    odd.write_bytes(json.dumps(foreign, sort_keys=True, separators=(",", ":")).encode())
    result = coordinator("digest", odd)
    assert result.returncode == 1
    assert "artifact.invalid" in result.stderr

    for junk in (b"\x00\x01binary", b'{"format": 1, "format": 2}', b"[]", b"NaN"):
        path = tmp_path / "junk.json"
        path.write_bytes(junk)
        result = coordinator("digest", path)
        assert result.returncode == 1, junk
        assert "Traceback" not in result.stderr
        assert "artifact." in result.stderr


def test_an_artifact_runs_on_its_own_descriptors(tmp_path: Path) -> None:
    _, artifact = package(tmp_path)
    definition, digest = load_file(artifact)
    assert digest.startswith("sha256:")
    assert definition.operations["notify"].path == "/v1/messages"
    assert definition.results["await_decision"].fetch.name == "read-review-result"
    graph = coordinator("graph", artifact, "--format", "dot")
    assert graph.returncode == 0
    assert graph.stdout.startswith('digraph "review-application" {')
    assert '"await_decision" -> "not_decided" [label="on-timeout", style=dashed];' in graph.stdout


def test_a_stored_definition_is_built_without_being_judged_again(tmp_path: Path) -> None:
    """Read back by digest for the runs admitted under it, an artifact is not judged again
    under this build's rules (here: a deadline over P366D, and a descriptor field this
    build's catalog schema does not know): it is built, and runs. It is
    refused only when this build cannot run it (an expression that does not compile)."""
    _, artifact = package(tmp_path / "out")
    document = json.loads(artifact.read_bytes())
    document["workflow"]["deadline"] = "P400D"
    document["catalog"]["breg"]["operations"]["read-record"]["since"] = "2025"
    refused_today = canonical_bytes(document)
    with pytest.raises(Refused):
        load(refused_today, "stored")
    definition = load(refused_today, "stored", trusted=True)
    assert definition.workflow.deadline == timedelta(days=400)
    assert definition.operations["read_application"].name == "read-record"

    document["workflow"]["steps"]["route"]["cases"][0]["when"] = "steps.await_decision.decision =="
    with pytest.raises(Refused) as unusable:
        load(canonical_bytes(document), "stored", trusted=True)
    first = unusable.value.diagnostics[0]
    assert first.code == "artifact.unusable"
    assert "expression" in first.message
