"""The operator's surface: /metrics, the remote CLI against a live service, JSON logs."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from registry_coordinator.http.auth import mint
from tests.support import ROOT, Services, development_jwt, metrics, process_env, wait_state


def test_metrics_parse_and_move_with_runs(dsn: str, services: Services) -> None:
    service, _ = services.deploy(["notify", "timed-choice"], {"notices": ("messaging", {})})
    before = metrics(service)
    assert before[("coordinator_listener_connected", ())] == 1
    runs = [service.start_run("notify", {"email": f"{n}@example.org"}) for n in range(3)]
    waiting = service.start_run("timed-choice", {"answer": "yes"})
    for run in runs:
        wait_state(dsn, run, "finished")
    wait_state(dsn, waiting, "waiting")
    during = metrics(service)
    wait_state(dsn, waiting, "finished")
    after = metrics(service)
    started = ("coordinator_runs_started_total", (("workflow", "notify"),))
    assert before.get(started, 0) == 0 and after[started] == 3
    ended = (
        "coordinator_runs_ended_total",
        (("outcome", "sent"), ("state", "finished"), ("workflow", "notify")),
    )
    assert after[ended] == 3
    assert after[("coordinator_step_transitions_total", (("type", "call"),))] == 3
    assert after[("coordinator_step_transitions_total", (("type", "finish"),))] == 4
    assert during[("coordinator_runs", (("state", "waiting"),))] == 1
    assert after[("coordinator_runs", (("state", "waiting"),))] == 0
    calls = (
        "coordinator_call_duration_seconds_count",
        # the catalog's operation, not the step that called it
        (("connection", "notices"), ("operation", "submit-message"), ("result", "2xx")),
    )
    assert after[calls] == 3
    assert after[("coordinator_timer_lateness_seconds_count", ())] >= 1
    assert after[("coordinator_pool_in_use", (("connection", "notices"),))] == 0


def cli(*args: str | Path, url: str, token: Path | None = None) -> subprocess.CompletedProcess[str]:
    options = ["--url", url, *(["--token-file", str(token)] if token else [])]
    return subprocess.run(
        [sys.executable, "-m", "registry_coordinator", *map(str, args), *options],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=process_env(),
        timeout=60,
        check=False,
    )


def start(*args: str, url: str, token: Path) -> str:
    """``coordinator runs start ARGS --format json``: the id of the run it started."""
    started = cli("runs", "start", *args, "--format", "json", url=url, token=token)
    assert started.returncode == 0, started.stderr
    return str(json.loads(started.stdout)["id"])


NAP = """\
apiVersion: coordinator.registrystack.org/v1alpha1
kind: Workflow
id: nap
version: "1"
deadline: PT2H
input: {type: object}
outcomes:
  done: {type: "null"}
start: sleep
steps:
  sleep: {type: wait-until, at: run.admitted_at + duration("1h"), next: done}
  done: {type: finish, outcome: done}
"""


def test_every_cli_command_against_a_live_service(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    key = tmp_path / "signing-key.pem"
    operator = tmp_path / "operator.token"
    operator.write_text(mint(key, "operators", ["coordinator.operate"], 1800))
    portal = tmp_path / "portal.token"
    portal.write_text(mint(key, "case-portal", ["coordinator.runs"], 1800))
    auth = development_jwt(
        key,
        {"client": "operators", "scopes": ["coordinator.operate"], "operator": True},
        {
            "client": "case-portal",
            "scopes": ["coordinator.runs"],
            "workflows": ["*"],
            "actions": ["start", "read", "cancel"],
        },
    )
    # The engine asks neither product what became of a call whose answer never came: each
    # such run is held at once, for the operator's commands below.
    asks_nothing = {"requestTimeout": "PT1S", "verification": {"attempts": 0}}
    connections = {"notices": ("messaging", asks_nothing), "registry": ("breg", asks_nothing)}
    # A run that waits an hour, for the cancel: a two-second wait could end before two CLI
    # starts do on a loaded machine.
    nap = tmp_path / "nap.yaml"
    nap.write_text(NAP)
    service, products = services.deploy(
        ["notify", "act", "timed-choice", nap], connections, extra={"auth": auth}
    )
    url = service.url
    run = start(
        "timed-choice", "--input", '{"answer": "yes"}', "--key", "k-1", url=url, token=portal
    )
    input_file = tmp_path / "input.json"
    input_file.write_text('{"answer": "yes"}')
    again = cli(
        "runs",
        "start",
        "timed-choice",
        "--input",
        f"@{input_file}",
        "--key",
        "k-1",
        url=url,
        token=portal,
    )
    assert again.returncode == 0 and run in again.stdout
    listed = cli("runs", "list", url=url, token=portal)
    assert listed.returncode == 0 and run in listed.stdout
    status = cli("runs", "status", run, url=url, token=portal)
    assert status.returncode == 0 and "workflow  timed-choice version 1" in status.stdout
    wait_state(dsn, run, "finished")
    history = cli("runs", "history", run, url=url, token=portal)
    assert history.returncode == 0
    assert "admitted" in history.stdout and "finished" in history.stdout
    # A timeline an operator reads down: every column starts where the one above does.
    lines = history.stdout.splitlines()
    for column in ("  #", " by "):
        assert len({line.index(column) for line in lines}) == 1, history.stdout
    waiting = start("nap", "--input", "{}", url=url, token=portal)
    cancelled = cli(
        "runs", "cancel", waiting, "--reason", "duplicate application", url=url, token=portal
    )
    assert cancelled.returncode == 0 and "state     cancelled" in cancelled.stdout

    hang = {"mode": "hang-after-apply", "seconds": 30, "times": 1}
    products.faults("messaging", {"match": "POST /v1/messages", **hang})
    # The action's invocation, not the reads that prepare it.
    products.faults("breg", {"match": "POST /v1/actions/mark-reviewed$", **hang})
    held_notice, held_action = (
        start(workflow, "--input", text, url=url, token=portal)
        for workflow, text in (
            ("notify", '{"email": "a@example.org"}'),
            ("act", json.dumps({"recordId": str(uuid.uuid4())})),
        )
    )
    for held in (held_notice, held_action):
        wait_state(dsn, held, "held")
    not_operator = cli("runs", "reconcile", held_notice, "--reason", "x", url=url, token=portal)
    assert not_operator.returncode == 1 and "auth.operator-required" in not_operator.stderr
    reconciled = cli(
        "runs", "reconcile", held_notice, "--reason", "receipt checked", url=url, token=operator
    )
    assert reconciled.returncode == 0, reconciled.stderr
    resent = cli(
        "runs",
        "retry-same",
        held_action,
        "--reason",
        "BReg said resend",
        url=url,
        token=operator,
    )
    assert resent.returncode == 0, resent.stderr
    for held in (held_notice, held_action):
        wait_state(dsn, held, "finished")

    hold = cli("admission", "hold", "--reason", "maintenance", url=url, token=operator)
    assert hold.returncode == 0 and "admission held: maintenance" in hold.stdout
    answer = '{"answer": "no"}'
    refused = cli("runs", "start", "timed-choice", "--input", answer, url=url, token=portal)
    assert refused.returncode == 1 and "admission.held" in refused.stderr
    release = cli("admission", "release", "--reason", "done", url=url, token=operator)
    assert release.returncode == 0

    assert cli("runs", "status", "no-such-run", url=url, token=portal).returncode == 1
    assert cli("runs", "list", url=url).returncode == 1  # no token: 401
    not_a_token = tmp_path / "not-a-token"
    not_a_token.write_bytes("jwt-é".encode("latin-1"))
    garbled = cli("runs", "list", url=url, token=not_a_token)
    assert garbled.returncode == 2 and "does not hold a token" in garbled.stderr
    assert "Traceback" not in garbled.stderr
    assert cli("runs", "cancel", run, url=url, token=portal).returncode == 2  # no --reason
    assert cli("runs", "start", "x", "--input", "{oops", url=url, token=portal).returncode == 2
    assert cli("runs", "list", url="http://127.0.0.1:1", token=portal).returncode == 3
    service.stop()  # its log complete
    log: list[dict[str, Any]] = [
        json.loads(line) for line in (tmp_path / "service.log").read_text().splitlines()
    ]
    held_lines = [entry["message"] for entry in log if entry.get("run") == held_notice]
    assert held_lines[0].startswith("run started") and any("run held" in m for m in held_lines)
    assert all({"at", "level", "logger", "message"} <= set(entry) for entry in log)
