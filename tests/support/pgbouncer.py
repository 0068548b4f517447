"""PgBouncer for the tests: Debian's ``pgbouncer`` (1.18, which ``./run test`` installs when
missing) in front of one test database, with a pool in transaction mode and one in
session mode, as an operator would put it before a PostgreSQL.

It reaches the cluster over its Unix socket, which sits in the data directory: run as
root, PgBouncer (which refuses to run as root) takes the cluster's own user, the one
user that may open that directory. It logs to its standard error, a file of the test's.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from tests.support.network import free_port
from tests.support.waiting import until

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncer:
    """PgBouncer before ``dsn``'s database: :attr:`transaction` and :attr:`session` are
    DSNs of the same database through a transaction-mode and a session-mode pool."""

    def __init__(self, directory: Path, dsn: str) -> None:
        parts = conninfo_to_dict(dsn)
        user, host, name = parts["user"], parts["host"], parts["dbname"]
        self.port = free_port()
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
        users = directory / "users.txt"
        users.write_text(f'"{user}" ""\n')
        server = f"host={host} port={parts.get('port', 5432)} dbname={name}"
        ini = directory / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"pooled = {server} pool_mode=transaction\n"
            f"session = {server} pool_mode=session\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "max_client_conn = 200\n"
            "default_pool_size = 20\n"
        )
        for path in (users, ini):
            path.chmod(0o644)
        self.log = directory / "pgbouncer.log"
        as_user = ["-u", "embedded_postgres"] if os.geteuid() == 0 else []
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [PGBOUNCER, *as_user, str(ini)], stdout=log, stderr=subprocess.STDOUT
            )
        base = f"postgresql://{user}@127.0.0.1:{self.port}"
        self.transaction = f"{base}/pooled"
        self.session = f"{base}/session"
        until(self._listening, f"pgbouncer listening on {self.port} ({self.log})")

    def _listening(self) -> bool | None:
        if self.process.poll() is not None:
            raise RuntimeError(f"pgbouncer ended: {self.log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return None
        return True

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
