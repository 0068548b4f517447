"""The service's configuration as the tests write it: workflows packaged in this process
and pinned, connections to stand-ins on loopback, and the problems loading one reports."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.artifact import write as write_artifact
from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.config import load_config
from registry_coordinator.custody import Kek
from tests.support.network import free_port
from tests.support.paths import ROOT, TEST_WORKFLOWS
from tests.support.tokens import PARAMETERS

#: A Casework connection whose feed and slow poll stay quiet through a test (ten minutes):
#: only what the test delivers wakes its runs.
QUIET = {"feedPoll": "PT10M", "resultPoll": "PT10M"}


def package(workflow: str | Path, output: Path) -> tuple[Path, str]:
    """Package tests/workflows/<workflow>.yaml (or a shipped workflow directory, or the
    workflow file at a path) as ``coordinator package`` does, in this process: the
    command itself is tested in tests/offline/test_cli.py, and a Python start per
    workflow was a large part of every service test's set-up."""
    if isinstance(workflow, Path):
        source = workflow
    else:
        source = TEST_WORKFLOWS / f"{workflow}.yaml"
        if not source.exists():
            source = ROOT / "workflows" / workflow
    checked = check_source(source)
    if checked.definition is None or checked.artifact is None or checked.digest is None:
        raise Refused(checked.diagnostics)
    return write_artifact(checked.artifact, checked.definition, output), checked.digest


def connection(product: str, port: int, **settings: Any) -> dict[str, Any]:
    """A connection to a stand-in on ``port``, authenticated with the tests' bearer token,
    with the connection-bound parameters the stand-in grants."""
    if product == "external-http":  # the stand-in directory, read in public by default
        return {
            "product": product,
            "baseUrl": f"http://127.0.0.1:{port}/directory/v2",
            "paths": ["offices"],
            "queryParameters": ["district"],
            "responseSchema": {"type": "object", "required": ["status", "body"]},
            **settings,
        }
    bound = {"parameters": PARAMETERS[product]} if product in PARAMETERS else {}
    return {
        "product": product,
        "baseUrl": f"http://127.0.0.1:{port}",
        "identity": {"bearer": "env:STANDIN_TOKEN"},
        **bound,
        **settings,
    }


def services_kek(dsn: str) -> Kek:
    """The key-encryption key of the tests' services on ``dsn``'s database: derived from
    its name, so that every service a test starts on it, from any directory, opens the
    same data keys, and the tests can read what the services sealed."""
    name = conninfo_to_dict(dsn).get("dbname", "coordinator")
    return Kek(1, hashlib.sha256(f"test kek of {name}".encode()).digest())


def custody(directory: Path, dsn: str) -> dict[str, Any]:
    """The ``custody`` section every test service has, as production's should."""
    kek = directory / f"kek-{conninfo_to_dict(dsn).get('dbname', 'coordinator')}"
    kek.write_text(services_kek(dsn).secret.hex() + "\n")
    return {"keys": {"1": f"file:{kek}"}, "active": 1}


def write_config(
    directory: Path,
    dsn: str,
    workflows: Sequence[str | Path],
    *,
    port: int | None = None,
    workers: int = 2,
    lease: str = "PT5S",
    sweep: str = "PT2S",
    connections: dict[str, dict[str, Any]] | None = None,
    grace: str = "PT5S",
    extra: dict[str, Any] | None = None,
) -> Path:
    pins = []
    for name in workflows:
        artifact, digest = package(name, directory / "artifacts")
        pins.append({"artifact": str(artifact), "digest": digest})
    # The high-water mark of this database (a test may start services on two): every
    # service the tests start keeps one, as a production service should.
    mark = directory / f"high-water-{conninfo_to_dict(dsn).get('dbname', 'coordinator')}.json"
    config = {
        "database": {"dsn": dsn, "poolSize": workers + 3, "highWaterMark": str(mark)},
        "custody": custody(directory, dsn),
        "listen": {"host": "127.0.0.1", "port": port or free_port()},
        "workflows": pins,
        "engine": {
            "workers": workers,
            "lease": lease,
            "sweepInterval": sweep,
            "shutdownGrace": grace,
        },
        "connections": connections or {},
        "auth": {"mode": "none"},
        **(extra or {}),
    }
    path = directory / f"config-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


def bound_to_one(
    directory: Path,
    dsn: str,
    workflow: str,
    name: str,
    product: str,
    settings: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[Path, int]:
    """A migrated configuration pinning ``workflow``, its one connection ``name`` bound to
    a stand-in ``product`` on a free port (for the test to start when it chooses), and
    that port."""
    port = free_port()
    bound = {name: connection(product, port, **(settings or {}))}
    return write_config(directory, dsn, [workflow], connections=bound, **options), port


def refused(path: Path) -> list[tuple[str, int | None]]:
    """The (code, line) of every problem loading the configuration at ``path`` reports."""
    with pytest.raises(Refused) as caught:
        load_config(path)
    return [(d.code, d.line) for d in caught.value.diagnostics]
