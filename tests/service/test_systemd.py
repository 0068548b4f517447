"""The service under systemd: the notify protocol, the watchdog, and the unit file."""

from __future__ import annotations

import shlex
import shutil
import signal
import socket
import subprocess
import time
from itertools import pairwise
from pathlib import Path

from registry_coordinator import cli
from registry_coordinator.errors import ExitCode
from tests.support import ROOT, Service, Services

STALL = 3.0  # seconds the test has the service's event loop blocked


def test_a_test_acting_as_systemd_sees_ready_watchdog_and_stopping(
    tmp_path: Path, services: Services
) -> None:
    """READY=1 once ready, WATCHDOG=1 pings from the event loop itself (they stop while the
    loop is blocked, so systemd would restart a stuck service), then STOPPING=1 on SIGTERM.
    The pings are asked every 0.2 s; only their order and the gap the stall leaves are
    asserted, not how punctual a loaded machine keeps them."""
    address = tmp_path / "notify.sock"
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(str(address))
    systemd.settimeout(0.2)
    config = services.configure(["timed-choice"])
    environment = {
        "NOTIFY_SOCKET": str(address),
        "WATCHDOG_USEC": "400000",
        "COORDINATOR_STALL_ON_USR1": str(STALL),
    }
    service = Service(config, tmp_path / "service.log", env=environment)
    received: list[tuple[float, str]] = []

    def listen(seconds: float, until: str | None = None) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                message = systemd.recv(4096).decode()
            except TimeoutError:
                continue
            received.extend((time.monotonic(), line) for line in message.splitlines())
            if until is not None and until in message.splitlines():
                return

    def pings() -> list[float]:
        ready = [at for at, line in received if line == "READY=1"]
        assert len(ready) == 1, received
        return [at for at, line in received if line == "WATCHDOG=1" and at > ready[0]]

    try:
        listen(30, until="READY=1")
        listen(1.5)
        assert service.http.get("/ready").json()["ready"] is True
        before = len(pings())
        assert before >= 3, received
        service.process.send_signal(signal.SIGUSR1)
        listen(STALL + 2)
        after = pings()
        gaps = [b - a for a, b in pairwise(after)]
        stalled = max(range(len(gaps)), key=gaps.__getitem__)
        assert gaps[stalled] > STALL - 1, gaps  # a pinger off the loop would have gone on
        assert stalled >= before - 1 and len(after) - stalled > 3, gaps  # and pings resumed
        assert any(line.startswith("STATUS=ready: http://127.0.0.1:") for _, line in received)
        stopping_at = len(received)
        service.process.send_signal(signal.SIGTERM)
        listen(3)
        assert service.process.wait(10) == 0
    finally:
        if service.process.poll() is None:
            service.process.kill()
        service.http.close()
        systemd.close()
    after_term = [line for _, line in received[stopping_at:]]
    assert "STOPPING=1" in after_term, after_term
    assert any(line.startswith("STATUS=stopping") for line in after_term), after_term
    assert "stalling the event loop" in service.log.read_text()


def test_systemd_analyze_accepts_the_unit_file(tmp_path: Path) -> None:
    """The unit as shipped is valid for systemd, and its command line for this build: with
    the default of COORDINATOR_PROCESSES (which the environment file may override) it runs
    one process; the supervisor of several is tested in tests/service/test_processes.py."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is not installed: install Debian's systemd package"
    unit = (ROOT / "config" / "systemd" / "registry-coordinator.service").read_text()
    assert "Type=notify" in unit and "WatchdogSec=" in unit and "Restart=on-failure" in unit
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and line[0] != "#"
    )
    assert settings["NotifyAccess"] == "main"  # the supervisor, or the one process, speaks
    # Outages (3) are restarted; refusals (1: configuration, schema, a refused database;
    # 2: the command line) are not, or systemd would repeat them every RestartSec forever.
    prevented = {int(code) for code in settings["RestartPreventExitStatus"].split()}
    assert prevented == {ExitCode.INVALID, ExitCode.USAGE}, prevented
    default = settings["Environment"].removeprefix("COORDINATOR_PROCESSES=")
    command = shlex.split(settings["ExecStart"].replace("${COORDINATOR_PROCESSES}", default))
    assert cli.parser().parse_args(command[1:]).processes == 1
    executable = shutil.which("coordinator") or str(ROOT / ".venv" / "bin" / "coordinator")
    # Verified as shipped, with ExecStart pointing at this installation's coordinator.
    local = tmp_path / "registry-coordinator.service"
    local.write_text(unit.replace("/opt/registry-coordinator/bin/coordinator", executable))
    result = subprocess.run(
        [analyze, "verify", str(local)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
