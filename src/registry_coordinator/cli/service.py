"""The service's commands: ``serve``, ``migrate`` and ``doctor``; and how a command runs
Trio (:func:`run_service`) and sets up its logs (:func:`configure_logging`).

Every command that runs Trio goes through :func:`run_service`, the audit and stand-in
commands too, so an error of the product's own raised inside a nursery is reported as
any other, as its one line and its exit code, never as a group's traceback; and every
command that logs sets its logs up once, before it starts, as ``serve`` does. ``serve``
refuses what it can before starting anything: the configuration and workflows, every
problem at once, and a port already taken.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from registry_coordinator.errors import CoordinatorError, ExitCode

if TYPE_CHECKING:
    from registry_coordinator.cli.tree import Commands, Handler


def add_commands(commands: Commands) -> None:
    """Running the service, migrating its schema, and looking at what a start needs."""
    serve = commands.add_parser("serve", help="run the service")
    serve.add_argument("--config", type=Path, required=True, metavar="FILE")
    serve.add_argument(
        "--processes",
        type=_positive,
        default=1,
        metavar="N",
        help="run N service processes sharing listen.port, each its own lease holder, "
        "under one supervisor (about one per core); 1, the default, runs one and no supervisor",
    )
    serve.add_argument(
        "--process-ports",
        type=_positive,
        metavar="FIRST",
        help="with --processes: also serve process k (from 0) alone on port FIRST+k of "
        "listen.host, its own /metrics and /ready, for scraping each process",
    )
    serve.add_argument(
        "--recovery-only",
        action="store_true",
        help="serve operators only: the API's reads and actions and the console; nothing "
        "is dispatched and no run is admitted (after restoring a backup)",
    )
    # How a supervisor starts its processes (processes.Supervisor); not for people.
    serve.add_argument("--child", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--process-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--supervisor-fd", type=int, help=argparse.SUPPRESS)

    migrate = commands.add_parser("migrate", help="apply pending database schema migrations")
    migrate.add_argument("--config", type=Path, required=True, metavar="FILE")

    doctor = commands.add_parser(
        "doctor", help="look at everything a start needs, one line each: exit 0, 1 or 3"
    )
    doctor.add_argument("--config", type=Path, required=True, metavar="FILE")

    recovery = commands.add_parser(
        "recovery", help="a restored database's recovery: what it holds, and ending it"
    )
    steps = recovery.add_subparsers(dest="action", required=True, parser_class=type(recovery))
    show = steps.add_parser("status", help="the open recovery and the runs it still holds")
    show.add_argument("--config", type=Path, required=True, metavar="FILE")
    end = steps.add_parser(
        "end", help="end the open recovery once its runs are reviewed: serve dispatches again"
    )
    end.add_argument("--config", type=Path, required=True, metavar="FILE")
    end.add_argument("--reason", required=True)


def handlers() -> dict[str, Handler]:
    return {"serve": _serve, "migrate": _migrate, "doctor": _doctor, "recovery": _recovery}


def run_service(main: Callable[[], Awaitable[None]]) -> int:
    """Run a Trio entry point. What escapes Trio's nurseries comes wrapped in exception
    groups, one inside another; an error of the product's own (or Ctrl-C) that came
    alone is taken out of them, so the command reports it as any other: its one line
    and its exit code. Anything else keeps its traceback."""
    import trio

    try:
        trio.run(main)
    except BaseExceptionGroup as group:
        found: BaseException = group
        while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
            found = found.exceptions[0]
        if isinstance(found, CoordinatorError | KeyboardInterrupt):
            raise found from None
        raise
    return ExitCode.OK


def configure_logging(process: int | None = None) -> None:
    """Logs on stderr (text on a terminal, JSON lines otherwise), as ``process`` of a
    supervisor's where it is one."""
    from registry_coordinator.observability.logs import configure

    configure(process)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _serve(args: argparse.Namespace) -> int:
    from registry_coordinator.addresses import require_free
    from registry_coordinator.engine.workflows import read_service
    from registry_coordinator.service import Seat, serve

    configure_logging(args.child)
    reading, workflows = read_service(args.config)  # every problem of every stage at once
    if reading.problems and args.child is None:  # refused anyway: and what is unreachable
        from registry_coordinator.doctor import add_unreachable

        add_unreachable(reading)
    reading.problems.refuse()
    config = reading.config
    assert config is not None
    if args.child is not None:  # a supervisor's process: the supervisor checked the rest
        seat = Seat.child(args.child, args.listen_fd, args.supervisor_fd, args.process_fd)
        return run_service(lambda: serve(config, workflows, seat, recovery_only=args.recovery_only))
    if args.processes > 1:
        from registry_coordinator.processes import Supervisor

        supervisor = Supervisor(config, args.processes, args.process_ports, args.recovery_only)
        return run_service(supervisor.run)
    if args.process_ports is not None:
        print(
            "coordinator serve: --process-ports is for --processes 2 or more: one process "
            "alone is reached on listen.port",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    where = f"listen.host, listen.port in {config.file}"
    require_free(config.host, config.port, where, "give listen.port another port")
    if config.admin is not None:
        where = f"listen.admin in {config.file}"
        require_free(*config.admin, where, "give listen.admin.port another port")
    return run_service(lambda: serve(config, workflows, recovery_only=args.recovery_only))


def _doctor(args: argparse.Namespace) -> int:
    from registry_coordinator.doctor import doctor

    return doctor(args.config)


def _migrate(args: argparse.Namespace) -> int:
    """Apply pending migrations; with ``database.migrationDsn``, as the schema's owner, then
    grant the role ``serve`` connects as (``database.dsn``'s) what it needs, and no more."""
    from dataclasses import replace

    from registry_coordinator.config import load_config
    from registry_coordinator.service import open_database_unchecked
    from registry_coordinator.store import roles
    from registry_coordinator.store.migrations import check_server, migrate

    configure_logging()
    config = load_config(args.config)
    database = config.database
    owner = database.migration_dsn

    async def run() -> None:
        runtime = None
        if owner is not None:
            async with open_database_unchecked(database, "coordinator/migrate", size=1) as db:
                runtime = await roles.current_role(db)
        as_owner = replace(database, dsn=owner) if owner is not None else database
        async with open_database_unchecked(as_owner, "coordinator/migrate") as db:
            await check_server(db)
            applied = await migrate(db)
            for migration in applied:
                print(f"applied {migration.version:04d} {migration.name}")
            if not applied:
                print("the schema is current")
            if runtime is not None and runtime != await roles.current_role(db):
                await roles.grant(db, runtime)
                print(f"granted {runtime}, the role serve connects as, what it needs")

    return run_service(run)


def _recovery(args: argparse.Namespace) -> int:
    """``recovery status`` and ``recovery end``: on the database directly, as ``migrate``,
    by whoever may run the service's commands on its host (recorded by login name)."""
    import getpass

    from registry_coordinator.config import load_config
    from registry_coordinator.service import open_database
    from registry_coordinator.store import timeline

    if args.action == "end" and not args.reason.strip():
        print("coordinator recovery end: give a reason: --reason TEXT", file=sys.stderr)
        return ExitCode.USAGE
    config = load_config(args.config)
    actor = f"local:{getpass.getuser()}"

    async def run() -> None:
        async with open_database(config, "registry-coordinator/recovery", 2) as db:
            restore = await timeline.open_restore(db)
            if restore is None:
                print("no recovery is open: the database was not recognised as restored")
                return
            newest = restore.newest_change.isoformat() if restore.newest_change else "never"
            print(
                f"recovery {restore.number}: recognised {restore.detected_at.isoformat()}; "
                f"the database's timeline was at {restore.database_epoch}, the mark at "
                f"{restore.mark_epoch}; its newest change was from {newest}; "
                f"{restore.still_held} of {restore.held} runs still held restored-review"
            )
            if args.action == "end":
                await timeline.end_restore(db, actor, args.reason.strip())
                print(f"ended by {actor}: restart the service to dispatch and admit again")

    return run_service(run)
