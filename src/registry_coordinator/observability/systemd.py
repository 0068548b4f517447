"""The systemd notify protocol: READY=1, WATCHDOG=1, STOPPING=1 and STATUS= lines.

When the service runs under systemd with ``Type=notify``, ``NOTIFY_SOCKET`` names a
datagram socket to write these to. The watchdog pings are sent by a task in the
Trio loop itself, so a stuck event loop stops pinging and systemd restarts the
service. The protocol is a few lines over a Unix socket, so it is spoken here
directly rather than through libsystemd bindings that need a C toolchain.
"""

from __future__ import annotations

import logging
import os
import socket

import trio

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self) -> None:
        address = os.environ.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._socket: socket.socket | None = None
        if self._address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._socket.setblocking(False)
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_period = int(usec) / 2_000_000 if usec.isdigit() and mine else None

    def send(self, *lines: str) -> None:
        if self._socket is None:
            return
        try:
            self._socket.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:  # systemd went away, or the socket is full: not fatal
            log.warning("could not notify systemd: %s", exc)

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    async def watchdog(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Ping the watchdog at half its interval, from the event loop, for as long as it runs."""
        task_status.started()
        if self.watchdog_period is None:
            return
        while True:
            self.send("WATCHDOG=1")
            await trio.sleep(self.watchdog_period)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
