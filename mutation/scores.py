"""The kill rate of mutmut's last run, per module, against the floor each must reach.

mutmut prints one total for every module it mutated; a well-tested module would hide
a poorly tested one in it, so ``just mutants-pure`` reads each mutant's status
(``mutmut results --all true``) and prints the rate per module. A mutant no fast
test reaches counts as a survivor: an untested function is not a tested one.

Exit status 1 if a module is below its floor, or if the run left mutants unchecked.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

FLOOR = 90.0  # percent of each module's mutants that the fast tests must kill
KILLED = {"killed", "timeout", "segfault"}  # a test run that did not pass
SURVIVED = {"survived", "no tests", "suspicious"}
NOT_COUNTED = {"skipped"}
_LINE = re.compile(r"^\s*(?P<module>\S+)\.[^.\s]+__mutmut_\d+: (?P<status>.+)$")


def statuses(mutmut: Path) -> dict[str, Counter[str]]:
    """Each mutated module's count of mutants by status."""
    done = subprocess.run(
        [str(mutmut), "results", "--all", "true"], capture_output=True, text=True, check=True
    )
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    for line in done.stdout.splitlines():
        if match := _LINE.match(line):
            by_module[match["module"]][match["status"].strip()] += 1
    return by_module


def main() -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    by_module = statuses(mutmut)
    if not by_module:
        print("no mutants: run `just mutants-pure` first")
        return 1
    failing = []
    print(f"{'module':<34} {'mutants':>7} {'killed':>6} {'survived':>8} {'no test':>7} {'rate':>6}")
    for module, counts in sorted(by_module.items()):
        unknown = set(counts) - KILLED - SURVIVED - NOT_COUNTED
        killed = sum(counts[s] for s in KILLED)
        survived = sum(counts[s] for s in SURVIVED)
        rate = 100.0 * killed / max(1, killed + survived)
        print(
            f"{module:<34} {killed + survived:>7} {killed:>6} {counts['survived']:>8} "
            f"{counts['no tests']:>7} {rate:>5.1f}%"
        )
        if unknown:
            failing.append(f"{module}: mutants left {', '.join(sorted(unknown))}")
        elif rate < FLOOR:
            failing.append(f"{module}: {rate:.1f}% killed, below the floor of {FLOOR:.0f}%")
    for line in failing:
        print(line)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
