"""The service under systemd: the notify protocol, the watchdog, and the unit file."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from itertools import pairwise
from pathlib import Path

from .harness import ROOT, Service, migrate, write_config


def test_a_test_acting_as_systemd_sees_ready_watchdog_and_stopping(
    dsn: str, tmp_path: Path
) -> None:
    address = tmp_path / "notify.sock"
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(str(address))
    systemd.settimeout(0.2)
    config = write_config(tmp_path, dsn, ["timed-choice"])
    migrate(config)
    environment = {"NOTIFY_SOCKET": str(address), "WATCHDOG_USEC": "400000"}
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

    try:
        listen(30, until="READY=1")
        listen(2.5)
        ready = [at for at, line in received if line == "READY=1"]
        assert len(ready) == 1, received
        assert service.http.get("/ready").json()["ready"] is True
        pings = [at for at, line in received if line == "WATCHDOG=1" and at > ready[0]]
        assert len(pings) >= 8, received  # every 0.2 s for the watchdog's 0.4 s
        gaps = [b - a for a, b in pairwise(pings)]
        assert max(gaps) < 0.4, gaps
        assert any(line.startswith("STATUS=ready: http://127.0.0.1:") for _, line in received)
        stopping_at = len(received)
        service.process.send_signal(15)
        listen(3)
        assert service.process.wait(10) == 0
    finally:
        if service.process.poll() is None:
            service.process.kill()
        systemd.close()
    after = [line for _, line in received[stopping_at:]]
    assert "STOPPING=1" in after, after
    assert any(line.startswith("STATUS=stopping") for line in after), after


def test_systemd_analyze_accepts_the_unit_file(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is not installed: install Debian's systemd package"
    unit = (ROOT / "config" / "systemd" / "registry-coordinator.service").read_text()
    assert "Type=notify" in unit and "WatchdogSec=" in unit and "Restart=on-failure" in unit
    executable = shutil.which("coordinator") or str(ROOT / ".venv" / "bin" / "coordinator")
    # Verified as shipped, with ExecStart pointing at this installation's coordinator.
    local = tmp_path / "registry-coordinator.service"
    local.write_text(unit.replace("/opt/registry-coordinator/bin/coordinator", executable))
    result = subprocess.run(
        [analyze, "verify", str(local)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
