"""Exit codes systemd can act on: a start refused for what it was given exits 1, which the
shipped unit does not restart (tests/service/test_systemd.py); only what may pass (a
database not up yet) exits 3, which it restarts. Against a real PostgreSQL."""

from __future__ import annotations

import pytest

from registry_coordinator.errors import ExitCode
from tests.support import Services, coordinator
from tests.support.network import free_port


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
