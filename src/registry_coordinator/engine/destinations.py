"""Where an external read may go: never to a link-local or cloud metadata address.

An external connection's base URL was reviewed by its operator (``engine.config``
refuses one that names such an address outright), but a host name is resolved anew for
every read, and what it resolves to can change. Before a read is authorized — before a
token is asked for — its host is resolved and every address it gives is judged: one that
is link-local (``169.254.0.0/16``, ``fe80::/10``, either mapped into IPv6), or a known
cloud metadata address outside those ranges, refuses the read
(``external-destination-refused``); a name that does not resolve leaves the read not
sent, to be tried again.

Known gap: httpx resolves the name again when it connects, so a name whose answers
change between the two resolutions (DNS rebinding by the reviewed host's own DNS) is
not caught; the Rust coordinator pins the connection to the validated addresses.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

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


async def refusal(url: str) -> str | None:
    """Why a read of ``url`` may not be sent (None when it may); :class:`Unresolved` when
    its host does not resolve now."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses: list[Address] = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            found = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise Unresolved(f"{host} did not resolve: {exc}") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]
    denied = sorted({str(a) for a in addresses if forbidden(a)})
    if denied:
        return f"{host} resolves to {', '.join(denied)}, where no external read may go"
    return None
