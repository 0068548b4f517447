"""Artifacts: the immutable, digest-pinned form of a checked workflow.

An artifact is the canonical JSON of ``{format, workflow, catalog}``: the workflow
document as authored (comments and YAML style gone) and the catalog descriptors
of every product it names, trimmed to the operations and results it uses. The
digest is SHA-256 over exactly those bytes. Loading an artifact re-checks it
against its own descriptors, so a run never depends on the catalog of the build
that happens to execute it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry_coordinator.authoring.canonical import (
    CanonicalError,
    canonical_bytes,
    digest_of,
    refuse_constant,
)
from registry_coordinator.authoring.catalog import Catalog, CatalogError, builtin_catalog
from registry_coordinator.authoring.checker import check_document
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.diagnostics import Diagnostic, Refused, errors
from registry_coordinator.authoring.source import SourceMap, load_yaml, read_source
from registry_coordinator.authoring.workflow import Call, WaitFor

FORMAT = "registry-coordinator.artifact/v1"
MAX_ARTIFACT_BYTES = 384 * 1024
MAX_ARTIFACT_FILE = 1024 * 1024


@dataclass(frozen=True)
class Checked:
    """The outcome of checking one workflow source: a definition and its artifact, or why not."""

    file: str
    diagnostics: list[Diagnostic]
    definition: Definition | None = None
    artifact: bytes | None = None

    @property
    def digest(self) -> str | None:
        return digest_of(self.artifact) if self.artifact is not None else None


def workflow_file(path: Path) -> Path:
    """A workflow is named by its directory or by its workflow.yaml."""
    return path / "workflow.yaml" if path.is_dir() else path


def check_source(path: Path, catalog: Catalog | None = None) -> Checked:
    """Read, check and package (in memory) a workflow source file."""
    path = workflow_file(path)
    file = str(path)
    try:
        document, source = load_yaml(read_source(path), file)
    except Refused as refused:
        return Checked(file, list(refused.diagnostics))
    report = check_document(document, source, catalog or builtin_catalog())
    if report.definition is None:
        return Checked(file, report.diagnostics)
    data = build(report.definition)
    if len(data) > MAX_ARTIFACT_BYTES:
        too_large = Diagnostic(
            "limit.artifact-size",
            f"the artifact would be {len(data)} bytes; at most {MAX_ARTIFACT_BYTES} are allowed",
            "shorten schemas and literals, or split the workflow",
            file,
            source.at(()),
        )
        return Checked(file, [*report.diagnostics, too_large])
    return Checked(file, report.diagnostics, report.definition, data)


def build(definition: Definition) -> bytes:
    """The canonical artifact bytes of a checked definition."""
    workflow = definition.workflow
    used: dict[str, tuple[set[str], set[str]]] = {
        kind: (set(), set()) for kind in set(workflow.connections.values())
    }
    for step in workflow.steps.values():
        if isinstance(step, Call):
            used[workflow.connections[step.connection]][0].add(step.operation)
        elif isinstance(step, WaitFor):
            used[workflow.connections[step.connection]][1].add(step.result_name)
    catalog = {
        kind: definition.catalog.products[kind].descriptor(ops, results)
        for kind, (ops, results) in used.items()
    }
    return canonical_bytes({"format": FORMAT, "workflow": workflow.document, "catalog": catalog})


def load(data: bytes, file: str, *, trusted: bool = False) -> Definition:
    """Verify and load artifact bytes; raises :class:`Refused` (``artifact.*``).

    ``trusted`` bytes are a definition runs were admitted under, read back by digest:
    they are not judged again under this build's rules (canonical form, the catalog's
    descriptor schema, the checker's rules), only built — refused only if this build
    cannot run them (``artifact.unusable``).
    """

    def refuse(code: str, message: str, repair: str) -> Refused:
        return Refused([Diagnostic(code, message, repair, file)])

    if len(data) > MAX_ARTIFACT_FILE:
        raise refuse(
            "artifact.invalid",
            f"{len(data)} bytes is too large for an artifact",
            "give the file that coordinator package wrote",
        )
    try:
        document = json.loads(
            data.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=refuse_constant
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise refuse(
            "artifact.invalid", f"not JSON: {exc}", "give the file that coordinator package wrote"
        ) from None
    try:
        canonical = canonical_bytes(document)
    except CanonicalError as exc:
        raise refuse("artifact.invalid", str(exc), "repackage the workflow") from None
    if canonical != data and not trusted:
        raise refuse(
            "artifact.not-canonical",
            "the bytes are not the canonical JSON form (was the file edited or reformatted?)",
            "repackage the workflow with coordinator package and pin the new digest",
        )
    if (
        not isinstance(document, dict)
        or document.get("format") != FORMAT
        or set(document) != {"format", "workflow", "catalog"}
    ):
        raise refuse(
            "artifact.invalid",
            f"not a {FORMAT} document",
            "give the file that coordinator package wrote",
        )
    try:
        catalog = Catalog.from_descriptors(document["catalog"], trusted=trusted)
    except CatalogError as exc:
        raise refuse(
            "artifact.invalid", f"its catalog is malformed: {exc}", "repackage the workflow"
        ) from None
    report = check_document(document["workflow"], SourceMap(file), catalog, trusted=trusted)
    if report.definition is None:
        raise Refused(errors(report.diagnostics))
    if build(report.definition) != data and not trusted:
        raise refuse(
            "artifact.invalid",
            "the catalog holds descriptors the workflow does not use",
            "repackage the workflow",
        )
    return report.definition


def load_file(path: Path) -> tuple[Definition, str]:
    """Load an artifact file; returns the definition and the digest of its bytes."""
    data = read_source(path, max_bytes=MAX_ARTIFACT_FILE)
    return load(data, str(path)), digest_of(data)


def write(artifact: bytes, definition: Definition, directory: Path) -> Path:
    """Write the artifact into ``directory``; never replaces a file with other content.

    The file appears whole or not at all: it is written aside, synced, then linked
    into place, which fails if the name is taken.
    """
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{definition.id}-{definition.version}.json"
    if target.exists():
        if target.is_file() and target.read_bytes() == artifact:
            return target
        raise Refused(
            [
                Diagnostic(
                    "artifact.exists",
                    f"{target} exists with other content",
                    "give the workflow a new version, or choose another --output directory",
                    str(target),
                )
            ]
        )
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".artifact-", delete=False) as handle:
        handle.write(artifact)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(handle.name, target)
    except FileExistsError:
        return write(artifact, definition, directory)
    finally:
        os.unlink(handle.name)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return target


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result
