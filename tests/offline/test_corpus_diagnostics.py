"""Every corpus file's diagnostics in full, against ``tests/corpus/diagnostics.json``:
code, severity, message, repair, line and column.

tests/offline/test_corpus.py checks, by marks written by hand, that each refusal has its code
and points at its line; mutation testing (``just mutants-pure``) found that a message
or a repair saying the wrong thing, a diagnostic pointing at the value instead of the
key, or a warning turned into an error went unnoticed there. The expectations here
were written by the checker and read through by hand: a change of wording or place
shows as a diff to review. After an intended change, rewrite the file with
``.venv/bin/python -m tests.test_corpus_diagnostics`` and review its diff.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from registry_coordinator.authoring.artifact import check_source
from tests.support import CORPUS

FILES = sorted((CORPUS / "invalid").glob("*.yaml"))
EXPECTED = CORPUS / "diagnostics.json"

Found = list[list[str | int | None]]


def found(path: Path) -> Found:
    return [
        [
            d.code,
            d.severity.value,
            d.message,
            d.repair,
            d.position.line if d.position else None,
            d.position.column if d.position else None,
        ]
        for d in check_source(path).diagnostics
    ]


@cache
def expected() -> dict[str, Found]:
    reviewed: dict[str, Found] = json.loads(EXPECTED.read_text())
    return reviewed


def test_every_corpus_file_has_reviewed_diagnostics() -> None:
    assert sorted(expected()) == sorted(path.stem for path in FILES)


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_a_corpus_files_diagnostics_are_as_reviewed(path: Path) -> None:
    assert found(path) == expected()[path.stem]


if __name__ == "__main__":
    written = {path.stem: found(path) for path in FILES}
    EXPECTED.write_text(json.dumps(written, indent=1, ensure_ascii=False) + "\n")
