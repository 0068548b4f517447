"""docs/tutorial.md: every command on the page, run in the order the page gives."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from registry_coordinator.semantics.chain import parse
from registry_coordinator.semantics.checkpoints import signing_key
from tests.support import ROOT, coordinator, free_port, python_env, resigned

TUTORIAL = ROOT / "docs" / "tutorial.md"
SCENARIOS = ROOT / "workflows" / "review-application" / "scenarios.yaml"
#: What a call whose answer never came leaves in its run's history before the receipt
#: Messaging kept completes it.
VERIFYING = ("call-lost", "verify-scheduled", "receipt-looked-up")
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
        scenarios = yaml.safe_load(SCENARIOS.read_text())["scenarios"]
        assert f"{len(scenarios)} of {len(scenarios)} scenarios passed" in output
        assert output.count("state     finished at step approved") == 2  # runs 1 and 2
        assert "retry-scheduled" in output  # run 2, while Messaging was down
        # Run 3: the notice's answer never came; Coordinator asked Messaging for its receipt
        # (a read, resending the original key and body) and completed the step with it.
        held_at = output.index("hold      outcome-unknown")  # run 4's status
        asked = [line.split() for line in output[:held_at].splitlines() if "  #" in line]
        asked = [words for words in asked if words[2] in VERIFYING]
        assert [words[2] for words in asked] == list(VERIFYING), asked
        assert '"status": 200' in " ".join(asked[-1]), asked
        history = output[output.rindex("#1   admitted") :]  # run 4's history, printed last
        kinds = [line.split()[2] for line in history.splitlines() if "  #" in line]
        # The 500 made the outcome unknown; the receipt route, asked twice, had nothing
        # (409, receipt.unresolved): held. The operator's retry-same sent the same request
        # under its key; then Messaging was read until the notice was delivered.
        before = kinds[kinds.index("call-dispatched", kinds.index("result-read")) :]
        assert before[: before.index("held") + 1] == [
            *("call-dispatched", "call-answered"),
            *("verify-scheduled", "receipt-looked-up") * 2,
            "held",
        ], kinds
        after = kinds[kinds.index("held") :]
        assert after[:6] == [
            *("held", "retry-same", "call-dispatched", "call-answered"),
            *("step-completed", "waiting"),
        ], kinds
        assert after[-4:] == ["result-read", "step-completed", "step-completed", "finished"]
        assert set(after[6:-4]) <= {"result-polled"}, kinds
        lines = [line for line in history.splitlines() if "  #" in line]
        looked = [line for line in lines if " receipt-looked-up " in line]
        assert all('"status": 409' in line for line in looked), looked
        sent = [line for line in lines if " call-answered " in line and "notify" in line]
        assert ['"status": 500' in line for line in sent] == [True, False], sent
        assert re.search(r"bundle of run \S+: \d+ events chained, the first \d+ under", output)
        # Run 4 replayed from its auditor's bundle: the wait's key, the route taken, the finish.
        assert "at route: took case 1 -> notify" in output
        assert re.search(r"at approved: finished approved-and-notified, with the output", output)
        assert re.search(
            r"\): \d+ decisions follow from its record, signed by the key given", output
        )
        _forged_branch_is_refused(WORK / "run4.replay.json", WORK / "keys" / "audit-key.pem")
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def _forged_branch_is_refused(bundle: Path, key_file: Path) -> None:
    """The auditor's bundle with its route changed and everything signed again with the
    service's own key: verify says it holds, and replay names the forged event."""
    forged = bundle.with_name("forged.replay.json")
    document = parse(bundle.read_bytes())
    assert isinstance(document, dict)
    events = document["events"]
    route = next(e for e in events if e["type"] == "step-completed" and e["step"] == "route")
    route["detail"] = {"via": "case 2", "next": "rejected"}
    forged.write_bytes(resigned(document, signing_key(key_file.read_text())))
    public = key_file.with_name("audit-key.pub")
    holds = coordinator("audit", "verify", "--bundle", forged, "--public-key", public)
    assert holds.returncode == 0, holds.stdout  # the key holder's signature is whole
    refused = coordinator("audit", "replay", "--bundle", forged, "--public-key", public)
    assert refused.returncode == 1, refused.stdout
    assert f"event {route['seq']}: the history says case 2 -> rejected" in refused.stdout
    assert "the record makes it take case 1 -> notify" in refused.stdout


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
