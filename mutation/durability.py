"""Apply each curated durability mutation to a copy of the tree; its tests must fail.

mutmut mutates the pure modules at random and counts what the fast tests kill, but
the promises that only show across a crash, a lost lease, a resend or a forged
delivery live in the store, the SQL, the call path and the webhooks, and are tested
by killing real ``coordinator serve`` processes. ``mutation/durability.yaml`` lists
one hand-written mutation for each such promise and the tests that must notice it.

For each mutation this copies the working tree (uncommitted work included; never
the tree itself, which others may be editing), replaces the one piece of text, and
runs the named tests there with ``PYTHONPATH`` on the copy's ``src``, so that the
test process and the service processes it starts all import the mutated code. The
same tests first run on an unmutated copy: a test that fails already proves
nothing, so its mutations are reported as not judged.

Usage: ``python mutation/durability.py [ID ...]`` (every mutation by default).
Exit status 1 if any mutation survived or could not be judged.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MUTATIONS = Path(__file__).resolve().with_suffix(".yaml")
# What a copy leaves out: the environment, history, caches and outputs of earlier runs.
LEFT_OUT = shutil.ignore_patterns(
    ".venv", ".git", "mutants", "var", "__pycache__", "*.egg-info", ".*_cache", ".hypothesis"
)
TIMEOUT = 1800  # seconds for one pytest run; the crash-loop chaos test alone takes minutes
_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)(?: - (.*))?$")


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    why: str


class Unapplicable(Exception):
    """The original text is not in the file exactly once: the list needs curating."""


def load(path: Path) -> list[Mutation]:
    entries: list[dict[str, Any]] = yaml.safe_load(path.read_text())
    return [
        Mutation(
            id=e["id"],
            file=e["file"],
            original=e["original"],
            replacement=e["replacement"],
            tests=tuple(e["tests"]),
            why=e["why"],
        )
        for e in entries
    ]


def _lines(block: str) -> list[str]:
    return textwrap.dedent(block).strip("\n").split("\n")


def apply(text: str, original: str, replacement: str) -> str:
    """``text`` with the whole lines ``original`` (found at any indentation, exactly
    once) replaced by ``replacement`` at that indentation."""
    lines, want, new = text.split("\n"), _lines(original), _lines(replacement)

    def indent_at(i: int) -> str | None:
        first = lines[i]
        indent = first[: len(first) - len(first.lstrip())]
        wanted = [indent + w if w else "" for w in want]
        return indent if [x.rstrip() for x in lines[i : i + len(want)]] == wanted else None

    found = [(i, ind) for i in range(len(lines)) if (ind := indent_at(i)) is not None]
    if len(found) != 1:
        raise Unapplicable(f"the original text is found {len(found)} times, not once")
    i, indent = found[0]
    lines[i : i + len(want)] = [indent + n if n else "" for n in new]
    return "\n".join(lines)


def copy_tree(into: Path) -> Path:
    tree = into / "tree"
    shutil.copytree(ROOT, tree, ignore=LEFT_OUT, symlinks=True)
    return tree


def run_tests(tree: Path, tests: list[str]) -> dict[str, tuple[str, str]]:
    """Each test's outcome (PASSED, FAILED, ERROR, ...) and its summary line, run in
    ``tree``; a test pytest did not report (not found, or the run timed out) is
    missing from the answer."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "COLUMNS": "300"}
    command = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
    command += [f"--basetemp={tree.parent / 'pytest'}", *tests]
    try:
        done = subprocess.run(
            command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        return {}
    outcomes = {}
    for line in done.stdout.splitlines():
        if match := _OUTCOME.match(line):
            outcomes[match[2]] = (match[1], line)
    return outcomes


def judge(mutation: Mutation, control: dict[str, tuple[str, str]]) -> tuple[bool, list[str]]:
    """Whether the mutation was killed (every named test failed), and the lines saying so."""
    unjudged = [t for t in mutation.tests if control.get(t, ("missing",))[0] != "PASSED"]
    if unjudged:
        return False, [f"not judged: fails unmutated: {t}" for t in unjudged]
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutation.id}-") as scratch:
        tree = copy_tree(Path(scratch))
        target = tree / mutation.file
        try:
            mutated = apply(target.read_text(), mutation.original, mutation.replacement)
        except Unapplicable as exc:
            return False, [f"not applied to {mutation.file}: {exc}"]
        target.write_text(mutated)
        outcomes = run_tests(tree, list(mutation.tests))
    report, killed = [], True
    for test in mutation.tests:
        outcome, line = outcomes.get(test, ("missing", f"no outcome for {test} (timed out?)"))
        killed &= outcome in ("FAILED", "ERROR")
        report.append(line)
    return killed, report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("ids", nargs="*", help="mutations to apply (default: all)")
    chosen = set(parser.parse_args().ids)
    mutations = [m for m in load(MUTATIONS) if not chosen or m.id in chosen]
    if unknown := chosen - {m.id for m in mutations}:
        parser.error(f"no such mutation: {', '.join(sorted(unknown))}")
    tests = sorted({t for m in mutations for t in m.tests})
    started = time.monotonic()
    print(f"control: {len(tests)} tests on the unmutated tree", flush=True)
    with tempfile.TemporaryDirectory(prefix="mutant-control-") as scratch:
        control = run_tests(copy_tree(Path(scratch)), tests)
    survived = 0
    for mutation in mutations:
        killed, lines = judge(mutation, control)
        survived += not killed
        print(f"{'killed' if killed else 'SURVIVED'}  {mutation.id}", flush=True)
        for line in lines:
            print(f"    {line}", flush=True)
    print(
        f"{len(mutations) - survived} of {len(mutations)} durability mutations killed "
        f"in {time.monotonic() - started:.0f} s"
    )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
