"""Exit codes systemd can act on: a start refused for what it was given exits 1, which the
shipped unit does not restart; only what may pass (a database not up yet) exits 3, which it
restarts. Against a real PostgreSQL, and the unit verified by systemd's own analyzer with
its ExecStart pointing at an installed virtual environment's ``coordinator``."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from registry_coordinator.errors import ExitCode
from tests.support import ROOT, Services, coordinator
from tests.support.network import free_port

UNIT = ROOT / "config" / "systemd" / "registry-coordinator.service"


def _dsn_with(services: Services, database: str | None = None, port: int | None = None) -> str:
    """The tests' DSN, naming another database or another port."""
    dsn = services.dsn
    if database is not None:
        dsn = dsn.replace(dsn.split("/")[3].split("?")[0], database)
    if port is not None:
        dsn = f"postgresql://postgres@127.0.0.1:{port}/coordinator"
    return dsn


@pytest.mark.parametrize(
    ("what", "code", "says"),
    [
        ("no such database", ExitCode.INVALID, "database refused the connection"),
        ("nothing listens", ExitCode.UNAVAILABLE, "database unavailable"),
    ],
)
def test_serve_exits_1_for_a_refused_database_and_3_for_one_not_up(
    services: Services, what: str, code: ExitCode, says: str
) -> None:
    if what == "no such database":
        dsn = _dsn_with(services, database="no_such_database")
    else:
        dsn = _dsn_with(services, port=free_port())
    config = services.configure(["chain"], extra={"database": {"dsn": dsn, "poolSize": 4}})
    for command in ("serve", "doctor", "migrate"):
        result = coordinator(command, "--config", config)
        assert result.returncode == code, (command, result.stdout, result.stderr)
        assert says in result.stdout + result.stderr, (command, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text())
    return unit


def test_the_unit_restarts_outages_and_not_refusals() -> None:
    service = _unit()["Service"]
    assert service["Restart"] == "on-failure"
    prevented = {int(code) for code in service["RestartPreventExitStatus"].split()}
    assert prevented == {ExitCode.INVALID, ExitCode.USAGE}
    assert ExitCode.UNAVAILABLE not in prevented


def test_systemd_verifies_the_unit_against_an_installed_environment(tmp_path: Path) -> None:
    """``systemd-analyze verify`` checks that ExecStart's binary exists: the shipped unit
    names /opt/registry-coordinator, so it is verified here with that path replaced by
    this environment's installed ``coordinator`` (docs/operations.md says the same)."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze not found: apt-get install systemd (./run test does)"
    installed = Path(sys.executable).parent / "coordinator"
    assert installed.exists(), installed
    text = UNIT.read_text()
    assert "/opt/registry-coordinator/bin/coordinator" in text
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace("/opt/registry-coordinator/bin/coordinator", str(installed)))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
