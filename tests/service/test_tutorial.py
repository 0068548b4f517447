"""docs/tutorial.md: every command on the page, run in the order the page gives."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from tests.harness import ROOT, free_port, python_env

TUTORIAL = ROOT / "docs" / "tutorial.md"
WORK = ROOT / "var" / "tutorial"


def commands() -> str:
    blocks = re.findall(r"```sh\n(.*?)```", TUTORIAL.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 10
    return "\n".join(blocks)


def test_every_tutorial_command_runs_in_order() -> None:
    shutil.rmtree(WORK, ignore_errors=True)
    # The page's commands, unchanged; the prelude only makes a failure stop the script and
    # take the background processes it started with it.
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + commands()
    try:
        ports = ("PORT", "BREG_PORT", "CASEWORK_PORT", "MESSAGING_PORT", "ISSUER_PORT")
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**python_env(), **{name: str(free_port()) for name in ports}},
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        output = result.stdout
        assert "10 of 10 scenarios passed" in output
        assert output.count("state     finished at step approved") == 2  # runs 1 and 2
        assert "retry-scheduled" in output  # run 2, while Messaging was down
        assert "hold      outcome-unknown" in output  # run 3
        history = output[output.rindex("#1   admitted") :]  # run 3's history, printed last
        kinds = [line.split()[2] for line in history.splitlines() if "  #" in line]
        after = kinds[kinds.index("held") :]
        # notify completes from Messaging's receipt; the delivery webhook may arrive before
        # the wait begins (then no result-delivered event: the wait finds it at once). The
        # wait completes on the result it reads from Messaging.
        assert after[:3] == ["held", "reconciled", "waiting"], kinds
        assert after[-3:] == ["result-read", "step-completed", "finished"], kinds
        assert set(after[3:-3]) <= {"result-delivered"}, kinds
        assert re.search(r"bundle of run \S+: \d+ events chained, the first \d+ under", output)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def test_a_tutorial_wait_that_runs_out_says_so_and_where_to_look(tmp_path: Path) -> None:
    """The page's waits are bounded: one whose condition never holds fails the shell's
    command, naming what it waited for and the log to read."""
    setup = re.findall(r"```sh\n(.*?)```", TUTORIAL.read_text(), flags=re.DOTALL)[0]
    result = subprocess.run(
        ["bash", "-c", setup + "waitfor 1 'curl -sf http://127.0.0.1:1/ready' coordinator.log"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr == (
        "gave up after 1 s waiting for: curl -sf http://127.0.0.1:1/ready (see coordinator.log)\n"
    )
