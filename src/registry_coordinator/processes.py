"""``coordinator serve --processes N``: N service processes on one port, supervised.

A Trio process uses one core. This supervisor lets one host use several: it runs N
``coordinator serve`` processes (its children) on one configuration, sharing the work the
way any processes on one database share it — each claims due runs for itself, as a lease
holder of its own — and sharing one listening port. It serves nothing and holds no
database connection itself; ``--processes 1`` (the default) never starts it.

Before any child starts, the parent does what would otherwise fail in every child at once:
the configuration is read (by the command line, every problem in one refusal), the
address is bound, and the database is reached and its version and schema checked once. A
start that cannot work ends there, with its one line and exit code, never as a restart
loop.

One socket, bound here and passed down, rather than SO_REUSEPORT: each child serves the
supervisor's socket as hypercorn's ``fd://N`` bind (hypercorn's own multi-worker mode
does the same: it makes the sockets once in its parent and hands them to its workers). So
the port is refused in one line here when it is taken, and ``listen.port: 0`` gives one
port to all; the callers waiting in its accept queue are served by whichever child
accepts next when one dies (with SO_REUSEPORT each socket has its own queue, and the
connections queued on a dying child's are reset); a restarted child binds nothing; and no
other process of the same user can join the port, as SO_REUSEPORT would let it. What a
shared queue does not do is spread connections evenly: the child that accepts first gets
the next one. Only admission is done where a request lands; the runs themselves are
claimed from PostgreSQL by every child alike.

What holds:

- Child ``k`` (0 to N-1) is ``coordinator serve --child k`` on the same file, the lease
  holder ``host:port/k``: a restarted child ``k`` takes over at once the claims its
  predecessor left (``store.take_over``), and a dead child's other claims fall due to any
  child when their leases run out. Every write stays fenced by its claim's lease token.
- Each child speaks the notify protocol (``observability.systemd``) to a datagram socket of its
  own here, in a directory only this user can reach. The supervisor is the one process
  that speaks to systemd: ``READY=1`` once every child has said it, ``WATCHDOG=1`` from
  its own loop, ``STOPPING=1`` when it stops. With a watchdog, a child that has not
  pinged for the whole watchdog interval is killed, and restarted.
- SIGTERM or SIGINT is forwarded to every child, each drains its calls within
  ``engine.shutdownGrace``, and the supervisor waits for all of them (killing any still
  there a margin past the grace) and exits 0.
- A child that dies otherwise is restarted, logging why, after a pause that doubles with
  each death in a row (:data:`RESTART`). While the service is starting (not every child
  has been ready yet), one that dies before it is ready :data:`START_ATTEMPTS` times in a
  row stops the supervisor: the other children are stopped and it exits 3, never looping
  on a start that cannot work. Once the service has been ready, a seat is never given
  up: a child that cannot start again (the database away during a failover, say) is
  tried again every 30 s at most while the others go on.
- A child reads the end of a pipe whose one write end the supervisor holds: however the
  supervisor ends, its children shut down rather than serve on unsupervised.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import trio

from registry_coordinator.addresses import bind
from registry_coordinator.config import Config
from registry_coordinator.engine.backoff import Backoff
from registry_coordinator.errors import CoordinatorError, ExitCode
from registry_coordinator.observability.systemd import Notifier
from registry_coordinator.service import open_database

log = logging.getLogger(__name__)

#: The pause before a child that died is started again, by deaths in a row: a crash costs
#: a second, a child that keeps dying a start every 30 s rather than a storm of them.
RESTART = Backoff(first=1.0, cap=30.0)
#: A child that was ready this long before it died starts its count of deaths again.
STABLE = 60.0
#: Deaths before ready in a row after which a starting supervisor gives up: under systemd
#: the unit is then started again as a whole (``Restart=on-failure``).
START_ATTEMPTS = 3
#: How long past ``engine.shutdownGrace`` a stopping child may take before it is killed.
STOP_MARGIN = 10.0


class Unsupervisable(CoordinatorError):
    """``--processes`` was given what a supervisor cannot run."""

    exit_code = ExitCode.USAGE


class ChildrenFailing(CoordinatorError):
    """A child kept dying before it was ready (its own lines said why): the service could
    not be started now."""

    exit_code = ExitCode.UNAVAILABLE


@dataclass
class _Child:
    """One of the supervisor's N seats, and the process in it now, if any."""

    index: int
    process: trio.Process | None = None
    ready: bool = False
    ready_at: float = 0.0  # trio time
    pinged: float = 0.0  # trio time of its last watchdog ping (or of READY=1)
    deaths: int = 0  # in a row, counting from its last stable life
    failed_starts: int = 0  # deaths before ready, in a row
    starts: int = 0


class Supervisor:
    """N children of one configuration file on one bound port (and, with ``process_ports``,
    child ``k`` also on its own port ``process_ports + k``: its own ``/metrics`` and
    ``/ready``, which the shared port, answered by whichever child accepts, cannot give)."""

    def __init__(
        self,
        config: Config,
        processes: int,
        process_ports: int | None,
        recovery_only: bool = False,
    ) -> None:
        if config.database.embedded is not None:
            raise Unsupervisable(
                f"--processes {processes} needs database.dsn: the embedded PostgreSQL of "
                f"{config.file} is for one process (the demo, the tests)"
            )
        if config.admin is not None:
            raise Unsupervisable(
                f"--processes {processes} and listen.admin in {config.file}: an admin "
                "listener is for one process; scrape each process on --process-ports"
            )
        self.config = config
        self.recovery_only = recovery_only
        self.children = [_Child(k) for k in range(processes)]
        where = f"listen.host, listen.port in {config.file}"
        repair = "give listen.port another port"
        self.listening = _listening(config.host, config.port, where, repair)
        self.port = self.listening.getsockname()[1]
        self.process_sockets: list[socket.socket] = []
        for k in range(processes if process_ports is not None else 0):
            assert process_ports is not None
            given = f"--process-ports {process_ports}, process {k}"
            repair = f"give --process-ports a first port with {processes} free ports from it"
            self.process_sockets.append(_listening(config.host, process_ports + k, given, repair))
        self.pipe, self._pipe_end = os.pipe()  # children read; the supervisor holds the end
        self.systemd = Notifier()
        self.stopping = trio.Event()
        self.stop_signal = signal.SIGTERM
        self.failure: CoordinatorError | None = None
        self.announced = False

    async def run(self) -> None:
        """Check the database once, then keep the children until SIGTERM or SIGINT, or until
        one keeps failing at startup (raised once every child has stopped)."""
        try:
            async with open_database(self.config, "coordinator/supervisor", size=1):
                pass
            holder = f"{socket.gethostname()}:{self.port}"
            names = ", ".join(f"{holder}/{child.index}" for child in self.children)
            log.info("starting %d processes on port %d: %s", len(self.children), self.port, names)
            self.systemd.status(f"starting {len(self.children)} processes")
            with (
                tempfile.TemporaryDirectory(prefix="coordinator-") as directory,
                trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals,
            ):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._until_signalled, signals)
                    await nursery.start(self.systemd.watchdog)
                    nursery.start_soon(self._watch_children)
                    async with trio.open_nursery() as keepers:
                        for child in self.children:
                            keepers.start_soon(self._keep, child, Path(directory))
                    nursery.cancel_scope.cancel()
        finally:
            for sock in (self.listening, *self.process_sockets):
                sock.close()
            os.close(self._pipe_end)
            os.close(self.pipe)
            self.systemd.close()
        if self.failure is not None:
            raise self.failure
        log.info("stopped")

    def _stop(self, received: signal.Signals) -> None:
        if self.stopping.is_set():
            return
        self.stop_signal = received
        self.stopping.set()
        self.systemd.send("STOPPING=1", "STATUS=stopping: the processes finish calls in flight")

    async def _until_signalled(self, signals: AsyncIterator[int]) -> None:
        async for received in signals:
            name = signal.Signals(received).name
            log.info("received %s: stopping %d processes", name, len(self.children))
            self._stop(signal.Signals(received))

    async def _keep(self, child: _Child, directory: Path) -> None:
        """Child ``k``'s seat: its process, and each one after it that died, until stopped
        (``directory``: where its notify sockets are bound)."""
        while not self.stopping.is_set():
            returncode, was_ready, lived = await self._run_once(child, directory)
            why = _why(returncode)
            if self.stopping.is_set():
                log.info("process %d %s", child.index, why)
                return
            if not was_ready:
                child.failed_starts += 1
                if child.failed_starts >= START_ATTEMPTS and not self.announced:
                    self._give_up(child, why)
                    return
            else:
                child.failed_starts = 0
            child.deaths = 1 if was_ready and lived >= STABLE else child.deaths + 1
            pause = RESTART.pause(child.deaths)
            log.warning(
                "process %d %s%s; starting it again in %.0f s",
                child.index,
                why,
                "" if was_ready else " before it was ready",
                pause,
            )
            self._status()
            with trio.move_on_after(pause):
                await self.stopping.wait()

    def _give_up(self, child: _Child, why: str) -> None:
        self.failure = ChildrenFailing(
            f"process {child.index} died before it was ready {child.failed_starts} times in a "
            f"row (last {why}; its own lines say why): stopping every process"
        )
        log.error("%s", self.failure)
        self._stop(signal.SIGTERM)

    async def _run_once(self, child: _Child, directory: Path) -> tuple[int, bool, float]:
        """Start child ``k`` and wait for it to end: its return code, whether it was ready,
        and how long it had been. Each process gets a notify socket of its own, so nothing
        a dead one sent is taken for its successor's."""
        child.starts += 1
        child.ready = False
        address = directory / f"{child.index}.{child.starts}.sock"
        with trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            await notify.bind(str(address))
            process = await trio.lowlevel.open_process(
                self._command(child),
                pass_fds=self._fds(child),
                env=self._environment(address),
            )
            child.process = process
            log.info("process %d started: pid %d", child.index, process.pid)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._listen, child, notify)
                nursery.start_soon(self._stop_when_asked, child, process)
                returncode = await process.wait()
                nursery.cancel_scope.cancel()
        address.unlink(missing_ok=True)
        child.process = None
        was_ready, child.ready = child.ready, False
        return returncode, was_ready, trio.current_time() - child.ready_at

    def _command(self, child: _Child) -> list[str]:
        command = [sys.executable, "-m", "registry_coordinator", "serve"]
        command += ["--config", str(self.config.file), "--child", str(child.index)]
        command += ["--listen-fd", str(self.listening.fileno()), "--supervisor-fd", str(self.pipe)]
        if self.process_sockets:
            command += ["--process-fd", str(self.process_sockets[child.index].fileno())]
        if self.recovery_only:
            command.append("--recovery-only")
        return command

    def _fds(self, child: _Child) -> tuple[int, ...]:
        mine = [self.process_sockets[child.index].fileno()] if self.process_sockets else []
        return (self.listening.fileno(), self.pipe, *mine)

    def _environment(self, address: Path) -> dict[str, str]:
        """The child's environment: its notify socket is the supervisor's, and its watchdog
        interval systemd's for the supervisor, if systemd keeps one."""
        environment = {k: v for k, v in os.environ.items() if not k.startswith("WATCHDOG_")}
        environment["NOTIFY_SOCKET"] = str(address)
        if self.systemd.watchdog_period is not None:
            environment["WATCHDOG_USEC"] = os.environ["WATCHDOG_USEC"]
        return environment

    async def _listen(self, child: _Child, notify: trio.socket.SocketType) -> None:
        """What child ``k`` tells systemd, told to the supervisor instead."""
        while True:
            message = await notify.recv(4096)
            lines = message.decode(errors="replace").splitlines()
            now = trio.current_time()
            if "WATCHDOG=1" in lines:
                child.pinged = now
            if "READY=1" in lines and not child.ready:
                child.ready, child.ready_at, child.pinged = True, now, now
                assert child.process is not None
                log.info("process %d ready: pid %d", child.index, child.process.pid)
                self._status()

    def _status(self) -> None:
        ready = sum(child.ready for child in self.children)
        count = len(self.children)
        url = f"{self.config.scheme}://{self.config.host}:{self.port}"
        if ready == count and not self.announced:
            self.announced = True
            log.info("listening on %s: all %d processes ready", url, count)
            workers = self.config.engine.workers
            self.systemd.send(
                "READY=1", f"STATUS=ready: {url}, {count} processes of {workers} workers"
            )
        elif self.announced:
            self.systemd.status(f"ready: {url}, {ready} of {count} processes ready")

    async def _stop_when_asked(self, child: _Child, process: trio.Process) -> None:
        """Forward the stop to this process, and kill it if it outlives its grace."""
        await self.stopping.wait()
        process.send_signal(self.stop_signal)
        grace = self.config.engine.shutdown_grace.total_seconds() + STOP_MARGIN
        await trio.sleep(grace)
        log.error("process %d did not stop within %.0f s: killing it", child.index, grace)
        process.kill()

    async def _watch_children(self) -> None:
        """Kill a ready child whose loop has not pinged for the whole watchdog interval, as
        systemd would kill the service: it is then started again."""
        if self.systemd.watchdog_period is None:
            return
        interval = 2 * self.systemd.watchdog_period
        while True:
            await trio.sleep(self.systemd.watchdog_period)
            now = trio.current_time()
            for child in self.children:
                process = child.process
                if child.ready and process is not None and now - child.pinged > interval:
                    log.error(
                        "process %d sent no watchdog ping for %.1f s: killing it",
                        child.index,
                        now - child.pinged,
                    )
                    process.kill()
                    child.pinged = now  # once: it is being killed


def _listening(host: str, port: int, given: str, repair: str) -> socket.socket:
    """The socket the children share, listening from now: a caller who comes before a
    child is ready waits in its queue rather than being refused. (Hypercorn sets
    TCP_NODELAY on the sockets it binds, and the accepted connections inherit it.)"""
    sock = bind(host, port, given, repair)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(socket.SOMAXCONN)
    return sock


def _why(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited {returncode}"
