"""Fixtures: a PostgreSQL cluster per test process, a fresh database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# database first: it imports trio_asyncio before psycopg, as psycopg requires under Trio.
import registry_coordinator.database  # noqa: F401

from .harness import Cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One embedded PostgreSQL 18 for this test process."""
    running = Cluster(tmp_path_factory.mktemp("cluster"))
    yield running
    running.stop()


@pytest.fixture
def dsn(cluster: Cluster) -> str:
    """A new, empty database for this test."""
    return cluster.create_database()
