"""Loopback sockets: a free port for each service and stand-in a test starts, and the
status of a response read with h11 off a socket the test writes to itself."""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator

import h11

#: Ports the tests hand out lie below the kernel's ephemeral range (32768-60999 here), so a
#: port chosen for a service is never taken meanwhile as the local end of some client's
#: connection (the "Address already in use" a port the kernel picked could meet); each
#: xdist worker takes its own slice, and walks it from a random start.
_PORTS_PER_WORKER = 3000
_worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 4
_slice = range(20000 + _worker * _PORTS_PER_WORKER, 20000 + (_worker + 1) * _PORTS_PER_WORKER)
_start = random.randrange(len(_slice))
_ports: Iterator[int] = itertools.cycle([*_slice[_start:], *_slice[:_start]])


def free_port() -> int:
    """A loopback port no one is listening on, not handed out before by this process."""
    for port in itertools.islice(_ports, len(_slice)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port from {_slice.start} to {_slice.stop - 1}")


def h11_answer(sock: socket.socket, client: h11.Connection) -> int:
    """The status of the next whole response on ``sock``, read with h11 (for tests that
    write a request's parts apart, as clients under load do)."""
    status = None
    while True:
        event = client.next_event()
        if event is h11.NEED_DATA:
            client.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.EndOfMessage):
            assert status is not None
            return status
