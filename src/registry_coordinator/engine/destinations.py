"""Where an external read may go: never to a link-local or cloud metadata address.

An external connection's base URL was reviewed by its operator (``config``
refuses one that names such an address outright), but a host name is resolved anew for
every read, and what it resolves to can change. Before a read is authorized — before a
token is asked for — its host is resolved and every address it gives is judged: one that
is link-local (``169.254.0.0/16``, ``fe80::/10``, either mapped into IPv6), or a known
cloud metadata address outside those ranges, refuses the read
(``external-destination-refused``); a name that does not resolve leaves the read not
sent, to be tried again.

The connection itself is pinned (:class:`Pinned`, the network backend of an external
connection's client): it resolves the name once more, judges those addresses, and
connects to one of exactly them — so a name whose answers changed since the first look
(DNS rebinding) can never take the read elsewhere. A refusal there leaves the read not
sent; its next attempt's first look refuses it for good.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import httpcore
import trio

#: Cloud metadata services answering outside the link-local ranges.
METADATA = frozenset(
    {
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
        ipaddress.ip_address("fd00:ec2::254"),  # AWS, over IPv6
    }
)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Unresolved(Exception):
    """The host did not resolve now: nothing was sent, and the read is tried again."""


def forbidden(address: Address) -> bool:
    """Whether no external read may reach ``address``."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_link_local or address in METADATA


async def resolve(host: str, port: int) -> list[Address]:
    """The addresses ``host`` resolves to now (the host itself when it is an address)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    found = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]


class Refused(httpcore.ConnectError):
    """A connection the pinned backend would not open: its host resolved where no
    external read may go."""


class Pinned(httpcore.AsyncNetworkBackend):
    """Trio's network backend, connecting only to addresses it has just judged."""

    def __init__(self, resolver: Callable[[str, int], Awaitable[list[Address]]] | None = None):
        self._inner = httpcore.TrioBackend()
        self._resolve = resolver or resolve

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await self._resolve(host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"{host} did not resolve: {exc}") from None
        denied = sorted({str(a) for a in addresses if forbidden(a)})
        if denied or not addresses:
            raise Refused(f"{host} resolves to {', '.join(denied) or 'nothing'}")
        last: httpcore.ConnectError | None = None
        for address in addresses:  # TLS still names the host: only the address is pinned
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                last = exc
        assert last is not None
        raise last

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


async def refusal(url: str) -> str | None:
    """Why a read of ``url`` may not be sent (None when it may); :class:`Unresolved` when
    its host does not resolve now."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = await resolve(host, port)
    except OSError as exc:
        raise Unresolved(f"{host} did not resolve: {exc}") from None
    denied = sorted({str(a) for a in addresses if forbidden(a)})
    if denied:
        return f"{host} resolves to {', '.join(denied)}, where no external read may go"
    return None
