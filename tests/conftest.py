"""Fixtures: a PostgreSQL cluster per test process, a fresh database per test, and the
services a test starts on it, each stopped when the test ends."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import Cluster, Services

# Hypothesis fails an example that runs longer than 200 ms: a wall-clock bound, which a
# loaded machine breaks (a 2.5 ms example took 255 ms in CI). Property tests assert what
# holds, never how fast; timings live in the benchmarks.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """One embedded PostgreSQL 18 for this test process, in a directory of its own: run as
    root, the tests have PostgreSQL run as the wheel's own user, and pg_ctl (a restart)
    must reach its data directory whatever mode pytest gives its temporary root, which
    another pytest session on the machine may set to 0700 at any time."""
    directory = Path(tempfile.mkdtemp(prefix="coordinator-cluster-"))
    directory.chmod(0o755)
    running = Cluster(directory)
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def dsn(cluster: Cluster) -> str:
    """A new database for this test, migrated to this build's schema."""
    return cluster.create_database(migrated=True)


@pytest.fixture
def empty_dsn(cluster: Cluster) -> str:
    """A new, empty database for this test: for the tests of migrating one."""
    return cluster.create_database()


@pytest.fixture(scope="module")
def schema(cluster: Cluster) -> str:
    """One migrated database for a module whose tests only read the schema's functions."""
    return cluster.create_database(migrated=True)


@pytest.fixture
def services(dsn: str, tmp_path: Path) -> Iterator[Services]:
    """``services(workflows, **options)`` starts a service on this test's database (model:
    Procrastinate's ``job_factory``); whatever a test started is stopped when it ends, so
    its body holds only what it tests."""
    with Services(tmp_path, dsn) as started:
        yield started
