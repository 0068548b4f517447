"""Shared helpers: the project's paths and running the real command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / "workflows"
CORPUS = Path(__file__).resolve().parent / "corpus"


def coordinator(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``coordinator`` as a separate process, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "registry_coordinator", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=120,
        check=False,
    )
