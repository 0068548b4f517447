"""Where the tests' files are: the checkout, its shipped workflows, the tests' own
workflows (``tests/workflows``) and the checker's corpus of refused sources."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
WORKFLOWS = ROOT / "workflows"
TEST_WORKFLOWS = ROOT / "tests" / "workflows"
CORPUS = ROOT / "tests" / "corpus"
