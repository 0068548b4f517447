"""The addresses a command listens on, checked before anything is started.

A root of its own, importing nothing but the standard library and ``errors``: the stand-ins
check their ports with it without importing the service (the engine, psycopg, Quart), which
would more than double their start.
"""

from __future__ import annotations

import errno
import socket

from registry_coordinator.errors import CoordinatorError, ExitCode


class PortInUse(CoordinatorError):
    """An address to listen on is taken by another process: what is taken (``what``) and
    what to do (``repair``), said apart where a command lists problems with their repairs."""

    exit_code = ExitCode.UNAVAILABLE

    def __init__(self, what: str, repair: str) -> None:
        super().__init__(f"{what}: stop it, or {repair}")
        self.what = what
        self.repair = f"stop it, or {repair}"


def bind(host: str, port: int, given: str, repair: str) -> socket.socket:
    """A socket bound to the address, or the one-line refusal of an address another process
    listens on. Like hypercorn's, it reuses an address left in TIME_WAIT."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        raise PortInUse(f"{host}:{port} is in use by another process ({given})", repair) from None
    return sock


def require_free(host: str, port: int, given: str, repair: str) -> None:
    """Refuse, in one line, an address another process listens on, before anything is
    started: a bind from the nursery would fail only after PostgreSQL started, and in an
    exception group. (Taken between this check and that bind, it still fails there.)"""
    if port != 0:
        bind(host, port, given, repair).close()
